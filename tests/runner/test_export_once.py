"""Every backend is prepared once per model, from one example input set (`export_inputs`, else the
model's first), and runs every input set through that one artifact: an export specialised on the example's
shapes fails the other shapes' checks as `shape_specialized`, and a dynamic export serves them all."""

from __future__ import annotations

import pytest
import torch

from parity import taxonomy as tx
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.execute.execution import execute
from parity.inputs import Inputs
from parity.records import read_records
from parity.records.summary import summarize
from parity.report.markdown import render_markdown
from tests.fixtures import traces
from tests.support import tiny_experiment

FIX = "tests.fixtures.traces"
BATCHES = [{"name": "b2", "synthetic": {"shape": [2, 8]}}, {"name": "b3", "synthetic": {"shape": [3, 8]}}]


def _run(write_yaml, tmp_path, target: dict, entry: str = "dense", executor: str = "local", **model) -> list[dict]:
    exp = tiny_experiment([target], models=[{"name": "m", "source": "python", "entry": f"{FIX}:{entry}", **model}],
                          inputs=BATCHES)
    out = tmp_path / "out"
    main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report", "--cache-dir", str(tmp_path / "c"),
          "--executor", executor])
    return read_records(out)


def _checks(records) -> dict[str, dict]:
    return {r["inputs"]: r for r in records if r["kind"] == "check" and r["tier"] == 1}


@pytest.mark.parametrize("export_inputs, specialised", [(None, "b3"), ("b3", "b2")])
def test_a_static_export_runs_only_the_shapes_it_was_exported_from(write_yaml, tmp_path, export_inputs, specialised):
    """Exported once from the example (the first input set, or the one `export_inputs` names), the graph
    keeps its batch size: the other input set's check is `shape_specialized`, naming both shapes."""
    extra = {"export_inputs": export_inputs} if export_inputs else {}
    records = _run(write_yaml, tmp_path, {"backend": "onnxruntime"}, **extra)
    example = export_inputs or "b2"
    checks = _checks(records)
    assert checks[example]["passed"] is True
    failed = checks[specialised]
    assert failed["passed"] is False and failed["failure_class"] == tx.SHAPE_SPECIALIZED
    shape = {"b2": "2x8", "b3": "3x8"}
    assert f"prepared from inputs of shape {shape[example]}, it cannot run inputs of shape {shape[specialised]}" \
        in failed["detail"], failed["detail"]
    executions = [r for r in records if r["kind"] == "execution"]
    assert executions and {r["prepared_from"] for r in executions} == {example}


def test_a_dynamic_export_serves_every_batch_size_from_one_artifact(write_yaml, tmp_path):
    records = _run(write_yaml, tmp_path, {"backend": "onnxruntime", "options": {"dynamic": True}})
    assert {name: c["passed"] for name, c in _checks(records).items()} == {"b2": True, "b3": True}
    cached = {r["inputs"]: r["cached"] for r in records if r["kind"] == "execution" and r["backend"] == "onnxruntime-cpu"}
    assert cached == {"b2": False, "b3": True}  # the second input set ran the first one's export


def test_dynamic_shapes_are_passed_to_the_exporter_as_given(write_yaml, tmp_path):
    records = _run(write_yaml, tmp_path, {"backend": "onnxruntime", "options": {"dynamic_shapes": {"x": {0: "batch"}}}})
    assert {name: c["passed"] for name, c in _checks(records).items()} == {"b2": True, "b3": True}


def test_a_trace_that_unrolls_a_loop_over_the_batch_fails_on_another_batch_size(write_yaml, tmp_path):
    """In a worker process too: the worker gets the example with the inputs, and traces the example. Each worker's
    execution is timed alone, and its records say so."""
    records = _run(write_yaml, tmp_path, {"backend": "torchscript"}, entry="per_row", executor="process")
    assert {r["latency_interleaved"] for r in records if r["kind"] == "execution"} == {False}
    assert "Each backend was timed alone" in render_markdown(records, summarize(records), "run")
    checks = _checks(records)
    assert checks["b2"]["passed"] is True
    assert checks["b3"]["passed"] is False and checks["b3"]["failure_class"] == tx.SHAPE_MISMATCH


def _failing_run(example_shape) -> object:
    spec = BackendSpec(backend=f"{FIX}:RunFails")
    example = None if example_shape is None else Inputs((torch.ones(example_shape),), {})
    return execute(spec, traces.dense(), Inputs((torch.ones(3, 8),), {}), 1, example=example)


def test_a_raise_on_inputs_of_the_examples_shapes_stays_what_it_is():
    for example_shape in (None, (3, 8)):
        ex = _failing_run(example_shape)
        assert ex.failure_class == tx.BACKEND_ERROR and ex.error == "RuntimeError: this backend cannot run"


def test_a_raise_on_inputs_of_other_shapes_than_the_examples_is_shape_specialized():
    ex = _failing_run((2, 8))
    assert ex.failure_class == tx.SHAPE_SPECIALIZED
    assert ex.error == ("prepared from inputs of shape 2x8, it cannot run inputs of shape 3x8: "
                        "RuntimeError: this backend cannot run")


def test_eager_prepares_nothing_for_its_example_so_its_raise_is_its_own():
    spec = BackendSpec(backend="tests.fixtures.tiny:FailingEager")
    ex = execute(spec, traces.dense(), Inputs((torch.ones(3, 8),), {}), 1, example=Inputs((torch.ones(2, 8),), {}))
    assert ex.failure_class == tx.BACKEND_ERROR


def test_export_inputs_must_name_one_of_the_models_input_sets(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([{"backend": "eager"}], inputs=BATCHES,
                          models=[{"name": "m", "source": "python", "entry": f"{FIX}:dense", "inputs": ["b2"],
                                   "export_inputs": "b3"}])
    assert main(["run", str(write_yaml(exp)), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "export_inputs" in err and "no input set named 'b3' among this model's input sets (b2)" in err, err
    exp["models"][0]["export_inputs"] = "b_2"
    exp["models"][0].pop("inputs")
    assert main(["run", str(write_yaml(exp)), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "did you mean 'b2'" in capsys.readouterr().err


def test_both_dynamic_options_at_once_are_refused(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([{"backend": "onnxruntime", "options": {"dynamic": True, "dynamic_shapes": {"x": {0: "b"}}}}])
    assert main(["run", str(write_yaml(exp)), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "give 'dynamic: true' or 'dynamic_shapes', not both" in capsys.readouterr().err


BAKED = {"backend": f"{FIX}:ShapeBaked", "dtype": "bfloat16", "name": "baked"}


def _whole_model_prepares() -> set[tuple[int, ...]]:
    """The example shapes the target was prepared from as a whole model (tier 2's layers alone are not)."""
    return {shape for backend, model, shape in traces.PREPARED if backend == "baked" and model == "Dense"}


def test_tier_2_in_a_run_sees_the_target_prepared_from_the_runs_example(write_yaml, tmp_path):
    """b3 fails only because the target was prepared from b2 (its example): the end-to-end runs tier 2
    localizes it with are prepared from b2 too, not from b3 (which would be a target that passes)."""
    traces.PREPARED.clear()
    exp = tiny_experiment([BAKED], models=[{"name": "m", "source": "python", "entry": f"{FIX}:dense"}], inputs=BATCHES,
                          tiers={"activations": {"mode": "propagated"}})
    out = tmp_path / "out"
    main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"])
    checks = _checks(read_records(out))
    assert checks["b2"]["passed"] is True and checks["b3"]["failure_class"] == tx.NUMERIC_DRIFT
    assert [r["inputs"] for r in read_records(out) if r["kind"] == "layers"] == ["b3"]
    assert len(traces.PREPARED) > 2 and _whole_model_prepares() == {(2, 8)}  # the run's two, and tier 2's


def test_localize_and_fallback_judge_the_artifact_the_run_prepared_from_its_example(write_yaml, tmp_path, capsys):
    """`parity localize` and `parity fallback` on b3 prepare the target from b2, as the run did: the check
    they explain fails as it failed in the run (prepared from b3, the target would pass)."""
    exp = tiny_experiment([BAKED], models=[{"name": "m", "source": "python", "entry": f"{FIX}:dense"}], inputs=BATCHES,
                          tiers={"activations": {"mode": "propagated"}})
    path = str(write_yaml(exp))
    traces.PREPARED.clear()
    assert main(["localize", path, "--model", "m", "--target", "baked", "--inputs", "b3", "--out", str(tmp_path / "l")]) == 0
    [layers] = [r for r in read_records(tmp_path / "l") if r["kind"] == "layers"]
    assert layers["tier1"]["passed"] is False and layers["tier1"]["failure_class"] == tx.NUMERIC_DRIFT
    assert _whole_model_prepares() == {(2, 8)}
    traces.PREPARED.clear()
    main(["fallback", path, "--model", "m", "--target", "baked", "--inputs", "b3", "--out", str(tmp_path / "f")])
    [fallback] = [r for r in read_records(tmp_path / "f") if r["kind"] == "fallback"]
    assert fallback["required_atol_before"] > 0.1, fallback  # the run's drift (b3 x 1.5), not a check that passes
    assert _whole_model_prepares() == {(2, 8)}


def test_onnx_layers_are_read_from_a_graph_exported_from_the_example_with_the_targets_dynamic_dims():
    """Tier 2's propagated mode on ONNX Runtime: the graph is exported from the example (batch 2) as the
    target exports it (dynamic batch) and runs the localized inputs (batch 3)."""
    from parity.backends.onnxruntime import OnnxRuntimeBackend

    backend = OnnxRuntimeBackend(BackendSpec(backend="onnxruntime", options={"dynamic": True}))
    model, inputs = traces.dense().eval(), Inputs((torch.randn(3, 8),), {})
    try:
        [out] = backend.capture_layers(model, Inputs((torch.randn(2, 8),), {}), ["linear"], inputs=inputs)["linear"]
    finally:
        backend.close()
    torch.testing.assert_close(out, model.linear(inputs.args[0]), rtol=1e-5, atol=1e-5)
