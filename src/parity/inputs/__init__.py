"""Input sets: named, ordered tensors handed to a model as positional and keyword arguments."""

from __future__ import annotations

import logging

import torch

from parity.errors import ParityError
from parity.inputs.audio import load_audio
from parity.inputs.base import Inputs
from parity.inputs.images import load_images
from parity.inputs.synthetic import make_synthetic
from parity.inputs.tensors import load_tensors
from parity.inputs.text import make_text, make_windows, read_text

log = logging.getLogger(__name__)


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
    if spec.tensors is not None:
        return load_tensors(experiment.resolve(spec.tensors))
    if spec.text is not None:
        return make_text(spec.text, experiment.resolve(spec.tokenizer))
    if spec.text_file is not None:
        return make_windows(read_text(spec.text_file, experiment), experiment.resolve(spec.tokenizer), spec.n_ctx,
                            spec.windows)
    if spec.audio is not None:
        clips, notes = load_audio([experiment.resolve(f) for f in spec.audio], spec.sample_rate, spec.samples)
        return Inputs((clips,), notes=tuple(notes))
    if spec.images is not None:
        images, notes = load_images(spec.images, spec.preprocess, experiment.base_dir)
        if batch == "list":
            return Inputs((images,), notes=tuple(notes))
        shapes = {tuple(i.shape) for i in images}
        if len(shapes) > 1:
            raise ParityError(
                f"input set '{spec.name}': images have different sizes after preprocessing ({sorted(shapes)}); "
                "add 'center_crop' or a fixed 'resize: [H, W]' to stack them into one batch"
            )
        return Inputs((torch.stack(images),), notes=tuple(notes))
    return make_synthetic(spec.synthetic, experiment.seed)
