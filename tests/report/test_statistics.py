"""report/statistics.py: a text-generation check's KL histogram is drawn from its typed part, and a record whose
lists do not add up (edited by hand) or that has none draws nothing."""

from __future__ import annotations

import pytest

from parity.records.models import Tier3Check
from parity.report.statistics import kld_counts


def _check(histogram):
    return Tier3Check.model_validate({
        "kind": "check", "tier": 3, "model": "m", "inputs": "x", "target": "t", "task": "text-generation",
        "status": "ok", "passed": True, "failure_class": None, "detail": None, "metrics": {},
        **({"kld_histogram": histogram} if histogram is not None else {})})


def test_the_kl_histogram_is_read_as_recorded():
    assert kld_counts(_check({"edges": [1e-3, 1e-2], "counts": [4, 0, 1]})) == ([1e-3, 1e-2], [4, 0, 1])


@pytest.mark.parametrize("histogram", [None, {}, {"edges": [1e-3]}, {"edges": [1e-3], "counts": [1, 2, 3]}],
                         ids=["none", "empty", "no counts", "counts of another length"])
def test_a_histogram_that_does_not_add_up_draws_nothing(histogram):
    assert kld_counts(_check(histogram)) is None
