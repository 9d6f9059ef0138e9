"""Input sets: named, ordered tensors handed to a model as positional and keyword arguments."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from parity.outputs import map_tensors

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a model is called with: `model(*args, **kwargs)`. `notes` are warnings about how the input
    set came out (a constant image), for the console and the records."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # A text input set's sentences and each one's token texts (as its tokenizer writes each id): what a backend
    # that brings its own tokenizer tokenizes again (verify/tokenizers.py)
    texts: tuple[str, ...] = ()
    pieces: tuple[tuple[str, ...], ...] = ()

    def map(self, fn) -> Inputs:
        return Inputs(map_tensors(self.args, fn), map_tensors(self.kwargs, fn), texts=self.texts, pieces=self.pieces)

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
        from parity.outputs import flatten

        return [v for v in flatten((self.args, self.kwargs)).values() if isinstance(v, torch.Tensor)]


def build_inputs(spec, experiment, batch: str = "stack") -> Inputs:
    """The Inputs of one input set; `batch` says how images are handed over (a stacked batch or a list).
    An input that came out constant by accident (an image whose values are all the same, a random draw
    that could take one value) is warned about on stderr and kept in `notes`: every backend agrees on a
    constant, so a pass on it proves little."""
    inputs = _build(spec, experiment, batch)
    for note in inputs.notes:
        log.warning("input set '%s': %s", spec.name, note)
    return inputs


def _build(spec, experiment, batch: str) -> Inputs:
    from parity.inputs.images import load_images
    from parity.inputs.synthetic import make_synthetic

    if spec.tensors is not None:
        from parity.inputs.tensors import load_tensors

        return load_tensors(experiment.resolve(spec.tensors))
    if spec.text is not None:
        from parity.inputs.text import make_text

        return make_text(spec.text, experiment.resolve(spec.tokenizer))
    if spec.audio is not None:
        from parity.inputs.audio import load_audio

        clips, notes = load_audio([experiment.resolve(f) for f in spec.audio], spec.sample_rate, spec.samples)
        return Inputs((clips,), notes=tuple(notes))
    if spec.images is not None:
        images, notes = load_images(spec.images, spec.preprocess, experiment.base_dir)
        if batch == "list":
            return Inputs((images,), notes=tuple(notes))
        shapes = {tuple(i.shape) for i in images}
        if len(shapes) > 1:
            from parity.errors import ParityError

            raise ParityError(
                f"input set '{spec.name}': images have different sizes after preprocessing ({sorted(shapes)}); "
                "add 'center_crop' or a fixed 'resize: [H, W]' to stack them into one batch"
            )
        return Inputs((torch.stack(images),), notes=tuple(notes))
    return make_synthetic(spec.synthetic, experiment.seed)
