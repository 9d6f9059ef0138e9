"""The statistics tables of tier 3 (`Task.statistics`: text-generation's is llama-perplexity's), one per model,
input set and task, a column per target: what every report (console, report.md, report.html) shows alike."""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.records.models import Tier3Check
from parity.verify.tasks import statistics_of


@dataclass
class StatisticsTable:
    model: str
    inputs: str
    task: str
    targets: list[str] = field(default_factory=list)
    rows: list[tuple[str, list[str]]] = field(default_factory=list)  # (statistic, its value per target)
    checks: list[Tier3Check] = field(default_factory=list)  # one per target, in the columns' order


def statistics_tables(tier3: list[Tier3Check]) -> list[StatisticsTable]:
    """Every tier-3 check whose task has a statistics table, grouped by model, input set and task."""
    groups: dict[tuple[str, str, str], list[tuple[Tier3Check, dict[str, str], list[str]]]] = {}
    for c in tier3:
        rows = statistics_of(c.task, c.metrics, c.thresholds)
        if rows:
            groups.setdefault((c.model, c.inputs, c.task), []).append((c, dict(rows), [name for name, _ in rows]))
    tables = []
    for (model, inputs, task), members in groups.items():
        names = list(dict.fromkeys(name for _, _, order in members for name in order))
        tables.append(StatisticsTable(model, inputs, task, [c.target for c, _, _ in members],
                                      [(name, [cells.get(name, "-") for _, cells, _ in members]) for name in names],
                                      [c for c, _, _ in members]))
    return tables


def kld_counts(check: Tier3Check) -> tuple[list[float], list[int]] | None:
    """A check's KL histogram as recorded (edges, counts: one more than the edges), or None when it has none or it
    does not add up (a record edited by hand)."""
    h = check.kld_histogram
    if h is None or h.edges is None or h.counts is None or len(h.counts) != len(h.edges) + 1:
        return None
    return list(h.edges), list(h.counts)
