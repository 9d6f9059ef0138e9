"""Which init each model of the study needs: every model of examples/study.yaml built with its builder's
own random init and with `init: fan_in`, run once in eager float32 on its input set, and how spread its
outputs are. A collapsed output (logits all ~0 or all equal, every box with one score, a one-class mask)
leaves no drift to measure, so the study uses `init: fan_in` for those models.

Per task, what is printed for each init:
- classification: the largest |logit|, the spread of the logits (std over classes, averaged over images)
  and the gap between the two best logits relative to that spread (0 means a tie for top-1);
- detection: the boxes kept, how many distinct scores they have (rounded to 1e-6), the score range and
  how many distinct boxes (rounded to 0.01 px);
- segmentation: the spread of the class scores and how many classes the argmax mask uses.

    .venv/bin/python benchmarks/study_init.py [examples/study.yaml] [--models resnet18,ssdlite320]
"""

from __future__ import annotations

import argparse
import time

import torch

from parity.experiment import load_experiment
from parity.inputs import build_inputs
from parity.models import build_model


def spread(model_spec, exp, init: str) -> str:
    spec = model_spec.model_copy(update={"init": init, "adapters": []})
    model = build_model(spec, exp)
    inputs = build_inputs(exp.inputs_for(spec)[0], exp, spec.batch_mode)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model(*inputs.args, **inputs.kwargs)
    took = time.perf_counter() - start
    if spec.task == "classification":
        logits = out if isinstance(out, torch.Tensor) else out.logits
        top2 = logits.topk(2, dim=1).values
        std = logits.std(dim=1)
        gap = ((top2[:, 0] - top2[:, 1]) / std.clamp_min(1e-30)).min().item()
        text = f"max|logit| {logits.abs().max().item():.2e}  logit std {std.mean().item():.2e}  top-1 gap/std {gap:.2e}"
    elif spec.task == "detection":
        scores = torch.cat([o["scores"] for o in out])
        boxes = torch.cat([o["boxes"] for o in out])
        distinct = torch.unique((scores.double() * 1e6).round()).numel()
        places = torch.unique((boxes.double() * 100).round(), dim=0).shape[0]
        rng = (scores.max() - scores.min()).item() if scores.numel() else 0.0
        text = (f"boxes {scores.numel():4d}  distinct scores {distinct:4d}  score range {rng:.2e}  "
                f"distinct boxes {places:4d}")
    else:
        masks = out["out"]
        classes = masks.argmax(dim=1).unique().numel()
        text = f"score std {masks.std().item():.2e}  classes in the mask {classes}"
    return f"{text}  ({took:.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", default="examples/study.yaml")
    parser.add_argument("--models", help="comma-separated model names (default: every model, one per builder)")
    args = parser.parse_args()
    exp = load_experiment(args.experiment)
    wanted = set(args.models.split(",")) if args.models else None
    seen: set[str] = set()
    for spec in exp.models:
        if (wanted and spec.name not in wanted) or (not wanted and spec.builder in seen):
            continue
        seen.add(spec.builder)
        print(f"{spec.name} (study: init {spec.init})")
        for init in ("default", "fan_in"):
            print(f"  {init:<8} {spread(spec, exp, init)}", flush=True)


if __name__ == "__main__":
    main()
