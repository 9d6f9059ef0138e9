"""Explanations that never contradict the evidence (issue 24): localize's ranking and verdicts, reduce and
fallback agreeing with localize, failure classes by phase."""

from __future__ import annotations

import math

from parity.verify.activations import LayerError, LevelResult
from parity.verify.localize import Localization, _ranked


def _level(errors: dict[str, float]) -> LevelResult:
    level = LevelResult(names=list(errors))
    for name, rel in errors.items():
        finite = math.isfinite(rel)
        level.local[name] = LayerError(name, max_abs=rel if finite else math.inf, rmse=rel, rel_rmse=rel,
                                       required_atol=rel if finite else None)
    return level


def test_infinite_layer_errors_rank_above_every_finite_one_and_are_of_no_finite_order():
    """Layer errors 3e-4, inf, inf, 3e-4: the median is infinite, which once made every layer 'of the same
    order'. The first infinite layer is the culprit; no 'same order' clause beside it."""
    level = _level({"a": 3e-4, "b": math.inf, "c": math.inf, "d": 3e-4})
    ranked = _ranked(level, 1e-5)
    assert [e.name for e in ranked[:2]] == ["b", "c"]
    loc = Localization("t", "hierarchical", 1e-5, levels=[("", level)], culprit="b", suspects=ranked[:3])
    assert not loc.evenly_spread()
    assert "same order" not in loc.verdict() and loc.verdict().startswith("b introduces the largest error")


def test_a_nan_layer_error_ranks_first_and_finite_errors_of_one_order_are_spread():
    level = _level({"a": 2e-3, "b": math.nan, "c": 3e-3})
    assert _ranked(level, 1e-5)[0].name == "b"
    spread = _level({"a": 2e-3, "b": 3e-3, "c": 2.5e-3})
    loc = Localization("t", "hierarchical", 1e-5, levels=[("", spread)], culprit="b", suspects=_ranked(spread, 1e-5))
    assert loc.evenly_spread() and "same order" in loc.verdict()
