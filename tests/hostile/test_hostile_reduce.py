"""Records that name code: a RUN_DIR someone hands over ("here is my failing run") whose records.jsonl names a
model entry, a repo folder or a backend module. `parity reduce` rebuilds the model from the records, so each
case below is refused in one line before anything is imported: no marker file appears, nothing is written
outside --out, the planted module never runs. Issue 42's attack is the first case: a folder holding only a
records.jsonl whose run record names `os:system` with a shell command and `base_dir` equal to the folder.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from tests.support.hostile import assert_user_error, run_parity
from tests.test_reduce import CHAIN, CHECK  # the failing, localized check test_reduce reduces

MARK = "pwned"  # the file every planted piece of code writes when it runs


@pytest.fixture(scope="module")
def localized(tmp_path_factory) -> list[dict]:
    """The records of a failing, localized check with a single culprit (tests/fixtures/culprit.py): made once."""
    from parity.cli import main

    folder = tmp_path_factory.mktemp("chain")
    (folder / "exp.yaml").write_text(yaml.safe_dump(CHAIN, sort_keys=False))
    assert main(["run", str(folder / "exp.yaml"), "--out", str(folder / "out"), "--quiet", "--no-report"]) == 1
    return [json.loads(line) for line in (folder / "out" / "records.jsonl").read_text().splitlines()]


def _code(folder: Path) -> str:
    return f"import pathlib\npathlib.Path({str(folder / MARK)!r}).write_text('ran')\n"


def _python(entry: str):
    def edit(config: dict, run_dir: Path) -> None:
        config["models"][0].update(source="python", entry=entry, params={"command": f"touch {run_dir / MARK}"})
    return edit


def _repo(config: dict, run_dir: Path) -> None:
    model = config["models"][0]
    model.pop("entry")
    model.update(source="repo", path=str(run_dir / "repo"), hubconf="chain")


def _target_backend(config: dict, run_dir: Path) -> None:
    config["targets"][0].update(backend="evil:Backend", name="compile-cpu")


def _reference_backend(config: dict, run_dir: Path) -> None:
    config["reference"].update(backend="evil:Backend")


def _other_target(config: dict, run_dir: Path) -> None:
    config["targets"].append({**copy.deepcopy(config["targets"][0]), "backend": "evil:Backend", "name": "other"})


def _unknown_source(config: dict, run_dir: Path) -> None:
    config["models"][0].update(source="evil")


# (how the run record is edited, where base_dir points): each a way records could name code to run
EDITS = {
    "os:system entry": _python("os:system"),
    "subprocess:getoutput entry": _python("subprocess:getoutput"),
    "a module planted in RUN_DIR": _python("evil:build"),
    "a package planted in RUN_DIR": _python("evilpkg.sub:build"),
    "the records' own entry": _python("tests.fixtures.culprit:chain"),
    "a repo folder in RUN_DIR": _repo,
    "the target's backend a planted module": _target_backend,
    "the reference's backend a planted module": _reference_backend,
    "another target's backend a planted module": _other_target,
    "a source no plugin registers": _unknown_source,
}
BASES = ["RUN_DIR absolute", "RUN_DIR relative", "its parent"]


def _plant(case: Path, records: list[dict], edit, base: str) -> Path:
    """A folder `case/run` holding only records.jsonl, edited, with planted code beside it that writes MARK."""
    run_dir = case / "run"
    run_dir.mkdir()
    records = copy.deepcopy(records)
    run = records[0]
    edit(run["config"], run_dir)
    run["base_dir"] = {"RUN_DIR absolute": str(run_dir), "RUN_DIR relative": "run", "its parent": str(case)}[base]
    run["file"] = None
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for folder in (run_dir, case):  # importable from base_dir, wherever it points
        (folder / "evil.py").write_text(_code(run_dir) + "def build(**kw):\n    return None\nBackend = None\n")
        (folder / "evilpkg").mkdir(exist_ok=True)
        (folder / "evilpkg" / "__init__.py").write_text(_code(run_dir))
        (folder / "evilpkg" / "sub.py").write_text("def build(**kw):\n    return None\n")
    (run_dir / "repo").mkdir()
    (run_dir / "repo" / "hubconf.py").write_text(_code(run_dir) + "def chain(**kw):\n    return None\n")
    return run_dir


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("edit", list(EDITS))
def test_records_that_name_code_are_refused_before_any_import(localized, tmp_path, edit, base):
    run_dir = _plant(tmp_path, localized, EDITS[edit], base)
    result = run_parity(["reduce", "run", "--check", CHECK], tmp_path, tmp_path, [])  # the next: line, as printed
    assert_user_error(result, "records.jsonl", "names code", "--experiment FILE", "--trust-records")
    assert not (run_dir / MARK).exists()
    assert not any(n.startswith("reduce-") for n in (p.name for p in run_dir.iterdir()))


@pytest.mark.parametrize("edit", ["os:system entry", "a module planted in RUN_DIR", "a repo folder in RUN_DIR",
                                  "the target's backend a planted module"])
def test_an_experiment_file_that_does_not_hold_the_recorded_code_is_refused(localized, tmp_path, edit):
    """--experiment with the user's own file: the records' model, reference or target must be the file's, exactly;
    a records file that swapped in code is refused before the file's or the records' code is imported."""
    run_dir = _plant(tmp_path, localized, EDITS[edit], "RUN_DIR absolute")
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(CHAIN, sort_keys=False))
    result = run_parity(["reduce", "run", "--check", CHECK, "--experiment", "exp.yaml"], tmp_path, tmp_path, [])
    assert_user_error(result, "--experiment exp.yaml", "the records ran")
    assert not (run_dir / MARK).exists()


@pytest.mark.parametrize("what", ["a FIFO", "missing", "a folder"])
def test_an_experiment_file_that_is_no_file_is_refused(localized, tmp_path, what):
    import os

    _plant(tmp_path, localized, EDITS["os:system entry"], "RUN_DIR absolute")
    path = tmp_path / "exp.yaml"
    if what == "a FIFO":
        os.mkfifo(path)
    elif what == "a folder":
        path.mkdir()
    result = run_parity(["reduce", "run", "--check", CHECK, "--experiment", "exp.yaml"], tmp_path, tmp_path, [])
    assert_user_error(result, "exp.yaml")

