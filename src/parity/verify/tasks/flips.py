"""Decision-flip attribution: why a box one side of a detection check kept is missing on the other.

A detection check whose decisions differ leaves unmatched boxes: kept by the reference and not the target, or the reverse.
Each is classed by the mechanism that made the sides differ:

- `label_change`: the other side kept a box at the same place (IoU at least the match IoU) with another label;
- `geometry`: the same candidate kept on both sides (or, from outputs alone, a same-label box that is each
  one's best overlap) whose boxes moved apart below the match IoU;
- `score_threshold`: the candidate's score is above the score threshold on one side and not on the other;
- `nms_iou`: a higher-scoring box the other side kept overlaps it beyond the NMS IoU threshold there, and not
  on this side;
- `tie_order`: that suppressor (or the last box within the top-k cut) has a score equal to the candidate's
  within `TIE_RTOL`: the order among equals decided;
- `score_order`: the suppressor and the candidate swapped order by more than a tie;
- `top_k`: the candidate survived NMS on the other side but fell beyond its detections-per-image cut;
- `unattributed`: none of these can be shown from what was captured (no post-processing inputs for a side,
  a candidate whose proposal the other side does not have, a chain of suppressions). Never a guess.

Everything here is a pure function of plain tensors: each side's output boxes (`Detections`) and the post-processing
inputs behind them (`Candidates`). The post-processing inputs (`Candidates`) of a torchvision
two-stage detector are captured by verify/tasks/detection_capture.py; a side without them (an exported graph
runs no Python post-processing) leaves only the output-level classes, label_change and geometry.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch

from parity.records.models import FlipExample, Flips

CLASSES = ("tie_order", "score_threshold", "nms_iou", "top_k", "score_order", "label_change", "geometry",
           "unattributed")
TIE_RTOL = 1e-5  # two scores are tied when they differ by at most this fraction of the larger
ORIGIN_IOU = 0.9  # two candidates come from the same proposal (anchor) when their origins overlap this much
EXAMPLES = 5  # unmatched boxes described in a record, beside the counts


@dataclass(frozen=True)
class Detections:
    """One image's detections on one side, as a torchvision detector returns them: boxes [N, 4], labels [N], scores
    [N] (verify/tasks/detection.py `detections_of` reads them from the model's output once)."""

    boxes: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def taking(self, keep: torch.Tensor | slice) -> Detections:
        """The detections that `keep` (indices, a mask or a slice) selects, in its order."""
        return Detections(self.boxes[keep], self.labels[keep], self.scores[keep])


@dataclass
class Candidates:
    """One image's post-processing on one side: every candidate before the score threshold (boxes in the
    coordinates the post-processing sees, scores, labels, and `origins`: the proposal or anchor each was
    regressed from, None when candidates correspond by index), the settings it ran with, and `kept`: the
    candidate behind each output box, in output order."""

    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    kept: torch.Tensor
    score_threshold: float
    nms_iou: float
    top_k: int
    min_size: float = 0.0
    origins: torch.Tensor | None = None
    group_top_k: int | None = None  # a top-k per label before the threshold and NMS (an RPN's per level)
    class_agnostic: bool = False  # NMS across labels (one group), not within each label
    proposals: Candidates | None = None  # the stage that chose the proposals these candidates come from
    per_proposal: int = 1  # candidates per proposal, consecutive (one per class)


def _iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from torchvision.ops import box_iou

    return torch.nan_to_num(box_iou(a.double(), b.double()), nan=0.0)


def tied(a: float, b: float, rtol: float = TIE_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def counterpart(c: int, this: Candidates, other: Candidates) -> int | None:
    """The other side's candidate that is `c` of this side: the same index (same label) when neither has
    origins, else the same-label candidate whose origin overlaps c's most, from ORIGIN_IOU."""
    if this.origins is None or other.origins is None:
        same = len(this.scores) == len(other.scores) and (
            (this.class_agnostic and other.class_agnostic) or bool((this.labels == other.labels).all()))
        return c if same else None  # class-agnostic candidates are anchors: the same index whatever its label
    pool = torch.nonzero(other.labels == this.labels[c]).flatten()
    if not len(pool):
        return None
    iou = _iou(this.origins[c][None], other.origins[pool])[0]
    best = int(iou.argmax())
    return int(pool[best]) if iou[best] >= ORIGIN_IOU else None


def why_not_kept(c: int, this: Candidates, other: Candidates) -> tuple[str, str]:
    """Why `other` did not keep candidate `c`, which `this` kept: (class, detail)."""
    d = counterpart(c, this, other)
    if d is None and this.proposals is not None and other.proposals is not None:
        upstream = int(this.proposals.kept[c // this.per_proposal])
        flip, detail = why_not_kept(upstream, this.proposals, other.proposals)
        return flip, f"its proposal, missing there: {detail}"
    if d is None:
        return "unattributed", "its proposal is not among the other side's candidates (the flip is upstream)"
    s_this, s_other = float(this.scores[c]), float(other.scores[d])
    cut = _group_cut(d, other)
    if cut is not None and s_other < cut and not tied(s_other, cut):
        return "top_k", f"score {s_other:.6g} there, below the last of the pre-NMS top {other.group_top_k} ({cut:.6g})"
    if s_other <= other.score_threshold < s_this:
        return "score_threshold", f"score {s_this:.6g} here, {s_other:.6g} there: threshold {other.score_threshold:g}"
    if s_this <= this.score_threshold < s_other:  # kept here below the threshold: not the reference's processing
        return "unattributed", "kept below the score threshold on this side"
    width, height = other.boxes[d, 2] - other.boxes[d, 0], other.boxes[d, 3] - other.boxes[d, 1]
    if min(float(width), float(height)) < other.min_size:
        return "geometry", f"its box is smaller than {other.min_size:g} there"
    kept = other.kept
    same_group = torch.ones_like(kept, dtype=torch.bool) if other.class_agnostic else other.labels[kept] == other.labels[d]
    rivals = kept[same_group & (kept != d)]
    if len(rivals):
        overlap = _iou(other.boxes[d][None], other.boxes[rivals])[0]
        above = (overlap > other.nms_iou) & (other.scores[rivals] >= other.scores[d] * (1 - TIE_RTOL))
        if above.any():
            k = int(rivals[above][int(other.scores[rivals][above].argmax())])
            return _suppressed(c, d, k, this, other)
    if len(kept) >= other.top_k and s_other <= float(other.scores[kept].min()):
        last = float(other.scores[kept].min())
        if tied(s_other, last):
            return "tie_order", f"score {s_other:.6g} tied with the last kept ({last:.6g}) at the top-{other.top_k} cut"
        return "top_k", f"score {s_other:.6g} below the last kept ({last:.6g}) of the top {other.top_k}"
    if cut is not None and tied(s_other, cut):
        return "tie_order", f"score {s_other:.6g} tied with the last of the pre-NMS top {other.group_top_k} ({cut:.6g})"
    return "unattributed", "the other side's post-processing would keep it"


def _group_cut(d: int, side: Candidates) -> float | None:
    """The lowest score within the top `group_top_k` of d's label, when the cut leaves some out."""
    if side.group_top_k is None:
        return None
    group = side.scores[side.labels == side.labels[d]]
    return float(group.topk(side.group_top_k).values[-1]) if len(group) > side.group_top_k else None


def _suppressed(c: int, d: int, k: int, this: Candidates, other: Candidates) -> tuple[str, str]:
    """Candidate d (c on this side) suppressed by the kept k on the other side: what differs here."""
    iou_other = float(_iou(other.boxes[d][None], other.boxes[k][None])[0, 0])
    k_here = counterpart(k, other, this)
    if k_here is None:
        return "unattributed", "its suppressor's proposal is not among this side's candidates"
    iou_here = float(_iou(this.boxes[c][None], this.boxes[k_here][None])[0, 0])
    if iou_here <= this.nms_iou < iou_other:
        return "nms_iou", f"IoU with a kept box {iou_here:.4g} here, {iou_other:.4g} there: threshold {this.nms_iou:g}"
    s_k, s_d = float(other.scores[k]), float(other.scores[d])
    if tied(s_k, s_d):
        return "tie_order", f"tied with the box kept instead ({s_d:.6g} and {s_k:.6g}), IoU {iou_other:.4g}"
    if float(this.scores[k_here]) < float(this.scores[c]):
        return "score_order", (f"the box kept instead scores {s_k:.6g} against {s_d:.6g} there, below it here; "
                               f"IoU {iou_other:.4g}")
    return "unattributed", "the box that suppressed it there ranks above it here too (a chain of suppressions)"


def _pairs(a: list[int], b: list[int], iou: torch.Tensor, accept) -> list[tuple[int, int]]:
    """Greedy one-to-one pairs of (a, b) by descending IoU among those `accept(i, j, iou)` allows."""
    scored = sorted(((float(iou[i, j]), i, j) for i in a for j in b if accept(i, j, float(iou[i, j]))), reverse=True)
    used_a, used_b, pairs = set(), set(), []
    for _, i, j in scored:
        if i not in used_a and j not in used_b:
            used_a.add(i), used_b.add(j)
            pairs.append((i, j))
    return pairs


def classify_image(ref: Detections, tgt: Detections, matched: list[tuple[int, int, float]], match_iou: float,
                   ref_cands: Candidates | None = None, tgt_cands: Candidates | None = None,
                   image: int = 0) -> list[FlipExample]:
    """Every unmatched box of one image (the `image`-th), classed."""
    ref_left = sorted(set(range(len(ref))) - {r for r, _, _ in matched})
    tgt_left = sorted(set(range(len(tgt))) - {t for _, t, _ in matched})
    iou = _iou(ref.boxes, tgt.boxes) if len(ref_left) and len(tgt_left) else torch.zeros(0, 0)
    classed: dict[tuple[str, int], tuple[str, str]] = {}
    for i, j in _pairs(ref_left, tgt_left, iou, lambda i, j, v: v >= match_iou and ref.labels[i] != tgt.labels[j]):
        detail = f"label {int(ref.labels[i])} in the reference, {int(tgt.labels[j])} in the target"
        classed[("reference", i)] = classed[("target", j)] = ("label_change", detail)
    if ref_cands is not None and tgt_cands is not None:
        for side, left, this, other in (("reference", ref_left, ref_cands, tgt_cands),
                                        ("target", tgt_left, tgt_cands, ref_cands)):
            for i in left:
                if (side, i) not in classed:
                    classed[(side, i)] = _named(_from_candidates(i, this, other, match_iou), side)
    else:  # from the outputs alone: same-label boxes that are each other's best overlap, below the match IoU
        ref_open = [i for i in ref_left if ("reference", i) not in classed]
        tgt_open = [j for j in tgt_left if ("target", j) not in classed]
        for i, j in _pairs(ref_open, tgt_open, iou, lambda i, j, v: v > 0 and ref.labels[i] == tgt.labels[j]
                           and _mutual_best(iou, i, j, ref_open, tgt_open)):
            detail = f"IoU {float(iou[i, j]):.4g} < the match IoU {match_iou:g}"
            classed[("reference", i)] = classed[("target", j)] = ("geometry", detail)
    rows = []
    for side, left, dets in (("reference", ref_left, ref), ("target", tgt_left, tgt)):
        for i in left:
            flip_class, detail = classed.get((side, i), ("unattributed", "no post-processing inputs for both sides"))
            rows.append(FlipExample(image=image, side=side, index=i, label=int(dets.labels[i]),
                                    score=float(dets.scores[i]), mechanism=flip_class, detail=detail))
    return rows


def _named(classed: tuple[str, str], side: str) -> tuple[str, str]:
    """A detail's 'here' and 'there' (the box's side and the other) named."""
    other = "target" if side == "reference" else "reference"
    detail = re.sub(r"\bthere\b", f"in the {other}", re.sub(r"\bhere\b", f"in the {side}", classed[1]))
    return classed[0], detail


def _mutual_best(iou: torch.Tensor, i: int, j: int, rows: list[int], cols: list[int]) -> bool:
    return max(float(iou[i, c]) for c in cols) == float(iou[i, j]) == max(float(iou[r, j]) for r in rows)


def _from_candidates(i: int, this: Candidates, other: Candidates, match_iou: float) -> tuple[str, str]:
    """An unmatched output box (the i-th of this side) classed through the candidates behind it."""
    c = int(this.kept[i])
    d = counterpart(c, this, other)
    if d is not None and bool((other.kept == d).any()):
        iou = float(_iou(this.boxes[c][None], other.boxes[d][None])[0, 0])
        if iou >= match_iou:
            return "unattributed", f"kept on both sides at IoU {iou:.4g}: the matching paired it with another box"
        return "geometry", f"the same candidate kept on both sides, its boxes at IoU {iou:.4g}"
    return why_not_kept(c, this, other)


def attribute(refs: list[Detections], tgts: list[Detections], matches: list[list[tuple[int, int, float]]], match_iou: float,
              ref_captured: list[Candidates] | None = None, tgt_captured: list[Candidates] | None = None
              ) -> Flips:
    """Counts of every unmatched box per class over all images, a few examples, and which sides' candidates
    were used (`candidates`: both, or none when a side has no capture for every image)."""
    both = (ref_captured is not None and tgt_captured is not None
            and len(ref_captured) == len(tgt_captured) == len(refs))
    counts: Counter[str] = Counter()
    examples = []
    for n, (r, t, pairs) in enumerate(zip(refs, tgts, matches, strict=True)):
        rc, tc = (ref_captured[n], tgt_captured[n]) if both else (None, None)
        for row in classify_image(r, t, pairs, match_iou, rc, tc, image=n):
            counts[row.mechanism] += 1
            if len(examples) < EXAMPLES:
                examples.append(row)
    return Flips(counts={k: counts[k] for k in CLASSES if counts[k]}, candidates="both" if both else "none",
                 examples=examples)
