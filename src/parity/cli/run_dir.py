"""`parity report` and `parity reduce`: commands that read a finished run's folder."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from parity.cli.terminal import EXIT_OK, make_console
from parity.errors import ParityError, clip
from parity.files import user_path
from parity.outdir import prepare


def cmd_report(args: argparse.Namespace) -> int:
    """Render summary.json, report.md, report.html and junit.xml again from a run's records.jsonl alone, and
    print the table the run printed."""
    from parity.records.io import being_written
    from parity.records.summary import summarize, write_summary
    from parity.records.view import RunView
    from parity.report import write_reports
    from parity.report.console import render

    out_dir = user_path(args.run_dir, "RUN_DIR")
    view = RunView.read(out_dir)
    refused = _name_problem(view, out_dir / "records.jsonl")
    if refused:
        raise ParityError(refused)
    if being_written(out_dir / "records.jsonl"):
        raise ParityError(f"RUN_DIR {out_dir}: the run is still in progress (a parity process is writing its "
                          "records.jsonl); report it once that run has ended")
    missing = view.unfinished()
    if missing:  # no summary.json (the mark of a finished run, which a continued run reads), no junit that passes
        file = shlex.quote(view.run.file) if view.run.file else "EXPERIMENT"
        raise ParityError(f"RUN_DIR {out_dir}: the run ended early: {missing}; no report is written, so that none reads "
                          f"as a pass. Continue it (parity run {file} --out {shlex.quote(str(out_dir))}), then report")
    prepare(out_dir, "RUN_DIR")  # where the reports go: no link, no folder in a report's place
    summary = summarize(view)
    write_summary(summary, out_dir / "summary.json")
    render(view, summary, out_dir, make_console(), write_reports(out_dir, view, summary))
    return EXIT_OK


def _name_problem(view, path: Path) -> str | None:
    """Why the records at `path` hold a name no experiment file could (config.schema.check_name: a `<script>`,
    a newline, a pipe), or None: such records were not written by parity, and their report is not rendered."""
    from parity.config.schema import check_name

    named = [("model", m.name) for m in view.run.config.models]
    named += [("input set", i.get("name")) for i in view.run.config.inputs]
    for record in view:
        named += [(what, getattr(record, what, None)) for what in ("model", "inputs", "target")]
    for what, name in named:
        if name is None:
            continue
        try:
            check_name(name) if isinstance(name, str) else check_name("")
        except ValueError as exc:
            return f"{path}: names {what} {clip(repr(name), 80)}, which no experiment file can name ({exc}); not written by parity"
    return None



def cmd_reduce(args: argparse.Namespace) -> int:
    """Cut a failing check down to its culprit module: a folder with a standalone repro script."""
    from parity.reduce import reduce_check

    out = reduce_check(user_path(args.run_dir, "RUN_DIR"), args.check, user_path(args.out, "--out") if args.out else None,
                       user_path(args.experiment, "--experiment") if args.experiment else None, args.trust_records)
    print(f"repro: {out} (python {out / 'repro.py'}: exit 1 when it diverges; README.txt says what it is)")
    return EXIT_OK
