"""Tier 3: does the target decide the same as the reference? One evaluator per task.

Each evaluator reads the reference's and the target's outputs (one execution each, as tier 1) and
returns task metrics, a verdict against the thresholds of the experiment file, and whether the two
outputs are the same set in another order (which turns a failed tier-1 check into `ordering`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TaskResult:
    task: str
    metrics: dict[str, Any] = field(default_factory=dict)
    passed: bool = True
    failure_class: str | None = None  # decision_flip, or why the outputs could not be read
    detail: str | None = None
    same_set: bool = False  # every item matched, with values within the gate: only the order differs


def evaluate(task: str, reference: Any, target: Any, thresholds, gate: float) -> TaskResult:
    from parity.verify.tasks import classification, detection, segmentation

    evaluators = {"classification": classification.evaluate, "detection": detection.evaluate,
                  "segmentation": segmentation.evaluate}
    try:
        return evaluators[task](reference, target, thresholds, gate)
    except OutputsNotUnderstood as exc:
        return TaskResult(task, passed=False, failure_class="structure_mismatch", detail=str(exc))


class OutputsNotUnderstood(ValueError):
    """The outputs are not what a model of this task returns."""


def verdict(result: TaskResult, failures: list[str]) -> TaskResult:
    if failures:
        result.passed, result.failure_class, result.detail = False, "decision_flip", "; ".join(failures)
    return result


EVALUATED = ("classification", "detection", "segmentation")


def task_check(job, target_exec, reference_exec, experiment) -> dict[str, Any] | None:
    """The fields of a tier-3 `check` record, or None when the task has no evaluator or a side did not
    run (its tier-1 check already says why). `same_set` is returned too, for the tier-1 check."""
    task = job.model.task
    if task not in EVALUATED or not (reference_exec.ok and target_exec.ok):
        return None
    result = evaluate(task, reference_exec.outputs[0], target_exec.outputs[0], experiment.tiers.tasks,
                      experiment.tolerances.gate_atol)
    return {"tier": 3, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id,
            "target": target_exec.backend.id, "task": task, "status": "ok", "passed": result.passed,
            "failure_class": result.failure_class, "detail": result.detail, "metrics": result.metrics,
            "thresholds": experiment.tiers.tasks.model_dump(exclude={"enabled", "output"}), "same_set": result.same_set}
