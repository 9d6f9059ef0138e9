"""Tokenizer parity: when a target brings its own tokenizer (a GGUF file carries one, and llama.cpp tokenizes with
it), the texts of a text input set are tokenized by both sides and the ids compared before the logits are. A
deployment that tokenizes differently runs other inputs than the model was checked on, however close its logits:
that is its own failure class (`tokenizer_mismatch`), named by the first token that differs and its text. The
logits are still compared on the reference's ids, so tier 1 says how the kernels drift apart from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parity.errors import clip


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


def first_mismatch(tokens: dict[str, Any] | None) -> Mismatch | None:
    """The first token where the two tokenizers disagree (execute.execution.own_tokens's record), or None."""
    if not tokens:
        return None
    for i, (ref, tgt) in enumerate(zip(tokens["reference"], tokens["target"], strict=True)):
        if ref == tgt:
            continue
        at = next((j for j, (a, b) in enumerate(zip(ref, tgt, strict=False)) if a != b), min(len(ref), len(tgt)))

        def token(ids, pieces, j):
            return (ids[j], pieces[j] if j < len(pieces) else "") if j < len(ids) else None

        return Mismatch(i, at, token(ref, tokens["reference_pieces"][i], at), token(tgt, tokens["target_pieces"][i], at),
                        (len(ref), len(tgt)))
    return None
