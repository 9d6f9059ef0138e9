"""Backends by name. Built-ins load lazily; plugins come from the `parity.backends` entry-point group or
from `backend: package.module:Class` in an experiment file."""

from __future__ import annotations

from parity.backends.base import Backend
from parity.errors import ParityError
from parity.registry import Registry, import_object

BACKENDS: Registry[type[Backend]] = Registry("backend", group="parity.backends")
for _name, _ref in {
    "eager": "parity.backends.eager:EagerBackend",
    "compile": "parity.backends.compile:CompileBackend",
    "onnxruntime": "parity.backends.onnxruntime:OnnxRuntimeBackend",
    "torchscript": "parity.backends.torchscript:TorchScriptBackend",
    "openvino": "parity.backends.openvino:OpenVinoBackend",
}.items():
    BACKENDS.register(_name, lambda ref=_ref: import_object(ref, "backend"))


def backend_class(name: str) -> type[Backend]:
    cls = BACKENDS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ParityError(f"backend '{name}' is {cls!r}, not a subclass of parity.backends.base.Backend")
    return cls


def create_backend(spec) -> Backend:
    return backend_class(spec.backend)(spec)


__all__ = ["BACKENDS", "Backend", "backend_class", "create_backend"]
