"""What the `parity` command's second process costs (cli.run_and_exit): the command as users run it (a first
process that starts the command's process and waits for its verdict, so that model code calling os._exit(0)
cannot end it with exit 0) against the command's process alone (as `parity` ran before: PARITY_VERDICT_FD set
to a file that takes the verdict), side by side, alternating, for --rounds rounds, on a tiny run and on
`parity --version` (only the start). Medians and their difference are printed.

    .venv/bin/python benchmarks/command_process.py [--rounds 5] [--config tests-tiny]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TINY = {"name": "tiny", "models": [{"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}],
        "inputs": [{"name": "noise", "synthetic": {"shape": [2, 3, 8, 8]}}],
        "targets": [{"backend": "eager", "name": "same"}]}


def timed(argv: list[str], cwd: Path, one_process: bool) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "PARITY_CACHE_DIR": "off"}
    with open(os.devnull, "wb") as sink:
        if one_process:
            env["PARITY_VERDICT_FD"] = f"{sink.fileno()}:{os.getpid()}"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "parity.cli", *argv], cwd=cwd, env=env, pass_fds=(sink.fileno(),),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        took = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr.decode()[-2000:])
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "exp.yaml").write_text(yaml.safe_dump(TINY))
        cases = {"tiny run": ["run", "exp.yaml", "--out", "out", "--quiet", "--fresh"], "--version": ["--version"]}
        for name, argv in cases.items():
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.rounds):
                for one in (True, False):
                    times[one].append(timed(argv, work, one))
            one, two = statistics.median(times[True]), statistics.median(times[False])
            print(f"{name}: one process {one:.3f} s, two processes {two:.3f} s: +{two - one:.3f} s ({two / one:.3f}x); "
                  f"rounds one {[round(t, 3) for t in times[True]]}, two {[round(t, 3) for t in times[False]]}")


if __name__ == "__main__":
    main()
