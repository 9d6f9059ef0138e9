"""What the deterministic NMS adapter does to the reference itself, measured on the experiment's own models.

An adapter that restores agreement between backends is only useful if it keeps the model's answers: the
adapted reference should find the boxes the unadapted one finds. For every model entry with the
`deterministic_nms` adapter, this builds the entry twice (with and without the adapter, the same seed,
weights and params), runs both eagerly in float32 on the entry's input sets and prints, per image set:

- boxes: how many each side keeps;
- kept: the unadapted boxes the adapted run also finds (matched one to one within a label at IoU 0.5);
- F1 of that matching, and the adapted run's mAP@0.5 with the unadapted boxes taken as ground truth;
- latency: the median forward time of each, measured interleaved (A, B, A, B, ...) so that load on the
  machine falls on both alike, and their ratio.

Whether the adapter restores agreement between backends is a run's tier-3 result (docs/study.md's adapter
table); this script answers the other half, its fidelity.

    .venv/bin/python benchmarks/adapter_fidelity.py [examples/study.yaml] [--repeats 5] [--model NAME ...] [--json OUT]

`--json OUT` also appends one JSON line per row to OUT (with the experiment's name and the commit), the form
docs/study.md's fidelity table is generated from (benchmarks/study_tables.py, docs/study-adapter-fidelity.jsonl).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from parity.experiment import load_experiment
from parity.inputs import build_inputs
from parity.runner.prepared import prepared_model
from parity.verify.tasks.detection import average_precision, detections_of, match
from parity.verify.tasks.flips import Detections

REPO = Path(__file__).resolve().parents[1]
ADAPTER = "deterministic_nms"
MATCH_IOU = 0.5


def fidelity(unadapted: list[Detections], adapted: list[Detections]) -> dict[str, float | int]:
    """Boxes on each side, the unadapted boxes the adapted run keeps, F1 and mAP of adapted against unadapted."""
    boxes_before = sum(len(d) for d in unadapted)
    boxes_after = sum(len(d) for d in adapted)
    kept = sum(len(match(u, a, MATCH_IOU)) for u, a in zip(unadapted, adapted, strict=True))
    f1 = 1.0 if boxes_before + boxes_after == 0 else 2 * kept / (boxes_before + boxes_after)
    return {"boxes_before": boxes_before, "boxes_after": boxes_after, "kept": kept, "f1": f1,
            "map": average_precision(unadapted, adapted, MATCH_IOU)}


def interleaved_medians(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of `first()` and `second()`, timed alternately after one untimed call of each."""
    first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "examples" / "study.yaml"))
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards of each side (default 5)")
    parser.add_argument("--model", action="append", help="only these model entries (default: every adapted one)")
    parser.add_argument("--json", type=Path, help="also append each row to this JSONL file")
    args = parser.parse_args(argv)
    exp = load_experiment(args.config)
    entries = [m for m in exp.models if any(a.name == ADAPTER for a in exp.adapters_for(m))
               and (not args.model or m.name in args.model)]
    if not entries:
        print(f"no model entry in {args.config} uses the {ADAPTER} adapter", file=sys.stderr)
        return 2
    print("| model | inputs | boxes unadapted | boxes adapted | kept | F1 | mAP@0.5 | "
          "latency unadapted | latency adapted | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec in entries:
        plain_spec = spec.model_copy(update={"adapters": []})
        adapted, _ = prepared_model(spec, exp)
        plain, _ = prepared_model(plain_spec, exp)
        for model in (adapted, plain):
            model.eval()
        for input_set in exp.inputs_for(spec):
            inputs = build_inputs(input_set, exp, spec.batch_mode)

            def forward(model, inputs=inputs):
                with torch.inference_mode():
                    return model(*inputs.args, **inputs.kwargs)

            result = fidelity(detections_of(forward(plain)), detections_of(forward(adapted)))
            before, after = interleaved_medians(functools.partial(forward, plain), functools.partial(forward, adapted),
                                                args.repeats)
            print(f"| {spec.name} | {input_set.name} | {result['boxes_before']} | {result['boxes_after']} | "
                  f"{result['kept']} | {result['f1']:.3f} | {result['map']:.3f} | {before * 1e3:.1f} ms | "
                  f"{after * 1e3:.1f} ms | {after / before:.2f} |", flush=True)
            if args.json is not None:
                row = {"experiment": exp.name, "model": spec.name, "inputs": input_set.name, **result,
                       "latency_unadapted_s": before, "latency_adapted_s": after, "repeats": args.repeats,
                       "commit": git_commit()}
                with open(args.json, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


def git_commit() -> str | None:
    """The commit the measuring code is at, as run records name theirs."""
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


if __name__ == "__main__":
    sys.exit(main())
