"""How records are keyed: the key of a verdict in a check's `verdicts` (`tolerance_key`), the atol of an
experiment's verdict (`gate_atol`), and the one way a check, a localization or a tier-3 result is named to a
reader (`check_key`: "model / inputs / target"). The identity of a record within a run is its model's
`record_key` (records/models.py)."""

from __future__ import annotations

from typing import Any


def check_key(record: Any) -> str:
    """What a check (or its `layers`, tier-3 or fallback record, as records/models.py's models) is about, as
    reports and the summary name it: "model / inputs / target"; an execution by its backend, a warning by its
    input set alone."""
    side = getattr(record, "target", None) or getattr(record, "backend", None)
    return " / ".join([record.model, record.inputs, *([side] if side is not None else [])])


def tolerance_key(atol: float) -> str:
    """The keys of a check's `verdicts`: 1e-6 -> '1e-06', 1.5e-3 -> '0.0015' (never two atols on one key)."""
    short = f"{atol:.0e}"
    return short if float(short) == atol else repr(atol)


def gate_atol(gate: float | str | None, sweep: list[float]) -> float:
    """The atol of an experiment's tier-1 verdict: its `gate` when that is a number, else 1e-4 when the sweep
    has it, else the sweep's largest (`gate: tier3` too: tier 1's own verdict is still read at it). The one
    home of this rule: the schema, the tolerance resolution and the summary (from a record's config) call it."""
    if isinstance(gate, float | int) and not isinstance(gate, bool):
        return float(gate)
    return 1e-4 if 1e-4 in sweep else max(sweep)
