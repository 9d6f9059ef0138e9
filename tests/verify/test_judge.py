"""The judge (verify/judge.py), the one function that decides a check's `passed`: each test pins one rule of
its verdict that a plausible edit would break without any end-to-end test noticing (issue 25's four
mutations), the task gate and the ordering relabel, the record it writes, and that the Python API and the
pytest plugin give the Runner's verdict on the same case.

The outputs are constructed so that every number is exact in binary floating point: the boundary is the
boundary, on any CPU."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import torch

from parity import taxonomy as tx
from parity.config.tolerances import Tolerance
from parity.execute.execution import Execution
from parity.experiment.loading import experiment_from_dict
from parity.records import tolerance_key
from parity.records.models import Tier1Check, Tier3Check
from parity.verify.judge import judge
from parity.verify.tasks import TaskResult, tier3_check
from tests.support import tiny_experiment

pytest_plugins = ["pytester"]


def _experiment(sweep: list[float], gate: float, rtol: float = 0.0, outputs: dict | None = None):
    tolerances = {"atol": sweep, "gate": gate, "rtol": rtol, **({"outputs": outputs} if outputs else {})}
    return experiment_from_dict(tiny_experiment([{"backend": "eager", "name": "target"}], tolerances=tolerances))


def _judge(exp, reference, target, target_warmup=(), reference_warmup=(), tolerance=None, task=None) -> Tier1Check:
    """The check of one target whose first timed output is `target` (its warm-up runs `target_warmup`)."""
    ref = Execution(exp.reference, "ok", outputs=[reference], warmup_outputs=list(reference_warmup))
    tgt = Execution(exp.targets[0], "ok", outputs=[target], warmup_outputs=list(target_warmup))
    return judge(ref, tgt, tolerance or exp.tolerance_for(exp.targets[0]), model="m", inputs="x", task=task)


def test_a_check_exactly_at_its_tolerance_passes_at_that_tolerance():
    """|t - r| = 0.5 exactly, gate 0.5: the test is <=, so it passes at 0.5 and fails only below it."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.5)
    check = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]))
    assert check.required_atol == 0.5
    assert check.passed is True and check.failure_class is None
    assert check.verdicts == {tolerance_key(0.25): False, tolerance_key(0.5): True, tolerance_key(1.0): True}


def test_the_required_atol_is_the_largest_leafs_not_the_last_leafs():
    """The first leaf drifts by 0.5, the last not at all: the check needs atol 0.5, at every atol of the sweep."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    reference = {"logits": torch.tensor([1.0, 2.0]), "labels": torch.tensor([1.0, 3.0])}
    target = {"logits": torch.tensor([1.5, 2.0]), "labels": torch.tensor([1.0, 3.0])}
    check = _judge(exp, reference, target)
    assert check.required_atol == 0.5
    assert check.passed is False and check.failure_class == tx.NUMERIC_DRIFT
    assert check.verdicts == {tolerance_key(0.25): False, tolerance_key(0.5): True, tolerance_key(1.0): True}
    assert "logits" in check.detail


def test_an_output_rule_judges_its_leaf_at_its_own_rtol():
    """|t - r| = 0.25 on |r| = 1: the rule's rtol 0.5 absorbs it (passes at any atol); the experiment's rtol 0
    would need atol 0.25, beyond the gate."""
    exp = _experiment([0.0625, 0.125], gate=0.0625, outputs={"out": {"rtol": 0.5}})
    check = _judge(exp, torch.tensor([1.0, -1.0]), torch.tensor([1.25, -1.25]))
    assert check.passed is True, check.detail
    assert check.required_atol == 0.0
    assert check.leaves[0].tolerance.rtol == 0.5


def test_the_experiments_rtol_still_judges_the_leaves_no_rule_names():
    """The mirror of the rule's test: without the rule the same outputs fail, so the rule is what passed them."""
    exp = _experiment([0.0625, 0.125, 0.25], gate=0.0625)
    check = _judge(exp, torch.tensor([1.0, -1.0]), torch.tensor([1.25, -1.25]))
    assert check.passed is False and check.required_atol == 0.25


@pytest.mark.parametrize("side", ["target", "reference"])
def test_the_repeats_spread_is_part_of_the_required_atol(side):
    """The first timed runs agree exactly; one warm-up run of one side differs by 0.5. The check needs atol 0.5
    to pass (the side disagrees with itself by that much), and fails as nondeterministic at the gate."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    same, other = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0])
    warm = {f"{side}_warmup": [other]}
    check = _judge(exp, same, same.clone(), **warm)
    assert check.nondeterminism[side] == 0.5
    assert check.required_atol == 0.5
    assert check.verdicts[tolerance_key(0.25)] is False and check.verdicts[tolerance_key(0.5)] is True
    assert check.passed is False and check.failure_class == tx.NONDETERMINISTIC
    assert side in check.detail


BY_TASK = Tolerance(sweep=(0.25, 0.5, 1.0), rtol=0.0, gate=0.25, by_task=True)


def _tier3(task: str = "classification", **verdict) -> Tier3Check:
    """The tier-3 check of a task's verdict, as the Runner hands it to the judge."""
    return tier3_check(TaskResult(task, **verdict), model="m", inputs="x", reference="eager", target="t",
                       thresholds=None)


AGREES = _tier3()
FLIPS = _tier3(passed=False, failure_class=tx.DECISION_FLIP, detail="top-1 agreement 0.5")


@pytest.mark.parametrize(("target", "warmup", "failure"), [
    (torch.tensor([float("nan"), 2.0]), (), tx.NONFINITE),
    (torch.tensor([1.0, 2.0, 3.0]), (), tx.SHAPE_MISMATCH),
    ({"out": torch.tensor([1.0, 2.0]), "extra": torch.tensor(1.0)}, (), tx.STRUCTURE_MISMATCH),
    (object(), (), tx.UNCOMPARABLE),
    (torch.tensor([1.0, 2.0]), (torch.tensor([1.5, 2.0]),), tx.NONDETERMINISTIC),  # tier 1 finds it
    (torch.tensor([1.5, 2.0]), (torch.tensor([1.0, 2.0]),), tx.NONDETERMINISTIC),  # drift; the gate finds it
])
def test_gate_tier3_never_excuses_what_is_not_numeric_drift(target, warmup, failure):
    """NaN where the reference has a number, another shape or structure, an output that cannot be compared, or
    runs that disagree with each other fail the check under gate: tier3 even when the task agrees."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    check = _judge(exp, torch.tensor([1.0, 2.0]), target, target_warmup=warmup, tolerance=BY_TASK, task=AGREES)
    assert check.passed is False and check.failure_class == failure and check.tier1_passed is False
    assert check.detail.startswith(f"tier 3 cannot excuse {failure}")


def test_gate_tier3_lets_the_task_decide_numeric_drift_and_keeps_tier_1s_verdict():
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    drift = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]), tolerance=BY_TASK, task=AGREES)
    assert drift.passed is True and drift.failure_class is None and drift.tier1_passed is False
    assert drift.required_atol == 0.5 and drift.detail.startswith("tier 3 agrees, which decides this check")
    flipped = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]), tolerance=BY_TASK, task=FLIPS)
    assert flipped.passed is False and flipped.failure_class == tx.DECISION_FLIP
    assert flipped.detail == "tier 3 (the gate): top-1 agreement 0.5" and flipped.tier1_passed is False
    at_tier1 = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]), task=AGREES)  # gate: a number
    assert at_tier1.passed is False and at_tier1.failure_class == tx.NUMERIC_DRIFT and at_tier1.tier1_passed is None


def test_the_same_items_in_another_order_are_ordering_not_drift():
    """Tier 3 matched every item (same_set): tier 1's numeric drift is relabelled ordering; a failure of
    another class keeps its own."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    same_set = _tier3("detection", same_set=True)
    check = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0]), task=same_set)
    assert check.failure_class == tx.ORDERING and check.passed is False
    assert check.detail.startswith("the same detection outputs in another order")
    nan = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 1.0]), task=same_set)
    assert nan.failure_class == tx.NONFINITE


# The keys of each kind of check record, in the order parity writes them: a rerun writes the bytes it wrote.
BASE = ["tier", "model", "inputs", "reference", "target", "rtol", "gate", "tolerance_source", "gated_by"]
VERDICT = ["status", "passed", "failure_class", "detail"]
NUMBERS = ["required_atol", "max_abs", "verdicts", "nondeterminism", "leaves", "oracle"]


def test_each_kind_of_check_records_its_fields_in_the_order_it_always_did():
    exp = _experiment([0.25, 0.5], gate=0.25)
    spec = exp.targets[0]
    ok = Execution(exp.reference, "ok", outputs=[torch.tensor([1.0])])
    failed_ref = Execution(exp.reference, "error", error="boom", failure_class=tx.BACKEND_ERROR)
    tol = exp.tolerance_for(spec)
    cases = {
        "compared": (judge(ok, Execution(spec, "ok", outputs=[torch.tensor([1.5])]), tol, oracle=failed_ref,
                           oracle_rule=exp.oracle, task=_tier3(same_set=None)),
                     [*BASE, "warnings", *VERDICT, *NUMBERS, "noise_floor", "oracle_error"]),
        "gated": (judge(ok, Execution(spec, "ok", outputs=[torch.tensor([1.5])]), BY_TASK, task=AGREES),
                  [*BASE, "warnings", *VERDICT, *NUMBERS, "noise_floor", "tier1_passed"]),
        "target failed": (judge(ok, Execution(spec, "error", error="boom"), tol),
                          [*BASE, "warnings", *VERDICT, *NUMBERS]),
        "skipped": (judge(ok, Execution(spec, "unavailable", error="not here"), tol),
                    [*BASE, "warnings", *VERDICT, *NUMBERS]),
        "reference failed": (judge(failed_ref, spec, tol),
                             [*BASE, *VERDICT, "reference_failure_class", "user_error", *NUMBERS]),
    }
    for name, (check, keys) in cases.items():
        record = check.model_dump(exclude_unset=True)  # what the Runner writes: the check is the record's model
        assert list(record) == ["kind", *keys], name
        assert Tier1Check.model_validate(record).model_dump(exclude_unset=True) == record  # read back: the same
    leaf = cases["compared"][0].model_dump(exclude_unset=True)["leaves"][0]
    assert list(leaf)[:3] == ["name", "required_atol", "failure_class"]  # as compare found them, not as declared
    assert [cases[n][0].status for n in cases] == ["ok", "ok", "ok", "skipped", "error"]
    assert cases["target failed"][0].verdicts == {tolerance_key(0.25): False, tolerance_key(0.5): False}
    assert cases["reference failed"][0].user_error is True and cases["reference failed"][0].passed is None
    assert "float64 oracle could not run" in cases["compared"][0].oracle_error


# --- The Python API and the pytest plugin judge as the Runner does -------------------------------------------

TARGETS = [{"backend": "eager", "name": "same"},
           {"backend": "tests.fixtures.tiny:OffsetEager", "name": "offset"},  # 2**-10 everywhere: beyond 1e-4
           {"backend": "eager", "dtype": "bfloat16"},  # judged at bfloat16's default tolerance, both ways
           {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """One tiny CNN and one input batch, judged by `parity run` (the Runner; one run of each side, as the API
    makes): its tier-1 checks by target, and the model and inputs as the Runner built them."""
    from parity.api import run_experiment
    from parity.inputs import build_inputs
    from parity.records import RunView
    from parity.runner.prepared import prepared_model

    data = tiny_experiment(TARGETS, repeats=1, warmup=0)
    folder = tmp_path_factory.mktemp("judge")
    records = run_experiment(data, out=folder / "out", reports=())
    exp = experiment_from_dict(data)
    model, _ = prepared_model(exp.models[0], exp)
    inputs = build_inputs(exp.inputs[0], exp, exp.models[0].batch_mode)
    return {c.target: c for c in RunView(records).checks(1)}, model, inputs.args, folder


def test_the_api_gives_the_runners_verdict(case):
    from parity.api import Disagreement, assert_backends_agree

    checks, model, args, _ = case
    assert checks["same"].passed is True and checks["offset"].passed is False  # the case has both verdicts
    with pytest.raises(Disagreement) as info:
        assert_backends_agree(model, args, targets=TARGETS)
    for name, found in info.value.result.targets.items():
        check = checks[name]
        assert (found.passed, found.failure_class, found.required_atol, found.max_abs) == \
               (check.passed, check.failure_class, check.required_atol, check.max_abs), name
        assert (found.atol, found.rtol) == (check.gate, check.rtol), name
        assert [(leaf["name"], leaf["required_atol"]) for leaf in found.leaves] == \
               [(leaf.name, leaf.required_atol) for leaf in check.leaves], name
    assert {t.atol for t in info.value.result.targets.values()} == {1e-4, 1e-5}  # float32's gate, bfloat16's


PLUGIN_TEST = '''
import torch


def test_case(parity):
    model, args = torch.load({path!r}, weights_only=False)
    parity.check(model, args, targets={targets!r})
'''


def test_the_pytest_plugin_gives_the_runners_verdict(case, pytester, monkeypatch):
    checks, model, args, folder = case
    torch.save((model, args), folder / "case.pt")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_case=PLUGIN_TEST.format(path=str(folder / "case.pt"), targets=TARGETS))
    result = pytester.runpytest("-p", "parity.pytest_plugin", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "junit.xml").getroot().iter("property")}
    for name, check in checks.items():
        assert props[f"parity.{name}.passed"] == str(check.passed), name
        assert props.get(f"parity.{name}.failure_class") == check.failure_class, name
        assert float(props[f"parity.{name}.required_atol"]) == check.required_atol, name


@pytest.mark.parametrize(("tolerances", "gate"), [
    ({}, 1e-4),  # swept by default, 1e-4 among the atols
    ({"atol": [1e-3, 1e-2]}, 1e-2),  # 1e-4 not swept: the sweep's largest
    ({"atol": [1e-3, 1e-2], "gate": 5e-3}, 5e-3),
    ({"gate": "tier3"}, 1e-4),  # tier 3 decides; tier 1's own verdict is still read at this
])
def test_the_default_gate_is_one_rule_that_the_schema_the_resolution_and_the_summary_share(tolerances, gate):
    """An experiment's gate when it gives none: the schema's `gate_atol`, a float32 target's resolved gate and
    the summary of its records (worked out from the run record's config) say the same."""
    from parity.records.summary import summarize

    data = tiny_experiment([{"backend": "eager", "name": "t"}], tolerances=tolerances)
    if tolerances.get("gate") == "tier3":
        data.update(tiers={"tasks": True})
        data["models"][0]["task"] = "classification"
    exp = experiment_from_dict(data)
    tol = exp.tolerance_for(exp.targets[0])
    check = judge(Execution(exp.reference, "ok", outputs=[torch.tensor([1.0])]),
                  Execution(exp.targets[0], "ok", outputs=[torch.tensor([1.0])]), tol, model="tiny", inputs="noise")
    run = {"kind": "run", "experiment": exp.name, "config": exp.model_dump(mode="json"), "base_dir": ".", "environment": {}}
    assert exp.tolerances.gate_atol == tol.gate == summarize([run, check.model_dump(exclude_unset=True)]).gate == gate
