"""Where a run's memory goes, step by step: `parity run ARGS` in this process (its `main()`, not the `parity` command's
second process), with each backend's steps (prepare, warm-up, each timed run, follow-up, close) and each tier-3
evaluation wrapped to print the resident memory before the step, the highest a thread sampling it every 5 ms saw
during the step, and after it. A Python frame is never read from the sampling thread (reading the main thread's stack
while torch runs crashed a run here): the steps are known by the functions wrapped.

    nice -n 5 .venv/bin/python benchmarks/memory_phases.py run examples/smollm2.yaml --target onnxruntime-cpu \\
        --out parity-out/phases --cache-dir parity-out/cache-llm

Used for make llm-demo's peak (docs/benchmarks.md, "make llm-demo"); the numbers depend on the machine's free memory
(the local executor's schedule reads it) and on what the C allocator keeps.
"""

from __future__ import annotations

import sys
import threading

import psutil

GIB = 2 ** 30
STEPS = ("prepare", "warm_up", "repeat", "follow_up", "close")


def main() -> int:
    from parity.cli.main import main as parity_main
    from parity.execute import execution
    from parity.verify.tasks import text_generation

    process = psutil.Process()
    highest = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            highest[0] = max(highest[0], process.memory_info().rss)
            done.wait(0.005)

    def wrap(owner, name: str, label: str) -> None:
        step = getattr(owner, name)

        def wrapped(*args, **kwargs):
            run = getattr(args[0], "result", None) if args else None
            who = run.backend.id if run is not None else ""
            before = process.memory_info().rss
            outer, highest[0] = highest[0], before
            try:
                return step(*args, **kwargs)
            finally:
                after = process.memory_info().rss
                during = max(highest[0], after)
                print(f"{label:<10} {who:<24} before {before / GIB:6.2f}  highest {during / GIB:6.2f}  "
                      f"after {after / GIB:6.2f} GiB", file=sys.stderr, flush=True)
                highest[0] = max(outer, during)

        setattr(owner, name, wrapped)

    for step in STEPS:
        wrap(execution._Run, step, step)
    wrap(text_generation, "evaluate", "tier 3")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        return parity_main(sys.argv[1:])
    finally:
        done.set()
        sampler.join()
        print(f"highest resident memory of the process: {highest[0] / GIB:.2f} GiB", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
