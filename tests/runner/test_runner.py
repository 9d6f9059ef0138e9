"""The runner end to end on a tiny model: independence, failure classes, records, summary, exit codes."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from parity.api import run_experiment
from parity.cli import main
from parity.execute.execution import execute
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from parity.models import build_model
from parity.records import SCHEMA_VERSION, read_records
from parity.records.summary import summarize
from tests.support import BF16_AT_FLOAT32, tiny_experiment

PERTURBED = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}


def checks_by_target(records):
    return {r["target"]: r for r in records if r["kind"] == "check"}


def test_reference_equals_a_fresh_float32_run_after_other_backends_ran():
    """The published tool moved one module in place for reference and target. Here every backend gets
    its own copy: after a bfloat16 and a perturbed backend ran, the model is untouched and the reference
    outputs equal a fresh float32 CPU run bit for bit."""
    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}, PERTURBED]))
    model = build_model(exp.models[0], exp)
    before = copy.deepcopy(model.state_dict())
    inputs = build_inputs(exp.inputs[0], exp)
    for target in exp.targets:
        assert execute(target, model, inputs, 1).ok
    for name, value in model.state_dict().items():
        assert value.dtype == before[name].dtype and torch.equal(value, before[name]), name
    reference = execute(exp.reference, model, inputs, 1)
    fresh = build_model(exp.models[0], exp)  # a new build: the same seed gives the same weights
    with torch.no_grad():
        expected = fresh(*build_inputs(exp.inputs[0], exp).args)
    assert torch.equal(reference.outputs[0], expected)


def test_bfloat16_and_perturbed_targets_fail_and_an_identical_one_passes(tmp_path):
    targets = [BF16_AT_FLOAT32, PERTURBED, {"backend": "eager", "name": "same"}]
    records = run_experiment(tiny_experiment(targets), out=tmp_path)
    checks = checks_by_target(records)
    assert checks["eager-cpu-bfloat16"]["passed"] is False
    assert checks["eager-cpu-bfloat16"]["failure_class"] == "numeric_drift"
    assert checks["perturbed"]["passed"] is False and checks["perturbed"]["failure_class"] == "numeric_drift"
    assert checks["same"]["passed"] is True and checks["same"]["max_abs"] == 0.0
    assert checks["same"]["verdicts"] == {"1e-06": True, "1e-05": True, "1e-04": True, "1e-03": True}


def test_records_are_self_describing_jsonl(tmp_path):
    run_experiment(tiny_experiment([{"backend": "torchscript"}], repeats=2, oracle=True), out=tmp_path)
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(r["schema_version"] == SCHEMA_VERSION for r in records)
    assert [r["kind"] for r in records][0] == "run"
    run = records[0]
    assert run["environment"]["torch"] == torch.__version__ and "cpu" in run["environment"]
    executions = [r for r in records if r["kind"] == "execution"]
    assert {(r["backend"], r["repeat"]) for r in executions} == {
        (b, i) for b in ("eager-cpu", "oracle", "torchscript-cpu") for i in (0, 1)}
    assert all(r["status"] == "ok" and r["run_s"] > 0 for r in executions)
    [check] = [r for r in records if r["kind"] == "check"]
    assert set(check) >= {"tier", "model", "inputs", "reference", "target", "passed", "failure_class",
                          "required_atol", "verdicts", "leaves", "oracle"}
    leaf = check["leaves"][0]
    assert set(leaf) >= {"name", "max_abs", "max_rel", "mean_abs", "rmse", "cosine", "mismatch_fraction", "required_atol"}
    assert check["oracle"]["target_worse"] is False
    assert read_records(tmp_path) == records


def test_one_execution_serves_every_tolerance(tmp_path):
    one = run_experiment(tiny_experiment([PERTURBED], tolerances={"atol": [1e-4]}), out=tmp_path / "one")
    many = run_experiment(tiny_experiment([PERTURBED], tolerances={"atol": [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1]}),
                          out=tmp_path / "many")
    count = lambda records: sum(r["kind"] == "execution" for r in records)  # noqa: E731
    assert count(one) == count(many) == 2
    [check] = [r for r in many if r["kind"] == "check"]
    required = check["required_atol"]
    assert check["verdicts"] == {k: required <= float(k) for k in check["verdicts"]}
    assert not all(check["verdicts"].values()) and any(check["verdicts"].values())


def test_nondeterministic_target_is_caught(tmp_path):
    noisy = {"backend": "tests.fixtures.tiny:NoisyEager", "name": "noisy"}
    records = run_experiment(tiny_experiment([noisy], repeats=3, warmup=0, tolerances={"atol": [1e-4]}),
                             out=tmp_path)  # no warm-up: the target's first run is its exact one
    [check] = [r for r in records if r["kind"] == "check"]
    assert check["passed"] is False and check["failure_class"] == "nondeterministic"
    assert check["nondeterminism"]["target"] > 1e-3 and check["nondeterminism"]["reference"] == 0.0


def test_a_failing_backend_fails_its_own_check_and_the_run_goes_on(tmp_path):
    failing = {"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"}
    records = run_experiment(tiny_experiment([failing, {"backend": "torchscript"}]), out=tmp_path)
    checks = checks_by_target(records)
    assert checks["failing"]["failure_class"] == "backend_error" and "boom" in checks["failing"]["detail"]
    assert checks["torchscript-cpu"]["passed"] is True
    [bad] = [r for r in records if r["kind"] == "execution" and r["backend"] == "failing"]
    assert bad["status"] == "error" and "RuntimeError: boom" in bad["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_target_is_listed_not_dropped(tmp_path, write_yaml, capsys):
    path = write_yaml(tiny_experiment([{"backend": "eager", "device": "cuda"}, {"backend": "torchscript"}]))
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "eager-cuda" in out and "CUDA is not available" in out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["totals"] == {"checks": 2, "passed": 1, "failed": 0, "skipped": 1, "errors": 0}
    [ex] = [r for r in read_records(tmp_path / "a") if r["kind"] == "execution" and r["backend"] == "eager-cuda"]
    assert ex["status"] == "unavailable"
    assert main(["run", str(path), "--out", str(tmp_path / "b"), "--quiet", "--allow-unavailable"]) == 0


def test_exit_codes_and_summary_arithmetic(tmp_path, write_yaml, capsys):
    data = tiny_experiment([{"backend": "torchscript"}, {"backend": "eager", "dtype": "float64"}])
    data["inputs"].append({"name": "ones", "synthetic": {"shape": [1, 3, 8, 8], "distribution": "ones"}})
    assert main(["run", str(write_yaml(data)), "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "tiny / noise" in printed and "pass" in printed and "report.md" in printed
    summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert summary["arithmetic"]["formula"] == (
        "2 (model, input set) pairs x 2 targets = 4 checks; x 4 tolerances = 16 verdicts")
    assert summary == summarize(read_records(tmp_path / "ok")).model_dump()  # the summary comes from the records alone
    assert (tmp_path / "ok" / "report.md").read_text().startswith("# parity report: tiny")

    data["targets"].append(PERTURBED)
    assert main(["run", str(write_yaml(data)), "--out", str(tmp_path / "bad"), "--quiet"]) == 1
    assert "failed tiny / noise / perturbed: numeric_drift" in capsys.readouterr().out


def test_a_failure_after_some_repeats_is_recorded_at_its_repeat(tmp_path):
    """One record per (model, input set, backend, repeat): the failure is the second repeat's record, not
    a second record for repeat 0."""
    records = run_experiment(tiny_experiment([{"backend": "tests.fixtures.tiny:FailsAfterFirstRun", "name": "later"}],
                                             repeats=3, warmup=0), out=tmp_path)
    later = [(r["repeat"], r["status"]) for r in records if r["kind"] == "execution" and r["backend"] == "later"]
    assert later == [(0, "ok"), (1, "error")]


@pytest.mark.numerics
def test_a_real_torchvision_model_on_real_photos(tmp_path):
    """ResNet-18 on two bundled photographs through exported and traced backends and bfloat16: every check
    gets a verdict at every tolerance, with finite numbers and the oracle's word. How far ONNX Runtime and
    TorchScript drift depends on the CPU (benchmarks/ print it); bfloat16's 8-bit mantissa does not: it
    fails, and the float64 oracle says the bfloat16 target, not the reference, is the one that is off."""
    data = {
        "name": "r18",
        "oracle": True,
        "models": [{"name": "resnet18", "builder": "resnet18", "params": {"num_classes": 10}, "task": "classification"}],
        "inputs": [{"name": "photos", "images": ["sample:chelsea", "sample:coffee"],
                    "preprocess": {"resize": 72, "center_crop": 64, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}],
        "targets": [{"backend": "onnxruntime"}, {"backend": "torchscript"}, {"backend": "eager", "dtype": "bfloat16"}],
    }
    checks = checks_by_target(run_experiment(data, out=tmp_path))
    for target in ("onnxruntime-cpu", "torchscript-cpu"):
        check = checks[target]
        assert check["status"] == "ok" and check["failure_class"] in (None, "numeric_drift"), check["detail"]
        assert set(check["verdicts"]) == {"1e-06", "1e-05", "1e-04", "1e-03"} and check["passed"] is (check["failure_class"] is None)
        assert math.isfinite(check["max_abs"]) and math.isfinite(check["required_atol"])
        assert set(check["oracle"]) >= {"target_worse"}
    bf16 = checks["eager-cpu-bfloat16"]
    assert bf16["failure_class"] == "numeric_drift" and bf16["oracle"]["target_worse"] is True


SWEEP = [2.0**-11, 2.0**-10, 2.0**-9]  # exact in binary: a required atol of 2**-10 equals the middle one


def test_a_required_atol_equal_to_an_atol_of_the_sweep_passes_there(tmp_path):
    """The test is |target - reference| <= atol + rtol * |reference|: a target off by exactly 2**-10 from a
    reference of exact zeros passes at atol 2**-10 (and at a gate of 2**-10), fails at 2**-11."""
    data = tiny_experiment([{"backend": "tests.fixtures.tiny:OffsetEager", "name": "offset"}],
                           tolerances={"atol": SWEEP, "gate": SWEEP[1]})
    data["models"][0]["entry"] = "tests.fixtures.tiny:zero_output"
    data["inputs"] = [{"name": "x", "synthetic": {"shape": [2, 4]}}]
    [check] = [r for r in run_experiment(data, out=tmp_path) if r["kind"] == "check"]
    assert check["required_atol"] == check["max_abs"] == SWEEP[1]
    assert list(check["verdicts"].values()) == [False, True, True]
    assert check["passed"] is True and check["failure_class"] is None


def mixed_experiment(*targets: dict) -> dict:
    data = tiny_experiment(list(targets), repeats=2)
    data["models"][0]["entry"] = "tests.fixtures.tiny:mixed_leaves"
    data["inputs"] = [{"name": "x", "synthetic": {"shape": [2, 4]}}]
    return data


def test_non_tensor_outputs_are_compared_exactly_end_to_end(tmp_path):
    """A model returning tensors with an int, a string, None, a float and a bool beside them: a target that
    returns the same passes at atol 0; one that changes the int fails as numeric_drift, one that changes
    the string or turns None into a number as structure_mismatch, at every tolerance."""
    changed = "tests.fixtures.tiny:ChangesLeaf"
    data = mixed_experiment({"backend": "eager", "name": "same"},
                            {"backend": changed, "name": "count", "options": {"leaf": "count", "value": 4}},
                            {"backend": changed, "name": "label", "options": {"leaf": "label", "value": "dog"}},
                            {"backend": changed, "name": "mask", "options": {"leaf": "mask", "value": 0}},
                            {"backend": changed, "name": "unchanged", "options": {"leaf": "label", "value": "cat"}})
    checks = checks_by_target(run_experiment(data, out=tmp_path))
    for name in ("same", "unchanged"):
        assert checks[name]["passed"] and checks[name]["required_atol"] == 0.0, checks[name]["detail"]
        leaves = {leaf["name"]: leaf for leaf in checks[name]["leaves"]}
        assert leaves["out['label']"]["value"] == "'cat'" and leaves["out['mask']"]["required_atol"] == 0.0
        assert {"out['count']", "out['meta'][1]", "out['meta'][2]"} <= set(leaves)
    for name, cls, value in (("count", "numeric_drift", "4"), ("label", "structure_mismatch", "'dog'"),
                             ("mask", "structure_mismatch", "0")):
        check = checks[name]
        assert check["passed"] is False and check["failure_class"] == cls, check["detail"]
        assert not any(check["verdicts"].values()) and check["required_atol"] is None
        [leaf] = [leaf for leaf in check["leaves"] if leaf["failure_class"]]
        assert leaf["name"] == f"out['{name}']" and leaf["value"] == value


def test_a_failure_keeps_its_whole_traceback_and_verbose_prints_it(tmp_path, write_yaml, capsys):
    """The table and the failure line stay short; the execution record keeps the whole traceback, and
    `--verbose` prints it (the process executor's worker sends it too)."""
    failing = {"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"}
    path = write_yaml(tiny_experiment([failing]))
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--quiet", "--no-report"]) == 1
    quiet = capsys.readouterr()
    assert "Traceback" not in quiet.out + quiet.err
    [ex] = [r for r in read_records(tmp_path / "a") if r["kind"] == "execution" and r["backend"] == "failing"]
    assert ex["traceback"].startswith("Traceback (most recent call last)") and "tiny.py" in ex["traceback"]
    assert ex["traceback"].rstrip().endswith("RuntimeError: boom: this backend always fails")
    assert main(["run", str(path), "--out", str(tmp_path / "b"), "--quiet", "--no-report", "--verbose",
                 "--executor", "process"]) == 1
    err = capsys.readouterr().err
    assert "--- tiny / noise / failing (repeat 0)" in err and "Traceback (most recent call last)" in err
    assert "RuntimeError: boom" in err


def test_the_progress_line_says_which_backend_is_prepared_and_the_bar_counts_each_timed_run(tmp_path, monkeypatch):
    """A compilation can take minutes: the line names the backend being prepared, not only the job; the bar moves
    with each timed run and ends at the total, the failed execution's repeats included."""
    from parity.runner.runner import _Progress

    said, moved = [], []
    monkeypatch.setattr(_Progress, "describe", lambda self, text: said.append(text))
    monkeypatch.setattr(_Progress, "advance", lambda self, n=1: moved.append(n))
    failing = {"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"}
    run_experiment(tiny_experiment([{"backend": "eager", "name": "same"}, failing], repeats=2), out=tmp_path / "out")
    assert said[:3] == ["tiny / noise / eager-cpu: preparing", "tiny / noise / same: preparing",
                        "tiny / noise / failing: preparing"]
    assert "tiny / noise / timed runs of eager-cpu, same" in said
    assert moved[:4] == [1, 1, 1, 1] and sum(moved) == 6  # 3 backends x 2 repeats
