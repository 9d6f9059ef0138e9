"""`make llm-demo`'s run (examples/smollm2.yaml: SmolLM2-135M on 9 targets, 1,020 scored positions) timed as a user
meets it: the `parity run` process from an empty artifact cache (a fresh clone; `--cache-dir` to reuse one), its wall
time, the CPU time of its whole process tree (llama.cpp's workers included), the peak resident memory of the tree
(the sum over its processes, sampled every 0.2 s) and of its largest process, the load average beside them, and each
target's preparation and run time from its records.

    .venv/bin/python benchmarks/llm_demo.py [--out parity-out/llm-demo-bench] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def tree_rss(process: psutil.Process) -> tuple[int, int]:
    """The resident bytes of `process` and its descendants together, and of the largest one."""
    sizes = []
    for p in [process, *process.children(recursive=True)]:
        try:
            sizes.append(p.memory_info().rss)
        except psutil.Error:  # ended between the listing and the reading
            pass
    return sum(sizes), max(sizes, default=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "parity-out" / "llm-demo-bench"))
    parser.add_argument("--cache-dir", default=None, help="an artifact cache to use (default: a new, empty one)")
    args = parser.parse_args()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="llm-demo-cache-")
    cold = not Path(cache).exists() or not any(Path(cache).iterdir())
    command = [str(ROOT / ".venv" / "bin" / "parity"), "run", str(ROOT / "examples" / "smollm2.yaml"), "--out", args.out,
               "--cache-dir", cache]
    loads, peak, largest = [os.getloadavg()[0]], [0], [0]
    start = time.perf_counter()
    with open(Path(tempfile.gettempdir()) / "llm-demo-bench.log", "w") as log:
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        process = psutil.Process(child.pid)
        done = threading.Event()

        def sample():
            last = 0.0
            while not done.is_set():
                try:
                    total, one = tree_rss(process)
                except psutil.Error:
                    break
                peak[0], largest[0] = max(peak[0], total), max(largest[0], one)
                if time.perf_counter() - last > 30:
                    loads.append(os.getloadavg()[0])
                    last = time.perf_counter()
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = child.wait()
        done.set()
        sampler.join()
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"parity run examples/smollm2.yaml: exit {code}, wall {wall:.0f} s, CPU {usage.ru_utime + usage.ru_stime:.0f} s "
          f"(user {usage.ru_utime:.0f} s) of its process tree; peak resident memory {peak[0] / 2**30:.2f} GiB of the tree, "
          f"{largest[0] / 2**30:.2f} GiB its largest process; load average (1 min) {min(loads):.1f} to {max(loads):.1f} "
          f"on {os.cpu_count()} cores; artifact cache {cache} {'empty' if cold else 'filled'} at the start")
    print(f"{'target':<28} {'prepare s':>10} {'run s':>8} {'tier 3':>7} {'mean KLD':>10} {'same top-1':>11} {'PPL ratio':>10}")
    tier3 = {}
    executions = []
    for line in (Path(args.out) / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "execution":
            executions.append(r)
        elif r["kind"] == "check" and r.get("tier") == 3:
            tier3[r["target"]] = r
    for r in executions:
        t = tier3.get(r["backend"], {})
        m = t.get("metrics") or {}
        verdict = "" if not t else "pass" if t.get("passed") else "FAIL"
        print(f"{r['backend']:<28} {r.get('prepare_s') or 0:>10.1f} {r.get('run_s') or 0:>8.1f} {verdict:>7} "
              f"{m.get('kl_mean', float('nan')):>10.4g} {m.get('same_top1', float('nan')):>11.4f} "
              f"{m.get('perplexity_ratio', float('nan')):>10.4f}")
    return code


if __name__ == "__main__":
    sys.exit(main())
