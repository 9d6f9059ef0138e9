"""What the hostile corpora (tests/hostile/test_hostile_*.py) share: run `parity` in-process in a case folder and
see what it wrote, by path and by content, anywhere in that folder.

Every case ends one of the ways the README promises: exit 2 with one `error:` line naming what to fix
(no traceback), or a run whose verdicts are true (exit 1 when a target failed; never 0 on garbage). And
nothing changes outside `--out` and the cache: not a byte of a file a link points to, not a new file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from parity.cli import main


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` (links not followed) -> what it is: a link and its target, a folder, a
    regular file and its content's hash, or another kind of file."""
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                what: tuple = ("link", os.readlink(path))
            elif stat.S_ISDIR(mode):
                what = ("folder",)
            elif stat.S_ISREG(mode):
                what = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                what = ("special", stat.S_IFMT(mode))
            found[str(path.relative_to(root))] = what
    return found


def changed_outside(before: dict[str, tuple], after: dict[str, tuple], allowed: list[str]) -> list[str]:
    """The paths that appeared, vanished or changed, except under the `allowed` relative paths."""
    def inside(rel: str) -> bool:
        return any(rel == a or rel.startswith(a.rstrip("/") + "/") for a in allowed)

    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p) and not inside(p))


@dataclass
class Result:
    code: int | str
    out: str
    err: str
    outside: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error: ")]


def run_parity(argv: list[str], root: Path, cwd: Path, allowed: list[str]) -> Result:
    """`parity ARGV` in this process with `cwd` as the working directory; what changed under `root`
    outside the `allowed` paths (relative to `root`) is reported."""
    before = snapshot(root)
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_cwd, saved_path = os.getcwd(), list(sys.path)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code: int | str = main(argv)
            except SystemExit as exc:  # argparse, or anything that escaped parity's boundary
                code = f"SystemExit({exc.code})"
            except BaseException as exc:  # noqa: BLE001 - whatever escapes main is what we test for
                code = f"raised {type(exc).__name__}: {exc}"
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
    return Result(code, stdout.getvalue(), stderr.getvalue(), changed_outside(before, snapshot(root), allowed))


def assert_user_error(result: Result, *words: str) -> None:
    """Exit 2, one `error:` line with `words` in it, no other line but warnings, no traceback, nothing
    written outside the allowed paths."""
    err = result.err
    assert result.code == 2, f"exit {result.code}:\n{err[-3000:]}"
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    assert len(result.errors) == 1, err[-3000:]
    assert all(line.startswith(("error: ", "warning: ")) for line in err.splitlines()), err[-3000:]
    assert len(result.errors[0]) < 1000, f"a {len(result.errors[0])}-character message"
    for word in words:
        assert word in result.errors[0], f"{word!r} not in {result.errors[0]!r}"
    assert result.outside == [], result.outside


def write_experiment(folder: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def experiment(targets: list[dict], models: list[dict] | None = None, **more) -> dict:
    """Linear-layer models on a small batch: the fastest experiment that still runs every part of a run."""
    return {"name": "hostile", "models": models or [{"name": "plain", "source": "python",
                                                      "entry": "tests.fixtures.exiting:plain"}],
            "inputs": [{"name": "noise", "synthetic": {"shape": [2, 8]}}], "targets": targets, **more}
