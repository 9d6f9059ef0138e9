"""Files in the published tool's format run with `parity run` as they are."""

from __future__ import annotations

import json

import pytest
import torch

from parity.cli import main
from parity.errors import ParityError
from parity.experiment import load_experiment
from parity.records import read_records
from tests.support import FIXTURES

LEGACY = FIXTURES / "legacy_repo.yaml"


def test_translation():
    exp = load_experiment(LEGACY)
    [model] = exp.models
    assert (model.source, model.entry, model.params) == ("repo", "model:RepoNet", {"classes": 3})
    assert exp.resolve(model.path) == FIXTURES / "repo_a"
    assert [s.name for s in exp.inputs] == ["cat", "cup"]
    assert exp.inputs[0].preprocess.resize_multiple == 32 and exp.inputs[0].preprocess.std[0] == 0.229
    assert exp.reference.id == "eager-cpu"
    ids = [t.id for t in exp.targets]
    assert {"compile-cpu", "onnxruntime-cpu", "torchscript-cpu"} <= set(ids)
    assert any(i.endswith("cuda") for i in ids) == torch.cuda.is_available()
    assert exp.tolerances.atol == [1e-6, 1e-5, 1e-4, 1e-3]
    assert (exp.tolerances.rtol, exp.tolerances.gate_atol) == (1e-5, 1e-5)


def test_the_files_tolerances_and_preprocessing_are_translated_each_to_its_own_key():
    from parity.experiment.legacy import translate

    data = {"from": "repo", "repo": {"path": "r", "class": "pkg.mod.Net"}, "params": {"width": 2},
            "inputs": ["a/cat.jpg", "b/cat.jpg"], "means": [0.5], "stds": [0.25], "options": {"resize_multiple": 16},
            "verification": {"tol": {"atol": 1e-3, "rtol": 2e-5}}}
    experiment, problems, warnings = translate(data, FIXTURES / "old.yaml")
    assert problems == [] and warnings == []
    assert experiment["models"] == [{"name": "Net", "source": "repo", "path": "r", "entry": "pkg.mod:Net",
                                     "params": {"width": 2}}]
    assert [s["name"] for s in experiment["inputs"]] == ["image0-cat", "image1-cat"]  # one stem twice
    assert experiment["inputs"][0]["preprocess"] == {"resize_multiple": 16, "mean": [0.5], "std": [0.25]}
    assert experiment["tolerances"] == {"atol": [1e-6, 1e-5, 1e-4, 1e-3], "rtol": 2e-5, "gate": 1e-3}
    assert translate({**data, "verification": {}}, FIXTURES / "old.yaml")[0]["tolerances"]["gate"] == 1e-5


def test_legacy_file_runs_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the file's folder, not the cwd
    code = main(["run", str(LEGACY), "--out", "out", "--quiet"])
    assert code == 0, capsys.readouterr()
    records = read_records(tmp_path / "out")
    checks = [r for r in records if r["kind"] == "check"]
    assert {c["inputs"] for c in checks} == {"cat", "cup"}
    assert all(c["passed"] for c in checks)
    executions = [r for r in records if r["kind"] == "execution" and r["backend"] == "eager-cpu"]
    assert executions and all(r["status"] == "ok" for r in executions)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["gate"] == 1e-5


def test_legacy_mistakes_are_named(write_yaml):
    path = write_yaml("from: libary\nmodel: resnet18\ninputs: [a.jpg]\nverifcation: {}\n")
    with pytest.raises(ParityError) as info:
        load_experiment(path)
    problems = "\n".join(info.value.problems)
    assert f"{path}:1: from: expected 'library' or 'repo'" in problems
    assert f"{path}:4: verifcation: unknown key in a legacy (from: ...) file; did you mean 'verification'?" in problems
