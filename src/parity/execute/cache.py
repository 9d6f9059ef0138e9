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

A cache folder is shared between runs (a CI cache restored from elsewhere), so no entry is trusted blindly:
each holds its manifest (`ENTRY_FILE`: its key, what the key was made of, and the sha256 of every file it
holds), and a hit is used only when the manifest matches the key and every file matches its digest, with
none missing and none added. Anything else is rebuilt, with a warning and a note on the execution: a
damaged entry is never loaded, so it can neither pass a check nor fail one as the target's error. The
manifest is also what `parity cache clear` removes: only the files it names.

A cache is shared between processes too: a run holds a shared lock (flock) on every entry it writes (the
`.partial` folder, from its first file) or uses, until its model's executions end (`for_model`), and
`parity cache clear` takes each entry's lock without waiting and leaves the entries a live process holds
(the kernel drops a dead process's locks, so a killed export's `.partial` is removed). An entry that still
vanishes under a build (removed by hand) is built once more; when it vanishes again the run stops with exit 2
naming the cache (`CacheLost`), never a failure charged to the target. So does a build that fails because the
cache's disk is full (`ArtifactCache._check_space`).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from parity import fingerprint
from parity.backends.quantize import float_modules
from parity.digest import feed_tensor
from parity.errors import CacheLost, ParityError, first_line
from parity.files import is_regular, user_path
from parity.inputs import Inputs
from parity.outdir import write_text
from parity.records import cpu_info
from parity.records.models import CpuInfo

try:
    import fcntl
except ImportError:  # not POSIX: no locks, as records.jsonl has none there
    fcntl = None

log = logging.getLogger(__name__)

OFF = ("off", "none", "0", "false", "")
# What parity puts in a cache folder: artifact entries (named by their key; a `.partial` one is an export in
# progress or killed, a `.damaged` one a damaged entry on its way out), torch.compile's caches, and the tag that
# marks the folder as parity's (the Cache Directory Tagging format: backup tools skip such folders). `clear`
# removes only what the tag (parity's own text), MADE and each entry's manifest say parity wrote.
ARTIFACTS, INDUCTOR, TAG = "artifacts", "inductor", "CACHEDIR.TAG"
ENTRY = re.compile(r"[0-9a-f]{32}|\.[0-9a-f]{32}\.[0-9]+\.(partial|damaged)")
MADE = "parity-made.json"  # the folders (artifacts/, inductor/) parity made in the cache: `clear` removes no other
ENTRY_FILE = "parity-entry.json"  # an entry's manifest: its key, the key's parts, each file's sha256
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This folder is parity's artifact cache; `parity cache clear` empties it.\n")
SYSTEM = (Path("/proc"), Path("/sys"))  # never a cache: not files on a disk
# A build that fails with less than this left on the cache's disk failed for the disk (_check_space): a write that
# ran out of space leaves under one block free; this margin takes in the space others free or fill meanwhile.
FULL_BELOW = 16 * 2 ** 20

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
    cpu = CpuInfo.model_validate(cpu_info())
    parts = [cpu.machine, *(cpu.flags or []),
             *(f"{k}={os.environ.get(k, '')}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"))]
    return "cpu-" + hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]


class ArtifactCache:
    """The artifact cache in the folder `root` (None: no cache, every export is made afresh). Whoever runs
    executions holds one (the Runner, a worker) and says whose artifacts they are with `for_model`; the
    execution layer hands them to each backend before `prepare` (execute/execution.py), so backends never
    import this module."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else None

    def given(self) -> str | None:
        """The folder when it is not the default one (a --cache-dir): what a later command must be told to find this
        cache's artifacts. None for the default and for no cache (a later command finds, or makes, its own)."""
        if self.root is None:
            return None
        try:
            default = default_root()
        except ParityError:  # an unusable $PARITY_CACHE_DIR: this folder is not it
            default = None
        return None if default is not None and self.root.resolve() == default.resolve() else str(self.root.resolve())

    def open(self) -> ArtifactCache:
        """Tag the folder as parity's and point torch.compile's caches into it (once per process: inductor
        reads its folder from the environment). Returns self."""
        if self.root is None:
            return self
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.root / INDUCTOR / kernel_tag())
        with contextlib.suppress(OSError, ParityError):  # a cache that cannot be written fails the exports that need it
            self.root.mkdir(parents=True, exist_ok=True)
            if not (self.root / TAG).exists() and not (self.root / TAG).is_symlink():
                write_text(self.root / TAG, TAG_TEXT)  # renamed into place: never through a link
            made = set(_made(self.root))
            for name in (ARTIFACTS, INDUCTOR):
                if not (self.root / name).exists() and not (self.root / name).is_symlink():
                    (self.root / name).mkdir()
                    made.add(name)
            if made != set(_made(self.root)):
                write_text(self.root / MADE, json.dumps(sorted(made)))
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
            artifacts.release()

    def key(self, kind: str, model: torch.nn.Module, backend: Any, example: Inputs, identity: str | None) -> str | None:
        """The key of an artifact that `backend` makes of `model`, or None when it may not be cached: no cache,
        no identity, or code the fingerprint cannot vouch for."""
        parts = self.key_parts(kind, model, backend, example, identity)
        return None if parts is None else digest_key(parts)

    def key_parts(self, kind: str, model: torch.nn.Module, backend: Any, example: Inputs,
                  identity: str | None) -> str | None:
        """What the key of that artifact hashes, as canonical JSON (kept in the entry's manifest), or None."""
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
        return json.dumps(parts, sort_keys=True, default=str)

    def fetch_or_build(self, parts: str, build: Callable[[Path], None],
                       held: list[int] | None = None) -> tuple[Path, bool, str | None]:
        """The folder of the artifact whose key is made of `parts` (`key_parts`), built by `build(folder)` when it
        is not there yet or is damaged; whether it was there intact (a hit); and what was wrong with the entry
        found under its key (None: nothing, or no entry). The entry's lock is added to `held` (`clear` leaves
        it alone until the holder releases it). A build whose folder was removed under it is built once more;
        twice is `CacheLost`."""
        for attempt in (1, 2):
            try:
                return self._fetch_or_build(parts, build, held)
            except _Vanished as gone:
                if attempt == 2:
                    raise CacheLost(f"cache folder {self.root}: the entry {gone.folder.name} being built was removed "
                                    "twice while this run wrote it (another process clearing the cache?): use the "
                                    "cache alone, or give another --cache-dir (or --no-cache)") from gone.__cause__
                log.warning("cache entry %s was removed while it was being built: building it again", gone.folder)
        raise AssertionError("unreachable")

    def _fetch_or_build(self, parts: str, build: Callable[[Path], None],
                        held: list[int] | None) -> tuple[Path, bool, str | None]:
        assert self.root is not None
        key = digest_key(parts)
        final = self.root / ARTIFACTS / key
        damage = None
        if final.is_dir() or final.is_symlink():
            lock = _hold(final, held)  # before it is checked: a clear that holds it first finishes first
            damage = entry_problem(final, key, parts)
            if damage is None:
                return final, True, None
            _unhold(lock, held)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.parent / f".{key}.{os.getpid()}.partial"
        _discard(partial)
        partial.mkdir()
        _hold(partial, held)  # the lock stays with the folder when it is renamed into place
        try:
            try:
                (partial / ENTRY_FILE).write_text(Manifest(key=key, parts=parts, files=None).text())
                build(partial)
            except Exception as exc:
                self._check_space(partial, exc)
                if not (partial / ENTRY_FILE).is_file():  # removed under the build: not the target's failure
                    raise _Vanished(partial) from exc
                raise
            (partial / ENTRY_FILE).write_text(Manifest(key=key, parts=parts, files=_digests(partial)).text())
            if damage is not None:  # set aside and removed, never loaded
                aside = final.parent / f".{key}.{os.getpid()}.damaged"
                with contextlib.suppress(FileNotFoundError):
                    os.replace(final, aside)
                _discard(aside)
            os.replace(partial, final)
        except OSError as exc:  # another process finished the same entry first: keep theirs
            if not final.is_dir() or entry_problem(final, key, parts) is not None:
                self._check_space(partial, exc)
                if not partial.is_dir():  # removed under the build, between its files
                    raise _Vanished(partial) from exc
                raise
        finally:
            _discard(partial)
        return final, False, damage

    def _check_space(self, partial: Path, exc: BaseException) -> None:
        """`CacheLost` when the entry being written into `partial` failed because its disk is full: the machine's
        problem, never the target's (no verdict). Full means no space (ENOSPC) or quota (EDQUOT) anywhere in the
        exception's chain, or under `FULL_BELOW` left on the disk as the build failed (a library can drop the
        errno: numpy's `tofile`, which the ONNX exporter writes with, says only "problem writing element N")."""
        assert self.root is not None
        left = _free(partial if partial.is_dir() else self.root)
        said = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in _chain(exc))
        if not said and (left is None or left >= FULL_BELOW):
            return
        mib = 2 ** 20
        tmp = Path(tempfile.gettempdir())
        other = _free(tmp) if _device(tmp) not in (None, _device(self.root)) else None
        space = "unknown" if left is None else f"{left / mib:.0f} MiB left"
        elsewhere = f"; the temporary folder {tmp}: {other / mib:.0f} MiB left" if other is not None else ""
        try:
            written = f"more than the {_size(partial)[1] / mib:.0f} MiB it had written"
        except OSError:
            written = "more than it had written"
        raise CacheLost(f"cache folder {self.root}: no space left on the disk for the entry being written (the cache's "
                        f"disk: {space}{elsewhere}; the entry needed {written}; "
                        f"{type(exc).__name__}: {first_line(exc)}): free space, or give another --cache-dir (or "
                        "--no-cache)") from exc


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or during, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _free(path: Path) -> int | None:
    """Bytes left to write on the disk holding `path` (None: it cannot say)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _device(path: Path) -> int | None:
    try:
        return path.stat().st_dev
    except OSError:
        return None


class _Vanished(Exception):
    """The `.partial` folder of an entry being built was removed under the build."""

    def __init__(self, folder: Path):
        super().__init__(str(folder))
        self.folder = folder


def _hold(folder: Path, held: list[int] | None) -> int | None:
    """A shared lock on the entry `folder` (its folder's own descriptor, which a rename keeps), added to `held`
    (None: no lock is taken)."""
    if fcntl is None or held is None:
        return None
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None  # a link or gone: entry_problem says so
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return None
    held.append(fd)
    return fd


def _unhold(fd: int | None, held: list[int] | None) -> None:
    if fd is not None and held is not None and fd in held:
        held.remove(fd)
        os.close(fd)


def in_use(entry: Path) -> Callable[[], None] | None:
    """None when a live process holds the entry's lock (a run writing or using it); else the release of the
    exclusive lock now taken (a no-op where there are no locks), to call once the entry is removed."""
    if fcntl is None:
        return lambda: None
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return lambda: None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return lambda: os.close(fd)


class ModelArtifacts:
    """One model's artifacts in a cache: what `Backend.artifact` is given (backends/base.py's
    `ArtifactStore`). It holds the lock of every entry it wrote or used until `release` (the end of the
    model's `for_model` block)."""

    def __init__(self, cache: ArtifactCache, identity: str | None):
        self.cache, self.identity = cache, identity
        self.held: list[int] = []

    def release(self) -> None:
        for fd in self.held:
            os.close(fd)
        self.held = []

    def fetch(self, kind: str, model: torch.nn.Module, backend: Any, example: Inputs,
              build: Callable[[Path], None]) -> tuple[Path, bool] | None:
        """(folder, hit) of the artifact `kind` of `model`, built by `build` when missing or damaged (said as a
        warning and as the backend's note); None when it may not be cached (the backend then builds it in a
        scratch folder of its own)."""
        parts = self.cache.key_parts(kind, model, backend, example, self.identity)
        if parts is None:
            return None
        folder, hit, damage = self.cache.fetch_or_build(parts, build, self.held)
        if damage is not None:
            message = f"cache entry {folder} was damaged ({damage}): rebuilt, the damaged one not used"
            log.warning(message)
            backend.note("cache", message)
        return folder, hit


class Manifest(BaseModel):
    """An entry's manifest (ENTRY_FILE): its key, what the key was made of, and the sha256 of every file it holds by
    path (None while the entry is being built). Read once, where the JSON is read, and by attribute after."""

    model_config = ConfigDict(strict=True, frozen=True)
    key: str
    parts: str
    files: dict[str, str] | None

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        """The manifest in `path`; None when its JSON is not one of parity's (OSError, or ValueError when it is not
        JSON: unreadable)."""
        data = json.loads(path.read_text())
        try:
            return cls.model_validate(data)
        except ValidationError:
            return None

    def text(self) -> str:
        """As ENTRY_FILE holds it (the bytes every parity wrote: json.dumps of key, parts, files)."""
        return json.dumps(self.model_dump())


def digest_key(parts: str) -> str:
    return hashlib.sha256(parts.encode()).hexdigest()[:32]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _digests(folder: Path) -> dict[str, str]:
    """The sha256 of every file under `folder` but its manifest, by path relative to it. Anything but a
    folder or a regular file (a link, a FIFO) is an OSError: a backend never writes one."""
    found = {}
    for here, dirs, names in os.walk(folder, onerror=_raise):
        for name in [*dirs, *names]:
            path = Path(here) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise OSError(f"{path.relative_to(folder)} is not a regular file or folder")
        for name in names:
            relative = (Path(here) / name).relative_to(folder).as_posix()
            if relative != ENTRY_FILE:
                found[relative] = _file_digest(Path(here) / name)
    return found


def entry_problem(folder: Path, key: str, parts: str) -> str | None:
    """What is wrong with the cache entry `folder` for the key `key` made of `parts`, or None when its manifest
    matches them and every file it holds is the one it had when written (sha256), none missing, none added."""
    if folder.is_symlink():
        return "it is a symbolic link"
    manifest_path = folder / ENTRY_FILE
    if manifest_path.is_symlink() or (os.path.lexists(manifest_path) and not is_regular(manifest_path)):
        return f"{ENTRY_FILE} is not a regular file"  # a FIFO would block the read
    try:
        manifest = Manifest.read(folder / ENTRY_FILE)
    except (OSError, ValueError) as exc:
        return f"no readable {ENTRY_FILE} ({getattr(exc, 'strerror', None) or exc})"
    if not isinstance(manifest, Manifest) or manifest.files is None:
        return f"{ENTRY_FILE} lists no files"
    if manifest.key != key or manifest.parts != parts or digest_key(str(manifest.parts)) != key:
        return f"{ENTRY_FILE} was written for other key inputs"
    try:
        found = _digests(folder)
    except OSError as exc:
        return str(exc.strerror or exc)
    expected = manifest.files
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            return f"{name} is missing"
        if name not in expected:
            return f"{name} was added"
        if found[name] != expected[name]:
            return f"{name} differs from the file written (sha256)"
    return None


def quantize_part(backend: Any, model: torch.nn.Module) -> list[Any] | None:
    """What a quantized artifact also depends on: the scheme, the calibration inputs it observed, and the modules
    kept in float (None for a float target)."""
    spec = backend.spec
    if getattr(spec, "quantize", None) is None:
        return None
    return [spec.quantize.scheme, [inputs_digest(c) for c in backend.calibration or []], float_modules(model)]


def active() -> ModelArtifacts | None:
    """The artifacts of the model whose executions run now (inside `ArtifactCache.for_model`), if any."""
    return _active.get()


def model_digest(model: torch.nn.Module) -> str:
    """The module tree (classes and their settings, as printed) and every parameter's and buffer's bytes."""
    h = hashlib.sha256(repr(model).encode())
    for name, tensor in model.state_dict(keep_vars=False).items():
        h.update(name.encode())
        feed_tensor(h, tensor)
    return h.hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """Every parameter's and buffer's name and bytes: what a weights file sets, apart from the module tree."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict(keep_vars=False).items():
        h.update(name.encode())
        feed_tensor(h, tensor)
    return h.hexdigest()


def inputs_digest(example: Inputs) -> str:
    """The example inputs by value, not only by shape: a trace follows the branches these values take,
    and an exporter may bake values into the graph, so an artifact made from other values could differ."""
    h = hashlib.sha256()
    for name, value in [*enumerate(example.args), *sorted(example.kwargs.items())]:
        h.update(str(name).encode())
        if isinstance(value, torch.Tensor):
            feed_tensor(h, value)
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


def tagged(root: Path) -> bool:
    """Whether `root` holds parity's own tag (another tool's CACHEDIR.TAG says the folder is that tool's)."""
    tag = root / TAG
    try:
        return not tag.is_symlink() and tag.is_file() and tag.stat().st_size == len(TAG_TEXT) and tag.read_text() == TAG_TEXT
    except (OSError, UnicodeDecodeError):
        return False


def _made(root: Path) -> list[str]:
    """The folders of the cache at `root` that parity made (MADE), [] when it says none or cannot be read."""
    try:
        made = json.loads((root / MADE).read_text()) if is_regular(root / MADE) and not (root / MADE).is_symlink() else []
    except (OSError, ValueError):
        return []
    return [name for name in made if name in (ARTIFACTS, INDUCTOR)] if isinstance(made, list) else []


@dataclass(frozen=True)
class CacheUsage:
    """What a cache folder holds (`usage`) and, after `clear`, what clearing it did: `left`, what was left and why;
    `in_use`, the entries left for the process that holds them; `freed`, bytes (nothing, for `usage`)."""

    tagged: bool  # parity's own tag is in the folder: `clear` empties only such a folder
    entries: int  # finished artifact entries
    artifact_bytes: int
    inductor_files: int
    inductor_bytes: int
    foreign: tuple[str, ...]  # what `artifacts/` holds that is no entry, and the links parity never makes
    left: tuple[str, ...] = ()
    in_use: tuple[str, ...] = ()
    freed: int = 0


def usage(root: Path) -> CacheUsage:
    """What the cache at `root` holds: its artifact entries (and what else is in `artifacts/`), inductor's
    files, their sizes, and whether parity tagged the folder."""
    check_location(root)
    entries = artifact_bytes = inductor_files = inductor_bytes = 0
    foreign: list[str] = []
    try:
        artifacts = root / ARTIFACTS
        if artifacts.is_dir() and not artifacts.is_symlink():
            for child in sorted(artifacts.iterdir()):
                if ENTRY.fullmatch(child.name):
                    entries += not child.name.startswith(".")
                    artifact_bytes += _size(child)[1]
                else:
                    foreign.append(child.name)
        elif artifacts.is_symlink():
            foreign.append(f"{ARTIFACTS} (a symbolic link)")
        inductor = root / INDUCTOR
        if inductor.is_symlink():
            foreign.append(f"{INDUCTOR} (a symbolic link)")
        elif inductor.is_dir():
            inductor_files, inductor_bytes = _size(inductor)
    except OSError as exc:
        raise ParityError(f"cache folder {root}: cannot be read ({exc.strerror or exc}: {exc.filename})") from exc
    return CacheUsage(tagged(root), entries, artifact_bytes, inductor_files, inductor_bytes, tuple(foreign))


def clear(root: Path) -> CacheUsage:
    """Remove what parity wrote in the cache at `root`, and only that: each artifact entry's files as its
    manifest names them (then its folders, when empty), `artifacts/` when parity made it and nothing else is
    left in it, and `inductor/` when parity made it (MADE). Never `root` itself, and no symbolic link is
    followed or removed (parity never makes one). A folder without parity's own tag is not a parity cache and
    is left as it is, and so is an entry a live process holds (a run writing or using it: `in_use`). Returns what
    was there (`usage`), with what was left, the entries in use and the bytes freed."""
    found = usage(root)
    left: list[str] = []
    held: list[str] = []
    freed = 0
    if not root.exists():
        return found
    if not found.tagged:
        raise ParityError(f"cache folder {root}: not a parity cache (no {TAG} written by parity); nothing removed")
    made = _made(root)
    try:
        artifacts = root / ARTIFACTS
        if artifacts.is_dir() and not artifacts.is_symlink():
            for child in sorted(artifacts.iterdir()):
                if ENTRY.fullmatch(child.name):
                    release = in_use(child)
                    if release is None:
                        held.append(f"{ARTIFACTS}/{child.name}")
                        continue
                    try:
                        freed += _clear_entry(child, left)
                    finally:
                        release()
            if ARTIFACTS in made and not any(artifacts.iterdir()):
                artifacts.rmdir()
        inductor = root / INDUCTOR
        if inductor.is_dir() and not inductor.is_symlink():
            if INDUCTOR in made:
                freed += found.inductor_bytes
                shutil.rmtree(inductor)
            else:
                left.append(f"{INDUCTOR}/ (not made by parity)")
        if not (root / ARTIFACTS).exists() and not (root / INDUCTOR).exists():
            _discard(root / MADE)
    except OSError as exc:
        raise ParityError(f"cache folder {root}: cannot remove {exc.filename}: {exc.strerror or exc}") from exc
    return replace(found, left=tuple(left), in_use=tuple(held), freed=freed)


def _clear_entry(entry: Path, left: list[str]) -> int:
    """Remove what parity wrote in the artifact entry `entry` (its manifest's files; all of an unfinished or a
    damaged one's, which parity alone names so); say in `left` what was left. Returns the bytes freed."""
    name = f"{ARTIFACTS}/{entry.name}"
    if entry.is_symlink() or not entry.is_dir():
        left.append(f"{name} (not a folder parity wrote)")
        return 0
    try:
        if (entry / ENTRY_FILE).is_symlink() or not is_regular(entry / ENTRY_FILE):
            raise ValueError("not a regular file")  # a FIFO would block the read
        manifest = Manifest.read(entry / ENTRY_FILE)
        files = manifest.files if isinstance(manifest, Manifest) and manifest.key == entry.name.removeprefix(".").split(".")[0] else False
    except (OSError, ValueError):
        files = False
    unfinished = entry.name.startswith(".")
    if files is False or not (isinstance(files, dict) or unfinished and files is None):
        left.append(f"{name} (no {ENTRY_FILE} of parity's)")
        return 0
    if unfinished:  # an export in progress or killed, or a damaged entry set aside: all parity's
        freed = _size(entry)[1]
        shutil.rmtree(entry)
        return freed
    freed = 0
    for relative in [*files, ENTRY_FILE]:
        path = entry / relative
        if ".." not in Path(relative).parts and not Path(relative).is_absolute() and path.is_file() and not path.is_symlink():
            freed += path.stat().st_size
            path.unlink()
    for here, dirs, _ in os.walk(entry, topdown=False):
        for folder in dirs:
            with contextlib.suppress(OSError):  # not empty: something parity did not write is in it
                (Path(here) / folder).rmdir()
    try:
        entry.rmdir()
    except OSError:
        kept = sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if not p.is_dir() or p.is_symlink())
        left.append(f"{name}/ ({', '.join(kept[:5])}{', ...' if len(kept) > 5 else ''}: not written by parity)")
    return freed


def _discard(path: Path) -> None:
    if path.exists() or path.is_symlink():
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # removes the links inside, never what they point to
    else:
        path.unlink()
