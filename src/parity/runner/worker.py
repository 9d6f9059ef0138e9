"""The worker side of the process and ray executors: rebuild the model from the experiment, run one
execution, report it as messages.

A worker gets the experiment, the model's name, the inputs (tensors), the example inputs the backend is
prepared from, the backend and the number of repeats, never a model: a model from someone's repository is imported from a path and may not unpickle
anywhere else, and rebuilding it from its spec (the seed, the weights file, the adapters) gives the same
weights, which the parent checks against its own build (the `built` message carries the digest).

Messages, in order: `("built", digest)`, then `("repeat", index, run_s, outputs, prepare_s, cached, notes,
warmup)` after each repeat, then `("done", status, error, failure_class, prepare_s, cached, notes, warmup,
traceback, warmup_outputs, captured, follow_up, tokens)` (captured: what instrumented model code recorded, execute/capture.py;
follow_up: what the model's task asked of the prepared backend afterwards, execute/follow_up.py; tokens: the texts
tokenized by both sides when the backend brings its own tokenizer).
Outputs are CPU tensors in the model's own structure (backends return them so), judged by the parent as the
local executor would.

`python -c "from parity.runner.worker import serve; serve()" FD` runs the process executor's worker: it
talks over the socket FD, keeps built models between executions, and dies with its parent.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import os
import pickle
import signal
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from parity import taxonomy as tx
from parity.config.schema import BackendSpec, Experiment, ModelSpec
from parity.errors import CacheLost, PlainLines
from parity.execute import follow_up
from parity.execute.cache import ArtifactCache
from parity.execute.execution import describe, ends_the_program, execute_together, format_traceback
from parity.inputs import Inputs
from parity.offline import die_with_parent
from parity.runner.prepared import ModelCopies, model_scope, prepared_model, task_follow_up
from parity.taxonomy import PREPARE, classify_exception


class ModelCache:
    """Built models (adapters applied), the last few kept: building a torchvision model costs seconds, and
    a worker usually runs every backend of one model in a row. Keyed by everything the experiment says
    the model is, so a worker that serves several experiments (Ray's) never mixes them up."""

    def __init__(self, size: int = 2):
        self.size = size
        self._models: OrderedDict[str, ModelCopies] = OrderedDict()

    @staticmethod
    def key(spec: ModelSpec, exp: Experiment) -> str:
        return json.dumps([spec.model_dump(mode="json"), exp.seed, str(exp.base_dir),
                           [a.model_dump(mode="json") for a in exp.adapters_for(spec)]], sort_keys=True, default=str)

    def get(self, spec: ModelSpec, exp: Experiment) -> ModelCopies:
        """The model, kept: each execution's copy deep-copied from it; its digest what the parent checks."""
        key = self.key(spec, exp)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        while len(self._models) >= self.size:
            self._models.popitem(last=False)
        model, _ = prepared_model(spec, exp)
        self._models[key] = ModelCopies(model, spec.name)
        return self._models[key]


MODELS = ModelCache()  # the models built by this process's Ray tasks (a Ray worker runs many)
ARTIFACTS = ArtifactCache(None)  # this worker's artifact cache: the parent's folder (prepare_worker)


def package_file() -> str:
    """The `__init__.py` of the parity this process imports, found without importing the package root (which
    would import the front ends): the parent and its workers must run the same one."""
    return str(Path(__file__).resolve().parent.parent / "__init__.py")


def run_execution(exp: Experiment, models: ModelCache, model_name: str, inputs: Inputs, example: Inputs | None,
                  spec: BackendSpec, repeats: int, send: Callable[[tuple], None]) -> None:
    """One execution, as `execute.execution.execute` runs it locally (prepared from `example`, None: from
    `inputs`), reported through `send`; its artifacts go to the cache `prepare_worker` opened."""
    model_spec = next(m for m in exp.models if m.name == model_name)
    try:
        copies = models.get(model_spec, exp)
    except Exception as exc:  # the parent built it; a worker that cannot is this execution's failure
        send(("done", "error", f"rebuilding the model in the worker failed: {describe(exc)}", classify_exception(exc, PREPARE),
              None, None, [], 0, format_traceback(exc), [], [], None, None))
        return
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # its builder ends the program here only (the parent's build returned)
        send(("done", "error", f"rebuilding the model in the worker failed: {ends_the_program(exc)}", tx.CRASH,
              None, None, [], 0, format_traceback(exc), [], [], None, None))
        return
    send(("built", copies.digest))

    def on_run(ex, repeat: int) -> None:
        send(("repeat", repeat, ex.run_s[repeat], ex.outputs[repeat], ex.prepare_s, ex.cached, ex.notes, ex.warmup))

    try:
        with model_scope(ARTIFACTS, model_spec, exp), follow_up.asking(task_follow_up(model_spec, exp)):
            [ex] = execute_together([(spec, lambda: copies.own(spec))], inputs, repeats,
                                    on_run=on_run, warmup=exp.warmup, example=example)
    except CacheLost as exc:  # the machine's problem, not this target's: the parent stops the run with it
        send(("lost", str(exc)))
        return
    send(("done", ex.status, ex.error, ex.failure_class, ex.prepare_s, ex.cached, ex.notes, ex.warmup, ex.traceback,
          ex.warmup_outputs, ex.captured, ex.follow_up, ex.tokens))


def send(conn, message: Any) -> None:
    """Plain pickle, by value: multiprocessing's own pickler (Connection.send) would hand tensors over as
    shared-memory handles (torch registers that), which need the two processes to trust each other's keys."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn) -> Any:
    return pickle.loads(conn.recv_bytes())


def use_cpus(n: int) -> None:
    """Keep this process to `n` CPUs, as its Ray task asked for: `n` torch threads, and `n` processes for
    torch.compile's code generation (inductor starts one per core by default, so a one-CPU task compiling
    would take every core of its machine, its neighbours' too). The compile setting goes through the
    environment while inductor is not imported yet (importing its config costs a second)."""
    torch.set_num_threads(n)
    if "torch._inductor.config" in sys.modules:
        sys.modules["torch._inductor.config"].compile_threads = n
    else:
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(n)


_crash_file = None  # kept open: faulthandler writes to its descriptor when the process dies


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """What a worker is told before its first execution (pickled to it: a process worker's pipe, a Ray task's
    argument): the parent's sys.path entries, its artifact cache's folder (None: no cache), the CPUs asked for
    (None: all) and where it writes its crash log (None: nowhere)."""

    sys_path: tuple[str, ...]
    cache_root: str | None
    threads: int | None
    crash_dir: str | None

    @classmethod
    def of_parent(cls, cache: ArtifactCache, threads: int | None, crash_dir: str | None) -> WorkerSettings:
        """This process's settings, for a worker it starts."""
        return cls(tuple(p for p in sys.path if p), None if cache.root is None else str(cache.root), threads, crash_dir)


def prepare_worker(settings: WorkerSettings) -> None:
    """Make this process run executions as the parent would: its sys.path entries (model modules next to
    the experiment, test fixtures), its artifact cache, the CPUs asked for; and say where it crashes or
    hangs (faulthandler writes the Python stack to `crash_dir`/worker-PID.log on a fatal signal, and on
    SIGUSR1)."""
    global _crash_file, ARTIFACTS
    logger = logging.getLogger("parity")
    if not any(getattr(h, "parity_worker", False) for h in logger.handlers):  # a Ray worker may serve several runs
        handler = logging.StreamHandler(sys.stderr)  # copied to the parent's stderr after each execution
        handler.setFormatter(PlainLines("%(message)s"))
        handler.parity_worker = True
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    for entry in reversed(settings.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    root = settings.cache_root
    ARTIFACTS = ArtifactCache(None if root is None else Path(root)).open()
    if settings.threads:
        use_cpus(settings.threads)
    if settings.crash_dir:
        path = Path(settings.crash_dir) / f"worker-{os.getpid()}.log"
        if _crash_file is None or _crash_file.name != str(path):  # a Ray worker may serve several runs
            if _crash_file is not None:
                _crash_file.close()
            _crash_file = open(path, "w")  # open for the life of the process
            faulthandler.enable(file=_crash_file, all_threads=True)
            if hasattr(signal, "SIGUSR1"):
                faulthandler.register(signal.SIGUSR1, file=_crash_file, all_threads=True)


def serve() -> None:
    """The process executor's worker: settings, the experiment, then one request per execution until the
    parent closes the connection."""
    from multiprocessing.connection import Connection

    die_with_parent()
    os.set_inheritable(int(sys.argv[1]), False)  # a process the model starts must not hold the parent's socket
    conn = Connection(int(sys.argv[1]))
    try:
        prepare_worker(receive(conn))
        exp: Experiment = receive(conn)
        models = ModelCache()
        send(conn, ("ready", os.getpid(), package_file()))
        while True:
            model_name, inputs, example, spec, repeats = receive(conn)
            run_execution(exp, models, model_name, inputs, example, spec, repeats, lambda message: send(conn, message))
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is done, or stopped listening
        return
