"""Tier-1 check records: one target against the reference on one model and input set."""

from __future__ import annotations

import math
from typing import Any

from parity import taxonomy as tx
from parity.records import tolerance_key
from parity.verify.tensors import compare, oracle_verdict


def repeat_spread(outputs: list[Any], rtol: float, gate: float, leaf_tolerance=None) -> float:
    """How far a backend's other runs stray from its first timed one: the largest required atol (0.0 =
    bitwise equal), each leaf at its own output rule."""
    spread = 0.0
    for other in outputs[1:]:
        spread = max(spread, compare(outputs[0], other, rtol, gate, leaf_tolerance=leaf_tolerance).required_atol)
    return spread


def _runs(execution) -> list[Any]:
    """Every output a backend returned: its first timed repeat, then its warm-up runs and the other repeats."""
    return [*execution.outputs[:1], *execution.warmup_outputs, *execution.outputs[1:]]


def tier1_check(job, target_exec, reference_exec, oracle_exec, experiment) -> dict[str, Any]:
    """The fields of one `check` record, judged at the target's own tolerance (config/tolerances.py)."""
    tol = experiment.tolerance_for(target_exec.backend)
    gate = tol.gate
    base = {"tier": 1, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id,
            "target": target_exec.backend.id, **_tolerance_fields(tol), "warnings": target_exec.notes}
    if target_exec.status == "unavailable":
        return {**base, "status": "skipped", "passed": None, "failure_class": None, "detail": target_exec.error,
                "required_atol": None, "max_abs": None, "verdicts": {}, "nondeterminism": None, "leaves": [],
                "oracle": None}
    if not reference_exec.ok:
        raise ValueError("a check is judged only against a reference that ran: see reference_error_check")
    if not target_exec.ok:
        return {**base, "status": "ok", "passed": False,
                "failure_class": target_exec.failure_class or tx.BACKEND_ERROR,
                "detail": f"target {target_exec.backend.id} failed: {target_exec.error}",
                "required_atol": None, "max_abs": None, "verdicts": {tolerance_key(a): False for a in tol.sweep},
                "nondeterminism": None, "leaves": [], "oracle": None,
                **_oracle_error(oracle_exec, "the target returned no output to hold against float64's")}
    oracle_out = oracle_exec.outputs[0] if oracle_exec is not None and oracle_exec.ok else None
    comparison = compare(reference_exec.outputs[0], target_exec.outputs[0], tol.rtol, gate, oracle_out, tol.for_leaf)
    reference_spread = repeat_spread(_runs(reference_exec), tol.rtol, gate, tol.for_leaf)
    target_spread = repeat_spread(_runs(target_exec), tol.rtol, gate, tol.for_leaf)
    required = max(comparison.required_atol, target_spread, reference_spread)
    failure, detail = comparison.failure_class, comparison.detail
    if failure is None and max(target_spread, reference_spread) > gate:
        failure = tx.NONDETERMINISTIC
        who = "target" if target_spread >= reference_spread else "reference"
        detail = (f"the {who}'s runs (warm-up and repeats) differ from its first timed run by up to "
                  f"{max(target_spread, reference_spread):.3g} (required atol)")
    oracle = None
    if oracle_out is not None and failure in (*EXCUSABLE, tx.NONFINITE):  # values that differ; a structural
        # failure has no side that is less precise
        oracle = oracle_verdict(comparison, experiment.oracle.multiplier, experiment.oracle.floor)
    max_abs = max((leaf.get("max_abs") or 0.0 for leaf in comparison.leaves), default=0.0)
    return {
        **base,
        "status": "ok",
        "passed": failure is None,
        "failure_class": failure,
        "detail": detail,
        "required_atol": required if math.isfinite(required) else None,
        "max_abs": max_abs,
        "verdicts": {tolerance_key(a): required <= a for a in tol.sweep},
        "nondeterminism": {"reference": reference_spread, "target": target_spread},
        "leaves": comparison.leaves,
        "oracle": oracle,
        "noise_floor": _noise_floor(reference_exec.outputs[0], oracle_out, reference_spread, tol),
        **_oracle_error(oracle_exec, None if oracle else f"no output leaf could be held against float64's "
                                                         f"({failure or 'the float64 outputs differ in structure or shape'})"),
    }


# What tier 3 may excuse under `gate: tier3`: values that differ. Not NaN where the reference has a number,
# another shape or structure, an output that cannot be compared, or repeats that disagree with each other.
EXCUSABLE = (None, tx.NUMERIC_DRIFT, tx.ORDERING)


def gate_on_task(check: dict[str, Any], task: dict[str, Any]) -> None:
    """`gate: tier3`: the check's verdict becomes the task-level one when tier 1 found only numeric drift
    (or nothing); tier 1's own verdict is kept beside it."""
    check["tier1_passed"] = check["passed"]
    spread = max((check.get("nondeterminism") or {}).values(), default=0.0)
    if (spread is None or spread > check["gate"]) and check["failure_class"] in EXCUSABLE:  # None: inf, written
        check["failure_class"] = tx.NONDETERMINISTIC
        check["detail"] = f"its runs disagree with each other by up to {spread} (required atol): {check['detail']}"
    if check["failure_class"] not in EXCUSABLE:
        check["detail"] = f"tier 3 cannot excuse {check['failure_class']} (gate: tier3 decides numeric drift only): {check['detail']}"
        return
    check["passed"] = task["passed"]
    if task["passed"]:
        if check["failure_class"]:
            check["detail"] = f"tier 3 agrees, which decides this check (gate: tier3); tier 1: {check['failure_class']}: {check['detail']}"
        check["failure_class"] = None
    else:
        check["failure_class"], check["detail"] = task["failure_class"], f"tier 3 (the gate): {task['detail']}"


def _tolerance_fields(tol) -> dict[str, Any]:
    """What a check was judged at, and where that came from (experiment, target, default-for-<dtype>)."""
    return {"rtol": tol.rtol, "gate": tol.gate, "tolerance_source": tol.source,
            "gated_by": "tier3" if tol.by_task else "tier1"}


def _noise_floor(reference_out: Any, oracle_out: Any, reference_spread: float, tol) -> dict[str, Any] | None:
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
    return {"atol": atol, "source": source}


def reference_error_check(job, target, reference_exec, experiment) -> dict[str, Any]:
    """The check of `target` when the reference could not run: no verdict about the target (it was not
    run), status `error`, class `reference_error`. `user_error` says whether the model as written failed on
    its inputs (the eager reference raised), which is the user's to fix, not a backend's finding."""
    tol = experiment.tolerance_for(target)
    user_error = reference_exec.backend.backend == "eager" and reference_exec.failure_class == tx.BACKEND_ERROR
    return {"tier": 1, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id,
            "target": target.id, **_tolerance_fields(tol), "status": "error", "passed": None,
            "failure_class": tx.REFERENCE_ERROR,
            "detail": f"the reference {reference_exec.backend.id} failed ({reference_exec.failure_class}), so "
                      f"{target.id} was not run: {reference_exec.error}",
            "reference_failure_class": reference_exec.failure_class, "user_error": user_error,
            "required_atol": None, "max_abs": None, "verdicts": {}, "nondeterminism": None, "leaves": [], "oracle": None}


def _oracle_error(oracle_exec, missing: str | None) -> dict[str, Any]:
    """Why a check has no oracle verdict although the oracle was asked for: it did not run, or (`missing`)
    it ran but nothing of the check could be held against it."""
    if oracle_exec is None:
        return {}
    if not oracle_exec.ok:
        return {"oracle_error": f"the float64 oracle could not run ({oracle_exec.failure_class}): {oracle_exec.error}"}
    return {"oracle_error": missing} if missing else {}
