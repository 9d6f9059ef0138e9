"""The summary: totals, per target, per tolerance, per failure class, latency, and the arithmetic that
makes the totals, and the exit code they give. Computed from the records alone (through RunView), below the
runner (which writes summary.json at the end of a run) and the reports (which render it). The summary is a
frozen model (`Summary`), read by attribute; summary.json is its dump, its keys in the order of the fields."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from parity.outdir import write_text
from parity.records.keys import gate_atol, tolerance_key
from parity.records.models import CompilerPass, LeafTolerance, NoiseFloor, Specialized, Tier1Check, Tier3Check
from parity.records.view import RunView

judged = RunView.judged


class _Part(BaseModel):
    """A part of the summary: made by `summarize` alone, frozen; its dump is summary.json's, key for key."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Totals(_Part):
    """The tier-1 checks counted by outcome."""

    checks: int
    passed: int
    failed: int
    skipped: int
    errors: int


class Arithmetic(_Part):
    """How many checks and verdicts the run makes, and the sentence that multiplies them out."""

    model_input_pairs: int
    targets: int
    checks: int
    tolerances: int
    verdicts: int
    formula: str


class ReferenceFailure(_Part):
    """A (model, input set) whose reference failed: what failed, and whether it is the user's to fix (the model as
    written raised on its inputs); its targets have no verdict."""

    model: str
    inputs: str
    reference: str | None
    detail: str | None
    failure_class: str | None
    user_error: bool
    targets: list[str]


class TargetTotals(_Part):
    """One target's checks counted, and what they were judged at (every check of a target shares it)."""

    checks: int
    passed: int
    failed: int
    skipped: int
    errors: int
    max_abs: float | None
    per_tolerance: dict[str, int]
    reason: str | None
    gate: float
    rtol: float
    tolerance_source: str
    gated_by: str
    noise_floor: NoiseFloor | None
    output_rules: list[str]


class ToleranceTotals(_Part):
    """The judged checks at one atol of the sweep."""

    passed: int
    failed: int


class Tier3Totals(_Part):
    """The tier-3 checks counted, and each one's metrics by its check key."""

    checks: int
    passed: int
    failed: int
    failure_classes: dict[str, int]
    metrics: dict[str, dict[str, Any]]


class Localized(_Part):
    """What tier 2 found for one check (its `layers` record, in short)."""

    culprit: str | None
    evenly_spread: bool | None
    error: str | None
    whole_graph: bool | None
    as_a_whole: bool | None
    first_divergent: str | None
    specialized: Specialized | None
    compiler_pass: CompilerPass | None


class BackendLatency(_Part):
    """One backend's timed runs over the whole run."""

    executions: int
    run_s_median: float
    run_s_min: float
    prepare_s_total: float


class Summary(_Part):
    """What summary.json holds and every report reads."""

    experiment: str
    rtol: float
    gate: float | None
    uniform_tolerance: bool
    tolerances: list[float]
    arithmetic: Arithmetic
    totals: Totals
    reference_errors: list[ReferenceFailure]
    per_target: dict[str, TargetTotals]
    per_tolerance: dict[str, ToleranceTotals]
    failure_classes: dict[str, int]
    tier3: Tier3Totals
    localized: dict[str, Localized]
    latency: dict[str, BackendLatency]
    warnings: list[str]


class LatencyRow(_Part):
    """One backend on one model and input set: every timed repeat, their median and spread, the one-time prepare
    cost apart, whether its timed runs took turns with the other backends'; a backend that failed or could not run
    has its status and error instead of times."""

    model: str
    inputs: str
    backend: str
    device: str
    dtype: str
    status: str
    error: str | None
    run_s: list[float]
    prepare_s: float | None
    interleaved: bool | None
    median_s: float | None
    min_s: float | None
    max_s: float | None


def _latency(view: RunView) -> dict[str, BackendLatency]:
    runs: dict[str, list[float]] = defaultdict(list)
    prepares: dict[str, list[float]] = defaultdict(list)
    for r in view.executions(status="ok"):
        runs[r.backend].append(r.run_s)
        if r.repeat == 0 and r.prepare_s is not None:
            prepares[r.backend].append(r.prepare_s)
    return {b: BackendLatency(executions=len(v), run_s_median=statistics.median(v), run_s_min=min(v),
                              prepare_s_total=sum(prepares[b])) for b, v in runs.items()}


def latency_rows(records: RunView | list[dict]) -> list[LatencyRow]:
    """Per model, input set and backend, in the order they ran: every repeat's run time, their median and
    spread, the one-time prepare cost (export, compile, load: repeat 0 carries it) apart, and whether its timed
    runs took turns with the other backends' (`interleaved`). A backend that failed or could not run has its
    status and error instead of times."""
    groups: dict[tuple[str, str, str], list] = {}
    for r in RunView.of(records).executions():
        groups.setdefault((r.model, r.inputs, r.backend), []).append(r)
    out = []
    for (model, inputs, backend), ran in groups.items():
        failed = [r for r in ran if r.status != "ok"]  # the last failure says why
        runs = [r.run_s for r in ran if r.status == "ok" and r.run_s is not None]
        prepared = [r.prepare_s for r in ran if r.repeat == 0 and r.prepare_s is not None]
        turns = [r.latency_interleaved for r in ran if r.repeat == 0 and r.status == "ok"]  # None: records before it
        out.append(LatencyRow(
            model=model, inputs=inputs, backend=backend, device=ran[0].device, dtype=ran[0].dtype,
            status=failed[-1].status if failed else "ok", error=failed[-1].error if failed else None, run_s=runs,
            prepare_s=prepared[-1] if prepared else None, interleaved=turns[-1] if turns else None,
            median_s=statistics.median(runs) if runs else None, min_s=min(runs) if runs else None,
            max_s=max(runs) if runs else None))
    return out


def _count(n: int, what: str) -> str:
    """'1 check', '2 checks'."""
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def summarize(records: RunView | list[dict]) -> Summary:
    view = RunView.of(records)
    run = view.run
    tol = run.config.tolerances
    checks: list[Tier1Check] = view.checks(1)
    keys = [tolerance_key(a) for a in tol.atol]
    pairs = view.pairs()
    targets = view.targets()
    ran = [c for c in checks if judged(c)]
    errors = [c for c in checks if c.status == "error"]
    per_target: dict[str, TargetTotals] = {}
    for t in targets:
        mine = [c for c in checks if c.target == t]
        done = [c for c in mine if judged(c)]
        per_target[t] = TargetTotals(
            checks=len(mine),
            passed=sum(bool(c.passed) for c in done),
            failed=sum(not c.passed for c in done),
            skipped=sum(c.status == "skipped" for c in mine),
            errors=sum(c.status == "error" for c in mine),
            max_abs=max((c.max_abs or 0.0 for c in done), default=None),
            per_tolerance={k: sum(bool(c.verdicts.get(k)) for c in done) for k in keys},
            reason=next((c.detail for c in mine if c.status == "skipped"), None),
            **_tolerance(mine),
        )
    n_checks = len(checks)
    return Summary(
        experiment=run.experiment,
        rtol=tol.rtol,
        gate=gate_atol(tol.gate, tol.atol) if checks else None,
        uniform_tolerance=len({(c.gate, c.rtol, c.gated_by) for c in checks}) <= 1,
        tolerances=tol.atol,
        arithmetic=Arithmetic(
            model_input_pairs=len(pairs),
            targets=len(targets),
            checks=n_checks,
            tolerances=len(keys),
            verdicts=n_checks * len(keys),
            formula=f"{_count(len(pairs), '(model, input set) pair')} x {_count(len(targets), 'target')} = "
                    f"{_count(n_checks, 'check')}; x {_count(len(keys), 'tolerance')} = "
                    f"{_count(n_checks * len(keys), 'verdict')}",
        ),
        totals=Totals(
            checks=n_checks,
            passed=sum(bool(c.passed) for c in ran),
            failed=sum(not c.passed for c in ran),
            skipped=sum(c.status == "skipped" for c in checks),
            errors=len(errors),
        ),
        reference_errors=_reference_errors(errors),
        per_target=per_target,
        per_tolerance={k: ToleranceTotals(passed=sum(bool(c.verdicts.get(k)) for c in ran),
                                          failed=sum(not c.verdicts.get(k) for c in ran)) for k in keys},
        failure_classes=dict(Counter(c.failure_class for c in ran if c.failure_class)),
        tier3=_tier3(view),
        localized={view.key(r): Localized(
            culprit=r.culprit, evenly_spread=r.evenly_spread, error=r.error, whole_graph=r.whole_graph,
            as_a_whole=r.as_a_whole, first_divergent=r.first_divergent, specialized=r.specialized,
            compiler_pass=r.compiler_pass) for r in view.layers},
        latency=_latency(view),
        warnings=[f"{view.key(r)}: {r.message}" for r in view.warnings],
    )


def _tolerance(checks: list[Tier1Check]) -> dict[str, Any]:
    """What a target's checks were judged at (every check of a target shares it) and the largest noise
    floor its checks found: the reference's own error, below which no gate can be met. Records written before
    the tolerance source and the task gate: the experiment's tolerances, gated by tier 1."""
    first = checks[0]
    floors = [c.noise_floor for c in checks if c.noise_floor]
    return {"gate": first.gate, "rtol": first.rtol,
            "tolerance_source": first.tolerance_source or "experiment",
            "gated_by": first.gated_by or "tier1",
            "noise_floor": max(floors, key=lambda f: f.atol) if floors else None,
            "output_rules": sorted({_rule(leaf.tolerance) for c in checks for leaf in c.leaves if leaf.tolerance})}


def _rule(tolerance: LeafTolerance) -> str:
    atol = "the gate" if tolerance.atol is None else f"atol {tolerance.atol:g}"
    return f"{tolerance.rule}: {atol}, rtol {tolerance.rtol:g}"


def _reference_errors(errors: list[Tier1Check]) -> list[ReferenceFailure]:
    """One entry per (model, input set) whose reference failed: what failed and whether it is the user's
    to fix (the model as written raised on its inputs)."""
    seen: dict[tuple[str, str], list[Tier1Check]] = {}
    for c in errors:
        seen.setdefault((c.model, c.inputs), []).append(c)
    return [ReferenceFailure(model=c.model, inputs=c.inputs, reference=c.reference, detail=c.detail,
                             failure_class=c.reference_failure_class, user_error=bool(c.user_error),
                             targets=[t.target for t in mine])
            for mine in seen.values() for c in mine[:1]]


def _tier3(view: RunView) -> Tier3Totals:
    checks: list[Tier3Check] = view.checks(3)
    return Tier3Totals(
        checks=len(checks),
        passed=sum(bool(c.passed) for c in checks),
        failed=sum(not c.passed for c in checks),
        failure_classes=dict(Counter(c.failure_class for c in checks if c.failure_class)),
        metrics={view.key(c): c.metrics for c in checks},
    )


def write_summary(summary: Summary, path: Path) -> None:
    """Whole or not at all (outdir.write_text): a summary.json on disk is the mark of a finished run. Every field of
    the summary is set; the record parts in it (a noise floor, a specialised trace) dump the fields they were read
    with, as records.jsonl has them."""
    write_text(path, json.dumps(summary.model_dump(exclude_unset=True), indent=2) + "\n")  # a record's part: as given


def exit_code(summary: Summary, allow_unavailable: bool = False) -> int:
    """0 when every check passed (tier 1 at the gate, tier 3 at its thresholds); 2 when the model as written
    could not run on its inputs (the eager reference raised: the user's to fix); 1 when a check failed, has
    no verdict because the reference failed otherwise (a crash, a time-out, another reference backend), or
    was skipped (a target that could not run here was not verified) unless `allow_unavailable`."""
    totals = summary.totals
    if any(e.user_error for e in summary.reference_errors):
        return 2
    if totals.failed or totals.errors or summary.tier3.failed or (totals.skipped and not allow_unavailable):
        return 1
    return 0


class RunResult(list):
    """What a run gives every front end (the Runner returns it; `parity run`, `parity.run_experiment` and
    their callers read it): the records (it is their list, as `run_experiment` returned before), the summary,
    and whether the run is complete: every planned check has its tier-1 verdict in the records and
    summary.json was written. An incomplete run never passes and its exit code is 3 (a bug in parity: nothing
    user code does should get there), whatever its checks say."""

    def __init__(self, records: list[dict[str, Any]], summary: Summary, planned: list[tuple[str, str, str]],
                 summary_written: bool):
        super().__init__(records)
        self.summary, self.summary_written = summary, summary_written
        judged_checks = {RunView.identity(c) for c in RunView(records).checks(1)}
        self.missing = [key for key in planned if key not in judged_checks]  # (model, inputs, target), plan order
        self.planned = len(planned)

    @property
    def records(self) -> list[dict[str, Any]]:
        return list(self)

    @property
    def complete(self) -> bool:
        return not self.missing and self.summary_written

    @property
    def incomplete(self) -> str | None:
        """Why the run is not complete, in words; None when it is."""
        if self.missing:
            return (f"{len(self.missing)} of {self.planned} planned checks have no verdict "
                    f"({' / '.join(self.missing[0])} first)")
        return None if self.summary_written else "no summary.json was written"

    def code(self, allow_unavailable: bool = False) -> int:
        """The exit code: 3 when the run is incomplete, else `exit_code` of its summary."""
        return 3 if not self.complete else exit_code(self.summary, allow_unavailable)

    @property
    def exit_code(self) -> int:
        return self.code()

    @property
    def passed(self) -> bool:
        """Every planned check judged and passed (tier 1 at its gate, tier 3 at its thresholds), none skipped."""
        return self.exit_code == 0

    @property
    def checks(self) -> list[Tier1Check]:
        """The tier-1 checks, typed (records/models.py), in the order written."""
        return RunView(self).checks(1)

    @property
    def failures(self) -> list[Tier1Check]:
        """The tier-1 checks judged and failed."""
        return [c for c in self.checks if c.status == "ok" and not c.passed]
