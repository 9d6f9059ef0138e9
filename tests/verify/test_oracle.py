"""The float64 oracle always answers or says why not (issue 24): a forward that casts to float32 still gets a
float64 run; an oracle that cannot run says why beside the check; NaN/Inf on one side get a verdict; two sides
equally far from float64 are said to be; a passing target much farther from float64 than the reference says so."""

from __future__ import annotations

import math

import pytest
import torch

from parity.records.models import OracleVerdict
from parity.report.next_steps import oracle_finding
from parity.verify.tensors import compare, oracle_verdict
from tests.support import tiny_experiment
from tests.support.cli import run_experiment

PERTURBED = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}
SAME = {"backend": "eager", "name": "same"}


def _model(entry: str) -> list[dict]:
    return [{"name": "tiny", "source": "python", "entry": f"tests.fixtures.oracle:{entry}"}]


def _run(write_yaml, tmp_path, capsys, exp, *extra):
    ran = run_experiment(exp, tmp_path, *extra, capsys=capsys)
    return ran.code, ran.out, ran.said


def _checks(out) -> dict:
    from parity.records.view import RunView

    return {c.target: c for c in RunView.read(out).checks(1)}


def _verdict(reference, target, oracle, multiplier=2.0, floor=1e-8):
    return oracle_verdict(compare(reference, target, 0.0, 1e-4, oracle), multiplier, floor)


def test_a_forward_that_casts_to_float32_still_gets_a_float64_run(write_yaml, tmp_path, capsys):
    """`x.float()`, `.to(torch.float32)`, `.type(torch.FloatTensor)`, `dtype=torch.float32`, a tensor made
    without a dtype: under the oracle each is float64, so the float64 run answers."""
    exp = tiny_experiment([PERTURBED], oracle=True, models=_model("casts_in_forward"))
    code, out, printed = _run(write_yaml, tmp_path, capsys, exp, "--no-report")
    check = _checks(out)["perturbed"]
    assert code == 1 and check.oracle_error is None, check.oracle_error
    assert check.oracle.worse == "target"
    assert "oracle: the target is worse than the reference at out" in printed
    assert torch.get_default_dtype() == torch.float32  # the float64 default is the oracle's run's alone


def test_an_oracle_that_cannot_run_says_why_beside_the_check_and_in_every_report(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([PERTURBED, SAME], oracle=True, models=_model("float32_only"))
    code, out, printed = _run(write_yaml, tmp_path, capsys, exp)
    why = "the float64 oracle could not run (backend_error): TypeError: this model runs in float32 only"
    checks = _checks(out)
    assert code == 1 and all(why in c.oracle_error for c in checks.values())
    assert f"oracle: no verdict: {why}" in printed  # beside the failed check
    assert f"oracle tiny / noise / same: no verdict: {why}" in printed  # the passing one: once per line
    assert "the oracle oracle" not in printed
    assert why in (out / "report.md").read_text() and why in (out / "report.html").read_text()


def test_nan_in_the_target_where_float64_has_a_number_is_the_targets():
    oracle = torch.linspace(-1, 1, 50, dtype=torch.float64)
    reference, target = oracle.float(), oracle.float()
    target[3] = math.nan
    verdict = _verdict(reference, target, oracle)
    assert verdict.worse == "target" and verdict.target_worse
    assert (verdict.target_nonfinite_off, verdict.reference_nonfinite_off) == (1, 0)
    assert oracle_finding(OracleVerdict.model_validate(verdict), False) == [
        "oracle: float64 has the reference's NaN/Inf pattern, not the target's: the target's NaN/Inf are its own "
        "(differing from float64 at 1 element(s) in the target, 0 in the reference)"]


def test_on_a_leaf_with_nan_or_inf_on_one_side_the_patterns_decide_not_the_rmse():
    """The reference has +Inf where float64 has a number; the target is 1e-3 off everywhere, far worse by rmse
    over the finite elements: on the Inf the check fails for, the reference is the one that is off."""
    oracle = torch.linspace(-1, 1, 50, dtype=torch.float64)
    reference, target = oracle.float(), (oracle + 1e-3).float()
    reference[7] = math.inf
    verdict = _verdict(reference, target, oracle)
    assert verdict.target_rmse > 2 * verdict.reference_rmse
    assert verdict.worse == "reference" and (verdict.target_nonfinite_off, verdict.reference_nonfinite_off) == (0, 1)


def test_inf_in_the_reference_that_float64_lacks_makes_the_target_the_faithful_side(write_yaml, tmp_path, capsys):
    """exp overflows float32 (the reference: +Inf) but not float64: a target that keeps the number is right."""
    exp = tiny_experiment([{"backend": "tests.fixtures.oracle:Float64Eager", "name": "wide"}], oracle=True,
                          models=_model("overflow"))
    code, out, printed = _run(write_yaml, tmp_path, capsys, exp, "--no-report")
    check = _checks(out)["wide"]
    assert code == 1 and check.failure_class == "nonfinite"
    assert check.oracle.worse == "reference" and not check.oracle.target_worse
    assert check.oracle.target_nonfinite_off == 0 < check.oracle.reference_nonfinite_off
    assert ("oracle: float64 has the target's NaN/Inf pattern, not the reference's: the reference's values there "
            "are the artefact, the target is right") in printed


@pytest.mark.parametrize(("target_over_reference", "worse"), [(2.2, "target"), (1.8, "neither"), (1.0, "neither"),
                                                              (1 / 1.8, "neither"), (1 / 2.2, "reference")])
def test_which_side_is_farther_from_float64_takes_a_factor_of_the_multiplier(target_over_reference, worse):
    """A side is farther only beyond `multiplier` (2) times the other's rmse: within it, both are equally far."""
    oracle = torch.linspace(-1, 1, 64, dtype=torch.float64)
    reference = oracle + 1e-3
    target = oracle + 1e-3 * target_over_reference
    verdict = _verdict(reference, target, oracle, floor=0.0)
    assert verdict.worse == worse and verdict.target_worse == (worse == "target")
    [line] = oracle_finding(OracleVerdict.model_validate(verdict), False)
    assert line.startswith({"target": "oracle: the target is worse than the reference at out",
                            "reference": "oracle: the reference is the imprecise one",
                            "neither": "oracle: both sides are equally far from float64"}[worse])


@pytest.mark.parametrize(("error", "notable"), [(1e-3, True), (3e-7, False)])
def test_a_passing_target_much_farther_from_float64_is_said_relative_to_the_outputs_scale(error, notable):
    """1e-3 of the output's scale from float64 while the reference is exact: said; 3e-7 (float32 noise) is
    quiet, though the reference is just as exact, so the target is as many times farther."""
    oracle = torch.linspace(-1, 1, 64, dtype=torch.float64)
    verdict = _verdict(oracle.clone(), oracle + error * oracle.square().mean().sqrt(), oracle)
    assert verdict.worse == "target" and verdict.notable is notable
    lines = oracle_finding(OracleVerdict.model_validate(verdict), True)
    assert bool(lines) is notable
    assert not lines or lines[0].startswith("oracle: passes, but the target is much farther from float64")


def test_a_passing_check_whose_target_is_far_worse_against_float64_says_so_everywhere(write_yaml, tmp_path, capsys):
    far = {"backend": "tests.fixtures.oracle:ScaledError", "name": "far", "options": {"error": 1e-3}}
    near = {"backend": "tests.fixtures.oracle:ScaledError", "name": "near", "options": {"error": 0.0}}
    exp = tiny_experiment([far, near], oracle=True, tolerances={"atol": [1e-1], "gate": 1e-1})
    code, out, printed = _run(write_yaml, tmp_path, capsys, exp)
    assert code == 0
    line = next(x for x in printed.splitlines() if x.startswith("oracle tiny / noise / far: passes, but the target is "))
    assert "x farther from float64 than the reference" in line and "output rms" in line
    assert "tiny / noise / near" not in printed
    assert "passes, but the target is" in (out / "report.md").read_text()
    assert "passes, but the target is" in (out / "report.html").read_text()


def test_a_target_that_returned_nothing_has_no_oracle_verdict_and_says_why(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([{"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"}], oracle=True)
    code, out, printed = _run(write_yaml, tmp_path, capsys, exp, "--no-report")
    check = _checks(out)["failing"]
    assert code == 1 and check.oracle is None
    assert check.oracle_error == "the target returned no output to hold against float64's"
    assert "oracle: no verdict: the target returned no output to hold against float64's" in printed


def test_the_numbers_beside_the_oracle_verdict_are_those_of_the_leaves_that_decided_it():
    """Leaf a: the reference is off (0.1 against 1e-3); leaf b: the target is further than the reference but within
    2x (0.0195 against 0.0103). The verdict is the reference, and its numbers are leaf a's: a line saying 'the
    target is closer' beside b's numbers (target 0.0195, reference 0.0103) would contradict itself."""
    from parity.records.models import Leaf
    from parity.verify.tensors import Comparison, oracle_verdict

    leaves = [Leaf(name="a", oracle_rmse_target=1e-3, oracle_rmse_reference=0.1),
              Leaf(name="b", oracle_rmse_target=0.0195, oracle_rmse_reference=0.0103)]
    verdict = oracle_verdict(Comparison(leaves=leaves), 2.0, 1e-8)
    assert verdict.worse == "reference"
    assert (verdict.target_rmse, verdict.reference_rmse) == (1e-3, 0.1)
