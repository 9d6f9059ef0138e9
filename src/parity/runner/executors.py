"""Executors: where executions run. The Runner (runner/runner.py) asks an executor for one execution at a
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

from parity.config.schema import ExecutorSpec
from parity.execute.execution import execute
from parity.runner.base import Executor
from parity.runner.prepared import configured_model


class LocalExecutor(Executor):
    """Every execution in this process, one after the other."""

    def execute(self, job, spec, model, inputs, on_run=None):
        return execute(spec, configured_model(model, spec, job.model.name), inputs, job.repeats, on_run=on_run,
                       warmup=self.exp.warmup)


def make_executor(settings: ExecutorSpec) -> Executor:
    if settings.kind == "process":
        from parity.runner.process import ProcessExecutor

        return ProcessExecutor(settings.timeout_s, settings.threads)
    if settings.kind == "ray":
        from parity.runner.ray_executor import RayExecutor

        return RayExecutor(settings.timeout_s, settings.execution_threads, settings.address, settings.workers)
    return LocalExecutor()
