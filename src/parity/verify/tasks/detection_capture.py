"""The post-processing inputs of a detector, captured for flip attribution (flips.py) without changing what the
model returns: torchvision's two-stage detectors (Faster, Mask and Keypoint R-CNN) by wrapping their
post-processing, and any detector whose own post-processing says what it chose from (`record_candidates`).

`install` wraps the instance's `roi_heads.postprocess_detections` and its region proposal network's
`filter_proposals`: the original runs on the same arguments and its result is returned untouched; when an
execution watches the run (execute/capture.py) and the arguments are plain eager tensors, the wrapper also
records references to them, the settings and the result. Under torch.compile, torch.export, tracing or
scripting nothing is recorded (those backends run no Python post-processing of their own). The candidates
are rebuilt from the records later (`candidates_of`), outside the timed run, as torchvision builds them, and
each output box is found among them. torchvision's one-stage detectors (RetinaNet, SSD, FCOS) decode per level
inside their post-processing; they are not captured, and their flips are attributed from the outputs alone.
A detector of one's own calls `parity.record_candidates` once per image from its post-processing.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any

import torch

from parity.execute import capture
from parity.verify.tasks.flips import Candidates


@dataclass(frozen=True)
class HeadsCall:
    """One call of a torchvision RoIHeads' `postprocess_detections`: its arguments, settings and result."""

    class_logits: torch.Tensor
    box_regression: torch.Tensor
    proposals: list[torch.Tensor]
    image_shapes: list[tuple[int, ...]]
    weights: tuple[float, ...]
    clip: float
    score_threshold: float
    nms_iou: float
    top_k: int
    outputs: tuple[list[torch.Tensor], ...]  # boxes, scores, labels: one tensor per image each


@dataclass(frozen=True)
class ProposalsCall:
    """One call of a torchvision RegionProposalNetwork's `filter_proposals`."""

    proposals: torch.Tensor
    objectness: torch.Tensor
    image_shapes: list[tuple[int, ...]]
    levels: list[int]  # anchors per feature level
    pre_top_k: int
    top_k: int
    nms_iou: float
    score_threshold: float
    min_size: float
    outputs: list[torch.Tensor]  # the proposals kept, per image


@dataclass(frozen=True)
class OwnCandidates:
    """What `record_candidates` keeps: one image's candidates, from a detector's own post-processing."""

    candidates: Candidates


def _plain(*tensors) -> bool:
    """Eager tensors only: not fake, functional or proxy tensors of a tracer or compiler."""
    return all(type(t) is torch.Tensor for t in tensors)


def _tracing() -> bool:
    compiler = torch.compiler
    return (compiler.is_compiling() or compiler.is_exporting() or torch.jit.is_tracing()
            or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export())


def _recording(original):
    """The class's own method, called on whichever instance runs (a deep copy's settings are its own)."""

    @functools.wraps(original)
    def postprocess_detections(self, class_logits, box_regression, proposals, image_shapes):
        result = original(self, class_logits, box_regression, proposals, image_shapes)
        if capture.watched() and not _tracing() and _plain(class_logits, box_regression, *proposals):
            capture.record(HeadsCall(class_logits, box_regression, list(proposals), [tuple(s) for s in image_shapes],
                                     tuple(self.box_coder.weights), self.box_coder.bbox_xform_clip,
                                     float(self.score_thresh), float(self.nms_thresh), int(self.detections_per_img),
                                     tuple(list(r) for r in result)))
        return result

    return postprocess_detections


def _recording_proposals(original):
    """The region proposal network's choice of proposals, recorded as the heads' post-processing is."""

    @functools.wraps(original)
    def filter_proposals(self, proposals, objectness, image_shapes, num_anchors_per_level):
        result = original(self, proposals, objectness, image_shapes, num_anchors_per_level)
        if capture.watched() and not _tracing() and _plain(proposals, objectness):
            capture.record(ProposalsCall(proposals, objectness, [tuple(s) for s in image_shapes],
                                         list(num_anchors_per_level), int(self.pre_nms_top_n()),
                                         int(self.post_nms_top_n()), float(self.nms_thresh), float(self.score_thresh),
                                         float(self.min_size), list(result[0])))
        return result

    return filter_proposals


def record_candidates(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, kept: torch.Tensor, *,
                      score_threshold: float, nms_iou: float, top_k: int, class_agnostic: bool = False,
                      min_size: float = 0.0) -> None:
    """For flip attribution, from a detector's own post-processing, once per image in the order of its outputs:
    every candidate before the score threshold (`boxes` as xyxy, `scores`, `labels`; the i-th candidate of
    both sides must be the same anchor or query), `kept` (the candidate behind each output box, in output
    order) and the settings the post-processing ran with (`class_agnostic`: NMS across labels). It records
    only in the run tier 3 judges, on a backend that runs the module eagerly; anywhere else (another repeat,
    a compiler, a tracer, an exporter) it does nothing and costs a check."""
    if _tracing() or not capture.watched() or not _plain(boxes, scores, labels, kept):
        return
    capture.record(OwnCandidates(Candidates(
        boxes.detach(), scores.detach(), labels.detach(), kept.detach().to(torch.int64), float(score_threshold),
        float(nms_iou), int(top_k), min_size=float(min_size), class_agnostic=class_agnostic)))


def install(model: torch.nn.Module) -> bool:
    """Wrap every torchvision RoIHeads of `model`, and its region proposal network (on the instance: deep
    copies keep them). False when the model has no RoIHeads."""
    from torchvision.models.detection.roi_heads import RoIHeads
    from torchvision.models.detection.rpn import RegionProposalNetwork

    heads = [m for m in model.modules() if isinstance(m, RoIHeads)]
    for head in heads:
        head.postprocess_detections = types.MethodType(_recording(type(head).postprocess_detections), head)
    for rpn in [m for m in model.modules() if isinstance(m, RegionProposalNetwork)] if heads else []:
        rpn.filter_proposals = types.MethodType(_recording_proposals(type(rpn).filter_proposals), rpn)
    return bool(heads)


def _kept(candidates: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor | None:
    """For each output row, the first candidate row equal to it that an earlier output did not take; None
    when an output has none. Row by row: a proposal network has some 10^5 candidates per image."""
    kept: list[int] = []
    for row in outputs:
        free = [int(i) for i in torch.nonzero((candidates == row).all(1)).flatten() if int(i) not in kept]
        if not free:
            return None  # an output the candidates do not explain: no attribution from this capture
        kept.append(free[0])
    return torch.tensor(kept, dtype=torch.int64)


def _proposal_candidates(rec: ProposalsCall) -> list[Candidates] | None:
    """Per image, every anchor's proposal with its objectness (labels: the feature level), as the region
    proposal network chose among them: a top-k per level, the threshold, NMS per level, the post-NMS top-k.
    Its outputs are found among them by box and level (objectness through sigmoid at another shape may
    differ in the last bit)."""
    from torchvision.ops import boxes as box_ops

    objectness = torch.sigmoid(rec.objectness.detach().reshape(len(rec.proposals), -1))
    levels = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(rec.levels)])
    images = []
    for boxes, scores, shape, out in zip(rec.proposals, objectness, rec.image_shapes, rec.outputs, strict=True):
        boxes = box_ops.clip_boxes_to_image(boxes.detach(), shape)
        kept = _kept(boxes, out)
        if kept is None:
            return None
        images.append(Candidates(boxes, scores, levels, kept, rec.score_threshold, rec.nms_iou, rec.top_k,
                                 min_size=rec.min_size, group_top_k=rec.pre_top_k))
    return images


def _image_candidates(boxes, scores, proposals, image_shape, outputs, rec: HeadsCall) -> Candidates | None:
    from torchvision.ops import boxes as box_ops

    num_classes = scores.shape[-1]
    boxes = box_ops.clip_boxes_to_image(boxes, image_shape)
    labels = torch.arange(num_classes).view(1, -1).expand_as(scores)
    origins = proposals[:, None, :].expand(-1, num_classes, -1)
    boxes, scores, labels = boxes[:, 1:].reshape(-1, 4), scores[:, 1:].reshape(-1), labels[:, 1:].reshape(-1)
    origins = origins[:, 1:].reshape(-1, 4)
    rows = torch.cat([boxes.double(), scores.double()[:, None], labels.double()[:, None]], 1)
    out_boxes, out_scores, out_labels = outputs
    kept = _kept(rows, torch.cat([out_boxes.double(), out_scores.double()[:, None], out_labels.double()[:, None]], 1))
    if kept is None:
        return None
    return Candidates(boxes.detach(), scores.detach(), labels, kept, rec.score_threshold, rec.nms_iou,
                      rec.top_k, min_size=1e-2, origins=origins.detach(), per_proposal=num_classes - 1)


def candidates_of(captured: list[Any]) -> list[Candidates] | None:
    """Per image, the candidates of the one post-processing call recorded (or what the detector's own
    post-processing recorded, one per image); None when there is not exactly one (a model that ran its head
    twice, or not at all) or its outputs are not found among its candidates."""
    from torchvision.models.detection._utils import BoxCoder

    own = [r.candidates for r in captured if isinstance(r, OwnCandidates)]
    records = [r for r in captured if isinstance(r, HeadsCall)]
    if own:
        return None if records else own  # two kinds of capture in one run: which explains the outputs is unknown
    if len(records) != 1:
        return None
    rec = records[0]
    rpn = [r for r in captured if isinstance(r, ProposalsCall)]
    with torch.no_grad():
        coder = BoxCoder(rec.weights, rec.clip)
        per_image = [len(p) for p in rec.proposals]
        boxes = coder.decode(rec.box_regression, rec.proposals).split(per_image, 0)
        scores = torch.nn.functional.softmax(rec.class_logits, -1).split(per_image, 0)
        images = []
        for n, (b, s, p, shape) in enumerate(zip(boxes, scores, rec.proposals, rec.image_shapes, strict=True)):
            outputs = tuple(side[n] for side in rec.outputs)
            image = _image_candidates(b, s, p, shape, outputs, rec)
            if image is None:
                return None
            images.append(image)
        upstream = _proposal_candidates(rpn[0]) if len(rpn) == 1 else None
    for image, proposals in zip(images, upstream or [], strict=False):
        image.proposals = proposals  # each image's proposals are its RPN's outputs, in order
    return images
