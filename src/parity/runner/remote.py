"""The parent's side of executions that run in a worker process (the process and ray executors): the
execution assembled from the worker's messages, checked against the digest of the model this process built
(runner.prepared.ModelCopies.digest) to prove the worker built the same, and how a worker that died is described."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import NamedTuple

from parity import taxonomy as tx
from parity.config.schema import BackendSpec
from parity.errors import CacheLost, ParityError
from parity.execute.execution import Execution, describe
from parity.runner.base import OnRun
from parity.runner.plan import Job


class RemoteExecution:
    """The parent's side of an execution that runs in a worker: it is assembled from the worker's
    messages (see runner/worker.py), or ends as a crash or a time-out when the worker dies or is stopped."""

    def __init__(self, job: Job, spec: BackendSpec, expected_digest: str, on_run: OnRun, streamed: bool = True):
        self.job, self.expected_digest, self.on_run = job, expected_digest, on_run
        self.streamed = streamed  # the worker reports each repeat as it finishes (else only at the end)
        self.execution = Execution(spec, "ok")
        self.finished = False

    def receive(self, message: tuple) -> None:
        kind, *fields = message
        ex = self.execution
        if kind == "built":
            (digest,) = fields
            if digest != self.expected_digest:
                raise ParityError(
                    f"model '{self.job.model.name}': the worker built it with other weights than this process did "
                    "(its builder is not deterministic for a seed); run it with the local executor")
        elif kind == "repeat":
            repeat, run_s, outputs, ex.prepare_s, ex.cached, ex.notes, ex.warmup = fields
            ex.outputs.append(outputs)
            ex.run_s.append(run_s)
            if self.on_run:
                self.on_run(ex, repeat)
        elif kind == "done":
            (ex.status, ex.error, ex.failure_class, ex.prepare_s, ex.cached, ex.notes, ex.warmup, ex.traceback,
             ex.warmup_outputs, ex.captured, ex.follow_up, ex.tokens) = fields
            if not ex.ok:  # as execute() leaves a failed execution: no outputs
                ex.outputs, ex.run_s = [], []
            self.finished = True
        elif kind == "lost":  # the artifact cache failed under the worker's build: exit 2, as in this process
            self.finished = True
            raise CacheLost(*fields)
        else:
            raise RuntimeError(f"unknown message from a worker: {kind!r}")

    def _progress(self) -> str:
        return f"; {len(self.execution.run_s)} of {self.job.repeats} run(s) done" if self.streamed else ""

    def fail(self, failure_class: str, error: str) -> Execution:
        ex = self.execution
        ex.status, ex.failure_class, ex.error = "error", failure_class, error
        ex.outputs, ex.run_s = [], []
        self.finished = True
        return ex

    def crashed(self, how: str, site: str | None = None) -> Execution:
        """`how` the worker ended ('died of SIGSEGV'), `site` where (a function and file:line), if known."""
        where = f" in {site}" if site else ""
        return self.fail(tx.CRASH, f"the worker process {how}{where}{self._progress()}")

    def timed_out(self, limit_s: float, site: str | None = None) -> Execution:
        where = f" in {site}" if site else ""
        return self.fail(tx.TIMEOUT, f"ran past the time limit of {limit_s:g} s{where} and was stopped{self._progress()}")


def ending(returncode: int) -> str:
    """How a process ended, from its return code: 'died of SIGSEGV' (a negative code), 'exited with code 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGKILL":
            name += " (killed from outside, often by the out-of-memory killer)"
        return f"died of {name}"
    return f"exited with code {returncode}"


# What faulthandler writes first for each fatal signal it handles.
_FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
          "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)')


class Frame(NamedTuple):
    """One frame of a faulthandler stack, as it writes it: `File "path", line N in func`."""

    path: str
    line: str
    func: str


def crash_report(path: Path | None) -> tuple[str | None, str | None]:
    """From a worker's faulthandler file: the fatal signal's name, and the innermost frame of the thread that
    ran the execution (the one whose stack holds parity's worker), as 'run (tiny.py:42)'."""
    if path is None or not path.is_file():
        return None, None
    text = path.read_text(errors="replace")
    name = next((sig for words, sig in _FATAL.items() if f"Fatal Python error: {words}" in text), None)
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text):
        frames = [Frame(*m.groups()) for m in map(_FRAME.match, block.splitlines()) if m]
        if any(f.path.endswith(("parity/runner/worker.py", "parity/runner/ray_executor.py")) for f in frames):
            top = frames[0]
            return name, f"{top.func} ({Path(top.path).name}:{top.line})"
    return name, None


def describe_worker_error(exc: BaseException) -> tuple[str, str]:
    """(failure class, message) for an exception raised while receiving a worker's results in this process
    (outputs that cannot be rebuilt here, for instance)."""
    return tx.BACKEND_ERROR, f"the outputs could not be received from the worker: {describe(exc)}"

