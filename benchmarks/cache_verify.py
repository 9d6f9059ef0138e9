"""What verifying a cache hit costs (execute/cache.py's `entry_problem`: the manifest read and a sha256 of every
file of the entry) on the quickstart's artifacts: resnet18 and mobilenet_v3_small (examples/quickstart.yaml,
seeded init) exported for its ONNX Runtime and TorchScript targets, batch 4 at 224x224 as its photos are.
Each warm `prepare` (the key, the hit, loading the artifact) is timed with verification and with it
switched off, alternating, in one process; the verification alone is timed too.

    .venv/bin/python benchmarks/cache_verify.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch
import torchvision

from parity.backends import create_backend
from parity.config.schema import BackendSpec
from parity.execute import cache
from parity.inputs import Inputs

MODELS = {"resnet18": {}, "mobilenet_v3_small": {}}
TARGETS = ("onnxruntime", "torchscript")


def prepare_s(store: cache.ArtifactCache, name: str, model, example, target: str) -> tuple[float, bool | None]:
    backend = create_backend(BackendSpec(backend=target))
    with store.for_model(name) as artifacts:
        backend.artifacts = artifacts
        start = time.perf_counter()
        backend.prepare(copy.deepcopy(model), example.clone())
        elapsed = time.perf_counter() - start
    hit = backend.cache_hit
    backend.close()
    return elapsed, hit


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    verify = cache.entry_problem
    print(f"warm prepare (median of {args.repeats}, alternating); verification alone (median of {args.repeats})")
    print(f"{'model / target':34s} {'entry':>9s} {'verify':>9s} {'prepare on':>11s} {'prepare off':>12s} {'ratio':>6s}")
    with tempfile.TemporaryDirectory() as root:
        store = cache.ArtifactCache(Path(root))
        for name in MODELS:
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, weights=None).eval()
            example = Inputs((torch.randn(4, 3, 224, 224),), {})
            for target in TARGETS:
                before = set((Path(root) / cache.ARTIFACTS).glob("*")) if (Path(root) / cache.ARTIFACTS).exists() else set()
                _, hit = prepare_s(store, name, model, example, target)  # cold: exports
                assert hit is False
                [entry] = set((Path(root) / cache.ARTIFACTS).glob("*")) - before
                parts = json.loads((entry / cache.ENTRY_FILE).read_text())["parts"]
                size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
                on, off, alone = [], [], []
                for _ in range(args.repeats):
                    cache.entry_problem = verify
                    elapsed, hit = prepare_s(store, name, model, example, target)
                    assert hit is True
                    on.append(elapsed)
                    cache.entry_problem = lambda folder, key, parts: None  # what a hit cost before: no verification
                    elapsed, hit = prepare_s(store, name, model, example, target)
                    assert hit is True
                    off.append(elapsed)
                    start = time.perf_counter()
                    assert verify(entry, entry.name, parts) is None
                    alone.append(time.perf_counter() - start)
                cache.entry_problem = verify
                print(f"{name + ' / ' + target:34s} {size / 1e6:7.1f}MB {median(alone) * 1e3:7.1f}ms "
                      f"{median(on) * 1e3:9.1f}ms {median(off) * 1e3:10.1f}ms {median(on) / median(off):6.3f}")


if __name__ == "__main__":
    main()
