"""Adapters: deterministic replacements for order-sensitive post-processing, applied to the model once,
before any backend gets its copy, so that every backend (the reference too) runs the same adapter. Each is
an `Adapter` registered in the `parity.adapters` entry-point group (built-in: deterministic_nms, nms.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from parity.plugins import ADAPTERS


class Adapter(ABC):
    name: ClassVar[str]
    # Its keys: a subclass of config.schema.AdapterSpec with `name: Literal["<name>"]`.
    Spec: ClassVar[type]

    @abstractmethod
    def apply(self, model: Any, spec: Any, experiment: Any) -> str:
        """Change `model` in place; return what changed, for the records."""


def apply_adapters(model, adapters, experiment) -> list[str]:
    """Apply the experiment's adapters to `model`; returns what each changed, for the records."""
    return [ADAPTERS.get(spec.name).apply(model, spec, experiment) for spec in adapters]
