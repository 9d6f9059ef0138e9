"""Executors: where executions run. The runner (runner/local.py) asks an executor for one execution at a
time and judges it; the executor decides where the backend runs:

- `local`: in this process (the default). A backend that segfaults or hangs takes the run with it.
- `process`: in a worker process with a time limit (runner/process.py). A crash or a hang fails that
  execution's checks as `crash` or `timeout`, and the next execution gets a fresh worker.
- `ray`: as Ray tasks, several at a time (runner/ray_executor.py), with the same crash and time-limit rules.

Whatever the executor, the records are the same: the same execution records, with outputs judged in
this process by the same code. Workers rebuild each model from the experiment (runner/worker.py) rather
than receive a pickled one, and the parent checks that they built the same weights as it did.
"""

from __future__ import annotations

import re
import signal
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Literal

import torch
from pydantic import model_validator

from parity import taxonomy as tx
from parity.adapters.fallback import apply_fallback, fallback_for
from parity.config.schema import BackendSpec, ExecutorSpec, Experiment
from parity.errors import ParityError
from parity.execute.execution import Execution, execute
from parity.inputs import Inputs
from parity.runner.plan import Job

OnRun = Callable[[Execution, int], None] | None


def configured_model(model: torch.nn.Module, spec: BackendSpec, model_name: str) -> torch.nn.Module:
    """The model as the target `spec` runs it: with its fallback modules, when it has some."""
    names = fallback_for(spec, model_name)
    return apply_fallback(model, names, spec) if names else model


class Executor(ABC):
    """Runs executions for the runner. `start` is called once before the first execution with every job
    the run may ask for (an executor that runs ahead may start them all; anything never asked for is
    dropped at `close`); `execute` returns one finished execution, calling `on_run(execution, repeat)`
    after each repeat so that records are written as results come."""

    # Told what the executor is doing while the runner waits on it (the runner's progress bar), if set.
    on_status: Callable[[str], None] | None = None

    def start(self, exp: Experiment, jobs: list[Job]) -> None:
        self.exp = exp

    @abstractmethod
    def execute(self, job: Job, spec: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                on_run: OnRun = None) -> Execution:
        """`spec` on `model` (as built for the experiment: adapters applied, the target's fallback not yet)
        and `inputs`, `job.repeats` times. Executors that run elsewhere use `model` only to check that
        their worker built the same."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalExecutor(Executor):
    """Every execution in this process, one after the other."""

    def execute(self, job, spec, model, inputs, on_run=None):
        return execute(spec, configured_model(model, spec, job.model.name), inputs, job.repeats, on_run=on_run,
                       warmup=self.exp.warmup)


def make_executor(settings: ExecutorSpec) -> Executor:
    """The executor `settings.kind` names (parity.plugins.EXECUTORS), set up as `settings` says."""
    from parity.plugins import EXECUTORS

    return EXECUTORS.get(settings.kind).make(settings)


class ExecutorPlugin(ABC):
    """An executor as registered in the `parity.executors` entry-point group: its spec (a subclass of
    config.schema.ExecutorSpec with `kind: Literal["<name>"]`, saying which settings apply to it) and how to
    make one."""

    name: ClassVar[str]
    Spec: ClassVar[type[ExecutorSpec]]

    @abstractmethod
    def make(self, settings: ExecutorSpec) -> Executor:
        """A new executor for `settings` (validated by `Spec`)."""


class LocalSpec(ExecutorSpec):
    kind: Literal["local"] = "local"

    @model_validator(mode="after")
    def _applies(self) -> LocalSpec:
        if self.timeout is not None or self.threads is not None:
            raise ValueError("'timeout' and 'threads' apply to the process and ray executors (the local executor "
                             "runs backends in this process and cannot stop one)")
        _ray_only(self)
        return self


def _ray_only(settings: ExecutorSpec) -> None:
    if settings.address is not None:
        raise ValueError("'address' applies to the ray executor")
    if settings.workers is not None:
        raise ValueError("'workers' applies to the ray executor without an address (the Ray it starts here; "
                         "a cluster runs as many tasks as its resources allow)")


class ProcessSpec(ExecutorSpec):
    kind: Literal["process"]

    @model_validator(mode="after")
    def _applies(self) -> ProcessSpec:
        _ray_only(self)
        return self


class RaySpec(ExecutorSpec):
    kind: Literal["ray"]

    @model_validator(mode="after")
    def _applies(self) -> RaySpec:
        if self.workers is not None and self.address is not None:
            raise ValueError("'workers' applies to the ray executor without an address (the Ray it starts here; "
                             "a cluster runs as many tasks as its resources allow)")
        return self

    @property
    def execution_threads(self) -> int | None:
        """One torch thread per execution unless told: Ray runs several executions at a time."""
        return self.threads or 1


class _Local(ExecutorPlugin):
    name, Spec = "local", LocalSpec

    def make(self, settings):
        return LocalExecutor()


class _Process(ExecutorPlugin):
    name, Spec = "process", ProcessSpec

    def make(self, settings):
        from parity.runner.process import ProcessExecutor

        return ProcessExecutor(settings.timeout_s, settings.threads)


class _Ray(ExecutorPlugin):
    name, Spec = "ray", RaySpec

    def make(self, settings):
        from parity.runner.ray_executor import RayExecutor

        return RayExecutor(settings.timeout_s, settings.execution_threads, settings.address, settings.workers)


LOCAL, PROCESS, RAY = _Local(), _Process(), _Ray()


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
             ex.warmup_outputs) = fields
            if not ex.ok:  # as execute() leaves a failed execution: no outputs
                ex.outputs, ex.run_s = [], []
            self.finished = True
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


class Digests:
    """The digest of each model this process built (execute/cache.py's model_digest), computed once per model."""

    def __init__(self):
        self._digests: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()

    def __call__(self, model: torch.nn.Module) -> str:
        from parity.execute.cache import model_digest

        if model not in self._digests:
            self._digests[model] = model_digest(model)
        return self._digests[model]


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
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def crash_report(path: Path | None) -> tuple[str | None, str | None]:
    """From a worker's faulthandler file: the fatal signal's name, and the innermost frame of the thread that
    ran the execution (the one whose stack holds parity's worker), as 'run (tiny.py:42)'."""
    if path is None or not path.is_file():
        return None, None
    text = path.read_text(errors="replace")
    name = next((sig for words, sig in _FATAL.items() if f"Fatal Python error: {words}" in text), None)
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text):
        frames = [m for m in map(_FRAME.match, block.splitlines()) if m]
        if any(m["path"].endswith(("parity/runner/worker.py", "parity/runner/ray_executor.py")) for m in frames):
            top = frames[0]
            return name, f"{top['func']} ({Path(top['path']).name}:{top['line']})"
    return name, None


def describe_worker_error(exc: BaseException) -> tuple[str, str]:
    """(failure class, message) for an exception raised while receiving a worker's results in this process
    (outputs that cannot be rebuilt here, for instance)."""
    from parity.execute.execution import _describe

    return tx.BACKEND_ERROR, f"the outputs could not be received from the worker: {_describe(exc)}"

