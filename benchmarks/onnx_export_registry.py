"""What building the dynamo exporter's ATen-to-ONNX table once per process saves (backends/onnxruntime.py's
`build_torchlib_registry_once`).

torch.onnx.export(dynamo=True) builds that table afresh for every export, and onnxscript parses the Python source
of each of its thousands of functions to read their domains. A localization on ONNX Runtime exports the whole
model, its layers graph and every layer it cannot slice, so a small model pays that cost many times. This script
exports one small CNN `--exports` times with torch's own table-building and as many times with the built-once one,
interleaved (A, B, A, B, ...) so that load on the machine falls on both alike, checks that both give byte-identical
ONNX files, and prints the median export time of each and their ratio.

    .venv/bin/python benchmarks/onnx_export_registry.py [--exports 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.onnx._internal.exporter import _registration

from parity.backends.onnxruntime import build_torchlib_registry_once, export_onnx
from parity.inputs import Inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 10)).eval()
    example = Inputs((torch.randn(2, 3, 8, 8),))
    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    build_torchlib_registry_once()
    once = _registration.ONNXRegistry.__dict__["from_torchlib"]
    times: dict[str, list[float]] = {"every export": [], "built once": []}
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.exports):
            for how, method in (("every export", original), ("built once", once)):
                _registration.ONNXRegistry.from_torchlib = method
                path = Path(folder) / f"{i}-{how}.onnx"
                start = time.perf_counter()
                export_onnx(model, example, path, opset=None)
                times[how].append(time.perf_counter() - start)
                files.setdefault(how, path.read_bytes())
                if path.read_bytes() != files[how] or files[how] != files.get("every export", files[how]):
                    raise SystemExit(f"export {i} ({how}) differs from the first")
    every, built = (statistics.median(times[h]) for h in ("every export", "built once"))
    print(f"{args.exports} exports of a small CNN each way, interleaved; the ONNX files are byte-identical")
    print(f"median export, table built for every export: {every:.3f} s")
    print(f"median export, table built once per process:  {built:.3f} s (the first export pays the build)")
    print(f"ratio: {built / every:.2f}x")


if __name__ == "__main__":
    main()
