"""Tier 3: does the target decide the same as the reference? One `Task` per task, registered in the
`parity.tasks` entry-point group (built-ins: classification.py, detection.py, segmentation.py).

Each task reads the reference's and the target's outputs (one execution each, as tier 1) and returns task
metrics, a verdict against its thresholds (`tiers.tasks.<task>` in the experiment file), and whether the two
outputs are the same set in another order (which turns a failed tier-1 check into `ordering`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pydantic import BaseModel

from parity import taxonomy as tx
from parity.config.tolerances import Tolerance
from parity.errors import ParityError
from parity.plugins import TASKS
from parity.records.models import Tier3Check

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskResult:
    """A task's verdict on one pair of outputs, made once (`verdict`, `with_failure` return a new one)."""

    task: str
    metrics: dict[str, Any] = field(default_factory=dict)
    passed: bool = True
    failure_class: str | None = None  # decision_flip, or why the outputs could not be read
    detail: str | None = None
    same_set: bool = False  # every item matched, with values within the gate: only the order differs
    notes: list[str] = field(default_factory=list)  # what a reader must know of the metrics (few positions, a cut)
    record: dict[str, Any] = field(default_factory=dict)  # fields the evaluation adds to its tier-3 record


@dataclass(frozen=True)
class Headline:
    """A metric a report shows first for a task. `threshold` names the key of the task's thresholds that
    bounds it (if one does); `higher_is_better` says which side of it fails (None: nearer zero is better)."""

    metric: str
    higher_is_better: bool | None = True
    threshold: str | None = None


class Task(ABC):
    """A tier-3 evaluator. Its module is imported when an experiment or a report names the task, so it
    imports heavy libraries inside its methods (torch is already loaded wherever it evaluates)."""

    name: ClassVar[str]
    # Its thresholds, validated under `tiers.tasks.<name>` (a pydantic model with a default for every key).
    Thresholds: ClassVar[type[BaseModel]]
    headline: ClassVar[tuple[Headline, ...]] = ()
    # The old flat spelling (`tiers.tasks.<key>`) of its thresholds: flat key -> its own key.
    flat_keys: ClassVar[dict[str, str]] = {}
    # How images are handed to its models unless the model says (`batch`): one stacked batch, or a list.
    batch: ClassVar[str] = "stack"
    # Whether `evaluate` reads the inputs the model was called with too (`inputs=`: text-generation scores the
    # text's next tokens); a task without it is called as before.
    reads_inputs: ClassVar[bool] = False

    @abstractmethod
    def evaluate(self, reference: Any, target: Any, thresholds: Any, gate: float, output: str | None) -> TaskResult:
        """Metrics and verdict; raise OutputsNotUnderstood when the outputs are not this task's. `output`
        names the leaf that holds the task's result when the outputs have several (tiers.tasks.output). With
        `reads_inputs`, also `inputs=`: the `Inputs` both sides were called with (None when unknown)."""

    def statistics(self, metrics: dict[str, Any], thresholds: dict[str, Any] | None) -> list[tuple[str, str]]:
        """Its statistics as (name, value) rows of one table per target, which every report shows side by side
        (text-generation: llama-perplexity's table), from a record's metrics and thresholds; none by default."""
        return []

    def record_fields(self, input_spec, reference: Any, target: Any, experiment, inputs) -> dict[str, Any]:
        """Fields this task adds to its tier-3 record (what a report needs beyond the metrics)."""
        return {}

    def instrument(self, model: Any, thresholds: Any) -> None:
        """Prepare a built model to record what `explain` needs while it runs (execute/capture.py), without
        changing what it returns. Called on every model of this task, before any backend copies it."""

    def follow_up(self, thresholds: Any, output: str | None):
        """What this task asks of every backend's prepared artifact after its timed runs, each on its own
        (execute/follow_up.py: a callable `(backend, inputs) -> value`, handed back to `judge_follow_ups`), or None.
        text-generation: greedy continuations and its cached decoding.
        `output`: the leaf that holds the task's result (tiers.tasks.output), as in `evaluate`."""
        return None

    def judge_follow_ups(self, result: TaskResult, reference: Any, target: Any, thresholds: Any, input_spec, experiment,
                         tolerance: Tolerance) -> tuple[TaskResult, dict[str, Any]]:
        """`result` with what both sides' follow-ups add to it (metrics, notes, failures: `with_failure`), and the
        fields they add to the tier-3 record; `tolerance`: the target's (text-generation judges the KV caches at it).
        Each follow-up is what `follow_up`'s callable returned, or `FollowUpRaised` (execute/follow_up.py) when it raised."""
        return result, {}

    def explain(self, reference: Any, target: Any, thresholds: Any, reference_captured: list[Any],
                target_captured: list[Any]) -> dict[str, Any]:
        """Fields a verdict whose decisions differ adds to its tier-3 record (a failed one, decision_flip, or a
        pass short of the same set: some decisions differ within the threshold): why they differ, from the
        outputs and what each side's run recorded (`Execution.captured`; empty when nothing was)."""
        return {}


def evaluated() -> list[str]:
    """The tasks tier 3 evaluates (the registered ones)."""
    return TASKS.names()


def headline_of(task: str) -> tuple[Headline, ...] | None:
    """The headline metrics of `task`, or None when it is not installed here (a report then lists the
    record's metrics as they are)."""
    try:
        return TASKS.get(task).headline if task in TASKS.names() else None
    except ParityError:
        return None


def statistics_of(task: str, metrics: dict[str, Any], thresholds: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A tier-3 record's statistics table (`Task.statistics`); none when its task is not installed here."""
    try:
        return TASKS.get(task).statistics(metrics, thresholds) if task in TASKS.names() else []
    except ParityError:
        return []


def follow_up_of(task: str | None, tasks_spec):
    """What `task` asks of each backend of a run after its timed runs (`Task.follow_up`), or None."""
    return TASKS.get(task).follow_up(tasks_spec.thresholds_for(task), tasks_spec.output) if task in evaluated() else None


def evaluate(task: str, reference: Any, target: Any, tasks_spec, gate: float, inputs=None) -> TaskResult:
    """`task`'s verdict at its thresholds in `tasks_spec` (an experiment's `tiers.tasks`); `inputs`: what both
    sides were called with, for a task that reads them (`Task.reads_inputs`)."""
    evaluator = TASKS.get(task)
    given = {"inputs": inputs} if evaluator.reads_inputs else {}
    try:
        return evaluator.evaluate(reference, target, tasks_spec.thresholds_for(task), gate, tasks_spec.output, **given)
    except OutputsNotUnderstood as exc:
        return TaskResult(task, passed=False, failure_class=tx.STRUCTURE_MISMATCH, detail=str(exc))


class OutputsNotUnderstood(ValueError):
    """The outputs are not what a model of this task returns."""


def verdict(result: TaskResult, failures: list[str]) -> TaskResult:
    """`result` failed for each of `failures` (none: as it is)."""
    for failure in failures:
        result = with_failure(result, failure)
    return result


def with_failure(result: TaskResult, failure: str) -> TaskResult:
    """`result` failing for `failure` too: a decision flip, its detail the failures so far joined."""
    return replace(result, passed=False, failure_class=result.failure_class or tx.DECISION_FLIP,
                   detail=f"{result.detail}; {failure}" if result.detail else failure)


def tier3_check(result: TaskResult, *, model: str, inputs: str, reference: str, target: str,
                thresholds: dict[str, Any] | None, fields: dict[str, Any] | None = None) -> Tier3Check:
    """The tier-3 check record of `result`, made once: its fields in the order parity has always written them, then
    `fields` (what the task adds: `TaskResult.record`, its follow-ups', `Task.record_fields`, `Task.explain`)."""
    made: dict[str, Any] = {"kind": "check", "tier": 3, "model": model, "inputs": inputs, "reference": reference,
                            "target": target, "task": result.task, "status": "ok", "passed": result.passed,
                            "failure_class": result.failure_class, "detail": result.detail, "metrics": result.metrics}
    if thresholds is not None:
        made["thresholds"] = thresholds
    made["same_set"] = result.same_set
    return Tier3Check.model_validate({**made, **(fields or {})})


def task_check(job, target_exec, reference_exec, experiment, inputs=None) -> Tier3Check | None:
    """The tier-3 `check` record, or None when the task has no evaluator or a side did not run (its tier-1 check
    already says why); the judge reads its `same_set` and, under `gate: tier3`, its verdict. A task may add fields
    of its own (`Task.record_fields`; detection: the `pictures`); `inputs` gives their sizes."""
    task = job.model.task
    if task not in evaluated() or not (reference_exec.ok and target_exec.ok):
        return None
    tasks_spec = experiment.tiers.tasks
    tolerance = experiment.tolerance_for(target_exec.backend)
    result = evaluate(task, reference_exec.outputs[0], target_exec.outputs[0], tasks_spec, tolerance.gate, inputs)
    followed: dict[str, Any] = {}
    if result.failure_class != tx.STRUCTURE_MISMATCH and None not in (reference_exec.follow_up, target_exec.follow_up):
        result, followed = TASKS.get(task).judge_follow_ups(result, reference_exec.follow_up, target_exec.follow_up,
                                                            tasks_spec.thresholds_for(task), job.inputs, experiment,
                                                            tolerance)
    fields = {**result.record, **followed}
    if result.notes:  # the reports print them under the check
        fields["notes"] = result.notes
    if result.failure_class != tx.STRUCTURE_MISMATCH:
        fields.update(TASKS.get(task).record_fields(job.inputs, reference_exec.outputs[0], target_exec.outputs[0],
                                                    experiment, inputs))
    if result.failure_class == tx.DECISION_FLIP or (result.passed and result.same_set is False):
        try:
            fields.update(TASKS.get(task).explain(reference_exec.outputs[0], target_exec.outputs[0],
                                                  tasks_spec.thresholds_for(task), reference_exec.captured,
                                                  target_exec.captured))
        except Exception as exc:  # an explanation is extra: it never costs the check its verdict
            log.warning("%s / %s / %s: tier 3 could not explain its failure: %s: %s", job.model.name,
                        job.inputs.name, target_exec.backend.id, type(exc).__name__, exc)
    return tier3_check(result, model=job.model.name, inputs=job.inputs.name, reference=job.reference.id,
                       target=target_exec.backend.id, thresholds=tasks_spec.thresholds_for(task).model_dump(),
                       fields=fields)


def instrument(model: Any, task: str | None, tasks_spec) -> None:
    """Let `task` instrument a built model (`Task.instrument`) when tier 3 evaluates it."""
    if task in evaluated():
        TASKS.get(task).instrument(model, tasks_spec.thresholds_for(task))
