"""Shared harness of the hostile corpus (tests/test_hostile_*.py): one in-process `parity` command on an
experiment in a fresh folder, and what it left behind.

Every case runs `parity.cli.main` with the case's folder as working directory and compares the whole
folder tree (and, for environment cases, a home folder) before and after: only the output folder may
change. The artifact cache is off in tests (conftest), so the output folder is the only place a case
may write.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from parity.cli import main

TINY = {"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}
BASE = {
    "name": "hostile",
    "models": [TINY],
    "inputs": [{"name": "noise", "synthetic": {"shape": [2, 3, 8, 8]}}],
    "targets": [{"backend": "eager", "name": "same"}],
}


@dataclass
class Outcome:
    code: int | str
    out: str
    err: str
    out_dir: Path
    written_outside: list[str]
    records: list[dict]


def experiment(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def with_images(images: list[str], **preprocess) -> dict:
    spec = {"name": "pictures", "images": images}
    if preprocess:
        spec["preprocess"] = preprocess
    return experiment(inputs=[spec])


def with_synthetic(spec) -> dict:
    return experiment(inputs=[{"name": "noise", "synthetic": spec}])


def _tree(folder: Path) -> dict[str, tuple]:
    """Every path under `folder` with what it is, and a file's size and time (a FIFO is listed, never
    opened; a folder's own time changes with what is made in it, so its contents speak for it)."""
    out = {}
    for path in folder.rglob("*"):
        st = path.lstat()
        out[str(path.relative_to(folder))] = (st.st_mode,) if path.is_dir() else (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def run(content: dict, setup: Callable[[Path], None] | None = None, verb: str = "run",
        extra: list[str] | None = None) -> Outcome:
    """`parity VERB exp.yaml [--out out --quiet --no-report]` in a fresh folder prepared by `setup`."""
    case = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        work = case / "work"
        work.mkdir()
        if setup:
            setup(work)
        path = work / "exp.yaml"
        path.write_text(yaml.safe_dump(content, sort_keys=False))
        out_dir = work / "out"
        argv = [verb, str(path)] + (["--out", str(out_dir), "--quiet", "--no-report"] if verb == "run" else [])
        before = _tree(case)
        stdout, stderr = io.StringIO(), io.StringIO()
        cwd, saved_path = os.getcwd(), list(sys.path)
        os.chdir(work)
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    code: int | str = main(argv + (extra or []))
                except SystemExit as exc:
                    code = f"SystemExit({exc.code})"
                except BaseException as exc:  # noqa: BLE001 - whatever escapes main is what we test for
                    code = f"raised {type(exc).__name__}: {exc}"
        finally:
            os.chdir(cwd)
            sys.path[:] = saved_path
        after = _tree(case)
        outside = sorted(p for p in set(after) | set(before)
                         if after.get(p) != before.get(p) and not p.startswith("work/out"))
        records_file = out_dir / "records.jsonl"
        records = [json.loads(line) for line in records_file.read_text().splitlines()] if records_file.exists() else []
        return Outcome(code, stdout.getvalue(), stderr.getvalue(), out_dir, outside, records)
    finally:
        shutil.rmtree(case, ignore_errors=True)


def assert_refused(outcome: Outcome, *words: str) -> None:
    """Exit 2, exactly one `error:` line holding `words`, no traceback, nothing written outside --out."""
    err = outcome.err
    assert outcome.code == 2, f"exit {outcome.code}:\n{err}\n{outcome.out[-2000:]}"
    assert "Traceback" not in err and "internal error" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    for w in words:
        assert w in errors[0], f"{w!r} not in:\n{err}"
    assert outcome.written_outside == [], outcome.written_outside
    assert not any(r["kind"] == "check" and r.get("passed") for r in outcome.records), "a check passed on garbage"


def assert_warned(outcome: Outcome, *words: str) -> None:
    """The run went through, but said (on stderr and in a `warning` record) that its input is constant."""
    assert outcome.code in (0, 1), f"exit {outcome.code}:\n{outcome.err}"
    assert "Traceback" not in outcome.err, outcome.err
    warnings = [r["message"] for r in outcome.records if r["kind"] == "warning"]
    assert warnings, f"no warning record:\n{outcome.err}"
    for w in words:
        assert w in outcome.err and any(w in m for m in warnings), f"{w!r} not warned:\n{outcome.err}"
    assert outcome.written_outside == [], outcome.written_outside


def assert_failed_with(outcome: Outcome, failure_class: str, *words: str) -> None:
    """The run ended (exit 1) with every check failed in `failure_class`: never a pass, never a traceback."""
    assert outcome.code == 1, f"exit {outcome.code}:\n{outcome.err}\n{outcome.out[-2000:]}"
    assert "Traceback" not in outcome.err, outcome.err
    checks = [r for r in outcome.records if r["kind"] == "check" and r["tier"] == 1]
    assert checks and all(not c["passed"] and c["failure_class"] == failure_class for c in checks), checks
    for w in words:
        assert any(w in (c["detail"] or "") for c in checks), [c["detail"] for c in checks]
    assert outcome.written_outside == [], outcome.written_outside
