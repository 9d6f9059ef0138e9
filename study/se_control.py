"""The squeeze-and-excitation control (issue #27): does float32 drift grow in SE blocks, relative to scale?

docs/study.md v2 read MobileNetV3-large's float32 failures as starting in its SE blocks, on an absolute
threshold and with fan-in-init weights. This control asks it with the confounds removed:

- weights: the builder's own seeded init, then the BatchNorm statistics calibrated on bundled photos (crops,
  flips, brightness of scikit-image's photos, study/make_detector_inputs.py's variants at 224 px; running
  averages over every batch, `momentum=None`), so that every block's activations are of unit scale as in a
  trained network, not the size an init happens to give;
- models: MobileNetV3-large and -small (Hardsigmoid-gated SE) and EfficientNet-B0 (Sigmoid-gated SE);
- ablations, each calibrated again: `sigmoid` (MobileNetV3's Hardsigmoid gate replaced by Sigmoid) and `no-se`
  (every SE block replaced by the identity);
- a per-block profile: each block's output (features.0 .. features.N-1) and the model's, the target's against
  eager float32, as the largest difference over the eager output's RMS and as relative RMSE; the target runs
  one graph per model whose outputs are every block's (as Polygraphy's `mark all`: a marked output may keep a
  compiler from fusing across it, which a prefix run alone would not); a block's *step* is its relative RMSE
  over the previous block's (how much the block multiplies the relative error it is given).

The SE reading predicts that the steps at blocks holding an SE block are larger than at the others, on every
model (not at features.11-15 of one), and that `no-se` removes the difference while `sigmoid` changes it;
steps alike with and without SE, or drift as large without SE, refute it. A jump at one SE block followed by
steps alike shows in the per-block rows, not in the medians: read both. One JSON line per (model, variant, target, block) goes to
`--json`: the per-layer tables the survey lacked, archived beside the study (docs/study-se-control.jsonl).
Targets: onnxruntime (the TorchScript exporter's graph), openvino (f32, converting the module), compile, and to
tell the ONNX path's exporter from its runtime, onnxruntime-dynamo (the dynamo exporter's graph) and openvino-onnx
(OpenVINO reading the TorchScript exporter's graph).

    .venv/bin/python study/se_control.py --json parity-out/se-control.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn
from torchvision.ops.misc import SqueezeExcitation

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from make_detector_inputs import PHOTOS, photo, variant  # noqa: E402
from study_tables import se_steps  # noqa: E402  (the study's own statistic)

MODELS = ("mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0")
VARIANTS = ("as-built", "sigmoid", "no-se")
MEAN, STD = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]


def images(count: int, seed: int, size: int = 224) -> torch.Tensor:
    """`count` normalized RGB variants of the bundled photos, (count, 3, size, size)."""
    rng = np.random.default_rng(seed)
    photos = [photo(name) for name in PHOTOS]
    out = []
    for i in range(count):
        image = variant(photos[i % len(photos)], rng).resize((size, size))
        out.append((torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1) - MEAN) / STD)
    return torch.stack(out)


def build(name: str, which: str, seed: int, calibration: torch.Tensor) -> nn.Module | None:
    """The model with its ablation, its BatchNorm statistics calibrated; None where the ablation does not apply
    (EfficientNet's gate is already a Sigmoid)."""
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None)
    se_blocks = [m for m in model.modules() if isinstance(m, SqueezeExcitation)]
    if which == "sigmoid":
        if not all(isinstance(se.scale_activation, nn.Hardsigmoid) for se in se_blocks):
            return None
        for se in se_blocks:
            se.scale_activation = nn.Sigmoid()
    elif which == "no-se":
        for parent in list(model.modules()):
            for child_name, child in parent.named_children():
                if isinstance(child, SqueezeExcitation):
                    setattr(parent, child_name, nn.Identity())
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over every calibration batch
    model.train()
    with torch.no_grad():
        for batch in calibration.split(8):
            model(batch)
    return model.eval()


class Blocks(nn.Module):
    """The model returning every block's output (features.0 .. features.N-1) and its own output: one graph per
    target whose marked outputs are the blocks' (as Polygraphy's `mark all`), not one graph per prefix."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = []
        for block in self.model.features:
            x = block(x)
            outputs.append(x)
        x = self.model.avgpool(x).flatten(1)
        return (*outputs, self.model.classifier(x))


def block_names(name: str) -> list[tuple[str, str, bool]]:
    """(name, type, holds an SE block in the model as built) of each output of Blocks(model), in order: an
    ablation's blocks are named by the model as built, so that `no-se` compares the same blocks."""
    model = getattr(torchvision.models, name)(weights=None)
    out = [(f"features.{k}", type(block).__name__, any(isinstance(m, SqueezeExcitation) for m in block.modules()))
           for k, block in enumerate(model.features)]
    return out + [("whole model", type(model).__name__, False)]


# The targets: compile; ONNX Runtime on the TorchScript exporter's graph (`onnxruntime`) and on the dynamo
# exporter's (`onnxruntime-dynamo`); OpenVINO converting the module itself (`openvino`) and reading the TorchScript
# exporter's graph (`openvino-onnx`). The last two pairs set one graph on two runtimes and two graphs on one, so
# the ONNX path's exporter and runtime are told apart.
TARGETS = ("onnxruntime", "openvino", "compile", "onnxruntime-dynamo", "openvino-onnx")


def run_on(target: str, module: nn.Module, x: torch.Tensor, folder: Path) -> list[torch.Tensor]:
    """`module`'s outputs on `x` as the target runs it, one graph."""
    if target == "compile":
        return list(torch.compile(module)(x))
    import openvino as ov

    f32 = {"INFERENCE_PRECISION_HINT": "f32"}
    if target == "openvino":
        compiled = ov.Core().compile_model(ov.convert_model(module, example_input=x), "CPU", f32)
        results = compiled([x.numpy()])
        return [torch.from_numpy(np.asarray(results[port])) for port in compiled.outputs]
    path = folder / "blocks.onnx"
    torch.onnx.export(module, (x,), str(path), dynamo=target == "onnxruntime-dynamo", input_names=["x"])
    if target == "openvino-onnx":
        compiled = ov.Core().compile_model(str(path), "CPU", f32)
        results = compiled([x.numpy()])
        return [torch.from_numpy(np.asarray(results[port])) for port in compiled.outputs]
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(y) for y in session.run(None, {"x": x.numpy()})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--targets", nargs="+", default=["onnxruntime", "openvino"],
                        choices=TARGETS)
    parser.add_argument("--calibration", type=int, default=64, help="images the BatchNorm statistics are taken on")
    parser.add_argument("--inputs", type=int, default=8, help="images the profile is measured on (others)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="append one line per (model, variant, target, block)")
    args = parser.parse_args(argv)
    calibration = images(args.calibration, args.seed)
    x = images(args.inputs, args.seed + 1)
    print("| model | variant | target | median step at SE blocks | median step at other blocks | "
          "whole model relative RMSE | whole model max abs / RMS |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for which in args.variants:
                model = build(name, which, args.seed, calibration)
                if model is None:
                    continue
                blocks = Blocks(model).eval()
                with torch.no_grad():
                    references = blocks(x)
                for target in args.targets:
                    with torch.no_grad():
                        outputs = run_on(target, blocks, x, Path(tmp))
                    rows = []
                    for (block, kind, has_se), ref, out in zip(block_names(name), references, outputs, strict=True):
                        rms = float(ref.pow(2).mean().sqrt())
                        out = out.float()
                        rows.append({"model": name, "variant": which, "target": target, "block": block, "type": kind,
                                     "se": has_se, "max_abs_over_rms": float((out - ref).abs().max()) / rms,
                                     "relative_rmse": float((out - ref).pow(2).mean().sqrt()) / rms})
                    if args.json is not None:
                        with open(args.json, "a", encoding="utf-8") as f:
                            f.writelines(json.dumps(r) + "\n" for r in rows)
                    steps = se_steps(rows)
                    print(f"| {name} | {which} | {target} | {_median(steps[True])} | {_median(steps[False])} | "
                          f"{rows[-1]['relative_rmse']:.1e} | {rows[-1]['max_abs_over_rms']:.1e} |", flush=True)
    return 0


def _median(values: list[float]) -> str:
    return f"{float(np.median(values)):.2f} ({len(values)})" if values else "-"


if __name__ == "__main__":
    sys.exit(main())
