"""The trained detector in float32 at scale (issue #27): nudenet's YOLOv8n on many inputs, each backend's head
behind one post-processing. Prepared; docs/study.md says it has not run.

The heads, each fed the same 320 x 320 images (study/make_detector_inputs.py):

- `eager`: onnx2torch's conversion of nudenet's shipped `320n.onnx`, eager PyTorch float32 (the reference);
- `compile`: that module under torch.compile (the PyTorch graph);
- `onnxruntime`: the shipped `320n.onnx` itself on ONNX Runtime's CPUExecutionProvider;
- `openvino`: the shipped `320n.onnx` on OpenVINO's CPU plugin, inference precision pinned to f32.

Every head's raw output (1, 22, 2100) goes through the same torch post-processing, eager and float32
(`NudenetDetector.postprocess_detections`, study/trained_models.py) with its anchors recorded, so flip
attribution sees both sides' candidates on every backend (a parity run cannot: there the post-processing runs
inside the target's artifact). Per target and image: F1 of the boxes matched by label at IoU 0.5, the
unmatched boxes by mechanism (docs/tiers.md), and the raw head's largest difference over its RMS. The summary
gives, per target, the images whose decision changed (F1 < 1) with Wilson's interval and a BCa interval
clustered by source photo (images made from one photo are not independent), and the mechanisms' totals.

`--threads N` sets torch's, ONNX Runtime's and OpenVINO's threads: run it at 1 and at 2 on one commit; an
image whose decision differs between the two runs is unstable, not drift (study/compare_runs.py compares the
two JSONL files). Needs `make study-deps` (nudenet, onnx2torch).

    .venv/bin/python study/make_detector_inputs.py parity-out/detector-inputs --count 240
    .venv/bin/python study/detector_at_scale.py parity-out/detector-inputs --threads 1 --json parity-out/detector-t1.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from parity.execute.capture import watching
from parity.verify.tasks.detection import match
from parity.verify.tasks.flips import attribute

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from study_tables import bca_bootstrap, wilson  # noqa: E402  (the study's own statistics)
from trained_models import NudenetDetector, nudenet_yolov8n, package_file  # noqa: E402

HEADS = ("eager", "compile", "onnxruntime", "openvino")
MATCH_IOU = 0.5


def make_heads(names: list[str], threads: int) -> dict:
    """Each head as a function from an image batch (1, 3, 320, 320) to the raw output, a float32 tensor."""
    torch.set_num_threads(threads)
    path = str(package_file("nudenet", "320n.onnx"))
    module = nudenet_yolov8n()
    heads = {"eager": module}
    if "compile" in names:
        heads["compile"] = torch.compile(module)
    if "onnxruntime" in names:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        heads["onnxruntime"] = lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])
    if "openvino" in names:
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                         "INFERENCE_NUM_THREADS": threads})
        heads["openvino"] = lambda x: torch.from_numpy(np.asarray(compiled([x.numpy()])[compiled.output(0)]))
    return heads


def decide(post: NudenetDetector, raw: torch.Tensor, size: tuple[int, int]) -> tuple[dict, object]:
    """The post-processing's detections of one image and the candidates it recorded."""
    with watching() as recorded:
        detections = post.postprocess_detections(raw, size)[0]
    return detections, recorded[0]["candidates"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", type=Path, help="study/make_detector_inputs.py's folder")
    parser.add_argument("--targets", nargs="+", default=list(HEADS[1:]), choices=HEADS[1:])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--score-thresh", type=float, default=0.001, help="as study/trained.yaml (default 0.001)")
    parser.add_argument("--json", type=Path, help="append one line per target and image to this JSONL file")
    args = parser.parse_args(argv)
    sources = json.loads((args.images / "source.json").read_text(encoding="utf-8"))
    post = NudenetDetector(torch.nn.Identity(), score_thresh=args.score_thresh).eval()
    heads = make_heads(args.targets, args.threads)
    rows = []
    for file, photo in sorted(sources.items()):
        pixels = np.asarray(Image.open(args.images / file).convert("RGB"), dtype=np.float32) / 255
        batch = torch.from_numpy(pixels).permute(2, 0, 1)[None].contiguous()
        with torch.inference_mode():
            raw_ref = heads["eager"](batch)
            ref, ref_candidates = decide(post, raw_ref, batch.shape[-2:])
            for target in args.targets:
                row = {"target": target, "image": file, "photo": photo, "threads": args.threads}
                try:
                    raw = heads[target](batch).float()
                except Exception as exc:  # a backend that cannot run the head fails its rows, as a check would
                    rows.append({**row, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
                    continue
                tgt, tgt_candidates = decide(post, raw, batch.shape[-2:])
                pairs = match(ref, tgt, MATCH_IOU)
                total = len(ref["labels"]) + len(tgt["labels"])
                flips = attribute([ref], [tgt], [pairs], MATCH_IOU, [ref_candidates], [tgt_candidates])
                rms = float(raw_ref.pow(2).mean().sqrt())
                rows.append({**row, "boxes_reference": len(ref["labels"]), "boxes_target": len(tgt["labels"]),
                             "matched": len(pairs), "f1": 1.0 if total == 0 else 2 * len(pairs) / total,
                             "flips": flips["counts"], "max_abs_over_rms": float((raw - raw_ref).abs().max()) / rms})
    if args.json is not None:
        with open(args.json, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    summarize(rows)
    return 0


def summarize(rows: list[dict]) -> None:
    """Per target: images with a changed decision, with Wilson's and the photo-clustered BCa interval."""
    print("| target | images | decision changed | Wilson 95% | BCa by photo (clusters) | mechanisms | median max abs / RMS |")
    print("|---|---|---|---|---|---|---|")
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        failed = [r for r in mine if "error" in r]
        if failed:
            print(f"| {target} | {len(mine)} | could not run: {failed[0]['error']} | | | | |")
            continue
        changed = [r["f1"] < 1.0 for r in mine]
        per_photo: dict[str, list[bool]] = defaultdict(list)
        for r, c in zip(mine, changed, strict=True):
            per_photo[r["photo"]].append(c)
        low, high = wilson(sum(changed), len(changed))
        b_low, b_high = bca_bootstrap([(sum(v), len(v)) for v in per_photo.values()])
        mechanisms = sum((Counter(r["flips"]) for r in mine), Counter())
        print(f"| {target} | {len(mine)} | {sum(changed)} | {100 * low:.1f}% to {100 * high:.1f}% | "
              f"{100 * b_low:.1f}% to {100 * b_high:.1f}% ({len(per_photo)}) | "
              f"{', '.join(f'{k} {n}' for k, n in mechanisms.items()) or 'none'} | "
              f"{statistics.median(r['max_abs_over_rms'] for r in mine):.1e} |")


if __name__ == "__main__":
    sys.exit(main())
