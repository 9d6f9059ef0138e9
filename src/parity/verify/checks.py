"""Tier-1 check records: one target against the reference on one model and input set."""

from __future__ import annotations

import math
from typing import Any

from parity.verify import taxonomy as tx
from parity.verify.tensors import compare, oracle_verdict


def tolerance_key(atol: float) -> str:
    """The keys of a check's `verdicts`: 1e-6 -> '1e-06', 1.5e-3 -> '0.0015' (never two atols on one key)."""
    short = f"{atol:.0e}"
    return short if float(short) == atol else repr(atol)


def repeat_spread(outputs: list[Any], rtol: float, gate: float) -> float:
    """How far a backend's repeats stray from its first: the largest required atol (0.0 = bitwise equal)."""
    spread = 0.0
    for other in outputs[1:]:
        spread = max(spread, compare(outputs[0], other, rtol, gate).required_atol)
    return spread


def tier1_check(job, target_exec, reference_exec, oracle_exec, experiment,
                reference_spread: float) -> dict[str, Any]:
    """The fields of one `check` record."""
    tol = experiment.tolerances
    gate = tol.gate_atol
    base = {"tier": 1, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id,
            "target": target_exec.backend.id, "rtol": tol.rtol, "gate": gate}
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
                "required_atol": None, "max_abs": None, "verdicts": {tolerance_key(a): False for a in tol.atol},
                "nondeterminism": None, "leaves": [], "oracle": None, **_oracle_error(oracle_exec)}
    oracle_out = oracle_exec.outputs[0] if oracle_exec is not None and oracle_exec.ok else None
    comparison = compare(reference_exec.outputs[0], target_exec.outputs[0], tol.rtol, gate, oracle_out)
    target_spread = repeat_spread(target_exec.outputs, tol.rtol, gate)
    required = max(comparison.required_atol, target_spread, reference_spread)
    failure, detail = comparison.failure_class, comparison.detail
    if failure is None and max(target_spread, reference_spread) > gate:
        failure = tx.NONDETERMINISTIC
        who = "target" if target_spread >= reference_spread else "reference"
        detail = f"the {who}'s repeats differ from its first run by up to {max(target_spread, reference_spread):.3g} (required atol)"
    oracle = None
    if oracle_out is not None:
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
        "verdicts": {tolerance_key(a): required <= a for a in tol.atol},
        "nondeterminism": {"reference": reference_spread, "target": target_spread},
        "leaves": comparison.leaves,
        "oracle": oracle,
        **_oracle_error(oracle_exec),
    }


def reference_error_check(job, target, reference_exec, experiment) -> dict[str, Any]:
    """The check of `target` when the reference could not run: no verdict about the target (it was not
    run), status `error`, class `reference_error`. `user_error` says whether the model as written failed on
    its inputs (the eager reference raised), which is the user's to fix, not a backend's finding."""
    tol = experiment.tolerances
    user_error = reference_exec.backend.backend == "eager" and reference_exec.failure_class not in (tx.CRASH, tx.TIMEOUT)
    return {"tier": 1, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id,
            "target": target.id, "rtol": tol.rtol, "gate": tol.gate_atol, "status": "error", "passed": None,
            "failure_class": tx.REFERENCE_ERROR,
            "detail": f"the reference {reference_exec.backend.id} failed ({reference_exec.failure_class}), so "
                      f"{target.id} was not run: {reference_exec.error}",
            "reference_failure_class": reference_exec.failure_class, "user_error": user_error,
            "required_atol": None, "max_abs": None, "verdicts": {}, "nondeterminism": None, "leaves": [], "oracle": None}


def _oracle_error(oracle_exec) -> dict[str, Any]:
    """Why a check has no oracle verdict although the oracle was asked for: it did not run."""
    if oracle_exec is None or oracle_exec.ok:
        return {}
    return {"oracle_error": f"the oracle {oracle_exec.backend.id} failed ({oracle_exec.failure_class}): {oracle_exec.error}"}
