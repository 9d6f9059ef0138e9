"""Detection: are the same objects found? Target boxes are matched to reference boxes of the same label
by IoU with the Hungarian method (scipy's linear_sum_assignment); agreement is precision, recall and F1
of that matching, plus the target's mAP with the reference taken as ground truth."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from parity.config.schema import Strict
from parity.inputs.images import image_files
from parity.records.models import DetectionPictures, DrawnDetections, Flips, PictureGeometry, PictureImage
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, verdict
from parity.verify.tasks.detection_capture import candidates_of, install
from parity.verify.tasks.flips import Detections, attribute


def detections_of(output: Any) -> list[Detections]:
    """torchvision's list (one per image) of {boxes [N, 4], labels [N], scores [N]}, read once: the model's output,
    a mapping by leaf name, becomes one `Detections` per image."""
    if not isinstance(output, list | tuple) or not all(isinstance(d, dict) for d in output):
        raise OutputsNotUnderstood("a detection model should return a list of dicts with boxes, labels and scores")
    for d in output:
        if not {"boxes", "labels", "scores"} <= set(d):
            raise OutputsNotUnderstood(f"a detection has keys {sorted(d)}; expected boxes, labels and scores")
    return [Detections(boxes=d["boxes"].detach().to("cpu"), labels=d["labels"].detach().to("cpu"),
                       scores=d["scores"].detach().to("cpu")) for d in output]


def _iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU, with zero-area boxes (0/0) matching only a box exactly equal to them."""
    from torchvision.ops import box_iou

    iou = torch.nan_to_num(box_iou(a.double(), b.double()), nan=0.0)
    return torch.where((a[:, None, :] == b[None, :, :]).all(-1), 1.0, iou)


def match(ref: Detections, tgt: Detections, iou_threshold: float) -> list[tuple[int, int, float]]:
    """(reference index, target index, IoU) of the boxes matched one to one within each label."""
    from scipy.optimize import linear_sum_assignment

    pairs = []
    for label in torch.unique(torch.cat([ref.labels, tgt.labels])):
        ri = torch.nonzero(ref.labels == label).flatten()
        ti = torch.nonzero(tgt.labels == label).flatten()
        if not len(ri) or not len(ti):
            continue
        iou = _iou(ref.boxes[ri], tgt.boxes[ti])
        rows, cols = linear_sum_assignment(-iou.numpy())
        pairs += [(int(ri[r]), int(ti[c]), float(iou[r, c])) for r, c in zip(rows, cols, strict=True)
                  if iou[r, c] >= iou_threshold]
    return pairs


def average_precision(refs: list[Detections], tgts: list[Detections], iou_threshold: float) -> float:
    """mAP at one IoU of the target's detections, the reference's boxes taken as ground truth
    (VOC-style: detections by descending score, greedy matching, all-point interpolated AP, mean over
    the labels the reference has)."""

    labels = torch.unique(torch.cat([r.labels for r in refs])) if refs else torch.zeros(0)
    if not len(labels):
        return 1.0 if all(len(t) == 0 for t in tgts) else 0.0
    aps = []
    for label in labels:
        scored = []  # (score, image, box)
        n_truth = 0
        for i, (r, t) in enumerate(zip(refs, tgts, strict=True)):
            n_truth += int((r.labels == label).sum())
            own = t.taking(t.labels == label)
            for box, score in zip(own.boxes, own.scores, strict=True):
                scored.append((float(score), i, box))
        scored.sort(key=lambda s: -s[0])
        taken = {i: torch.zeros(int((r.labels == label).sum()), dtype=torch.bool) for i, r in enumerate(refs)}
        hits = []
        for _, i, box in scored:
            truth = refs[i].boxes[refs[i].labels == label]
            hit = False
            if len(truth):
                iou = _iou(box[None], truth)[0]
                iou[taken[i]] = -1
                best = int(iou.argmax())
                if iou[best] >= iou_threshold:
                    taken[i][best], hit = True, True
            hits.append(hit)
        tp = torch.tensor(hits, dtype=torch.float64).cumsum(0)
        precision = tp / torch.arange(1, len(hits) + 1)
        recall = tp / max(n_truth, 1)
        # all-point interpolation: precision made non-increasing, integrated over recall steps
        ap, prev_recall = 0.0, 0.0
        for j in range(len(hits)):
            if hits[j]:
                ap += float(precision[j:].max()) * (float(recall[j]) - prev_recall)
                prev_recall = float(recall[j])
        aps.append(ap)
    return sum(aps) / len(aps)


class DetectionThresholds(Strict):
    iou: float = Field(default=0.5, gt=0, le=1)  # a target box matches a reference box of its label from this IoU
    f1: float = Field(default=0.95, ge=0, le=1)
    attribution: bool = True  # class a failing check's unmatched boxes by mechanism (R-CNN heads: captured)


def evaluate(reference: Any, target: Any, thresholds: DetectionThresholds, gate: float,
             output: str | None = None) -> TaskResult:
    refs, tgts = detections_of(reference), detections_of(target)
    if len(refs) != len(tgts):
        raise OutputsNotUnderstood(f"{len(tgts)} images' detections vs {len(refs)} in the reference")
    matched = n_ref = n_tgt = 0
    score_drift = box_drift = 0.0
    for r, t in zip(refs, tgts, strict=True):
        pairs = match(r, t, thresholds.iou)
        matched += len(pairs)
        n_ref, n_tgt = n_ref + len(r), n_tgt + len(t)
        for ri, ti, _ in pairs:
            score_drift = max(score_drift, abs(float(t.scores[ti]) - float(r.scores[ri])))
            box_drift = max(box_drift, float((t.boxes[ti].double() - r.boxes[ri].double()).abs().max()))
    precision = matched / n_tgt if n_tgt else 1.0
    recall = matched / n_ref if n_ref else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    result = TaskResult("detection", {
        "reference_boxes": n_ref, "target_boxes": n_tgt, "box_count_change": n_tgt - n_ref, "matched": matched,
        "precision": precision, "recall": recall, "f1": f1,
        "map": average_precision(refs, tgts, thresholds.iou),
        "max_score_drift": score_drift, "max_box_drift": box_drift,
    }, same_set=matched == n_ref == n_tgt and score_drift <= gate and box_drift <= gate)
    failures = []
    if f1 < thresholds.f1:
        failures.append(f"detection F1 {f1:.3f} < {thresholds.f1} ({matched} of {n_ref} reference boxes "
                        f"matched, {n_tgt} target boxes)")
    return verdict(result, failures)


def flips(reference: Any, target: Any, thresholds: DetectionThresholds, reference_captured: list[Any],
          target_captured: list[Any]) -> Flips:
    """Every unmatched box classed by the mechanism that made it differ (flips.py), through both sides'
    post-processing inputs when both were captured, else from the outputs alone."""
    refs, tgts = detections_of(reference), detections_of(target)
    matches = [match(r, t, thresholds.iou) for r, t in zip(refs, tgts, strict=True)]
    return attribute(refs, tgts, matches, thresholds.iou, behind(refs, candidates_of(reference_captured)),
                     behind(tgts, candidates_of(target_captured)))


def behind(detections: list[Detections], captured: list | None) -> list | None:
    """The captured candidates when they are behind these outputs: per image, the kept candidates' scores
    and labels are the output's, in its order (not so when code after the detector's head dropped or
    reordered boxes: then nothing is attributed through them)."""
    if captured is None or len(captured) != len(detections):
        return None
    for d, c in zip(detections, captured, strict=True):
        if not (torch.equal(c.scores[c.kept], d.scores) and torch.equal(c.labels[c.kept], d.labels)):
            return None
    return captured


PICTURE_BOXES = 50  # boxes per image kept in a record for the report's pictures: the highest scores


def drawable(output: Any, cap: int = PICTURE_BOXES) -> list[DrawnDetections]:
    """Per image, the `cap` highest-scoring detections, rounded (boxes to 0.01 px, scores to 1e-4), and how
    many there were: enough for a report to draw reference and target boxes, small enough for a record."""
    images = []
    for d in detections_of(output):
        scores = d.scores.double()
        order = torch.argsort(scores, descending=True, stable=True)[:cap]
        images.append(DrawnDetections(boxes=[[round(float(v), 2) for v in box] for box in d.boxes[order].double()],
                                      labels=[int(label) for label in d.labels[order]],
                                      scores=[round(float(s), 4) for s in scores[order]], total=len(scores)))
    return images


def _image_sizes(inputs) -> list[list[int]]:
    """[H, W] of every image the model was given: a list of CHW tensors or an NCHW batch."""
    sizes = []
    for t in inputs.tensors() if inputs is not None else []:
        if t.dim() == 3:
            sizes.append(list(t.shape[-2:]))
        elif t.dim() == 4:
            sizes += [list(t.shape[-2:])] * t.shape[0]
    return sizes


def detection_pictures(input_spec, reference_out: Any, target_out: Any, experiment, inputs=None) -> DetectionPictures:
    """What a report needs to draw reference and target boxes on each input image, from the record alone:
    the image files (resolved paths; `path` is None for synthetic inputs), the size the model saw them at,
    the preprocessing geometry that took the file there, and each side's highest-scoring boxes."""
    reference, target = drawable(reference_out), drawable(target_out)
    files = image_files(input_spec.images, experiment.base_dir) if input_spec.images else []
    sizes = _image_sizes(inputs)
    images = []
    for i in range(len(reference)):
        source, path = files[i] if i < len(files) else ("synthetic", None)
        images.append(PictureImage(source=source, path=str(path) if path else None,
                                   size=sizes[i] if len(sizes) == len(reference) else None))
    geometry = PictureGeometry(**input_spec.preprocess.model_dump(include=set(PictureGeometry.model_fields)))
    return DetectionPictures(images=images, preprocess=geometry, cap=PICTURE_BOXES, reference=reference, target=target)


class Detection(Task):
    name = "detection"
    Thresholds = DetectionThresholds
    headline = (Headline("f1", threshold="f1"), Headline("map"), Headline("box_count_change", higher_is_better=None),
                Headline("max_box_drift", higher_is_better=False))
    flat_keys = {"detection_iou": "iou", "detection_f1": "f1"}
    batch = "list"  # detectors take a list of CHW images

    def evaluate(self, reference, target, thresholds, gate, output):
        return evaluate(reference, target, thresholds, gate, output)

    def record_fields(self, input_spec, reference, target, experiment, inputs):
        # task_check's record is a mapping, written as it is: the pictures go in as their dump
        return {"pictures": detection_pictures(input_spec, reference, target, experiment, inputs).model_dump()}

    def instrument(self, model, thresholds):
        if thresholds.attribution:
            install(model)

    def explain(self, reference, target, thresholds, reference_captured, target_captured):
        """`flips` whenever a box is unmatched: a passing check's few flipped boxes are classed too."""
        if not thresholds.attribution:
            return {}
        classed = flips(reference, target, thresholds, reference_captured, target_captured)
        return {"flips": classed} if classed.counts else {}


TASK = Detection()
