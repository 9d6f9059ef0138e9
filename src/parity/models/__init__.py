"""Build a model from its spec: source, weights, eval mode. Each call builds a new, independent module."""

from __future__ import annotations

import torch

from parity.models.sources import build_python, build_repo, build_torchvision
from parity.models.weights import apply_weights, redraw_fan_in, seeded


def build_model(spec, experiment) -> torch.nn.Module:
    """The model of `spec` in eval mode; `weights: null` is a seeded init from the experiment's seed
    (the builder's own, or `init: fan_in`)."""
    with seeded(experiment.seed):
        if spec.source == "torchvision":
            model = build_torchvision(spec.builder, spec.params, pretrained=spec.weights == "DEFAULT")
        elif spec.source == "repo":
            model = build_repo(experiment.resolve(spec.path), spec.entry, spec.hubconf, spec.params)
        else:
            model = build_python(spec.entry, spec.params)
    if spec.init == "fan_in":
        redraw_fan_in(model, experiment.seed)
    if spec.weights not in (None, "DEFAULT"):
        apply_weights(model, experiment.resolve(spec.weights))
    return model.eval()
