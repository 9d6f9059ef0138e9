"""What a model is called with, the value every input set becomes (its own module, so that the input kinds
can import it without importing the package's `build_inputs`, which imports them)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from parity.outputs import flatten, map_tensors


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a model is called with: `model(*args, **kwargs)`. `notes` are warnings about how the input
    set came out (a constant image), for the console and the records. `scored_from`: the first position whose
    next token a language model is scored on (a text cut into windows: each window's second half, as
    llama-perplexity scores it; 0: every position)."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    scored_from: int = 0
    # A text input set's texts, each one's ids as the reference's tokenizer gives them and each id's text (as its
    # tokenizer writes it): what a backend that brings its own tokenizer tokenizes again and is compared with
    # (verify/tokenizers.py). `ids_cut`: the ids are the first tokens of the text only, the span the input set runs
    # (a text cut into windows, the rest dropped), and the other side's ids are compared over that span
    texts: tuple[str, ...] = ()
    text_ids: tuple[tuple[int, ...], ...] = ()
    pieces: tuple[tuple[str, ...], ...] = ()
    ids_cut: bool = False

    def map(self, fn) -> Inputs:
        return Inputs(map_tensors(self.args, fn), map_tensors(self.kwargs, fn), scored_from=self.scored_from,
                      texts=self.texts, text_ids=self.text_ids, pieces=self.pieces, ids_cut=self.ids_cut)

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> Inputs:
        """Move to `device`; cast floating tensors to `dtype` when given (integer inputs keep theirs)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t.to(device)

        return self.map(move)

    def clone(self) -> Inputs:
        return self.map(lambda t: t.detach().clone())

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in flatten((self.args, self.kwargs)).values() if isinstance(v, torch.Tensor)]
