"""The artifact cache: a warm run reuses exports, and nothing that differs ever shares one."""

from __future__ import annotations

import os

import pytest
import torch

from parity.cli import main
from parity.records import read_records
from parity.runner import cache
from tests.conftest import tiny_experiment

EXPORTERS = [{"backend": "onnxruntime"}, {"backend": "torchscript"}, {"backend": "openvino"}]


@pytest.fixture(autouse=True)
def private_cache(monkeypatch):
    """Inductor's cache stays where it is (configure would move it), and no test leaves a cache behind."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor-parity-tests"))
    yield
    cache.configure(None)


def _run(write_yaml, tmp_path, name: str, *extra: str, targets=EXPORTERS, **overrides) -> dict[str, dict]:
    """Run the tiny experiment (every check must pass); its first executions by backend id, and its checks."""
    path = write_yaml(tiny_experiment(targets, **overrides), f"{name}.yaml")
    out = tmp_path / name
    assert main(["run", str(path), "--out", str(out), "--quiet", *extra]) == 0
    records = read_records(out / "records.jsonl")
    executions = {r["backend"]: r for r in records if r["kind"] == "execution" and r["repeat"] == 0}
    checks = {r["target"]: r for r in records if r["kind"] == "check" and r["tier"] == 1}
    assert all(c["passed"] for c in checks.values()), checks
    return {"executions": executions, "checks": checks}


@pytest.mark.numerics
def test_a_second_run_reuses_every_export_and_gets_the_same_results(write_yaml, tmp_path):
    where = ["--cache-dir", str(tmp_path / "cache")]
    cold = _run(write_yaml, tmp_path, "cold", *where)
    warm = _run(write_yaml, tmp_path, "warm", *where)
    for target in ("onnxruntime-cpu", "torchscript-cpu", "openvino-cpu"):
        assert cold["executions"][target]["cached"] is False
        assert warm["executions"][target]["cached"] is True
        assert warm["checks"][target]["required_atol"] == cold["checks"][target]["required_atol"]
    assert warm["executions"]["eager-cpu"]["cached"] is None  # eager exports nothing
    assert len(list((tmp_path / "cache" / "artifacts").iterdir())) == 3


def test_other_weights_under_the_same_model_entry_are_exported_afresh(write_yaml, tmp_path):
    """Seed 1 draws other weights for the same model entry: a stale export would fail the check."""
    where = ["--cache-dir", str(tmp_path / "cache")]
    _run(write_yaml, tmp_path, "seed0", *where, seed=0)
    other = _run(write_yaml, tmp_path, "seed1", *where, seed=1)  # asserts every check passes
    assert all(other["executions"][t]["cached"] is False for t in ("onnxruntime-cpu", "torchscript-cpu", "openvino-cpu"))


def test_other_input_values_are_exported_afresh(write_yaml, tmp_path):
    """A trace follows the branches its example takes: the key holds the inputs' values, not only shapes."""
    where = ["--cache-dir", str(tmp_path / "cache")]
    onnx = [{"backend": "onnxruntime"}]
    _run(write_yaml, tmp_path, "a", *where, targets=onnx)
    other_inputs = [{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16], "seed": 7}}]
    b = _run(write_yaml, tmp_path, "b", *where, targets=onnx, inputs=other_inputs)
    assert b["executions"]["onnxruntime-cpu"]["cached"] is False


def test_no_cache_writes_nothing(write_yaml, tmp_path):
    _run(write_yaml, tmp_path, "off", "--cache-dir", str(tmp_path / "cache"), "--no-cache")
    assert not (tmp_path / "cache").exists()


def test_a_model_without_an_identity_is_never_cached(tmp_path):
    """A module handed over in Python (no experiment entry says what it is) is exported afresh."""
    cache.configure(tmp_path / "cache")
    from parity.inputs import Inputs

    example = Inputs((torch.ones(1, 3),), {})
    spec = type("Spec", (), {"backend": "onnxruntime", "device": "cpu", "dtype": "float32", "options": {}})()
    assert cache.artifact_key("onnx", torch.nn.Linear(3, 2), spec, example) is None
    with cache.model_identity("linear"):
        first = cache.artifact_key("onnx", torch.nn.Linear(3, 2), spec, example)
        second = cache.artifact_key("onnx", torch.nn.Linear(3, 2), spec, example)  # other random weights
    assert first and second and first != second


def test_an_interrupted_entry_is_not_used(tmp_path):
    """An export killed half-way leaves a .partial folder, which is never taken for the artifact."""
    cache.configure(tmp_path / "cache")
    built = []

    def build(folder):
        built.append(folder)
        (folder / "model.onnx").write_text("complete")

    (tmp_path / "cache" / "artifacts").mkdir(parents=True)
    (tmp_path / "cache" / "artifacts" / ".k.999.partial").mkdir()
    folder, hit = cache.fetch_or_build("k", build)
    assert not hit and (folder / "model.onnx").read_text() == "complete"
    assert cache.fetch_or_build("k", build) == (folder, True) and len(built) == 1
