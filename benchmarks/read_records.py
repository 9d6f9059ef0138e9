"""What reading a run's records costs: `parity.records.read_run` (every line parsed and validated) on the
archived study records (docs/study-v1-records.jsonl.gz, the first study run: 432 records), as the median and the best of repeated
reads in one process; CPU time (this process's), which a busy machine disturbs less than the wall clock. The records are decompressed into a temporary folder first, outside the timing.

    .venv/bin/python benchmarks/read_records.py [--repeats 50]
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python benchmarks/read_records.py   # another version
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from pathlib import Path

from parity.records import read_run

ARCHIVE = Path(__file__).resolve().parent.parent / "docs" / "study-v1-records.jsonl.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "records.jsonl").write_bytes(gzip.decompress(ARCHIVE.read_bytes()))
        count = len(read_run(folder))  # the first read imports what reading needs: not timed
        wall, cpu = [], []
        for _ in range(args.repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            read_run(folder)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    print(f"read_run: {count} records, over {args.repeats} reads: CPU time median {statistics.median(cpu) * 1e3:.1f} ms "
          f"(best {min(cpu) * 1e3:.1f}); wall median {statistics.median(wall) * 1e3:.1f} ms (best {min(wall) * 1e3:.1f})")


if __name__ == "__main__":
    main()
