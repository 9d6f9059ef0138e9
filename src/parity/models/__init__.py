"""Build a model from its spec: source, weights, eval mode. Each call builds a new, independent module.
The source is the plugin `spec.source` names (parity.plugins.SOURCES; built-ins in models/sources/)."""

from __future__ import annotations

from typing import Any

import torch

from parity import fingerprint
from parity.models.weights import apply_weights, redraw_fan_in, seeded
from parity.plugins import SOURCES


def build_model(spec, experiment) -> torch.nn.Module:
    """The model of `spec` in eval mode; `weights: null` is a seeded init (the builder's own, or `init:
    fan_in`) from the model's `seed`, else the experiment's."""
    seed = spec.init_seed(experiment.seed)
    with seeded(seed):
        model = SOURCES.get(spec.source).build(spec, experiment)
    if spec.init == "fan_in":
        redraw_fan_in(model, seed)
    if spec.weights not in (None, "DEFAULT"):
        apply_weights(model, experiment.resolve(spec.weights))
    return model.eval()


def source_notes(spec, model) -> list[str]:
    """What `spec`'s source changed in the built `model` so that every backend runs it (`Source.notes`)."""
    return SOURCES.get(spec.source).notes(spec, model)


def source_fingerprint(spec, experiment) -> dict[str, Any] | None:
    """What `spec`'s source reads its model from, beyond the module objects (the artifact cache keys exports
    on it): the files the source digests (a repo folder's .py files, a python entry's module file) and the
    versions of the libraries the source declares. None when a file cannot be read or digested (then the
    model's exports are never cached). Call it after the model is built: the entry's module is imported by then."""
    source = SOURCES.get(spec.source)
    try:
        files = source.files_digest(spec, experiment)
    except OSError:  # a file that cannot be read now: not cached, rather than guessed at
        return None
    return None if files is None else {"files": files, "libraries": fingerprint.versions(source.libraries)}
