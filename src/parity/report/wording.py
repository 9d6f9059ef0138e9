"""The words and numbers every report shares (the console's table, report.md, report.html, junit.xml): how a
number, a share, a cosine and a metric are written, what a tolerance, a note, a flip, a generation, a suspect
layer and the environment are called. One home, so that the reports never say one thing two ways."""

from __future__ import annotations

import math
from typing import Any

from parity.dtypes import QUANTIZE_SCHEMES
from parity.records import tolerance_key
from parity.records.models import (
    CacheComparison,
    CachedMetrics,
    Check,
    CpuInfo,
    Environment,
    GenerationText,
    LayerError,
    Layers,
    Note,
    Tier1Check,
    Tier3Check,
)
from parity.records.summary import Summary, TargetTotals
from parity.records.view import RunView
from parity.report.next_steps import oracle_finding
from parity.verify.localize import against_threshold
from parity.verify.tasks import headline_of

NOT_RUN = "not run here"  # a target that cannot run on this machine: the one name every view gives that state


def tolerance_title(summary: Summary) -> str:
    """`tier 1 at atol=.., rtol=..` when every target shares one tolerance, else where to read each."""
    if summary.gate is None:
        return "tier 1"
    if summary.uniform_tolerance:
        first = next(iter(summary.per_target.values()), None)
        gate, rtol = (first.gate, first.rtol) if first else (summary.gate, summary.rtol)
        by = " (gate: tier 3)" if first and first.gated_by == "tier3" else ""
        return f"tier 1 at atol={gate:g}, rtol={rtol:g}{by}"
    return "tier 1, each target at its own tolerance"


def tolerance_lines(summary: Summary) -> list[str]:
    """Where targets are judged at different tolerances, one line per tolerance with the targets judged at it
    (else one per target judged at other than the experiment's); then the output rules, and one line per noise
    floor the checks show (the reference's own error, at each target's rtol), with the targets it concerns."""
    shared, rules, floors = {}, [], {}
    for target, info in summary.per_target.items():
        source = info.tolerance_source
        if not summary.uniform_tolerance or source != "experiment" or info.gated_by == "tier3":
            shared.setdefault((info.gate, info.rtol, source, info.gated_by), []).append(target)
        if info.output_rules:
            rules.append(f"output rules {target}: {'; '.join(info.output_rules)} (the leaves they matched)")
        floor = info.noise_floor
        if floor and floor.atol > 0:
            floors.setdefault((floor.atol, floor.source), []).append(target)
    lines = [f"tolerance {', '.join(targets)}: {_gate_words(gate, source)}, rtol {rtol:g} ({source})"
             + ("; tier 3 decides the verdict (gate: tier3)" if gated_by == "tier3" else "")
             + _at_float_gate(summary, targets, source)
             for (gate, rtol, source, gated_by), targets in shared.items()]
    for (atol, source), targets in floors.items():
        rules.append(f"noise floor {', '.join(targets)}: atol {atol:.2g} is within the reference's own error "
                     f"({source}): a gate below it judges the reference's rounding, not the target")
    return lines + rules


def _scheme_of(source: str):
    """The quantize scheme whose default a `tolerance_source` names (`default-for-int8-weight`), else None."""
    return next((s for s in QUANTIZE_SCHEMES.values() if source == f"default-for-{s.word}"), None)


def _gate_words(gate: float, source: str) -> str:
    """`atol 1e-05`; a quantized target's scale-aware default says its rule and the first check's atol."""
    scheme = _scheme_of(source)
    if scheme is None:
        return f"atol {gate:g}"
    return f"atol {scheme.relative_gate:g} x the reference output's rms (each check's own; {gate:.3g} on the first)"


def _at_float_gate(summary: Summary, targets: list[str], source: str) -> str:
    """For targets at a quantized default: how their checks fare at the experiment's (float32's) gate, which the
    sweep still holds."""
    gate = summary.gate
    key = tolerance_key(gate) if gate is not None else None
    if _scheme_of(source) is None or key not in summary.per_target[targets[0]].per_tolerance:
        return ""
    mine = [summary.per_target[t] for t in targets]
    passed = sum(info.per_tolerance[key] for info in mine)
    judged = sum(info.passed + info.failed for info in mine)
    return f"; at the experiment's gate {gate:g}: {passed}/{judged} pass"


def target_tolerance(info: TargetTotals) -> str:
    """A target's tolerance as the tables head its column with: `atol 1e-05, rtol 0.016`."""
    return f"atol {info.gate:g}, rtol {info.rtol:g}"


def environment_line(env: Environment) -> str:
    """One line for what the numbers depend on: the recorded libraries' versions, python, CPU, threads, CUDA.
    Records written before the runner chose the libraries have no `libraries`: torch, torchvision, onnxruntime."""
    libraries = env.libraries if env.libraries is not None else ("torch", "torchvision", "onnxruntime")
    versions = ", ".join(f"{name} {env.version(name)}" for name in libraries)
    cpu = env.cpu or CpuInfo()
    shown = cpu.model if cpu.model is not None else cpu.machine
    return (f"{versions}, python {env.python}, {shown}, {env.threads} threads, "
            f"CUDA: {env.cuda.devices if env.cuda else 'none'}")


def describe_note(note: Note) -> str:
    """One line for what a backend warned of: `trace_specialized: "if x.mean() > 0:" at model.py:12`."""
    where = f" at {note.where}" if note.where else ""
    what = f'"{note.code}"' if note.code else note.message
    count = f" ({note.count}x)" if (note.count or 1) > 1 else ""
    return f"{note.kind}: {what}{where}{count}"


def warned(checks: list[Tier1Check]) -> list[tuple[Tier1Check, list[str]]]:
    """The checks whose target warned while it prepared or ran (a trace fixed to one branch, a graph
    break), each with its lines, whatever the check's verdict: a pass can rest on such a trace."""
    return [(c, [describe_note(n) for n in c.warnings]) for c in checks if c.warnings]


def passing_oracle_lines(view: RunView) -> dict[str, list[str]]:
    """What the float64 oracle says of passing checks (a target much farther from float64, or why it has no
    verdict), each line once with the checks it concerns: an oracle that could not run says so once per job."""
    lines: dict[str, list[str]] = {}
    for c in view.checks(1):
        if c.status == "ok" and c.passed:
            for line in oracle_finding(c.oracle, c.passed, c.oracle_error):
                lines.setdefault(line, []).append(view.key(c))
    return lines


def headline_figures(check: Tier3Check) -> str:
    """A tier-3 check's figures for the console: its task's headline metrics, or every metric the record
    has when the task is not installed here (reports render from the records alone)."""
    m = check.metrics
    headline = headline_of(check.task)
    shown = [h.metric for h in headline] if headline is not None else list(m)
    return ", ".join(f"{k} {figure(m[k])}" for k in shown if k in m)


def flips_line(check: Check) -> str | None:
    """A detection check's unmatched boxes by mechanism, in words ('flips: 2 tie_order, 1
    score_threshold (from the post-processing inputs of both sides)'), or None when the record has none."""
    flips = getattr(check, "flips", None)  # tier 3 only
    if not flips:
        return None
    counts = ", ".join(f"{n} {mechanism}" for mechanism, n in flips.counts.items()) or "none"
    source = ("the post-processing inputs of both sides" if flips.candidates == "both"
              else "the outputs alone: a side has no captured post-processing inputs")
    return f"flips: {counts} (from {source})"


def generation_line(check: Tier3Check) -> str | None:
    """A text-generation check's free-running continuations in words (how many match, and the earliest divergence
    with the tokens around it), or None when the record has none."""
    gen = check.generation
    if gen is None:
        return None
    if gen.error:
        return f"free-running: not compared ({gen.error})"
    prompts = gen.prompts or []
    line = (f"free-running: {sum(p.first_divergence is None for p in prompts)} of {len(prompts)} continuations of "
            f"{gen.new_tokens} tokens match exactly")
    diverged = [(p.first_divergence, i) for i, p in enumerate(prompts) if p.first_divergence is not None]
    if diverged:
        k, i = min(diverged)
        p = prompts[i]
        words = p.text or GenerationText(context=str(p.context), reference=str(p.reference), target=str(p.target))
        line += (f"; first divergence: prompt {i} at new token {k}, after '{words.context}': reference "
                 f"'{words.reference}', target '{words.target}' (reference margin {p.margin:.3g}, {p.flip})")
    return line


def cached_line(check: Tier3Check) -> str | None:
    """A text-generation check's cached decoding in words (its verdict, the target against the reference and the
    reference against its own uncached forward), or None when the record has none."""
    c = check.cached
    if c is None:
        return None
    if c.error:
        return f"cached decoding: not compared ({f'{c.failure_class}: ' if c.failure_class else ''}{c.error})"
    nothing = CachedMetrics()

    def compared(m: CachedMetrics | None) -> str:
        m = m or nothing
        flipped = f", first flip at step {m.first_flip}" if m.first_flip is not None else ""
        kl = m.kl_mean if m.kl_mean is not None else math.nan
        return f"mean KL {kl:.3g}, top-1 {percent(m.top1_agreement)}{flipped}"

    verdict = "agrees" if c.passed else f"fails ({c.side})"
    cache = "" if c.passed or c.cache is None else f"; {cache_words(c.cache)}"
    return (f"cached decoding, {c.steps} steps after a {c.prompt_tokens}-token prompt: {verdict}; target vs reference: "
            f"{compared(c.target)}; reference cached vs uncached: {compared(c.reference_self)}; target cached vs "
            f"uncached: {compared(c.target_self)}{cache}")


def cache_words(cache: CacheComparison) -> str:
    """Where the target's KV cache first differs from the reference's, in words (a failed cached decoding says it):
    "its cache first differs at layer 0's keys (values agree)". A layer's keys and values are made from that layer's
    input, so the words say the cause may lie before it: a wrong attention in layer 0 leaves layer 0's cache equal and
    shows first in layer 1's."""
    if cache.error:
        return f"its cache: not compared ({cache.error})"
    if cache.first_layer is None:
        return f"its cache agrees at every layer ({len(cache.layers or ())}, keys and values)"
    parts = cache.first_parts or []
    where = " and ".join(parts)
    agree = next((f" ({part} agree)" for part in ("keys", "values") if part not in parts), "")
    before = " or before it" if cache.first_layer else " or the embedding"
    return (f"its cache first differs at layer {cache.first_layer}'s {where}{agree}: made from that layer's input, so "
            f"the cause is in its key/value path{before}")


def group_rows(record: Layers) -> list[tuple[str, ...]]:
    """A tensor-group localization's rows (runner/tensor_types.py), worst block first, each split block's attention
    and FFN under it: group, its type in the target's file, mean KLD ± SE alone at that type, the KLD it adds over
    the all-F16 floor and its share, same top-1."""
    rows = record.tensor_groups.groups
    out = []
    for row in sorted((r for r in rows if r.parent is None), key=lambda r: -r.kl_added):
        for r in [row, *(r for r in rows if r.parent == row.name)]:
            share = "" if r.share is None or r.parent else f"{r.share:.1%}"
            out.append(("  " * bool(r.parent) + r.name, r.type, f"{r.kl_mean:.4g} ± {r.kl_mean_se:.2g}",
                        f"{r.kl_added:.3g}", share, f"{r.same_top1:.2%}"))
    return out


def suspect_words(suspect: LayerError, threshold: float) -> str:
    """A suspect layer with the number that made it one: `layer1 (required atol 3.10e-04 > threshold 0.0001, ...)`."""
    return f"{suspect.name} ({against_threshold(suspect.required_atol, threshold, suspect.rel_rmse, suspect.max_abs)})"


def figure(x: Any, none: str = "nan") -> str:
    """A metric as every report prints it: a float to 4 significant digits, an integer whole, and a NaN (null in
    the records) as `nan`; `none` for a cell that has no value at all."""
    if x is None:
        return none
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    return str(x) if isinstance(x, int) else f"{x:.4g}"


def percent(share: float | None, none: str = "-") -> str:
    """A share (a fraction, as records keep it) as a reader reads it: 0.138 -> '13.8%', 1e-06 -> '0.0001%'."""
    return none if share is None else f"{100 * share:.3g}%"


def cosine(x: Any, none: str = "-") -> str:
    """Cosine similarity shows its distance from 1, where the information is: 0.9999871 -> 1 - 1.3e-05 (a
    cosine of 1.00e+00 beside 59.8% mismatched elements would say nothing); in every report alike."""
    if x is None:
        return none
    if not isinstance(x, int | float) or isinstance(x, bool):
        return str(x)
    return "1" if x == 1 else (f"1 − {1 - x:.1e}" if 0 < 1 - x < 1e-3 else f"{x:.4f}")


def number(x: Any, fmt: str = ".2e", none: str = "-") -> str:
    """A measured difference in a fixed format (`.2e`; a layer's SQNR `.1f`), `none` where there is none: a
    required atol that no atol reaches reads `inf` in report.md."""
    return none if x is None else format(x, fmt)


def scientific(x: Any, digits: int = 2, none: str = "–") -> str:
    """A number to `digits` significant digits in scientific notation (report.html's leaves and atols); 0 as `0`."""
    if x is None:
        return none
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    return "0" if x == 0 else f"{x:.{digits - 1}e}"
