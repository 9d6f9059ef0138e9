"""What many test files share: the repository's paths, the tiny experiment, one target for each outcome."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


# One target for each way a check can end: identical, drifting (bfloat16, a perturbed weight), a backend
# that raises, and one that cannot run here. Reports and the study's tables are tested on runs with these.
# A bfloat16 target judged at float32's tolerance (its own default, rtol 1.6e-2, would pass a tiny CNN):
# a drift every CPU shows.
BF16_AT_FLOAT32 = {"backend": "eager", "dtype": "bfloat16", "tolerances": {"rtol": 1e-5, "gate": 1e-4}}
EVERY_OUTCOME = [
    {"backend": "eager", "name": "same"},
    BF16_AT_FLOAT32,
    {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"},
    {"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"},
    {"backend": "tests.fixtures.tiny:NeverAvailable", "name": "never"},
]


def tiny_experiment(targets: list[dict], **overrides) -> dict:
    """A small experiment: the tiny CNN on one synthetic batch."""
    exp = {
        "name": "tiny",
        "seed": 0,
        "models": [{"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}],
        "inputs": [{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}],
        "targets": targets,
    }
    exp.update(overrides)
    return exp


def fallback_found(target: str = "t", runs_in: str = "eager", **fields):
    """A `fallback` record as a search makes one (runner/search.py `fallback_record`): nothing found, nothing tried,
    unless `fields` say otherwise."""
    from parity.runner.search import fallback_record

    return fallback_record(model="m", inputs="x", reference="eager", target=target, runs_in=runs_in,
                           **{"aim": "tier 1", "modules": [], "passed": False, "tried": 0, "whole_model": False, **fields})


CHECK = ("m", "x")  # the (model, input set) a search's record names, where a test searches outside a run


def localized(loc):
    """A Localization (verify/localize.py) as the `layers` record a run writes of it, for one check."""
    return loc.record(*CHECK)
