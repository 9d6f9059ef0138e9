"""A runtime in a worker process of its own, behind one request/reply call: what llama.cpp's and ONNX Runtime GenAI's
backends run their C/C++ in, so that an abort or a segmentation fault there ends that process only and is the
target's `crash` (taxonomy.WorkerDied), never the run's end.

The worker is a script beside the backend (`llamacpp_worker.py`, `ortgenai_worker.py`) that imports its runtime and
numpy, never parity or torch. Protocol: each request one JSON line on its stdin; each reply one JSON line on its
stdout, followed by `nbytes` raw bytes when the reply says so; `{"error": ...}` is the runtime's error, raised here.
Each reply is read once, into the `Reply` model the caller names (`LogitsReply`...), read by attribute afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from parity.offline import state_folder
from parity.taxonomy import WorkerDied


def script_in_process(script: Path, name: str):
    """The worker script loaded as a module of this process (a backend's `in_process` option: no crash isolation,
    for debugging and the tests that need one process), under `name`, apart from parity's own modules."""
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Reply(BaseModel):
    """A worker's reply, read once from its JSON line: a message kind's fields in a subclass, the ones it does not
    name (`nbytes`, fields a newer worker adds) ignored; this class itself is a reply whose fields nobody reads."""
    model_config = ConfigDict(frozen=True, extra="ignore")


class LogitsReply(Reply):
    """The header of a reply carrying float32 logits as its raw payload: their shape."""
    shape: tuple[int, ...]


class _Frame(Reply):
    """What every reply may say to the protocol itself: the runtime's error, the raw payload's length."""
    error: str | None = None
    nbytes: int | None = None


R = TypeVar("R", bound=Reply)


class WorkerProcess:
    def __init__(self, script: Path, runtime: str):
        self.runtime = runtime  # how messages name it: "llama.cpp"
        # its stderr (the runtime's log, an assertion's message) to a file: a pipe nobody reads would fill and block it
        self.log = tempfile.TemporaryFile(dir=state_folder())
        self.process: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def request(self, message: dict, reply: type[R] = Reply) -> tuple[R, bytes]:
        """The worker's reply to `message`, as `reply`, and its raw payload; its error as RuntimeError, its death as
        WorkerDied."""
        process = self.process
        if process is None:
            raise WorkerDied(f"{self.runtime}'s worker process was closed")
        try:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()
            line = process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            raise WorkerDied(self._death())
        header = json.loads(line)  # parsed once: the protocol's frame, then the caller's reply, from the same mapping
        frame = _Frame.model_validate(header)
        if frame.error is not None:
            raise RuntimeError(f"{self.runtime}: {frame.error}")
        body = b"" if frame.nbytes is None else process.stdout.read(frame.nbytes)
        if frame.nbytes is not None and len(body) != frame.nbytes:
            raise WorkerDied(self._death())
        return reply.model_validate(header), body

    def _death(self) -> str:
        """What ended the worker: its signal or exit code, and the last line it wrote to stderr."""
        process = self.process
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        self.log.seek(max(0, self.log.seek(0, os.SEEK_END) - 4096))
        lines = self.log.read().decode("utf-8", "replace").strip().splitlines()
        last = f": {lines[-1][:300]}" if lines else ""
        if code < 0:
            import signal

            how = f"died of {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return f"{self.runtime}'s worker process {how}{last}"

    def close(self) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            try:
                process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            process.stdout.close()
            self.log.close()
