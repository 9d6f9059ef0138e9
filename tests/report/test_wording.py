"""Every message that states a comparison states the one that decided (issue 24, seen-item 5): a layer is a
suspect when its required atol exceeds the threshold (or NaN/Inf leave no atol), so that is the number
said, never a max abs of 0 or a relative RMSE below the threshold "which exceeds" it."""

from __future__ import annotations

import math
import re

from parity.records.models import CacheComparison, LayerError
from parity.report.wording import cache_words, figure, number, scientific, suspect_words
from parity.verify.activations import LevelResult, new_layer_error
from parity.verify.localize import Localization

THRESHOLD = 1e-4


def _culprit(error: LayerError) -> Localization:
    level = LevelResult(names=[error.name, "quiet"], local={error.name: error, "quiet": new_layer_error("quiet")})
    return Localization("t", "flat", THRESHOLD, [("", level)], culprit=error.name, suspects=[error])


def _stated(text: str) -> tuple[float, str, float]:
    """The comparison a message states: (left, operator, right) of 'required atol X > threshold Y'."""
    m = re.search(r"required atol ([0-9.e+-]+) (>|<=) threshold ([0-9.e+-]+)", text)
    assert m, text
    return float(m[1]), m[2], float(m[3])


def test_a_culprit_whose_relative_rmse_is_below_the_threshold_is_said_by_its_required_atol():
    """relative RMSE 8.5e-05 < 1e-4 but required atol 3e-4 > 1e-4: the message says the latter."""
    error = new_layer_error("conv", max_abs=3.2e-4, rel_rmse=8.5e-5, required_atol=3e-4)
    verdict = _culprit(error).verdict()
    left, op, right = _stated(verdict)
    assert (left, op, right) == (3e-4, ">", THRESHOLD) and left > right
    assert "which exceeds" not in verdict
    assert _stated(suspect_words(error, THRESHOLD)) == (left, op, right)


def test_a_culprit_with_nan_says_no_atol_passes_not_a_max_abs_of_zero():
    """NaN where the reference has a number: max abs over the finite rest is 0, and no atol passes."""
    error = new_layer_error("head", max_abs=0.0, rel_rmse=math.inf, required_atol=None)
    for text in (_culprit(error).verdict(), suspect_words(error, THRESHOLD)):
        assert "NaN/Inf where the reference has numbers: no atol passes" in text
        assert "above the threshold 0.0001" in text and "max abs 0" not in text


def test_no_culprit_says_the_largest_error_is_within_the_threshold_by_its_required_atol():
    """max abs 2e-4 is above the threshold, yet with rtol the required atol is 5e-5 <= 1e-4: no culprit, and
    the message says the comparison that made it none."""
    largest = new_layer_error("fc", max_abs=2e-4, rel_rmse=3e-5, required_atol=5e-5)
    level = LevelResult(names=["fc"], local={"fc": largest})
    verdict = Localization("t", "flat", THRESHOLD, [("", level)]).verdict()
    left, op, right = _stated(verdict)
    assert op == "<=" and left <= right


def test_every_report_writes_a_metric_and_a_difference_the_same_way():
    """One home for numbers (report/wording.py), which the console, report.md and report.html all read: a metric to
    4 significant digits, an integer whole, a NaN (null in the records) as nan; a difference in a fixed format,
    `inf` in report.md where no atol reaches it; report.html's to 2 significant digits, 0 as 0."""
    assert [figure(x) for x in (0.123456, 12345, None, True, "n/a")] == ["0.1235", "12345", "nan", "True", "n/a"]
    assert figure(None, none="–") == "–"
    assert [number(x) for x in (3.1e-4, None)] == ["3.10e-04", "-"] and number(None, none="inf") == "inf"
    assert number(-12.345, ".1f") == "-12.3"
    assert [scientific(x) for x in (3.14e-4, 0.0, None)] == ["3.1e-04", "0", "–"]


def test_a_cached_decoding_is_said_from_its_typed_metrics():
    """Each side's metrics are a CachedMetrics: its first flip is said when it has one, a missing KL reads nan."""
    from parity.records.models import CachedDecodingCheck, CachedMetrics, Tier3Check
    from parity.report.wording import cached_line

    cached = CachedDecodingCheck(prompt_tokens=6, steps=4, passed=False, side="target",
                                 target=CachedMetrics(kl_mean=0.125, top1_agreement=0.75, first_flip=2),
                                 reference_self=CachedMetrics(kl_mean=0.0, top1_agreement=1.0), target_self=None)
    check = Tier3Check(kind="check", tier=3, model="m", inputs="x", target="t", task="text-generation", status="ok",
                       passed=False, failure_class="decision_flip", detail="d", metrics={}, cached=cached)
    assert cached_line(check) == ("cached decoding, 4 steps after a 6-token prompt: fails (target); target vs "
                                  "reference: mean KL 0.125, top-1 75%, first flip at step 2; reference cached vs "
                                  "uncached: mean KL 0, top-1 100%; target cached vs uncached: mean KL nan, top-1 -")


def test_the_cache_words_say_the_cause_may_lie_before_the_first_layer_that_differs():
    """A layer's keys and values are made from its input: a wrong attention in layer 0 shows first in layer 1's cache,
    so the words for layer 1 send the reader to it or before it, and layer 0's to its own key/value path or the
    embedding; the part that agrees is named."""
    assert cache_words(CacheComparison(first_layer=0, first_parts=["keys"])) == (
        "its cache first differs at layer 0's keys (values agree): made from that layer's input, so the cause is in "
        "its key/value path or the embedding")
    assert cache_words(CacheComparison(first_layer=1, first_parts=["keys", "values"])) == (
        "its cache first differs at layer 1's keys and values: made from that layer's input, so the cause is in its "
        "key/value path or before it")
    assert cache_words(CacheComparison(layers=[])) == "its cache agrees at every layer (0, keys and values)"
