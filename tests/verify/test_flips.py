"""Decision-flip attribution (verify/tasks/flips.py): each class from a hand-made case whose mechanism is
known by construction, through torchvision's own NMS; two mechanisms at once; nothing flipped; and what
cannot be attributed."""

from __future__ import annotations

import torch

from parity.backends.eager import EagerBackend
from parity.verify.tasks.detection import match
from parity.verify.tasks.flips import Candidates, Detections, attribute


def side(boxes, scores, labels=None, threshold=0.5, nms_iou=0.5, top_k=10, origins=None):
    """One side's candidates and its detections, its post-processing done as torchvision's R-CNN head does
    it: scores above the threshold, NMS per label, the first top_k."""
    from torchvision.ops import batched_nms

    boxes = torch.tensor(boxes, dtype=torch.float32)
    scores = torch.tensor(scores, dtype=torch.float32)
    labels = torch.tensor(labels if labels is not None else [1] * len(scores))
    above = torch.nonzero(scores > threshold).flatten()
    kept = above[batched_nms(boxes[above], scores[above], labels[above], nms_iou)][:top_k]
    cands = Candidates(boxes, scores, labels, kept, threshold, nms_iou, top_k,
                       origins=torch.tensor(origins, dtype=torch.float32) if origins is not None else None)
    return Detections(boxes[kept], labels[kept], scores[kept]), cands


def output(dets: Detections) -> dict[str, torch.Tensor]:
    """The detections as a torchvision detector returns them for one image."""
    return {"boxes": dets.boxes, "labels": dets.labels, "scores": dets.scores}


def flips(ref, tgt, match_iou=0.5, captured=True):
    """attribute() on one image, (detections, candidates) per side."""
    (r, rc), (t, tc) = ref, tgt
    result = attribute([r], [t], [match(r, t, match_iou)], match_iou, [rc] if captured else None,
                       [tc] if captured else None)
    unmatched = len(r) + len(t) - 2 * len(match(r, t, match_iou))
    assert sum(result.counts.values()) == unmatched  # every unmatched box is classed, once
    return result


FAR = [100.0, 100, 110, 110]  # a box that overlaps nothing else here


def test_score_threshold_a_reference_box_whose_score_falls_below_the_threshold_in_the_target():
    result = flips(side([[0, 0, 10, 10], FAR], [0.6, 0.9]), side([[0, 0, 10, 10], FAR], [0.4, 0.9]))
    assert result.counts == {"score_threshold": 1}
    example = result.examples[0]
    assert (example.side, example.mechanism) == ("reference", "score_threshold")
    assert "threshold 0.5" in example.detail


def test_score_threshold_the_other_way_a_target_box_the_reference_scored_below_it():
    result = flips(side([[0, 0, 10, 10]], [0.45]), side([[0, 0, 10, 10]], [0.55]))
    assert result.counts == {"score_threshold": 1} and result.examples[0].side == "target"


def test_nms_iou_the_overlap_with_a_kept_box_crosses_the_nms_threshold():
    """The kept box K and C overlap at IoU 0.449 in the reference (both kept) and 0.550 in the target (C
    suppressed), scores unchanged."""
    k = [0.0, 0, 10, 10]
    result = flips(side([k, [3.8, 0, 13.8, 10]], [0.9, 0.8]), side([k, [2.9, 0, 12.9, 10]], [0.9, 0.8]))
    assert result.counts == {"nms_iou": 1}
    assert "threshold 0.5" in result.examples[0].detail


def test_tie_order_nms_kept_the_other_of_a_tied_pair():
    """Two boxes at IoU 0.6 (suppress at 0.5, match only from 0.7) whose scores differ by 1e-6: each side
    keeps the other one, so both sides have one unmatched box."""
    boxes = [[0.0, 0, 10, 10], [2.5, 0, 12.5, 10]]
    result = flips(side(boxes, [0.7, 0.700001]), side(boxes, [0.700001, 0.7]), match_iou=0.7)
    assert result.counts == {"tie_order": 2}


def test_tie_order_at_the_top_k_cut():
    result = flips(side([[0, 0, 10, 10], FAR], [0.7, 0.700001], top_k=1),
                   side([[0, 0, 10, 10], FAR], [0.700001, 0.7], top_k=1))
    assert result.counts == {"tie_order": 2}
    assert "top-1 cut" in result.examples[0].detail


def test_top_k_a_box_beyond_the_detections_per_image_cut_on_one_side_only():
    result = flips(side([[0, 0, 10, 10], FAR], [0.9, 0.8], top_k=1), side([[0, 0, 10, 10], FAR], [0.7, 0.8], top_k=1))
    assert result.counts == {"top_k": 2}


def test_top_k_before_nms_a_per_label_cut_as_a_region_proposal_network_makes_per_level():
    boxes, labels = torch.tensor([[0.0, 0, 10, 10], FAR]), torch.tensor([0, 0])

    def cut(scores, kept):
        cands = Candidates(boxes, torch.tensor(scores), labels, torch.tensor(kept), 0.0, 0.7, 10, group_top_k=1)
        return Detections(boxes[kept], labels[kept], cands.scores[kept]), cands

    result = flips(cut([0.9, 0.8], [0]), cut([0.7, 0.8], [1]))
    assert result.counts == {"top_k": 2} and "pre-NMS top 1" in result.examples[0].detail
    result = flips(cut([0.9, 0.8], [0]), cut([0.8, 0.800001], [1]))
    assert result.counts == {"tie_order": 1, "top_k": 1}  # the target's cut fell between equals


def test_a_flip_upstream_is_classed_in_the_stage_that_chose_the_proposals():
    """The reference's and the target's heads each kept a box from a proposal the other side's proposal
    network did not keep: the post-NMS top-1 of two far-apart anchors, scored the other way round."""
    anchors, level = torch.tensor([[0.0, 0, 10, 10], FAR]), torch.tensor([0, 0])

    def two_stages(objectness, kept_proposal):
        rpn = Candidates(anchors, torch.tensor(objectness), level, torch.tensor([kept_proposal]), 0.0, 0.7, 1)
        proposal = anchors[kept_proposal:kept_proposal + 1]
        head = Candidates(proposal.clone(), torch.tensor([0.9]), torch.tensor([1]), torch.tensor([0]), 0.5, 0.5, 10,
                          origins=proposal, proposals=rpn)
        return Detections(proposal, torch.tensor([1]), torch.tensor([0.9])), head

    result = flips(two_stages([0.9, 0.5], 0), two_stages([0.5, 0.9], 1))
    assert result.counts == {"top_k": 2}
    assert result.examples[0].detail.startswith("its proposal, missing in the target: score 0.5")


def test_score_order_overlapping_boxes_that_swap_by_more_than_a_tie():
    boxes = [[0.0, 0, 10, 10], [2.5, 0, 12.5, 10]]
    result = flips(side(boxes, [0.6, 0.8]), side(boxes, [0.8, 0.6]), match_iou=0.7)
    assert result.counts == {"score_order": 2}


def test_label_change_with_candidates_and_from_the_outputs_alone():
    """The same place scored for two labels: the reference keeps label 1, the target label 2."""
    boxes, labels = [[0.0, 0, 10, 10], [0.0, 0, 10, 10]], [1, 2]
    ref, tgt = side(boxes, [0.8, 0.6], labels, threshold=0.7), side(boxes, [0.6, 0.8], labels, threshold=0.7)
    for captured in (True, False):
        result = flips(ref, tgt, captured=captured)
        assert result.counts == {"label_change": 2}
        assert result.examples[0].detail == "label 1 in the reference, 2 in the target"


def test_geometry_the_same_box_moved_beyond_the_match_iou():
    ref, tgt = side([[0.0, 0, 10, 10]], [0.8]), side([[5.0, 0, 15, 10]], [0.8])
    with_candidates = flips(ref, tgt)
    assert with_candidates.counts == {"geometry": 2} and with_candidates.candidates == "both"
    from_outputs = flips(ref, tgt, captured=False)
    assert from_outputs.counts == {"geometry": 2} and from_outputs.candidates == "none"


def test_a_box_kept_on_both_sides_that_the_matching_paired_otherwise_is_not_called_geometry():
    """The target's copy of candidate 0 moved onto candidate 1's place (IoU 0.667 with where it was) and
    candidate 1 fell below the threshold: the one target box is matched to reference box 1, so reference box
    0 is unmatched although its candidate is kept on both sides, above the match IoU."""
    ref = side([[0.0, 0, 10, 10], [2.0, 0, 12, 10]], [0.9, 0.8], nms_iou=0.7)
    tgt = side([[2.0, 0, 12, 10], [2.0, 0, 12, 10]], [0.9, 0.3], nms_iou=0.7)
    result = flips(ref, tgt)
    assert result.counts == {"unattributed": 1} and "paired it with another box" in result.examples[0].detail


def test_two_mechanisms_in_one_image():
    """A box crosses the score threshold while two far-away tied boxes swap: both classes counted."""
    tied = [[50.0, 0, 60, 10], [52.5, 0, 62.5, 10]]
    ref = side([[0.0, 0, 10, 10], *tied], [0.6, 0.7, 0.700001])
    tgt = side([[0.0, 0, 10, 10], *tied], [0.4, 0.700001, 0.7])
    result = flips(ref, tgt, match_iou=0.7)
    assert result.counts == {"tie_order": 2, "score_threshold": 1}


def test_an_example_names_the_image_its_box_is_in():
    same = side([[0.0, 0, 10, 10]], [0.9])
    ref, tgt = side([[0, 0, 10, 10], FAR], [0.6, 0.9]), side([[0, 0, 10, 10], FAR], [0.4, 0.9])
    refs, tgts = [same[0], ref[0]], [same[0], tgt[0]]
    result = attribute(refs, tgts, [match(r, t, 0.5) for r, t in zip(refs, tgts, strict=True)], 0.5,
                       [same[1], ref[1]], [same[1], tgt[1]])
    assert [(e.image, e.mechanism) for e in result.examples] == [(1, "score_threshold")]


def test_nothing_flipped_nothing_counted():
    ref = side([[0.0, 0, 10, 10], FAR], [0.9, 0.8])
    result = flips(ref, side([[0.0, 0, 10, 10], FAR], [0.9, 0.8]))
    assert result.model_dump() == {"counts": {}, "candidates": "both", "examples": []}


def test_what_cannot_be_shown_is_unattributed_never_guessed():
    # from the outputs alone, a box crossing the threshold leaves no trace on the other side
    result = flips(side([[0, 0, 10, 10], FAR], [0.6, 0.9]), side([[0, 0, 10, 10], FAR], [0.4, 0.9]), captured=False)
    assert result.counts == {"unattributed": 1}
    # the target's candidate came from another proposal: its flip is upstream of this post-processing
    ref = side([[0, 0, 10, 10]], [0.6], origins=[[0, 0, 10, 10]])
    tgt = side([[0, 0, 10, 10]], [0.4], origins=[[40, 40, 50, 50]])
    result = flips(ref, tgt)
    assert result.counts == {"unattributed": 1} and "upstream" in result.examples[0].detail
    # a box the target's post-processing would have kept: the target does not post-process as the reference
    ref = side([[0, 0, 10, 10], FAR], [0.6, 0.9])
    tgt = side([[0, 0, 10, 10], FAR], [0.6, 0.9])
    tgt[1].kept, tgt = tgt[1].kept[1:], (tgt[0].taking(slice(1, None)), tgt[1])
    result = flips(ref, tgt)
    assert result.counts == {"unattributed": 1} and "would keep it" in result.examples[0].detail


# -- end to end: a torchvision detector whose post-processing inputs are captured on both sides ----------------

def threshold_detector() -> torch.nn.Module:
    """tests.fixtures.tiny.tied_detector with a score threshold of 0.3: every candidate of its 2 classes
    scores 1/3, so the reference keeps boxes that a nudge of the class logits can take below the threshold."""
    from tests.fixtures.tiny import tied_detector

    model = tied_detector()
    model.roi_heads.score_thresh = 0.3
    return model


class BelowThreshold(EagerBackend):
    """A target that raises the background logit by 0.5: every class's score becomes 0.274, below the
    threshold, so every reference box is gone, and by no other mechanism (the proposals are untouched)."""

    name = "below_threshold"

    def prepare(self, model, example):
        def box_predictor(module, args, output):
            logits, deltas = output
            return logits + torch.tensor([0.5, 0.0, 0.0]), deltas

        model.roi_heads.box_predictor.register_forward_hook(box_predictor)
        super().prepare(model, example)


def test_the_capture_leaves_the_outputs_bit_identical_and_explains_them():
    import copy

    from parity.execute import capture
    from parity.verify.tasks.detection_capture import candidates_of, install

    torch.manual_seed(0)
    model = threshold_detector().eval()
    torch.nn.init.normal_(model.roi_heads.box_predictor.cls_score.weight, std=0.5)  # scores that differ
    images = [torch.rand(3, 128, 128), torch.rand(3, 96, 128)]
    with torch.no_grad():
        plain = model(images)
        assert install(model)
        with capture.watching() as captured:
            watched = copy.deepcopy(model)(images)
        unwatched = model(images)
    for out in (watched, unwatched):
        assert all(torch.equal(a[k], b[k]) for a, b in zip(plain, out, strict=True) for k in a)
    images_candidates = candidates_of(captured)
    assert len(images_candidates) == 2 and len(plain[0]["scores"]) > 0 and len(plain[0]["scores"].unique()) > 1
    for out, cands in zip(plain, images_candidates, strict=True):
        assert torch.equal(cands.scores[cands.kept], out["scores"]) and torch.equal(cands.labels[cands.kept], out["labels"])
        assert cands.proposals is not None and len(cands.proposals.kept) == len(cands.scores) // cands.per_proposal
    assert candidates_of([]) is None and candidates_of(captured * 2) is None  # not exactly one call: none


def test_a_run_classes_a_score_threshold_crossing_and_records_it(tmp_path):
    """The reference's and the target's post-processing inputs are captured in their executions (in a
    worker process: they come back with the execution) and every reference box is classed score_threshold;
    every report says so beside the tier-3 verdict."""
    import io
    import xml.etree.ElementTree as ET

    from rich.console import Console

    from parity.api import run_experiment
    from parity.records.summary import summarize
    from parity.records.view import RunView
    from parity.report.console import render

    exp = {"name": "flips", "seed": 0,
           "models": [{"name": "frcnn", "source": "python", "entry": "tests.verify.test_flips:threshold_detector",
                       "task": "detection"}],
           "inputs": [{"name": "photo", "images": ["sample:astronaut"], "preprocess": {"resize": 64}}],
           "targets": [{"backend": "tests.verify.test_flips:BelowThreshold", "name": "below"}],
           "tolerances": {"atol": [1e-3], "rtol": 1e-5}, "tiers": {"tasks": True},
           "executor": "process"}  # captured in the worker, sent back (the adapter's test runs locally)
    out = tmp_path / "out"
    records = run_experiment(exp, out, reports=("report.md", "report.html", "junit.xml"))
    tier3 = RunView(records).checks(3)[0]
    assert tier3.passed is False and tier3.failure_class == "decision_flip"
    n = tier3.metrics["reference_boxes"]
    assert tier3.metrics["target_boxes"] == 0 and n > 0
    assert tier3.flips.candidates == "both"
    assert tier3.flips.counts == {"score_threshold": n}
    example = tier3.flips.examples[0]
    assert example.detail == "score 0.333333 in the reference, 0.274069 in the target: threshold 0.3"
    # every report shows it beside the tier-3 verdict
    line = f"flips: {n} score_threshold (from the post-processing inputs of both sides)"
    console = Console(file=io.StringIO(), width=300, highlight=False, color_system=None)
    render(records, summarize(records), out, console)
    assert line in console.file.getvalue()
    assert line in (out / "report.md").read_text()
    assert (out / "report.html").read_text().count(line) == 2  # the task's table and the detection boxes
    junit = ET.parse(out / "junit.xml").getroot()
    failure = [c for c in junit.iter("testcase") if c.get("name") == "below tier 3"][0].find("failure")
    assert line in failure.get("message") and "score_threshold: score 0.333333" in failure.text



def test_a_workers_execution_brings_what_it_captured_back():
    """The process and Ray executors rebuild an execution from its worker's messages (runner/worker.py,
    runner/remote.py): what the worker's run captured travels in its `done` message."""
    from types import SimpleNamespace

    from parity.runner.remote import RemoteExecution

    captured = [{"kind": "torchvision_roi_heads", "class_logits": torch.ones(2, 3)}]
    remote = RemoteExecution(SimpleNamespace(), None, "digest", None)
    remote.receive(("repeat", 0, 0.1, [{"boxes": torch.zeros(0, 4)}], 0.2, None, [], 0))
    remote.receive(("done", "ok", None, None, 0.2, None, [], 0, None, [], captured, None, None))
    assert remote.execution.captured is captured and remote.finished


def test_candidates_are_used_only_when_they_are_behind_the_outputs():
    """Code after the detector's head that drops or reorders boxes breaks the link between an output box
    and its candidate: the candidates are then not used (outputs alone), rather than misread."""
    from parity.verify.tasks.detection import behind

    dets, cands = side([[0.0, 0, 10, 10], FAR], [0.6, 0.9])
    assert behind([dets], [cands]) == [cands]
    assert behind([dets.taking(slice(0, 1))], [cands]) is None  # one box dropped
    assert behind([dets.taking(torch.tensor([1, 0]))], [cands]) is None  # reordered
    assert behind([dets], None) is None


def test_tier3_settings_travel_to_a_worker_pickled():
    """An experiment goes to process and Ray workers pickled; its `tiers.tasks` is a model made at run
    time, which pickles as its values."""
    import pickle

    from parity.config.schema import tasks_spec

    spec = tasks_spec({"detection": {"f1": 0.5, "attribution": False}})
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and type(back) is type(spec) and back.detection.attribution is False


def test_attribution_off_neither_instruments_nor_classes():
    from parity.verify.tasks.detection import TASK, DetectionThresholds

    model = threshold_detector()
    TASK.instrument(model, DetectionThresholds(attribution=False))
    assert "postprocess_detections" not in vars(model.roi_heads)
    TASK.instrument(model, DetectionThresholds())
    assert "postprocess_detections" in vars(model.roi_heads) and "filter_proposals" in vars(model.rpn)
    dets = output(side([[0.0, 0, 10, 10]], [0.9])[0])
    none = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}
    assert TASK.explain([dets], [none], DetectionThresholds(attribution=False), [], []) == {}
    assert TASK.explain([dets], [none], DetectionThresholds(), [], [])["flips"].counts == {"unattributed": 1}


def test_an_explanation_that_raises_leaves_the_verdict(monkeypatch, caplog):
    """Attribution is extra: if it fails on outputs nobody foresaw, the check keeps its verdict and the
    run says why it has no flips."""
    from types import SimpleNamespace

    from parity.config.schema import tasks_spec
    from parity.verify.tasks import detection, task_check

    def broken(*args):
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(detection, "flips", broken)
    dets = output(side([[0.0, 0, 10, 10]], [0.9])[0])
    none = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}
    ran = lambda out: SimpleNamespace(ok=True, outputs=[out], captured=[], follow_up=None,  # noqa: E731
                                      backend=SimpleNamespace(id="t"))
    job = SimpleNamespace(model=SimpleNamespace(task="detection", name="m"), inputs=SimpleNamespace(name="i"),
                          reference=SimpleNamespace(id="r"))
    experiment = SimpleNamespace(tiers=SimpleNamespace(tasks=tasks_spec({})),
                                 tolerance_for=lambda backend: SimpleNamespace(gate=1e-3))
    monkeypatch.setattr(detection.TASK, "record_fields", lambda *args: {})
    record = task_check(job, ran([none]), ran([dets]), experiment)
    assert record.passed is False and record.failure_class == "decision_flip" and record.flips is None
    assert "could not explain its failure: RuntimeError: unforeseen" in caplog.text


# -- a detector's own post-processing: record_candidates, and NMS across labels ----------------------------------

def test_class_agnostic_nms_a_box_suppressed_by_one_of_another_label():
    """NMS across labels (as YOLO post-processing runs it): the target's box of label 2 overlaps the kept
    box of label 1 beyond the NMS IoU there and not in the reference. Classed through NMS when the
    candidates say their NMS is class-agnostic; per-label NMS would have no rival to name."""
    def agnostic(boxes, scores, labels):
        d, c = side(boxes, scores, labels=[0, 0])  # one NMS group, as class-agnostic NMS has
        c.labels = torch.tensor(labels)
        c.class_agnostic = True
        return Detections(d.boxes, c.labels[c.kept], d.scores), c

    k = [0.0, 0, 10, 10]
    ref = agnostic([k, [3.8, 0, 13.8, 10]], [0.9, 0.8], [1, 2])
    tgt = agnostic([k, [2.9, 0, 12.9, 10]], [0.9, 0.8], [1, 2])
    result = flips(ref, tgt)
    assert result.counts == {"nms_iou": 1} and result.examples[0].label == 2
    ref[1].class_agnostic = tgt[1].class_agnostic = False  # the same candidates read as per-label NMS
    assert flips(ref, tgt).counts == {"unattributed": 1}


def test_class_agnostic_candidates_correspond_by_index_when_an_anchor_changes_its_label():
    """An anchor whose best class changed is still the same anchor: its score crossing the threshold is
    classed as such, not left unattributed for want of a counterpart."""
    ref = side([[0, 0, 10, 10], FAR], [0.6, 0.9], labels=[1, 3])
    tgt = side([[0, 0, 10, 10], FAR], [0.4, 0.9], labels=[2, 3])
    assert flips(ref, tgt).counts == {"unattributed": 1}  # per-label candidates: no counterpart
    ref[1].class_agnostic = tgt[1].class_agnostic = True
    assert flips(ref, tgt).counts == {"score_threshold": 1}


def test_record_candidates_keeps_one_images_post_processing_only_in_a_watched_eager_run(monkeypatch):
    import parity
    from parity.execute import capture
    from parity.verify.tasks.detection_capture import HeadsCall, candidates_of

    boxes, scores = torch.tensor([[0.0, 0, 10, 10], FAR]), torch.tensor([0.6, 0.9])
    labels, kept = torch.tensor([1, 1]), torch.tensor([1, 0])

    def record():
        parity.record_candidates(boxes, scores, labels, kept, score_threshold=0.5, nms_iou=0.45, top_k=100,
                                 class_agnostic=True)

    record()  # not watched: nothing anywhere
    with capture.watching() as captured:
        record()
        record()
    [first, second] = candidates_of(captured)
    assert torch.equal(first.kept, kept) and first.class_agnostic and first.nms_iou == 0.45 and first.top_k == 100
    with capture.watching() as traced:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        record()  # a compiler tracing the model: its fake tensors are no candidates
    assert traced == []
    # with a torchvision head's capture in the same run, which of the two explains the outputs is unknown
    heads = HeadsCall(torch.ones(1, 3), torch.zeros(1, 12), [torch.zeros(1, 4)], [(8, 8)], (10.0, 10.0, 5.0, 5.0), 4.0,
                      0.05, 0.5, 100, ([boxes], [scores], [labels]))
    assert candidates_of([*captured, heads]) is None


class GridDetector(torch.nn.Module):
    """Twenty boxes apart on a grid, each scored by a parameter, post-processed in torch (threshold 0.5, NMS)
    with its candidates handed to parity.record_candidates, as a detector of one's own does."""

    def __init__(self):
        super().__init__()
        corners = torch.tensor([[20.0 * (i % 5), 20.0 * (i // 5)] for i in range(20)])
        self.register_buffer("boxes", torch.cat([corners, corners + 10], 1))
        self.scores = torch.nn.Parameter(torch.linspace(0.6, 0.9, 20))

    def forward(self, images):
        from torchvision.ops import batched_nms

        import parity

        results = []
        for image in images:
            scores = self.scores * (1 + 0 * image.mean())
            labels = torch.ones(20, dtype=torch.int64)
            above = torch.nonzero(scores > 0.5).flatten()
            keep = above[batched_nms(self.boxes[above], scores[above], labels[above], 0.5)]
            parity.record_candidates(self.boxes, scores, labels, keep, score_threshold=0.5, nms_iou=0.5, top_k=100)
            results.append({"boxes": self.boxes[keep], "scores": scores[keep], "labels": labels[keep]})
        return results


class OneBelowThreshold(EagerBackend):
    """Takes the lowest-scoring box below the threshold: 19 of 20 boxes left, F1 0.974, a pass at 0.95."""

    name = "one_below_threshold"

    def prepare(self, model, example):
        with torch.no_grad():
            model.scores[0] = 0.4
        super().prepare(model, example)


def test_a_passing_check_with_an_unmatched_box_classes_it_too(tmp_path):
    """Tier 3 passes (F1 above its threshold) and still names why the one box differs, beside 'agrees'."""
    from parity.api import run_experiment
    from parity.records.view import RunView

    exp = {"name": "pass-flips", "seed": 0,
           "models": [{"name": "grid", "source": "python", "entry": "tests.verify.test_flips:GridDetector", "task": "detection"}],
           "inputs": [{"name": "photo", "images": ["sample:astronaut"], "preprocess": {"resize": 32}}],
           "targets": [{"backend": "tests.verify.test_flips:OneBelowThreshold", "name": "one-below"}],
           "tolerances": {"atol": [1e-3], "rtol": 1e-5}, "tiers": {"tasks": True}}
    out = tmp_path / "out"
    records = run_experiment(exp, out)
    tier3 = RunView(records).checks(3)[0]
    assert tier3.passed is True and tier3.metrics["target_boxes"] == 19
    assert tier3.flips.counts == {"score_threshold": 1} and tier3.flips.candidates == "both"
    assert "agrees; flips: 1 score_threshold (from the post-processing inputs of both sides)" in (out / "report.md").read_text()
