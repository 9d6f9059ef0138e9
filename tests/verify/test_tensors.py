"""Tier 1: the closeness test, the required atol, and a failure class for every way outputs differ."""

from __future__ import annotations

import math

import pytest
import torch

from parity import taxonomy as tx
from parity.verify.tensors import compare, error_stats, oracle_verdict


def test_required_atol_is_the_smallest_passing_atol():
    ref = torch.tensor([1.0, 100.0, 0.0], dtype=torch.float64)
    tgt = torch.tensor([1.0 + 3e-5, 100.0 + 2e-3, 1e-6], dtype=torch.float64)
    rtol = 1e-5
    stats = error_stats(ref, tgt, rtol, gate=1e-4)
    # per element |t - r| - rtol * |r|: 3e-5 - 1e-5, 2e-3 - 1e-3, 1e-6
    assert stats.required_atol == pytest.approx(1e-3, rel=1e-6)
    comparison = compare(ref, tgt, rtol, 1e-4)
    assert comparison.required_atol > 0.99e-3 and comparison.required_atol <= 1.01e-3
    # the verdict at every atol agrees with torch.isclose
    for atol in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
        assert (comparison.required_atol <= atol) == bool(torch.isclose(tgt.double(), ref.double(), rtol=rtol, atol=atol).all())


def test_statistics():
    ref, tgt = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([1.0, -2.5, 4.0])
    s = error_stats(ref, tgt, rtol=0.0, gate=0.1)
    assert s.max_abs == 0.5 and s.max_rel == 0.25
    assert s.mean_abs == pytest.approx(0.5 / 3) and s.rmse == pytest.approx(math.sqrt(0.25 / 3))
    assert s.mismatch_fraction == pytest.approx(1 / 3)
    assert 0.99 < s.cosine < 1.0
    assert s.reference_rms == pytest.approx(math.sqrt((1 + 4 + 16) / 3))  # the scale of required_atol


def test_identical_outputs_pass_at_zero():
    out = {"a": torch.randn(3, 3), "b": 7}
    c = compare(out, {"a": out["a"].clone(), "b": 7}, 0.0, 0.0)
    assert c.failure_class is None and c.required_atol == 0.0


def test_numeric_drift():
    c = compare(torch.zeros(4), torch.full((4,), 2e-3), 0.0, 1e-4)
    assert c.failure_class == tx.NUMERIC_DRIFT and c.required_atol <= 1e-2 and c.required_atol > 1e-3
    assert "max abs 0.002" in c.detail


def test_nan_introduced_is_nonfinite_at_every_tolerance():
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    same = compare(ref, ref.clone(), 0.0, 0.0)
    assert same.failure_class is None  # NaN where the reference has NaN, inf where it has inf: fine
    c = compare(ref, torch.tensor([float("nan"), float("nan"), float("inf")]), 0.0, 1e-4)
    assert c.failure_class == tx.NONFINITE and c.required_atol == math.inf and c.required_atol > 1e9
    c = compare(ref, torch.tensor([1.0, float("nan"), -float("inf")]), 0.0, 1e-4)
    assert c.failure_class == tx.NONFINITE


def test_nan_throughout_both_outputs_is_no_pass():
    """Both sides agree, but on no number: nothing was compared, so no tolerance can pass it."""
    nan = torch.full((2, 3), float("nan"))
    c = compare({"logits": nan, "loss": float("nan")}, {"logits": nan.clone(), "loss": float("nan")}, 0.0, 1e-4)
    assert [leaf.failure_class for leaf in c.leaves] == [tx.NONFINITE, tx.NONFINITE] and c.required_atol > 1e9
    assert "no number to compare" in c.leaves[0].detail
    partly = torch.tensor([1.0, float("nan")])
    assert compare(partly, partly.clone(), 0.0, 0.0).failure_class is None  # numbers compared, NaN in place
    assert compare(torch.zeros(0), torch.zeros(0), 0.0, 0.0).failure_class is None  # empty: no detection is an answer


def test_shape_and_structure_mismatch():
    assert compare(torch.zeros(2, 3), torch.zeros(3, 2), 0, 1).failure_class == tx.SHAPE_MISMATCH
    c = compare({"a": torch.zeros(1), "b": torch.zeros(1)}, {"a": torch.zeros(1)}, 0, 1)
    assert c.failure_class == tx.STRUCTURE_MISMATCH and "missing" in c.detail and c.required_atol > 1e9
    assert compare([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)], 0, 1).failure_class == tx.STRUCTURE_MISMATCH
    assert compare(torch.zeros(1), 0.0, 0, 1).failure_class == tx.STRUCTURE_MISMATCH


def test_float_precision_may_differ_but_integer_dtypes_may_not():
    ref = torch.tensor([1.0, 2.0])
    c = compare(ref, ref.to(torch.bfloat16), 0.0, 1e-4)
    assert c.failure_class is None and c.leaves[0].reference_dtype == "float32"
    c = compare(torch.tensor([1, 2]), torch.tensor([1, 2], dtype=torch.int32), 0.0, 1e-4)
    assert c.failure_class == tx.DTYPE_MISMATCH


def test_non_tensor_leaves_are_compared_exactly_never_passed_silently():
    x = torch.ones(2)
    assert compare({"n": 3, "x": x}, {"n": 3, "x": x}, 0, 1).failure_class is None
    assert compare({"n": 3}, {"n": 3}, 0, 1).failure_class == tx.UNCOMPARABLE  # no tensor: nothing computed is checked
    assert compare({"n": 3}, {"n": 4}, 0, 1e9).failure_class == tx.NUMERIC_DRIFT
    assert compare({"n": 3}, {"n": 4}, 0, 1e9).required_atol > 1e9
    assert compare({"s": "cat"}, {"s": "dog"}, 0, 1).failure_class == tx.STRUCTURE_MISMATCH
    c = compare(object(), object(), 0, 1)
    assert c.failure_class == tx.UNCOMPARABLE and "cannot be compared" in c.detail


def test_most_severe_class_wins():
    ref = {"a": torch.zeros(2), "b": torch.zeros(2)}
    c = compare(ref, {"a": torch.ones(2), "b": torch.zeros(3)}, 0, 1e-4)
    assert c.failure_class == tx.SHAPE_MISMATCH


def test_oracle_tells_who_is_wrong():
    oracle = torch.linspace(-1, 1, 100, dtype=torch.float64)
    reference = oracle.float()
    close_target = (oracle + 1e-8).float()
    far_target = (oracle + 1e-3).float()
    verdict = oracle_verdict(compare(reference, far_target, 0, 1e-4, oracle), 2.0, 1e-8)
    assert verdict.target_worse and verdict.target_rmse > verdict.reference_rmse
    verdict = oracle_verdict(compare(reference, close_target, 0, 1e-4, oracle), 2.0, 1e-8)
    assert not verdict.target_worse


def test_statistics_of_a_tensor_larger_than_a_chunk_equal_the_whole_tensor_formulas():
    """error_stats works a chunk at a time; what it adds up must be what one pass over the whole gives,
    a NaN in a later chunk included."""
    from parity.verify.tensors import CHUNK

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2 * CHUNK + 123, generator=g, dtype=torch.float64)
    tgt = ref + 1e-3 * torch.randn(ref.shape, generator=g, dtype=torch.float64)
    tgt[CHUNK + 5] = float("nan")
    stats = error_stats(ref.float(), tgt.float(), rtol=1e-2, gate=1e-3)
    r, t = ref.float().double(), tgt.float().double()
    keep = torch.isfinite(t)
    d = (t - r)[keep].abs()
    assert stats.nonfinite == 1 and stats.required_atol is None
    assert stats.max_abs == pytest.approx(float(d.max()), rel=1e-12)
    assert stats.rmse == pytest.approx(float(d.square().mean().sqrt()), rel=1e-9)
    assert stats.mean_abs == pytest.approx(float(d.mean()), rel=1e-9)
    assert stats.reference_energy == pytest.approx(float(r[keep].square().sum()), rel=1e-9)
    assert stats.reference_rms == pytest.approx(float(r[keep].square().mean().sqrt()), rel=1e-9)
    beyond = int((d - 1e-2 * r[keep].abs() > 1e-3).sum())
    assert stats.mismatch_fraction == pytest.approx((beyond + 1) / r.numel())
    clean = error_stats(ref.float(), torch.where(keep, tgt, ref).float(), rtol=1e-2, gate=1e-3)
    assert clean.required_atol == pytest.approx(float((d - 1e-2 * r[keep].abs()).max()), rel=1e-9)


STATS = ["max_abs", "rmse", "cosine", "nonfinite", "max_rel", "mean_abs", "mismatch_fraction", "reference_rms"]


def test_each_kind_of_leaf_is_a_frozen_record_with_its_keys_in_the_order_parity_always_wrote_them():
    """`compare` returns `Leaf` records; each dumps the keys it was made from in the order it measured them (the
    bytes of records.jsonl), whatever order the model declares them in."""
    from pydantic import ValidationError

    from parity.records.models import Leaf, LeafTolerance

    ref = {"x": torch.tensor([1.0, 2.0]), "n": 3, "s": torch.zeros(2), "gone": torch.zeros(1)}
    tgt = {"x": torch.tensor([1.5, 2.0], dtype=torch.float64), "n": 4, "s": torch.zeros(3)}
    oracle = {"x": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    rule = LeafTolerance(atol=0.1, rtol=0.0, rule="rule out['x']")
    c = compare(ref, tgt, 0.0, 1e-4, oracle, lambda name: rule if name == "out['x']" else LeafTolerance(
        atol=None, rtol=0.0, rule=None))
    leaves = {leaf.name: leaf for leaf in c.leaves}
    assert all(isinstance(leaf, Leaf) for leaf in c.leaves)
    keys = {name: list(leaf.model_dump(exclude_unset=True)) for name, leaf in leaves.items()}
    head = ["name", "required_atol", "failure_class"]
    assert keys["out['x']"] == [*head, "shape", "dtype", "reference_dtype", *STATS, "detail", "tolerance",
                                "oracle_rmse_target", "oracle_rmse_reference"]
    assert keys["out['n']"] == [*head, "value", "reference_value", "detail"]
    assert keys["out['s']"] == [*head, "shape", "dtype", "reference_shape", "detail"]
    assert keys["out['gone']"] == [*head, "detail"]
    x = leaves["out['x']"]
    assert x.detail.endswith("(judged by the rule out['x'])") and x.tolerance == rule and x.required_atol == 0.5
    with pytest.raises(ValidationError):
        x.max_abs = 0.0  # frozen: no reader changes a value for the next
