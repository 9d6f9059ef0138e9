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

import functools
import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from parity.errors import ParityError

log = logging.getLogger(__name__)

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


# What each kind of record must hold for the runner and the reports to read it: a type, a tuple of
# types, {key: shape} for a mapping with those keys ("key?": only when present), or [shape] for a list
# of items of that shape. Fields nothing reads unconditionally are not listed.
_NUM, _STR_OR_NONE, _NUM_OR_NONE = (int, float), (str, type(None)), (int, float, type(None))
_LEAF = {"name": str, "failure_class?": _STR_OR_NONE}
SHAPES: dict[str, dict[str, Any]] = {
    "run": {"experiment": str, "digest?": str, "base_dir": str, "environment": dict,
            "config": {"tolerances": {"atol": [_NUM], "rtol": _NUM}}},
    "resume": {},
    "model": {"model": str},
    "execution": {"model": str, "inputs": str, "backend": str, "device": str, "dtype": str, "repeat": int,
                  "status": str, "prepare_s": _NUM_OR_NONE, "run_s": _NUM_OR_NONE, "error?": _STR_OR_NONE},
    "check": {"model": str, "inputs": str, "target": str, "tier": int, "status": str, "passed": (bool, type(None)),
              "failure_class": _STR_OR_NONE, "detail": _STR_OR_NONE},
    "layers": {"model": str, "inputs": str, "target": str, "error?": _STR_OR_NONE},
    "fallback": {},
    "warning": {"model": str, "inputs": str, "message": str},
}
_TIER_SHAPES = {
    1: {"verdicts": dict, "leaves": [_LEAF], "gate": _NUM, "rtol": _NUM, "required_atol": _NUM_OR_NONE,
        "max_abs?": _NUM_OR_NONE, "oracle?": (dict, type(None))},
    3: {"task": str, "metrics": dict},
}
_LAYERS_SHAPE = {"verdict": str, "mode": str, "threshold": _NUM, "suspects": [{"name": str, "rel_rmse": _NUM_OR_NONE}],
                 "levels": [{"parent": _STR_OR_NONE, "layers": list}]}


def _shape_problem(value: Any, shape: Any, where: str) -> str | None:
    """Where `value` first differs from `shape` ('config.tolerances: missing'), or None when it fits."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'the record'}: expected a mapping, got {type(value).__name__}"
        for key, inner in shape.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                return f"{where + '.' if where else ''}{name}: missing"
            problem = _shape_problem(value[name], inner, f"{where + '.' if where else ''}{name}")
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where}: expected a list, got {type(value).__name__}"
        return next((p for i, item in enumerate(value) if (p := _shape_problem(item, shape[0], f"{where}[{i}]"))), None)
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in types:  # true is an int to Python, not to a record
        return f"{where}: expected {_names(types)}, got bool"
    if not isinstance(value, types):
        return f"{where}: expected {_names(types)}, got {type(value).__name__}"
    return None


def _names(types: tuple) -> str:
    words = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a mapping",
             list: "a list", type(None): "null"}
    return " or ".join(dict.fromkeys(words.get(t, t.__name__) for t in types if not (t is int and float in types)))


def record_problem(record: Any) -> str | None:
    """Why `record` is not a record parity can read (a missing field, a list where a string belongs), or None."""
    if not isinstance(record, dict) or "kind" not in record:
        return "not a parity record (no 'kind')"
    kind = record["kind"]
    if kind not in SHAPES:
        return f"unknown kind of record {str(kind)[:40]!r} (parity writes {', '.join(SHAPES)})"
    problem = _shape_problem(record, SHAPES[kind], "")
    if problem is None and kind == "check":
        if record["tier"] not in _TIER_SHAPES:
            return f"tier: expected 1 or 3, got {record['tier']}"
        problem = _shape_problem(record, _TIER_SHAPES[record["tier"]], "")
    if problem is None and kind == "layers" and not record.get("error"):
        problem = _shape_problem(record, _LAYERS_SHAPE, "")
    return f"a '{kind}' record: {problem}" if problem else None


def _parse(data: bytes, path: Path) -> list[dict[str, Any]]:
    """The records in `data` up to its last newline: what follows is a torn line, not a record yet. Every
    line is checked (record_problem); a record whose key an earlier line has is dropped when the two are
    identical (said on stderr) and an error when they differ: no check is ever counted twice."""
    records = []
    seen: dict[tuple, tuple[int, dict]] = {}
    dropped = []
    for number, line in enumerate(data[:data.rfind(b"\n") + 1].split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ParityError(f"{path}:{number}: not a JSON record ({getattr(exc, 'msg', exc)})") from exc
        problem = record_problem(record)
        if problem:
            raise ParityError(f"{path}:{number}: {problem}")
        key = record_key(record)
        if key in seen:
            first, earlier = seen[key]
            if earlier != record:
                raise ParityError(f"{path}:{number}: a second {' / '.join(map(str, key))} record, different from the "
                                  f"one on line {first}; a run holds one of each: remove the one that is wrong")
            dropped.append(number)
            continue
        if key is not None:
            seen[key] = number, record
        records.append(record)
    if dropped:
        log.warning("%s: line(s) %s%s repeat a record of an earlier line exactly; each is counted once", path,
                    ", ".join(map(str, dropped[:10])), " ..." if len(dropped) > 10 else "")
    return records


class RecordWriter:
    """Appends records to OUT/records.jsonl, flushing each line so a crash loses nothing written.

    The file is locked while the writer is open, so two runs cannot interleave lines in one folder.
    `resume=False` empties it; `resume=True` reads the records already there (`records`) and the bytes
    of a torn last line (`torn`), which `drop_torn_line` cuts off; `write` then skips any record whose
    key is already in the file."""

    def __init__(self, path: Path, resume: bool = False):
        from parity.outdir import open_records, reason

        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ParityError(f"{path.parent}: cannot create the folder: {reason(exc)}") from exc
        self._file = open_records(path)  # never through a link, never anything but a regular file
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
        except OSError as exc:
            self._file.close()
            raise ParityError(f"{path}: cannot read or empty it: {exc.strerror or exc}") from exc
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
            try:
                self._file.truncate(self._file.seek(0, os.SEEK_END) - torn)
            except OSError as exc:
                raise ParityError(f"{self.path}: cannot cut off its torn last line: {exc.strerror or exc}") from exc
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
        try:
            self._file.write((json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))
            self._file.flush()
        except OSError as exc:  # a full disk, a quota: the run stops here, its records so far kept
            raise ParityError(f"{self.path}: cannot write a record: {exc.strerror or exc}; the records written "
                              "so far are kept and the run continues from them once the problem is solved") from exc
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
    return _parse(_read(path), path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ParityError(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def read_run(folder: str | Path) -> list[dict[str, Any]]:
    """The records of the run in `folder` (an `--out` folder), for rendering reports. A missing file, a
    line that is not JSON or a file without its `run` record is a ParityError that says which."""
    folder = Path(folder)
    path = folder / "records.jsonl" if folder.suffix != ".jsonl" else folder
    try:
        if not path.is_file():
            where = "does not exist" if not folder.exists() else "has no records.jsonl"
            raise ParityError(f"{folder}: {where} (expected the --out folder of a parity run)")
    except OSError as exc:  # a name too long, a folder parity may not enter
        raise ParityError(f"{folder}: cannot read it: {exc.strerror or exc}") from exc
    records = _parse(_read(path), path)  # a torn last line (a run in progress, or killed) is left out
    if not any(r["kind"] == "run" for r in records):
        raise ParityError(f"{path}: no 'run' record (the first line of every parity run); is this a parity records file?")
    return records


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed
        return None


def cpu_info() -> dict[str, Any]:
    """The machine, its CPU model and the vector extensions numbers depend on (a copy: read once)."""
    info = _read_cpu_info()
    return {**info, **({"flags": list(info["flags"])} if "flags" in info else {})}


@functools.cache
def _read_cpu_info() -> dict[str, Any]:
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
        "cpu": cpu_info(),
        "threads": threads or torch.get_num_threads(),
        "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32},
        "cuda": cuda,
        "git_commit": _git_commit(experiment_dir),
    }
