"""The artifact cache: exported ONNX graphs, traced TorchScript modules and OpenVINO models on disk, so
that a second run of the same model on the same backend skips the export (seconds to minutes each).

An artifact is reused only when everything that determines it is the same. Its key hashes:
- the model's identity, given by whoever built it (`ArtifactCache.for_model`; the runner gives
  runner/prepared.py's `model_identity`: source, builder, params, weights, adapters, as written in the
  experiment, and what the source reads the model from: a repository folder's .py files, a python
  entry's module, the versions of the libraries the source declares); without an identity nothing is
  cached, so a module handed over in Python is always exported afresh;
- its content (module tree, every parameter and buffer) and its code: every user class and function it
  runs, with their files (parity/fingerprint.py); code past the walk's bounds is never cached;
- the backend (name, device, dtype, options), its class's code, and what kind of artifact it is;
- the example inputs, by value (a trace follows the branches its inputs take);
- Python's version, parity's own source, and the versions (and installed file lists) of torch, of the
  libraries the backend declares (`Backend.libraries`) and of every library the model's code reaches
  (transformers, timm).
torch.compile's own caches (inductor's FX graph and autograd caches) are pointed into the same folder,
so one folder holds everything a warm run reuses, and removing it makes the next run cold.

Location: `--cache-dir`, else `$PARITY_CACHE_DIR`, else `$XDG_CACHE_HOME/parity` (~/.cache/parity).
`--no-cache` or `PARITY_CACHE_DIR=off` turns it off (an `ArtifactCache(None)`: the Python API's). Nothing is ever evicted: `parity cache clear`
reclaims the space. Entries are written to a temporary folder and renamed into place when complete, so
a run killed mid-export leaves no half-written entry behind.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from parity import fingerprint
from parity.errors import ParityError
from parity.files import user_path
from parity.inputs import Inputs

OFF = ("off", "none", "0", "false", "")
# What parity puts in a cache folder, and all that `clear` removes: artifact entries (named by their key;
# a `.partial` one is an export in progress or killed), torch.compile's caches, and the tag that marks the
# folder as parity's (the Cache Directory Tagging format: backup tools skip such folders).
ARTIFACTS, INDUCTOR, TAG = "artifacts", "inductor", "CACHEDIR.TAG"
ENTRY = re.compile(r"[0-9a-f]{32}|\.[0-9a-f]{32}\.[0-9]+\.partial")
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This folder is parity's artifact cache; `parity cache clear` empties it.\n")
SYSTEM = (Path("/proc"), Path("/sys"))  # never a cache: not files on a disk

# The artifacts of the model whose executions are running (ArtifactCache.for_model): a context, so that every
# execution inside it (a run's, tier 2's on submodules, a fallback search's trials) finds them without each
# layer between the Runner and `execute` passing them on.
_active: contextvars.ContextVar[ModelArtifacts | None] = contextvars.ContextVar("parity_artifacts", default=None)


def default_root() -> Path | None:
    value = os.environ.get("PARITY_CACHE_DIR")
    if value is not None:
        return None if value.strip().lower() in OFF else user_path(value, "$PARITY_CACHE_DIR")
    return user_path(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "the artifact cache's folder ($XDG_CACHE_HOME, else ~/.cache)") / "parity"


def kernel_tag() -> str:
    """Which CPU kernels this process compiles for: the machine, its vector extensions and the settings
    that cap them (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA). Inductor's own cache does not key on them
    (measured: a kernel compiled for AVX-512 and reused under ATEN_CPU_CAPABILITY=avx2 gave NaN), so each
    kind of kernel gets its own inductor folder, and artifacts carry the tag in their key."""
    from parity.records import cpu_info

    cpu = cpu_info()
    parts = [cpu.get("machine"), *cpu.get("flags", []),
             *(f"{k}={os.environ.get(k, '')}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"))]
    return "cpu-" + hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]


class ArtifactCache:
    """The artifact cache in the folder `root` (None: no cache, every export is made afresh). Whoever runs
    executions holds one (the Runner, a worker) and says whose artifacts they are with `for_model`; the
    execution layer hands them to each backend before `prepare` (execute/execution.py), so backends never
    import this module."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else None

    def open(self) -> ArtifactCache:
        """Tag the folder as parity's and point torch.compile's caches into it (once per process: inductor
        reads its folder from the environment). Returns self."""
        if self.root is None:
            return self
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.root / INDUCTOR / kernel_tag())
        with contextlib.suppress(OSError):  # a cache that cannot be written fails the exports that need it
            self.root.mkdir(parents=True, exist_ok=True)
            if not (self.root / TAG).exists():
                (self.root / TAG).write_text(TAG_TEXT)
        return self

    @contextlib.contextmanager
    def for_model(self, *parts: Any) -> Iterator[ModelArtifacts]:
        """Artifacts exported inside this block may be cached under this identity (JSON-able parts). A part
        that is None (a source that cannot say what its model is made of) means: cache nothing."""
        identity = None if any(p is None for p in parts) else json.dumps(parts, sort_keys=True, default=str)
        artifacts = ModelArtifacts(self, identity)
        token = _active.set(artifacts)
        try:
            yield artifacts
        finally:
            _active.reset(token)

    def key(self, kind: str, model: torch.nn.Module, backend: Any, example: Inputs, identity: str | None) -> str | None:
        """The key of an artifact that `backend` makes of `model`, or None when it may not be cached: no cache,
        no identity, or code the fingerprint cannot vouch for."""
        if identity is None or self.root is None:
            return None
        code = fingerprint.code_fingerprint(model, type(backend))
        if code is None:
            return None
        code_digest, reached = code
        spec = backend.spec
        options = {k: v for k, v in spec.options.items() if k not in getattr(backend, "session_options", ())}
        parts = {"kind": kind, "identity": identity, "model": model_digest(model), "code": code_digest,
                 "inputs": inputs_digest(example), "backend": [spec.backend, spec.device, spec.dtype, options],
                 "quantize": quantize_part(backend, model),
                 "libraries": fingerprint.versions({"torch", *backend.libraries, *reached}),
                 "python": sys.version, "parity": fingerprint.parity_digest(), "kernels": kernel_tag()}
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def fetch_or_build(self, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """The folder of the artifact `key`, built by `build(folder)` when it is not there yet; and whether it
        was there (a hit)."""
        assert self.root is not None
        final = self.root / ARTIFACTS / key
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


class ModelArtifacts:
    """One model's artifacts in a cache: what `Backend.artifact` is given (backends/base.py's
    `ArtifactStore`)."""

    def __init__(self, cache: ArtifactCache, identity: str | None):
        self.cache, self.identity = cache, identity

    def fetch(self, kind: str, model: torch.nn.Module, backend: Any, example: Inputs,
              build: Callable[[Path], None]) -> tuple[Path, bool] | None:
        """(folder, hit) of the artifact `kind` of `model`, built by `build` when missing; None when it may not
        be cached (the backend then builds it in a scratch folder of its own)."""
        key = self.cache.key(kind, model, backend, example, self.identity)
        return None if key is None else self.cache.fetch_or_build(key, build)


def quantize_part(backend: Any, model: torch.nn.Module) -> list[Any] | None:
    """What a quantized artifact also depends on: the scheme, the calibration inputs it observed, and the modules
    kept in float (None for a float target)."""
    spec = backend.spec
    if getattr(spec, "quantize", None) is None:
        return None
    from parity.backends.quantize import float_modules

    return [spec.quantize.scheme, [inputs_digest(c) for c in backend.calibration or []], float_modules(model)]


def active() -> ModelArtifacts | None:
    """The artifacts of the model whose executions run now (inside `ArtifactCache.for_model`), if any."""
    return _active.get()


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


# -- parity cache info / clear ---------------------------------------------------------------------

def check_location(root: Path) -> None:
    """A ParityError unless `root` can be a cache: a folder (or nothing yet), readable, on a disk."""
    resolved = root.resolve()
    if any(resolved == system or system in resolved.parents for system in SYSTEM):
        raise ParityError(f"cache folder {root}: is a system folder, not a cache")
    try:
        if root.exists() and not root.is_dir():
            raise ParityError(f"cache folder {root}: is a file, not a folder")
        if root.is_dir():
            with os.scandir(root):
                pass
    except OSError as exc:
        raise ParityError(f"cache folder {root}: cannot be read ({exc.strerror or exc})") from exc


def _size(path: Path) -> tuple[int, int]:
    """Files and bytes under `path`, never following a symbolic link."""
    if path.is_symlink() or not path.is_dir():
        return 1, path.lstat().st_size
    files = size = 0
    for here, _, names in os.walk(path, onerror=_raise):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(here, name)).st_size
    return files, size


def _raise(exc: OSError) -> None:
    raise exc


def usage(root: Path) -> dict[str, Any]:
    """What the cache at `root` holds: its artifact entries (and what else is in `artifacts/`), inductor's
    files, their sizes, and whether parity tagged the folder."""
    check_location(root)
    found: dict[str, Any] = {"tagged": (root / TAG).is_file(), "entries": 0, "artifact_bytes": 0, "foreign": [],
                             "inductor_files": 0, "inductor_bytes": 0}
    try:
        artifacts = root / ARTIFACTS
        if artifacts.is_dir() and not artifacts.is_symlink():
            for child in sorted(artifacts.iterdir()):
                if ENTRY.fullmatch(child.name):
                    found["entries"] += not child.name.endswith(".partial")
                    found["artifact_bytes"] += _size(child)[1]
                else:
                    found["foreign"].append(child.name)
        elif artifacts.is_symlink():
            found["foreign"].append(f"{ARTIFACTS} (a symbolic link)")
        inductor = root / INDUCTOR
        if inductor.is_symlink():
            found["foreign"].append(f"{INDUCTOR} (a symbolic link)")
        elif inductor.is_dir():
            found["inductor_files"], found["inductor_bytes"] = _size(inductor)
    except OSError as exc:
        raise ParityError(f"cache folder {root}: cannot be read ({exc.strerror or exc}: {exc.filename})") from exc
    return found


def clear(root: Path) -> dict[str, Any]:
    """Remove what parity put in the cache at `root`: the artifact entries, `artifacts/` when nothing else is
    left in it, and `inductor/`. Never `root` itself, nothing parity did not write, and no symbolic link is
    followed (a link where parity keeps a folder is left alone: parity never makes one). A folder without
    parity's tag is not a parity cache and is left as it is. Returns what was there (`usage`)."""
    found = usage(root)
    if not root.exists():
        return found
    if not found["tagged"]:
        raise ParityError(f"cache folder {root}: not a parity cache (no {TAG} written by parity); nothing removed")
    try:
        artifacts = root / ARTIFACTS
        if artifacts.is_dir() and not artifacts.is_symlink():
            for child in artifacts.iterdir():
                if ENTRY.fullmatch(child.name):
                    _remove(child)
            if not any(artifacts.iterdir()):
                artifacts.rmdir()
        inductor = root / INDUCTOR
        if inductor.is_dir() and not inductor.is_symlink():
            shutil.rmtree(inductor)
    except OSError as exc:
        raise ParityError(f"cache folder {root}: cannot remove {exc.filename}: {exc.strerror or exc}") from exc
    return found


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # removes the links inside, never what they point to
    else:
        path.unlink()
