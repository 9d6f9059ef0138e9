"""Explanations that never contradict the evidence (issue 24): localize's ranking and verdicts, reduce and
fallback agreeing with localize, failure classes by phase."""

from __future__ import annotations

import math

import pytest

from parity.verify.activations import LevelResult, new_layer_error
from parity.verify.localize import Localization, rank
from tests.support import fallback_found


def _level(errors: dict[str, float]) -> LevelResult:
    level = LevelResult(names=list(errors))
    for name, rel in errors.items():
        finite = math.isfinite(rel)
        level.local[name] = new_layer_error(name, max_abs=rel if finite else math.inf, rmse=rel, rel_rmse=rel,
                                       required_atol=rel if finite else None)
    return level


def test_infinite_layer_errors_rank_above_every_finite_one_and_are_of_no_finite_order():
    """Layer errors 3e-4, inf, inf, 3e-4: the median is infinite, which once made every layer 'of the same
    order'. The first infinite layer is the culprit; no 'same order' clause beside it."""
    level = _level({"a": 3e-4, "b": math.inf, "c": math.inf, "d": 3e-4})
    ranked = rank(level, 1e-5)
    assert [e.name for e in ranked[:2]] == ["b", "c"]
    loc = Localization("t", "hierarchical", 1e-5, levels=[("", level)], culprit="b", suspects=ranked[:3])
    assert not loc.evenly_spread()
    assert "same order" not in loc.verdict() and loc.verdict().startswith("b introduces the largest relative error")


def test_a_nan_layer_error_ranks_first_and_finite_errors_of_one_order_are_spread():
    level = _level({"a": 2e-3, "b": math.nan, "c": 3e-3})
    assert rank(level, 1e-5)[0].name == "b"
    spread = _level({"a": 2e-3, "b": 3e-3, "c": 2.5e-3})
    loc = Localization("t", "hierarchical", 1e-5, levels=[("", spread)], culprit="b", suspects=rank(spread, 1e-5))
    assert loc.evenly_spread() and "same order" in loc.verdict()


def test_a_culprit_named_without_a_suspect_is_not_one_of_many_drifting_alike():
    """A specialised trace's module is named the culprit with every layer within the threshold (bfloat16's
    noise, of one order): 'every layer drifts alike' beside it would contradict the verdict that the branch,
    not the layers, makes the drift."""
    level = _level({"a": 2e-3, "b": 3e-3, "c": 2.5e-3})
    loc = Localization("t", "hierarchical", 1e-2, levels=[("", level)], culprit="b", suspects=[])
    assert not loc.evenly_spread()


def test_a_fallback_whose_tier3_aim_already_agrees_says_tier1_fails_and_how_to_gate_on_tier3(write_yaml, tmp_path, capsys):
    """bfloat16 at a gate of 1e-6, rtol 0: tier 1 fails, the top-1 decisions agree. It once printed "the check already
    passes: no fallback is needed" for a check the table calls FAIL."""
    from parity.cli import main
    from tests.support import tiny_experiment

    exp = tiny_experiment([{"backend": "eager", "dtype": "bfloat16", "tolerances": {"gate": 1e-6, "rtol": 0.0}}])
    exp["models"][0]["task"] = "classification"  # bfloat16's rounding alone exceeds atol 1e-6 at rtol 0, on any CPU
    file = write_yaml(exp)
    assert main(["fallback", str(file), "--target", "eager-cpu-bfloat16", "--tier", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "already passes" not in out
    assert "tier 1 fails (required atol" in out and "> gate 1e-06), but the classification decisions agree" in out
    assert "tolerances: {gate: tier3}" in out and "top1_agreement 1" in out


def test_fallback_names_its_modules():
    from parity.report.console import fallback_lines

    failed = fallback_found(runs_in="float32", modules=["a.conv", "b", "c.0"], required_atol_before=1e-2,
                            required_atol_after=1e-3, tried=6)
    lines = [text for _, text in fallback_lines(failed, 1e-4, False, "m", None)]
    assert "with 3 module(s) in float32 (a.conv, b, c.0)" in lines[0]
    aimed = fallback_found(runs_in="float32", aim="tier 3", modules=["head"], passed=True, required_atol_before=1e-2,
                           required_atol_after=1e-3, latency_before_s=1.0, latency_after_s=1.0)
    lines = [text for _, text in fallback_lines(aimed, 1e-4, False, "m", "classification")]
    assert "apply it: in the target's entry, fallback: [m:head]" in lines
    assert any("tier 1 still fails with it" in line and "gate: tier3" in line for line in lines)
    gated = [text for _, text in fallback_lines(aimed, 1e-4, True, "m", "classification")]
    assert not any("gate: tier3" in line for line in gated)  # the target gates on tier 3 already
    # tier 1's verdict is the judge's, recorded by the search: an output rule may pass a leaf above the gate
    ruled = fallback_found(runs_in="float32", aim="tier 3", modules=["head"], passed=True, required_atol_before=1e-2,
                           required_atol_after=1e-3, tier1_passed_after=True, latency_before_s=1.0, latency_after_s=1.0)
    lines = [text for _, text in fallback_lines(ruled, 1e-4, False, "m", "classification")]
    assert not any("tier 1 still fails" in line for line in lines)


SPECIALIZED = {
    "name": "trace", "seed": 0,
    "models": [{"name": "gated", "source": "python", "entry": "tests.fixtures.specialized:gated", "export_inputs": "calib"}],
    "inputs": [{"name": "calib", "synthetic": {"shape": [2, 3, 8, 8], "distribution": "uniform", "low": 0.0, "high": 1.0}},
               {"name": "shifted", "synthetic": {"shape": [2, 3, 8, 8], "distribution": "uniform", "low": -1.0, "high": 0.0}}],
    "targets": [{"backend": "torchscript"}],
    "tiers": {"activations": True},
}


def test_a_specialised_trace_is_explained_by_its_warned_line_and_module_not_the_whole_graph(write_yaml, tmp_path, capsys):
    """Traced on positive inputs, Gate's `if x.mean() > 0:` runs the positive branch for negative ones too. Each
    layer re-traced alone on them agrees, which once read as "comes from how the target transforms the whole
    graph"; the run's trace_specialized note names the line and the module that holds it. reduce refuses: the
    module re-traced alone would take the inputs' branch and agree."""
    import inspect

    from parity.cli import main
    from parity.records import read_records
    from tests.fixtures.specialized import Gate

    file = write_yaml(SPECIALIZED)
    out = tmp_path / "run"
    assert main(["run", str(file), "--out", str(out)]) == 1
    console = " ".join(capsys.readouterr().out.split())
    [layers] = [r for r in read_records(out / "records.jsonl") if r["kind"] == "layers"]
    line = inspect.getsourcelines(Gate.forward)[1] + 1  # `if x.mean() > 0:`
    assert layers["specialized"]["where"].endswith(f"specialized.py:{line}")
    assert layers["culprit"] == "pre.gate" and not layers["whole_graph"]
    assert layers["culprit_code"].startswith("Gate (") and layers["reference"] == "eager-cpu"  # what the run's record names
    assert "trace is specialised" in layers["verdict"] and "if x.mean() > 0:" in layers["verdict"]
    assert "comes from how the target transforms the whole graph" not in layers["verdict"]
    assert "diverges at gated / shifted / torchscript-cpu: pre.gate (its trace is specialised at" in console
    assert "parity reduce" not in console
    assert main(["reduce", str(out), "--check", "gated/shifted/torchscript-cpu"]) == 2
    assert "trace is specialised at" in capsys.readouterr().err
    # parity localize explains with the notes of its own run of the target
    assert main(["localize", str(file), "--target", "torchscript-cpu", "--inputs", "shifted"]) == 0
    assert "the target's trace is specialised" in " ".join(capsys.readouterr().out.split())


def test_reduce_refuses_a_localization_with_no_single_culprit(write_yaml, tmp_path, capsys):
    """A localization whose layers all drift alike names its largest one but no single culprit: a repro of that one
    module would show only its share, which a maintainer closes as not-a-bug. PerturbedEager nudges the first weight
    of whatever it runs, so each layer alone drifts alike; reduce once wrote "The culprit: ... 'conv'" for it."""
    from parity.cli import main
    from parity.records import read_records
    from tests.support import tiny_experiment

    perturbed = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}
    file = write_yaml(tiny_experiment([perturbed], tiers={"activations": True}))
    out = tmp_path / "run"
    assert main(["run", str(file), "--out", str(out)]) == 1
    [layers] = [r for r in read_records(out / "records.jsonl") if r["kind"] == "layers"]
    assert layers["culprit"] and layers["evenly_spread"]
    assert "parity reduce" not in capsys.readouterr().out
    assert main(["reduce", str(out), "--check", "tiny/noise/perturbed"]) == 2
    assert "found no single culprit" in capsys.readouterr().err
    assert not (out / "reduce-tiny-noise-perturbed").exists()


def test_torch_export_refusing_a_model_while_it_is_prepared_is_unsupported_op():
    """torch.export cannot express Gate's data-dependent `if` (GuardOnDataDependentSymNode, whose message says nothing
    of "unsupported"): the class comes from the phase (prepare) and the library that raised, not from words."""
    import torch

    from parity.config.schema import BackendSpec
    from parity.execute.execution import execute
    from parity.inputs import Inputs
    from tests.fixtures.specialized import gated

    result = execute(BackendSpec(backend="export"), gated(), Inputs((torch.rand(2, 3, 8, 8),)), 1)
    assert result.status == "error" and result.failure_class == "unsupported_op", result.error
    assert "GuardOnDataDependentSymNode" in result.error


def _raised(module: str, name: str, base: type = Exception, cause: BaseException | None = None) -> BaseException:
    """An exception of a class defined in `module` (as a library defines it), raised, with its cause."""
    cls = type(name, (base,), {"__module__": module})
    try:
        raise cls("it failed") from cause
    except BaseException as exc:
        return exc


def test_failure_classes_come_from_the_phase_and_the_library_that_raised():
    from parity import taxonomy as tx
    from parity.taxonomy import classify_exception

    exporter = _raised("torch.onnx._internal.exporter._errors", "TorchExportError")
    assert classify_exception(exporter, tx.PREPARE) == tx.UNSUPPORTED_OP  # the exporter refused the model
    assert classify_exception(exporter, tx.RUN) == tx.BACKEND_ERROR  # the same library's error while running is not
    lowering = _raised("torch._dynamo.exc", "BackendCompilerFailed", cause=_raised("torch._inductor.exc", "LoweringException"))
    assert classify_exception(lowering, tx.PREPARE) == tx.BACKEND_ERROR  # the compiler failed on a graph it accepted
    assert classify_exception(_raised("builtins", "RuntimeError", RuntimeError), tx.PREPARE) == tx.BACKEND_ERROR
    # a missing kernel or operator, in any phase; words in a message decide nothing
    assert classify_exception(_raised("x", "E", NotImplementedError), tx.RUN) == tx.UNSUPPORTED_OP
    ort = _raised("onnxruntime.capi.onnxruntime_pybind11_state", "NotImplemented")
    assert classify_exception(ort, tx.RUN) == tx.UNSUPPORTED_OP
    assert classify_exception(RuntimeError("operator not supported"), tx.RUN) == tx.BACKEND_ERROR


CASTS = {
    "name": "casts", "seed": 0,
    "models": [{"name": "chain", "source": "python", "entry": "tests.fixtures.casts:chain"}],
    "inputs": [{"name": "noise", "synthetic": {"shape": [64, 64]}}],
    "reference": {"backend": "eager", "dtype": "bfloat16"},
    "targets": [{"backend": "compile", "dtype": "bfloat16", "tolerances": {"gate": 0.0, "rtol": 0.0}}],
    "tolerances": {"atol": [0.0]},
    "tiers": {"activations": True},
}


@pytest.mark.slow
def test_a_compile_only_drift_is_named_by_its_compiler_pass_and_the_switch_that_removes_it(write_yaml, tmp_path, capsys):
    """A chain of one-operation bfloat16 layers: each alone compiles exactly, the fused chain keeps its intermediates in
    float32 (inductor elides the casts). No layer makes an error of its own; torch's CompilerBisector names
    inductor / emulate_precision_casts, recorded with the check and shown beside the module verdict, and the
    switch it names, given as the target's option, makes the check pass."""
    from parity.api import run_experiment
    from parity.cli import main
    from parity.records import read_records

    out = tmp_path / "run"
    assert main(["run", str(write_yaml(CASTS)), "--out", str(out)]) == 1
    console = " ".join(capsys.readouterr().out.split())
    [layers] = [r for r in read_records(out / "records.jsonl") if r["kind"] == "layers"]
    assert layers["culprit"] is None and layers["suspects"] == []
    found = layers["compiler_pass"]
    assert found["found"] and found["backend"] == "inductor" and found["subsystem"] == "emulate_precision_casts"
    assert found["switch"] == {"emulate_precision_casts": True}
    assert "compiler bisector names the pass that introduces it: inductor / emulate_precision_casts" in layers["verdict"]
    assert "compiler pass: inductor / emulate_precision_casts" in console
    assert "try the target with options: {inductor_config: {emulate_precision_casts: true}}" in console
    assert "next: try" not in console
    switched = {**CASTS, "targets": [{**CASTS["targets"][0], "options": {"inductor_config": {"emulate_precision_casts": True}}}],
                "tiers": {}}
    [check] = [r for r in run_experiment(switched, out=tmp_path / "switched") if r["kind"] == "check"]
    assert check["passed"], check["detail"]


def test_inductor_config_is_checked_when_the_experiment_is():
    from pydantic import ValidationError

    from parity.backends.compile import CompileOptions

    assert CompileOptions(inductor_config={"emulate_precision_casts": True}).inductor_config
    with pytest.raises(ValidationError, match="no setting 'emulate_precision_cast'.*emulate_precision_casts"):
        CompileOptions(inductor_config={"emulate_precision_cast": True})
    with pytest.raises(ValidationError, match="one or the other"):
        CompileOptions(mode="max-autotune", inductor_config={"emulate_precision_casts": True})


def test_a_compiler_pass_bisection_stops_at_its_budget_and_prints_nothing(capsys):
    """The bisection compiles the model once per step: past its budget it stops, says so in the record, leaves torch's
    bisector disabled (later compilations are the target's own) and prints nothing on the console."""
    from torch._inductor.compiler_bisector import CompilerBisector

    from parity.backends.compile import CompileBackend
    from parity.config.schema import BackendSpec

    found = CompileBackend.compiler_pass(BackendSpec(backend="compile"), lambda: False, budget_s=0.0)
    assert found["found"] is False and found["why"].startswith("stopped after 0 s (0 compilations)")
    assert not CompilerBisector.bisection_enabled and CompilerBisector.get_backend() is None
    assert capsys.readouterr().out == ""
