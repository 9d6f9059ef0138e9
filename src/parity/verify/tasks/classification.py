"""Classification: do the top-1 and top-5 decisions agree, and how far apart are the distributions?"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from parity.config.schema import Strict
from parity.outputs import flatten
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, verdict


def logits_of(output: Any, leaf: str | None = None) -> torch.Tensor:
    """The [N, C] scores: the leaf named by `tiers.tasks.output`, else a leaf named logits, else the only
    1-D or 2-D floating output. Several candidates and no name: an error that lists them, not a guess."""
    leaves = {k: v for k, v in flatten(output).items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if leaf is not None:
        if leaf not in leaves:
            raise OutputsNotUnderstood(f"tiers.tasks.output '{leaf}' is not a floating output (outputs: {', '.join(leaves)})")
        candidates = {leaf: leaves[leaf]}
    else:
        named = {k: v for k, v in leaves.items() if k.endswith(".logits") or k.endswith("['logits']")}
        candidates = named or {k: v for k, v in leaves.items() if v.dim() in (1, 2)}
    if len(candidates) != 1:
        found = ", ".join(candidates) or "none"
        raise OutputsNotUnderstood(f"which output holds the class scores? candidates: {found}; "
                                   "name it with tiers.tasks.output (e.g. out[1])")
    scores = next(iter(candidates.values())).detach().to(torch.float64)
    return scores[None] if scores.dim() == 1 else scores


def rank_distance(ref: torch.Tensor, tgt: torch.Tensor, k: int) -> float:
    """How far the reference's top-k classes move in the target's ranking, in the spirit of CRADLE's
    D_CLASS: mean over samples and the k classes of |rank in target - rank in reference| / (C - 1)."""
    classes = ref.shape[1]
    order_t = tgt.argsort(dim=1, descending=True)
    rank_t = torch.empty_like(order_t)
    rank_t.scatter_(1, order_t, torch.arange(classes).expand_as(order_t))
    top_r = ref.argsort(dim=1, descending=True)[:, :k]
    moved = (rank_t.gather(1, top_r) - torch.arange(k)).abs().double()
    return float(moved.mean() / max(classes - 1, 1))


def kl_divergence(ref: torch.Tensor, tgt: torch.Tensor) -> float:
    """Mean KL(ref || tgt) of the softmax distributions. KL is never negative; two almost equal
    distributions can sum to -1e-18 in float64, which a report would show as a negative divergence."""
    p, log_p, log_q = ref.softmax(1), ref.log_softmax(1), tgt.log_softmax(1)
    return max(float((p * (log_p - log_q)).sum(1).mean()), 0.0)


class ClassificationThresholds(Strict):
    top1_agreement: float = Field(default=0.99, ge=0, le=1)
    top5_overlap: float | None = Field(default=None, ge=0, le=1)


def evaluate(reference: Any, target: Any, thresholds: ClassificationThresholds, gate: float,
             output: str | None = None) -> TaskResult:
    ref, tgt = logits_of(reference, output), logits_of(target, output)
    if ref.shape != tgt.shape:
        raise OutputsNotUnderstood(f"scores of shape {list(tgt.shape)} vs reference {list(ref.shape)}")
    k = min(5, ref.shape[1])
    top1 = float((ref.argmax(1) == tgt.argmax(1)).double().mean())
    top_r, top_t = ref.topk(k, dim=1).indices, tgt.topk(k, dim=1).indices
    overlap = float(torch.tensor([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(top_r, top_t, strict=True)]).mean())
    kl = kl_divergence(ref, tgt)
    flips = int((ref.argmax(1) != tgt.argmax(1)).sum())
    result = TaskResult("classification", {
        "samples": ref.shape[0], "top1_agreement": top1, "top5_overlap": overlap, "top1_flips": flips,
        "kl_divergence": kl, "rank_distance": rank_distance(ref, tgt, k),
    })
    failures = []
    if top1 < thresholds.top1_agreement:
        failures.append(f"top-1 agreement {top1:.3f} < {thresholds.top1_agreement} ({flips} of {ref.shape[0]} decisions flipped)")
    if thresholds.top5_overlap is not None and overlap < thresholds.top5_overlap:
        failures.append(f"top-5 overlap {overlap:.3f} < {thresholds.top5_overlap}")
    return verdict(result, failures)


class Classification(Task):
    name = "classification"
    Thresholds = ClassificationThresholds
    headline = (Headline("top1_agreement", threshold="top1_agreement"), Headline("top5_overlap", threshold="top5_overlap"),
                Headline("kl_divergence", higher_is_better=False))
    flat_keys = {"top1_agreement": "top1_agreement", "top5_overlap": "top5_overlap"}

    def evaluate(self, reference, target, thresholds, gate, output):
        return evaluate(reference, target, thresholds, gate, output)


TASK = Classification()
