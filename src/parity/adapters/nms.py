"""A tie-robust NMS and top-k for torchvision detection models, without editing torchvision.

Backends differ in the last bits of scores and boxes. Plain NMS and top-k order candidates by exact
score, so two candidates whose scores differ by 1e-7 swap places between backends, and a box survives
on one backend and not on the other. Here candidates are ordered by score *quantized to a grid* set from
the tolerance (descending), ties broken by box coordinates quantized to `box_grid` pixels, then by
index: differences well below the grids cannot change which boxes survive or their order. (A value that
sits right on a grid boundary can still land on either side: the grids make flips rare, not impossible.)

Applied per model: the model's own `forward` is wrapped so that torchvision's `batched_nms` is swapped
in for the duration of the forward (detection heads look it up at call time) and put back however the
forward ends, and the region proposal network's top-k is replaced on the model's own instance. Both are
instance attributes and travel with deep copies, so every backend runs the adapter.
"""

from __future__ import annotations

import functools
import types
from typing import Literal

import torch
import torchvision.ops.boxes as box_ops
from pydantic import Field

from parity.adapters import Adapter
from parity.config.schema import AdapterSpec
from parity.errors import ParityError

_ORIGINAL_BATCHED_NMS = box_ops.batched_nms


COORD_BITS = 15  # box coordinates on the grid, 0 to 32767 each: four of them fit in one int64 key


def deterministic_order(scores: torch.Tensor, score_grid: float, boxes: torch.Tensor | None = None,
                        box_grid: float = 1.0) -> torch.Tensor:
    """Indices by quantized score (descending), then quantized box coordinates (x1, y1, x2, y2; each
    clamped to 0..32767 grid steps), then index. Two stable sorts: the four coordinates are packed into
    one integer key."""
    order = torch.arange(scores.shape[0], device=scores.device)
    if boxes is not None:
        cells = torch.floor(boxes.double() / box_grid).clamp_(0, 2**COORD_BITS - 1).long()
        packed = ((cells[:, 0] << COORD_BITS | cells[:, 1]) << COORD_BITS | cells[:, 2]) << COORD_BITS | cells[:, 3]
        order = torch.sort(packed, stable=True).indices
    buckets = -torch.floor(scores.double() / score_grid)
    return order[torch.sort(buckets[order], stable=True).indices]


def deterministic_top_k(scores: torch.Tensor, k: int, score_grid: float) -> torch.Tensor:
    """The first k of `deterministic_order(scores)`, sorting only the candidates that can be among them:
    those in the k-th largest score's bucket or above (fewer than k lie above it)."""
    if k >= scores.shape[0]:
        return deterministic_order(scores, score_grid)
    buckets = torch.floor(scores.double() / score_grid)
    kth_bucket = torch.floor(scores.topk(k).values[-1].double() / score_grid)
    candidates = torch.nonzero(buckets >= kth_bucket).squeeze(1)  # ascending: index order kept for ties
    return candidates[deterministic_order(scores[candidates], score_grid)[:k]]


def make_batched_nms(score_grid: float, box_grid: float):
    def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        if boxes.numel() == 0:
            return torch.empty((0,), dtype=torch.int64, device=boxes.device)
        order = deterministic_order(scores, score_grid, boxes, box_grid)
        ranks = torch.empty(scores.shape[0], dtype=torch.float32, device=scores.device)
        ranks[order] = torch.arange(scores.shape[0], 0, -1, dtype=torch.float32, device=scores.device)
        # torchvision's kernel keeps boxes in descending "score": the ranks make that our order exactly
        return _ORIGINAL_BATCHED_NMS(boxes.float(), ranks, idxs, iou_threshold)

    return batched_nms


def _forward_with(patched, forward):
    """`forward` with torchvision's batched_nms swapped for `patched` while it runs, put back in a
    `finally`. Not forward hooks: torch.export's non-strict tracing runs a module's pre-hooks but not its
    always_call forward hooks when the forward raises, which left the swap in place for every model after."""

    @functools.wraps(forward)
    def with_patched_nms(self, *args, **kwargs):
        previous = box_ops.batched_nms
        box_ops.batched_nms = patched
        try:
            return forward(self, *args, **kwargs)
        finally:
            box_ops.batched_nms = previous

    return with_patched_nms


def _deterministic_top_n_idx(self, objectness: torch.Tensor, num_anchors_per_level: list[int]) -> torch.Tensor:
    """RegionProposalNetwork._get_top_n_idx with a tie-robust top-k (same output shape and meaning)."""
    from torchvision.models.detection import _utils as det_utils

    r, offset = [], 0
    for ob in objectness.split(num_anchors_per_level, 1):
        num_anchors = ob.shape[1]
        top_n = det_utils._topk_min(ob, self.pre_nms_top_n(), 1)
        rows = [deterministic_top_k(row, top_n, self._parity_score_grid) for row in ob]
        r.append(torch.stack(rows) + offset)
        offset += num_anchors
    return torch.cat(r, dim=1)


def apply_deterministic_nms(model: torch.nn.Module, score_grid: float, box_grid: float) -> str:
    has_nms_head = any(hasattr(m, "postprocess_detections") or hasattr(m, "filter_proposals") for m in model.modules())
    if not has_nms_head:
        raise ParityError(f"adapter deterministic_nms: {type(model).__name__} has no torchvision detection head "
                          "(postprocess_detections / filter_proposals) to adapt")
    model.forward = types.MethodType(_forward_with(make_batched_nms(score_grid, box_grid), type(model).forward), model)
    rpns = [m for m in model.modules() if hasattr(m, "_get_top_n_idx")]
    for rpn in rpns:
        rpn._parity_score_grid = score_grid
        rpn._get_top_n_idx = types.MethodType(_deterministic_top_n_idx, rpn)
    return (f"deterministic_nms: batched_nms ordered by score on a {score_grid:g} grid, then box coordinates "
            f"on a {box_grid:g} px grid, then index" + (f"; tie-robust top-k in {len(rpns)} proposal network(s)" if rpns else ""))


class DeterministicNmsSpec(AdapterSpec):
    name: Literal["deterministic_nms"]
    score_grid: float | None = Field(default=None, gt=0)  # default: 10 x the gate atol
    box_grid: float = Field(default=1.0, gt=0)  # pixels

    def score_grid_for(self, experiment) -> float:
        return self.score_grid if self.score_grid is not None else 10 * max(experiment.tolerances.gate_atol, 1e-7)


class DeterministicNms(Adapter):
    name = "deterministic_nms"
    Spec = DeterministicNmsSpec

    def apply(self, model, spec, experiment):
        return apply_deterministic_nms(model, spec.score_grid_for(experiment), spec.box_grid)


ADAPTER = DeterministicNms()
