"""Memory that scales with the model (issue #26): peak resident memory of `parity run` on a random-init
LLaMA-style decoder checked on 3 CPU targets, under the old schedule (every backend of a job prepared
together: its copies all alive at once) and under this checkout's, as a ratio to the model's size in float32.
Goal: <= 2.5x for 3 targets, against (targets + 2)x before.

"before" runs this same script's experiment with the `src/` of `--before` (a git revision with the old schedule;
default: the commit this change was made on), extracted to a temporary folder and put first on PYTHONPATH;
"after" runs this checkout. Each run is its own process, its peak read from the kernel (ru_maxrss of a wrapper's
children), so nothing of one run lingers in the other. The width is TinyLlama's (hidden 2048, MLP 5632, 32 heads,
4 key-value heads, vocabulary 32000); `--layers` sets the size: 22 layers is 1.1B parameters (4.4 GB), 9 layers
0.53B, 3 layers 0.26B. The targets: eager bfloat16, eager int8 weight-only (torchao) and torch.compile, against
eager float32, one timed run each, on one sequence of `--tokens` token ids; tier 1 only.

    nice -n 10 .venv/bin/python benchmarks/memory_scale.py [--layers 22] [--skip before]

Issue #38's sets (`--targets onnxruntime`: one ONNX Runtime target, goal <= 2x; `--targets three`: ONNX Runtime,
int8 weight-only and bfloat16, goal <= 2.5x) on 6 layers (0.40B parameters, 1.58 GB), against `--before` the
commit the memory work started from:

    nice -n 10 .venv/bin/python benchmarks/memory_scale.py --layers 6 --targets onnxruntime --before adf9a77
    nice -n 10 .venv/bin/python benchmarks/memory_scale.py --layers 6 --targets three --before adf9a77

and against 438ff62, the last commit whose runner held its model beside every backend's copy (`--before 438ff62`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARITY = str(Path(sys.executable).with_name("parity"))
OLD_SCHEDULE = "13aa4a7"  # the last commit that prepared every backend of a job together

PEAK_OF = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)
# The same libraries imported and nothing built: what every run's peak holds before any model.
IMPORTS = ("import parity.cli, parity.backends.compile, parity.backends.quantize, parity.backends.onnxruntime, "
           "transformers, torchao, onnxruntime")


def llama(layers: int) -> dict:
    return {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": layers,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048}


def parameters(config: dict) -> int:
    """The decoder's parameter count, from its config (untied embedding and head)."""
    h, m, v, layers = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * m + 2 * h
    return layers * per_layer + 2 * v * h + h


# The targets of each measured set: issue #26's (the schedule), and issue #38's (one ONNX Runtime target, and ONNX
# Runtime with int8 weight-only and bfloat16: the copies an export and its session hold).
TARGET_SETS = {
    "schedule": [{"backend": "eager", "dtype": "bfloat16"},
                 {"backend": "eager", "quantize": {"scheme": "torchao-int8-weight"}},
                 {"backend": "compile"}],
    "onnxruntime": [{"backend": "onnxruntime"}],
    "three": [{"backend": "onnxruntime"}, {"backend": "eager", "quantize": {"scheme": "torchao-int8-weight"}},
              {"backend": "eager", "dtype": "bfloat16"}],
}
GOALS = {"schedule": 2.5, "onnxruntime": 2.0, "three": 2.5}


def experiment(layers: int, tokens: int, targets: str = "schedule") -> dict:
    return {
        "name": "memory-scale",
        "models": [{"name": "decoder", "source": "transformers", "config": llama(layers),
                    "architecture": "LlamaForCausalLM"}],
        "inputs": [{"name": "ids", "synthetic": {"shape": [1, tokens], "dtype": "int64", "distribution": "randint",
                                                 "low": 0, "high": 32000}}],
        "reference": {"backend": "eager"},
        "targets": TARGET_SETS[targets],
        "repeats": 1,
        "warmup": 0,
    }


def peak_of(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall s, peak GB, exit code) of `command` in its own process."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK_OF, *command], capture_output=True, text=True, check=True,
                            env=env)
    rc, peak_kib = map(int, result.stdout.split())
    return time.perf_counter() - start, peak_kib * 1024 / 1e9, rc


def old_source(revision: str, into: Path) -> Path:
    """`src/` of `revision`, extracted from this repository into `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def schedule_of(out: Path) -> str:
    """How the run held its backends (from the execution records), and any check without a verdict."""
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    flags = {r["latency_interleaved"] for r in records if r["kind"] == "execution"}
    checks = [r for r in records if r["kind"] == "check"]
    failed = [f"{c['target']}: {c.get('failure_class')}" for c in checks if c.get("status") != "ok"]
    return ("together" if flags == {True} else "one at a time" if flags == {False} else str(flags)) + (
        f"; not judged: {', '.join(failed)}" if failed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=22, help="decoder layers (22: 1.1B parameters)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--before", default=OLD_SCHEDULE, help="a git revision with the old schedule")
    parser.add_argument("--skip", choices=("before", "after"), help="measure only the other schedule (memory)")
    parser.add_argument("--targets", choices=sorted(TARGET_SETS), default="schedule",
                        help="schedule: eager bfloat16, int8 weight-only, compile (#26); onnxruntime: one ONNX Runtime "
                             "target; three: ONNX Runtime, int8 weight-only, bfloat16 (#38)")
    args = parser.parse_args()
    size = parameters(llama(args.layers)) * 4 / 1e9
    rows = {}
    with tempfile.TemporaryDirectory(prefix="memory-scale-") as tmp:
        path = Path(tmp) / "exp.json"
        path.write_text(json.dumps(experiment(args.layers, args.tokens, args.targets)))  # JSON is YAML
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        _, base, _ = peak_of([sys.executable, "-c", IMPORTS], env)
        for schedule in ("before", "after"):
            if schedule == args.skip:
                continue
            run_env = dict(env)
            if schedule == "before":
                run_env["PYTHONPATH"] = str(old_source(args.before, Path(tmp)))
            out = Path(tmp) / schedule
            wall, peak, rc = peak_of([PARITY, "run", str(path), "--out", str(out), "--quiet", "--no-report"], run_env)
            rows[schedule] = wall, peak, rc, schedule_of(out)
    targets = ", ".join(f"{t['backend']}{' ' + t['dtype'] if 'dtype' in t else ''}"
                        f"{' ' + t['quantize']['scheme'] if 'quantize' in t else ''}" for t in TARGET_SETS[args.targets])
    print(f"LLaMA-style decoder, {args.layers} layers: {parameters(llama(args.layers)) / 1e9:.2f}B parameters, "
          f"{size:.2f} GB in float32; reference eager float32; targets {targets}; imports alone {base:.2f} GB")
    print("| schedule | backends held | peak GB | peak / model | wall s | exit |\n|---|---|---|---|---|---|")
    for schedule, (wall, peak, rc, how) in rows.items():
        label = f"before ({args.before})" if schedule == "before" else "after"
        print(f"| {label} | {how} | {peak:.2f} | {peak / size:.2f}x | {wall:.0f} | {rc} |")
    if "after" in rows:
        print(f"after: peak / model {rows['after'][1] / size:.2f}x (goal <= {GOALS[args.targets]})")


if __name__ == "__main__":
    main()
