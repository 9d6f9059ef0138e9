"""Segmentation: do the per-pixel decisions (argmax masks) agree?"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from parity.config.schema import Strict
from parity.outputs import flatten
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, verdict


def scores_of(output: Any) -> torch.Tensor:
    """The [N, C, H, W] scores: torchvision's `out`, else the first 4-D floating leaf."""
    leaves = {k: v for k, v in flatten(output).items() if isinstance(v, torch.Tensor) and v.dim() == 4}
    for name, value in leaves.items():
        if name.endswith("['out']"):
            return value
    if not leaves:
        raise OutputsNotUnderstood("no [N, C, H, W] scores among the outputs of a segmentation model")
    return next(iter(leaves.values()))


def miou(ref: torch.Tensor, tgt: torch.Tensor) -> float:
    """Mean IoU over the classes present in either mask, the reference's mask taken as ground truth."""
    ious = []
    for c in torch.unique(torch.cat([ref.unique(), tgt.unique()])):
        r, t = ref == c, tgt == c
        union = int((r | t).sum())
        if union:
            ious.append(int((r & t).sum()) / union)
    return sum(ious) / len(ious) if ious else 1.0


class SegmentationThresholds(Strict):
    pixel_agreement: float = Field(default=0.99, ge=0, le=1)
    miou: float | None = Field(default=None, ge=0, le=1)


def evaluate(reference: Any, target: Any, thresholds: SegmentationThresholds, gate: float,
             output: str | None = None) -> TaskResult:
    ref, tgt = scores_of(reference), scores_of(target)
    if ref.shape != tgt.shape:
        raise OutputsNotUnderstood(f"scores of shape {list(tgt.shape)} vs reference {list(ref.shape)}")
    ref_mask, tgt_mask = ref.argmax(1), tgt.argmax(1)
    agreement = float((ref_mask == tgt_mask).double().mean())
    result = TaskResult("segmentation", {"pixels": ref_mask.numel(), "pixel_agreement": agreement,
                                         "pixels_flipped": int((ref_mask != tgt_mask).sum()), "miou": miou(ref_mask, tgt_mask)})
    failures = []
    if agreement < thresholds.pixel_agreement:
        failures.append(f"pixel agreement {agreement:.4f} < {thresholds.pixel_agreement}")
    if thresholds.miou is not None and result.metrics["miou"] < thresholds.miou:
        failures.append(f"mIoU {result.metrics['miou']:.4f} < {thresholds.miou}")
    return verdict(result, failures)


class Segmentation(Task):
    name = "segmentation"
    Thresholds = SegmentationThresholds
    headline = (Headline("pixel_agreement", threshold="pixel_agreement"), Headline("miou", threshold="miou"))
    flat_keys = {"pixel_agreement": "pixel_agreement", "miou": "miou"}

    def evaluate(self, reference, target, thresholds, gate, output):
        return evaluate(reference, target, thresholds, gate, output)


TASK = Segmentation()
