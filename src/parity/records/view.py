"""RunView: the one reader of a run's records. Every report, the summary, resume and the tests select
records through it, so the selectors (the tier-1 checks, a check's `layers`), the name of a check
("model / inputs / target") and the order of a check's worst leaves are written once, here.

The view holds each record as its model of records/models.py (Run, TimedRun, Tier1Check, Layers, ...): readers
use attributes, and a field that records written by earlier versions lack reads as its default (None). The
dicts stay what records.jsonl holds and what `parity.api` returns to users; reading validates every line
into its model anyway (records/io.py), so the view keeps the models it was given.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from parity.records.io import read_typed_run, typed
from parity.records.keys import check_key
from parity.records.models import (
    Check,
    Fallback,
    InputWarning,
    Layers,
    Leaf,
    ModelBuilt,
    Record,
    Run,
    TimedRun,
)


class RunView:
    """The records of one run, selected by kind. `RunView(records)` over records in memory (the writer's),
    `RunView.read(folder)` over an `--out` folder; `RunView.of(x)` accepts either a view or a list."""

    def __init__(self, records: Iterable[Record | dict[str, Any]]):
        """`records` as models, or as the dicts a writer wrote (validated into their models here)."""
        self.records: list[Record] = [r if isinstance(r, Record) else typed(r) for r in records]
        self._runs: list[Run] = []
        self._models: list[ModelBuilt] = []
        self._warnings: list[InputWarning] = []
        self._fallbacks: list[Fallback] = []
        self._layers_written: list[Layers] = []
        self._checks: list[Check] = []
        self._executions: list[TimedRun] = []
        kinds = ((Run, self._runs), (ModelBuilt, self._models), (InputWarning, self._warnings),
                 (Fallback, self._fallbacks), (Layers, self._layers_written), (Check, self._checks),
                 (TimedRun, self._executions))
        for r in self.records:  # each kind's records in the order written (a `resume` record is no reader's)
            found = next((found for kind, found in kinds if isinstance(r, kind)), None)
            if found is not None:
                found.append(r)
        self._layers = {self.identity(r): r for r in self._layers_written}

    @classmethod
    def read(cls, folder: str | Path) -> RunView:
        return cls(read_typed_run(folder))

    @classmethod
    def of(cls, records: RunView | Iterable[Record | dict[str, Any]]) -> RunView:
        return records if isinstance(records, RunView) else cls(records)

    def __iter__(self):
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def run(self) -> Run:
        """The `run` record (read_run refuses a file without one)."""
        return self._runs[0]

    @property
    def models(self) -> list[ModelBuilt]:
        return list(self._models)

    @property
    def warnings(self) -> list[InputWarning]:
        """`warning` records: input sets that came out constant."""
        return list(self._warnings)

    @property
    def fallbacks(self) -> list[Fallback]:
        return list(self._fallbacks)

    @property
    def layers(self) -> list[Layers]:
        """Every `layers` record (tier 2), in the order written."""
        return list(self._layers_written)

    def checks(self, tier: int | None = None, *, model: str | None = None, inputs: str | None = None,
               target: str | None = None, status: str | None = None) -> list[Any]:
        """The `check` records, in the order written: of one tier (1: the verdicts every total counts), and
        of one model, input set, target or status when given."""
        wanted = {"tier": tier, "model": model, "inputs": inputs, "target": target, "status": status}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        return [c for c in self._checks if all(getattr(c, k) == v for k, v in wanted.items())]

    def failed(self, tier: int | None = None) -> list[Any]:
        """The judged checks whose verdict is a failure (not those skipped or without a verdict)."""
        return [c for c in self.checks(tier, status="ok") if not c.passed]

    def decides(self, check: Check) -> bool:
        """Whether `check` is a failed tier-3 check that is its tier-1 check's verdict (`gate: tier3`): that check
        fails by it, in its class, and says so with its next steps, so a report says this failure there, once."""
        if check.tier != 3 or check.status != "ok" or check.passed:
            return False
        return any(c.tier1_passed is not None and c.status == "ok" and not c.passed and c.failure_class == check.failure_class
                   for c in self.checks(1, model=check.model, inputs=check.inputs, target=check.target))

    def failures(self) -> list[Any]:
        """The failed checks a report lists, each failure once: every failed tier-1 check, then the failed tier-3
        checks that are not a tier-1 check's verdict (`decides`)."""
        return [*self.failed(1), *(c for c in self.failed(3) if not self.decides(c))]

    def executions(self, *, model: str | None = None, inputs: str | None = None, backend: str | None = None,
                   status: str | None = None, repeat: int | None = None) -> list[TimedRun]:
        """The `execution` records, in the order written, narrowed as asked."""
        wanted = {"model": model, "inputs": inputs, "backend": backend, "status": status, "repeat": repeat}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        return [r for r in self._executions if all(getattr(r, k) == v for k, v in wanted.items())]

    def targets(self) -> list[str]:
        """The targets of the tier-1 checks, in the order first judged."""
        return list(dict.fromkeys(c.target for c in self.checks(1)))

    def planned_checks(self) -> int:
        """How many tier-1 checks the experiment of the `run` record plans: every target on every (model, input
        set) pair, as runner/plan.py pairs them."""
        config = self.run.config
        sets = len(config.inputs)
        return len(config.targets) * sum(sets if m.inputs is None else len(m.inputs) for m in config.models)

    def unfinished(self) -> str | None:
        """What a run that ended early (killed, stopped by an error, or model code that ended the process) lacks,
        in words; None when every planned check has its verdict. A report of an unfinished run must never read
        as a pass."""
        planned, judged = self.planned_checks(), len({self.identity(c) for c in self.checks(1)})
        return None if judged >= planned else f"{judged} of its {planned} planned checks have a verdict"

    def pairs(self) -> list[tuple[str, str]]:
        """The (model, input set) pairs of the tier-1 checks, in the order first judged."""
        return list(dict.fromkeys((c.model, c.inputs) for c in self.checks(1)))

    @staticmethod
    def identity(record: Check | Layers | Fallback) -> tuple[str, str, str]:
        """(model, input set, target): what a check, its `layers` and its tier-3 check share."""
        return record.model, record.inputs, record.target

    def layers_for(self, check: Check | tuple[str, str, str]) -> Layers | None:
        """The `layers` record that localizes `check` (or the check of that identity), if the run localized it."""
        return self._layers.get(check if isinstance(check, tuple) else self.identity(check))

    @staticmethod
    def key(record: Record) -> str:
        """How a check (its layers, its tier-3 result, an execution) is named to a reader: "model / inputs /
        target"."""
        return check_key(record)

    @staticmethod
    def worst_leaves(check: Check, n: int = 5) -> list[Leaf]:
        """A check's failing leaves, largest absolute difference first (a leaf without one, last), at most `n`;
        none for a tier-3 check."""
        failing = [leaf for leaf in getattr(check, "leaves", None) or [] if leaf.failure_class]
        return sorted(failing, key=lambda leaf: -(leaf.max_abs or 0.0))[:n]

    @staticmethod
    def judged(check: Check | dict[str, Any]) -> bool:
        """Whether a check holds a verdict about its target: not when the target could not run here
        (`skipped`) nor when the reference failed (`error`). A check as read is judged alike: the study's
        tables (benchmarks/study_tables.py) count the archived records as read."""
        return (check["status"] if isinstance(check, dict) else check.status) == "ok"
