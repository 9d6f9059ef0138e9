"""A Markdown report rendered from the records alone: verdicts, the tolerance sweep, failures with
their worst leaves, the oracle's opinion and latency per backend.

report.md is pasted into pull requests and issue trackers, and the names and texts in it come from files
(a model's output keys, an .onnx output name, a runtime's error quoting an op type, a records.jsonl written
by anyone): every one goes through `md` (Markdown and HTML characters backslash-escaped) or `md_code` (a code
span whose fence no backtick inside can close), both after errors.visible, so a CommonMark render holds no
element parity did not write and no table cell splits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parity.errors import visible
from parity.outdir import write_text
from parity.records import tolerance_key
from parity.records.summary import LatencyRow, Summary, latency_rows
from parity.records.view import RunView
from parity.report import ReportWriter
from parity.report.next_steps import next_steps, oracle_side
from parity.report.statistics import statistics_tables
from parity.report.wording import (
    NOT_RUN,
    cached_line,
    cosine,
    environment_line,
    flips_line,
    generation_line,
    group_rows,
    headline_figures,
    number,
    passing_oracle_lines,
    percent,
    suspect_words,
    tolerance_lines,
    tolerance_title,
    warned,
)

# What could start an element or end a table cell inside a line: emphasis, code, links and images, raw HTML
# and entities, autolinks, strikethrough, maths, table pipes, and the backslash itself (an underscore only
# where it could open or close emphasis). CommonMark lets a
# backslash escape any ASCII punctuation, and a line never starts with a name, so block syntax cannot arise.
_ACTIVE = re.compile(r"([\\`*\[\]<>&|~$!#])")
_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")  # one between two letters or digits opens no emphasis


def md(text: Any) -> str:
    """`text` as inert Markdown, fit for a table cell: control characters shown, active characters escaped."""
    return _UNDERSCORE.sub(r"\\_", _ACTIVE.sub(r"\\\1", visible(str(text))))


def md_code(text: Any) -> str:
    """`text` as one code span: a fence longer than any run of backticks inside it, padded when the text
    starts or ends with one (CommonMark strips one space each side). Not for table cells: a pipe would split."""
    shown = visible(str(text))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", shown)), default=0) + 1)
    pad = " " if shown.startswith(("`", " ")) or shown.endswith(("`", " ")) or not shown else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def render_markdown(records: RunView | list[dict[str, Any]], summary: Summary, run_dir: str | Path) -> str:
    view = RunView.of(records)
    checks = view.checks(1)
    keys = [tolerance_key(a) for a in summary.tolerances]
    t, tier3_totals = summary.totals, summary.tier3
    gate = "" if summary.gate is None else " " + md(tolerance_title(summary).removeprefix("tier 1 "))
    lines = [
        f"# parity report: {md(summary.experiment)}",
        "",
        f"**{t.passed} passed, {t.failed} failed, {t.skipped} {NOT_RUN}"
        + (f", {t.errors} without a verdict (reference failed)" if t.errors else "")
        + f"**{gate}. {md(summary.arithmetic.formula)}."
        + (f" Tier 3: **{tier3_totals.passed} agree, {tier3_totals.failed} differ**." if tier3_totals.checks else ""),
        "",
        md(environment_line(view.run.environment)),
        "",
        *[f"- {md(line)}" for line in tolerance_lines(summary)],
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
        rows.append(f"| {md(c.model)} | {md(c.inputs)} | {md(c.target)} | {verdict} | {md(c.failure_class or '')} | "
                    f"{number(c.max_abs, none='inf') if c.status == 'ok' else ''} | "
                    f"{number(c.required_atol, none='inf') if c.status == 'ok' else ''} | {md(worse)} |")
    lines += _table(["model", "inputs", "target", "verdict", "class", "max abs", "required atol", "oracle: farther from float64"],
                    rows, "No tier-1 checks in these records.")
    lines += ["", "## Tolerance sweep (checks passing at each atol)", ""]
    rows = []
    for target, info in summary.per_target.items():
        ran = info.checks - info.skipped - info.errors
        rows.append(f"| {md(target)} | " + " | ".join(f"{info.per_tolerance[k]}/{ran}" for k in keys) + " |")
    lines += _table(["target", *map(md, keys)], rows, "No tier-1 check ran, so there is no sweep.")
    if summary.reference_errors:
        lines += ["", "## Reference failures (no verdict about the targets)", ""]
        for e in summary.reference_errors:
            why = ("the model as written raised on these inputs: fix the model or the input set" if e.user_error
                   else "the reference could not run")
            lines.append(f"- **{md(e.model)} / {md(e.inputs)}**: {why}; targets not run: "
                         f"{md(', '.join(e.targets))}. {md(e.detail)}")
    failed = view.failed(1)
    if failed:
        lines += ["", "## Failures", ""]
        for c in failed:
            lines.append(f"- **{md(view.key(c))}**: {md_code(c.failure_class)}: {md(c.detail)}")
            lines += [f"  - {line.split(': ', 1)[0]}: {md_code(line.split(': ', 1)[1])}" if line.startswith("next: ")
                      else f"  - {md(line)}" for line in next_steps(c, view, run_dir)]
            for leaf in view.worst_leaves(c, 5):
                lines.append(f"  - {md_code(leaf.name)}: max abs {number(leaf.max_abs, none='inf')}, "
                             f"max rel {number(leaf.max_rel, none='inf')}, cosine {cosine(leaf.cosine)}, "
                             f"mismatched {percent(leaf.mismatch_fraction)}"
                             + (f" ({md(leaf.detail)})" if leaf.detail else ""))
    notes = passing_oracle_lines(view)
    if notes:
        lines += ["", "## The float64 oracle on passing checks", ""]
        lines += [f"- **{md(', '.join(keys))}**: {md(line)}" for line, keys in notes.items()]
    tier3 = view.checks(3)
    if tier3:
        lines += ["", "## Task-level agreement (tier 3)", "", "| model | inputs | target | task | verdict | metrics |",
                  "|---|---|---|---|---|---|"]
        for c in tier3:
            metrics = headline_figures(c)
            flips = flips_line(c) or generation_line(c)
            verdict = ("agrees" if c.passed else f"{c.failure_class}: {c.detail}")
            verdict = "; ".join([verdict, *(line for line in (flips, cached_line(c)) if line), *(c.notes or ())])
            lines.append(f"| {md(c.model)} | {md(c.inputs)} | {md(c.target)} | {md(c.task)} | {md(verdict)} | {md(metrics)} |")
        for stats in statistics_tables(tier3):
            lines += ["", f"### {md(stats.model)} / {md(stats.inputs)}: {md(stats.task)} statistics", ""]
            lines += _table(["statistic", *map(md, stats.targets)],
                            [f"| {md(name)} | " + " | ".join(map(md, values)) + " |" for name, values in stats.rows],
                            "")
    layers = view.layers
    if layers:
        lines += ["", "## Where the failing checks diverge (tier 2)", ""]
        for r in layers:
            head = f"- **{md(view.key(r))}**: "
            if r.error:
                lines.append(head + f"localization failed: {md(r.error)}")
                continue
            path = " > ".join(level.parent for level in r.levels if level.parent)
            lines.append(head + md(r.verdict) + (f" (descent: {md(path)})" if path else ""))
            if r.tensor_groups:  # a split block's attention and FFN under it, marked
                rows = [(("↳ " + row[0].strip()) if row[0].startswith(" ") else row[0], *row[1:]) for row in group_rows(r)]
                lines += ["", *_table(["group", "type", "mean KLD", "added", "share", "same top-1"],
                                      ["| " + " | ".join(map(md, row)) + " |" for row in rows], ""), ""]
            if r.whole_graph:
                lines.append("  - whole graph: no layer's own error exceeds the threshold "
                             f"{r.threshold:g}; the drift is not one layer's")
            if r.suspects:
                lines.append("  - suspects: " + md("; ".join(suspect_words(s, r.threshold) for s in r.suspects)))
            if r.first_divergent:
                which = "propagated" if r.first_divergent_by == "propagated" else "own"
                lines.append(f"  - first layer whose {which} error exceeds the threshold: {md_code(r.first_divergent)}")
    if warned(checks):
        lines += ["", "## What the targets warned of", "",
                  "A trace that took one branch of a data-dependent `if` is right only for inputs that take the same "
                  "branch, whatever this run's verdict.", ""]
        for c, notes in warned(checks):
            lines += [f"- **{md(view.key(c))}** ({'pass' if c.passed else 'FAIL'}): {md(n)}"
                      for n in notes]
    skipped = {c.target: c.detail for c in checks if c.status == "skipped"}
    if skipped:
        lines += ["", "## Targets not run here", ""] + [f"- {md(t)}: {md(why)}" for t, why in skipped.items()]
    latency = latency_rows(view)
    lines += ["", "## Latency per model, input set and backend", "",
              "Timed repeats only (the warm-up runs before them are not timed); prepare (export, compile, load) apart."
              + md(_interleaving(latency)), ""]
    rows = []
    for row in latency:
        if row.median_s is None:
            rows.append(f"| {md(row.model)} | {md(row.inputs)} | {md(row.backend)} | {md(row.status)} | | | | |")
            continue
        prepare = "" if row.prepare_s is None else f"{row.prepare_s:.2f}"
        rows.append(f"| {md(row.model)} | {md(row.inputs)} | {md(row.backend)} | {len(row.run_s)} | {row.median_s:.4f} | "
                    f"{row.min_s:.4f} | {row.max_s:.4f} | {prepare} |")
    lines += _table(["model", "inputs", "backend", "repeats", "median run s", "min", "max", "prepare s"], rows,
                    "No execution records in this run.")
    return "\n".join(lines) + "\n"


def _table(columns: list[str], rows: list[str], empty: str) -> list[str]:
    """A Markdown table, or the one line `empty` when it has no rows: never a header over nothing."""
    if not rows:
        return [empty]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows]


def write_markdown(records: RunView | list[dict[str, Any]], summary: Summary, path: Path) -> None:
    write_text(path, render_markdown(records, summary, path.parent))  # whole or not at all


WRITER = ReportWriter("markdown", "report.md", write_markdown)


def _interleaving(latency: list[LatencyRow]) -> str:
    """How the backends were timed: in turns (the local executor), or each alone (the process and ray executors,
    or a backend alone in its turn), as the execution records say."""
    alone = [f"{r.model}/{r.inputs}/{r.backend}" for r in latency if r.interleaved is False]
    if any(r.interleaved for r in latency):
        return (" The backends of each model and input set took turns (interleaved)"
                + (f", except {', '.join(alone)}, timed alone." if alone else "."))
    return " Each backend was timed alone, one after the other: compare them only from a quiet machine." if alone else ""
