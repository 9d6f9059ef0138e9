"""Tokenizer parity: when a target brings its own tokenizer (a GGUF file carries one, and llama.cpp tokenizes with
it), the texts of a text input set are tokenized by both sides and the ids compared before the logits are. A
deployment that tokenizes differently runs other inputs than the model was checked on, however close its logits:
that is its own failure class (`tokenizer_mismatch`), named by the first token that differs and its text. The
logits are still compared on the reference's ids, so tier 1 says how the kernels drift apart from it."""

from __future__ import annotations

from dataclasses import dataclass

from parity.errors import clip
from parity.execute.execution import OwnTokens


@dataclass(frozen=True)
class Mismatch:
    text: int  # which text of the input set
    position: int  # the first token position where the ids differ
    reference: tuple[int, str] | None  # (id, its text) on each side; None: that side's ids ended first
    target: tuple[int, str] | None
    lengths: tuple[int, int]

    def describe(self) -> str:
        def side(token):
            return "nothing (its ids end here)" if token is None else f"{token[0]} {clip(repr(token[1]))}"

        return (f"tokenizers differ on text {self.text} at token {self.position}: the reference's tokenizer gives "
                f"{side(self.reference)}, the target's {side(self.target)} ({self.lengths[0]} vs {self.lengths[1]} "
                "tokens)")


def first_mismatch(tokens: OwnTokens | None) -> Mismatch | None:
    """The first token where the two tokenizers disagree (execute.execution.own_tokens's), or None."""
    if tokens is None:
        return None
    for i, at in enumerate(tokens.at):
        if at is None:
            continue
        ref, tgt = tokens.reference[i], tokens.target[i]
        return Mismatch(i, at, _token(ref, tokens.reference_piece[i], at),
                        _token(tgt, tokens.target_piece[i], at), (len(ref), len(tgt)))
    return None


def _token(ids: list[int], piece: str | None, at: int) -> tuple[int, str] | None:
    return (ids[at], piece or "") if at < len(ids) else None
