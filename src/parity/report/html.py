"""The HTML report: one self-contained file (inline CSS, charts and pictures as `data:` URIs, no script,
nothing fetched), rendered from the records alone with the jinja2 template next to this module.

This module turns records into the template's rows and figures; the template only lays them out. Every
section is always there: one without data says so in a line.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import partial
from importlib.resources import files
from pathlib import Path
from typing import Any

from parity.config.tolerances import rounded_up
from parity.errors import visible
from parity.outdir import write_text
from parity.plugins import TASKS
from parity.records import tolerance_key
from parity.records.models import CpuInfo, DetectionPictures, Layers, Run, Tier1Check, Tier3Check
from parity.records.summary import Summary, latency_rows
from parity.records.view import RunView
from parity.report import ReportWriter, pictures, plots
from parity.report.next_steps import next_steps
from parity.report.statistics import kld_counts, statistics_tables
from parity.report.wording import (
    cached_line,
    cosine,
    describe_note,
    figure,
    flips_line,
    generation_line,
    group_rows,
    passing_oracle_lines,
    percent,
    scientific,
    suspect_words,
    target_tolerance,
    tolerance_lines,
    tolerance_title,
)
from parity.taxonomy import MEANINGS, SEVERITY
from parity.verify.tasks import headline_of, statistics_of

PICTURED_IMAGES = 4  # images drawn per detection check; the rest are counted, not drawn

SECTIONS = [  # (id, title): the order of the page and of its navigation bar
    ("summary", "Summary"),
    ("environment", "Environment"),
    ("gate", "Checks at the gate"),
    ("heatmap", "Pass rate"),
    ("sweep", "Tolerance sweep"),
    ("taxonomy", "Failure taxonomy"),
    ("latency", "Latency"),
    ("tier2", "Where it diverges (tier 2)"),
    ("tier3", "Task metrics (tier 3)"),
    ("detections", "Detection boxes"),
]


def _atol(x: Any) -> str:
    """A required atol, to 3 digits and rounded up (config.tolerances.rounded_up), so that it never reads as
    passing an atol of the sweep that the check fails: 1.04e-4 is "1.04e-04", never "1.0e-04"."""
    return scientific(rounded_up(x), 3) if isinstance(x, float) and not isinstance(x, bool) else scientific(x)


def _seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


_key = RunView.key


def _environment(run: Run) -> list[tuple[str, str]]:
    env = run.environment
    cpu = env.cpu or CpuInfo()
    libraries = env.libraries if env.libraries is not None else (
        "torch", "torchvision", "onnx", "onnxruntime", "openvino", "numpy")  # older records
    rows = [(name, env.version(name)) for name in ("python", "platform", "parity", *libraries)]
    shown = next((x for x in (cpu.model, cpu.machine) if x is not None), "?")
    rows += [
        ("cpu", f"{shown}, {cpu.count if cpu.count is not None else '?'} cores"
                + (f"; {' '.join(cpu.flags)}" if cpu.flags else "")),
        ("threads", env.threads),
        ("cuda", f"{env.cuda.version}: {', '.join(env.cuda.devices)}" if env.cuda else "none"),
        ("git commit", env.git_commit),
        ("experiment folder", run.base_dir),
    ]
    return [(k, "not installed" if v is None and k in libraries else str(v if v is not None else "–")) for k, v in rows]


def _setup(run: Run, summary: Summary) -> list[tuple[str, str]]:
    setting = run.config.setting
    ref = [setting("reference", key, default="?") for key in ("backend", "device", "dtype")]
    return [
        ("reference", "{} on {}, {}".format(*ref)),
        ("gate", "–" if summary.gate is None else tolerance_title(summary).removeprefix("tier 1 ")),
        *[("tolerance", line.removeprefix("tolerance ")) for line in tolerance_lines(summary) if line.startswith("tolerance ")],
        *[(kind, line.removeprefix(kind + " ")) for line in tolerance_lines(summary)
          for kind in ("noise floor", "output rules") if line.startswith(kind + " ")],
        ("tolerance sweep", ", ".join(f"{a:g}" for a in summary.tolerances)),
        ("repeats", str(setting("repeats", default="?"))),
        ("seed", str(setting("seed", default="?"))),
        ("oracle (eager float64)", "on" if setting("oracle", "enabled") else "off"),
        ("tier 2 (localize failures)", "on" if setting("tiers", "activations", "enabled") else "off"),
        ("tier 3 (task metrics)", "on" if setting("tiers", "tasks", "enabled") else "off"),
    ]


def _gates(summary: Summary) -> dict[float, list[str]]:
    """Each gate the targets are judged at, with its targets: the sweep chart marks every one."""
    gates: dict[float, list[str]] = {}
    for target, info in summary.per_target.items():
        gates.setdefault(info.gate, []).append(target)
    return gates


def _gate_table(checks: list[Tier1Check], tier3: list[Tier3Check], layers: list[Layers],
                targets: list[str]) -> list[dict]:
    """Rows (model, input set), one cell per target: the tier-1 verdict at the gate and its numbers."""
    tier3_by = {_key(c): c for c in tier3}
    culprit_by = {_key(r): r.culprit for r in layers if not r.error}
    whole_graph = {_key(r) for r in layers if r.whole_graph}
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for c in checks:
        state = {"skipped": "skip", "error": "error"}.get(c.status) or ("pass" if c.passed else "fail")
        task = tier3_by.get(_key(c))
        cells.setdefault((c.model, c.inputs), {})[c.target] = {
            "state": state, "max_abs": c.max_abs, "required_atol": c.required_atol,
            "failure_class": c.failure_class, "detail": c.detail or "",
            "whole_graph": _key(c) in whole_graph,
            "tier3": None if task is None else ("agrees" if task.passed else task.failure_class),
            "culprit": culprit_by.get(_key(c)),
            "warnings": [describe_note(n) for n in c.warnings or []],
            "ran": c.status == "ok" and c.max_abs is not None,
        }
    return [{"model": model, "inputs": inputs, "cells": [mine.get(t) for t in targets]}
            for (model, inputs), mine in cells.items()]


def _pass_rates(checks: list[Tier1Check], keys: list[str]) -> tuple[list[str], dict[tuple[str, str], float | None]]:
    """Per model and target: the share of verdicts that pass, over every tolerance and input set."""
    passed: dict[tuple[str, str], int] = Counter()
    total: dict[tuple[str, str], int] = Counter()
    models = list(dict.fromkeys(c.model for c in checks))
    for c in checks:
        cell = (c.model, c.target)
        total.setdefault(cell, 0)
        if c.status != "ok":
            continue
        passed[cell] += sum(bool(c.verdicts.get(k)) for k in keys)
        total[cell] += len(keys)
    return models, {cell: (passed[cell] / n if n else None) for cell, n in total.items()}


def _failures(view: RunView, run_dir: str | Path) -> list[dict[str, Any]]:
    out = []
    for c in view.failures():
        worst = view.worst_leaves(c, 5)
        out.append({"key": _key(c), "tier": c.tier, "failure_class": c.failure_class, "detail": c.detail or "",
                    "next": next_steps(c, view, run_dir),
                    "leaves": [{"name": leaf.name, "failure_class": leaf.failure_class,
                                "max_abs": scientific(leaf.max_abs), "max_rel": scientific(leaf.max_rel),
                                "cosine": cosine(leaf.cosine, none="–"), "mismatch": percent(leaf.mismatch_fraction, none="–"),
                                "detail": leaf.detail or ""} for leaf in worst]})
    return out


def _taxonomy(checks: list[Tier1Check], tier3: list[Tier3Check]) -> tuple[list[dict], str | None]:
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    for c in [*checks, *tier3]:
        if c.status == "ok" and not c.passed and c.failure_class:
            counts[c.failure_class][c.tier] = counts[c.failure_class].get(c.tier, 0) + 1
    ordered = sorted(counts, key=lambda k: SEVERITY.index(k) if k in SEVERITY else len(SEVERITY))
    rows = [{"name": k, "meaning": MEANINGS.get(k, ""), "tier1": counts[k].get(1, 0), "tier3": counts[k].get(3, 0)}
            for k in ordered]
    return rows, plots.taxonomy_bars({k: counts[k] for k in ordered}) if rows else None


@dataclass(frozen=True)
class _Column:
    """A metric's column of a tier-3 table: its threshold, if it has one, and which side of it fails."""

    name: str
    threshold: Any = None
    higher_is_better: bool = True

    @property
    def title(self) -> str:
        return self.name.replace("_", " ")


def _column(task: str, metric: str, thresholds: dict[str, Any]) -> _Column:
    """The column of `metric` with its threshold in a tier-3 record, from the task's headline metrics (a record of
    the old flat thresholds names them as the task's `flat_keys` did). A task that is not installed here: no
    thresholds shown."""
    headline = {h.metric: h for h in headline_of(task) or ()}
    h = headline.get(metric)
    if h is None or h.threshold is None or h.higher_is_better is None:
        return _Column(metric)
    flat = {own: old for old, own in TASKS.get(task).flat_keys.items()}
    value = thresholds.get(h.threshold, thresholds.get(flat.get(h.threshold, "")))
    return _Column(metric, value, h.higher_is_better)


def _tier3_tables(tier3: list[Tier3Check]) -> list[dict[str, Any]]:
    """One table per task: rows checks, columns the metrics, each metric with its threshold if it has one."""
    tables = []
    for task in dict.fromkeys(c.task for c in tier3):
        mine = [c for c in tier3 if c.task == task]
        metrics = list(dict.fromkeys(k for c in mine for k in c.metrics))
        if statistics_of(task, mine[0].metrics, mine[0].thresholds):  # the rest: in its statistics table
            headline = [h.metric for h in headline_of(task) or ()]
            metrics = [k for k in headline if k in metrics] or metrics
        columns = [_column(task, m, mine[0].thresholds or {}) for m in metrics]
        rows = []
        for c in mine:
            cells = []
            for col in columns:
                value = c.metrics.get(col.name)
                low = col.threshold is not None and isinstance(value, int | float) and (
                    value < col.threshold if col.higher_is_better else value > col.threshold)
                cells.append({"text": figure(value, none="nan" if col.name in c.metrics else "–"),
                              "low": low})
            rows.append({"key": _key(c), "passed": c.passed, "failure_class": c.failure_class,
                         "detail": c.detail or "", "same_set": c.same_set, "cells": cells, "flips": flips_line(c) or generation_line(c),
                         "cached": cached_line(c), "notes": c.notes or []})
        tables.append({"task": task, "columns": columns, "rows": rows})
    return tables


def _statistics(tier3: list[Tier3Check]) -> list[dict[str, Any]]:
    """The tier-3 statistics tables (report/statistics.py), each with a picture of every target's KL distribution
    when its records keep one."""
    out = []
    for t in statistics_tables(tier3):
        drawn = [(c.target, kld_counts(c)) for c in t.checks]
        out.append({"title": f"{t.model} / {t.inputs}: {t.task}", "targets": t.targets, "rows": t.rows,
                    "pictures": [{"target": target, "uri": plots.kld_histogram(*counts, target)}
                                 for target, counts in drawn if counts]})
    return out


def _tier2(layers: list[Layers]) -> list[dict[str, Any]]:
    out = []
    for r in layers:
        entry = {"key": _key(r), "error": r.error}
        if not r.error:
            entry.update(
                verdict=r.verdict, mode=r.mode, threshold=r.threshold,
                descent=" › ".join(level.parent for level in r.levels if level.parent),
                suspects=[suspect_words(s, r.threshold) for s in r.suspects],
                first_divergent=r.first_divergent, whole_graph=r.whole_graph,
                first_divergent_by="propagated" if r.first_divergent_by == "propagated" else "own",
                skipped=r.skipped or [],
                elapsed=_seconds(r.elapsed_s), plot=plots.depth_plot(r),
                groups=group_rows(r) if r.tensor_groups else [],
            )
        out.append(entry)
    return out


def _detections(tier3: list[Tier3Check]) -> list[dict[str, Any]]:
    out = []
    for c in tier3:
        if not c.pictures:
            continue
        try:  # as recorded (maybe edited by hand): a mapping that is not a detection's pictures says why here
            pics = c.pictures if isinstance(c.pictures, DetectionPictures) else DetectionPictures.model_validate(c.pictures)
            drawn = []
            for i, image in enumerate(pics.images[:PICTURED_IMAGES]):
                uri, note = pictures.side_by_side(pics, i, c.target)
                drawn.append({"label": pictures.image_label(image), "uri": uri, "note": note})
            more = max(0, len(pics.images) - PICTURED_IMAGES)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:  # a record edited by hand
            drawn, more = [{"label": "not drawn", "uri": None, "note": f"this check's pictures cannot be drawn "
                            f"(records edited by hand?): {type(exc).__name__}: {exc}"[:300]}], 0
        out.append({"key": _key(c), "passed": c.passed, "failure_class": c.failure_class,
                    "flips": flips_line(c), "metrics": c.metrics, "images": drawn, "more": more})
    return out


def _latency(records: RunView) -> tuple[list[dict], str | None]:
    rows = latency_rows(records)
    table = [{**r.model_dump(), "median": _seconds(r.median_s), "min": _seconds(r.min_s), "max": _seconds(r.max_s),
              "prepare": _seconds(r.prepare_s), "repeats": len(r.run_s),
              "spread": f"{(r.max_s - r.min_s) / r.median_s:.0%}" if r.median_s else "–"}
             for r in rows]
    timed = [r for r in rows if r.run_s or r.prepare_s]
    return table, plots.latency_chart(timed) if timed else None


def render_html(records: RunView | list[dict[str, Any]], summary: Summary, run_dir: str | Path) -> str:
    """The whole page as one string."""
    import jinja2

    view = RunView.of(records)
    run, checks, tier3, layers = view.run, view.checks(1), view.checks(3), view.layers
    targets = list(summary.per_target)
    keys = [tolerance_key(a) for a in summary.tolerances]

    models, rates = _pass_rates(checks, keys)
    sweep_rows = []
    curves: dict[str, list[float]] = {}
    for target, info in summary.per_target.items():
        ran = info.checks - info.skipped - info.errors
        sweep_rows.append({"target": target, "cells": [f"{info.per_tolerance[k]}/{ran}" for k in keys] if ran else []})
        if ran:
            curves[target] = [info.per_tolerance[k] / ran for k in keys]
    taxonomy_rows, taxonomy_plot = _taxonomy(checks, tier3)
    latency_table, latency_plot = _latency(view)
    totals, tier3_totals = summary.totals, summary.tier3
    context = {
        "title": f"parity report: {summary.experiment}",
        "experiment": summary.experiment,
        # the navigation bar leads only to what the run has: no empty tier 2, tier 3 or detection sections
        "sections": [(i, title) for i, title in SECTIONS if {
            "tier2": bool(layers), "tier3": bool(tier3), "detections": any(c.task == "detection" for c in tier3),
        }.get(i, True)],
        "totals": totals,
        "tier3_totals": tier3_totals,
        "localized": len(layers),
        "arithmetic": summary.arithmetic.formula,
        "verdict": ("no checks in these records" if not totals.checks else
                    "every check passed at the gate"
                    if not (totals.failed or totals.skipped or totals.errors or tier3_totals.failed)
                    else f"{totals.failed + tier3_totals.failed} check(s) failed"
                    + (f", {totals.skipped} not run here" if totals.skipped else "")
                    + (f", {totals.errors} without a verdict (the reference failed)" if totals.errors else "")),
        "ok": bool(totals.checks) and not (totals.failed or tier3_totals.failed or totals.skipped or totals.errors),
        "reference_errors": summary.reference_errors,
        "setup": _setup(run, summary),
        "environment": _environment(run),
        "targets": targets,
        "gate": None if summary.gate is None else tolerance_title(summary).removeprefix("tier 1 "),
        "target_tolerances": [target_tolerance(summary.per_target[t]) for t in targets],
        "gate_rows": _gate_table(checks, tier3, layers, targets),
        "unavailable": [(t, info.reason) for t, info in summary.per_target.items() if info.skipped],
        "heatmap": plots.pass_rate_heatmap(models, targets, rates) if checks else None,
        "tolerance_keys": [f"{a:g}" for a in summary.tolerances],
        "sweep_rows": sweep_rows,
        "sweep": plots.sweep_curve(summary.tolerances, curves, _gates(summary)) if curves else None,
        "taxonomy_rows": taxonomy_rows,
        "taxonomy_plot": taxonomy_plot,
        "failures": _failures(view, run_dir),
        "oracle_notes": list(passing_oracle_lines(view).items()),
        "latency_rows": latency_table,
        "latency_plot": latency_plot,
        "tier2": _tier2(layers),
        "tier3_tables": _tier3_tables(tier3),
        "statistics": _statistics(tier3),
        "detections": _detections(tier3),
        "detection_models": [c for c in tier3 if c.task == "detection"],
        "parity_version": run.environment.parity,
    }
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=_shown)
    env.filters.update(sci=scientific, atol=_atol, num=partial(figure, none="–"), seconds=_seconds)
    template = env.from_string((files("parity.report") / "report.html.j2").read_text(encoding="utf-8"))
    return template.render(**context)


def _shown(value: Any) -> Any:
    """Every text the template prints with its control characters shown (errors.visible); markup parity made
    (a chart's SVG) as it is."""
    import markupsafe

    return visible(value) if isinstance(value, str) and not isinstance(value, markupsafe.Markup) else value


def write_html(records: list[dict], summary: Summary, path: Path) -> None:
    write_text(path, render_html(records, summary, path.parent))  # whole or not at all


WRITER = ReportWriter("html", "report.html", write_html)
