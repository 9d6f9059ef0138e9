"""The `parity` command in two processes, so that model code that ends the process never reads as exit 0."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys

from parity.cli.main import main
from parity.cli.terminal import EXIT_FAILED, EXIT_OK
from parity.offline import die_with_parent

VERDICT_FD = "PARITY_VERDICT_FD"  # set by the `parity` command's first process for the one that runs the command


def run_and_exit() -> None:
    """The `parity` command, in two processes. The first starts the second (`python -m parity.cli ARGS`) and
    waits: the second runs main() and, before it exits, writes its exit code to a pipe the first holds. Model
    code that ends the second process at once (os._exit(0) under the local executor: nothing in that process
    can stop it) leaves the pipe empty, and the first process says so and exits 1, never 0 without a verdict.
    The cost is one Python start (docs/benchmarks.md)."""
    if VERDICT_FD in os.environ:

        fd, parent = map(int, os.environ.pop(VERDICT_FD).split(":"))  # not inherited by workers or the model's processes
        die_with_parent(parent)  # killed with the first process (a CI step's time-out kills that one)
        _run_command(fd)
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-m", "parity.cli", *sys.argv[1:]], pass_fds=(write,),
                             env={**os.environ, VERDICT_FD: f"{write}:{os.getpid()}"})
    os.close(write)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the command's process too: it says "interrupted"
    for forwarded in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(forwarded, lambda signum, frame: child.send_signal(signum))
    returncode = child.wait()
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().strip()
    if said:
        os._exit(int(said))
    if returncode == 0:
        print("error: the command's process ended with exit 0 before parity gave its verdict: model code ended it "
              "(os._exit?); no verdict is given (exit 1). --executor process runs model code in a worker process, "
              "which cannot end the run", file=sys.stderr)
        os._exit(EXIT_FAILED)
    os._exit(returncode if returncode > 0 else 128 - returncode)  # killed by a signal: as a shell says it


def _run_command(verdict_fd: int) -> None:
    """main(), its exit code said on `verdict_fd`, then exit without tearing the interpreter down. Every file
    parity writes is closed by then; tearing down torch's and torchvision's modules would add over a second
    and, for that moment, about 100 MB to the peak memory of every command (measured on this project's
    machine: `import torch, torchvision` then a normal exit peaks at 816 MB, against 688 MB)."""
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, --version (0), a command line it refuses (2)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_FAILED
    with contextlib.suppress(OSError):
        os.write(verdict_fd, f"{code}\n".encode())
    try:
        atexit._run_exitfuncs()  # what libraries registered at exit (logging's flush, worker pools) still runs
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, or None (`>&-`)
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    run_and_exit()
