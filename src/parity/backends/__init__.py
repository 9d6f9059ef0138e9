"""Backends by name: the `parity.backends` entry-point group (parity's own are registered in its
pyproject.toml, a plugin package's in its own), or `backend: package.module:Class` in an experiment file."""

from __future__ import annotations

from parity.backends.base import Backend
from parity.dtypes import REDUCED
from parity.errors import ParityError
from parity.plugins import BACKENDS


def backend_class(name: str) -> type[Backend]:
    """The backend class `name` names, as its type (the registry checked it is a Backend subclass)."""
    return BACKENDS.get(name)


def create_backend(spec) -> Backend:
    return backend_class(spec.backend)(spec)


def fallback_kind(spec) -> str:
    """What the fallback modules of `spec` (a BackendSpec) run as: float on a quantized target (left out of
    quantization), float32 on a reduced-dtype one, else the backend's own `fallback_kind` (compile: eager)."""
    if spec.quantize is not None:
        return "float"
    if spec.dtype in REDUCED:
        return "float32"
    kind = backend_class(spec.backend).fallback_kind
    if kind is None:
        able = [n for n in BACKENDS.names() if backend_class(n).fallback_kind is not None]
        raise ParityError(f"target {spec.id}: fallback applies to {', '.join(able)} targets, to bfloat16/float16 "
                          "targets and to quantized targets")
    return kind


__all__ = ["BACKENDS", "Backend", "backend_class", "create_backend", "fallback_kind"]
