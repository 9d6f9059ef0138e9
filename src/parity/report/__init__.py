"""Reports rendered from the records alone, one `ReportWriter` each, registered in the `parity.reports`
entry-point group (built-ins: report.md from markdown.py, report.html from html.py, junit.xml from junit.py).
Every report reads the records through records.view.RunView; `summary.json` comes from records/summary.py and
the console's summary from console.py: they are not plugins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.errors import ParityError
from parity.plugins import REPORTS
from parity.records.summary import Summary, summarize
from parity.records.view import RunView


@dataclass(frozen=True)
class ReportWriter:
    name: str
    filename: str  # what it writes in the output folder
    write: Callable[[RunView, Summary, Path], None]  # (the run's records, summary, path)


def report_writers() -> list[ReportWriter]:
    return [REPORTS.get(name) for name in REPORTS.names()]


def write_reports(out_dir: str | Path, records: RunView | list[dict[str, Any]], summary: Summary | None = None,
                  names: tuple[str, ...] | None = None) -> list[Path]:
    """Write the reports whose file names are `names` (every registered writer's by default) of one run into
    `out_dir`; returns their paths."""
    writers = {w.filename: w for w in report_writers()}
    unknown = [n for n in names or () if n not in writers]
    if unknown:
        raise ParityError(f"unknown report '{unknown[0]}' (parity writes {', '.join(writers)})")
    out_dir = Path(out_dir)
    view = RunView.of(records)
    summary = summary if summary is not None else summarize(view)
    paths = []
    for name in names if names is not None else list(writers):
        writers[name].write(view, summary, out_dir / name)
        paths.append(out_dir / name)
    return paths
