"""Adapters: deterministic replacements for order-sensitive post-processing, applied to the model once,
before any backend gets its copy, so that every backend (the reference too) runs the same adapter."""

from __future__ import annotations

from parity.errors import ParityError, did_you_mean

ADAPTERS = ("deterministic_nms",)


def apply_adapters(model, adapters, experiment) -> list[str]:
    """Apply the experiment's adapters to `model`; returns what each changed, for the records."""
    notes = []
    for spec in adapters:
        if spec.name == "deterministic_nms":
            from parity.adapters.nms import apply_deterministic_nms

            notes.append(apply_deterministic_nms(model, spec.score_grid_for(experiment), spec.box_grid))
        else:  # the schema lists the names; this is a guard for a name added there but not here
            raise ParityError(f"unknown adapter '{spec.name}'{did_you_mean(spec.name, ADAPTERS)}")
    return notes
