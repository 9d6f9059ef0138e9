"""The artifact cache: exported ONNX graphs, traced TorchScript modules and OpenVINO models on disk, so
that a second run of the same model on the same backend skips the export (seconds to minutes each).

An artifact is reused only when everything that determines it is the same. Its key hashes:
- the model's identity, given by whoever built it (`model_identity`: source, builder, params, weights,
  adapters, as written in the experiment), and its content (module tree, every parameter and buffer);
  without an identity nothing is cached, so a module handed over in Python is always exported afresh;
- the backend (name, device, dtype, options) and what kind of artifact it is;
- the example inputs, by value (a trace follows the branches its inputs take);
- the versions of Python, parity and every library that exports or runs artifacts.
torch.compile's own caches (inductor's FX graph and autograd caches) are pointed into the same folder,
so one folder holds everything a warm run reuses, and removing it makes the next run cold.

Location: `--cache-dir`, else `$PARITY_CACHE_DIR`, else `$XDG_CACHE_HOME/parity` (~/.cache/parity).
`--no-cache` or `PARITY_CACHE_DIR=off` turns it off. Nothing is ever evicted: remove the folder to
reclaim the space. Entries are written to a temporary folder and renamed into place when complete, so
a run killed mid-export leaves no half-written entry behind.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import torch

from parity.inputs import Inputs

OFF = ("off", "none", "0", "false", "")
LIBRARIES = ("parity", "torch", "torchvision", "onnx", "onnxscript", "onnxruntime", "openvino", "numpy")

_root: Path | None = None
_identity: contextvars.ContextVar[str | None] = contextvars.ContextVar("parity_model_identity", default=None)


def default_root() -> Path | None:
    value = os.environ.get("PARITY_CACHE_DIR")
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parity"


def configure(root: Path | None) -> None:
    """Use `root` as the cache for this process (None: no cache)."""
    global _root
    _root = Path(root) if root is not None else None
    if _root is not None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_root / "inductor")


def root() -> Path | None:
    return _root


@contextlib.contextmanager
def model_identity(*parts: Any) -> Iterator[None]:
    """Artifacts exported inside this block may be cached under this identity (JSON-able parts)."""
    token = _identity.set(json.dumps(parts, sort_keys=True, default=str))
    try:
        yield
    finally:
        _identity.reset(token)


@cache
def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def model_digest(model: torch.nn.Module) -> str:
    """The module tree (classes and their settings, as printed) and every parameter's and buffer's bytes."""
    h = hashlib.sha256(repr(model).encode())
    for name, tensor in model.state_dict(keep_vars=False).items():
        h.update(name.encode())
        _tensor_digest(h, tensor)
    return h.hexdigest()


def _tensor_digest(h, t: torch.Tensor) -> None:
    t = t.detach().to("cpu")
    h.update(f"{t.dtype}:{tuple(t.shape)}:{t.layout}".encode())
    if t.layout == torch.strided and not t.is_quantized:
        h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:  # sparse, quantized: their serialized form
        buffer = io.BytesIO()
        torch.save(t, buffer)
        h.update(buffer.getvalue())


def inputs_digest(example: Inputs) -> str:
    """The example inputs by value, not only by shape: a trace follows the branches these values take,
    and an exporter may bake values into the graph, so an artifact made from other values could differ."""
    h = hashlib.sha256()
    for name, value in [*enumerate(example.args), *sorted(example.kwargs.items())]:
        h.update(str(name).encode())
        if isinstance(value, torch.Tensor):
            _tensor_digest(h, value)
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def artifact_key(kind: str, model: torch.nn.Module, spec: Any, example: Inputs) -> str | None:
    """The key of an artifact, or None when the model has no identity (then it is not cached)."""
    identity = _identity.get()
    if identity is None or _root is None:
        return None
    parts = {"kind": kind, "identity": identity, "model": model_digest(model), "inputs": inputs_digest(example),
             "backend": [spec.backend, spec.device, spec.dtype, spec.options], "versions": _versions()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def fetch_or_build(key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The folder of the artifact `key`, built by `build(folder)` when it is not there yet; and whether it
    was there (a hit)."""
    assert _root is not None
    final = _root / "artifacts" / key
    if final.is_dir():
        return final, True
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f".{key}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        build(partial)
        os.replace(partial, final)
    except OSError:  # another process finished the same entry first: keep theirs
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final, False
