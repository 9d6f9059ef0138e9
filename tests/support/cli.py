"""The one way tests drive the `parity` command: in this process (`parity`, `run_experiment`) or, where a test
needs what a user's own process gives (model code imported afresh, no state from the test process), in a new
interpreter (`parity_process`)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from parity.cli import main
from parity.records import read_records
from tests.support import ROOT


@dataclass
class Ran:
    """What one in-process command gave: its exit code, what it printed, its experiment file and its --out
    folder."""

    code: int
    printed: str
    path: Path | None = None
    out: Path | None = None

    @property
    def said(self) -> str:
        """What it printed with each wrapped line joined again (the console indents a continuation by two)."""
        return self.printed.replace("\n  ", " ")

    def records(self) -> list[dict]:
        return read_records(self.out)

    def checks(self, tier: int = 1) -> dict[str, dict]:
        """The run's checks of one tier, by target."""
        return {r["target"]: r for r in self.records() if r["kind"] == "check" and r["tier"] == tier}


def parity(*argv: str, capsys=None) -> Ran:
    """`parity ARGV` in this process; `printed` is its stdout when the test hands its capsys."""
    code = main([str(a) for a in argv])
    return Ran(code, capsys.readouterr().out if capsys else "")


def run_experiment(exp: dict, folder: Path, *extra: str, capsys=None, name: str = "out",
                   file_name: str = "exp.yaml") -> Ran:
    """`parity run` of the experiment `exp`, written to `folder/file_name`, into `folder/name`, quiet."""
    path = folder / file_name
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    out = folder / name
    ran = parity("run", path, "--out", out, "--quiet", *extra, capsys=capsys)
    return Ran(ran.code, ran.printed, path, out)


def process_command(*argv: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `parity ARGV` in its own interpreter, with this checkout's parity
    and test fixtures importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return [sys.executable, "-m", "parity.cli", *map(str, argv)], env


def parity_process(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`parity ARGV` in its own interpreter, as a user runs it, to its end."""
    command, env = process_command(*argv)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
