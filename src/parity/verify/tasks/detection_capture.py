"""The post-processing inputs of a torchvision two-stage detector (Faster, Mask and Keypoint R-CNN), captured
for flip attribution (flips.py) without changing what the model returns.

`install` wraps the instance's `roi_heads.postprocess_detections`: the original runs on the same arguments
and its result is returned untouched; when an execution watches the run (execute/capture.py) and the
arguments are plain eager tensors, the wrapper also records references to them, the head's settings and the
result. Under torch.compile, torch.export, tracing or scripting nothing is recorded (those backends run no
Python post-processing of their own). The candidates are rebuilt from the record later (`candidates_of`),
outside the timed run, exactly as torchvision builds them, and each output box is found among them.
One-stage detectors (RetinaNet, SSD, FCOS) decode per level inside their post-processing; they are not
captured, and their flips are attributed from the outputs alone.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from parity.execute import capture
from parity.verify.tasks.flips import Candidates

KIND = "torchvision_roi_heads"


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
            capture.record({"kind": KIND, "class_logits": class_logits, "box_regression": box_regression,
                            "proposals": list(proposals), "image_shapes": [tuple(s) for s in image_shapes],
                            "weights": tuple(self.box_coder.weights), "clip": self.box_coder.bbox_xform_clip,
                            "score_threshold": float(self.score_thresh), "nms_iou": float(self.nms_thresh),
                            "top_k": int(self.detections_per_img), "outputs": tuple(list(r) for r in result)})
        return result

    return postprocess_detections


def install(model: torch.nn.Module) -> bool:
    """Wrap every torchvision RoIHeads of `model` (on the instance: deep copies keep it). False when the
    model has none."""
    from torchvision.models.detection.roi_heads import RoIHeads

    heads = [m for m in model.modules() if isinstance(m, RoIHeads)]
    for head in heads:
        head.postprocess_detections = types.MethodType(_recording(type(head).postprocess_detections), head)
    return bool(heads)


def _image_candidates(boxes, scores, proposals, image_shape, outputs, rec) -> Candidates | None:
    from torchvision.ops import boxes as box_ops

    num_classes = scores.shape[-1]
    boxes = box_ops.clip_boxes_to_image(boxes, image_shape)
    labels = torch.arange(num_classes).view(1, -1).expand_as(scores)
    origins = proposals[:, None, :].expand(-1, num_classes, -1)
    boxes, scores, labels = boxes[:, 1:].reshape(-1, 4), scores[:, 1:].reshape(-1), labels[:, 1:].reshape(-1)
    origins = origins[:, 1:].reshape(-1, 4)
    out_boxes, out_scores, out_labels = outputs
    same = ((boxes[None] == out_boxes[:, None]).all(-1) & (scores[None] == out_scores[:, None])
            & (labels[None] == out_labels[:, None]))
    kept = []
    for row in same:  # the first candidate equal to each output box, not taken by an earlier one
        free = [int(i) for i in torch.nonzero(row).flatten() if int(i) not in kept]
        if not free:
            return None  # an output the candidates do not explain: no attribution from this capture
        kept.append(free[0])
    return Candidates(boxes.detach(), scores.detach(), labels, torch.tensor(kept, dtype=torch.int64),
                      rec["score_threshold"], rec["nms_iou"], rec["top_k"], min_size=1e-2, origins=origins.detach())


def candidates_of(captured: list[Any]) -> list[Candidates] | None:
    """Per image, the candidates of the one post-processing call recorded; None when there is not exactly
    one (a model that ran its head twice, or not at all) or its outputs are not found among its candidates."""
    from torchvision.models.detection._utils import BoxCoder

    records = [r for r in captured if isinstance(r, dict) and r.get("kind") == KIND]
    if len(records) != 1:
        return None
    rec = records[0]
    with torch.no_grad():
        coder = BoxCoder(rec["weights"], rec["clip"])
        per_image = [len(p) for p in rec["proposals"]]
        boxes = coder.decode(rec["box_regression"], rec["proposals"]).split(per_image, 0)
        scores = torch.nn.functional.softmax(rec["class_logits"], -1).split(per_image, 0)
        images = []
        for n, (b, s, p, shape) in enumerate(zip(boxes, scores, rec["proposals"], rec["image_shapes"], strict=True)):
            outputs = tuple(side[n] for side in rec["outputs"])
            image = _image_candidates(b, s, p, shape, outputs, rec)
            if image is None:
                return None
            images.append(image)
    return images
