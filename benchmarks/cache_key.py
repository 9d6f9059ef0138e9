"""What an artifact cache key costs (execute/cache.py): the whole key for one export of a torchvision model,
and each of its parts, as medians of repeated calls in one process. The code walk (fingerprint.py) is
what the key added to know the model's code; the state dict's bytes were hashed before it too.

    .venv/bin/python benchmarks/cache_key.py [--model resnet18] [--size 224] [--repeats 9]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torchvision

from parity import fingerprint
from parity.backends import create_backend
from parity.config.schema import BackendSpec
from parity.execute import cache
from parity.inputs import Inputs


def median_ms(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model, weights=None).eval()
    example = Inputs((torch.randn(2, 3, args.size, args.size),), {})
    backend = create_backend(BackendSpec(backend="onnxruntime"))
    with tempfile.TemporaryDirectory() as folder:
        artifacts = cache.ArtifactCache(Path(folder))
        identity = args.model
        start = time.perf_counter()
        artifacts.key("onnx", model, backend, example, identity)
        first = (time.perf_counter() - start) * 1e3
        n = args.repeats
        print(f"{args.model}, batch 2, {args.size}x{args.size}, ONNX Runtime target; medians of {n} calls")
        print(f"first key of the process:  {first:8.1f} ms (reads parity's source and the libraries' RECORDs once)")
        print(f"key:                       {median_ms(lambda: artifacts.key('onnx', model, backend, example, identity), n):8.1f} ms")
        print(f"  code walk:               {median_ms(lambda: fingerprint.code_fingerprint(model, type(backend)), n):8.2f} ms")
        print(f"  state dict and repr:     {median_ms(lambda: cache.model_digest(model), n):8.1f} ms")
        print(f"  inputs by value:         {median_ms(lambda: cache.inputs_digest(example), n):8.1f} ms")
        print(f"  parity's source (once):  {median_ms(fingerprint.parity_digest.__wrapped__, n):8.1f} ms")
        names = {"torch", "torchvision", *backend.libraries}
        records = median_ms(lambda: [fingerprint._record_digest.__wrapped__(name) for name in names], n)
        print(f"  libraries' RECORDs (once):{records:8.1f} ms ({len(names)} of them)")


if __name__ == "__main__":
    main()
