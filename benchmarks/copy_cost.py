"""What a backend's copy of the model costs in wall time (issue #38, memory that scales): a deep copy of a model
the runner keeps (every copy at 438ff62, `own_copy`; still every copy of backends prepared together) against a copy
built again from the model's spec and checked against the first build's digest (runner/prepared.py
`ModelCopies.model`: every copy but the first when backends run one at a time), for the 0.4B-parameter LLaMA-style
decoder of benchmarks/memory_scale.py and the vision models of examples/quickstart.yaml, side by side in one process. Each figure is the median of `--repeats` timings; the
first build (the one every run makes, before and after) is timed once.

    nice -n 10 .venv/bin/python benchmarks/copy_cost.py [--layers 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from memory_scale import experiment, llama, parameters  # noqa: E402

from parity.api import _experiment  # noqa: E402
from parity.execute.cache import weights_digest  # noqa: E402
from parity.runner.prepared import ModelCopies, model_bytes, prepared_model  # noqa: E402


def timed(make, *args) -> float:
    start = time.perf_counter()
    made = make(*args)
    took = time.perf_counter() - start
    del made
    gc.collect()
    return took


def row(name: str, spec, exp, repeats: int) -> str:
    start = time.perf_counter()
    first, _ = prepared_model(spec, exp)
    build = time.perf_counter() - start
    size = model_bytes(first) / 1e9
    deep = statistics.median(timed(copy.deepcopy, first) for _ in range(repeats))
    digest = statistics.median(timed(weights_digest, first) for _ in range(repeats))
    home = ModelCopies.built(spec, exp, first)
    del first
    home.model()  # the first build, handed to the first copy
    rebuilt = statistics.median(timed(home.model) for _ in range(repeats))
    return (f"| {name} | {size:.3f} | {build:.2f} | {deep:.2f} | {rebuilt:.2f} | {digest:.2f} | "
            f"{rebuilt - deep:+.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats}")
    print("| model | GB (float32) | first build s | deep copy s (before) | built again + digest s (after) | "
          "of which digest s | after - before s |\n|---|---|---|---|---|---|---|")
    decoder = _experiment(experiment(args.layers, 32, "onnxruntime"))
    print(row(f"LLaMA-style decoder, {args.layers} layers, {parameters(llama(args.layers)) / 1e9:.2f}B", decoder.models[0],
              decoder, args.repeats), flush=True)
    quickstart = _experiment(str(REPO / "examples" / "quickstart.yaml"))
    for spec in quickstart.models:
        print(row(f"{spec.name} (quickstart)", spec, quickstart, args.repeats), flush=True)


if __name__ == "__main__":
    main()
