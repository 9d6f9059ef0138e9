"""JSONL records: one self-describing JSON object per line, written and flushed as results come.

Kinds: `run` (the resolved experiment, its digest and the environment), `resume` (a later process
continued the run), `model`, `execution` (one backend run), `check` (one verdict), `layers` (one
localized check), `fallback`, `warning` (an input that came out constant). Reports and summaries are
rendered from these lines alone. Non-finite floats (an infinite required atol) are written as null:
the file stays strict JSON.

A run can be continued: `record_key` says what identifies a record, and a writer opened with
`resume=True` keeps the records already in the file and never writes a second record with the same key.
A process killed while writing leaves at most one torn last line (no newline); it is detected, and cut
off before anything is appended.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from parity.errors import ParityError

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; two runs into one folder are then the user's to avoid
    fcntl = None

SCHEMA_VERSION = 1


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


# Settings of how a run is carried out, not of what it measures: a run may continue under others.
NOT_DIGESTED = ("executor",)


def experiment_digest(config: dict[str, Any], base_dir: str) -> str:
    """What a run is a run of: the resolved experiment and the folder its relative paths start from.
    Comments, key order and spelling (`1e-5` vs `0.00001`) do not change it; a setting does, except
    where executions run (`executor`: a run started locally may continue in worker processes)."""
    measured = {k: v for k, v in config.items() if k not in NOT_DIGESTED}
    canonical = json.dumps({"config": _finite(measured), "base_dir": base_dir}, sort_keys=True,
                           separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def record_key(record: dict[str, Any]) -> tuple | None:
    """The identity of a record within one run, or None for kinds that may repeat (`resume`, `fallback`).
    A run holds one `run` record, one `model` record per model, one `execution` per (model, input set,
    backend, repeat), one `check` per (model, input set, target, tier), one `layers` per check, one
    `warning` per (model, input set, message)."""
    kind = record.get("kind")
    if kind == "run":
        return ("run",)
    if kind == "model":
        return ("model", record["model"])
    if kind == "execution":
        return ("execution", record["model"], record["inputs"], record["backend"], record["repeat"])
    if kind == "check":
        return ("check", record["model"], record["inputs"], record["target"], record["tier"])
    if kind == "layers":
        return ("layers", record["model"], record["inputs"], record["target"])
    if kind == "warning":
        return ("warning", record["model"], record["inputs"], record["message"])
    return None


def _parse(data: bytes, path: Path) -> list[dict[str, Any]]:
    """The records in `data` up to its last newline: what follows is a torn line, not a record yet."""
    records = []
    for number, line in enumerate(data[:data.rfind(b"\n") + 1].split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ParityError(f"{path}:{number}: not a JSON record ({getattr(exc, 'msg', exc)})") from exc
        if not isinstance(record, dict) or "kind" not in record:
            raise ParityError(f"{path}:{number}: not a parity record (no 'kind')")
        records.append(record)
    return records


class RecordWriter:
    """Appends records to OUT/records.jsonl, flushing each line so a crash loses nothing written.

    The file is locked while the writer is open, so two runs cannot interleave lines in one folder.
    `resume=False` empties it; `resume=True` reads the records already there (`records`) and the bytes
    of a torn last line (`torn`), which `drop_torn_line` cuts off; `write` then skips any record whose
    key is already in the file."""

    def __init__(self, path: Path, resume: bool = False):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a+b")
        try:
            self._lock()
            self.records: list[dict[str, Any]] = []
            self.torn = 0
            if resume:
                self._file.seek(0)
                data = self._file.read()
                self.torn = len(data) - (data.rfind(b"\n") + 1)
                try:
                    self.records = _parse(data, path)
                except ParityError as exc:
                    raise ParityError(f"{exc.problems[0]}; something other than parity wrote this file: move it "
                                      "away, or pass --fresh to start over") from exc
            else:
                self._file.truncate(0)
        except BaseException:
            self._file.close()
            raise
        self._keys = {record_key(r) for r in self.records} - {None}

    def _lock(self) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ParityError(f"{self.path}: another parity process is writing this run; wait for it to end "
                              "or give another --out") from exc

    def drop_torn_line(self) -> int:
        """Cut off a torn last line (what a killed process was writing); returns its length in bytes."""
        torn, self.torn = self.torn, 0
        if torn:
            self._file.truncate(self._file.seek(0, os.SEEK_END) - torn)
        return torn

    def has(self, *key: Any) -> bool:
        return tuple(key) in self._keys

    def write(self, kind: str, **fields: Any) -> dict[str, Any] | None:
        """Append one record; None (and nothing written) when the file already has a record with its key."""
        record = _finite({"kind": kind, "schema_version": SCHEMA_VERSION, **fields})
        key = record_key(record)
        if key is not None and key in self._keys:
            return None
        if self.torn:
            raise RuntimeError("records.jsonl ends with a torn line; drop_torn_line() before appending")
        self._file.write((json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))
        self._file.flush()
        self.records.append(record)
        if key is not None:
            self._keys.add(key)
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run. A torn last line (the run is being written, or was killed mid-line) is not a
    record yet and is left out."""
    path = Path(path)
    if path.is_dir():
        path = path / "records.jsonl"
    return _parse(path.read_bytes(), path)


def read_run(folder: str | Path) -> list[dict[str, Any]]:
    """The records of the run in `folder` (an `--out` folder), for rendering reports. A missing file, a
    line that is not JSON or a file without its `run` record is a ParityError that says which."""
    folder = Path(folder)
    path = folder / "records.jsonl" if folder.suffix != ".jsonl" else folder
    if not path.is_file():
        where = "does not exist" if not folder.exists() else "has no records.jsonl"
        raise ParityError(f"{folder}: {where} (expected the --out folder of a parity run)")
    records = _parse(path.read_bytes(), path)  # a torn last line (a run in progress, or killed) is left out
    if not any(r["kind"] == "run" for r in records):
        raise ParityError(f"{path}: no 'run' record (the first line of every parity run); is this a parity records file?")
    return records


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed
        return None


def _cpu() -> dict[str, Any]:
    info: dict[str, Any] = {"machine": platform.machine(), "count": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and "model" not in info:
            info["model"] = value.strip()
        if key.strip() == "flags" and "flags" not in info:
            wanted = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
            info["flags"] = [f for f in value.split() if f in wanted]
    return info


def _git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(experiment_dir: Path, threads: int | None = None) -> dict[str, Any]:
    """What the numbers depend on: library versions, CPU, threads, CUDA, the experiment's git commit.
    `threads`: the torch threads the executions run with, when not this process's (an executor's setting)."""
    import torch

    cuda = None
    if torch.cuda.is_available():
        cuda = {"version": torch.version.cuda, "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "parity": _version("parity"),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "openvino": _version("openvino"),
        "numpy": _version("numpy"),
        "cpu": _cpu(),
        "threads": threads or torch.get_num_threads(),
        "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32},
        "cuda": cuda,
        "git_commit": _git_commit(experiment_dir),
    }
