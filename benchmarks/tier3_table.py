"""Tier 3 per model: task metrics with and without the deterministic NMS adapter, the adapter's latency
cost, and the fallback sets `parity fallback` finds, with theirs. Every figure is measured in this run.

- Detection (torchvision's Faster R-CNN with MobileNetV3-FPN at 800 and at 320 px, and SSDlite; their own
  random init, a low score threshold): the reference is eager CPU with 2 threads; the targets are eager
  CPU with 1 thread and eager CPU channels_last, real backend variants whose drift is last-bit. Each model
  runs without and with `adapters: [deterministic_nms]`. The adapter's cost: the NMS and proposal top-k
  calls of one forward are recorded and replayed, torchvision's and the adapter's, the best of --runs
  each, against the median forward (eager CPU, `init: fan_in` weights: the builders' own init leaves
  denormal values in the backbone, which slow every forward several times over).
- Classification (ResNet-18) and segmentation (LR-ASPP MobileNetV3): eager bfloat16 on the CPU. The
  fallback search (tier-2 suspects first, grown until the check passes, then shrunk) aimed at tier 1
  (every output within --gate) and at tier 3 (the task verdict), and the median latency of the target
  with and without the set it finds.

    .venv/bin/python benchmarks/tier3_table.py [--photos 2] [--runs 10] [--gate 1e-2] [--sections detection,cost,fallback]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from parity.adapters.nms import DeterministicNmsSpec
from parity.api import run_experiment
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from parity.runner.localization import localize_check
from parity.runner.plan import Job
from parity.runner.prepared import prepared_model
from parity.runner.search import candidates_from, search_fallback

PHOTOS = ["sample:coffee", "sample:chelsea", "sample:astronaut", "sample:rocket"]
DETECTORS = [
    ("frcnn_mnv3_fpn", "fasterrcnn_mobilenet_v3_large_fpn", {"num_classes": 10, "box_score_thresh": 0.001}),
    ("frcnn_mnv3_320", "fasterrcnn_mobilenet_v3_large_320_fpn", {"num_classes": 10, "box_score_thresh": 0.001}),
    ("ssdlite320", "ssdlite320_mobilenet_v3_large", {"num_classes": 10, "score_thresh": 0.001}),
]
DETECTION_TARGETS = [{"backend": "eager", "name": "1-thread", "options": {"threads": 1}},
                     {"backend": "eager", "name": "channels_last", "options": {"channels_last": True, "threads": 2}}]
DENSE = [
    ("resnet18", "resnet18", "classification", {}, "default"),
    ("lraspp", "lraspp_mobilenet_v3_large", "segmentation", {"num_classes": 21}, "fan_in"),
]
PREPROCESS = {"resize": 256, "center_crop": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def detection_rows(photos: list[str]) -> list[tuple]:
    models = []
    for name, builder, params in DETECTORS:
        entry = {"builder": builder, "task": "detection", "params": params}
        models += [{"name": name, **entry, "adapters": []}, {"name": f"{name}+nms", **entry, "adapters": ["deterministic_nms"]}]
    exp = {"name": "tier3-detection", "models": models, "inputs": [{"name": "photos", "images": photos}],
           "reference": {"backend": "eager", "options": {"threads": 2}}, "targets": DETECTION_TARGETS,
           "tolerances": {"atol": [1e-3], "gate": 1e-3}, "tiers": {"tasks": {"detection_f1": 0.95}}}
    with tempfile.TemporaryDirectory() as out:
        records = run_experiment(exp, out)
    rows = []
    for r in records:
        if r["kind"] == "check" and r["tier"] == 3:
            m = r.get("metrics") or {}
            rows.append((r["model"], r["target"], m.get("f1"), m.get("map"), m.get("max_box_drift"), r["passed"],
                         r.get("failure_class") or "-"))
    return rows


def adapter_cost(photos: list[str], runs: int) -> list[tuple]:
    """The forward's median time, and the time of its NMS and proposal top-k calls as torchvision runs
    them and as the adapter does. The calls are recorded in one forward and replayed `runs` times each
    (the best of them): a difference of milliseconds inside a forward of seconds would drown in the
    machine's noise if timed as whole forwards."""
    return [(name, *_adapter_cost(builder, params, photos, runs)) for name, builder, params in DETECTORS]


def _adapter_cost(builder: str, params: dict, photos: list[str], runs: int) -> tuple[float, float, float, float]:
    import torchvision.ops.boxes as box_ops

    from parity.adapters import nms

    exp = experiment_from_dict({
        "models": [{"name": "m", "builder": builder, "task": "detection", "params": params, "init": "fan_in"}],
        "inputs": [{"name": "photos", "images": photos}], "targets": [{"backend": "eager", "name": "t"}]})
    model, _ = prepared_model(exp.models[0], exp)
    inputs = build_inputs(exp.inputs[0], exp, "list")
    grid = DeterministicNmsSpec(name="deterministic_nms").score_grid_for(exp)  # the grid `adapters: [deterministic_nms]` would use
    nms_calls, topk_calls = [], []
    plain_nms = box_ops.batched_nms
    rpns = [m for m in model.modules() if hasattr(m, "_get_top_n_idx")]

    def spy_nms(*args):
        nms_calls.append(args)
        return plain_nms(*args)

    box_ops.batched_nms = spy_nms
    for rpn in rpns:
        plain_top_n = rpn._get_top_n_idx
        rpn._get_top_n_idx = lambda *a, _rpn=rpn, _f=plain_top_n: (topk_calls.append((_rpn, a)), _f(*a))[1]
    with torch.inference_mode():
        times = []
        for i in range(max(3, runs // 2) + 1):
            start = time.perf_counter()
            model(*inputs.args)
            times.append(time.perf_counter() - start)
            if i == 0:
                box_ops.batched_nms = plain_nms  # the calls of one forward are enough
                for rpn in rpns:
                    del rpn._get_top_n_idx
        forward = statistics.median(times[1:])
        adapted_nms = nms.make_batched_nms(grid, 1.0)

        def replay(adapted: bool) -> float:
            best = float("inf")
            for _ in range(runs):
                start = time.perf_counter()
                for args in nms_calls:
                    (adapted_nms if adapted else plain_nms)(*args)
                for rpn, args in topk_calls:
                    if adapted:
                        rpn._parity_score_grid = grid
                        nms._deterministic_top_n_idx(rpn, *args)
                    else:
                        type(rpn)._get_top_n_idx(rpn, *args)
                best = min(best, time.perf_counter() - start)
            return best

        plain_s, adapter_s = replay(False), replay(True)
    return forward * 1e3, plain_s * 1e3, adapter_s * 1e3, (forward - plain_s + adapter_s) / forward


def fallback_rows(photos: list[str], gate: float) -> list[tuple]:
    """For each dense model: the fallback search aimed at tier 1 (every output within `gate`) and at
    tier 3 (the task verdict), from the same tier-2 candidates."""
    from parity.config.schema import tasks_spec

    rows = []
    for name, builder, task, params, init in DENSE:
        exp = experiment_from_dict({
            "models": [{"name": name, "builder": builder, "task": task, "params": params, "init": init}],
            "inputs": [{"name": "photos", "images": photos, "preprocess": PREPROCESS}],
            "targets": [{"backend": "eager", "dtype": "bfloat16"}],
            "tolerances": {"atol": [gate], "rtol": 1e-5, "gate": gate}, "tiers": {"tasks": True, "activations": True}})
        model, _ = prepared_model(exp.models[0], exp)
        inputs = build_inputs(exp.inputs[0], exp)
        target = exp.targets[0]
        layers = localize_check(Job(exp.models[0], exp.inputs[0], exp.reference, None, (target,), 1), target, model,
                                inputs, exp)
        for aim in (None, (task, tasks_spec())):
            found = search_fallback(exp.reference, target, model, inputs, candidates_from(layers),
                                    exp.tolerance_for(target), task=aim)
            rows.append((name, target.id, found))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=2, help="how many bundled photos (1 to 4; default 2)")
    parser.add_argument("--runs", type=int, default=10, help="timed forwards per variant for the adapter's cost")
    parser.add_argument("--gate", type=float, default=1e-2, help="the atol the fallback must reach (bfloat16)")
    parser.add_argument("--sections", default="detection,cost,fallback", help="which tables (default: all three)")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    photos = PHOTOS[: max(1, min(args.photos, 4))]
    print(f"photos: {', '.join(photos)}; torch {torch.__version__}, {torch.get_num_threads()} threads")

    if "detection" in sections:
        print_detection(photos)
    if "cost" in sections:
        print_cost(photos, args.runs)
    if "fallback" in sections:
        print_fallback(photos, args.gate)


def print_detection(photos: list[str]) -> None:
    print("\n## Detection, tier 3 against eager CPU (2 threads), without and with deterministic_nms")
    print(f"{'model':22s} {'target':14s} {'F1':>6s} {'mAP':>6s} {'box drift':>10s}  verdict")
    for model, target, f1, map_, drift, passed, klass in detection_rows(photos):
        print(f"{model:22s} {target:14s} {f1:6.3f} {map_:6.3f} {drift:10.3g}  {'agrees' if passed else klass}")


def print_cost(photos: list[str], runs: int) -> None:
    print("\n## deterministic_nms latency cost (eager CPU, fan_in weights; NMS + proposal top-k calls replayed)")
    print(f"{'model':22s} {'forward ms':>10s} {'nms+topk ms':>11s} {'adapted ms':>10s} {'forward ratio':>13s}")
    for model, forward, plain, adapted, ratio in adapter_cost(photos, runs):
        print(f"{model:22s} {forward:10.1f} {plain:11.2f} {adapted:10.2f} {ratio:13.3f}")


def print_fallback(photos: list[str], gate: float) -> None:
    print(f"\n## Fallback to float32 for eager bfloat16 on the CPU (tier 1 at gate atol {gate:g}, or tier 3)")
    metric = lambda m: ", ".join(f"{k} {v:.4f}" for k, v in (m or {}).items() if k in ("top1_agreement", "pixel_agreement", "miou"))  # noqa: E731
    for name, target, found in fallback_rows(photos, gate):
        cost = (f"{found.latency_before_s * 1e3:.1f} -> {found.latency_after_s * 1e3:.1f} ms "
                f"({found.latency_after_s / found.latency_before_s:.2f}x)" if found.passed and found.modules else "-")
        task = f"; {metric(found.task_before)} -> {metric(found.task_after)}" if found.aim == "tier 3" else ""
        print(f"{name} / {target}, aim {found.aim}: required atol {found.required_atol_before:.3g} -> "
              f"{found.required_atol_after:.3g}{task}; {'passes' if found.passed else 'still fails'} with "
              f"{len(found.modules)} module(s) in float32 {found.modules}, {found.tried} trials; latency {cost}")


if __name__ == "__main__":
    main()
