"""Reports rendered from the records alone: report.md (a short summary), report.html (the whole story,
self-contained) and junit.xml (one testcase per check, for CI). `summary.json` comes from records/summary.py;
every report reads the records through records.view.RunView."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parity.records.view import RunView

REPORT_FILES = ("report.md", "report.html", "junit.xml")


def write_reports(out_dir: str | Path, records: RunView | list[dict[str, Any]], summary: dict[str, Any] | None = None,
                  names: tuple[str, ...] = REPORT_FILES) -> list[Path]:
    """Write the reports `names` (all of them by default) of one run into `out_dir`; returns their paths."""
    from parity.errors import ParityError
    from parity.records.summary import summarize
    from parity.records.view import RunView
    from parity.report.html import write_html
    from parity.report.junit import write_junit
    from parity.report.markdown import write_markdown

    writers = {"report.md": write_markdown, "report.html": write_html, "junit.xml": write_junit}
    unknown = [n for n in names if n not in writers]
    if unknown:
        raise ParityError(f"unknown report '{unknown[0]}' (parity writes {', '.join(REPORT_FILES)})")
    out_dir = Path(out_dir)
    view = RunView.of(records)
    summary = summary if summary is not None else summarize(view)
    paths = []
    for name in names:
        writers[name](view, summary, out_dir / name)
        paths.append(out_dir / name)
    return paths
