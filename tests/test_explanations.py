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


def test_a_fallback_whose_tier3_aim_already_agrees_says_tier1_fails_and_how_to_gate_on_tier3(write_yaml, tmp_path, capsys):
    """bfloat16 at a gate of 1e-6, rtol 0: tier 1 fails, the top-1 decisions agree. It once printed "the check already
    passes: no fallback is needed" for a check the table calls FAIL."""
    from parity.cli import main
    from tests.conftest import tiny_experiment

    exp = tiny_experiment([{"backend": "eager", "dtype": "bfloat16", "tolerances": {"gate": 1e-6, "rtol": 0.0}}])
    exp["models"][0]["task"] = "classification"  # bfloat16's rounding alone exceeds atol 1e-6 at rtol 0, on any CPU
    file = write_yaml(exp)
    assert main(["fallback", str(file), "--target", "eager-cpu-bfloat16", "--tier", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "already passes" not in out
    assert "tier 1 fails (required atol" in out and "> gate 1e-06), but the classification decisions agree" in out
    assert "tolerances: {gate: tier3}" in out and "top1_agreement 1" in out


def test_fallback_names_its_modules():
    from parity.adapters.fallback import FallbackResult
    from parity.report.console import fallback_lines

    failed = FallbackResult("t", "float32", modules=["a.conv", "b", "c.0"], required_atol_before=1e-2,
                            required_atol_after=1e-3, tried=6)
    lines = [text for _, text in fallback_lines(failed, failed.record(), 1e-4, False, "m", None)]
    assert "with 3 module(s) in float32 (a.conv, b, c.0)" in lines[0]
    aimed = FallbackResult("t", "float32", aim="tier 3", modules=["head"], passed=True, required_atol_before=1e-2,
                           required_atol_after=1e-3, latency_before_s=1.0, latency_after_s=1.0)
    lines = [text for _, text in fallback_lines(aimed, aimed.record(), 1e-4, False, "m", "classification")]
    assert "apply it: in the target's entry, fallback: [m:head]" in lines
    assert any("tier 1 still fails with it" in line and "gate: tier3" in line for line in lines)
    gated = [text for _, text in fallback_lines(aimed, aimed.record(), 1e-4, True, "m", "classification")]
    assert not any("gate: tier3" in line for line in gated)  # the target gates on tier 3 already
