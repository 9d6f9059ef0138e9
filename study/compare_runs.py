"""Which decisions differ between two runs of one experiment on one commit (issue #27): reproducibility.

Run the same experiment twice (study/repro_threads.sh: one torch thread, then two) and compare every check's
verdict, keyed by (tier, model, input set, target): a check whose verdict or failure class differs between
the runs is *unstable*, and its verdict in either run is not evidence of drift. Also takes two JSONL files of
study/detector_at_scale.py (`--threads 1` and `--threads 2`): an image whose decision changed (F1 < 1) in one
run and not in the other is unstable. Prints the unstable ones and a count; exit 0.

    .venv/bin/python study/compare_runs.py parity-out/repro-t1 parity-out/repro-t2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from study_tables import check_decisions, image_decisions, load_records, unstable  # noqa: E402


def decisions(path: Path) -> dict[tuple, tuple]:
    """Each check's (passed, failure class) by (tier, model, inputs, target); for detector_at_scale.py's rows
    (one thread count per file), each image's (decision changed, error) by (target, image)."""
    rows = load_records(path)
    if rows and "kind" not in rows[0]:  # detector_at_scale.py's rows, not a run's records
        return image_decisions(rows, rows[0]["threads"])
    return check_decisions(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    first, second = decisions(args.first), decisions(args.second)
    keys = unstable(first, second)
    for key in keys:
        print(f"unstable: {' / '.join(str(k) for k in key)}: {first[key]} then {second[key]}")
    both = len(first.keys() & second.keys())
    print(f"{len(keys)} of {both} decisions differ between {args.first} and {args.second}"
          + (f"; {len(first.keys() ^ second.keys())} in one run only" if first.keys() != second.keys() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
