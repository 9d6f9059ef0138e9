"""The environment a run's numbers depend on, recorded in its `run` (and each `resume`) record."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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


def environment(experiment_dir: Path, threads: int | None = None, libraries: Iterable[str] = ("torch",)) -> dict[str, Any]:
    """What the numbers depend on: the versions of `libraries` (the caller's: the runner passes those of the
    experiment's backends, `Backend.libraries`), CPU, threads, CUDA, the experiment's git commit. Each
    library's version is a key of its own (null: not installed) and `libraries` lists them, in order.
    `threads`: the torch threads the executions run with, when not this process's (an executor's setting)."""
    import torch

    names = list(dict.fromkeys(libraries))
    cuda = None
    if torch.cuda.is_available():
        cuda = {"version": torch.version.cuda, "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "parity": _version("parity"),
        **{name: torch.__version__ if name == "torch" else _version(name) for name in names},
        "libraries": names,
        "cpu": cpu_info(),
        "threads": threads or torch.get_num_threads(),
        "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32},
        "cuda": cuda,
        "git_commit": _git_commit(experiment_dir),
    }
