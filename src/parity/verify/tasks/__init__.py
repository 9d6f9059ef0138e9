"""Tier 3: does the target decide the same as the reference? One evaluator per task.

Each evaluator reads the reference's and the target's outputs (one execution each, as tier 1) and
returns task metrics, a verdict against the thresholds of the experiment file, and whether the two
outputs are the same set in another order (which turns a failed tier-1 check into `ordering`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parity import taxonomy as tx


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
        return TaskResult(task, passed=False, failure_class=tx.STRUCTURE_MISMATCH, detail=str(exc))


class OutputsNotUnderstood(ValueError):
    """The outputs are not what a model of this task returns."""


def verdict(result: TaskResult, failures: list[str]) -> TaskResult:
    if failures:
        result.passed, result.failure_class, result.detail = False, tx.DECISION_FLIP, "; ".join(failures)
    return result


EVALUATED = ("classification", "detection", "segmentation")


def task_check(job, target_exec, reference_exec, experiment, inputs=None) -> dict[str, Any] | None:
    """The fields of a tier-3 `check` record, or None when the task has no evaluator or a side did not
    run (its tier-1 check already says why). `same_set` is returned too, for the tier-1 check.
    A detection check also carries `pictures` (see `detection_pictures`); `inputs` gives their sizes."""
    task = job.model.task
    if task not in EVALUATED or not (reference_exec.ok and target_exec.ok):
        return None
    result = evaluate(task, reference_exec.outputs[0], target_exec.outputs[0], experiment.tiers.tasks,
                      experiment.tolerance_for(target_exec.backend).gate)
    record = {"tier": 3, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id,
              "target": target_exec.backend.id, "task": task, "status": "ok", "passed": result.passed,
              "failure_class": result.failure_class, "detail": result.detail, "metrics": result.metrics,
              "thresholds": experiment.tiers.tasks.model_dump(exclude={"enabled", "output"}), "same_set": result.same_set}
    if task == "detection" and result.failure_class != tx.STRUCTURE_MISMATCH:
        record["pictures"] = detection_pictures(job.inputs, reference_exec.outputs[0], target_exec.outputs[0],
                                                experiment, inputs)
    return record


def _image_sizes(inputs) -> list[list[int]]:
    """[H, W] of every image the model was given: a list of CHW tensors or an NCHW batch."""
    sizes = []
    for t in inputs.tensors() if inputs is not None else []:
        if t.dim() == 3:
            sizes.append(list(t.shape[-2:]))
        elif t.dim() == 4:
            sizes += [list(t.shape[-2:])] * t.shape[0]
    return sizes


def detection_pictures(input_spec, reference_out: Any, target_out: Any, experiment, inputs=None) -> dict[str, Any]:
    """What a report needs to draw reference and target boxes on each input image, from the record alone:
    the image files (resolved paths; `path` is None for synthetic inputs), the size the model saw them at,
    the preprocessing geometry that took the file there, and each side's highest-scoring boxes."""
    from parity.inputs.images import image_files
    from parity.verify.tasks.detection import PICTURE_BOXES, drawable

    reference, target = drawable(reference_out), drawable(target_out)
    files = image_files(input_spec.images, experiment.base_dir) if input_spec.images else []
    sizes = _image_sizes(inputs)
    images = []
    for i in range(len(reference)):
        source, path = files[i] if i < len(files) else ("synthetic", None)
        images.append({"source": source, "path": str(path) if path else None,
                       "size": sizes[i] if len(sizes) == len(reference) else None})
    geometry = input_spec.preprocess.model_dump(include={"resize", "center_crop", "resize_multiple"})
    return {"images": images, "preprocess": geometry, "cap": PICTURE_BOXES, "reference": reference, "target": target}
