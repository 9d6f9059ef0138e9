"""How parity scales: a model x target matrix on Ray with one worker and with two, and the quickstart
cold (empty artifact cache) against warm.

1. Ray: 4 torchvision models (resnet18, mobilenet_v3_small, squeezenet1_1, shufflenet_v2_x0_5, seeded
   init) x the 4 CPU targets of the study's first run (torch.compile, onnxruntime, torchscript, eager
   bfloat16) on two photos, 3 repeats, run by `run_experiment` with the ray executor, which starts a
   local Ray and stops it at the end (its start is counted). A worker is one CPU, as a Ray task asks for
   by default: one torch thread and one torch.compile process (runner/worker.py's use_cpus); the two
   configurations are `workers: 1` and `workers: 2`, so the second has twice the CPUs, as adding a
   worker to a cluster adds its CPU. Every run starts cold: the artifact cache is off and torch.compile
   gets an empty cache folder of its own, so each run exports and compiles afresh. The configurations
   alternate for --rounds rounds and the medians count (the load average is printed: on a shared machine
   other people's work slows either one). Goal: two workers / one worker <= 0.6. For context, one run
   gives the single worker both cores as threads instead (`threads: 2`): what process parallelism gains
   over torch's own threads on the same cores. Each run prints its wall time and the time its executions
   spent in backends (preparation plus runs, from the records); the rest is fixed cost: starting Ray,
   importing torch in each worker, the driver building each model and judging.
2. Cache: `parity run examples/quickstart.yaml` in a fresh process with an empty `--cache-dir` (the
   inductor cache points into it, execute/cache.py), then again with the same folder. Goal: cold / warm >= 3.

Run it from the repository root (about fifteen minutes on 2 cores):

    .venv/bin/python benchmarks/scale.py [--part ray|cache|both] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RAY_GOAL = 0.6
CACHE_GOAL = 3.0
MODELS = [
    {"name": "resnet18", "builder": "resnet18", "task": "classification"},
    {"name": "mobilenet_v3_small", "builder": "mobilenet_v3_small", "init": "fan_in", "task": "classification"},
    {"name": "squeezenet1_1", "builder": "squeezenet1_1", "task": "classification"},
    {"name": "shufflenet_v2_x0_5", "builder": "shufflenet_v2_x0_5", "task": "classification"},
]
TARGETS = [
    {"backend": "compile"},
    {"backend": "onnxruntime"},
    {"backend": "torchscript"},
    {"backend": "eager", "dtype": "bfloat16"},
]


def matrix(executor: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "scale",
        "seed": 0,
        "repeats": 3,
        "models": [{"source": "torchvision", **m} for m in MODELS],
        "inputs": [{"name": "photos", "images": ["sample:chelsea", "sample:coffee"],
                    "preprocess": {"resize": 256, "center_crop": 224, "mean": [0.485, 0.456, 0.406],
                                   "std": [0.229, 0.224, 0.225]}}],
        "targets": TARGETS,
        "executor": executor,
    }


def run_matrix(executor: dict[str, Any]) -> tuple[float, float, dict[tuple, bool]]:
    """Wall time, seconds spent in backends (prepare + runs, from the records), and each check's verdict.
    Cold: no artifact cache, and an empty torch.compile cache (Ray's workers inherit the variable)."""
    import torchvision  # noqa: F401 - imported once by this process: only the first run would pay for it

    from parity.api import run_experiment

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="parity-scale-") as out:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(out) / "inductor")
        try:
            start = time.perf_counter()
            records = run_experiment(matrix(executor), out=Path(out) / "run", reports=())
            wall = time.perf_counter() - start
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
            if before is not None:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    busy = sum((r["prepare_s"] or 0.0) + (r["run_s"] or 0.0) for r in records if r["kind"] == "execution")
    verdicts = {(r["model"], r["target"], r["tier"]): r["passed"] for r in records if r["kind"] == "check"}
    return wall, busy, verdicts


def ray_part(workers: int, rounds: int) -> None:
    cores = os.cpu_count() or 1
    configs = {"ray, 1 worker": {"kind": "ray", "workers": 1}, f"ray, {workers} workers": {"kind": "ray", "workers": workers}}
    print(f"matrix: {len(MODELS)} models x {len(TARGETS)} targets; {cores} cores; one CPU per worker; cold caches; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    walls: dict[str, list[float]] = {name: [] for name in configs}
    reference: dict[tuple, bool] | None = None
    for i in range(rounds):  # alternating, so that a neighbour's load falls on both alike
        for name in (configs if i % 2 == 0 else reversed(list(configs))):
            wall, busy, verdicts = run_matrix(configs[name])
            walls[name].append(wall)
            print(f"round {i + 1}: {name:<18} wall {wall:7.1f} s   in backends {busy:7.1f} s   "
                  f"{sum(verdicts.values())}/{len(verdicts)} checks pass   load average {os.getloadavg()[0]:.1f}", flush=True)
            reference = reference or verdicts
            if verdicts != reference:
                differ = sorted(k for k in reference if verdicts.get(k) != reference[k])
                print(f"note: {name} gives other verdicts than the first run on {differ}")
    one, many = (statistics.median(w) for w in walls.values())
    print(f"median wall: 1 worker {one:.1f} s, {workers} workers {many:.1f} s")
    print(f"ray {workers} workers / 1 worker: {many / one:.3f} (goal <= {RAY_GOAL})")
    wall, busy, verdicts = run_matrix({"kind": "ray", "workers": 1, "threads": cores})
    print(f"context, one run: 1 worker with {cores} threads (every core, as torch threads): wall {wall:.1f} s   in backends "
          f"{busy:.1f} s   {sum(verdicts.values())}/{len(verdicts)} checks pass; {workers} one-CPU workers / this: "
          f"{many / wall:.3f}")
    print("failing checks: " + ", ".join(f"{m} / {t} (tier {tier})" for (m, t, tier), ok in reference.items() if not ok))


def parity_run(cache_dir: Path, out: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "PARITY_CACHE_DIR")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "parity.cli", "run", str(REPO / "examples" / "quickstart.yaml"),
                           "--cache-dir", str(cache_dir), "--out", str(out), "--quiet"],
                          env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: the quickstart's bfloat16 target fails on purpose
        raise SystemExit(f"parity run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def cache_part() -> None:
    with tempfile.TemporaryDirectory(prefix="parity-scale-cache-") as tmp:
        cache_dir = Path(tmp) / "cache"
        cold = parity_run(cache_dir, Path(tmp) / "cold")
        print(f"quickstart cold (empty --cache-dir): {cold:7.1f} s", flush=True)
        warm = parity_run(cache_dir, Path(tmp) / "warm")
        print(f"quickstart warm (same --cache-dir):  {warm:7.1f} s")
    print(f"cold / warm: {cold / warm:.2f} (goal >= {CACHE_GOAL})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["ray", "cache", "both"], default="both")
    parser.add_argument("--workers", type=int, default=2, help="workers of the parallel Ray configuration")
    parser.add_argument("--rounds", type=int, default=3, help="Ray runs of each configuration (the median counts)")
    args = parser.parse_args()
    if args.rounds < 1 or args.workers < 2:
        parser.error("--rounds must be at least 1 and --workers at least 2")
    if args.part in ("ray", "both"):
        ray_part(args.workers, args.rounds)
    if args.part in ("cache", "both"):
        cache_part()


if __name__ == "__main__":
    main()
