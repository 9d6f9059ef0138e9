"""RunView: the one reader of a run's records. Every report, the summary, resume and the tests select
records through it, so the selectors (the tier-1 checks, a check's `layers`), the name of a check
("model / inputs / target") and the order of a check's worst leaves are written once, here.

The records stay the dicts read from (or written to) records.jsonl, validated against records/models.py:
the summary and the reports are built from those dicts, and the archived study records must render
byte for byte, which a round trip through the models (defaults filled in, ints made floats) would not
promise; the dicts are also what `parity.api` returns to users. The models are the schema, the view the
reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from parity.records.io import read_run
from parity.records.keys import check_key

Record = dict[str, Any]


class RunView:
    """The records of one run, selected by kind. `RunView(records)` over records in memory (the writer's),
    `RunView.read(folder)` over an `--out` folder; `RunView.of(x)` accepts either a view or a list."""

    def __init__(self, records: Iterable[Record]):
        self.records: list[Record] = list(records)
        self._by_kind: dict[str, list[Record]] = {}
        for r in self.records:
            self._by_kind.setdefault(r["kind"], []).append(r)
        self._layers = {self.identity(r): r for r in self._by_kind.get("layers", [])}

    @classmethod
    def read(cls, folder: str | Path) -> RunView:
        return cls(read_run(folder))

    @classmethod
    def of(cls, records: RunView | Iterable[Record]) -> RunView:
        return records if isinstance(records, RunView) else cls(records)

    def __iter__(self):
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def of_kind(self, kind: str) -> list[Record]:
        return list(self._by_kind.get(kind, []))

    @property
    def run(self) -> Record:
        """The `run` record (read_run refuses a file without one)."""
        return self._by_kind["run"][0]

    @property
    def models(self) -> list[Record]:
        return self.of_kind("model")

    @property
    def warnings(self) -> list[Record]:
        """`warning` records: input sets that came out constant."""
        return self.of_kind("warning")

    @property
    def fallbacks(self) -> list[Record]:
        return self.of_kind("fallback")

    @property
    def layers(self) -> list[Record]:
        """Every `layers` record (tier 2), in the order written."""
        return self.of_kind("layers")

    def checks(self, tier: int | None = None, *, model: str | None = None, inputs: str | None = None,
               target: str | None = None, status: str | None = None) -> list[Record]:
        """The `check` records, in the order written: of one tier (1: the verdicts every total counts), and
        of one model, input set, target or status when given."""
        wanted = {"tier": tier, "model": model, "inputs": inputs, "target": target, "status": status}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        return [c for c in self._by_kind.get("check", []) if all(c[k] == v for k, v in wanted.items())]

    def failed(self, tier: int | None = None) -> list[Record]:
        """The judged checks whose verdict is a failure (not those skipped or without a verdict)."""
        return [c for c in self.checks(tier, status="ok") if not c["passed"]]

    def executions(self, *, model: str | None = None, inputs: str | None = None, backend: str | None = None,
                   status: str | None = None, repeat: int | None = None) -> list[Record]:
        """The `execution` records, in the order written, narrowed as asked."""
        wanted = {"model": model, "inputs": inputs, "backend": backend, "status": status, "repeat": repeat}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        return [r for r in self._by_kind.get("execution", []) if all(r[k] == v for k, v in wanted.items())]

    def targets(self) -> list[str]:
        """The targets of the tier-1 checks, in the order first judged."""
        return list(dict.fromkeys(c["target"] for c in self.checks(1)))

    def planned_checks(self) -> int:
        """How many tier-1 checks the experiment of the `run` record plans: every target on every (model, input
        set) pair, as runner/plan.py pairs them."""
        config = self.run["config"]
        sets = len(config["inputs"])
        return len(config["targets"]) * sum(sets if m.get("inputs") is None else len(m["inputs"]) for m in config["models"])

    def unfinished(self) -> str | None:
        """What a run that ended early (killed, stopped by an error, or model code that ended the process) lacks,
        in words; None when every planned check has its verdict. A report of an unfinished run must never read
        as a pass."""
        planned, judged = self.planned_checks(), len({self.identity(c) for c in self.checks(1)})
        return None if judged >= planned else f"{judged} of its {planned} planned checks have a verdict"

    def pairs(self) -> list[tuple[str, str]]:
        """The (model, input set) pairs of the tier-1 checks, in the order first judged."""
        return list(dict.fromkeys((c["model"], c["inputs"]) for c in self.checks(1)))

    @staticmethod
    def identity(record: Record) -> tuple[str, str, str]:
        """(model, input set, target): what a check, its `layers` and its tier-3 check share."""
        return record["model"], record["inputs"], record["target"]

    def layers_for(self, check: Record) -> Record | None:
        """The `layers` record that localizes `check`, if the run localized it."""
        return self._layers.get(self.identity(check))

    @staticmethod
    def key(record: Record) -> str:
        """How a check (its layers, its tier-3 result, an execution) is named to a reader: "model / inputs /
        target"."""
        return check_key(record)

    @staticmethod
    def worst_leaves(check: Record, n: int = 5) -> list[Record]:
        """A check's failing leaves, largest absolute difference first (a leaf without one, last), at most `n`."""
        failing = [leaf for leaf in check.get("leaves") or [] if leaf.get("failure_class")]
        return sorted(failing, key=lambda leaf: -(leaf.get("max_abs") or 0.0))[:n]

    @staticmethod
    def judged(check: Record) -> bool:
        """Whether a check holds a verdict about its target: not when the target could not run here
        (`skipped`) nor when the reference failed (`error`)."""
        return check["status"] == "ok"
