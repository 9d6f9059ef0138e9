"""Build a model from its spec: source, weights, eval mode. Each call builds a new, independent module."""

from __future__ import annotations

from typing import Any

import torch

from parity import fingerprint
from parity.models.sources import LIBRARIES, build_python, build_repo, build_torchvision
from parity.models.weights import apply_weights, redraw_fan_in, seeded
from parity.registry import split_ref


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


def source_fingerprint(spec, experiment) -> dict[str, Any] | None:
    """What `spec`'s source reads its model from, beyond the module objects (the artifact cache keys exports
    on it): a repo folder's .py files, a python entry's module file, and the versions of the libraries the
    source declares. None when there is no file to read, or one cannot be read, or a folder is too large to
    hash (then the model's exports are never cached). Call it after the model is built: the entry's module
    is imported by then."""
    try:
        if spec.source == "repo":
            files = fingerprint.folder_digest(experiment.resolve(spec.path))
        elif spec.source == "python":
            files = fingerprint.module_digest(split_ref(spec.entry)[0])
        else:
            files = ""
    except OSError:  # a file that cannot be read now: not cached, rather than guessed at
        return None
    return None if files is None else {"files": files, "libraries": fingerprint.versions(LIBRARIES[spec.source])}
