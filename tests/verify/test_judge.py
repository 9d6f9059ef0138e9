"""The verdict of one check, at its boundaries: each test pins one rule of tier 1's judgement that a
plausible edit of verify/ would break without any end-to-end test noticing (issue 25's four mutations).

The outputs are constructed so that every number is exact in binary floating point: the boundary is the
boundary, on any CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity import taxonomy as tx
from parity.execute.execution import Execution
from parity.experiment.loading import experiment_from_dict
from parity.records import tolerance_key
from parity.verify.checks import tier1_check
from tests.support import tiny_experiment


def _experiment(sweep: list[float], gate: float, rtol: float = 0.0, outputs: dict | None = None):
    tolerances = {"atol": sweep, "gate": gate, "rtol": rtol, **({"outputs": outputs} if outputs else {})}
    return experiment_from_dict(tiny_experiment([{"backend": "eager", "name": "target"}], tolerances=tolerances))


def _judge(exp, reference, target, target_warmup=(), reference_warmup=()):
    """tier1_check of one target whose first timed output is `target` (its warm-up runs `target_warmup`)."""
    job = SimpleNamespace(model=exp.models[0], inputs=exp.inputs[0], reference=exp.reference)
    ref = Execution(exp.reference, "ok", outputs=[reference], warmup_outputs=list(reference_warmup))
    tgt = Execution(exp.targets[0], "ok", outputs=[target], warmup_outputs=list(target_warmup))
    return tier1_check(job, tgt, ref, None, exp)


def test_a_check_exactly_at_its_tolerance_passes_at_that_tolerance():
    """|t - r| = 0.5 exactly, gate 0.5: the test is <=, so it passes at 0.5 and fails only below it."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.5)
    check = _judge(exp, torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]))
    assert check["required_atol"] == 0.5
    assert check["passed"] is True and check["failure_class"] is None
    assert check["verdicts"] == {tolerance_key(0.25): False, tolerance_key(0.5): True, tolerance_key(1.0): True}


def test_the_required_atol_is_the_largest_leafs_not_the_last_leafs():
    """The first leaf drifts by 0.5, the last not at all: the check needs atol 0.5, at every atol of the sweep."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    reference = {"logits": torch.tensor([1.0, 2.0]), "labels": torch.tensor([1.0, 3.0])}
    target = {"logits": torch.tensor([1.5, 2.0]), "labels": torch.tensor([1.0, 3.0])}
    check = _judge(exp, reference, target)
    assert check["required_atol"] == 0.5
    assert check["passed"] is False and check["failure_class"] == tx.NUMERIC_DRIFT
    assert check["verdicts"] == {tolerance_key(0.25): False, tolerance_key(0.5): True, tolerance_key(1.0): True}
    assert "logits" in check["detail"]


def test_an_output_rule_judges_its_leaf_at_its_own_rtol():
    """|t - r| = 0.25 on |r| = 1: the rule's rtol 0.5 absorbs it (passes at any atol); the experiment's rtol 0
    would need atol 0.25, beyond the gate."""
    exp = _experiment([0.0625, 0.125], gate=0.0625, outputs={"out": {"rtol": 0.5}})
    check = _judge(exp, torch.tensor([1.0, -1.0]), torch.tensor([1.25, -1.25]))
    assert check["passed"] is True, check["detail"]
    assert check["required_atol"] == 0.0
    assert check["leaves"][0]["tolerance"]["rtol"] == 0.5


def test_the_experiments_rtol_still_judges_the_leaves_no_rule_names():
    """The mirror of the rule's test: without the rule the same outputs fail, so the rule is what passed them."""
    exp = _experiment([0.0625, 0.125, 0.25], gate=0.0625)
    check = _judge(exp, torch.tensor([1.0, -1.0]), torch.tensor([1.25, -1.25]))
    assert check["passed"] is False and check["required_atol"] == 0.25


@pytest.mark.parametrize("side", ["target", "reference"])
def test_the_repeats_spread_is_part_of_the_required_atol(side):
    """The first timed runs agree exactly; one warm-up run of one side differs by 0.5. The check needs atol 0.5
    to pass (the side disagrees with itself by that much), and fails as nondeterministic at the gate."""
    exp = _experiment([0.25, 0.5, 1.0], gate=0.25)
    same, other = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0])
    warm = {f"{side}_warmup": [other]}
    check = _judge(exp, same, same.clone(), **warm)
    assert check["nondeterminism"][side] == 0.5
    assert check["required_atol"] == 0.5
    assert check["verdicts"][tolerance_key(0.25)] is False and check["verdicts"][tolerance_key(0.5)] is True
    assert check["passed"] is False and check["failure_class"] == tx.NONDETERMINISTIC
    assert side in check["detail"]
