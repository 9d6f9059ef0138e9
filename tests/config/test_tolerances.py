"""The tolerance policy: per target, per output leaf, dtype-aware defaults, gating on tier 3, and the
reference's own noise. Every perturbation is constructed (tests/fixtures/tolerance.py), so each test puts
a known error on a known side of a tolerance, on any CPU."""

from __future__ import annotations

import json

import pytest

from parity.cli import main
from parity.experiment import experiment_from_dict
from parity.records import read_records
from tests.support import tiny_experiment
from tests.support.cli import run_experiment

FIX = "tests.fixtures.tolerance"
TWO_HEADS = [{"name": "heads", "source": "python", "entry": f"{FIX}:two_heads"}]
NUDGE = {"backend": f"{FIX}:RelativeNudge"}


def _run(write_yaml, tmp_path, exp, name="out"):
    ran = run_experiment(exp, tmp_path, "--no-report", name=name, file_name=f"{name}.yaml")
    return ran.code, {(r["target"], r["tier"]): r for r in ran.records() if r["kind"] == "check"}, ran.out


def test_a_bfloat16_target_is_judged_at_its_dtype_default_while_float32_keeps_the_experiments(write_yaml, tmp_path):
    """One perturbation (every output x (1 + 1e-3)) on two targets: declared bfloat16 it passes at
    torch.testing's bfloat16 default (rtol 1.6e-2, atol 1e-5); declared float32 it fails at the
    experiment's tolerance, which the bfloat16 default did not loosen."""
    exp = tiny_experiment([{**NUDGE, "dtype": "bfloat16", "name": "nudge-bf16"}, {**NUDGE, "name": "nudge-fp32"}],
                          models=TWO_HEADS)
    code, checks, out = _run(write_yaml, tmp_path, exp)
    bf16, fp32 = checks["nudge-bf16", 1], checks["nudge-fp32", 1]
    assert (bf16["passed"], bf16["tolerance_source"], bf16["rtol"], bf16["gate"]) == (True, "default-for-bfloat16", 1.6e-2, 1e-5)
    assert (fp32["passed"], fp32["tolerance_source"], fp32["rtol"], fp32["gate"]) == (False, "experiment", 1e-5, 1e-4)
    assert fp32["failure_class"] == "numeric_drift" and code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_target"]["nudge-bf16"]["tolerance_source"] == "default-for-bfloat16"
    assert summary["uniform_tolerance"] is False


def test_a_targets_own_tolerance_wins_over_its_dtype_default_and_the_experiments(write_yaml, tmp_path):
    strict_bf16 = {**NUDGE, "dtype": "bfloat16", "name": "strict", "tolerances": {"rtol": 1e-5}}
    loose_fp32 = {**NUDGE, "name": "loose", "tolerances": {"rtol": 2e-3, "gate": 0.0}}
    _, checks, _ = _run(write_yaml, tmp_path, tiny_experiment([strict_bf16, loose_fp32], models=TWO_HEADS))
    strict, loose = checks["strict", 1], checks["loose", 1]
    assert (strict["passed"], strict["tolerance_source"], strict["rtol"], strict["gate"]) == (False, "target", 1e-5, 1e-5)
    assert (loose["passed"], loose["tolerance_source"], loose["gate"]) == (True, "target", 0.0)


def test_an_output_rule_turns_a_box_drift_failure_into_a_pass_and_says_which_rule(write_yaml, tmp_path):
    """Boxes moved by 0.3 px fail at the experiment's gate; a rule for `*boxes*` with atol 0.5 passes
    them (the leaf records the rule) while the scores keep the gate. A rule at atol 0.1 fails them at
    every atol of the sweep: a leaf beyond its own rule's atol fails whatever the sweep says."""
    shift = {"backend": f"{FIX}:ShiftBoxes", "name": "shift"}
    _, checks, _ = _run(write_yaml, tmp_path, tiny_experiment([shift], models=TWO_HEADS), "plain")
    assert checks["shift", 1]["passed"] is False

    exp = tiny_experiment([shift], models=TWO_HEADS, tolerances={"outputs": {"*boxes*": {"atol": 0.5}}})
    code, checks, _ = _run(write_yaml, tmp_path, exp, "rule")
    check = checks["shift", 1]
    assert code == 0 and check["passed"] is True
    leaves = {leaf["name"]: leaf for leaf in check["leaves"]}
    [boxes] = [leaf for name, leaf in leaves.items() if "boxes" in name]
    [scores] = [leaf for name, leaf in leaves.items() if "scores" in name]
    assert boxes["tolerance"] == {"atol": 0.5, "rtol": 1e-5, "rule": "experiment output rule '*boxes*'"}
    assert "tolerance" not in scores
    summary = json.loads((tmp_path / "rule" / "summary.json").read_text())
    assert summary["per_target"]["shift"]["output_rules"] == ["experiment output rule '*boxes*': atol 0.5, rtol 1e-05"]
    assert check["required_atol"] == scores["required_atol"] == 0.0  # the boxes left the sweep to their rule

    exp["tolerances"]["outputs"]["*boxes*"]["atol"] = 0.1
    code, checks, _ = _run(write_yaml, tmp_path, exp, "tight")
    check = checks["shift", 1]
    assert code == 1 and check["passed"] is False and check["required_atol"] is None
    assert set(check["verdicts"].values()) == {False}
    assert "judged by the experiment output rule '*boxes*'" in check["detail"]


def test_a_targets_output_rule_comes_before_the_experiments(write_yaml, tmp_path):
    shift = {"backend": f"{FIX}:ShiftBoxes", "name": "shift", "tolerances": {"outputs": {"*boxes*": {"atol": 1.0}}}}
    exp = tiny_experiment([shift], models=TWO_HEADS, tolerances={"outputs": {"*boxes*": {"atol": 0.1}}})
    _, checks, _ = _run(write_yaml, tmp_path, exp)
    [boxes] = [leaf for leaf in checks["shift", 1]["leaves"] if "boxes" in leaf["name"]]
    assert checks["shift", 1]["passed"] is True and boxes["tolerance"]["rule"] == "target output rule '*boxes*'"


CLASSIFIER = [{"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "task": "classification"}]


@pytest.mark.parametrize(("backend", "gate", "code", "passed"), [
    ("ConstantShift", None, 1, False),      # tier 1 fails, and it decides
    ("ConstantShift", "tier3", 0, True),    # the same drift; tier 3 agrees, and it decides
    ("Reverse", "tier3", 1, False),            # tier 3 sees the top-1 change
])
def test_gate_tier3_makes_the_task_verdict_decide_the_exit_code(write_yaml, tmp_path, backend, gate, code, passed):
    target = {"backend": f"{FIX}:{backend}", "name": "t"}
    if gate:
        target["tolerances"] = {"gate": gate}
    exp = tiny_experiment([target], models=CLASSIFIER, tiers={"tasks": True},
                          inputs=[{"name": "noise", "synthetic": {"shape": [8, 3, 16, 16]}}])
    got, checks, _ = _run(write_yaml, tmp_path, exp)
    tier1, tier3 = checks["t", 1], checks["t", 3]
    assert got == code and tier1["passed"] is passed
    assert tier1["gated_by"] == ("tier3" if gate else "tier1")
    assert tier1["required_atol"] > tier1["gate"]  # tier 1's own numbers are kept whatever decides
    if gate:
        assert tier1["tier1_passed"] is False and tier1["passed"] is tier3["passed"]
    if backend == "Reverse":
        assert tier1["failure_class"] == "decision_flip"


@pytest.mark.parametrize(("extra", "words"), [
    ({}, "needs tier 3"),
    ({"tiers": {"tasks": True}, "models": [{**CLASSIFIER[0], "task": "other"}]}, "has task 'other'"),
])
def test_gate_tier3_without_a_task_verdict_is_refused_before_anything_runs(write_yaml, tmp_path, capsys, extra, words):
    exp = tiny_experiment([{"backend": "eager", "name": "t"}], tolerances={"gate": "tier3"}, **{"models": CLASSIFIER, **extra})
    assert main(["run", str(write_yaml(exp)), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert words in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_the_reference_noise_floor_is_measured_against_the_oracle(write_yaml, tmp_path, capsys):
    """The float32 reference of a cancelling model is far from the float64 oracle: the check records that
    floor and the console says that a gate below it judges the reference, not the target."""
    exp = tiny_experiment([{"backend": "eager", "name": "same"}], oracle=True,
                          models=[{"name": "cancel", "source": "python", "entry": f"{FIX}:cancellation"}])
    out = tmp_path / "out"
    main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"])
    [check] = [r for r in read_records(out) if r["kind"] == "check"]
    assert check["passed"] is True  # the target is the reference's twin; the floor is about the reference
    assert check["noise_floor"]["source"] == "float64 oracle" and check["noise_floor"]["atol"] > 0.01
    assert "noise floor same: atol" in capsys.readouterr().out.replace("\n", " ")


def test_tolerance_settings_are_validated(write_yaml, tmp_path, capsys):
    bad = [
        ({"gate": "tier4"}, None, "a number (an atol) or 'tier3'"),
        ({"outputs": {"*boxes*": {}}}, None, "an output rule sets atol, rtol or both"),
        ({"outputs": {"*boxes*": {"atol": -1}}}, None, "greater than or equal to 0"),
        (None, {"atol": [1e-3]}, "unknown key"),  # the sweep is the experiment's
        (None, {"gate": -1.0}, "the gate must be >= 0"),
    ]
    for i, (experiment, target, words) in enumerate(bad):
        exp = tiny_experiment([{"backend": "eager", **({"tolerances": target} if target else {})}],
                              **({"tolerances": experiment} if experiment else {}))
        assert main(["validate", str(write_yaml(exp, f"bad{i}.yaml"))]) == 2, (experiment, target)
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_resolution_order_for_every_source():
    exp = experiment_from_dict(tiny_experiment(
        [{"backend": "eager", "dtype": "float16"}, {"backend": "eager", "name": "mine", "tolerances": {"gate": 1e-3}},
         {"backend": "eager", "name": "plain"}],
        tolerances={"atol": [1e-5, 1e-2], "rtol": 1e-4}))
    fp16, mine, plain = (exp.tolerance_for(t) for t in exp.targets)
    assert (fp16.rtol, fp16.gate, fp16.source) == (1e-3, 1e-5, "default-for-float16")
    assert (mine.rtol, mine.gate, mine.source) == (1e-4, 1e-3, "target")
    assert (plain.rtol, plain.gate, plain.source) == (1e-4, 1e-2, "experiment")  # no 1e-4 in the sweep: its largest


def test_an_explicit_experiment_gate_does_not_reach_a_reduced_precision_target():
    """The experiment's gate is written for float32: a float16 target still gets its dtype's default."""
    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "dtype": "float16"}, {"backend": "eager", "name": "fp32"}],
                                               tolerances={"gate": 1e-3, "rtol": 1e-4}))
    fp16, fp32 = (exp.tolerance_for(t) for t in exp.targets)
    assert (fp16.gate, fp16.rtol) == (1e-5, 1e-3) and (fp32.gate, fp32.rtol) == (1e-3, 1e-4)


def test_a_pair_is_judged_at_the_default_of_its_less_precise_side_whichever_side_that_is():
    """A bfloat16 target of a float64 reference, a float32 target of a bfloat16 reference: bfloat16's default;
    float64 against float32 keeps the experiment's. `parity run` and the API's default alike."""
    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}, {"backend": "eager"},
                                                {"backend": "eager", "dtype": "float16"}],
                                               reference={"backend": "eager", "dtype": "float64"}))
    bf16, fp32, _ = (exp.tolerance_for(t) for t in exp.targets)
    assert [exp.tolerance_for(t).source for t in exp.targets] == ["default-for-bfloat16", "experiment", "default-for-float16"]
    assert (bf16.rtol, bf16.gate) == (1.6e-2, 1e-5) and (fp32.rtol, fp32.gate) == (1e-5, 1e-4)
    under_bf16 = experiment_from_dict(tiny_experiment([{"backend": "eager"}], reference={"backend": "eager", "dtype": "bfloat16"}))
    tol = under_bf16.tolerance_for(under_bf16.targets[0])
    assert (tol.source, tol.rtol, tol.gate) == ("default-for-bfloat16", 1.6e-2, 1e-5)


def test_an_exact_leaf_name_wins_over_an_earlier_glob():
    exp = experiment_from_dict(tiny_experiment(
        [{"backend": "eager", "name": "t", "tolerances": {"outputs": {"out*": {"atol": 1.0}}}}],
        tolerances={"outputs": {"out[0]['boxes']": {"atol": 2.0}, "*": {"rtol": 0.5}}}))
    tol = exp.tolerance_for(exp.targets[0])
    assert tol.for_leaf("out[0]['boxes']").atol == 2.0  # exact, though the target's glob comes first
    assert tol.for_leaf("out[0]['scores']").atol == 1.0  # the target's glob before the experiment's
    assert tol.for_leaf("logits").rtol == 0.5 and tol.for_leaf("logits").atol is None


def test_a_wrong_first_call_is_not_hidden_by_the_warm_up(write_yaml, tmp_path):
    """The warm-up run is not timed but it is judged: its outputs count among the target's runs."""
    target = {"backend": f"{FIX}:FirstCallWrong", "name": "t"}
    code, checks, _ = _run(write_yaml, tmp_path, tiny_experiment([target]))
    assert code == 1 and checks["t", 1]["failure_class"] == "nondeterministic"
    assert checks["t", 1]["nondeterminism"]["target"] >= 999


def test_gate_tier3_never_excuses_runs_that_disagree_with_each_other(write_yaml, tmp_path):
    """The first timed run only drifts (tier 3 agrees); the next ones flip every decision."""
    target = {"backend": f"{FIX}:ShiftThenReverse", "name": "t", "tolerances": {"gate": "tier3"}}
    exp = tiny_experiment([target], models=CLASSIFIER, tiers={"tasks": True}, repeats=3, warmup=0,
                          inputs=[{"name": "noise", "synthetic": {"shape": [8, 3, 16, 16]}}])
    code, checks, _ = _run(write_yaml, tmp_path, exp)
    assert code == 1 and checks["t", 1]["passed"] is False and checks["t", 1]["failure_class"] == "nondeterministic"


def test_brackets_in_an_output_rule_are_literal_and_rules_make_the_tolerance_the_targets():
    exp = experiment_from_dict(tiny_experiment(
        [{"backend": "eager", "name": "t", "tolerances": {"outputs": {"out[*]['boxes']": {"atol": 0.5}}}}]))
    tol = exp.tolerance_for(exp.targets[0])
    assert tol.for_leaf("out[0]['boxes']").atol == 0.5 and tol.for_leaf("out[12]['boxes']").atol == 0.5
    assert tol.for_leaf("out0boxes").atol is None and tol.for_leaf("out[0]['scores']").atol is None
    assert tol.source == "target"  # a target with rules of its own is not judged at the experiment's alone


def test_a_metric_that_is_not_a_number_does_not_crash_the_report(write_yaml, tmp_path, capsys):
    """An overflowing top logit: tier 1 fails nonfinite, tier 3's KL divergence is NaN (null in the
    records); the run ends with its verdict (exit 1), not a traceback."""
    exp = tiny_experiment([{"backend": f"{FIX}:InfAtTop", "name": "t"}], models=CLASSIFIER, tiers={"tasks": True})
    code, checks, _ = _run(write_yaml, tmp_path, exp)
    assert code == 1 and checks["t", 1]["failure_class"] == "nonfinite"
    assert "Traceback" not in capsys.readouterr().err


def test_an_experiment_gate_that_a_default_overrides_warns_where_to_put_it(caplog):
    """The experiment's gate does not reach a bfloat16 target (its dtype's default wins): loading says so, with
    the target's own entry as the place where it takes effect; a float32 target's gate says nothing."""
    with caplog.at_level("WARNING", logger="parity"):
        experiment_from_dict(tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}, {"backend": "eager", "name": "f"}],
                                             tolerances={"gate": 0.000104}))
    [warning] = [r.getMessage() for r in caplog.records if "does not apply" in r.getMessage()]
    assert ("tolerances.gate 0.000104 does not apply to target eager-cpu-bfloat16: it is judged at its bfloat16 "
            "default (atol 1e-05); to judge it at 0.000104, set `tolerances: {gate: 0.000104}` in that target's own "
            "entry") in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="parity"):
        experiment_from_dict(tiny_experiment([{"backend": "eager", "dtype": "bfloat16", "tolerances": {"gate": 1e-4}}],
                                             tolerances={"gate": 0.000104}))
    assert not [r for r in caplog.records if "does not apply" in r.getMessage()]


def _quantized(**extra):
    from parity.config.schema import BackendSpec

    return BackendSpec(backend="eager", quantize={"scheme": "torchao-int8-weight"}, **extra)


def test_a_quantized_target_is_judged_at_a_scale_aware_gate_and_the_sweep_keeps_float32s():
    """int8 at float32's 1e-4 fails whatever its quality: by default it is judged at 5% of the reference output's
    rms (rms 2 here: atol 0.1), the check records that atol, and the sweep's 1e-4 still reports its verdict."""
    import torch

    from parity.config.schema import BackendSpec, Tolerances
    from parity.config.tolerances import resolve
    from parity.execute.execution import Execution
    from parity.records import tolerance_key
    from parity.verify.judge import judge

    tol = resolve(Tolerances(), _quantized(), "float32")
    assert (tol.relative, tol.source) == (0.05, "default-for-int8-weight")
    ref = Execution(BackendSpec(backend="eager"), "ok", outputs=[torch.tensor([2.0, -2.0, 2.0, -2.0])])
    near = judge(ref, Execution(_quantized(), "ok", outputs=[torch.tensor([2.0625, -2.0, 2.0, -2.0])]), tol)
    far = judge(ref, Execution(_quantized(), "ok", outputs=[torch.tensor([2.125, -2.0, 2.0, -2.0])]), tol)
    assert near.passed is True and near.gate == 0.1 and near.tolerance_source == tol.source
    assert near.verdicts[tolerance_key(1e-4)] is False  # float32's gate, still reported
    assert far.passed is False and far.failure_class == "numeric_drift"
    own = resolve(Tolerances(), _quantized(tolerances={"gate": 1e-4}), "float32")
    assert (own.relative, own.gate, own.source) == (None, 1e-4, "target")  # the target's own gate wins


def test_the_tolerance_line_states_a_quantized_default_and_the_verdict_at_float32s_gate():
    from parity.records import tolerance_key
    from parity.records.summary import Summary, TargetTotals
    from parity.report.wording import tolerance_lines

    info = TargetTotals.model_construct(  # only what the line reads
        gate=0.1, rtol=1e-5, tolerance_source="default-for-int8-weight", gated_by="tier1", passed=1, failed=0,
        per_tolerance={tolerance_key(1e-4): 0, tolerance_key(1e-3): 0}, output_rules=[], noise_floor=None)
    [line] = tolerance_lines(Summary.model_construct(gate=1e-4, uniform_tolerance=False,
                                                     per_target={"eager-cpu-int8-weight": info}))
    assert line == ("tolerance eager-cpu-int8-weight: atol 0.05 x the reference output's rms (each check's own; 0.1 on "
                    "the first), rtol 1e-05 (default-for-int8-weight); at the experiment's gate 0.0001: 0/1 pass")
