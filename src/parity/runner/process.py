"""The process executor: every execution in a worker process, with a time limit.

One worker at a time runs the executions one after the other, as the local executor would, and is kept
between them (starting one imports torch: seconds). When a backend crashes the worker (a segfault, an
abort) its execution fails as `crash`, with the signal's name and, from faulthandler, the function it
died in; when an execution runs past the time limit, the worker's Python stack is dumped (to say where
it hung), the worker is killed and the execution fails as `timeout`. The next execution starts a fresh
worker, so the run goes on.

The worker is a new interpreter (`subprocess`, not `fork`: forking after torch started its thread pools
is unsafe; and not `multiprocessing`, which would import the caller's `__main__` again). It talks over a
socket pair with pickled messages (runner/worker.py says which); the backend's own prints on stdout
and stderr go to files, copied to this process's stdout and stderr after each execution (never a pipe
that a process the model started could hold open after parity ends). It runs in its own session: Ctrl-C reaches only this process, which
stops the worker; the kernel kills a worker whose parent died (Linux).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from parity import taxonomy as tx
from parity.errors import ParityError
from parity.execute.execution import Execution
from parity.offline import state_folder
from parity.runner.base import Executor
from parity.runner.remote import RemoteExecution, crash_report, describe_worker_error, ending
from parity.runner.worker import WorkerSettings, package_file, receive, send

STARTUP_S = 120.0  # at least this long to start a worker (importing torch on a busy machine), else the time limit
# Imports parity from where this process has it, even when only this process's sys.path says where.
_BOOT = ("import sys; root = sys.argv[2]; root in sys.path or sys.path.insert(0, root); "
         "from parity.runner.worker import serve; serve()")


class _Output:
    """A worker's stdout or stderr: a file in the scratch folder, copied to this process's stream after each
    execution. Not a pipe: a process the model starts in a session of its own (`setsid`, a daemon) keeps
    the worker's streams open after the worker is killed, and whoever reads a pipe (a CI step reading
    parity's output) waits until every process holding it has closed it."""

    def __init__(self, path: Path, stream: str):
        self.path, self.stream, self.offset = path, stream, 0
        self.file = path.open("wb")  # the worker's end; this process closes it once the worker has it

    def copy(self) -> None:
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        self.offset += len(data)
        if data:
            stream = getattr(sys, self.stream)
            stream.write(data.decode("utf-8", errors="replace"))
            stream.flush()


@dataclass
class _Worker:
    process: subprocess.Popen
    conn: Connection
    crash_file: Path
    started: float
    outputs: tuple[_Output, _Output]
    ready: bool = False
    busy: bool = False  # an execution was sent and its `done` not received yet

    def copy_output(self) -> None:
        for output in self.outputs:
            output.copy()


class ProcessExecutor(Executor):
    """Executions in a worker process, each within `timeout_s` seconds (building the model in a fresh
    worker, preparing the backend and every repeat); `threads`: the worker's CPUs, as torch threads and
    torch.compile processes (runner/worker.py's use_cpus; default: torch's own defaults)."""

    def __init__(self, timeout_s: float, threads: int | None = None):
        self.timeout_s = timeout_s
        self.threads = threads
        self._worker: _Worker | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._spawned = 0  # workers started: names their output files

    def start(self, exp, jobs, cache=None) -> None:
        super().start(exp, jobs, cache)
        self._scratch = tempfile.TemporaryDirectory(prefix="workers-", dir=state_folder())
        self._spawn()  # it imports torch while this process builds the first model

    def _spawn(self) -> None:
        assert self._scratch is not None, "start() first"
        ours, theirs = socket.socketpair()
        root = str(Path(package_file()).parent.parent)
        self._spawned += 1
        scratch = Path(self._scratch.name)
        outputs = (_Output(scratch / f"output-{self._spawned}.stdout", "stdout"),
                   _Output(scratch / f"output-{self._spawned}.stderr", "stderr"))
        try:
            process = subprocess.Popen([sys.executable, "-c", _BOOT, str(theirs.fileno()), root],
                                       pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=outputs[0].file,
                                       stderr=outputs[1].file, start_new_session=True)
        finally:
            theirs.close()
            for output in outputs:
                output.file.close()
        conn = Connection(ours.detach())
        send(conn, WorkerSettings.of_parent(self.cache, self.threads, self._scratch.name))  # small: they wait in the socket's buffer until the worker has started
        send(conn, self.exp)
        crash_file = Path(self._scratch.name) / f"worker-{process.pid}.log"
        self._worker = _Worker(process, conn, crash_file, time.monotonic(), outputs)

    @property
    def worker_pid(self) -> int | None:
        """The process id of the current worker (None between a crash and the next execution)."""
        return self._worker.process.pid if self._worker is not None else None

    def _ready(self) -> str | None:
        """None once a worker is ready for a request, else why none could start."""
        if self._worker is None:
            self._spawn()
        worker = self._worker
        if worker.ready:
            return None
        limit = max(self.timeout_s, STARTUP_S)
        if not worker.conn.poll(max(0.0, worker.started + limit - time.monotonic())):
            self._stop()
            return f"the worker process did not start within {limit:g} s"
        try:
            _, _, their_parity = receive(worker.conn)
        except (EOFError, OSError):
            how, _ = self._reap()
            return f"the worker process {how} while starting"
        if Path(their_parity).resolve() != Path(package_file()):
            self._stop()
            raise ParityError(f"the worker process imports parity from {their_parity}, this process from "
                              f"{package_file()}; set PYTHONPATH so that both find the same one")
        worker.ready = True
        return None

    def execute(self, job, spec, copies, inputs, on_run=None, example=None) -> Execution:
        """One execution in the worker; what it printed is copied to this process's streams afterwards."""
        if self._worker is None:
            self._spawn()
        worker = self._worker
        try:
            return self._execute(job, spec, copies, inputs, on_run, example)
        finally:
            worker.copy_output()

    def _execute(self, job, spec, copies, inputs, on_run, example) -> Execution:
        remote = RemoteExecution(job, spec, copies.digest, on_run)
        problem = self._ready()
        if problem is not None:
            return remote.fail(tx.CRASH, problem)
        worker = self._worker
        try:
            # one pickle: an example that is the inputs themselves travels once
            send(worker.conn, (job.model.name, inputs, example, spec, job.repeats))
        except OSError:
            return remote.crashed(*self._reap())
        worker.busy = True
        deadline = time.monotonic() + self.timeout_s
        unreadable = None  # outputs this process cannot unpickle: the execution fails once the worker is done
        while not remote.finished:
            if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                return remote.timed_out(self.timeout_s, self._stop(dump_stack=True))
            try:
                message = receive(worker.conn)
            except (EOFError, OSError):
                return remote.crashed(*self._reap())
            except Exception as exc:  # e.g. an output class that does not import here
                unreadable = unreadable or exc
                continue
            remote.receive(message)
        worker.busy = False
        if unreadable is not None:
            return remote.fail(*describe_worker_error(unreadable))
        return remote.execution

    def _reap(self) -> tuple[str, str | None]:
        """After the worker's connection broke: how it ended ('died of SIGSEGV') and where."""
        worker, self._worker = self._worker, None
        try:
            code = worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # it closed the connection but lives on: it is of no use now
            self._kill(worker)
            code = worker.process.wait()
        self._kill(worker)  # what it started (compile workers) must not outlive it
        _, site = crash_report(worker.crash_file)
        worker.conn.close()
        return ending(code), site

    def _stop(self, dump_stack: bool = False) -> str | None:
        """Kill the worker (and anything it started); first, when asked, have it write its Python stack and
        return where it was."""
        worker, self._worker = self._worker, None
        if worker is None:
            return None
        site = None
        if dump_stack and hasattr(signal, "SIGUSR1") and worker.process.poll() is None:
            before = worker.crash_file.stat().st_size if worker.crash_file.exists() else 0
            os.kill(worker.process.pid, signal.SIGUSR1)
            for _ in range(20):  # faulthandler writes from the signal handler: at once, unless the process is stopped
                time.sleep(0.05)
                if worker.crash_file.exists() and worker.crash_file.stat().st_size > before:
                    break
            _, site = crash_report(worker.crash_file)
        self._kill(worker)
        worker.process.wait()
        worker.conn.close()
        return site

    @staticmethod
    def _kill(worker: _Worker) -> None:
        try:
            os.killpg(worker.process.pid, signal.SIGKILL)  # the worker's session: its own children too
        except ProcessLookupError:
            pass

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.conn.close()  # an idle worker reads EOF and exits
            try:
                # a busy one (the run stopped early) is killed, and one still starting (nothing was run) too
                worker.process.wait(timeout=0 if worker.busy or not worker.ready else 10)
            except subprocess.TimeoutExpired:
                pass
            self._kill(worker)  # and what it started in its session, which would outlive it
            worker.process.wait()
            worker.copy_output()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
