"""Text generation: does the target choose the same next tokens as the reference, and how far apart are its
next-token distributions? The statistics llama.cpp's `llama-perplexity --kl-divergence` judges a quantized model
by, for any backend pair, teacher-forced: both sides read the same token sequences (the input set), and every
position of the logits `[batch, positions, vocabulary]` is one next-token decision.

- top-1 agreement: the share of positions where both sides' most likely next token is the same;
- KL(reference || target) of the next-token distributions: mean, median, p99, max over positions;
- delta p: the change in the probability of the reference's chosen token (target minus reference): mean, RMS;
- perplexity ratio: the target's perplexity over the reference's, both on the reference's chosen tokens (the
  outputs carry no input ids, so the tokens scored are the reference's greedy choices, not the text's own);
- each flip (a position whose top-1 differs) with the reference's top-2 margin (its two most likely tokens'
  probability difference): a flip within `near_tie_margin` is a near tie, where any rounding may swap the two;
  beyond it, a real flip.

Free-running greedy decoding (each side generating from its own tokens) is not evaluated: a check sees one
execution's outputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field

from parity.config.schema import Strict
from parity.outputs import flatten
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, verdict

MAX_FLIPS = 20  # flips a record lists, real ones first, then by margin


class TextGenerationThresholds(Strict):
    top1_agreement: float = Field(default=0.99, ge=0, le=1)
    kl_mean: float = Field(default=1e-3, ge=0)
    near_tie_margin: float = Field(default=0.01, ge=0, le=1)  # a flip whose reference top-2 margin is within it


def scores_of(output: Any, leaf: str | None = None) -> torch.Tensor:
    """The next-token scores in float64, [batch, positions, vocabulary] (or [positions, vocabulary]): the leaf
    `tiers.tasks.output` names, else the one named logits, else the only 3-D floating leaf."""
    leaves = {k: v for k, v in flatten(output).items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if leaf is not None:
        candidates = {leaf: leaves[leaf]} if leaf in leaves else {}
    else:
        candidates = ({k: v for k, v in leaves.items() if k.endswith("['logits']") or k.endswith(".logits")}
                      or {k: v for k, v in leaves.items() if v.dim() == 3})
    if len(candidates) != 1 or next(iter(candidates.values())).dim() not in (2, 3):
        raise OutputsNotUnderstood(f"which output holds the next-token scores [batch, positions, vocabulary]? "
                                   f"candidates: {', '.join(candidates) or 'none'}; name it with tiers.tasks.output")
    return next(iter(candidates.values())).detach().to(torch.float64)


def kl_per_position(ref: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """KL(reference || target) of each position's softmax, clamped at 0 (float64 rounding can give -1e-18)."""
    log_p, log_q = ref.log_softmax(-1), tgt.log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)


def flips(ref: torch.Tensor, tgt: torch.Tensor, near_tie: float) -> list[dict[str, Any]]:
    """Every position whose top-1 differs ([sequence, position]), with the reference's top-2 margin (the
    difference of its two largest probabilities) and its class: near_tie within `near_tie`, else real."""
    p = ref.softmax(-1)
    top2 = p.topk(2, dim=-1).values if p.shape[-1] > 1 else torch.cat([p, torch.zeros_like(p)], -1)
    margin = top2[..., 0] - top2[..., 1]
    chosen_r, chosen_t = ref.argmax(-1), tgt.argmax(-1)
    out = []
    for where in (chosen_r != chosen_t).nonzero().tolist():
        m = float(margin[tuple(where)])
        out.append({"position": where, "reference_token": int(chosen_r[tuple(where)]),
                    "target_token": int(chosen_t[tuple(where)]), "margin": m,
                    "class": "near_tie" if m <= near_tie else "real"})
    return out


def evaluate(reference: Any, target: Any, thresholds: TextGenerationThresholds, gate: float,
             output: str | None = None) -> TaskResult:
    ref, tgt = scores_of(reference, output), scores_of(target, output)
    if ref.shape != tgt.shape:
        raise OutputsNotUnderstood(f"next-token scores of shape {list(tgt.shape)} vs reference {list(ref.shape)}")
    kl = kl_per_position(ref, tgt).flatten()
    chosen = ref.argmax(-1, keepdim=True)
    logp_r = ref.log_softmax(-1).gather(-1, chosen).flatten()
    logp_t = tgt.log_softmax(-1).gather(-1, chosen).flatten()
    delta_p = logp_t.exp() - logp_r.exp()
    found = flips(ref, tgt, thresholds.near_tie_margin)
    real = sum(f["class"] == "real" for f in found)
    positions = kl.numel()
    top1 = 1.0 - len(found) / positions
    metrics = {
        "positions": positions, "top1_agreement": top1, "flips": len(found), "real_flips": real,
        "near_tie_flips": len(found) - real,
        "kl_mean": float(kl.mean()), "kl_median": float(kl.median()), "kl_p99": float(kl.quantile(0.99)),
        "kl_max": float(kl.max()), "delta_p_mean": float(delta_p.mean()),
        "delta_p_rms": float(delta_p.square().mean().sqrt()),
        "perplexity_ratio": float((logp_r.mean() - logp_t.mean()).exp()),  # exp(mean nll_t) / exp(mean nll_r)
    }
    failures = []
    if top1 < thresholds.top1_agreement:
        failures.append(f"top-1 agreement {top1:.4f} < {thresholds.top1_agreement} ({len(found)} of {positions} "
                        f"next-token decisions flipped, {real} beyond a near tie)")
    if not math.isfinite(metrics["kl_mean"]):  # NaN/Inf in a side's scores: no comparison ever passes it
        failures.append(f"mean KL {metrics['kl_mean']}: NaN or Inf in the scores of a side")
    elif metrics["kl_mean"] > thresholds.kl_mean:
        failures.append(f"mean KL {metrics['kl_mean']:.3g} > {thresholds.kl_mean}")
    result = verdict(TaskResult("text-generation", metrics), failures)
    return result


class TextGeneration(Task):
    name = "text-generation"
    Thresholds = TextGenerationThresholds
    headline = (Headline("top1_agreement", threshold="top1_agreement"),
                Headline("kl_mean", higher_is_better=False, threshold="kl_mean"),
                Headline("kl_p99", higher_is_better=False), Headline("delta_p_rms", higher_is_better=False),
                Headline("perplexity_ratio", higher_is_better=None), Headline("real_flips", higher_is_better=False),
                Headline("near_tie_flips", higher_is_better=False))

    def evaluate(self, reference, target, thresholds, gate, output):
        return evaluate(reference, target, thresholds, gate, output)

    def explain(self, reference, target, thresholds, reference_captured, target_captured):
        """The flips, real ones first, then by the reference's margin (largest first): what a reader looks at."""
        found = flips(scores_of(reference), scores_of(target), thresholds.near_tie_margin)
        found.sort(key=lambda f: (f["class"] != "real", -f["margin"]))
        return {"token_flips": found[:MAX_FLIPS]} if found else {}


TASK = TextGeneration()
