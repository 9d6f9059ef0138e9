"""What parity's verification costs, measured side by side in one process.

1. Overhead: parity running the experiment (`run_experiment`: executions, comparisons, records, report)
   against a bare script making the same executions with nothing else (for each model and input set,
   every backend in [reference, oracle, *targets] prepares its own deep copy and runs `repeats` times).
   Goal: parity / bare <= 1.10.
2. Sweep: parity with the file's atol sweep against the same experiment with a single atol (1e-4).
   A sweep only re-reads the same comparison, so it should cost nothing: goal <= 1.02. The execution
   records of both runs are counted, to show that no model runs twice.

torch.compile's first compile is slow and later ones hit the inductor cache, so one bare warm-up pass
runs first and is not counted; then bare, parity and parity-single-atol alternate for --rounds rounds.
Medians, their ratios and every round's times are printed. Torch's thread count is left as it is.

Run it from the repository root (a few minutes on a small machine):

    .venv/bin/python benchmarks/overhead.py [--rounds 3] [--config examples/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from parity.api import run_experiment
from parity.backends import create_backend
from parity.config import Experiment
from parity.experiment import load_experiment
from parity.inputs import build_inputs
from parity.models import build_model
from parity.runner.plan import plan

REPO = Path(__file__).resolve().parents[1]
SINGLE_ATOL = 1e-4
OVERHEAD_GOAL = 1.10
SWEEP_GOAL = 1.02


def bare(config: Path) -> None:
    """The executions parity makes, with no comparisons and no records."""
    exp = load_experiment(config)
    jobs = plan(exp)
    for model_spec in exp.models:
        model = build_model(model_spec, exp)
        for job in (j for j in jobs if j.model is model_spec):
            inputs = build_inputs(job.inputs, exp, model_spec.batch_mode)
            for spec in job.backends:
                backend = create_backend(spec)
                backend.prepare(copy.deepcopy(model), inputs)
                for _ in range(exp.repeats):
                    backend.run(inputs)
                backend.close()


def single_atol(config: Path) -> Experiment:
    """The experiment of `config` with one atol instead of its sweep (everything else unchanged)."""
    exp = load_experiment(config)
    single = exp.model_copy(deep=True)
    single.tolerances.atol = [SINGLE_ATOL]
    single._base_dir = exp.base_dir  # private attributes do survive model_copy; set it to be sure
    return single


def run_parity(source: Path | Experiment) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="parity-overhead-") as out:
        return run_experiment(source, out=out, progress=False)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def executions(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(execution records, distinct (model, inputs, backend, repeat) among them)."""
    runs = [r for r in records if r["kind"] == "execution"]
    return len(runs), len({(r["model"], r["inputs"], r["backend"], r["repeat"]) for r in runs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", type=Path, default=REPO / "examples" / "quickstart.yaml")
    args = parser.parse_args()

    exp = load_experiment(args.config)
    expected = sum(job.executions for job in plan(exp))
    print(f"{args.config}: {len(exp.models)} models, {expected} executions, atol sweep {exp.tolerances.atol}, "
          f"torch threads {torch.get_num_threads()}")
    warmup, _ = timed(lambda: bare(args.config))
    print(f"warm-up (bare, not counted): {warmup:.1f} s")

    times: dict[str, list[float]] = {"bare": [], "parity": [], "parity 1 atol": []}
    counts: dict[str, tuple[int, int]] = {}
    for i in range(args.rounds):
        times["bare"].append(timed(lambda: bare(args.config))[0])
        t, records = timed(lambda: run_parity(args.config))
        times["parity"].append(t)
        counts["parity"] = executions(records)
        t, records = timed(lambda: run_parity(single_atol(args.config)))
        times["parity 1 atol"].append(t)
        counts["parity 1 atol"] = executions(records)
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print()
    for name, ts in times.items():
        print(f"{name:<14} median {med[name]:7.2f} s   rounds: {', '.join(f'{t:.2f}' for t in ts)}")
    for name, (n, distinct) in counts.items():
        print(f"{name:<14} execution records: {n} ({distinct} distinct; the plan has {expected})")
    print()
    print(f"parity / bare:            {med['parity'] / med['bare']:.3f} (goal <= {OVERHEAD_GOAL:.2f})")
    print(f"sweep / single atol:      {med['parity'] / med['parity 1 atol']:.3f} (goal <= {SWEEP_GOAL:.2f})")


if __name__ == "__main__":
    main()
