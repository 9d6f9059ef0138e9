"""Executors: where executions run. The Runner (runner/runner.py) asks an executor for one execution at a
time and judges it; the executor decides where the backend runs:

- `local`: in this process (the default). A backend that segfaults or hangs takes the run with it. The
  backends of one job are prepared together and their timed repeats interleaved when there are repeats to take
  turns with (more than one) and their copies of the model fit in memory together (each then deep-copied from
  a model kept beside them); else one at a time, so that memory holds one copy (runner/prepared.py `ModelCopies`:
  the runner keeps no model beside it, each copy is built again from the model's spec).
- `process`: in a worker process with a time limit (runner/process.py). A crash or a hang fails that
  execution's checks as `crash` or `timeout`, and the next execution gets a fresh worker. Each execution is
  timed alone (`latency_interleaved: false`).
- `ray`: as Ray tasks, several at a time (runner/ray_executor.py), with the same crash and time-limit rules.

Whatever the executor, the records are the same: the same execution records, with outputs judged in
this process by the same code. Workers rebuild each model from the experiment (runner/worker.py) rather
than receive a pickled one, and the parent checks that they built the same weights as it did.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import model_validator

from parity.config.schema import ExecutorSpec
from parity.execute.execution import execute_together
from parity.plugins import EXECUTORS
from parity.runner.base import Executor
from parity.runner.prepared import ModelCopies
from parity.runner.process import ProcessExecutor
from parity.runner.ray_executor import RayExecutor

log = logging.getLogger(__name__)


class LocalExecutor(Executor):
    """Every execution in this process; the backends of one job prepared together and their timed repeats
    interleaved (execute.execution.execute_together) when each is timed more than once and their copies of the
    model fit in memory together (`fits_together`), else one at a time: each prepared, run and closed before the
    next makes its copy. With one timed run a backend there are no turns to take, and holding every backend at
    once would only hold every backend's copy, artifacts and outputs together (make llm-demo: nine language-model
    targets, docs/benchmarks.md)."""

    def execute(self, job, spec, copies, inputs, on_run=None, example=None):
        [result] = self.execute_together(job, [spec], copies, inputs, on_run, example)
        return result

    def execute_together(self, job, specs, copies, inputs, on_run=None, example=None, on_step=None, on_done=None):
        available = available_memory()
        together = job.repeats > 1 and fits_together(copies, len(specs), available)
        if not together and len(specs) > 1 and job.repeats > 1:
            log.info("model %s: its %d backends run one at a time, each making its own copy when it runs: %d copies of "
                     "%.2f GB would take more than %.0f%% of the memory available (%s); each is timed alone",
                     job.model.name, len(specs), len(specs), copies.bytes / 1e9, SHARE * 100,
                     "unknown" if available is None else f"{available / 1e9:.1f} GB")
        if together:  # every copy alive at once: each deep-copied from a kept model (one copy more), not built again
            copies.keep()
        own = [(spec, lambda spec=spec: copies.own(spec)) for spec in specs]
        return execute_together(own, inputs, job.repeats, on_run=on_run, warmup=self.exp.warmup, example=example,
                                on_step=on_step, interleave=together, on_done=on_done)


# The share of the available memory that the copies of a job's backends may take together, for their timed runs to
# take turns: a backend can hold as much again as its copy (an export beside the module, a runtime's own weights).
SHARE = 0.25


def fits_together(copies: ModelCopies, n: int, available: int | None) -> bool:
    """Whether `n` of the model's `copies` take at most SHARE of `available` bytes (None: unknown, so no)."""
    return available is not None and n * copies.bytes <= SHARE * available


def available_memory() -> int | None:
    """Bytes this process can still take without swapping: the kernel's MemAvailable, within the cgroup's limit
    (a container's) when it has one; None where neither can be read (not Linux)."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def make_executor(settings: ExecutorSpec) -> Executor:
    """The executor `settings.kind` names (parity.plugins.EXECUTORS), set up as `settings` says."""
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
        return ProcessExecutor(settings.timeout_s, settings.threads)


class _Ray(ExecutorPlugin):
    name, Spec = "ray", RaySpec

    def make(self, settings):
        return RayExecutor(settings.timeout_s, settings.execution_threads, settings.address, settings.workers)


LOCAL, PROCESS, RAY = _Local(), _Process(), _Ray()
