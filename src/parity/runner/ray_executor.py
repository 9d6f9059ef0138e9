"""The ray executor: executions as Ray tasks, several at a time, on this machine or a Ray cluster.

At `start`, every execution of the plan becomes a task: references and oracles first, then targets the
costliest to prepare first (compilations, then exports, then traces: Backend.preparation_cost), else in
plan order (costliest_first). Each (model, input set)'s inputs are put in the object store once and
shared by the tasks of its reference, oracle and targets, and the experiment once for all. A task asks for `threads` CPUs (and keeps to them: that many torch threads and
compile processes), and a CUDA backend's task also for one GPU, so Ray runs as many at a time as the
cluster has room for; a worker process rebuilds each model from the experiment and keeps it for the next
task (runner/worker.py).

The runner asks for executions in plan order, as with the other executors, and judges each check in
this process as soon as its target's and its reference's tasks are done: the reference's outputs are
fetched from the object store once per (model, input set) and every target is judged against them.
While it waits, it watches every running task: a task that runs past the time limit (counted from its
start, not from its submission) is cancelled (its worker killed) and fails as `timeout`; a task whose
worker dies fails as `crash`, with the signal and the function it died in when the worker ran on this
machine (faulthandler's file). Tasks are never retried: a backend that crashes once would crash again.

A worker's records differ from the process executor's in one way: a task reports when it is done, so a
worker that dies in its third repeat leaves one `crash` execution record rather than two `ok` ones first.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import parity
from parity.backends import backend_class
from parity.errors import ParityError
from parity.runner.execute import Execution
from parity.runner.executors import Digests, Executor, RemoteExecution, crash_report
from parity.verify import taxonomy as tx


def _execution_task(settings: dict[str, Any], exp, model_name: str, inputs, spec, repeats: int):
    """A Ray task (a generator): says it started, then hands over every message of the execution at once."""
    from parity.runner.worker import MODELS, prepare_worker, run_execution

    yield ("started", os.getpid(), socket.gethostname())
    prepare_worker(settings)
    messages: list[tuple] = []
    run_execution(exp, MODELS, model_name, inputs, spec, repeats, messages.append)
    yield messages


def costliest_first(executions: list[tuple]) -> list[tuple]:
    """(job, spec, ...) in the order to submit them: every reference and oracle first, then the targets by
    their backend's preparation cost, highest first, else in the order given. References first: no check
    can be judged, nor a record written, before its reference ran (a run killed early must leave something
    to resume from). Then longest first keeps every worker busy to the end (a compilation started last
    would run alone while the others wait)."""
    def order(execution: tuple) -> tuple[int, int]:
        job, spec = execution[:2]
        return (0, 0) if spec is job.reference or spec is job.oracle else (1, -backend_class(spec.backend).preparation_cost)
    return sorted(executions, key=order)


@dataclass
class _Task:
    job: Any
    spec: Any
    generator: Any = None  # the task's ObjectRefGenerator; None when it was never submitted
    started: float | None = None  # when this process learnt that it started
    pid: int | None = None
    host: str | None = None
    messages: list[tuple] | None = None
    failure: tuple[str, str, str | None] | None = None  # (failure class, how, where)
    unavailable: str | None = None
    finished: bool = field(default=False)


class RayExecutor(Executor):
    """Executions as Ray tasks, each within `timeout_s` seconds of its start, on `threads` CPUs each (default
    1; runner/worker.py's use_cpus). `address`: a Ray cluster to join; without one, a Ray instance already
    started in this process is used, else a local one is started (and stopped at `close`), with room for
    `workers` tasks at a time (default: as many as this machine's cores allow)."""

    def __init__(self, timeout_s: float, threads: int | None = None, address: str | None = None,
                 workers: int | None = None):
        self.timeout_s = timeout_s
        self.threads = threads or 1
        self.address = address
        self.workers = workers
        self._tasks: dict[tuple, _Task] = {}
        self._running: dict[int, _Task] = {}  # by id() of the generator
        self._digest = Digests()
        self._started_ray = False
        self._scratch: tempfile.TemporaryDirectory | None = None

    def start(self, exp, jobs) -> None:
        super().start(exp, jobs)
        if not jobs:  # a finished run started again: nothing to run, so no Ray to start (seconds)
            return
        from parity.inputs import build_inputs
        from parity.runner import cache

        ray = self._ray()
        self._init(ray)
        self._gpus = ray.cluster_resources().get("GPU", 0)
        self._remote = ray.remote(max_retries=0)(_execution_task)
        self._scratch = tempfile.TemporaryDirectory(prefix="parity-ray-")
        self._settings = {"sys_path": [p for p in sys.path if p], "threads": self.threads, "crash_dir": self._scratch.name,
                          "cache_root": str(cache.root()) if cache.root() else None}
        self._exp_ref = ray.put(exp)
        executions = []
        for job in jobs:
            try:
                inputs = ray.put(build_inputs(job.inputs, exp, job.model.batch_mode))
            except Exception:  # the runner builds them again and says why they cannot be built, in its turn
                continue
            executions += [(job, spec, inputs) for spec in job.backends]
        for job, spec, inputs in costliest_first(executions):
            self._tasks[self._key(job, spec)] = self._submit(job, spec, inputs)

    @staticmethod
    def _ray():
        try:
            import ray
        except ImportError as exc:
            raise ParityError("the ray executor needs Ray: pip install 'parity[ray]'") from exc
        return ray

    def _init(self, ray) -> None:
        if ray.is_initialized():
            if self.workers is not None:
                raise ParityError("the ray executor's 'workers' sizes the Ray it starts, but this process already "
                                  "runs one: size that one (ray.init(num_cpus=...)), or leave 'workers' out")
            return
        if self.address:
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
            return
        # Workers of a local instance inherit this environment: they must import the parity this process runs.
        root = str(Path(parity.__file__).resolve().parent.parent)
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *([before] if before else [])])
        try:
            cpus = None if self.workers is None else self.workers * self.threads
            ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        finally:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before
        self._started_ray = True

    @staticmethod
    def _key(job, spec) -> tuple:
        return job.model.name, job.inputs.name, id(spec)

    def _submit(self, job, spec, inputs_ref) -> _Task:
        task = _Task(job, spec)
        cuda = spec.device.startswith("cuda")
        if cuda and not self._gpus:
            task.unavailable, task.finished = "the Ray cluster has no GPU", True
            return task
        options = {"num_cpus": self.threads, "num_gpus": 1 if cuda else 0}
        task.generator = self._remote.options(**options).remote(self._settings, self._exp_ref, job.model.name,
                                                                   inputs_ref, spec, job.repeats)
        self._running[id(task.generator)] = task
        return task

    def execute(self, job, spec, model, inputs, on_run=None) -> Execution:
        task = self._tasks.pop(self._key(job, spec), None)
        if task is None:  # not in the plan given to start()
            task = self._submit(job, spec, self._ray().put(inputs))
        self._pump(until=task)
        if task.unavailable:
            return Execution(spec, "unavailable", error=task.unavailable)
        remote = RemoteExecution(job, spec, self._digest(model), on_run, streamed=False)
        for message in task.messages or []:
            remote.receive(message)
        if task.failure is not None:
            failure_class, how, site = task.failure
            if failure_class == tx.TIMEOUT:
                return remote.timed_out(self.timeout_s)
            if failure_class == tx.CRASH:
                return remote.crashed(how, site)
            return remote.fail(failure_class, how)
        if not remote.finished:
            return remote.crashed("ended without a result")
        return remote.execution

    def _pump(self, until: _Task) -> None:
        """Take in what the running tasks report, and stop those past the time limit, until `until` is finished."""
        ray = self._ray()
        while not until.finished:
            now = time.monotonic()
            for task in list(self._running.values()):
                if task.started is not None and now - task.started > self.timeout_s:
                    ray.cancel(task.generator, force=True)
                    self._finish(task, failure=(tx.TIMEOUT, "", None))
            if until.finished or not self._running:
                break
            deadlines = [t.started + self.timeout_s - now for t in self._running.values() if t.started is not None]
            wait = min([1.0, *deadlines])
            ready, _ = ray.wait([t.generator for t in self._running.values()], num_returns=1, timeout=max(wait, 0.01))
            for generator in ready:
                self._take(self._running[id(generator)])

    def _take(self, task: _Task) -> None:
        """The next thing a task yielded (it is ready): its start, its messages, or how it failed."""
        ray = self._ray()
        try:
            item = ray.get(next(task.generator))
        except StopIteration:
            self._finish(task, failure=None if task.messages is not None else (tx.CRASH, "ended without a result", None))
            return
        except ray.exceptions.WorkerCrashedError:
            signal_name, site = crash_report(self._crash_file(task))
            self._finish(task, failure=(tx.CRASH, f"died of {signal_name}" if signal_name else "died", site))
            return
        except ray.exceptions.OutOfMemoryError:
            self._finish(task, failure=(tx.CRASH, "was killed by Ray's memory monitor (out of memory)", None))
            return
        except ray.exceptions.RayTaskError as exc:  # the task itself raised, outside the backend
            self._finish(task, failure=(tx.BACKEND_ERROR, f"the Ray task raised: {str(exc).strip().splitlines()[-1]}", None))
            return
        except Exception as exc:  # e.g. outputs whose classes do not import in this process
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._finish(task, failure=(tx.BACKEND_ERROR, f"its result could not be received: {type(exc).__name__}: {first}", None))
            return
        if isinstance(item, tuple) and item and item[0] == "started":
            task.started, task.pid, task.host = time.monotonic(), item[1], item[2]
        else:
            task.messages = item
            self._finish(task)

    def _crash_file(self, task: _Task) -> Path | None:
        if self._scratch is None or task.pid is None or task.host != socket.gethostname():
            return None  # another machine's file
        return Path(self._scratch.name) / f"worker-{task.pid}.log"

    def _finish(self, task: _Task, failure: tuple[str, str, str | None] | None = None) -> None:
        task.failure = failure
        task.finished = True
        self._running.pop(id(task.generator), None)

    def close(self) -> None:
        if "ray" in sys.modules:
            ray = sys.modules["ray"]
            for task in self._running.values():  # asked for by no one (a run that stopped early)
                ray.cancel(task.generator, force=True)
            self._running.clear()
            self._tasks.clear()
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
