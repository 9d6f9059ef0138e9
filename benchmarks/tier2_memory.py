"""What tier 2 costs in memory: peak resident memory of `parity run` on a ResNet-50 with tier 1 only,
and of the same run with tier 2 (localization of the failing check) switched on. Goal: <= 1.25.

The target is eager bfloat16, which fails tier 1 on a seeded ResNet-50, so tier 2 localizes it
(hierarchical descent, local and propagated modes). Each run is its own process; its peak is read from
the kernel (ru_maxrss of a wrapper's children), so nothing of one run lingers in the other.

    .venv/bin/python benchmarks/tier2_memory.py [--model resnet50] [--size 224]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARITY = str(Path(sys.executable).with_name("parity"))
GOAL = 1.25

PEAK_OF = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def experiment(model: str, size: int, tier2: bool) -> dict:
    exp = {
        "name": f"{model}-tier{'2' if tier2 else '1'}",
        "models": [{"name": model, "builder": model, "task": "classification"}],
        "inputs": [{"name": "photo", "images": ["sample:chelsea"],
                    "preprocess": {"resize": size, "center_crop": size, "mean": [0.485, 0.456, 0.406],
                                   "std": [0.229, 0.224, 0.225]}}],
        "targets": [{"backend": "eager", "dtype": "bfloat16"}],
    }
    if tier2:
        exp["tiers"] = {"activations": {"granularity": "blocks", "mode": "both"}}
    return exp


def measure(path: Path, out: Path) -> tuple[float, float, int]:
    """(wall s, peak MiB, exit code) of one `parity run` in its own process."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK_OF, PARITY, "run", str(path), "--out", str(out), "--quiet"],
                            capture_output=True, text=True, check=True)
    rc, peak_kib = map(int, result.stdout.split())
    return time.perf_counter() - start, peak_kib / 1024, rc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tier2 in (False, True):
            path = Path(tmp) / f"tier{int(tier2) + 1}.json"
            path.write_text(json.dumps(experiment(args.model, args.size, tier2)))  # JSON is YAML
            wall, peak, rc = measure(path, Path(tmp) / path.stem)
            layers = [json.loads(line) for line in (Path(tmp) / path.stem / "records.jsonl").read_text().splitlines()]
            layers = [r for r in layers if r["kind"] == "layers"]
            rows[tier2] = (wall, peak, rc, layers[0]["culprit"] if layers else "-")
    print(f"{args.model}, one {args.size}x{args.size} photo, target eager bfloat16")
    for tier2, (wall, peak, rc, culprit) in rows.items():
        print(f"  tier 1{' + tier 2' if tier2 else '         '}: {wall:6.1f} s, peak {peak:7.0f} MiB, exit {rc}, "
              f"localized at: {culprit}")
    ratio = rows[True][1] / rows[False][1]
    print(f"peak with tier 2 / tier 1 only: {ratio:.3f} (goal <= {GOAL})")


if __name__ == "__main__":
    main()
