"""The table `parity run` prints: rows models (and input sets), columns targets, cells the verdict at the
gate with the greatest absolute difference."""

from __future__ import annotations

from parity.config.tolerances import rounded_up
from parity.errors import visible
from parity.records.models import DecodeStepCompared, Fallback, GateVerdict, Layers, Tier1Check
from parity.records.summary import Summary, exit_code
from parity.records.view import RunView
from parity.report.next_steps import next_steps
from parity.report.statistics import statistics_tables
from parity.report.wording import (
    NOT_RUN,
    cached_line,
    flips_line,
    generation_line,
    group_rows,
    headline_figures,
    number,
    passing_oracle_lines,
    suspect_words,
    tolerance_lines,
    tolerance_title,
    warned,
)
from parity.verify.localize import pass_path


def escape(text: str) -> str:
    """Text for a rich console: its markup escaped, its control characters shown (errors.visible), so a name
    from a records file can neither style the console nor rub out what is printed before it."""
    from rich.markup import escape as markup_escape

    return markup_escape(visible(text))


def _cell(checks: list[Tier1Check]) -> str:
    if all(c.status == "skipped" for c in checks):
        return f"[dim]{NOT_RUN}[/dim]"
    if any(c.status == "error" for c in checks):
        return "[magenta]ERROR[/magenta] reference"
    done = [c for c in checks if c.status == "ok"]
    failed = [c for c in done if not c.passed]
    max_abs = max((c.max_abs or 0.0 for c in done), default=0.0)
    if not failed:
        return f"[green]pass[/green] {max_abs:.1e}"
    classes = sorted({c.failure_class for c in failed})
    number = f" {max_abs:.1e}" if any(c.leaves for c in failed) else ""
    return f"[red]FAIL[/red]{number} {','.join(classes)}"


def render(records: RunView | list[dict], summary: Summary, out_dir, console, reports=(),
           allow_unavailable: bool = False) -> None:
    """The table and the findings, the totals with why the exit code is 1 when only a check not run here
    makes it so; then where the records, the summary and `reports` (paths) are."""
    from rich.table import Table

    view = RunView.of(records)
    checks = view.checks(1)
    targets = list(summary.per_target)
    rows = view.pairs()
    # The title short enough for one line of an 80-column terminal, and the table at least as wide (a
    # narrower table wraps it); what a cell says goes in the caption.
    title = f"{summary.experiment}: {tolerance_title(summary)}"
    table = Table(title=escape(title), caption="cells: verdict, max abs difference", min_width=len(title))
    table.add_column("model / inputs")
    for t in targets:
        table.add_column(escape(t))
    for model, inputs in rows:
        mine = [c for c in checks if (c.model, c.inputs) == (model, inputs)]
        table.add_row(escape(f"{model} / {inputs}"), *[_cell([c for c in mine if c.target == t]) for t in targets])
    console.print(table if rows else "no checks: no (model, input set) was judged")
    for line in tolerance_lines(summary):
        console.print(escape(line), soft_wrap=True)
    for warning in summary.warnings:  # an input that came out constant: a pass on it proves little
        console.print("[yellow]warning[/yellow] " + escape(warning), soft_wrap=True)
    for t, info in summary.per_target.items():
        if info.skipped:
            console.print(f"[yellow]{NOT_RUN}[/yellow] {escape(t)}: {escape(str(info.reason))}")
    for e in summary.reference_errors:
        why = ("the model as written raised on these inputs: fix the model or the input set"
               if e.user_error else "no target was judged")
        console.print("[magenta]reference failed[/magenta] " + escape(f"{e.model} / {e.inputs}: {e.reference}: "
                                                                      f"{e.detail} ({why})"), soft_wrap=True)
    for c in view.failed(1):
        console.print("[red]failed[/red] " + escape(f"{view.key(c)}: {c.failure_class}: {c.detail}"), soft_wrap=True)
        for line in next_steps(c, view, out_dir):
            console.print("  " + escape(line), soft_wrap=True)
    for line, keys in passing_oracle_lines(view).items():
        console.print("[yellow]oracle[/yellow] " + escape(f"{', '.join(keys)}: {line.removeprefix('oracle: ')}"), soft_wrap=True)
    for c, lines in warned(checks):
        more = f" (and {len(lines) - 3} more in the records)" if len(lines) > 3 else ""
        for i, line in enumerate(lines[:3]):
            console.print("[yellow]warning[/yellow] " + escape(f"{view.key(c)}: {line}"
                                                               + (more if i == 2 else "")), soft_wrap=True)
    for c in view.checks(3):
        figures = headline_figures(c)
        verdict = "[green]agrees[/green]" if c.passed else f"[red]{c.failure_class}[/red]"
        said = view.decides(c)  # its failure, detail and next steps are its tier-1 check's, printed above
        why = " (the verdict of the failed check above: gate: tier3)" if said else f" ({c.detail})" if c.detail else ""
        console.print(f"tier 3 {verdict} " + escape(f"{view.key(c)}: {figures}{why}"), soft_wrap=True)
        steps = next_steps(c, view, out_dir) if not c.passed and not said else []
        for line in [flips_line(c), generation_line(c), cached_line(c), *steps]:
            if line:
                console.print("  " + escape(line), soft_wrap=True)
        for note in c.notes or ():
            console.print("  [yellow]warning[/yellow] " + escape(note), soft_wrap=True)
    for stats in statistics_tables(view.checks(3)):
        table = Table(title=escape(f"{stats.model} / {stats.inputs}: {stats.task} statistics (tier 3)"))
        table.add_column("statistic")
        for t in stats.targets:
            table.add_column(escape(t), justify="right")
        for name, values in stats.rows:
            table.add_row(escape(name), *map(escape, values))
        console.print(table)
    decode_steps = {view.key(r) for r in view.layers if r.decode_step}  # localized on a decode step, as next steps say
    for key, loc in summary.localized.items():
        step = " on the decode step (its cached decoding fails, its forward agrees)" if key in decode_steps else ""
        if loc.error:
            where = f"not localized ({loc.error})"
        elif loc.whole_graph:
            where = f"the whole graph{step} (no layer alone exceeds the threshold)" + (
                f"; its propagated error first exceeds it at {loc.first_divergent}" if loc.first_divergent else "")
        elif loc.culprit is None:
            where = f"no single layer{step} (see the tier-2 verdict in report.md)"
        else:
            where = loc.culprit + step + (" as a whole (none of its submodules alone exceeds the threshold)"
                                          if loc.as_a_whole else "")
        if loc.specialized:
            where += f" (its trace is specialised at {loc.specialized.where})"
        if loc.compiler_pass and loc.compiler_pass.found:
            where += f"; compiler pass: {pass_path(loc.compiler_pass)}"
        if loc.evenly_spread:
            where += " (every layer drifts alike: no single source)"
        console.print("[yellow]diverges at[/yellow] " + escape(f"{key}: {where}"))
    totals, tier3 = summary.totals, summary.tier3
    errors = f", {totals.errors} without a verdict (reference failed)" if totals.errors else ""
    console.print(f"{totals.passed} passed, {totals.failed} failed, {totals.skipped} {NOT_RUN}{errors} "
                  f"({summary.arithmetic.formula})"
                  + (f"; tier 3: {tier3.passed} agree, {tier3.failed} differ" if tier3.checks else ""))
    if totals.skipped and not allow_unavailable and exit_code(summary) == 1 and exit_code(summary, True) == 0:
        console.print(f"exit 1: {totals.skipped} check(s) {NOT_RUN}, so not verified (--allow-unavailable exits 0 "
                      "when every check that ran passed)")
    console.print(f"records: {out_dir / 'records.jsonl'}\nsummary: {out_dir / 'summary.json'}")
    for path in reports:
        console.print(f"report:  {path}")
    if not reports:
        console.print(f"reports: not written (--no-report); parity report {out_dir} renders them")


def render_layers(record: Layers, console) -> None:
    """One table per level of a `layers` record (the last level holds the culprit), then the verdict."""
    from rich.table import Table

    if record.tier1:
        console.print(escape(gate_line(record.tier1, forward=bool(record.decode_step))), soft_wrap=True)
    if record.decode_step:
        console.print(escape(decode_line(record.decode_step)), soft_wrap=True)
    if record.error:
        console.print(f"[red]localization failed[/red] for {escape(record.target)}: {escape(record.error)}")
        return
    if record.tensor_groups:
        console.print(group_table(record))
        console.print(f"[bold]verdict:[/bold] {escape(record.verdict)}")
        console.print(f"localized in {record.elapsed_s:.1f} s ({record.tensor_groups.trials} trials)")
        return
    suspects = {s.name for s in record.suspects}
    for level in record.levels:
        title = f"{RunView.key(record)}: layers of {level.parent or 'the model'}"
        if record.decode_step:
            title += f" on the decode step (after a {record.decode_step.prompt_tokens}-token prompt)"
        table = Table(title=escape(title))
        for col in ("layer", "local max abs", "local rel rmse", "local SQNR dB", "propagated rel rmse", "R"):
            table.add_column(col, justify="left" if col == "layer" else "right")
        for layer in level.layers:
            local, prop = layer.local, layer.propagated  # either may be missing: a layer that did not run
            prop_text = "n/a" if prop and prop.error else number(prop and prop.rel_rmse)
            name = escape(layer.name)
            if layer.name in suspects:
                name = f"[bold red]{name}[/bold red]"
            if local and local.error:
                table.add_row(name, escape(local.error[:60]), "", "", prop_text, "")
                continue
            table.add_row(name, number(local and local.max_abs), number(local and local.rel_rmse),
                          number(local and local.sqnr_db, ".1f"), prop_text, number(layer.introduction_rate, ".2g"))
        console.print(table)
        unseen = {layer.name: layer.propagated.error for layer in level.layers
                  if layer.propagated and layer.propagated.error}
        if unseen:
            console.print("propagated n/a: " + escape("; ".join(f"{n}: {why}" for n, why in unseen.items())))
    console.print(f"[bold]verdict:[/bold] {escape(record.verdict)}")
    if record.suspects:
        console.print("suspects: " + escape("; ".join(suspect_words(s, record.threshold) for s in record.suspects)))
    if record.first_divergent:
        which = "propagated error" if record.first_divergent_by == "propagated" else "own error"
        which += " on the decode step" if record.decode_step else ""
        console.print(f"first layer whose {which} exceeds {record.threshold:g}: {escape(record.first_divergent)}")
    console.print(f"localized in {record.elapsed_s:.1f} s")


def group_table(record: Layers):
    """The console table of `group_rows`, titled with the floor and the whole file."""
    from rich.table import Table

    found = record.tensor_groups
    title = (f"{RunView.key(record)}: each tensor group alone at its type, the rest at {found.trial_type} "
             f"(floor KLD {found.floor.kl_mean:.3g}, whole file {found.whole.kl_mean:.3g})")
    table = Table(title=escape(title))
    for col in ("group", "type", "mean KLD", "added", "share", "same top-1"):
        table.add_column(col, justify="left" if col in ("group", "type") else "right")
    for row in group_rows(record):
        table.add_row(*(escape(c) for c in row))
    return table


def decode_line(decode_step: DecodeStepCompared) -> str:
    """What `parity localize` says of a check localized on a decode step: its cached decoding fails, and what the
    tables compare instead of the forward."""
    detail = decode_step.cached.detail if decode_step.cached else None
    return (f"its cached decoding fails ({detail}): the layers below are compared on the decode step, "
            f"one token fed after the same {decode_step.prompt_tokens}-token prompt through each side's own KV cache")


def gate_line(tier1: GateVerdict, forward: bool = False) -> str:
    """What `parity localize` says before its tables: whether the check it explains passes at the gate (`forward`: the
    tables compare a decode step instead, and say so next)."""
    required, gate = tier1.required_atol, tier1.gate
    if tier1.passed and forward:
        return f"the check's forward passes at the gate (required atol {required:.3g} <= gate {gate:g})"
    if tier1.passed:
        return (f"the check passes at the gate (required atol {required:.3g} <= gate {gate:g}); the tables below "
                "show where the small differences are")
    if required is None:
        return f"the check fails at the gate: no atol passes it ({tier1.failure_class}: {tier1.detail})"
    times = f", {required / gate:.3g}x the gate" if gate > 0 else ""
    return (f"the check fails at the gate: required atol {required:.3g} > gate {gate:g}{times} "
            f"({tier1.failure_class}: {tier1.detail})")


def fallback_lines(result: Fallback, gate: float, by_task: bool, model: str, task: str | None) -> list[tuple[str, str]]:
    """What `parity fallback` prints, as (style, text) lines: the numbers before and after with the modules named,
    then what the search found. A check that fails at tier 1 while its task decisions agree is said to, with the
    `gate: tier3` line that gates it on them: never "the check already passes" for a check the table calls FAIL."""
    if result.tensor_types:
        return _tensor_type_lines(result, task)
    before, after = (rounded_up(a) if a is not None else a for a in (result.required_atol_before,
                                                                      result.required_atol_after))
    named = f" ({', '.join(result.modules)})" if result.modules else ""
    lines = [("", f"{result.target}: required atol {before:.3g} -> {after:.3g} (gate {gate:g}) with "
                  f"{len(result.modules)} module(s) in {result.runs_in}{named}, {result.tried} trial run(s)")]
    if result.aim == "tier 3":
        shown = lambda metrics: ", ".join(f"{k} {v:.4g}" for k, v in (metrics or {}).items() if isinstance(v, float))  # noqa: E731
        lines.append(("", f"tier 3 ({task}): {shown(result.task_before)} -> {shown(result.task_after)}"))
    tier1_fails = not result.tier1_passed_after  # the judge's verdict, as the search recorded it
    gated_on_task = ("" if by_task or not tier1_fails else
                     "; gate this check on them: set `tolerances: {gate: tier3}` in the target's entry (tier 1's numbers "
                     "stay recorded)")
    if result.passed and not result.modules:
        if result.aim == "tier 3" and tier1_fails:
            lines.append(("", f"tier 1 fails (required atol {before:.3g} > gate {gate:g}), but the {task} decisions agree "
                              f"at the tier-3 thresholds: no fallback is needed for them{gated_on_task}"))
        else:
            lines.append(("", "the check already passes: no fallback is needed"))
    elif result.whole_model:
        lines.append(("yellow", f"fallback: [{', '.join(result.modules)}]: {_whole_model_note(result)}"))
    elif result.passed:
        lines.append(("", f"fallback: [{', '.join(result.modules)}]; median latency {result.latency_before_s * 1e3:.2f} ms "
                          f"-> {result.latency_after_s * 1e3:.2f} ms ({result.latency_ratio:.2f}x)"))
        if result.latency_float_s is not None:
            lines.append(("", f"the float model on the same backend: {result.latency_float_s * 1e3:.2f} ms (quantized "
                              f"{result.latency_before_s / result.latency_float_s:.2f}x, with the fallback "
                              f"{result.latency_after_s / result.latency_float_s:.2f}x of it)"))
        qualified = ", ".join(f"{model}:{m}" for m in result.modules)
        lines.append(("", f"apply it: in the target's entry, fallback: [{qualified}]"))
        if result.aim == "tier 3" and gated_on_task:
            lines.append(("", f"tier 1 still fails with it (required atol {after:.3g} > gate {gate:g}): the "
                              f"{task} decisions agree{gated_on_task}"))
    elif result.ceiling_atol is not None:  # the ceiling failed: the search stopped there (search_fallback)
        where = {"eager": "run eager", "float": "in float"}.get(result.runs_in, f"in {result.runs_in}")
        needs = (f"the {task} decisions still disagree" if result.aim == "tier 3" else
                 f"the check still needs atol {rounded_up(result.ceiling_atol):.3g} > gate {gate:g}")
        lines.append(("red", f"no fallback can pass: with all {result.ceiling_modules} candidate module(s) {where} at "
                             f"once, {needs}"))
    else:
        lines.append(("red", "no fallback among the localized layers makes the check pass"))
    for line in (result.next_step or "").splitlines():
        lines.append(("", line))
    return lines


# What the tensor-group fallback's lines show of tier 3's metrics (text generation's), before and after.
KEPT_METRICS = (("mean KLD", "kl_mean", ".4g"), ("top-1", "top1_agreement", ".4f"))


def _tensor_type_lines(result: Fallback, task: str | None) -> list[tuple[str, str]]:
    """`parity fallback` on a file of typed tensors (llama.cpp): the groups kept at a higher type, tier 3 before and
    after, what it costs in bytes and tokens per second, and the target entry that reproduces it."""
    found = result.tensor_types
    shown = lambda m: ", ".join(f"{words} {m[key]:{spec}}" for words, key, spec in KEPT_METRICS)  # noqa: E731
    lines = [("", f"{result.target}: {len(result.modules)} of {found.groups} tensor group(s) at {found.keep_type}"
                  f"{' (' + ', '.join(result.modules) + ')' if result.modules else ''}, {result.tried} trial run(s)"),
             ("", f"tier 3 ({task}): {shown(result.task_before)} -> {shown(result.task_after)}")]
    if result.passed and not result.modules:
        lines.append(("", "tier 3 already passes: no tensor needs a higher type"))
        return lines
    if not result.passed:
        lines.append(("red", f"no prefix of the localized groups at {found.keep_type} passes tier 3"))
    else:
        mb = 2 ** 20
        lines.append(("", f"cost: {found.bytes_before / mb:.1f} MiB -> {found.bytes_after / mb:.1f} MiB "
                          f"({found.bytes_after / found.bytes_before:.2f}x), {found.tokens_per_s_before:.0f} -> "
                          f"{found.tokens_per_s_after:.0f} tokens/s over {found.tokens} tokens"))
        if result.whole_model:
            lines.append(("yellow", f"every group is kept: this is the whole file at {found.keep_type}"))
        lines.append(("", "apply it: add this target to the experiment's targets:"))
        lines.append(("", found.snippet))
    for line in (result.next_step or "").splitlines():
        lines.append(("", line))
    return lines


def _whole_model_note(result: Fallback) -> str:
    """What a passing set that is the whole model amounts to, in the fallback kind's words."""
    where = {"eager": "run entirely eager", "float": "left in float (no quantization)"}.get(
        result.runs_in, "at the reference's precision (float32)")
    return f"no partial fallback exists; this is the whole model {where}"


def render_fallback(lines: list[tuple[str, str]], console) -> None:

    for style, text in lines:
        console.print(f"[{style}]{escape(text)}[/{style}]" if style else escape(text), soft_wrap=True)
