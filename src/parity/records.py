"""JSONL records: one self-describing JSON object per line, written and flushed as results come.

Kinds: `run` (the resolved experiment and the environment), `model`, `execution` (one backend run),
`check` (one verdict), `layers` (one localized check), `fallback`. Reports and summaries are rendered from these lines alone. Non-finite floats (an infinite
required atol) are written as null: the file stays strict JSON.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


class RecordWriter:
    """Appends records to OUT/records.jsonl, flushing each line so a crash loses nothing written."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", encoding="utf-8")
        self.records: list[dict[str, Any]] = []

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = _finite({"kind": kind, "schema_version": SCHEMA_VERSION, **fields})
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self.records.append(record)
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if path.is_dir():
        path = path / "records.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_run(folder: str | Path) -> list[dict[str, Any]]:
    """The records of the run in `folder` (an `--out` folder), for rendering reports. A missing file, a
    line that is not JSON or a file without its `run` record is a ParityError that says which."""
    from parity.errors import ParityError

    folder = Path(folder)
    path = folder / "records.jsonl" if folder.suffix != ".jsonl" else folder
    if not path.is_file():
        where = "does not exist" if not folder.exists() else "has no records.jsonl"
        raise ParityError(f"{folder}: {where} (expected the --out folder of a parity run)")
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ParityError(f"{path}:{number}: not a JSON record ({exc.msg})") from exc
            if not isinstance(record, dict) or "kind" not in record:
                raise ParityError(f"{path}:{number}: not a parity record (no 'kind')")
            records.append(record)
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


def environment(experiment_dir: Path) -> dict[str, Any]:
    """What the numbers depend on: library versions, CPU, threads, CUDA, the experiment's git commit."""
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
        "threads": torch.get_num_threads(),
        "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32},
        "cuda": cuda,
        "git_commit": _git_commit(experiment_dir),
    }
