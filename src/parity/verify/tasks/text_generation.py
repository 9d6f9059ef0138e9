"""Text generation: does the target choose the same next tokens as the reference, and how far apart are its
next-token distributions? The statistics llama.cpp's `llama-perplexity --kl-divergence` judges a quantized model
by (tools/perplexity/perplexity.cpp `kl_divergence`, its formulas replicated in `next_token_statistics`), for any
backend pair, teacher-forced: both sides read the same token sequences (the input set), the reference as
llama.cpp's base, the target as its Q.

Scored positions (`scored_positions`): the logits at position t predict the text's token t+1, so t is scored when
t and t+1 are real tokens (padding masked by the attention mask) and t is in the scored part of its sequence (a
text cut into windows, `text_file`: each window's second half, perplexity.cpp's `first = n_ctx/2`; a padded
`text` set: every real next token). On them:

- perplexity of each side on the text's next tokens, their ratio (and its log) with a standard error, and the
  correlation of the two sides' ln PPL;
- KL(reference || target): mean ± SE, median, 90/95/99/99.9th percentiles, maximum (and a histogram per decade
  in the record, for the report's picture);
- delta p: the target's probability of the text's next token minus the reference's: mean ± SE, RMS ± SE and
  percentiles;
- same top p ± SE (llama.cpp's: the share of positions whose most likely tokens are the same), and each flip with
  the reference's top-2 margin (its two most likely tokens' probability difference): within `near_tie_margin` a
  near tie, where any rounding may swap the two, beyond it a real flip. `top1_agreement`, which the verdict
  judges, counts real flips only unless `count_near_ties` is set (the failure's line says which).

Under 100 scored positions the record carries a note (llama-perplexity prints no statistics at all there).
Without the token ids among the inputs (a model fed embeddings) the text is unknown: KL and top-1 over every
real position, perplexity and delta p NaN, with a note.

Free-running (`new_tokens`, default 16): each side generates a continuation greedily with its own artifact
(`follow_up`, run in the execution after its timed runs: execute/follow_up.py). Artifacts are prepared at a fixed
sequence length and run here without a cache, so each continuation is written into a buffer of the input set's own
shape: each sequence keeps its first tokens as the prompt (at most its length less `new_tokens`: a prompt cut
shorter than its sequence is said in the record's notes and on the console), and every step
re-runs the whole buffer and reads the scores at the last written position. A causal decoder's scores at a
position depend only on the tokens up to it, so what the buffer holds beyond (the rest of the text, padding)
changes nothing; this is verified (the prompt's scores must stay put when a token is written after them), and a
model that fails it (an encoder reading both ways) gets no continuation, with that reason. A backend that decodes
through its own KV cache (`CachedDecoding`: ONNX Runtime GenAI, optimum-intel's OpenVINO) generates its continuation
that way instead, as it is deployed: one prefill of the same prompt, then one token at a time. An encoder-decoder
(T5) generates into its `decoder_input_ids`, its encoder inputs unchanged. Reported per prompt: the first
divergent new token, the tokens around it (decoded with the input set's tokenizer where it has one) and the
reference's top-2 margin there (a near tie or a real flip); over prompts, `exact_match` (the share of continuations
that match to the last token) and `first_divergence` (the earliest divergent new token, 0-based; absent when every
continuation matches). `exact_match` is reported, not judged, unless its threshold is set: one near tie early on
changes everything after it, so over a handful of prompts it is a coarse count, where the teacher-forced
statistics judge every decision on the same prefix.

Cached decoding (the same `new_tokens` steps): a backend that decodes through its KV cache (`CachedDecoding`) does
so in the same follow-up, teacher-forced on the text (`decode_cached`), so both sides' steps line up; `judge_cached`
compares the target's cached decoding with the reference's and each side's with its own uncached forward (the
record's `cached`, its own verdict; a failure fails the check), and where both sides' caches run in this process
(eager, compile) their KV caches at the end layer by layer, keys and values apart (`compare_caches`: shown, not
judged; where the cache first differs). A target that cannot run the cache is not compared and says why, as
`unsupported_op`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from pydantic import Field, ValidationError

from parity import taxonomy as tx
from parity.backends.base import CachedDecoding
from parity.config.schema import Strict
from parity.config.tolerances import Tolerance
from parity.errors import exception_words
from parity.execute.follow_up import FollowUpRaised
from parity.inputs import Inputs
from parity.inputs.text import load_tokenizer
from parity.outputs import flatten
from parity.records.models import (
    CacheComparison,
    CachedDecodingCheck,
    CachedLayer,
    CachedMetrics,
    CacheTensorError,
    GeneratedPrompt,
    Generation,
    GenerationText,
    NextTokenMetrics,
    TokenFlip,
)
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, verdict, with_failure
from parity.verify.tensors import error_stats

MAX_FLIPS = 20  # flips a record lists, real ones first, then by margin
CONTEXT = 6  # tokens a divergence is shown after
SHOWN = 4  # tokens of each side's continuation shown from a divergence on
CAUSAL_RTOL = 1e-3  # how far a prompt's scores may move when a later token is written (a backend's own jitter)


KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # each layer's (keys, values), as `Decoded.cache` holds them


@dataclass(frozen=True)
class Unavailable:
    """Why a side gives no continuation or no cached decoding, in one line; for a target that cannot run the cache,
    its failure class (`unsupported_op`)."""

    error: str
    failure_class: str | None = None


@dataclass(frozen=True)
class Continuations:
    """A side's greedy continuations (`generate`): per sequence its prompt's ids, its `new_tokens` new tokens and
    the top-2 margin of its scores at each; `text_tokens`: each sequence's own length (its prompt may be cut shorter
    to leave room for the new tokens)."""

    new_tokens: int
    prompts: list[list[int]]
    text_tokens: list[int]
    tokens: list[list[int]]
    margins: list[list[float]]


@dataclass(frozen=True)
class CachedRun:
    """A side's cached decoding teacher-forced on the text (`decode_cached`): the prompt's length, the steps, the
    forced ids [batch, steps], the logits of each step through the cache and the same positions' logits from its
    uncached forward [batch, steps, vocabulary] float32, and its KV cache at the end (None: not exposed)."""

    prompt_tokens: int
    steps: int
    tokens: list[list[int]]
    logits: torch.Tensor
    uncached: torch.Tensor
    cache: KVCache | None = None


@dataclass(frozen=True)
class FollowedUp:
    """What text generation's follow-up (`follow`) returns of a side: its continuations and its cached decoding
    (None: a follow-up that raised, which execute/follow_up.py keeps as its error alone, `FollowUpRaised`)."""

    generation: Continuations | Unavailable
    cached: CachedRun | Unavailable | None


def unraised(value: Any) -> Any:
    """An execution's `follow_up` as this task's follow-up returned it (`follow`'s FollowedUp, `decode_cached`'s
    value); what the follow-up raised (execute/follow_up.py's `FollowUpRaised`) as `Unavailable`."""
    return Unavailable(value.error) if isinstance(value, FollowUpRaised) else value


def _followed(value: Any) -> FollowedUp:
    """A side's `follow` as judged: one that raised has no continuations (why) and no cached decoding."""
    found = unraised(value)
    return found if isinstance(found, FollowedUp) else FollowedUp(found, None)


class TextGenerationThresholds(Strict):
    top1_agreement: float = Field(default=0.99, ge=0, le=1)
    kl_mean: float = Field(default=1e-3, ge=0)
    near_tie_margin: float = Field(default=0.01, ge=0, le=1)  # a flip whose reference top-2 margin is within it
    count_near_ties: bool = False  # top1_agreement counts near-tie flips too (default: real flips only)
    new_tokens: int = Field(default=16, ge=0)  # free-running tokens and cached decoding steps per side (0: neither)
    exact_match: float | None = Field(default=None, ge=0, le=1)  # fail below this share of matching continuations


def scores_of(output: Any, leaf: str | None = None) -> torch.Tensor:
    """The next-token scores in float64, [batch, positions, vocabulary] (or [positions, vocabulary]): the leaf
    `tiers.tasks.output` names, else the one named logits, else the only 3-D floating leaf."""
    return logits_of(output, leaf).to(torch.float64)


def logits_of(output: Any, leaf: str | None = None) -> torch.Tensor:
    """`scores_of`'s leaf in its own dtype: a whole text's logits in float64 are twice their size again (a 49,152-token
    vocabulary over 2,048 positions: 0.8 GB a side), so the statistics take float64 a chunk of positions at a time."""
    leaves = {k: v for k, v in flatten(output).items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if leaf is not None:
        candidates = {leaf: leaves[leaf]} if leaf in leaves else {}
    else:
        candidates = ({k: v for k, v in leaves.items() if k.endswith("['logits']") or k.endswith(".logits")}
                      or {k: v for k, v in leaves.items() if v.dim() == 3})
    if len(candidates) != 1 or next(iter(candidates.values())).dim() not in (2, 3):
        raise OutputsNotUnderstood(f"which output holds the next-token scores [batch, positions, vocabulary]? "
                                   f"candidates: {', '.join(candidates) or 'none'}; name it with tiers.tasks.output")
    return next(iter(candidates.values())).detach()


def _margins(scores: torch.Tensor) -> torch.Tensor:
    """The difference of the two largest probabilities of each row of next-token scores [..., vocabulary]."""
    p = scores.softmax(-1)
    top2 = p.topk(2, dim=-1).values if p.shape[-1] > 1 else torch.cat([p, torch.zeros_like(p)], -1)
    return top2[..., 0] - top2[..., 1]


def flips(ref: torch.Tensor, tgt: torch.Tensor, near_tie: float, scored: torch.Tensor | None = None) -> list[TokenFlip]:
    """Every scored position (`scored`: a mask over [sequence, position]; None: all) whose top-1 differs
    ([sequence, position]), with the reference's top-2 margin (the difference of its two largest probabilities)
    and its class: near_tie within `near_tie`, else real."""
    chosen_r, chosen_t = ref.argmax(-1), tgt.argmax(-1)
    differ = chosen_r != chosen_t
    if scored is not None:
        differ &= scored
    differing = ref[differ]  # only where they differ: a softmax of every position is large; in float64 a chunk at a time
    step = chunk_rows(ref.shape[-1])
    margins = [m for start in range(0, differing.shape[0], step)
               for m in _margins(differing[start:start + step].to(torch.float64)).tolist()]
    return [TokenFlip(position=where, reference_token=int(chosen_r[tuple(where)]), target_token=int(chosen_t[tuple(where)]),
                      margin=m, flip="near_tie" if m <= near_tie else "real")
            for where, m in zip(differ.nonzero().tolist(), margins, strict=True)]


def _mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """perplexity.cpp `kl_divergence`'s `mean_and_uncertainty`: the mean and its standard error from a sum and a
    sum of squares (0 at 10 values or fewer, or a variance rounded to <= 0)."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def _covariance(sum_a: float, sum_b: float, sum_ab: float, count: int) -> float:
    """perplexity.cpp `kl_divergence`'s `covariance` of two means (0 under 10 values)."""
    if count < 10:
        return 0.0
    return (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1)


def _percentile(values: torch.Tensor, fraction: float) -> float:
    """perplexity.cpp's `percentile` of sorted values: linear between the two nearest ranks of fraction*(n-1)."""
    return float(torch.quantile(values, fraction, interpolation="linear")) if values.numel() else math.nan


def scored_positions(ids: torch.Tensor | None, mask: torch.Tensor | None, shape: torch.Size,
                     first: int) -> torch.Tensor:
    """Which positions [batch, positions] are scored: the logits at t predict token t+1, so t is scored when both t
    and t+1 are real tokens (the attention mask; no mask: all) and t >= `first` (a text window's first half is
    context only, as llama-perplexity's `first = n_ctx/2`). Without the token ids the text's next token is unknown:
    every real position is scored (for KL and top-1; perplexity and delta p then have no value)."""
    batch, length = shape
    real = torch.ones(shape, dtype=torch.bool) if mask is None else mask.bool()
    t = torch.arange(length)
    if ids is None:
        return real & (t >= first)
    nxt = torch.zeros(shape, dtype=torch.bool)
    nxt[:, :-1] = real[:, 1:]
    return real & nxt & (t >= first)


def next_token_statistics(ref: torch.Tensor, tgt: torch.Tensor, next_tokens: torch.Tensor | None,
                          rows: torch.Tensor | None = None,
                          chunk: int | None = None) -> tuple[NextTokenMetrics, torch.Tensor]:
    """The statistics `llama-perplexity --kl-divergence` prints (perplexity.cpp `kl_divergence`, per position in
    its `log_softmax(n_vocab, logits, base_log_prob, tok, kld)`), with the reference as its base and the target as
    Q, over scored positions [n, vocabulary] (`rows` [n]: which rows of `ref` and `tgt` they are; None: every row;
    `next_tokens` [n]: the text's next token at each; None: unknown, and the statistics on it are NaN). Each
    position's values are computed in float64 `chunk` positions at a time (default: CHUNK_ELEMENTS scores), so the
    working memory is a chunk's whatever the text's length; the sums over positions are taken after, over all.
    Its formulas, in float64: PPL = exp(mean NLL) ± PPL·SE; ln(PPL(Q)/PPL(base)) ± sqrt(SE_Q² + SE_base² − 2·cov); Cor(ln PPL(Q), ln PPL(base)) = cov / (SE_Q·SE_base); KLD mean ± SE and
    percentiles; Δp = p_Q(token) − p_base(token): mean ± SE, RMS ± 0.5/RMS·SE(mean Δp²) and percentiles; same
    top p ± sqrt(p(1−p)/(n−1)). The KL sums the reference's tokens of log probability above -16 only, as
    perplexity.cpp does (its base's log probabilities are stored in 16 bits, within 16 nats of the largest: what
    lies below is not kept); parity keeps the rest in float64 where llama.cpp rounds them to 16 bits. Returns the
    statistics and each position's KL [n]."""
    rows = torch.arange(ref.shape[0]) if rows is None else rows
    n = rows.numel()
    nan = math.nan
    kld, nll_q, nll_b, same = _per_position(ref, tgt, rows, next_tokens,
                                            chunk or chunk_rows(ref.shape[-1]))
    m: dict[str, Any] = {"positions": n}
    kl_mean, kl_se = _mean_and_uncertainty(float(kld.sum()), float(kld.square().sum()), n)
    same_top = same / n if n else nan
    m.update(kl_mean=kl_mean if n else nan, kl_mean_se=kl_se if n else nan,
             same_top1=same_top, same_top1_se=math.sqrt(same_top * (1 - same_top) / (n - 1)) if n > 1 else nan)
    for key, fraction in KL_PERCENTILES:
        m[key] = _percentile(kld, fraction)
    if next_tokens is None or not n:
        m.update({k: nan for k in TEXT_STATISTICS})
        return NextTokenMetrics.model_validate(m), kld
    lq, lq_se = _mean_and_uncertainty(float(nll_q.sum()), float(nll_q.square().sum()), n)
    lb, lb_se = _mean_and_uncertainty(float(nll_b.sum()), float(nll_b.square().sum()), n)
    cov = _covariance(float(nll_q.sum()), float(nll_b.sum()), float((nll_q * nll_b).sum()), n)
    ratio_se = math.sqrt(max(lq_se ** 2 + lb_se ** 2 - 2 * cov, 0.0))
    dp = (-nll_q).exp() - (-nll_b).exp()
    dp_mean, dp_se = _mean_and_uncertainty(float(dp.sum()), float(dp.square().sum()), n)
    mse, mse_se = _mean_and_uncertainty(float(dp.square().sum()), float(dp.pow(4).sum()), n)
    rms = math.sqrt(mse)
    m.update(ppl_target=math.exp(lq), ppl_target_se=math.exp(lq) * lq_se,
             ppl_reference=math.exp(lb), ppl_reference_se=math.exp(lb) * lb_se,
             ln_ppl_ratio=lq - lb, ln_ppl_ratio_se=ratio_se,
             perplexity_ratio=math.exp(lq - lb), perplexity_ratio_se=math.exp(lq - lb) * ratio_se,
             ln_ppl_correlation=cov / (lq_se * lb_se) if lq_se * lb_se > 0 else nan,
             delta_p_mean=dp_mean, delta_p_mean_se=dp_se,
             delta_p_rms=rms, delta_p_rms_se=0.5 / rms * mse_se if rms > 0 else 0.0)
    for key, fraction in DP_PERCENTILES:
        m[key] = _percentile(dp, fraction)
    return NextTokenMetrics.model_validate(m), kld


def _per_position(ref: torch.Tensor, tgt: torch.Tensor, rows: torch.Tensor, next_tokens: torch.Tensor | None,
                  chunk: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """Each scored position's KL, the target's and the reference's NLL of the text's next token (None without it)
    and the count of positions whose top-1 is the same, from `chunk` rows of `ref` and `tgt` at a time in float64:
    every value is a reduction over one row's vocabulary, the same whichever rows it is computed beside."""
    kld, nll_q, nll_b, same = [], [], [], 0
    for start in range(0, rows.numel(), chunk):
        at = rows[start:start + chunk]
        r, t = ref[at].to(torch.float64), tgt[at].to(torch.float64)
        same += int((r.argmax(-1) == t.argmax(-1)).sum())
        log_p, log_q = r.log_softmax(-1), t.log_softmax(-1)
        del r, t
        kept = log_p > KL_FLOOR  # perplexity.cpp sums only the base's tokens above it (`if (p_log_base > -16.f)`)
        kld.append(torch.where(kept, log_p.exp() * (log_p - log_q), 0.0).sum(-1))
        if next_tokens is not None:
            token = next_tokens[start:start + chunk, None]
            nll_q.append(-log_q.gather(-1, token).squeeze(-1))
            nll_b.append(-log_p.gather(-1, token).squeeze(-1))
    empty = torch.zeros(0, dtype=torch.float64)
    kld_all = torch.cat(kld) if kld else empty
    if next_tokens is None:
        return kld_all, None, None, same
    return kld_all, (torch.cat(nll_q) if nll_q else empty), (torch.cat(nll_b) if nll_b else empty), same


CHUNK_ELEMENTS = 1 << 22  # scores taken to float64 at a time by the statistics (32 MB; 85 positions of a 49,152 vocabulary)


def chunk_rows(vocabulary: int) -> int:
    """How many positions of a `vocabulary`-wide score matrix make one chunk of CHUNK_ELEMENTS (at least one)."""
    return max(1, CHUNK_ELEMENTS // max(vocabulary, 1))
KL_PERCENTILES = (("kl_median", 0.5), ("kl_p90", 0.9), ("kl_p95", 0.95), ("kl_p99", 0.99), ("kl_p999", 0.999),
                  ("kl_max", 1.0))
DP_PERCENTILES = (("delta_p_min", 0.0), ("delta_p_p01", 0.01), ("delta_p_p05", 0.05), ("delta_p_median", 0.5),
                  ("delta_p_p95", 0.95), ("delta_p_p99", 0.99), ("delta_p_max", 1.0))
# What needs the text's next token: no value without the token ids.
TEXT_STATISTICS = ("ppl_target", "ppl_target_se", "ppl_reference", "ppl_reference_se", "ln_ppl_ratio",
                   "ln_ppl_ratio_se", "perplexity_ratio", "perplexity_ratio_se", "ln_ppl_correlation",
                   "delta_p_mean", "delta_p_mean_se", "delta_p_rms", "delta_p_rms_se",
                   *(k for k, _ in DP_PERCENTILES))
KL_FLOOR = -16.0  # a reference token below this log probability (1.1e-7) is left out of the KL, as llama.cpp does
FEW_POSITIONS = 100  # under it llama-perplexity prints no final statistics; parity prints them with a warning
KLD_BINS = [10.0 ** e for e in range(-9, 3)]  # edges of the KL histogram a record keeps (per decade)


def kld_histogram(kld: torch.Tensor) -> dict[str, Any]:
    """The scored positions' KL per decade, for a report's picture: counts below 1e-9, in each decade, above 100."""
    edges = torch.tensor(KLD_BINS, dtype=kld.dtype)
    counts = torch.bincount(torch.bucketize(kld, edges), minlength=len(KLD_BINS) + 1)
    return {"edges": KLD_BINS, "counts": counts.tolist()}


def _text_of(inputs, shape: torch.Size) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
    """The token ids the logits were computed on, their attention mask (each None when absent or of another shape)
    and the first scored position, from the inputs the model was called with."""
    if inputs is None:
        return None, None, 0
    key, mask_key = _buffer_keys(inputs)
    ids, mask = inputs.kwargs.get(key), inputs.kwargs.get(mask_key)
    fits = lambda t: isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape) and not t.is_floating_point()  # noqa: E731
    return (ids if fits(ids) else None), (mask if fits(mask) else None), inputs.scored_from


def evaluate(reference: Any, target: Any, thresholds: TextGenerationThresholds, gate: float,
             output: str | None = None, inputs=None) -> TaskResult:
    """The statistics over the scored positions (`scored_positions`: real next tokens only, from the first scored
    position of each window) of the logits a model returned on `inputs` (None: every position, the text unknown),
    and the verdict: top-1 agreement on real flips (near ties within `near_tie_margin` reported apart, and counted
    only with `count_near_ties`) and mean KL."""
    ref, tgt = logits_of(reference, output), logits_of(target, output)
    if ref.shape != tgt.shape:
        raise OutputsNotUnderstood(f"next-token scores of shape {list(tgt.shape)} vs reference {list(ref.shape)}")
    if ref.dim() == 2:
        ref, tgt = ref[None], tgt[None]
    ids, mask, first = _text_of(inputs, ref.shape[:2])
    scored = scored_positions(ids, mask, ref.shape[:2], first)
    next_tokens = None if ids is None else ids.roll(-1, dims=1)[scored]
    stats, kld = next_token_statistics(ref.flatten(0, 1), tgt.flatten(0, 1), next_tokens,
                                       rows=scored.flatten().nonzero().squeeze(1))
    found = flips(ref, tgt, thresholds.near_tie_margin, scored)
    real = sum(f.flip == "real" for f in found)
    n = stats.positions
    top1 = 1.0 - (len(found) if thresholds.count_near_ties else real) / n if n else math.nan
    m = stats.model_dump(exclude_unset=True) | {"top1_agreement": top1, "flips": len(found), "real_flips": real,
                                                "near_tie_flips": len(found) - real}
    record: dict[str, Any] = {"kld_histogram": kld_histogram(kld)}
    if ids is not None and getattr(inputs, "texts", ()):  # a text's ids: what re-running the statistics needs
        record["token_ids"] = ids.tolist()
    if found:  # what a reader looks at: real flips first, then by the reference's margin (largest first)
        found.sort(key=lambda f: (f.flip != "real", -f.margin))
        record["token_flips"] = [f.model_dump(by_alias=True) for f in found[:MAX_FLIPS]]
    notes = []
    if ids is None:
        notes.append("no token ids among the inputs: the text's next tokens are unknown, so perplexity and "
                     "delta p have no value; KL and top-1 are over every real position")
    if n < FEW_POSITIONS:
        notes.append(f"only {n} scored positions (under {FEW_POSITIONS}): the statistics are rough "
                     "(llama-perplexity prints none)")
    result = TaskResult("text-generation", m, notes=notes, record=record)
    failures = []
    if not n:
        failures.append("no scored position: every next token is padding or in a window's unscored first half")
    elif top1 < thresholds.top1_agreement:
        counted = ("every flip counted, near ties too (count_near_ties)" if thresholds.count_near_ties else
                   f"real flips only: {len(found) - real} near ties within a reference top-2 margin of "
                   f"{thresholds.near_tie_margin} not counted")
        failures.append(f"top-1 agreement {top1:.4f} < {thresholds.top1_agreement} ({real} real flips, "
                        f"{len(found) - real} near ties, of {n} scored next-token decisions; {counted})")
    if n and not math.isfinite(stats.kl_mean):  # NaN/Inf in a side's scores: no comparison ever passes it
        failures.append(f"mean KL {stats.kl_mean}: NaN or Inf in the scores of a side")
    elif n and stats.kl_mean > thresholds.kl_mean:
        failures.append(f"mean KL {stats.kl_mean:.3g} ± {stats.kl_mean_se:.2g} > {thresholds.kl_mean}")
    return verdict(result, failures)


def _buffer_keys(inputs) -> tuple[str, str]:
    """The token ids a continuation is written into, and their attention mask's key: an encoder-decoder's decoder
    inputs when it is given them, else the input ids."""
    return (("decoder_input_ids", "decoder_attention_mask") if "decoder_input_ids" in inputs.kwargs
            else ("input_ids", "attention_mask"))


def generate(run, inputs, new_tokens: int, leaf: str | None = None) -> Continuations | Unavailable:
    """Each sequence's greedy continuation by `run` (a prepared backend), in a buffer of the inputs' own shape (see
    the module's docstring). Returns the prompts, each side's new tokens and its top-2 margin at each, or why no
    continuation can be generated."""
    key, mask_key = _buffer_keys(inputs)
    ids, mask = inputs.kwargs.get(key), inputs.kwargs.get(mask_key)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.shape[1] < 2:
        return Unavailable(f"free-running needs the token ids as a keyword input '{key}' [batch, positions >= 2]")
    batch, length = ids.shape
    positions = torch.arange(length)
    lengths = torch.full((batch,), length) if mask is None else mask.sum(-1).long()
    if mask is not None and not torch.equal(mask.bool(), positions < lengths[:, None]):
        return Unavailable(f"free-running needs right-padded sequences ('{mask_key}' ones, then zeros); the "
                           "tokenizer pads on the left")
    n = min(new_tokens, length - 1)
    prompt = lengths.clamp(1, length - n)  # room for n tokens after each prompt
    backend = getattr(run, "__self__", None)  # the prepared backend whose `run` this is
    if isinstance(backend, CachedDecoding) and key == "input_ids":
        try:
            return _decoded(backend, ids, prompt, n, lengths)
        except NotImplementedError:  # this model's forward takes no cache (eager's NoCache): the buffer is re-run
            pass
    rows = torch.arange(batch)
    buffer = ids.clone()
    tokens, margins, before = [], [], None
    for step in range(n):
        kwargs = {**inputs.kwargs, key: buffer.clone()}
        if mask is not None:
            kwargs[mask_key] = (positions < (prompt + step)[:, None]).to(mask.dtype)
        scores = scores_of(run(Inputs(inputs.args, kwargs)), leaf)
        if scores.dim() != 3 or scores.shape[:2] != ids.shape:
            return Unavailable(f"next-token scores of shape {list(scores.shape)} for token ids {list(ids.shape)}")
        known = positions < prompt[:, None]  # the prompt's positions: a causal decoder's scores there never move
        if before is not None and not torch.allclose(scores[known], before, rtol=CAUSAL_RTOL, equal_nan=True,
                                                     atol=CAUSAL_RTOL * float(before.nan_to_num(0, 0, 0).abs().max())):
            return Unavailable("not a causal decoder: its scores at the prompt's positions change when a later token "
                               "is written, so no continuation can be generated in a buffer of fixed length")
        before = scores[known]
        read = scores[rows, prompt + step - 1]
        chosen = read.argmax(-1)
        buffer[rows, prompt + step] = chosen
        tokens.append(chosen)
        margins.append(_margins(read))
    return Continuations(new_tokens=n, prompts=[ids[i, :int(prompt[i])].tolist() for i in range(batch)],
                         text_tokens=lengths.tolist(), tokens=torch.stack(tokens, -1).tolist(),
                         margins=torch.stack(margins, -1).tolist())


def follow(backend, inputs, new_tokens: int, leaf: str | None = None) -> FollowedUp:
    """Text generation's follow-up (execute/follow_up.py) on a prepared backend: its free-running continuations
    (`generate`) and its decoding through the KV cache (`decode_cached`)."""
    return FollowedUp(generate(backend.run, inputs, new_tokens, leaf), decode_cached(backend, inputs, new_tokens, leaf))


def decode_cached(backend, inputs, steps: int, leaf: str | None = None) -> CachedRun | Unavailable:
    """The backend's cached decoding (`CachedDecoding`), teacher-forced on the text: a prompt of each sequence's
    first tokens (as many as leave `steps` real tokens after the shortest), then `steps` decode steps fed the text's
    own next tokens, so both sides' steps read the same tokens and line up; beside them, the same positions' logits
    from the backend's uncached forward over the whole sequence (`run`), which a correct cache reproduces, and its
    KV cache at the end where it exposes it. Or why not (one line), with the `failure_class` of a target that cannot
    run the cache (always `unsupported_op`)."""
    if not isinstance(backend, CachedDecoding):
        return Unavailable(f"backend '{backend.name}' has no cached decoding (it does not implement CachedDecoding: "
                           "an export or trace captured without the cache, or a runtime whose cache parity does not "
                           "drive)", tx.UNSUPPORTED_OP)
    found = cached_prompt(inputs, steps)
    if isinstance(found, str):
        return Unavailable(found)
    prompt, forced = found
    n, real = forced.shape[1], prompt.shape[1] + forced.shape[1]
    try:
        decoded = backend.decode(prompt.clone(), n, forced.clone())
    except Exception as exc:  # a target that cannot run the cache: its class by what raised (NoCache: unsupported_op)
        return Unavailable(f"the cached decoding raised {exception_words(exc)}", tx.classify_exception(exc, tx.RUN))
    if decoded.logits.shape[:2] != forced.shape:
        return Unavailable(f"cached decoding returned logits of shape {list(decoded.logits.shape)} for {n} steps of "
                           f"{forced.shape[0]} sequences", tx.BACKEND_ERROR)
    uncached = logits_of(backend.run(inputs.clone()), leaf)[:, real - n - 1:real - 1]  # n positions, not all, in float
    return CachedRun(prompt_tokens=real - n, steps=n, tokens=forced.tolist(), logits=decoded.logits.float(),
                     uncached=uncached.float(), cache=decoded.cache)


def cached_prompt(inputs, steps: int) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The prompt [batch, P] and the forced tokens [batch, n] of a cached decoding teacher-forced on the text: each
    sequence's first P tokens, as many as leave n = min(`steps`, shortest - 1) real tokens after the shortest, and
    those n tokens; or why the input set has none (one line). Tier 3's `decode_cached` and tier 2's localization on
    the decode step read the same prompt."""
    ids, mask = inputs.kwargs.get("input_ids"), inputs.kwargs.get("attention_mask")
    if "decoder_input_ids" in inputs.kwargs:
        return "cached decoding of an encoder-decoder is not compared (a decoder-only model's is)"
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.shape[1] < 2:
        return "cached decoding needs the token ids as a keyword input 'input_ids' [batch, positions >= 2]"
    positions = torch.arange(ids.shape[1])
    lengths = torch.full((ids.shape[0],), ids.shape[1]) if mask is None else mask.sum(-1).long()
    if mask is not None and not torch.equal(mask.bool(), positions < lengths[:, None]):
        return "cached decoding needs right-padded sequences ('attention_mask' ones, then zeros)"
    real = int(lengths.min())
    n = min(steps, real - 1)
    if n < 1:
        return f"cached decoding needs sequences of at least 2 tokens (the shortest has {real})"
    return ids[:, :real - n], ids[:, real - n:real]


def _cached_statistics(ref: torch.Tensor, tgt: torch.Tensor, tokens: torch.Tensor,
                       thresholds: TextGenerationThresholds) -> tuple[CachedMetrics, list[str]]:
    """One comparison of cached decodings [batch, steps, vocabulary] (`ref` the side judged against): the
    teacher-forced statistics' KL, top-1 and flips, judged at the same thresholds; returns metrics and failures."""
    ref, tgt = ref.double(), tgt.double()
    stats, _ = next_token_statistics(ref.flatten(0, 1), tgt.flatten(0, 1), tokens.flatten())
    found = flips(ref, tgt, thresholds.near_tie_margin)
    real = sum(f.flip == "real" for f in found)
    n = stats.positions
    top1 = 1.0 - (len(found) if thresholds.count_near_ties else real) / n
    kept: dict[str, Any] = {"positions": n, "kl_mean": stats.kl_mean, "kl_max": stats.kl_max,
                            "same_top1": stats.same_top1, "top1_agreement": top1, "real_flips": real,
                            "near_tie_flips": len(found) - real, "max_abs": float((ref - tgt).abs().max())}
    if found:
        kept["first_flip"] = min(f.position[1] for f in found)  # the earliest step whose decision differs
    failures = []
    if top1 < thresholds.top1_agreement:
        failures.append(f"top-1 agreement {top1:.4f} < {thresholds.top1_agreement} ({real} real flips, "
                        f"{len(found) - real} near ties, of {n} decode steps)")
    if not math.isfinite(stats.kl_mean):
        failures.append(f"mean KL {stats.kl_mean}: NaN or Inf in the logits of a side")
    elif stats.kl_mean > thresholds.kl_mean:
        failures.append(f"mean KL {stats.kl_mean:.3g} > {thresholds.kl_mean}")
    return CachedMetrics.model_validate(kept), failures


def judge_cached(result: TaskResult, reference: CachedRun | Unavailable | None, target: CachedRun | Unavailable | None,
                 thresholds: TextGenerationThresholds,
                 tolerance: Tolerance) -> tuple[TaskResult, CachedDecodingCheck | None]:
    """The `cached` field of a tier-3 record from both sides' `decode_cached`: the target's cached decoding against
    the reference's (`target`), the reference's cached decoding against its own uncached forward (`reference_self`:
    a cache bug in the reference itself), and the target's against its own (`target_self`, shown, not judged: it
    says whether a difference comes from the target's cache path); and both sides' KV caches at the end, layer by
    layer, at the target's `tolerance` (`compare_caches`: shown, not judged). A failure of either judged comparison
    fails the check (`result` failing too); a side that could not decode says why (`error`, `side`, and the
    target's `failure_class`)."""
    if reference is None or target is None:  # a follow-up that raised, or none asked
        return result, None
    for side, found in (("reference", reference), ("target", target)):
        if isinstance(found, Unavailable):
            return result, CachedDecodingCheck(side=side, error=f"the {side}: {found.error}",
                                               failure_class=found.failure_class)
    if (reference.prompt_tokens, reference.steps) != (target.prompt_tokens, target.steps):
        return result, CachedDecodingCheck(error="the two sides decoded different prompts",
                                           failure_class=tx.BACKEND_ERROR)
    tokens = torch.tensor(reference.tokens)
    versus, failures = _cached_statistics(reference.logits, target.logits, tokens, thresholds)
    own, own_failures = _cached_statistics(reference.uncached, reference.logits, tokens, thresholds)
    target_own, target_failures = _cached_statistics(target.uncached, target.logits, tokens, thresholds)
    said = [f"{who}: {', '.join(found)}" for who, found in (
        ("the reference's cached decoding against its own uncached forward", own_failures),
        ("the target's cached decoding against the reference's", failures)) if found]
    if failures and target_failures:
        said.append("the target's cached decoding differs from its own uncached forward too: its cache path")
    detail = "; ".join(said) or None
    cached = CachedDecodingCheck(prompt_tokens=reference.prompt_tokens, steps=reference.steps, passed=not said,
                                 side="reference" if own_failures else "target" if failures else None,
                                 failure_class=tx.DECISION_FLIP if said else None, detail=detail,
                                 target=versus, reference_self=own, target_self=target_own,
                                 cache=compare_caches(reference.cache, target.cache, tolerance))
    if said:
        result = with_failure(result, f"cached decoding: {detail}")
    return result, cached


NOT_EXPOSED = ("its runtime does not expose its KV cache (it keeps it in its own process: ONNX Runtime GenAI, "
               "OpenVINO, llama.cpp)")


def compare_caches(reference: KVCache | None, target: KVCache | None, tolerance: Tolerance) -> CacheComparison:
    """Both sides' KV caches at the end of their cached decodings, layer by layer, keys and values apart, measured as
    tier 2 measures a layer (max abs, rmse / rms of the reference, the required atol at `tolerance`'s rtol) and
    judged at its gate (scale-aware where the target's is: `Tolerance.at_scale` of each reference tensor's RMS);
    `first_layer`: the first layer whose keys or values exceed it. Or why they are not compared (`error`)."""
    for side, cache in (("the reference", reference), ("the target", target)):
        if cache is None:
            return CacheComparison(error=f"{side}: {NOT_EXPOSED}")
    if len(reference) != len(target):
        return CacheComparison(error=f"the target's cache has {len(target)} layers, the reference's {len(reference)}")
    layers = []
    for i, ((ref_keys, ref_values), (tgt_keys, tgt_values)) in enumerate(zip(reference, target, strict=True)):
        for name, ref, tgt in (("keys", ref_keys, tgt_keys), ("values", ref_values, tgt_values)):
            if ref.shape != tgt.shape:
                return CacheComparison(error=f"layer {i}'s {name}: shape {list(tgt.shape)} vs reference "
                                             f"{list(ref.shape)}")
        layers.append(CachedLayer(layer=i, keys=_cache_error(ref_keys, tgt_keys, tolerance),
                                  values=_cache_error(ref_values, tgt_values, tolerance)))
    first = next((layer for layer in layers if layer.keys.exceeds or layer.values.exceeds), None)
    if first is None:
        return CacheComparison(layers=layers)
    return CacheComparison(layers=layers, first_layer=first.layer,
                           first_parts=[name for name, e in (("keys", first.keys), ("values", first.values))
                                        if e.exceeds])


def _cache_error(ref: torch.Tensor, tgt: torch.Tensor, tolerance: Tolerance) -> CacheTensorError:
    """One cache tensor's error, measured by tier 1's `error_stats` as tier 2 measures a layer's output: its required
    atol None, and exceeding, where NaN/Inf stand on one side only."""
    stats = error_stats(ref, tgt, tolerance.rtol, gate=math.inf)
    rms = stats.reference_rms
    gate = tolerance.at_scale(rms).gate
    return CacheTensorError(max_abs=stats.max_abs, rel_rmse=stats.rmse / rms if rms else stats.rmse,
                            required_atol=stats.required_atol,
                            exceeds=stats.required_atol is None or stats.required_atol > gate)


def _decoded(backend, ids: torch.Tensor, prompt: torch.Tensor, n: int, lengths: torch.Tensor) -> Continuations:
    """`generate`'s continuations by a backend that decodes through its own KV cache (`CachedDecoding`: an LLM
    runtime's generator): each prompt prefilled once, then `n` greedy steps, as the runtime generates, instead of
    `n` runs of the whole buffer (each a prefill of the window: for 1,000 positions, most of a tier-3 run's cost)."""
    tokens, margins = [], []
    for i in range(ids.shape[0]):
        decoded = backend.decode(ids[i:i + 1, :int(prompt[i])], n)
        tokens.append(decoded.tokens[0].tolist())
        margins.append(_margins(decoded.logits[0].to(torch.float64)).tolist())
    return Continuations(new_tokens=n, prompts=[ids[i, :int(prompt[i])].tolist() for i in range(ids.shape[0])],
                         text_tokens=lengths.tolist(), tokens=tokens, margins=margins)


def first_divergence(reference: list[int], target: list[int]) -> int | None:
    """The first new token at which two continuations differ (0-based), or None when they match."""
    return next((k for k, (a, b) in enumerate(zip(reference, target, strict=True)) if a != b), None)


def _decoder(input_spec, experiment):
    """Token ids to text with the input set's tokenizer (None: the input set has none, ids are shown)."""
    if getattr(input_spec, "tokenizer", None) is None:
        return None
    tokenizer = load_tokenizer(experiment.resolve(input_spec.tokenizer))
    return lambda ids: tokenizer.decode(ids)


def judge_continuations(result: TaskResult, reference: Continuations | Unavailable, target: Continuations | Unavailable,
                        thresholds: TextGenerationThresholds, decode=None) -> tuple[TaskResult, Generation]:
    """The `generation` field of a tier-3 record, from both sides' `generate`: per prompt, where the continuations
    first differ and the tokens around it; and `result` with `exact_match` and `first_divergence` in its metrics,
    failing when `exact_match` is below its threshold (when one is set)."""
    for side, found in (("reference", reference), ("target", target)):
        if isinstance(found, Unavailable):
            return result, Generation(error=f"the {side}: {found.error}")
    prompts = [_continuation(prompt, ref, tgt, text, margins, thresholds, decode) for prompt, ref, tgt, text, margins
               in zip(reference.prompts, reference.tokens, target.tokens, reference.text_tokens, reference.margins,
                      strict=True)]
    cut = [(p.text_tokens, p.prompt_tokens) for p in prompts if p.text_tokens is not None]
    notes = list(result.notes)
    if cut:
        shown = ", ".join(f"{a} -> {b}" for a, b in cut[:4]) + (", ..." if len(cut) > 4 else "")
        notes.append(f"free-running: {len(cut)} of {len(prompts)} prompts cut to leave room for "
                     f"{reference.new_tokens} new tokens in the input set's sequence length (tokens "
                     f"{shown}); a lower new_tokens keeps more of each prompt")
    diverged = [p.first_divergence for p in prompts if p.first_divergence is not None]
    exact = 1.0 - len(diverged) / len(prompts) if prompts else 1.0
    metrics = {**result.metrics, "exact_match": exact, **({"first_divergence": min(diverged)} if diverged else {})}
    result = replace(result, metrics=metrics, notes=notes)
    if thresholds.exact_match is not None and exact < thresholds.exact_match:
        result = with_failure(result, f"exact match of the continuations {exact:.3g} < {thresholds.exact_match} "
                                      f"({len(diverged)} of {len(prompts)} greedy continuations of "
                                      f"{reference.new_tokens} tokens differ)")
    return result, Generation(new_tokens=reference.new_tokens, exact_match=exact, prompts=prompts)


def _continuation(prompt: list[int], ref: list[int], tgt: list[int], text_tokens: int, margins: list[float],
                  thresholds: TextGenerationThresholds, decode=None) -> GeneratedPrompt:
    """One prompt's continuations compared, made once: where they first differ, the reference's margin there and
    the tokens around it (in words with `decode`); `text_tokens` when the prompt was cut shorter than its text."""
    k = first_divergence(ref, tgt)
    fields: dict[str, Any] = {"prompt_tokens": len(prompt), "first_divergence": k}
    if text_tokens > len(prompt):
        fields["text_tokens"] = text_tokens
    if k is not None:
        context, reference, target = (prompt + ref[:k])[-CONTEXT:], ref[k:k + SHOWN], tgt[k:k + SHOWN]
        fields.update(margin=margins[k], flip="near_tie" if margins[k] <= thresholds.near_tie_margin else "real",
                      context=context, reference=reference, target=target)
        if decode is not None:
            fields["text"] = GenerationText(context=decode(context), reference=decode(reference), target=decode(target))
    return GeneratedPrompt.made(fields)


def _num(x: Any, fmt: str = ".6g") -> str:
    """A statistic as reports print it: NaN (kept as null in the records) is `nan`."""
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _pm(value: float | None, se: float | None, scale: float = 1.0, fmt: str = ".6g", unit: str = "") -> str:
    """`value ± standard error`, scaled (100: percent)."""
    return f"{_num(_scaled(value, scale), fmt)} ± {_num(_scaled(se, scale), '.2g')}{unit}"


def statistics_rows(metrics: dict[str, Any], thresholds: dict[str, Any]) -> list[tuple[str, str]]:
    """A check's statistics in llama-perplexity's words and order (its `kl_divergence` summary), Q the target and
    base the reference, from a record's metrics (`NextTokenMetrics`) and thresholds; a record written before these
    statistics shows what it has."""
    try:
        m = NextTokenMetrics.model_validate(metrics)
    except ValidationError:  # edited by hand: shown as it is
        m = None
    if m is None or "kl_mean_se" not in m.model_fields_set:  # an older record: its own metrics as they are
        return [(k, _num(v, ".4g") if isinstance(v, float) else str(v)) for k, v in metrics.items()]
    n = m.positions or 0
    rows = [("scored positions", f"{n}" + (f" (under {FEW_POSITIONS}: rough)" if n < FEW_POSITIONS else "")),
            ("PPL(reference)", _pm(m.ppl_reference, m.ppl_reference_se)),
            ("PPL(target)", _pm(m.ppl_target, m.ppl_target_se)),
            ("Cor(ln PPL(target), ln PPL(reference))", _num(_scaled(m.ln_ppl_correlation, 100), ".2f") + "%"),
            ("ln(PPL(target)/PPL(reference))", _pm(m.ln_ppl_ratio, m.ln_ppl_ratio_se)),
            ("PPL(target)/PPL(reference)", _pm(m.perplexity_ratio, m.perplexity_ratio_se)),
            ("mean KLD", _pm(m.kl_mean, m.kl_mean_se))]
    rows += [(f"{label} KLD", _num(value)) for value, label in
             ((m.kl_max, "maximum"), (m.kl_p999, "99.9%"), (m.kl_p99, "99.0%"), (m.kl_p95, "95.0%"),
              (m.kl_p90, "90.0%"), (m.kl_median, "median"))]
    rows += [("mean Δp", _pm(m.delta_p_mean, m.delta_p_mean_se, 100, ".4g", " %")),
             ("RMS Δp", _pm(m.delta_p_rms, m.delta_p_rms_se, 100, ".4g", " %"))]
    rows += [(f"{label} Δp", _num(_scaled(value, 100), ".4g") + "%") for value, label in
             ((m.delta_p_max, "maximum"), (m.delta_p_p99, "99.0%"), (m.delta_p_p95, "95.0%"),
              (m.delta_p_median, "median"), (m.delta_p_p05, "5.0%"), (m.delta_p_p01, "1.0%"),
              (m.delta_p_min, "minimum"))]
    rows.append(("same top p", _pm(m.same_top1, m.same_top1_se, 100, ".4g", " %")))
    gated = "every flip" if _judged_at(thresholds).count_near_ties else "real flips only"
    rows.append((f"top-1 agreement (judged: {gated})",
                 f"{_num(_scaled(m.top1_agreement, 100), '.4g')}% ({m.real_flips} real, "
                 f"{m.near_tie_flips} near-tie flips)"))
    return rows


def _judged_at(recorded: dict[str, Any]) -> TextGenerationThresholds:
    """The thresholds a record was judged at, as this task's own: a record written before tasks were plugins holds
    every task's (the others left out here); one that does not validate (edited by hand) reads as the defaults."""
    try:
        return TextGenerationThresholds.model_validate(
            {k: v for k, v in recorded.items() if k in TextGenerationThresholds.model_fields})
    except ValidationError:
        return TextGenerationThresholds()


def _scaled(x: Any, scale: float) -> Any:
    return None if x is None else x * scale


class TextGeneration(Task):
    name = "text-generation"
    Thresholds = TextGenerationThresholds
    reads_inputs = True
    headline = (Headline("positions"), Headline("top1_agreement", threshold="top1_agreement"),
                Headline("kl_mean", higher_is_better=False, threshold="kl_mean"),
                Headline("kl_p99", higher_is_better=False), Headline("delta_p_rms", higher_is_better=False),
                Headline("perplexity_ratio", higher_is_better=None), Headline("real_flips", higher_is_better=False),
                Headline("near_tie_flips", higher_is_better=False), Headline("exact_match", threshold="exact_match"),
                Headline("first_divergence"))

    def statistics(self, metrics, thresholds):
        return statistics_rows(metrics, thresholds or {})

    def evaluate(self, reference, target, thresholds, gate, output, inputs=None):
        return evaluate(reference, target, thresholds, gate, output, inputs)

    def follow_up(self, thresholds, output):
        return partial(follow, new_tokens=thresholds.new_tokens, leaf=output) if thresholds.new_tokens else None

    def judge_follow_ups(self, result, reference, target, thresholds, input_spec, experiment, tolerance):
        reference, target = _followed(reference), _followed(target)
        result, cached = judge_cached(result, reference.cached, target.cached, thresholds, tolerance)
        result, generation = judge_continuations(result, reference.generation, target.generation, thresholds,
                                                 _decoder(input_spec, experiment))
        return result, {"generation": generation} | ({"cached": cached} if cached is not None else {})


TASK = TextGeneration()
