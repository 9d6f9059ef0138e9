"""What reading a run's records costs, on an archived study run (by default the biggest,
docs/study-records.jsonl.gz: 927 records), as the median and the best of repeated passes in one process; CPU
time (this process's), which a busy machine disturbs less than the wall clock. Two passes are timed:

- `read`: `RunView.read` (every line parsed, validated, and typed: the records as records/models.py's models);
- `report`: what `parity report` does apart from drawing the HTML's charts: read, `summarize`, and render
  report.md and junit.xml (matplotlib's drawing is the same whatever the records are).

The records are decompressed into a temporary folder first, outside the timing.

    .venv/bin/python benchmarks/read_records.py [--repeats 20] [--archive docs/study-v1-records.jsonl.gz]
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python benchmarks/read_records.py   # another version
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from pathlib import Path

from parity.records import RunView
from parity.records.summary import summarize
from parity.report.junit import render_junit
from parity.report.markdown import render_markdown

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _read(folder: str) -> None:
    RunView.read(folder)


def _report(folder: str) -> None:
    view = RunView.read(folder)
    summary = summarize(view)
    render_markdown(view, summary, folder)
    render_junit(view, summary, folder)


def _timed(what, folder: str, repeats: int) -> str:
    what(folder)  # the first pass imports what it needs: not timed
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        what(folder)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return (f"CPU time median {statistics.median(cpu) * 1e3:.1f} ms (best {min(cpu) * 1e3:.1f}); "
            f"wall median {statistics.median(wall) * 1e3:.1f} ms (best {min(wall) * 1e3:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--archive", type=Path, default=DOCS / "study-records.jsonl.gz")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "records.jsonl").write_bytes(gzip.decompress(args.archive.read_bytes()))
        count = len(RunView.read(folder))
        print(f"{args.archive.name}: {count} records, {args.repeats} passes each")
        print(f"read:   {_timed(_read, folder, args.repeats)}")
        print(f"report: {_timed(_report, folder, args.repeats)}")


if __name__ == "__main__":
    main()
