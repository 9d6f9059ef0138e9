"""Shared harness of the hostile corpus (tests/hostile/test_hostile_*.py): one in-process `parity` command on an
experiment in a fresh folder, and what it left behind.

Every case runs `parity.cli.main` with the case's folder as working directory and compares the whole
folder tree (and, for environment cases, a home folder) before and after: only the output folder may
change. The artifact cache is off in tests (conftest), so the output folder is the only place a case
may write.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from parity.records.view import RunView
from tests.support.hostile import run_parity

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


def run(content: dict, setup: Callable[[Path], None] | None = None, verb: str = "run",
        extra: list[str] | None = None) -> Outcome:
    """`parity VERB exp.yaml [--out out --quiet --no-report]` in a fresh folder prepared by `setup`; what
    changed in that folder outside `out` (support.hostile.run_parity) is `written_outside`."""
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
        result = run_parity(argv + (extra or []), case, work, ["work/out"])
        records_file = out_dir / "records.jsonl"
        records = [json.loads(line) for line in records_file.read_text().splitlines()] if records_file.exists() else []
        return Outcome(result.code, result.out, result.err, out_dir, result.outside, records)
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
    checks = RunView(outcome.records).checks(1)
    assert checks and all(not c.passed and c.failure_class == failure_class for c in checks), checks
    for w in words:
        assert any(w in (c.detail or "") for c in checks), [c.detail for c in checks]
    assert outcome.written_outside == [], outcome.written_outside
