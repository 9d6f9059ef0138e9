"""Offline and contained by construction: the libraries parity loads send nothing and keep no state in
the home folder.

Measured on this stack (strace and a fresh `$HOME`, before these switches): importing ONNX Runtime
creates `~/.cache/Microsoft/DeveloperTools/.onnxruntime/` (a device id and an event database for its
1DS telemetry); OpenVINO's model conversion writes `~/intel/openvino_ga_cid` and `~/intel/stats` and
looks up `www.google-analytics.com`; matplotlib (the reports' charts) writes its font cache to
`~/.cache/matplotlib`. Each is switched off or moved before the library loads:

- ONNX Runtime reads `ORT_DISABLE_TELEMETRY` (and, in later versions, `ORT_TELEMETRY_DISABLED`) once,
  when it initializes: with it set, no uploader, device id or offline store is created. Its runtime
  API (`disable_telemetry_events`) comes too late: the device id is written at import.
- OpenVINO's converter imports `openvino_telemetry` inside `try/except ImportError` and falls back to
  its own no-op stub. The package has no switch but a consent file in the home folder, so parity makes
  the import fail (`sys.modules[name] = None`, Python's documented way to block one) and the stub runs.
- matplotlib keeps its state in `MPLCONFIGDIR`: the artifact cache's `matplotlib` folder, or with the
  cache off a temporary folder removed when the process ends. A folder the user set is kept.

`contain()` runs when `parity` is imported, before any backend can load; `keep_state_in(root)` once the
command knows where its cache is. Worker processes import parity too and inherit the environment. The pytest
plugin, which pytest imports in every session once parity is installed, undoes it at once (`release()`) and
contains only the tests that use parity (`contained()`): a user's other tests keep their environment.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from parity.errors import ParityError

TELEMETRY_OFF = {"ORT_DISABLE_TELEMETRY": "1", "ORT_TELEMETRY_DISABLED": "1"}
BLOCKED_MODULES = ("openvino_telemetry",)


def put_environ(settings: dict[str, str | None]) -> dict[str, str | None]:
    """Set each of `settings` in os.environ (None: unset it); returns what they were, which put back undoes it."""
    before = {name: os.environ.get(name) for name in settings}
    for name, value in settings.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return before


def contain() -> Callable[[], None]:
    """Turn every known telemetry off for this process and the processes it starts; returns what undoes it."""
    before = put_environ(TELEMETRY_OFF)
    blocked = []
    for name in BLOCKED_MODULES:
        if name not in sys.modules:  # already imported by the caller's own code (or blocked): not ours to unload
            sys.modules[name] = None  # type: ignore[assignment]  # `import name` now raises ImportError
            blocked.append(name)

    def undo() -> None:
        put_environ(before)
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]

    return undo


_AT_IMPORT: list[Callable[[], None]] = []  # what undoes the contain() that `import parity` ran


def release() -> None:
    """Undo what `import parity` contained (the pytest plugin, loaded in every session): once."""
    while _AT_IMPORT:
        _AT_IMPORT.pop()()


@contextlib.contextmanager
def contained():
    """Telemetry off for the time of a block, as it was after: the pytest plugin's tests that use parity."""
    undo = contain()
    try:
        yield
    finally:
        undo()


STATE_ENV = "PARITY_STATE_DIR"  # the state folder of the process that made it, for the processes it starts


def state_folder() -> Path:
    """This process's temporary folder, where everything parity keeps for the time of a command goes (matplotlib's
    and torch.compile's state without a cache, the workers' and Ray's scratch folders, backends' exports): one
    `parity-*` folder in TMPDIR, removed when the process that made it ends; the processes it starts (workers)
    use the same one. A TMPDIR where no folder can be made is the user's to fix."""
    inherited = os.environ.get(STATE_ENV)
    if inherited and os.path.isdir(inherited):
        return Path(inherited)
    try:
        folder = Path(tempfile.mkdtemp(prefix="parity-"))
    except OSError as exc:  # no usable temporary folder: a read-only or missing TMPDIR (and /tmp)
        raise ParityError(f"no temporary folder parity can write: {exc.strerror or exc}; set TMPDIR to a writable "
                          "folder") from exc
    atexit.register(shutil.rmtree, folder, True)
    os.environ[STATE_ENV] = str(folder)
    return folder


def keep_state_in(cache_root: Path | None) -> None:
    """Libraries' state goes under the cache, or into the state folder when there is none: matplotlib's font
    cache (else in the home folder), and torch.compile's (else `torchinductor_USER` left in TMPDIR, even by
    `parity backends`; a command's artifact cache, opened first, has put it there already). Decided once per
    process: each library reads it once. A folder the user set is kept."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(state_folder() / "inductor")
    if "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = str(cache_root / "matplotlib" if cache_root is not None else state_folder() / "matplotlib")


def die_with_parent(parent: int | None = None) -> None:
    """Linux: the kernel kills this process when its parent dies (a worker; the `parity` command's second
    process), even when a backend hangs in C code. `parent`: the pid it must have (it may be 1, in a
    container), else any but 1."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent if parent is not None else os.getppid() == 1:  # it died before that took effect
        os._exit(1)


@contextlib.contextmanager
def quiet_library_imports():
    """Import torchao (directly, or through ExecuTorch or transformers, which import it when it is installed)
    inside this: it registers Enums as pytree constants, and torch logs a deprecation warning about that once
    per process, about torchao's code and not about the model, on the user's console."""
    logger = logging.getLogger("torch.utils._pytree")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)
