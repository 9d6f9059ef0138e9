"""Backends by name: the `parity.backends` entry-point group (parity's own are registered in its
pyproject.toml, a plugin package's in its own), or `backend: package.module:Class` in an experiment file."""

from __future__ import annotations

from parity.backends.base import Backend
from parity.errors import ParityError
from parity.plugins import BACKENDS


def backend_class(name: str) -> type[Backend]:
    cls = BACKENDS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ParityError(f"backend '{name}' is {cls!r}, not a subclass of parity.backends.base.Backend")
    return cls


def create_backend(spec) -> Backend:
    return backend_class(spec.backend)(spec)


__all__ = ["BACKENDS", "Backend", "backend_class", "create_backend"]
