"""The table `parity run` prints: rows models (and input sets), columns targets, cells the verdict at the
gate with the greatest absolute difference."""

from __future__ import annotations

from typing import Any

from parity.config.tolerances import rounded_up
from parity.dtypes import QUANTIZE_SCHEMES
from parity.errors import visible
from parity.records import tolerance_key
from parity.records.models import Check, GateVerdict, LayerError, Layers, Note, Tier1Check, Tier3Check
from parity.records.summary import exit_code
from parity.records.view import RunView
from parity.report.next_steps import next_steps, oracle_finding
from parity.report.statistics import statistics_tables
from parity.verify.localize import pass_path
from parity.verify.tasks import headline_of


def escape(text: str) -> str:
    """Text for a rich console: its markup escaped, its control characters shown (errors.visible), so a name
    from a records file can neither style the console nor rub out what is printed before it."""
    from rich.markup import escape as markup_escape

    return markup_escape(visible(text))


NOT_RUN = "not run here"  # a target that cannot run on this machine: the one name every view gives that state


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


def tolerance_title(summary: dict[str, Any]) -> str:
    """`tier 1 at atol=.., rtol=..` when every target shares one tolerance, else where to read each."""
    if summary["gate"] is None:
        return "tier 1"
    if summary["uniform_tolerance"]:
        first = next(iter(summary["per_target"].values()), {})
        gate, rtol = first.get("gate", summary["gate"]), first.get("rtol", summary["rtol"])
        by = " (gate: tier 3)" if first.get("gated_by") == "tier3" else ""
        return f"tier 1 at atol={gate:g}, rtol={rtol:g}{by}"
    return "tier 1, each target at its own tolerance"


def tolerance_lines(summary: dict[str, Any]) -> list[str]:
    """Where targets are judged at different tolerances, one line per tolerance with the targets judged at it
    (else one per target judged at other than the experiment's); then the output rules, and one line per noise
    floor the checks show (the reference's own error, at each target's rtol), with the targets it concerns."""
    shared, rules, floors = {}, [], {}
    for target, info in summary["per_target"].items():
        if info.get("gate") is None:
            continue
        source = info.get("tolerance_source", "experiment")
        if not summary["uniform_tolerance"] or source != "experiment" or info.get("gated_by") == "tier3":
            shared.setdefault((info["gate"], info["rtol"], source, info.get("gated_by")), []).append(target)
        if info.get("output_rules"):
            rules.append(f"output rules {target}: {'; '.join(info['output_rules'])} (the leaves they matched)")
        floor = info.get("noise_floor")
        if floor and (floor.get("atol") or 0) > 0:
            floors.setdefault((floor["atol"], floor["source"]), []).append(target)
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


def _at_float_gate(summary: dict[str, Any], targets: list[str], source: str) -> str:
    """For targets at a quantized default: how their checks fare at the experiment's (float32's) gate, which the
    sweep still holds."""
    gate = summary["gate"]
    key = tolerance_key(gate) if gate is not None else None
    if _scheme_of(source) is None or key not in summary["per_target"][targets[0]].get("per_tolerance", {}):
        return ""
    passed = sum(summary["per_target"][t]["per_tolerance"][key] for t in targets)
    judged = sum(summary["per_target"][t]["passed"] + summary["per_target"][t]["failed"] for t in targets)
    return f"; at the experiment's gate {gate:g}: {passed}/{judged} pass"


def target_tolerance(info: dict[str, Any]) -> str:
    """A target's tolerance as the tables head its column with: `atol 1e-05, rtol 0.016`."""
    return "" if info.get("gate") is None else f"atol {info['gate']:g}, rtol {info['rtol']:g}"


def environment_line(env: dict[str, Any]) -> str:
    """One line for what the numbers depend on: the recorded libraries' versions, python, CPU, threads, CUDA.
    Records written before the runner chose the libraries have no `libraries`: torch, torchvision, onnxruntime."""
    versions = ", ".join(f"{name} {env.get(name)}" for name in env.get("libraries", ("torch", "torchvision", "onnxruntime")))
    return (f"{versions}, python {env['python']}, {env['cpu'].get('model', env['cpu']['machine'])}, {env['threads']} threads, "
            f"CUDA: {env['cuda']['devices'] if env['cuda'] else 'none'}")


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


def render(records: RunView | list[dict], summary: dict[str, Any], out_dir, console, reports=(),
           allow_unavailable: bool = False) -> None:
    """The table and the findings, the totals with why the exit code is 1 when only a check not run here
    makes it so; then where the records, the summary and `reports` (paths) are."""
    from rich.table import Table

    view = RunView.of(records)
    checks = view.checks(1)
    targets = list(summary["per_target"])
    rows = view.pairs()
    # The title short enough for one line of an 80-column terminal, and the table at least as wide (a
    # narrower table wraps it); what a cell says goes in the caption.
    title = f"{summary['experiment']}: {tolerance_title(summary)}"
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
    for warning in summary.get("warnings", []):  # an input that came out constant: a pass on it proves little
        console.print("[yellow]warning[/yellow] " + escape(warning), soft_wrap=True)
    for t, info in summary["per_target"].items():
        if info["skipped"]:
            console.print(f"[yellow]{NOT_RUN}[/yellow] {escape(t)}: {escape(str(info['reason']))}")
    for e in summary["reference_errors"]:
        why = ("the model as written raised on these inputs: fix the model or the input set"
               if e["user_error"] else "no target was judged")
        console.print("[magenta]reference failed[/magenta] " + escape(f"{e['model']} / {e['inputs']}: {e['reference']}: "
                                                                      f"{e['detail']} ({why})"), soft_wrap=True)
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
        console.print(f"tier 3 {verdict} " + escape(f"{view.key(c)}: {figures}"
                                                    + (f" ({c.detail})" if c.detail else "")), soft_wrap=True)
        for line in [flips_line(c), generation_line(c), *(next_steps(c, view, out_dir) if not c.passed else ())]:
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
    for key, loc in summary.get("localized", {}).items():
        if loc["error"]:
            where = f"not localized ({loc['error']})"
        elif loc.get("whole_graph"):
            where = "the whole graph (no layer alone exceeds the threshold)" + (
                f"; its propagated error first exceeds it at {loc['first_divergent']}" if loc.get("first_divergent") else "")
        elif loc["culprit"] is None:
            where = "no single layer (see the tier-2 verdict in report.md)"
        else:
            where = loc["culprit"] + (" as a whole (none of its submodules alone exceeds the threshold)"
                                      if loc.get("as_a_whole") else "")
        if loc.get("specialized"):
            where += f" (its trace is specialised at {loc['specialized']['where']})"
        if (loc.get("compiler_pass") or {}).get("found"):
            where += f"; compiler pass: {pass_path(loc['compiler_pass'])}"
        if loc["evenly_spread"]:
            where += " (every layer drifts alike: no single source)"
        console.print("[yellow]diverges at[/yellow] " + escape(f"{key}: {where}"))
    totals, tier3 = summary["totals"], summary["tier3"]
    errors = f", {totals['errors']} without a verdict (reference failed)" if totals["errors"] else ""
    console.print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} {NOT_RUN}{errors} "
                  f"({summary['arithmetic']['formula']})"
                  + (f"; tier 3: {tier3['passed']} agree, {tier3['failed']} differ" if tier3["checks"] else ""))
    if totals["skipped"] and not allow_unavailable and exit_code(summary) == 1 and exit_code(summary, True) == 0:
        console.print(f"exit 1: {totals['skipped']} check(s) {NOT_RUN}, so not verified (--allow-unavailable exits 0 "
                      "when every check that ran passed)")
    console.print(f"records: {out_dir / 'records.jsonl'}\nsummary: {out_dir / 'summary.json'}")
    for path in reports:
        console.print(f"report:  {path}")
    if not reports:
        console.print(f"reports: not written (--no-report); parity report {out_dir} renders them")


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


def figure(x: Any) -> str:
    """A metric as the reports print it: 4 significant digits, and a NaN (null in the records) as `nan`."""
    if x is None:
        return "nan"
    return f"{x:.4g}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


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
        words = p.text or {"context": str(p.context), "reference": str(p.reference), "target": str(p.target)}
        line += (f"; first divergence: prompt {i} at new token {k}, after '{words['context']}': reference "
                 f"'{words['reference']}', target '{words['target']}' (reference margin {p.margin:.3g}, {p.flip})")
    return line


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


def _num(x: Any, fmt: str = ".2e") -> str:
    return "-" if x is None else format(x, fmt)


def render_layers(record: Layers, console) -> None:
    """One table per level of a `layers` record (the last level holds the culprit), then the verdict."""
    from rich.table import Table

    if record.tier1:
        console.print(escape(gate_line(record.tier1)), soft_wrap=True)
    if record.error:
        console.print(f"[red]localization failed[/red] for {escape(record.target)}: {escape(record.error)}")
        return
    if record.tensor_groups:
        console.print(group_table(record))
        console.print(f"[bold]verdict:[/bold] {escape(record.verdict)}")
        console.print(f"localized in {record.elapsed_s:.1f} s ({record.tensor_groups['trials']} trials)")
        return
    suspects = {s.name for s in record.suspects}
    for level in record.levels:
        title = f"{RunView.key(record)}: layers of {level.parent or 'the model'}"
        table = Table(title=escape(title))
        for col in ("layer", "local max abs", "local rel rmse", "local SQNR dB", "propagated rel rmse", "R"):
            table.add_column(col, justify="left" if col == "layer" else "right")
        for layer in level.layers:
            local, prop = layer.local, layer.propagated  # either may be missing: a layer that did not run
            prop_text = "n/a" if prop and prop.error else _num(prop and prop.rel_rmse)
            name = escape(layer.name)
            if layer.name in suspects:
                name = f"[bold red]{name}[/bold red]"
            if local and local.error:
                table.add_row(name, escape(local.error[:60]), "", "", prop_text, "")
                continue
            table.add_row(name, _num(local and local.max_abs), _num(local and local.rel_rmse),
                          _num(local and local.sqnr_db, ".1f"), prop_text, _num(layer.introduction_rate, ".2g"))
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
        console.print(f"first layer whose {which} exceeds {record.threshold:g}: {escape(record.first_divergent)}")
    console.print(f"localized in {record.elapsed_s:.1f} s")


def group_rows(record: Layers) -> list[tuple[str, ...]]:
    """A tensor-group localization's rows (runner/tensor_types.py), worst block first, each split block's attention
    and FFN under it: group, its type in the target's file, mean KLD ± SE alone at that type, the KLD it adds over
    the all-F16 floor and its share, same top-1."""
    found = record.tensor_groups
    rows = found["groups"]
    out = []
    for row in sorted((r for r in rows if r["parent"] is None), key=lambda r: -r["kl_added"]):
        for r in [row, *(r for r in rows if r["parent"] == row["name"])]:
            share = "" if r["share"] is None or r["parent"] else f"{r['share']:.1%}"
            out.append(("  " * bool(r["parent"]) + r["name"], r["type"], f"{r['kl_mean']:.4g} ± {r['kl_mean_se']:.2g}",
                        f"{r['kl_added']:.3g}", share, f"{r['same_top1']:.2%}"))
    return out


def group_table(record: Layers):
    """The console table of `group_rows`, titled with the floor and the whole file."""
    from rich.table import Table

    found = record.tensor_groups
    title = (f"{RunView.key(record)}: each tensor group alone at its type, the rest at {found['trial_type']} "
             f"(floor KLD {found['floor']['kl_mean']:.3g}, whole file {found['whole']['kl_mean']:.3g})")
    table = Table(title=escape(title))
    for col in ("group", "type", "mean KLD", "added", "share", "same top-1"):
        table.add_column(col, justify="left" if col in ("group", "type") else "right")
    for row in group_rows(record):
        table.add_row(*(escape(c) for c in row))
    return table


def suspect_words(suspect: LayerError, threshold: float) -> str:
    """A suspect layer with the number that made it one: `layer1 (required atol 3.10e-04 > threshold 0.0001, ...)`."""
    from parity.verify.localize import against_threshold

    return f"{suspect.name} ({against_threshold(suspect.required_atol, threshold, suspect.rel_rmse, suspect.max_abs)})"


def gate_line(tier1: GateVerdict) -> str:
    """What `parity localize` says before its tables: whether the check it explains passes at the gate."""
    required, gate = tier1.required_atol, tier1.gate
    if tier1.passed:
        return (f"the check passes at the gate (required atol {required:.3g} <= gate {gate:g}); the tables below "
                "show where the small differences are")
    if required is None:
        return f"the check fails at the gate: no atol passes it ({tier1.failure_class}: {tier1.detail})"
    times = f", {required / gate:.3g}x the gate" if gate > 0 else ""
    return (f"the check fails at the gate: required atol {required:.3g} > gate {gate:g}{times} "
            f"({tier1.failure_class}: {tier1.detail})")


def fallback_lines(result, record: dict[str, Any], gate: float, by_task: bool, model: str,
                   task: str | None) -> list[tuple[str, str]]:
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
                          f"-> {result.latency_after_s * 1e3:.2f} ms ({record['latency_ratio']:.2f}x)"))
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


def _tensor_type_lines(result, task: str | None) -> list[tuple[str, str]]:
    """`parity fallback` on a file of typed tensors (llama.cpp): the groups kept at a higher type, tier 3 before and
    after, what it costs in bytes and tokens per second, and the target entry that reproduces it."""
    found = result.tensor_types
    shown = lambda m: f"mean KLD {m['kl_mean']:.4g}, top-1 {m['top1_agreement']:.4f}"  # noqa: E731
    lines = [("", f"{result.target}: {len(result.modules)} of {found['groups']} tensor group(s) at {found['keep_type']}"
                  f"{' (' + ', '.join(result.modules) + ')' if result.modules else ''}, {result.tried} trial run(s)"),
             ("", f"tier 3 ({task}): {shown(result.task_before)} -> {shown(result.task_after)}")]
    if result.passed and not result.modules:
        lines.append(("", "tier 3 already passes: no tensor needs a higher type"))
        return lines
    if not result.passed:
        lines.append(("red", f"no prefix of the localized groups at {found['keep_type']} passes tier 3"))
    else:
        mb = 2 ** 20
        lines.append(("", f"cost: {found['bytes_before'] / mb:.1f} MiB -> {found['bytes_after'] / mb:.1f} MiB "
                          f"({found['bytes_after'] / found['bytes_before']:.2f}x), {found['tokens_per_s_before']:.0f} -> "
                          f"{found['tokens_per_s_after']:.0f} tokens/s over {found['tokens']} tokens"))
        if result.whole_model:
            lines.append(("yellow", f"every group is kept: this is the whole file at {found['keep_type']}"))
        lines.append(("", "apply it: add this target to the experiment's targets:"))
        lines.append(("", found["snippet"]))
    for line in (result.next_step or "").splitlines():
        lines.append(("", line))
    return lines


def _whole_model_note(result) -> str:
    """What a passing set that is the whole model amounts to, in the fallback kind's words."""
    where = {"eager": "run entirely eager", "float": "left in float (no quantization)"}.get(
        result.runs_in, "at the reference's precision (float32)")
    return f"no partial fallback exists; this is the whole model {where}"


def render_fallback(lines: list[tuple[str, str]], console) -> None:

    for style, text in lines:
        console.print(f"[{style}]{escape(text)}[/{style}]" if style else escape(text), soft_wrap=True)
