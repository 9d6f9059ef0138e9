"""The tie-robust NMS: scores that differ below its grid cannot change which boxes survive or their
order, where torchvision's own NMS follows the last bits."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops.boxes as box_ops
from torchvision.ops import batched_nms as plain_batched_nms

from parity.adapters.nms import apply_deterministic_nms, deterministic_order, make_batched_nms
from parity.errors import ParityError
from parity.records.view import RunView


def candidates():
    """Ten well-separated boxes whose scores are tied up to 1e-6, as two backends would give them."""
    boxes = torch.tensor([[i * 20.0, 0.0, i * 20.0 + 10, 10.0] for i in range(10)])
    base = torch.full((10,), 0.5004)  # mid-grid: a value right on a grid line could still land either side
    jitter = torch.randn(10, generator=torch.Generator().manual_seed(0)) * 1e-6
    return boxes, base + jitter, base - jitter, torch.zeros(10, dtype=torch.int64)


def test_plain_nms_order_follows_the_last_bits_and_the_adapter_does_not():
    boxes, scores_a, scores_b, idxs = candidates()
    assert not torch.equal(plain_batched_nms(boxes, scores_a, idxs, 0.5), plain_batched_nms(boxes, scores_b, idxs, 0.5))
    nms = make_batched_nms(score_grid=1e-3, box_grid=1.0)
    keep_a, keep_b = nms(boxes, scores_a, idxs, 0.5), nms(boxes, scores_b, idxs, 0.5)
    assert torch.equal(keep_a, keep_b)
    assert keep_a.tolist() == list(range(10))  # ties broken by the boxes' coordinates (left to right)


def test_adapter_still_suppresses_overlaps_and_keeps_real_score_order():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1.0, 0, 11, 10], [50.0, 0, 60, 10]])
    scores = torch.tensor([0.6, 0.9, 0.7])
    keep = make_batched_nms(1e-3, 1.0)(boxes, scores, torch.zeros(3, dtype=torch.int64), 0.5)
    assert keep.tolist() == plain_batched_nms(boxes, scores, torch.zeros(3, dtype=torch.int64), 0.5).tolist() == [1, 2]


def test_deterministic_order_keys():
    scores = torch.tensor([0.50001, 0.5, 0.7])
    boxes = torch.tensor([[5.0, 0, 9, 9], [1.0, 0, 9, 9], [0.0, 0, 9, 9]])
    assert deterministic_order(scores, 1e-3, boxes, 1.0).tolist() == [2, 1, 0]


def test_applied_to_a_model_only_during_its_forward():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3).eval()
    note = apply_deterministic_nms(model, 1e-3, 1.0)
    assert "tie-robust top-k in 1 proposal network" in note
    seen = []
    original = box_ops.batched_nms
    model.roi_heads.register_forward_pre_hook(lambda m, a: seen.append(box_ops.batched_nms))
    with torch.no_grad():
        model([torch.rand(3, 64, 64)])
    assert seen and seen[0] is not original and box_ops.batched_nms is original
    with pytest.raises(ParityError, match="no torchvision detection head"):
        apply_deterministic_nms(torch.nn.Linear(2, 2), 1e-3, 1.0)


def test_a_forward_that_torch_export_abandons_leaves_torchvisions_nms_as_it_was():
    """torch.export's non-strict tracing (the ONNX exporter's first step) fails on a detector's
    data-dependent shapes midway through the forward. The adapter's swap must not outlive that forward:
    it once did, and every model after it in the run, those without the adapter too, ran its NMS."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3).eval()
    apply_deterministic_nms(model, 1e-3, 1.0)
    original = box_ops.batched_nms
    with pytest.raises(Exception):  # noqa: B017 (whichever error torch.export raises on data-dependent shapes)
        torch.export.export(model, ([torch.rand(3, 64, 64)],), strict=False)
    assert box_ops.batched_nms is original


def adapter_experiment() -> dict:
    """The tied detector twice, without and with the adapter, against a target that jitters its scores by
    at most 1e-6 (tests/fixtures/tiny.py): the drift another backend's last bits would make, constructed so
    that it is the same on every machine."""
    detector = {"source": "python", "entry": "tests.fixtures.tiny:tied_detector", "task": "detection"}
    return {"name": "adapter", "seed": 0,
            "models": [{"name": "frcnn", **detector}, {"name": "frcnn_nms", **detector, "adapters": ["deterministic_nms"]}],
            "inputs": [{"name": "photos", "images": ["sample:coffee", "sample:astronaut"], "preprocess": {"resize": 64}}],
            "targets": [{"backend": "tests.fixtures.tiny:JitteredScores", "name": "jittered"}],
            "tolerances": {"atol": [1e-4, 1e-3, 1e-2], "rtol": 1e-5, "gate": 1e-3},
            "tiers": {"tasks": {"detection_f1": 0.95}}}


@pytest.mark.numerics
def test_the_adapter_turns_a_detectors_decision_flip_into_agreement(tmp_path):
    """Every score of the tied detector is tied; the target's jitter decides the ties its own way. Without
    the adapter the target keeps other proposals and other boxes (first asserted, so that the test cannot
    pass for want of a flip); with it, the same boxes in the same order. Fails if the adapter is removed or
    stops reaching the proposal network's top-k or NMS."""
    from parity.api import run_experiment

    records = run_experiment(adapter_experiment(), tmp_path / "out")
    tier3 = {r.model: r for r in RunView(records).checks(3)}
    tier1 = {r.model: r for r in RunView(records).checks(1)}
    assert tier3["frcnn"].passed is False and tier3["frcnn"].failure_class == "decision_flip"
    assert tier3["frcnn"].metrics["f1"] < 0.9
    assert tier1["frcnn"].passed is False and tier1["frcnn"].failure_class != "ordering"  # other boxes
    # every score is tied: the flips are tie-order flips (most in the proposal network's top-k), and a label
    # change where the two classes' tied scores went the other way
    flips = tier3["frcnn"].flips
    assert flips.candidates == "both" and set(flips.counts) <= {"tie_order", "label_change"}
    assert flips.counts["tie_order"] >= 0.9 * sum(flips.counts.values())
    assert tier3["frcnn_nms"].passed is True and tier3["frcnn_nms"].metrics["f1"] == 1.0
    assert tier3["frcnn_nms"].same_set is True
    assert tier1["frcnn_nms"].passed is True, tier1["frcnn_nms"].detail  # only the scores' jitter is left
    notes = {r.model: r.adapters for r in RunView(records).models}
    assert notes["frcnn"] == [] and "proposal network" in notes["frcnn_nms"][0]


def test_the_proposal_networks_top_k_is_tie_robust():
    """Objectness tied up to 1e-6 on two levels of 600 and 150 anchors, 200 kept per level: the plain
    top-k keeps other anchors for two jitters of the same ties, the adapter's the same ones."""
    from tests.fixtures.tiny import TIED_OBJECTNESS, jitter, tied_detector

    torch.manual_seed(0)
    model = tied_detector().eval()
    levels = [600, 150]
    tied = torch.full((1, sum(levels)), TIED_OBJECTNESS)
    a, b = jitter(tied, 1), jitter(tied, 2)
    assert not torch.equal(model.rpn._get_top_n_idx(a, levels), model.rpn._get_top_n_idx(b, levels))
    apply_deterministic_nms(model, 1e-2, 1.0)
    top_a = model.rpn._get_top_n_idx(a, levels)
    assert top_a.shape == (1, 350) and torch.equal(top_a, model.rpn._get_top_n_idx(b, levels))
    assert top_a[0, :200].tolist() == list(range(200))  # ties in one grid cell go by index


def test_top_k_sorts_only_what_can_be_in_it_and_equals_the_full_order():
    from parity.adapters.nms import deterministic_top_k

    g = torch.Generator().manual_seed(0)
    scores = (torch.rand(5000, generator=g) * 50).round() / 50 + torch.rand(5000, generator=g) * 1e-7  # many ties
    for k in (1, 10, 999, 4999, 5000, 6000):
        assert torch.equal(deterministic_top_k(scores, k, 1e-2), deterministic_order(scores, 1e-2)[:k]), k


def test_box_keys_are_packed_without_losing_order():
    g = torch.Generator().manual_seed(1)
    boxes = torch.randint(0, 40, (300, 4), generator=g).float()
    scores = torch.full((300,), 0.5)
    order = deterministic_order(scores, 1e-2, boxes, 1.0)
    keys = [tuple(boxes[i].long().tolist()) + (int(i),) for i in order]
    assert keys == sorted(keys)


def test_the_adapter_fidelity_benchmark_counts_kept_boxes_f1_and_map():
    """benchmarks/adapter_fidelity.py's arithmetic on hand-made detections: of three boxes, one is kept, one
    moved away (IoU < 0.5) and one dropped; F1 = 2 * kept / (boxes before + boxes after)."""
    import importlib.util

    from parity.verify.tasks.flips import Detections
    from tests.support import ROOT

    spec = importlib.util.spec_from_file_location("adapter_fidelity", ROOT / "benchmarks" / "adapter_fidelity.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def detections(boxes, labels, scores):
        return Detections(torch.tensor(boxes, dtype=torch.float32), torch.tensor(labels), torch.tensor(scores))

    before = [detections([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]], [1, 1, 2], [0.9, 0.8, 0.7])]
    after = [detections([[0, 0, 10, 10], [26, 26, 36, 36]], [1, 1], [0.9, 0.8])]
    result = bench.fidelity(before, after)
    assert (result["boxes_before"], result["boxes_after"], result["kept"]) == (3, 2, 1)
    assert result["f1"] == pytest.approx(2 / 5)
    assert bench.fidelity(before, before)["f1"] == 1.0 and bench.fidelity(before, before)["map"] == 1.0
    empty = [detections(torch.zeros(0, 4).tolist(), [], [])]
    assert bench.fidelity(empty, empty)["f1"] == 1.0
