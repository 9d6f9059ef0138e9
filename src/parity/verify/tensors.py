"""Tier 1: tensor closeness, leaf by leaf.

The elementwise test is |target - reference| <= atol + rtol * |reference|. Each leaf keeps its
*required atol* at the configured rtol, max(|t - r| - rtol * |r|), the smallest atol that passes, so the
verdict at every atol of a sweep, and any later re-judgement, comes from one execution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from numbers import Number
from typing import Any

import torch

from parity import taxonomy as tx
from parity.outputs import Opaque, flatten
from parity.records.models import Leaf, LeafTolerance, OracleVerdict


@dataclass(frozen=True)
class Comparison:
    """Every leaf of one target-vs-reference comparison, and what they add up to."""

    leaves: list[Leaf] = field(default_factory=list)
    failure_class: str | None = None  # a failure that no tolerance can fix, or numeric_drift
    detail: str | None = None

    @property
    def required_atol(self) -> float:
        """The smallest atol of the sweep at which every leaf passes; inf when none does (structure, NaN,
        a leaf beyond the atol of its own output rule, which no sweep atol changes)."""
        if self.failure_class not in (None, tx.NUMERIC_DRIFT):
            return math.inf
        required = 0.0
        for leaf in self.leaves:
            value, own = leaf.required_atol, leaf.tolerance.atol if leaf.tolerance else None
            if value is None or (own is not None and value > own):
                return math.inf
            if own is None:
                required = max(required, value)
        return required


def _as_float(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.detach().to("cpu", torch.float64)


def _kind(t: torch.Tensor) -> str:
    return "float" if (t.is_floating_point() or t.is_complex()) else str(t.dtype)


def compared_exactly(leaf: Leaf) -> bool:
    """Was this tensor leaf compared exactly (integer or boolean on both sides: labels, indices, masks),
    so that no tolerance applied to it? Read from its record, for the messages that render it."""
    dtypes = [getattr(torch, d, None) if d else None for d in (leaf.dtype, leaf.reference_dtype or leaf.dtype)]
    return all(isinstance(d, torch.dtype) and not (d.is_floating_point or d.is_complex) for d in dtypes) \
        and dtypes[0] == dtypes[1]


CHUNK = 1 << 18  # elements compared at a time: the float64 temporaries stay a few MB however large a tensor is


def _flat(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)


@dataclass(frozen=True)
class ErrorStats:
    """Error statistics of two same-shape tensors (`error_stats`); non-finite values must match in place and kind."""

    max_abs: float
    rmse: float
    cosine: float
    required_atol: float | None  # None: NaN/Inf in one output only, which no atol passes
    nonfinite: int  # elements NaN/Inf in one output only (or another kind of them)
    reference_energy: float  # the sum of squares of the reference's finite values: tier 2's SQNR
    # what tier 1 keeps beside them (`full`), None when left out
    max_rel: float | None = None
    mean_abs: float | None = None
    mismatch_fraction: float | None = None
    reference_rms: float | None = None

    def leaf_fields(self) -> dict[str, Any]:
        """What a `Leaf` record keeps of them, in the order it has always had them (the required atol apart)."""
        return {"max_abs": self.max_abs, "rmse": self.rmse, "cosine": self.cosine, "nonfinite": self.nonfinite,
                "max_rel": self.max_rel, "mean_abs": self.mean_abs, "mismatch_fraction": self.mismatch_fraction,
                "reference_rms": self.reference_rms}


def error_stats(ref: torch.Tensor, tgt: torch.Tensor, rtol: float, gate: float, full: bool = True) -> ErrorStats:
    """The error statistics of two same-shape tensors, with the energy of the reference's finite values, which tier
    2's SQNR needs. Tier 2 runs this on every layer of a model while holding two runs' activations, so it
    is lean: float64 a chunk at a time, finite energies prove that a chunk's values are all finite (the
    masks, the costliest part, are for the rare chunk with NaN/Inf), and `full=False` leaves out what
    tier 2 does not use (max_rel, mean_abs, mismatch_fraction, reference_rms)."""
    r_all, t_all = _flat(ref), _flat(tgt)
    n = r_all.numel()
    n_bad = compared = mismatches = 0
    max_abs = sq_diff = dot = ref_energy = tgt_energy = abs_sum = max_rel = 0.0
    max_excess = -math.inf
    for start in range(0, n, CHUNK):
        r = r_all[start:start + CHUNK].to("cpu", torch.float64)
        t = t_all[start:start + CHUNK].to("cpu", torch.float64)
        r_e, t_e = float(torch.dot(r, r)), float(torch.dot(t, t))
        if not (math.isfinite(r_e) and math.isfinite(t_e)):
            fin_r, fin_t = torch.isfinite(r), torch.isfinite(t)
            same_special = (torch.isnan(r) & torch.isnan(t)) | (~fin_r & ~fin_t & (r == t))
            n_bad += int(((~fin_r | ~fin_t) & ~same_special).sum())
            both = fin_r & fin_t
            r, t = r[both], t[both]
            r_e, t_e = float(torch.dot(r, r)), float(torch.dot(t, t))
        if r.numel() == 0:
            continue
        diff = t.sub(r).abs_()
        abs_r = r.abs()
        excess = diff.sub(abs_r, alpha=rtol)
        compared += r.numel()
        ref_energy, tgt_energy, dot = ref_energy + r_e, tgt_energy + t_e, dot + float(torch.dot(r, t))
        max_abs, sq_diff = max(max_abs, float(diff.max())), sq_diff + float(torch.dot(diff, diff))
        max_excess = max(max_excess, float(excess.max()))
        if full:
            abs_sum, mismatches = abs_sum + float(diff.sum()), mismatches + int((excess > gate).sum())
            rel = diff.div_(abs_r).masked_fill_(abs_r == 0, 0.0)  # x/0 and 0/0 are no relative errors
            max_rel = max(max_rel, float(rel.max()))
    stats = ErrorStats(max_abs=max_abs, rmse=math.sqrt(sq_diff / compared) if compared else 0.0,
                       cosine=_cosine(dot, ref_energy, tgt_energy),
                       required_atol=None if n_bad else max(max_excess, 0.0), nonfinite=n_bad,
                       reference_energy=ref_energy)
    if not full:
        return stats
    return replace(stats, max_rel=max_rel, mean_abs=abs_sum / compared if compared else 0.0,
                   mismatch_fraction=(mismatches + n_bad) / n if n else 0.0,
                   reference_rms=math.sqrt(ref_energy / compared) if compared else 0.0)


def _cosine(dot: float, ref_energy: float, tgt_energy: float) -> float:
    if ref_energy == 0 or tgt_energy == 0:
        return 1.0 if ref_energy == tgt_energy else 0.0
    return dot / math.sqrt(ref_energy * tgt_energy)


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = _as_float(a), _as_float(b)
    both = torch.isfinite(a) & torch.isfinite(b)
    return float((a[both] - b[both]).square().mean().sqrt()) if bool(both.any()) else 0.0


def _special(t: torch.Tensor) -> torch.Tensor:
    """Each element's kind: 0 a number, 1 NaN, 2 +Inf, 3 -Inf."""
    t = _as_float(t)
    return torch.isnan(t) * 1 + (t == math.inf) * 2 + (t == -math.inf) * 3


def _nonfinite_off(side: torch.Tensor, oracle: torch.Tensor) -> int:
    """Elements where `side` is NaN/Inf and float64 is not, or the other way round (or another kind)."""
    return int((_special(side) != _special(oracle)).sum())


def uncomparable_tensor(t: torch.Tensor) -> str | None:
    """Why a tensor's values cannot be read as one dense array (None when they can): a sparse, nested,
    quantized or meta tensor is a failure with its reason, never a traceback or a silent pass."""
    if t.is_meta:
        return "a meta tensor (it has a shape but no values)"
    if t.is_nested:
        return "a nested tensor (its parts have different shapes)"
    if t.layout != torch.strided:
        return f"a tensor with layout {str(t.layout).removeprefix('torch.')} (sparse; compare its to_dense())"
    if t.is_quantized:
        return f"a quantized tensor ({str(t.dtype).removeprefix('torch.')}; compare its dequantize())"
    return None


NO_TENSOR = "the model returned no tensor to compare"
# Both sides NaN throughout agree, but on no number: a pass would be a verdict on nothing.
ALL_NAN = "NaN in every element of both outputs: no number to compare (the reference itself computes none)"


def _measure(ref: Any, tgt: Any, rtol: float, gate: float) -> tuple[float | None, str | None, str | None, dict[str, Any]]:
    """One leaf's required atol, failure class and detail, and what was measured of it (a value's repr, or a
    tensor's shape, dtype and error statistics), in the order its record has them."""
    if isinstance(ref, Opaque) or isinstance(tgt, Opaque):
        opaque = ref if isinstance(ref, Opaque) else tgt
        return None, tx.UNCOMPARABLE, f"an output of type {opaque.type_name} cannot be compared", {}
    ref_t, tgt_t = isinstance(ref, torch.Tensor), isinstance(tgt, torch.Tensor)
    if ref_t != tgt_t:
        return None, tx.STRUCTURE_MISMATCH, f"reference has {type(ref).__name__}, target has {type(tgt).__name__}", {}
    reasons = [f"{side} output is {why}" for side, t in (("the reference's", ref), ("the target's", tgt))
               if ref_t and (why := uncomparable_tensor(t))]
    if reasons:
        return None, tx.UNCOMPARABLE, "; ".join(reasons), {}
    if not ref_t:
        return _measure_value(ref, tgt)
    shape, dtype = list(tgt.shape), str(tgt.dtype).removeprefix("torch.")
    measured: dict[str, Any] = {"shape": shape, "dtype": dtype}
    if tgt.shape != ref.shape:
        measured["reference_shape"] = list(ref.shape)
        return None, tx.SHAPE_MISMATCH, f"shape {shape} vs reference {list(ref.shape)}", measured
    reference_dtype = str(ref.dtype).removeprefix("torch.")
    if ref.dtype != tgt.dtype:
        measured["reference_dtype"] = reference_dtype
    if ref.is_complex() != tgt.is_complex():
        return None, tx.DTYPE_MISMATCH, f"dtype {dtype} vs reference {reference_dtype}", measured
    stats = error_stats(ref, tgt, rtol, gate)
    required, nonfinite, max_abs = stats.required_atol, stats.nonfinite, stats.max_abs
    measured.update(stats.leaf_fields())
    exact = _kind(ref) != "float" and _kind(ref) == _kind(tgt)
    if exact and not torch.equal(ref, tgt):  # integers and booleans (labels, indices, masks) must be equal
        differ = int((ref != tgt).sum())
        measured["mismatch_fraction"] = differ / max(ref.numel(), 1)
        return None, tx.NUMERIC_DRIFT, f"{differ} of {ref.numel()} {dtype} values differ (compared exactly)", measured
    if exact:
        required = 0.0
    if _kind(ref) != _kind(tgt):
        return required, tx.DTYPE_MISMATCH, f"dtype {dtype} vs reference {reference_dtype}", measured
    if nonfinite:
        return required, tx.NONFINITE, f"{nonfinite} element(s) are NaN/Inf in one output only", measured
    if max_abs == 0.0 and ref.numel() and bool(torch.isnan(ref).all()):  # nothing compared: no verdict
        return None, tx.NONFINITE, ALL_NAN, measured
    if required > gate:
        return required, tx.NUMERIC_DRIFT, (f"max abs {max_abs:.3g}, {stats.mismatch_fraction:.1%} of elements "
                                            f"beyond atol {gate:g} + rtol * |reference|; passes from atol "
                                            f"{required:.3g}"), measured
    return required, None, None, measured


def _measure_value(ref: Any, tgt: Any) -> tuple[float | None, str | None, str | None, dict[str, Any]]:
    """A leaf that is no tensor on either side (a number, a string, None): compared exactly."""
    measured = {"value": repr(tgt)[:200], "reference_value": repr(ref)[:200]}
    equal = type(ref) is type(tgt) and ref == tgt
    if isinstance(ref, float) and isinstance(tgt, float) and math.isnan(ref) and math.isnan(tgt):
        return 0.0 if equal else None, tx.NONFINITE, ALL_NAN, measured
    if equal:
        return 0.0, None, None, measured
    numbers = isinstance(ref, Number) and isinstance(tgt, Number) and not isinstance(ref, bool)
    return None, tx.NUMERIC_DRIFT if numbers else tx.STRUCTURE_MISMATCH, \
        f"non-tensor output differs: reference {ref!r}, target {tgt!r}"[:300], measured


def _compare_leaf(name: str, ref: Any, tgt: Any, rtol: float, gate: float, rule: LeafTolerance | None = None,
                  oracle: Any = None) -> Leaf:
    """One leaf's record, made once from what was measured: at `rule`'s rtol and atol when an output rule judges
    it, and with its distances from float64 when `oracle` (the float64 output's leaf) has its shape."""
    if rule is not None:
        rtol, gate = rule.rtol, gate if rule.atol is None else rule.atol
    required, failure, detail, measured = _measure(ref, tgt, rtol, gate)
    fields: dict[str, Any] = {"name": name, "required_atol": required, "failure_class": failure, **measured}
    said = f"{detail} (judged by the {rule.rule})" if rule is not None and detail else detail
    if detail is not None:
        fields["detail"] = said
    if rule is not None:
        fields["tolerance"] = rule
    judged = failure in (None, tx.NUMERIC_DRIFT, tx.NONFINITE) and "shape" in measured
    if isinstance(oracle, torch.Tensor) and judged and oracle.shape == ref.shape:
        fields.update(oracle_rmse_target=_rmse(tgt, oracle), oracle_rmse_reference=_rmse(ref, oracle))
        # NaN/Inf on one side only, or NaN in every element of both: whose pattern float64 has decides
        one_side = failure == tx.NONFINITE and detail != ALL_NAN  # a judged leaf's other NONFINITE: NaN/Inf counted
        if one_side or said == ALL_NAN:
            fields.update(oracle_nonfinite_target=_nonfinite_off(tgt, oracle),
                          oracle_nonfinite_reference=_nonfinite_off(ref, oracle))
    return Leaf.made(fields)


def _unmatched(name: str, detail: str) -> Leaf:
    return Leaf.made({"name": name, "required_atol": None, "failure_class": tx.STRUCTURE_MISMATCH,
                                "detail": detail})


def compare(reference: Any, target: Any, rtol: float, gate: float, oracle: Any = None,
            leaf_tolerance: Callable[[str], LeafTolerance] | None = None) -> Comparison:
    """Compare two model outputs leaf by leaf. With `oracle` (float64 outputs), each tensor leaf also
    gets rmse(target, oracle) and rmse(reference, oracle). `leaf_tolerance(name)` gives a leaf its own rtol
    and atol (output rules): the leaf is judged at them and records which rule applied."""
    ref_leaves, tgt_leaves = flatten(reference), flatten(target)
    oracle_leaves = flatten(oracle) if oracle is not None else {}
    missing = [n for n in ref_leaves if n not in tgt_leaves]
    extra = [n for n in tgt_leaves if n not in ref_leaves]
    leaves = [_unmatched(name, "missing in the target's outputs") for name in missing]
    leaves += [_unmatched(name, "not in the reference's outputs") for name in extra]
    for name, ref in ref_leaves.items():
        if name not in tgt_leaves:
            continue
        own = leaf_tolerance(name) if leaf_tolerance is not None else None
        leaves.append(_compare_leaf(name, ref, tgt_leaves[name], rtol, gate, own if own is not None and own.rule
                                    is not None else None, oracle_leaves.get(name)))
    failure = tx.most_severe(leaf.failure_class for leaf in leaves)
    no_tensor = not any(isinstance(v, torch.Tensor) for v in ref_leaves.values())  # None, (), {}, constants
    if no_tensor and failure is None:  # otherwise it fails for its own reason
        shown = ", ".join(f"{n} = {v!r}"[:60] for n, v in list(ref_leaves.items())[:3])
        return Comparison(leaves, tx.UNCOMPARABLE,
                          f"{NO_TENSOR} (it returned {shown}): a pass would check nothing it computes")
    if missing or extra:
        return Comparison(leaves, failure, f"{len(missing)} leaf(s) missing in the target, {len(extra)} extra: "
                          + ", ".join((missing + extra)[:5]))
    culprits = [leaf for leaf in leaves if leaf.failure_class == failure and leaf.detail]
    if not culprits:
        return Comparison(leaves, failure)
    worst = max(culprits, key=lambda leaf: math.inf if leaf.required_atol is None else leaf.required_atol)
    more = f" (and {len(culprits) - 1} more leaf(s))" if len(culprits) > 1 else ""
    return Comparison(leaves, failure, f"{worst.name}: {worst.detail}{more}")


# A passing check's target is worth a line when its rmse from float64 is above this share of the output's
# scale (the rms of the reference's values): about ten float32 roundings, so that float32 noise stays quiet.
NOTABLE = 1e-6


def _farther(leaf: Leaf, multiplier: float, floor: float) -> str:
    """Which side of one leaf is farther from float64: target, reference, both (float64 has neither side's
    NaN/Inf pattern) or neither (equally far: each within `multiplier` times the other's rmse plus `floor`)."""
    if leaf.oracle_nonfinite_target is not None:
        t_off, r_off = leaf.oracle_nonfinite_target, leaf.oracle_nonfinite_reference
        return {(True, False): "target", (False, True): "reference", (True, True): "both"}.get((t_off > 0, r_off > 0), "neither")
    t, r = leaf.oracle_rmse_target, leaf.oracle_rmse_reference
    if t > multiplier * r + floor:
        return "target"
    if r > multiplier * t + floor:
        return "reference"
    return "neither"


def oracle_verdict(comparison: Comparison, multiplier: float, floor: float) -> OracleVerdict | None:
    """Which side is farther from the float64 oracle, leaf by leaf. As in PyTorch's own compile accuracy
    checks, a side is farther when its rmse from float64 exceeds `multiplier` times the other side's plus
    `floor`; when neither is, both are equally far. A leaf with NaN/Inf on one side only is judged by its
    non-finite pattern instead: the side whose pattern float64 does not have is the one that is off."""
    leaves = [leaf for leaf in comparison.leaves if leaf.oracle_rmse_target is not None]
    if not leaves:
        return None
    sides = {leaf.name: _farther(leaf, multiplier, floor) for leaf in leaves}
    worse = next((side for side in ("target", "both", "reference") if side in sides.values()), "neither")
    # the numbers said beside the verdict are those of the leaves that decided it, never another leaf's
    deciding = [leaf for leaf in leaves if sides[leaf.name] == worse]
    if worse == "reference":
        worst = max(deciding, key=lambda leaf: leaf.oracle_rmse_reference - multiplier * leaf.oracle_rmse_target)
    else:
        worst = max(deciding, key=lambda leaf: leaf.oracle_rmse_target - multiplier * leaf.oracle_rmse_reference)
    nonfinite = [leaf for leaf in deciding if leaf.oracle_nonfinite_target is not None]
    scale = worst.reference_rms or 0.0
    return OracleVerdict(
        multiplier=multiplier,
        floor=floor,
        target_rmse=worst.oracle_rmse_target,
        reference_rmse=worst.oracle_rmse_reference,
        scale=scale,
        worse=worse,
        target_worse=worse == "target",
        leaves_target_worse=[name for name, side in sides.items() if side == "target"],
        notable=sides[worst.name] == "target" and worst.oracle_rmse_target > NOTABLE * scale,
        target_nonfinite_off=sum(leaf.oracle_nonfinite_target for leaf in nonfinite) if nonfinite else None,
        reference_nonfinite_off=sum(leaf.oracle_nonfinite_reference for leaf in nonfinite) if nonfinite else None,
        # both sides return the same NaN/Inf where float64 has numbers: wrong alike, no drift between them
        nonfinite_alike=worse == "both" and bool(nonfinite) and not any(leaf.nonfinite for leaf in nonfinite),
    )
