"""The ray executor: executions as Ray tasks, several at a time, on this machine or a Ray cluster.

At `start`, every execution of the plan becomes a task: references and oracles first, then targets the
costliest to prepare first (compilations, then exports, then traces: Backend.preparation_cost), else in
plan order (submission_order). Each (model, input set)'s inputs are put in the object store once and
shared by the tasks of its reference, oracle and targets (and, as the example they are prepared from, by
every job of the model), and the experiment once for all. A task asks for `threads` CPUs (and keeps to them: that many torch threads and
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

Offline and contained, as every executor: a Ray started here listens on the loopback address only (no
probe of 8.8.8.8 for the machine's address), sends no usage stats (whose cloud probe asked the metadata
address 169.254.169.254 over HTTP), runs no dashboard, authenticates with a token kept in its
environment (not `~/.ray/auth_token`), and keeps its session folder (sockets, logs, spilled objects) in
this executor's scratch folder, removed at `close`: nothing in HOME, nothing left in TMPDIR. Joining a
cluster (`address`) sends no usage stats either; that cluster's own settings are its owner's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity import taxonomy as tx
from parity.backends import backend_class
from parity.errors import ParityError
from parity.execute.execution import Execution
from parity.inputs import build_inputs
from parity.offline import put_environ, state_folder
from parity.runner.base import Executor
from parity.runner.remote import RemoteExecution, crash_report, describe_worker_error
from parity.runner.worker import MODELS, WorkerSettings, package_file, prepare_worker, run_execution


def _execution_task(settings: WorkerSettings, exp, model_name: str, inputs, example, spec, repeats: int):
    """A Ray task (a generator): says it started, then hands over every message of the execution at once."""
    yield ("started", os.getpid(), socket.gethostname())
    prepare_worker(settings)
    messages: list[tuple] = []
    run_execution(exp, MODELS, model_name, inputs, example, spec, repeats, messages.append)
    yield messages


def submission_order(jobs: list) -> list[tuple]:
    """(job, spec) for every execution of `jobs`, in the order to submit them: every reference and oracle
    first, in plan order, since no check can be judged before its reference ran; then every target, the
    costliest to prepare first (compilations, then exports, then traces: Backend.preparation_cost), else in
    plan order. Longest first keeps every worker busy to the end: a compilation started last would run
    alone while the others wait (on 2 cores, 2 workers / 1 took 0.62 in plan order, 0.59 this way). The
    price: the runner judges in plan order, so the first model's checks wait for its cheapest target,
    started late; the executor reports how many tasks are done meanwhile (`on_status`)."""
    references = [(job, spec) for job in jobs for spec in job.baselines]
    targets = [(job, spec) for job in jobs for spec in job.targets]
    return references + sorted(targets, key=lambda e: -backend_class(e[1].backend).preparation_cost)


RAY_OFFLINE = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage report
# A Ray started here: on the loopback address (Ray otherwise finds the machine's address by a UDP connect to
# 8.8.8.8 and listens there), and every HTTP request its processes make sent to a proxy that refuses it at
# once (the discard port on the loopback address): its dashboard process asks the cloud metadata address
# which cloud it runs on at start, usage stats or not, with no switch to stop it.
NO_HTTP = "http://127.0.0.1:9"
RAY_LOCAL = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **{name: NO_HTTP for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY")},
             "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"}
# Unix socket paths hold at most 107 bytes on Linux; Ray puts its sockets at
# TEMP_DIR/session_2026-12-02_00-49-05_722273_8542/sockets/plasma_store (TEMP_DIR plus about 64).
SOCKET_PATH_LIMIT, RAY_SOCKET_SUFFIX = 107, 64
_TOKEN = secrets.token_hex(32)  # this process's local Ray: its driver and workers share it through the environment


def _local_token() -> dict[str, str]:
    """Ray's token authentication for the instance started here, with the token in its environment: Ray would
    otherwise write one to ~/.ray/auth_token (and a token path the user set would point elsewhere)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN, "RAY_AUTH_TOKEN_PATH": None}


@contextlib.contextmanager
def _environment(settings: dict[str, str | None]):
    """os.environ with `settings` (None: unset), restored after."""
    before = put_environ(settings)
    try:
        yield
    finally:
        put_environ(before)


def _reread_ray_config(ray) -> None:
    """Ray's native settings were read from the environment when Ray was imported: read them again (as Ray's
    own ray.init does when it turns token authentication on), so this driver speaks the token its Ray asks for."""
    config = getattr(getattr(ray, "_raylet", None), "Config", None)
    if config is not None and hasattr(config, "initialize"):
        config.initialize("")


def _check_socket_room(temp_dir: Path) -> None:
    """A temporary folder too deep for Ray's sockets is the user's to fix, said before Ray starts (Ray itself
    fails deep inside its startup)."""
    length = len(os.fsencode(temp_dir)) + RAY_SOCKET_SUFFIX
    if length > SOCKET_PATH_LIMIT:
        raise ParityError(f"TMPDIR {tempfile.gettempdir()}: Ray's socket paths under it would be {length} bytes long, "
                          f"over the {SOCKET_PATH_LIMIT} the system allows; set TMPDIR to a shorter folder (e.g. /tmp)")


@dataclass
class _Task:
    job: Any
    spec: Any
    generator: Any = None  # the task's ObjectRefGenerator; None when it was never submitted
    started: float | None = None  # when this process learnt that it started
    pid: int | None = None
    host: str | None = None
    result: Any = None  # the ObjectRef of its messages, fetched when the runner asks for this execution
    failure: tuple[str, str, str | None] | None = None  # (failure class, how, where)
    unavailable: str | None = None
    finished: bool = field(default=False)


class RayExecutor(Executor):
    """Executions as Ray tasks, each within `timeout_s` seconds of its start, on `threads` CPUs each (default
    1; runner/worker.py's use_cpus). `address`: a Ray cluster to join; without one, a Ray instance already
    started in this process is used (then `workers` is refused: that Ray has its size), else a local one is
    started (and stopped at `close`), with room for `workers` tasks at a time (default: as many as this
    machine's cores allow)."""

    def __init__(self, timeout_s: float, threads: int | None = None, address: str | None = None,
                 workers: int | None = None):
        self.timeout_s = timeout_s
        self.threads = threads or 1
        self.address = address
        self.workers = workers
        self._tasks: dict[tuple, _Task] = {}
        self._running: dict[int, _Task] = {}  # by id() of the generator
        self._submitted = 0  # tasks; those not in _running are done
        self._started_ray = False
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._environment = contextlib.ExitStack()  # Ray's settings in os.environ, until close

    def start(self, exp, jobs, cache=None) -> None:
        super().start(exp, jobs, cache)
        if not jobs:  # a finished run started again: nothing to run, so no Ray to start (seconds)
            return
        ray = self._ready()
        refs: dict[tuple, Any] = {}  # by (model, input set): an input set is put once, examples included

        def put(job, input_set):
            key = job.model.name, input_set.name
            if key not in refs:
                refs[key] = ray.put(build_inputs(input_set, exp, job.model.batch_mode))
            return refs[key]

        inputs = {}
        for job in jobs:
            try:
                inputs[id(job)] = put(job, job.inputs), put(job, job.prepared_from)
            except Exception:  # the runner builds them again and says why they cannot be built, in its turn
                continue
        for job, spec in submission_order([job for job in jobs if id(job) in inputs]):
            self._tasks[self._key(job, spec)] = self._submit(job, spec, *inputs[id(job)])

    def _ready(self):
        """Ray, started or joined, with the task and what every task shares; once."""
        if self._scratch is not None:
            return self._ray()
        local = not self.address and not ("ray" in sys.modules and sys.modules["ray"].is_initialized())
        # Before Ray is imported where possible: it reads some of them once, at import.
        self._environment.enter_context(_environment({**RAY_OFFLINE, **(RAY_LOCAL | _local_token() if local else {})}))
        ray = self._ray()
        scratch = tempfile.TemporaryDirectory(prefix="r", dir=state_folder())  # short: Ray's socket paths lie under it
        try:
            self._init(ray, Path(scratch.name))
        except BaseException:
            scratch.cleanup()
            raise
        self._scratch = scratch
        self._gpus = ray.cluster_resources().get("GPU", 0)
        self._remote = ray.remote(max_retries=0)(_execution_task)
        self._settings = WorkerSettings.of_parent(self.cache, self.threads, self._scratch.name)
        self._exp_ref = ray.put(self.exp)
        return ray

    @staticmethod
    def _ray():
        try:
            import ray
        except ImportError as exc:
            raise ParityError("the ray executor needs Ray: pip install 'parity[ray]'") from exc
        return ray

    def _init(self, ray, scratch: Path) -> None:
        if ray.is_initialized():
            if self.workers is not None:
                raise ParityError("the ray executor's 'workers' sizes the Ray it starts, but this process already "
                                  "runs one: size that one (ray.init(num_cpus=...)), or leave 'workers' out")
            return
        if self.address:
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
            return
        # Workers of a local instance inherit this environment: they must import the parity this process runs.
        root = str(Path(package_file()).parent.parent)
        before = os.environ.get("PYTHONPATH")
        _check_socket_room(scratch)
        cpus = self.workers * self.threads if self.workers else None
        if cpus is None and self.threads > (os.cpu_count() or 1):  # else no task would ever fit
            cpus = self.threads
        _reread_ray_config(ray)
        with _environment({"PYTHONPATH": os.pathsep.join([root, *([before] if before else [])])}):
            ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                     _temp_dir=str(scratch))
        self._started_ray = True

    @staticmethod
    def _key(job, spec) -> tuple:
        return job.model.name, job.inputs.name, id(spec)

    def _submit(self, job, spec, inputs_ref, example_ref) -> _Task:
        task = _Task(job, spec)
        cuda = spec.device.startswith("cuda")
        if cuda and not self._gpus:
            task.unavailable, task.finished = "the Ray cluster has no GPU", True
            return task
        options = {"num_cpus": self.threads, "num_gpus": 1 if cuda else 0}
        task.generator = self._remote.options(**options).remote(self._settings, self._exp_ref, job.model.name,
                                                                   inputs_ref, example_ref, spec, job.repeats)
        self._running[id(task.generator)] = task
        self._submitted += 1
        return task

    def execute(self, job, spec, copies, inputs, on_run=None, example=None) -> Execution:
        task = self._tasks.pop(self._key(job, spec), None)
        if task is None:  # not in the plan given to start()
            ray = self._ready()
            task = self._submit(job, spec, ray.put(inputs), None if example is None else ray.put(example))
        self._pump(until=task)
        if task.unavailable:
            return Execution(spec, "unavailable", error=task.unavailable)
        messages = self._get(task, task.result) if task.result is not None else None
        remote = RemoteExecution(job, spec, copies.digest, on_run, streamed=False)
        for message in messages or []:
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
            if self.on_status is not None:
                done = self._submitted - len(self._running)
                self.on_status(f"ray {done}/{self._submitted} done, next {until.job.model.name} / {until.spec.id}")

    def _take(self, task: _Task) -> None:
        """The next thing a task yielded (it is ready): first that it started, then its messages, which stay
        in the object store until the runner asks for this execution (so this process holds no outputs it
        does not need yet, however far ahead the workers run)."""
        try:
            ref = next(task.generator)
        except StopIteration:
            self._finish(task, failure=(tx.CRASH, "ended without a result", None))
            return
        except Exception as exc:
            self._finish(task, failure=self._failure(task, exc))
            return
        if task.started is not None:
            task.result = ref
            self._finish(task)
            return
        item = self._get(task, ref)
        if item is not None:
            task.started, task.pid, task.host = time.monotonic(), item[1], item[2]

    def _get(self, task: _Task, ref):
        """The value of `ref`, or None when it holds the task's failure (then the task is finished with it)."""
        try:
            return self._ray().get(ref)
        except Exception as exc:
            self._finish(task, failure=self._failure(task, exc))
            return None

    def _failure(self, task: _Task, exc: Exception) -> tuple[str, str, str | None]:
        """What Ray's exception says of the task: (failure class, how, where)."""
        ray = self._ray()
        if isinstance(exc, ray.exceptions.WorkerCrashedError):
            signal_name, site = crash_report(self._crash_file(task))
            return tx.CRASH, f"died of {signal_name}" if signal_name else "died", site
        if isinstance(exc, ray.exceptions.OutOfMemoryError):
            return tx.CRASH, "was killed by Ray's memory monitor (out of memory)", None
        if isinstance(exc, ray.exceptions.RayTaskError):  # the task itself raised, outside the backend
            return tx.BACKEND_ERROR, f"the Ray task raised: {str(exc).strip().splitlines()[-1]}", None
        return *describe_worker_error(exc), None  # e.g. outputs whose classes do not import here

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
        self._environment.close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
