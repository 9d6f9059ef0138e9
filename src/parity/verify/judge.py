"""The judge: the one function that decides whether a check passes (`judge`), and the typed `Check` it returns.

A check is one target against the reference on one model and input set. `judge` makes its verdict in this
order, and nothing after it edits one: tier 1 (every output leaf at the target's `Tolerance`, and both sides'
repeats, whose spread is part of the required atol), the float64 oracle's side and the reference's noise floor
(explanations beside the verdict, never part of it), then, given tier 3's result, the ordering relabel (the same
items in another order) and under `gate: tier3` the task gate, and last tokenizer parity (a target with a
tokenizer of its own that tokenizes the texts otherwise fails as `tokenizer_mismatch`: verify/tokenizers.py). The Runner (`parity run`), `parity localize`'s
first verdict and its compiler-pass bisection, and the Python API's `assert_backends_agree` (so the pytest
plugin) all call it. The check is the `check` record's own model (records.models.Tier1Check), made in the
order of the record's fields, which `model_dump(exclude_unset=True)` gives back: a run writes it as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from parity import taxonomy as tx
from parity.config.schema import BackendSpec, Oracle
from parity.config.tolerances import Tolerance
from parity.execute.execution import Execution
from parity.outputs import float_rms
from parity.records import tolerance_key
from parity.records.models import Leaf, NoiseFloor, OracleVerdict, Tier1Check, Tier3Check
from parity.verify.tensors import compare, oracle_verdict
from parity.verify.tokenizers import first_mismatch

# What tier 3 may excuse under `gate: tier3`: values that differ. Not NaN where the reference has a number,
# another shape or structure, an output that cannot be compared, or repeats that disagree with each other.
EXCUSABLE = (None, tx.NUMERIC_DRIFT, tx.ORDERING)


@dataclass(frozen=True)
class _About:
    """What every check of one target against the reference starts with: the pair's names and its tolerance."""

    model: str
    inputs: str
    reference: str
    target: str
    tolerance: Tolerance


def _check(about: _About, *, status: str, passed: bool | None, failure_class: str | None, detail: str | None,
           warnings: list[dict[str, Any]] | None = None, reference_failure_class: str | None = None,
           user_error: bool | None = None, required_atol: float | None = None, max_abs: float | None = None,
           verdicts: dict[str, bool] | None = None, nondeterminism: dict[str, float] | None = None,
           leaves: list[Leaf] | None = None, oracle: OracleVerdict | None = None,
           noise_floor: NoiseFloor | None = None, oracle_error: str | None = None) -> Tier1Check:
    """The check record, its fields in the order parity has always written them (the archived records and a
    rerun's compare byte for byte). A field that does not apply is left out, as before: `warnings` when the target
    did not run, the reference's failure unless it failed, `noise_floor` unless the outputs were compared,
    `oracle_error` and `tier1_passed` when they have no value."""
    tolerance = about.tolerance
    fields: dict[str, Any] = {"kind": "check", "tier": 1, "model": about.model, "inputs": about.inputs,
                              "reference": about.reference, "target": about.target, "rtol": tolerance.rtol,
                              "gate": tolerance.gate, "tolerance_source": tolerance.source,
                              "gated_by": "tier3" if tolerance.by_task else "tier1"}
    if status != "error":
        fields["warnings"] = warnings or []
    fields.update(status=status, passed=passed, failure_class=failure_class, detail=detail)
    if status == "error":
        fields.update(reference_failure_class=reference_failure_class, user_error=user_error)
    fields.update(required_atol=required_atol, max_abs=max_abs, verdicts=verdicts or {}, nondeterminism=nondeterminism,
                  leaves=leaves or [], oracle=oracle)
    if nondeterminism is not None:
        fields["noise_floor"] = noise_floor
    if oracle_error is not None:
        fields["oracle_error"] = oracle_error
    return Tier1Check.model_validate(fields)


def judge(reference: Execution, target: Execution | BackendSpec, tolerance: Tolerance, *, model: str = "",
          inputs: str = "", oracle: Execution | None = None, oracle_rule: Oracle | None = None,
          task: Tier3Check | None = None) -> Tier1Check:
    """The check of `target` (its execution; its spec alone when it was not run because the reference failed)
    against `reference`, on `model` / `inputs` (names for the record), at `tolerance`. `oracle`: the float64
    oracle's execution, judged by `oracle_rule` (the experiment's `oracle:`: multiplier, floor). `task`: the
    tier-3 check record of the same pair (verify.tasks.task_check), for the ordering relabel and, when the
    tolerance is `gate: tier3`, the verdict."""
    spec = target.backend if isinstance(target, Execution) else target
    if reference.ok and tolerance.relative is not None:  # a scale-aware gate (a quantized target's default)
        tolerance = tolerance.at_scale(float_rms(reference.outputs[0]))  # becomes this check's atol here, once
    about = _About(model, inputs, reference.backend.id, spec.id, tolerance)
    if not reference.ok:
        return _reference_failed(about, reference)
    if not isinstance(target, Execution):
        raise TypeError("a target is judged by its execution; its spec alone only when the reference failed")
    if target.status == "unavailable":
        return _check(about, status="skipped", passed=None, failure_class=None, detail=target.error,
                      warnings=target.notes)
    if not target.ok:
        return _check(about, status="ok", passed=False, failure_class=target.failure_class or tx.BACKEND_ERROR,
                      detail=f"target {spec.id} failed: {target.error}", warnings=target.notes,
                      verdicts={tolerance_key(a): False for a in tolerance.sweep},
                      oracle_error=_oracle_error(oracle, "the target returned no output to hold against float64's"))
    check = _tier1(about, reference, target, oracle, oracle_rule)
    if task is not None:
        if task.same_set and check.failure_class == tx.NUMERIC_DRIFT:
            check = check.model_copy(update={"failure_class": tx.ORDERING, "detail": f"the same {task.task} outputs "
                                             f"in another order (tier 3 matched all): {check.detail}"})
        check = _gated(check, task) if tolerance.by_task else check
    return _tokenized(check, target)


def _tokenized(check: Tier1Check, target: Execution) -> Tier1Check:
    """A target that tokenizes the texts otherwise than the reference fails as `tokenizer_mismatch`, whatever its
    logits on the reference's ids (said beside it): it runs other inputs than the ones compared."""
    mismatch = first_mismatch(target.tokens)
    if mismatch is None:
        return check
    logits = "pass" if check.passed else f"fail ({check.failure_class}: {check.detail})"
    return check.model_copy(update={"passed": False, "failure_class": tx.TOKENIZER_MISMATCH,
                                    "detail": f"{mismatch.describe()}; on the reference's ids the logits {logits}",
                                    "verdicts": {k: False for k in check.verdicts}})


def repeat_spread(outputs: list[Any], tol: Tolerance) -> float:
    """How far a backend's other runs stray from its first timed one: the largest required atol (0.0 =
    bitwise equal), each leaf at its own output rule."""
    spread = 0.0
    for other in outputs[1:]:
        spread = max(spread, compare(outputs[0], other, tol.rtol, tol.gate, leaf_tolerance=tol.for_leaf).required_atol)
    return spread


def _runs(execution: Execution) -> list[Any]:
    """Every output a backend returned: its first timed repeat, then its warm-up runs and the other repeats."""
    return [*execution.outputs[:1], *execution.warmup_outputs, *execution.outputs[1:]]


def _tier1(about: _About, reference: Execution, target: Execution, oracle: Execution | None,
           oracle_rule: Oracle | None) -> Tier1Check:
    """Tier 1 of two executions that ran: the leaves at the tolerance, the repeats' spread, the oracle."""
    tol = about.tolerance
    oracle_out = oracle.outputs[0] if oracle is not None and oracle.ok else None
    comparison = compare(reference.outputs[0], target.outputs[0], tol.rtol, tol.gate, oracle_out, tol.for_leaf)
    reference_spread = repeat_spread(_runs(reference), tol)
    target_spread = repeat_spread(_runs(target), tol)
    required = max(comparison.required_atol, target_spread, reference_spread)
    failure, detail = comparison.failure_class, comparison.detail
    if failure is None and max(target_spread, reference_spread) > tol.gate:
        failure = tx.NONDETERMINISTIC
        who = "target" if target_spread >= reference_spread else "reference"
        detail = (f"the {who}'s runs (warm-up and repeats) differ from its first timed run by up to "
                  f"{max(target_spread, reference_spread):.3g} (required atol)")
    found = None
    if oracle_out is not None and failure in (*EXCUSABLE, tx.NONFINITE):  # values that differ; a structural
        # failure has no side that is less precise
        if oracle_rule is None:
            raise TypeError("an oracle's execution is judged by the experiment's oracle_rule (multiplier, floor)")
        found = oracle_verdict(comparison, oracle_rule.multiplier, oracle_rule.floor)
    missing = None if found else (f"no output leaf could be held against float64's "
                                  f"({failure or 'the float64 outputs differ in structure or shape'})")
    return _check(about, status="ok", passed=failure is None, failure_class=failure, detail=detail,
                  warnings=target.notes, required_atol=required if math.isfinite(required) else None,
                  max_abs=max((leaf.max_abs or 0.0 for leaf in comparison.leaves), default=0.0),
                  verdicts={tolerance_key(a): required <= a for a in tol.sweep},
                  nondeterminism={"reference": reference_spread, "target": target_spread}, leaves=comparison.leaves,
                  oracle=found, noise_floor=_noise_floor(reference.outputs[0], oracle_out, reference_spread, tol),
                  oracle_error=_oracle_error(oracle, missing))


def _gated(check: Tier1Check, task: Tier3Check) -> Tier1Check:
    """`gate: tier3`: the check's verdict becomes the task-level one when tier 1 found only numeric drift
    (or nothing); tier 1's own verdict is kept beside it (`tier1_passed`)."""
    failure, detail = check.failure_class, check.detail
    spread = max(check.nondeterminism.values(), default=0.0)
    if spread > check.gate and failure in EXCUSABLE:
        failure, detail = tx.NONDETERMINISTIC, f"its runs disagree with each other by up to {spread} (required atol): {detail}"
    if failure not in EXCUSABLE:
        return check.model_copy(update={"failure_class": failure, "tier1_passed": check.passed, "detail": f"tier 3 "
                                        f"cannot excuse {failure} (gate: tier3 decides numeric drift only): {detail}"})
    if task.passed:
        if failure:
            detail = f"tier 3 agrees, which decides this check (gate: tier3); tier 1: {failure}: {detail}"
        return check.model_copy(update={"passed": True, "failure_class": None, "detail": detail,
                                        "tier1_passed": check.passed})
    return check.model_copy(update={"passed": False, "failure_class": task.failure_class,
                                    "detail": f"tier 3 (the gate): {task.detail}", "tier1_passed": check.passed})


def _reference_failed(about: _About, reference: Execution) -> Tier1Check:
    """The check when the reference could not run: no verdict about the target (it was not run), status
    `error`, class `reference_error`. `user_error` says whether the model as written failed on its inputs
    (the eager reference raised), which is the user's to fix, not a backend's finding."""
    return _check(about, status="error", passed=None, failure_class=tx.REFERENCE_ERROR,
                  detail=f"the reference {reference.backend.id} failed ({reference.failure_class}), so "
                         f"{about.target} was not run: {reference.error}",
                  reference_failure_class=reference.failure_class,
                  user_error=reference.backend.backend == "eager" and reference.failure_class == tx.BACKEND_ERROR)


def _noise_floor(reference_out: Any, oracle_out: Any, reference_spread: float, tol: Tolerance) -> NoiseFloor | None:
    """The reference's own error, where the data show it: its distance from the float64 oracle and the
    spread of its repeats, as a required atol. No gate below it can be met, whatever the target does."""
    found = []
    if oracle_out is not None:
        against_oracle = compare(oracle_out, reference_out, tol.rtol, tol.gate).required_atol
        if math.isfinite(against_oracle):
            found.append((against_oracle, "float64 oracle"))
    if 0 < reference_spread < math.inf:  # inf: repeats that cannot be compared say nothing of the noise
        found.append((reference_spread, "the reference's repeats"))
    if not found:
        return None
    atol, source = max(found)
    return NoiseFloor(atol=atol, source=source)


def _oracle_error(oracle: Execution | None, missing: str | None) -> str | None:
    """Why a check has no oracle verdict although the oracle was asked for: it did not run, or (`missing`)
    it ran but nothing of the check could be held against it."""
    if oracle is None:
        return None
    if not oracle.ok:
        return f"the float64 oracle could not run ({oracle.failure_class}): {oracle.error}"
    return missing
