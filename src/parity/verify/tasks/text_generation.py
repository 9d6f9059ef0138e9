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

Free-running (`new_tokens`, default 16): each side generates a continuation greedily with its own artifact
(`follow_up`, run in the execution after its timed runs: execute/follow_up.py). Artifacts are prepared at a fixed
sequence length and run here without a cache, so each continuation is written into a buffer of the input set's own
shape: each sequence keeps its first tokens as the prompt (at most its length less `new_tokens`), and every step
re-runs the whole buffer and reads the scores at the last written position. A causal decoder's scores at a
position depend only on the tokens up to it, so what the buffer holds beyond (the rest of the text, padding)
changes nothing; this is verified (the prompt's scores must stay put when a token is written after them), and a
model that fails it (an encoder reading both ways) gets no continuation, with that reason. An encoder-decoder
(T5) generates into its `decoder_input_ids`, its encoder inputs unchanged. Reported per prompt: the first
divergent new token, the tokens around it (decoded with the input set's tokenizer where it has one) and the
reference's top-2 margin there (a near tie or a real flip); over prompts, `exact_match` (the share of continuations
that match to the last token) and `first_divergence` (the earliest divergent new token, 0-based; absent when every
continuation matches). `exact_match` is reported, not judged, unless its threshold is set: one near tie early on
changes everything after it, so over a handful of prompts it is a coarse count, where the teacher-forced
statistics judge every decision on the same prefix.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from pydantic import Field

from parity.config.schema import Strict
from parity.outputs import flatten
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, fail, verdict

MAX_FLIPS = 20  # flips a record lists, real ones first, then by margin
CONTEXT = 6  # tokens a divergence is shown after
SHOWN = 4  # tokens of each side's continuation shown from a divergence on
CAUSAL_RTOL = 1e-3  # how far a prompt's scores may move when a later token is written (a backend's own jitter)


class TextGenerationThresholds(Strict):
    top1_agreement: float = Field(default=0.99, ge=0, le=1)
    kl_mean: float = Field(default=1e-3, ge=0)
    near_tie_margin: float = Field(default=0.01, ge=0, le=1)  # a flip whose reference top-2 margin is within it
    new_tokens: int = Field(default=16, ge=0)  # free-running: tokens each side generates greedily (0: none)
    exact_match: float | None = Field(default=None, ge=0, le=1)  # fail below this share of matching continuations


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


def _margins(scores: torch.Tensor) -> torch.Tensor:
    """The difference of the two largest probabilities of each row of next-token scores [..., vocabulary]."""
    p = scores.softmax(-1)
    top2 = p.topk(2, dim=-1).values if p.shape[-1] > 1 else torch.cat([p, torch.zeros_like(p)], -1)
    return top2[..., 0] - top2[..., 1]


def flips(ref: torch.Tensor, tgt: torch.Tensor, near_tie: float) -> list[dict[str, Any]]:
    """Every position whose top-1 differs ([sequence, position]), with the reference's top-2 margin (the
    difference of its two largest probabilities) and its class: near_tie within `near_tie`, else real."""
    margin = _margins(ref)
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


def _buffer_keys(inputs) -> tuple[str, str]:
    """The token ids a continuation is written into, and their attention mask's key: an encoder-decoder's decoder
    inputs when it is given them, else the input ids."""
    return (("decoder_input_ids", "decoder_attention_mask") if "decoder_input_ids" in inputs.kwargs
            else ("input_ids", "attention_mask"))


def generate(run, inputs, new_tokens: int, leaf: str | None = None) -> dict[str, Any]:
    """Each sequence's greedy continuation by `run` (a prepared backend), in a buffer of the inputs' own shape (see
    the module's docstring). Returns the prompts, each side's new tokens and its top-2 margin at each, or an
    `error` saying why no continuation can be generated."""
    from parity.inputs import Inputs

    key, mask_key = _buffer_keys(inputs)
    ids, mask = inputs.kwargs.get(key), inputs.kwargs.get(mask_key)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.shape[1] < 2:
        return {"error": f"free-running needs the token ids as a keyword input '{key}' [batch, positions >= 2]"}
    batch, length = ids.shape
    positions = torch.arange(length)
    lengths = torch.full((batch,), length) if mask is None else mask.sum(-1).long()
    if mask is not None and not torch.equal(mask.bool(), positions < lengths[:, None]):
        return {"error": f"free-running needs right-padded sequences ('{mask_key}' ones, then zeros); the tokenizer "
                         "pads on the left"}
    n = min(new_tokens, length - 1)
    prompt = lengths.clamp(1, length - n)  # room for n tokens after each prompt
    rows = torch.arange(batch)
    buffer = ids.clone()
    tokens, margins, before = [], [], None
    for step in range(n):
        kwargs = {**inputs.kwargs, key: buffer.clone()}
        if mask is not None:
            kwargs[mask_key] = (positions < (prompt + step)[:, None]).to(mask.dtype)
        scores = scores_of(run(Inputs(inputs.args, kwargs)), leaf)
        if scores.dim() != 3 or scores.shape[:2] != ids.shape:
            return {"error": f"next-token scores of shape {list(scores.shape)} for token ids {list(ids.shape)}"}
        known = positions < prompt[:, None]  # the prompt's positions: a causal decoder's scores there never move
        if before is not None and not torch.allclose(scores[known], before, rtol=CAUSAL_RTOL, equal_nan=True,
                                                     atol=CAUSAL_RTOL * float(before.nan_to_num(0, 0, 0).abs().max())):
            return {"error": "not a causal decoder: its scores at the prompt's positions change when a later token "
                             "is written, so no continuation can be generated in a buffer of fixed length"}
        before = scores[known]
        read = scores[rows, prompt + step - 1]
        chosen = read.argmax(-1)
        buffer[rows, prompt + step] = chosen
        tokens.append(chosen)
        margins.append(_margins(read))
    return {"new_tokens": n, "prompts": [ids[i, :int(prompt[i])].tolist() for i in range(batch)],
            "tokens": torch.stack(tokens, -1).tolist(), "margins": torch.stack(margins, -1).tolist()}


def first_divergence(reference: list[int], target: list[int]) -> int | None:
    """The first new token at which two continuations differ (0-based), or None when they match."""
    return next((k for k, (a, b) in enumerate(zip(reference, target, strict=True)) if a != b), None)


def _decoder(input_spec, experiment):
    """Token ids to text with the input set's tokenizer (None: the input set has none, ids are shown)."""
    if getattr(input_spec, "tokenizer", None) is None:
        return None
    from parity.inputs.text import load_tokenizer

    tokenizer = load_tokenizer(experiment.resolve(input_spec.tokenizer))
    return lambda ids: tokenizer.decode(ids)


def judge_continuations(result: TaskResult, reference: dict[str, Any], target: dict[str, Any],
                        thresholds: TextGenerationThresholds, decode=None) -> dict[str, Any]:
    """The `generation` field of a tier-3 record, from both sides' `generate`: per prompt, where the continuations
    first differ and the tokens around it; `exact_match` and `first_divergence` into the metrics, and a failure
    when `exact_match` is below its threshold (when one is set)."""
    for side, found in (("reference", reference), ("target", target)):
        if "error" in found:
            return {"generation": {"error": f"the {side}: {found['error']}"}}
    prompts = []
    for i, (prompt, ref, tgt) in enumerate(zip(reference["prompts"], reference["tokens"], target["tokens"], strict=True)):
        k = first_divergence(ref, tgt)
        entry: dict[str, Any] = {"prompt_tokens": len(prompt), "first_divergence": k}
        if k is not None:
            margin = reference["margins"][i][k]
            entry.update(margin=margin, flip="near_tie" if margin <= thresholds.near_tie_margin else "real",
                         context=(prompt + ref[:k])[-CONTEXT:], reference=ref[k:k + SHOWN], target=tgt[k:k + SHOWN])
            if decode is not None:
                entry["text"] = {part: decode(entry[part]) for part in ("context", "reference", "target")}
        prompts.append(entry)
    diverged = [p["first_divergence"] for p in prompts if p["first_divergence"] is not None]
    exact = 1.0 - len(diverged) / len(prompts) if prompts else 1.0
    result.metrics["exact_match"] = exact
    if diverged:
        result.metrics["first_divergence"] = min(diverged)
    if thresholds.exact_match is not None and exact < thresholds.exact_match:
        fail(result, f"exact match of the continuations {exact:.3g} < {thresholds.exact_match} ({len(diverged)} of "
                     f"{len(prompts)} greedy continuations of {reference['new_tokens']} tokens differ)")
    return {"generation": {"new_tokens": reference["new_tokens"], "exact_match": exact, "prompts": prompts}}


class TextGeneration(Task):
    name = "text-generation"
    Thresholds = TextGenerationThresholds
    headline = (Headline("top1_agreement", threshold="top1_agreement"),
                Headline("kl_mean", higher_is_better=False, threshold="kl_mean"),
                Headline("kl_p99", higher_is_better=False), Headline("delta_p_rms", higher_is_better=False),
                Headline("perplexity_ratio", higher_is_better=None), Headline("real_flips", higher_is_better=False),
                Headline("near_tie_flips", higher_is_better=False), Headline("exact_match", threshold="exact_match"),
                Headline("first_divergence"))

    def evaluate(self, reference, target, thresholds, gate, output):
        return evaluate(reference, target, thresholds, gate, output)

    def follow_up(self, thresholds, output):
        return partial(generate, new_tokens=thresholds.new_tokens, leaf=output) if thresholds.new_tokens else None

    def judge_follow_ups(self, result, reference, target, thresholds, input_spec, experiment):
        return judge_continuations(result, reference, target, thresholds, _decoder(input_spec, experiment))

    def explain(self, reference, target, thresholds, reference_captured, target_captured):
        """The flips, real ones first, then by the reference's margin (largest first): what a reader looks at."""
        found = flips(scores_of(reference), scores_of(target), thresholds.near_tie_margin)
        found.sort(key=lambda f: (f["class"] != "real", -f["margin"]))
        return {"token_flips": found[:MAX_FLIPS]} if found else {}


TASK = TextGeneration()
