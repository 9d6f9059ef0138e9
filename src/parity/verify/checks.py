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
    failed_exec = next((e for e in (reference_exec, target_exec) if not e.ok), None)
    if failed_exec is not None:
        who = "reference" if failed_exec is reference_exec else "target"
        return {**base, "status": "ok", "passed": False,
                "failure_class": failed_exec.failure_class or tx.BACKEND_ERROR,
                "detail": f"{who} {failed_exec.backend.id} failed: {failed_exec.error}",
                "required_atol": None, "max_abs": None, "verdicts": {tolerance_key(a): False for a in tol.atol},
                "nondeterminism": None, "leaves": [], "oracle": None}
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
    }
