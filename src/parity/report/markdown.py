"""A Markdown report rendered from the records alone: verdicts, the tolerance sweep, failures with
their worst leaves, the oracle's opinion and latency per backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.records import tolerance_key
from parity.records.summary import latency_rows
from parity.records.view import RunView
from parity.report import ReportWriter
from parity.report.console import (
    NOT_RUN,
    cosine,
    environment_line,
    flips_line,
    generation_line,
    headline_figures,
    passing_oracle_lines,
    percent,
    suspect_words,
    tolerance_lines,
    tolerance_title,
    warned,
)
from parity.report.next_steps import next_steps, oracle_side
from parity.report.statistics import statistics_tables


def _fmt(x: Any) -> str:
    if x is None:
        return "inf"
    return f"{x:.2e}" if isinstance(x, float) else str(x)


def render_markdown(records: RunView | list[dict[str, Any]], summary: dict[str, Any], run_dir: str | Path) -> str:
    view = RunView.of(records)
    checks = view.checks(1)
    keys = [tolerance_key(a) for a in summary["tolerances"]]
    t = summary["totals"]
    gate = "" if summary["gate"] is None else " " + tolerance_title(summary).removeprefix("tier 1 ")
    lines = [
        f"# parity report: {summary['experiment']}",
        "",
        f"**{t['passed']} passed, {t['failed']} failed, {t['skipped']} {NOT_RUN}"
        + (f", {t['errors']} without a verdict (reference failed)" if t["errors"] else "")
        + f"**{gate}. {summary['arithmetic']['formula']}."
        + (f" Tier 3: **{summary['tier3']['passed']} agree, {summary['tier3']['failed']} differ**."
           if summary["tier3"]["checks"] else ""),
        "",
        environment_line(view.run.environment),
        "",
        *[f"- {line}" for line in tolerance_lines(summary)],
        "",
        "Charts, tier-2 plots and detection pictures: `report.html` next to this file; CI results: `junit.xml`.",
        "",
        "## Checks",
        "",
    ]
    rows = []
    for c in checks:
        verdict = {"skipped": NOT_RUN, "error": "ERROR (reference)"}.get(c.status) or ("pass" if c.passed else "FAIL")
        worse = oracle_side(c.oracle) if c.oracle else ("no verdict" if c.oracle_error else "")
        rows.append(f"| {c.model} | {c.inputs} | {c.target} | {verdict} | {c.failure_class or ''} | "
                    f"{_fmt(c.max_abs) if c.status == 'ok' else ''} | "
                    f"{_fmt(c.required_atol) if c.status == 'ok' else ''} | {worse} |")
    lines += _table(["model", "inputs", "target", "verdict", "class", "max abs", "required atol", "oracle: farther from float64"],
                    rows, "No tier-1 checks in these records.")
    lines += ["", "## Tolerance sweep (checks passing at each atol)", ""]
    rows = []
    for target, info in summary["per_target"].items():
        ran = info["checks"] - info["skipped"] - info["errors"]
        rows.append(f"| {target} | " + " | ".join(f"{info['per_tolerance'][k]}/{ran}" for k in keys) + " |")
    lines += _table(["target", *keys], rows, "No tier-1 check ran, so there is no sweep.")
    if summary["reference_errors"]:
        lines += ["", "## Reference failures (no verdict about the targets)", ""]
        for e in summary["reference_errors"]:
            why = ("the model as written raised on these inputs: fix the model or the input set" if e["user_error"]
                   else "the reference could not run")
            lines.append(f"- **{e['model']} / {e['inputs']}**: {why}; targets not run: {', '.join(e['targets'])}. "
                         f"{e['detail']}")
    failed = view.failed(1)
    if failed:
        lines += ["", "## Failures", ""]
        for c in failed:
            lines.append(f"- **{view.key(c)}**: `{c.failure_class}`: {c.detail}")
            lines += [f"  - {line.split(': ', 1)[0]}: `{line.split(': ', 1)[1]}`" if line.startswith("next: ")
                      else f"  - {line}" for line in next_steps(c, view, run_dir)]
            for leaf in view.worst_leaves(c, 5):
                lines.append(f"  - `{leaf.name}`: max abs {_fmt(leaf.max_abs)}, max rel {_fmt(leaf.max_rel)}, "
                             f"cosine {cosine(leaf.cosine)}, mismatched {percent(leaf.mismatch_fraction)}"
                             + (f" ({leaf.detail})" if leaf.detail else ""))
    notes = passing_oracle_lines(view)
    if notes:
        lines += ["", "## The float64 oracle on passing checks", ""]
        lines += [f"- **{', '.join(keys)}**: {line}" for line, keys in notes.items()]
    tier3 = view.checks(3)
    if tier3:
        lines += ["", "## Task-level agreement (tier 3)", "", "| model | inputs | target | task | verdict | metrics |",
                  "|---|---|---|---|---|---|"]
        for c in tier3:
            metrics = headline_figures(c)
            flips = flips_line(c) or generation_line(c)
            verdict = ("agrees" if c.passed else f"{c.failure_class}: {c.detail}")
            verdict = "; ".join([verdict, *([flips] if flips else []), *(c.notes or ())]).replace("|", "\\|")
            lines.append(f"| {c.model} | {c.inputs} | {c.target} | {c.task} | {verdict} | {metrics} |")
        for stats in statistics_tables(tier3):
            lines += ["", f"### {stats.model} / {stats.inputs}: {stats.task} statistics", ""]
            cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731
            lines += _table(["statistic", *map(cell, stats.targets)],
                            [f"| {cell(name)} | " + " | ".join(map(cell, values)) + " |" for name, values in stats.rows],
                            "")
    layers = view.layers
    if layers:
        lines += ["", "## Where the failing checks diverge (tier 2)", ""]
        for r in layers:
            head = f"- **{view.key(r)}**: "
            if r.error:
                lines.append(head + f"localization failed: {r.error}")
                continue
            path = " > ".join(level.parent for level in r.levels if level.parent)
            lines.append(head + r.verdict + (f" (descent: {path})" if path else ""))
            if r.whole_graph:
                lines.append("  - whole graph: no layer's own error exceeds the threshold "
                             f"{r.threshold:g}; the drift is not one layer's")
            if r.suspects:
                lines.append("  - suspects: " + "; ".join(suspect_words(s, r.threshold) for s in r.suspects))
            if r.first_divergent:
                which = "propagated" if r.first_divergent_by == "propagated" else "own"
                lines.append(f"  - first layer whose {which} error exceeds the threshold: `{r.first_divergent}`")
    if warned(checks):
        lines += ["", "## What the targets warned of", "",
                  "A trace that took one branch of a data-dependent `if` is right only for inputs that take the same "
                  "branch, whatever this run's verdict.", ""]
        for c, notes in warned(checks):
            lines += [f"- **{view.key(c)}** ({'pass' if c.passed else 'FAIL'}): {n}"
                      for n in notes]
    skipped = {c.target: c.detail for c in checks if c.status == "skipped"}
    if skipped:
        lines += ["", "## Targets not run here", ""] + [f"- {t}: {why}" for t, why in skipped.items()]
    latency = latency_rows(view)
    lines += ["", "## Latency per model, input set and backend", "",
              "Timed repeats only (the warm-up runs before them are not timed); prepare (export, compile, load) apart."
              + _interleaving(latency), ""]
    rows = []
    for row in latency:
        if row["median_s"] is None:
            rows.append(f"| {row['model']} | {row['inputs']} | {row['backend']} | {row['status']} | | | | |")
            continue
        prepare = "" if row["prepare_s"] is None else f"{row['prepare_s']:.2f}"
        rows.append(f"| {row['model']} | {row['inputs']} | {row['backend']} | {len(row['run_s'])} | {row['median_s']:.4f} | "
                    f"{row['min_s']:.4f} | {row['max_s']:.4f} | {prepare} |")
    lines += _table(["model", "inputs", "backend", "repeats", "median run s", "min", "max", "prepare s"], rows,
                    "No execution records in this run.")
    return "\n".join(lines) + "\n"


def _table(columns: list[str], rows: list[str], empty: str) -> list[str]:
    """A Markdown table, or the one line `empty` when it has no rows: never a header over nothing."""
    if not rows:
        return [empty]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows]


def write_markdown(records: RunView | list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    from parity.outdir import write_text

    write_text(path, render_markdown(records, summary, path.parent))  # whole or not at all


WRITER = ReportWriter("markdown", "report.md", write_markdown)


def _interleaving(latency: list[dict]) -> str:
    """How the backends were timed: in turns (the local executor), or each alone (the process and ray executors,
    or a backend alone in its turn), as the execution records say."""
    alone = [f"{r['model']}/{r['inputs']}/{r['backend']}" for r in latency if r["interleaved"] is False]
    if any(r["interleaved"] for r in latency):
        return (" The backends of each model and input set took turns (interleaved)"
                + (f", except {', '.join(alone)}, timed alone." if alone else "."))
    return " Each backend was timed alone, one after the other: compare them only from a quiet machine." if alone else ""
