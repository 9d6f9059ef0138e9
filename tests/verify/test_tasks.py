"""Tier 3: task-level agreement, with targets that really differ (flipped decisions, lost boxes, boxes
in another order, relabelled pixels) and the failure class each must get."""

from __future__ import annotations

import pytest
import torch

from parity.api import run_experiment
from parity.config.schema import tasks_spec
from parity.records.view import RunView
from parity.verify.tasks import evaluate
from parity.verify.tasks.classification import rank_distance
from parity.verify.tasks.detection import average_precision, detections_of, match
from tests.support import tiny_experiment

T = tasks_spec()


def dets(boxes, labels, scores):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels),
            "scores": torch.tensor(scores)}


REF = [dets([[0, 0, 10, 10], [20, 20, 40, 40], [50, 50, 60, 70]], [1, 2, 1], [0.9, 0.8, 0.7])]


def test_classification_agreement_and_flips():
    logits = torch.randn(8, 10, generator=torch.Generator().manual_seed(0))
    same = evaluate("classification", logits, logits + 1e-7, T, 1e-4)
    assert same.passed and same.metrics["top1_agreement"] == 1.0 and same.metrics["rank_distance"] == 0.0
    flipped = logits.clone()
    flipped[0] = -flipped[0]  # the first sample's decision changes
    r = evaluate("classification", logits, flipped, T, 1e-4)
    assert not r.passed and r.failure_class == "decision_flip" and r.metrics["top1_flips"] == 1
    assert r.metrics["top1_agreement"] == 7 / 8 and r.metrics["kl_divergence"] > 0.1
    assert "1 of 8 decisions flipped" in r.detail


def test_kl_divergence_of_almost_equal_scores_is_never_negative():
    """Scores that differ by a float32 round trip: the float64 sum comes out around -1e-18 for some of
    them (the first assertion proves this set has such a case), which must read as 0."""
    g = torch.Generator().manual_seed(0)
    pairs = [(ref, ref.float().double()) for ref in (torch.randn(2, 5, generator=g, dtype=torch.float64) for _ in range(50))]
    raw = [float((r.softmax(1) * (r.log_softmax(1) - t.log_softmax(1))).sum(1).mean()) for r, t in pairs]
    assert min(raw) < 0
    assert min(evaluate("classification", r, t, T, 1e-4).metrics["kl_divergence"] for r, t in pairs) == 0.0


def test_rank_distance_grows_with_reordering():
    ref = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert rank_distance(ref, ref, 3) == 0.0
    assert 0 < rank_distance(ref, torch.tensor([[3.0, 4.0, 2.0, 1.0, 0.0]]), 3) < rank_distance(ref, -ref, 3)


def test_detection_same_boxes_in_another_order_is_the_same_set():
    perm = [2, 0, 1]
    shuffled = [{k: v[perm] for k, v in REF[0].items()}]
    r = evaluate("detection", REF, shuffled, T, 1e-4)
    assert r.passed and r.same_set and r.metrics["f1"] == 1.0 and r.metrics["map"] == pytest.approx(1.0)


def test_detection_lost_and_moved_boxes():
    lost = [dets([[0, 0, 10, 10], [20, 20, 40, 40]], [1, 2], [0.9, 0.8])]
    r = evaluate("detection", REF, lost, T, 1e-4)
    assert not r.passed and r.failure_class == "decision_flip"
    assert r.metrics["box_count_change"] == -1 and r.metrics["recall"] == pytest.approx(2 / 3)
    assert r.metrics["precision"] == 1.0 and r.metrics["f1"] == pytest.approx(0.8)
    moved = [dets([[0.5, 0, 10.5, 10], [20, 20, 40, 40], [50, 50, 60, 70]], [1, 2, 1], [0.9, 0.79, 0.7])]
    r = evaluate("detection", REF, moved, T, 1e-4)
    assert r.passed and not r.same_set  # the same objects, but not the same numbers
    assert r.metrics["max_box_drift"] == pytest.approx(0.5) and r.metrics["max_score_drift"] == pytest.approx(0.01)


def test_zero_area_boxes_match_nothing_instead_of_crashing():
    flat = [dets([[5, 5, 5, 5], [20, 20, 40, 40]], [1, 2], [0.9, 0.8])]
    assert evaluate("detection", flat, flat, T, 1e-4).metrics["matched"] == 2  # identical boxes match
    moved = [dets([[5, 5, 5, 6], [20, 20, 40, 40]], [1, 2], [0.9, 0.8])]
    assert evaluate("detection", flat, moved, T, 1e-4).metrics["matched"] == 1


def test_matching_respects_labels_and_iou():
    [ref, relabelled, far] = detections_of([REF[0], dets([[0, 0, 10, 10]], [2], [0.9]),
                                            dets([[5, 5, 15, 15]], [1], [0.9])])  # far: IoU 25/175
    assert match(ref, relabelled, 0.5) == []
    assert match(ref, far, 0.5) == [] and len(match(ref, far, 0.1)) == 1


def test_average_precision():
    ref = detections_of(REF)
    assert average_precision(ref, ref, 0.5) == pytest.approx(1.0)
    # label 1: a confident false positive ranked first; precision 0, 1/2, 2/3 at recall 0, 1/2, 1, so the
    # interpolated AP is 2/3 * 1/2 + 2/3 * 1/2 = 2/3; label 2 is perfect: mAP = (2/3 + 1) / 2
    extra = [dets([[100, 100, 110, 110], [0, 0, 10, 10], [50, 50, 60, 70], [20, 20, 40, 40]],
                  [1, 1, 1, 2], [0.99, 0.9, 0.7, 0.8])]
    assert average_precision(ref, detections_of(extra), 0.5) == pytest.approx(5 / 6)


def test_segmentation_pixel_agreement_and_miou():
    scores = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert evaluate("segmentation", {"out": scores}, {"out": scores.clone()}, T, 1e-4).metrics["miou"] == 1.0
    flipped = scores.clone()
    flipped[..., :2, :] = flipped[..., :2, :].flip(1)  # two rows of pixels change class
    r = evaluate("segmentation", {"out": scores}, {"out": flipped}, T, 1e-4)
    assert not r.passed and r.failure_class == "decision_flip" and r.metrics["pixel_agreement"] < 0.99


def test_outputs_of_the_wrong_shape_are_a_structure_mismatch():
    r = evaluate("detection", torch.zeros(2, 3), torch.zeros(2, 3), T, 1e-4)
    assert not r.passed and r.failure_class == "structure_mismatch"


def test_run_writes_tier3_checks_and_fails_on_a_flip(tmp_path):
    data = tiny_experiment([{"backend": "eager", "name": "same"},
                            {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}],
                           tiers={"tasks": {"classification": {"top1_agreement": 1.0}}})
    data["models"][0]["task"] = "classification"
    records = run_experiment(data, out=tmp_path)
    tier3 = {r.target: r for r in RunView(records).checks(3)}
    assert tier3["same"].passed and tier3["same"].metrics["top1_agreement"] == 1.0
    assert set(tier3["perturbed"].metrics) >= {"top1_agreement", "top5_overlap", "kl_divergence", "rank_distance"}


def test_detections_in_another_order_fail_tier1_as_ordering_and_agree_in_tier3(tmp_path):
    data = tiny_experiment([{"backend": "tests.fixtures.tiny:ShuffledEager", "name": "shuffled"},
                            {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}],
                           tiers={"tasks": True})
    data["models"][0].update(entry="tests.fixtures.tiny:tiny_detector", task="detection")
    data["inputs"] = [{"name": "photos", "images": ["sample:chelsea", "sample:coffee"], "preprocess": {"resize": 32}}]
    records = run_experiment(data, out=tmp_path)
    checks = {(r["tier"], r["target"]): r for r in records if r["kind"] == "check"}
    assert checks[(1, "shuffled")]["failure_class"] == "ordering"
    assert checks[(3, "shuffled")]["passed"] and checks[(3, "shuffled")]["same_set"]
    assert checks[(1, "perturbed")]["failure_class"] == "numeric_drift"  # other numbers, not another order
    assert not checks[(3, "perturbed")]["same_set"]
    pictures = checks[(3, "shuffled")]["pictures"]  # what a report draws: the files and both sides' boxes
    assert [image["source"] for image in pictures["images"]] == ["sample:chelsea", "sample:coffee"]
    assert pictures["target"] == pictures["reference"]  # by score, the same boxes: only their order differed


def test_class_scores_among_several_outputs_are_named_not_guessed(tmp_path, capsys):
    data = tiny_experiment([{"backend": "tests.fixtures.tiny:FlipLogits", "name": "flip"}],
                           tiers={"tasks": True}, tolerances={"atol": [10.0], "gate": 10.0})
    data["models"][0].update(entry="tests.fixtures.tiny:features_and_logits", task="classification")
    data["inputs"] = [{"name": "x", "synthetic": {"shape": [4, 3, 2, 2]}}]
    records = run_experiment(data, out=tmp_path / "guess")
    [tier3] = RunView(records).checks(3)
    assert tier3.failure_class == "structure_mismatch" and "tiers.tasks.output" in tier3.detail
    data["tiers"] = {"tasks": {"output": "out[1]"}}
    path = tmp_path / "named.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    from parity.cli import main

    assert main(["run", str(path), "--out", str(tmp_path / "named"), "--quiet"]) == 1  # tier 1 passes at 10
    out = capsys.readouterr().out
    assert "1 passed, 0 failed" in out and "tier 3: 0 agree, 1 differ" in out and "decision_flip" in out


def test_fallback_names_are_checked_before_anything_runs(tmp_path):
    from parity.errors import ParityError

    data = tiny_experiment([{"backend": "eager", "dtype": "bfloat16", "fallback": ["haed"]}])
    with pytest.raises(ParityError, match="target eager-cpu-bfloat16: fallback names 'haed'.*did you mean 'head'"):
        run_experiment(data, out=tmp_path)
    assert [r["kind"] for r in map(__import__("json").loads, (tmp_path / "records.jsonl").read_text().splitlines())] == ["run"]


def test_drawable_keeps_the_highest_scores_rounded():
    from parity.verify.tasks.detection import drawable

    out = [{"boxes": torch.tensor([[0, 0, 1, 1], [2, 2, 3.123456, 3], [4, 4, 5, 5]], dtype=torch.float32),
            "labels": torch.tensor([1, 2, 3]), "scores": torch.tensor([0.2, 0.9, 0.5])}]
    [kept] = drawable(out, cap=2)
    assert kept.model_dump() == {"boxes": [[2.0, 2.0, 3.12, 3.0], [4.0, 4.0, 5.0, 5.0]], "labels": [2, 3],
                                 "scores": [0.9, 0.5], "total": 3}


def test_a_tasks_verdict_is_made_once_and_its_check_is_a_frozen_record_in_the_order_parity_writes():
    """`verdict` and `with_failure` return a new result (the task's own is left as it was); `tier3_check` makes
    the record once, its keys in the order of records.jsonl, a task's extra fields after the verdict's."""
    from pydantic import ValidationError

    from parity.records.models import Tier3Check
    from parity.verify.tasks import TaskResult, tier3_check, verdict

    agrees = TaskResult("classification", {"top1_agreement": 1.0}, same_set=True)
    failed = verdict(agrees, ["top-1 agreement 0.5 < 0.99", "KL 0.3 > 0.1"])
    assert agrees.passed and agrees.detail is None
    assert not failed.passed and failed.failure_class == "decision_flip"
    assert failed.detail == "top-1 agreement 0.5 < 0.99; KL 0.3 > 0.1"
    check = tier3_check(failed, model="m", inputs="i", reference="r", target="t", thresholds={"top1_agreement": 0.99},
                        fields={"notes": ["few positions"]})
    assert isinstance(check, Tier3Check) and (check.passed, check.same_set, check.notes) == (False, True, ["few positions"])
    assert list(check.model_dump(exclude_unset=True)) == [
        "kind", "tier", "model", "inputs", "reference", "target", "task", "status", "passed", "failure_class",
        "detail", "metrics", "thresholds", "same_set", "notes"]
    with pytest.raises(ValidationError):
        check.passed = True
