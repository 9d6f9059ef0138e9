"""The trained detector in float32 at scale (issue #27): nudenet's YOLOv8n on many inputs, each backend's head
behind one post-processing. Its rows are archived as docs/study-detector-scale.jsonl.gz (docs/study.md).

The heads, each fed the same 320 x 320 images (study/make_detector_inputs.py):

- `eager`: onnx2torch's conversion of nudenet's shipped `320n.onnx`, eager PyTorch float32 (the reference),
  with the values computed from the input's shape alone folded into constants (`fold_shapes`: torch.compile
  cannot trace onnx2torch's shape arithmetic; the folded graph's eager output is checked equal to the unfolded);
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
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from parity.execute.capture import watching
from parity.verify.tasks.detection import detections_of, match
from parity.verify.tasks.flips import Detections, attribute

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from study_tables import detector_scale_table  # noqa: E402  (the study's own table)
from trained_models import NudenetDetector, nudenet_yolov8n, package_file  # noqa: E402

HEADS = ("eager", "compile", "onnxruntime", "openvino")
MATCH_IOU = 0.5


def fold_shapes(module: torch.fx.GraphModule, example: torch.Tensor) -> torch.fx.GraphModule:
    """onnx2torch's graph with every value computed from the input's shape alone (the detect head's anchors and
    strides: Shape, Gather, Range, Expand...) stored as a constant for `example`'s shape. torch.compile cannot
    trace onnx2torch's Shape-then-Gather (a torch.Size of FakeTensors); every input here is 1 x 3 x 320 x 320,
    and the constants are the values eager computes, so eager's output does not change (main checks it)."""
    from onnx2torch.node_converters.reshape import OnnxReshape
    from onnx2torch.node_converters.shape import OnnxShape

    static: set[torch.fx.Node] = set()
    values: dict[torch.fx.Node, object] = {}
    shapes: dict[torch.fx.Node, tuple[int, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> object:
            result = super().run_node(node)
            if node.op == "call_module" and isinstance(self.module.get_submodule(node.target), OnnxReshape):
                shapes[node] = tuple(result.shape)
            if node.op == "get_attr" or (node.op == "call_module" and isinstance(self.module.get_submodule(node.target), OnnxShape)) \
                    or (node.op in ("call_module", "call_function", "call_method")
                        and all(n in static for n in node.all_input_nodes)):
                static.add(node)
                values[node] = result
            return result

    with torch.inference_mode():
        Recorder(module).run(example)
    graph = module.graph
    for i, node in enumerate(n for n in list(graph.nodes) if n in static and n.op != "get_attr"):
        if isinstance(values[node], torch.Tensor) and any(user not in static for user in node.users):
            module.register_buffer(f"_folded_{i}", values[node].clone())
            with graph.inserting_before(node):
                constant = graph.get_attr(f"_folded_{i}")
            node.replace_all_uses_with(constant)
    for node in list(graph.nodes):  # a Reshape to a folded shape: torch.reshape to that shape's ints
        if node.op == "call_module" and isinstance(module.get_submodule(node.target), OnnxReshape) \
                and node.args[1].op == "get_attr" and node in shapes:
            with graph.inserting_before(node):
                reshaped = graph.call_function(torch.reshape, (node.args[0], shapes[node]))
            node.replace_all_uses_with(reshaped)
            graph.erase_node(node)
    graph.eliminate_dead_code()
    module.recompile()
    return module


def make_heads(names: list[str], threads: int, example: torch.Tensor) -> dict:
    """Each head as a function from an image batch (1, 3, 320, 320) to the raw output, a float32 tensor."""
    torch.set_num_threads(threads)
    path = str(package_file("nudenet", "320n.onnx"))
    module = fold_shapes(nudenet_yolov8n(), example)
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


def load(path: Path) -> torch.Tensor:
    """An image as nudenet's input, (1, 3, H, W) RGB in [0, 1]."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255
    return torch.from_numpy(pixels).permute(2, 0, 1)[None].contiguous()


def decide(post: NudenetDetector, raw: torch.Tensor, size: tuple[int, int]) -> tuple[Detections, object]:
    """The post-processing's detections of one image, read as tier 3 reads them, and the candidates it recorded."""
    with watching() as recorded:
        [detections] = detections_of(post.postprocess_detections(raw, size))
    return detections, recorded[0].candidates  # record_candidates keeps an OwnCandidates


def compared(ref: Detections, tgt: Detections, ref_candidates, tgt_candidates) -> dict:
    """One image's row fields: the boxes of each side, those matched, F1 and the flips by mechanism."""
    pairs = match(ref, tgt, MATCH_IOU)
    total = len(ref) + len(tgt)
    flips = attribute([ref], [tgt], [pairs], MATCH_IOU, [ref_candidates], [tgt_candidates])
    return {"boxes_reference": len(ref), "boxes_target": len(tgt), "matched": len(pairs),
            "f1": 1.0 if total == 0 else 2 * len(pairs) / total, "flips": flips.counts}


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
    batches = {file: load(args.images / file) for file in sorted(sources)}
    heads = make_heads(args.targets, args.threads, next(iter(batches.values())))
    with torch.inference_mode():
        unfolded, folded = nudenet_yolov8n(), heads["eager"]
        if not all(torch.equal(unfolded(b), folded(b)) for b in list(batches.values())[:5]):
            raise SystemExit("folding the shapes changed eager's output: the reference would not be the shipped graph's")
    rows = []
    for file, batch in batches.items():
        photo = sources[file]
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
                rms = float(raw_ref.pow(2).mean().sqrt())
                rows.append({**row, **compared(ref, tgt, ref_candidates, tgt_candidates),
                             "max_abs_over_rms": float((raw - raw_ref).abs().max()) / rms,
                             "relative_rmse": float((raw - raw_ref).pow(2).mean().sqrt()) / rms})
    if args.json is not None:
        with open(args.json, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    summarize(rows)
    return 0


def summarize(rows: list[dict]) -> None:
    """Per target: images with a changed decision, Wilson's and the photo-clustered BCa interval, mechanisms."""
    print(detector_scale_table(rows))


if __name__ == "__main__":
    sys.exit(main())
