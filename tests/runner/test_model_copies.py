"""Every backend's copy of the model comes from one home (runner/prepared.py ModelCopies, principle 2): the first
build is the first copy, every later one is built again from the model's spec and must have the same weights, so
that the runner holds no model while a backend holds its copy (issue #38, memory that scales)."""

from __future__ import annotations

import pytest
import torch

from parity.adapters.fallback import Float32Island
from parity.api import run_experiment
from parity.config.schema import BackendSpec
from parity.errors import NotRebuilt
from parity.experiment import experiment_from_dict
from parity.runner import executors
from parity.runner.prepared import ModelCopies, prepared_model
from tests.fixtures import copies
from tests.support import tiny_experiment

COPIES = "tests.fixtures.copies:CopiesEager"


def _copies(entry: str) -> ModelCopies:
    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "name": "t"}],
                                               models=[{"name": "m", "source": "python", "entry": entry}]))
    spec = exp.models[0]
    return ModelCopies.built(spec, exp, prepared_model(spec, exp)[0])


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return model.state_dict(keep_vars=True)


def test_each_copy_is_its_own_with_the_first_builds_weights_tied_weights_and_buffers():
    home = _copies("tests.fixtures.copies:tied")
    made = [home.model() for _ in range(3)]
    first = _tensors(made[0])
    for model in made:
        assert model.head.weight is model.embed.weight  # tied within each copy, as built
        assert _tensors(model).keys() == first.keys()
        assert all(torch.equal(t, first[name]) for name, t in _tensors(model).items())  # parameters and buffers
    pointers = [{t.data_ptr() for t in _tensors(m).values()} for m in made]
    assert all(not (pointers[i] & pointers[j]) for i in range(3) for j in range(i + 1, 3))  # no storage shared
    with torch.no_grad():
        made[1].embed.weight.add_(1.0)
        made[1].scale.zero_()
    assert torch.equal(made[2].embed.weight, first["embed.weight"]) and torch.equal(made[2].scale, first["scale"])


def test_a_model_that_cannot_be_built_again_is_kept_and_each_copy_deep_copied():
    kept = torch.nn.Linear(4, 2)
    home = ModelCopies(kept, "linear")
    one, two = home.model(), home.model()
    assert one is not kept and two is not kept and one.weight.data_ptr() != two.weight.data_ptr()
    assert torch.equal(one.weight, kept.weight) and torch.equal(two.weight, kept.weight)


def test_kept_after_the_first_copy_went_the_model_is_built_again_once_and_deep_copied_from():
    """Backends prepared together (LocalExecutor): the first build already handed to an earlier job's reference."""
    home = _copies("tests.fixtures.copies:tied")
    first = home.model()
    home.keep()
    one, two = home.model(), home.model()
    for model in (one, two):
        assert model.head.weight is model.embed.weight  # deep copies keep the ties
        assert all(torch.equal(t, first.state_dict()[name]) for name, t in model.state_dict().items())
    assert len({id(first), id(one), id(two)}) == 3 and one.embed.weight.data_ptr() != two.embed.weight.data_ptr()


def test_a_targets_copy_carries_its_fallback_modules_and_the_others_none():
    home = _copies("tests.fixtures.tiny:tiny_cnn")
    plain = home.own(BackendSpec(backend="eager", dtype="bfloat16"))
    islands = home.own(BackendSpec(backend="eager", dtype="bfloat16", fallback=["m:conv", "other:head"]))
    assert isinstance(islands.conv, Float32Island) and not isinstance(islands.head, Float32Island)
    assert not isinstance(plain.conv, Float32Island)
    assert torch.equal(islands.conv.island.weight, plain.conv.weight)


def test_a_builder_that_gives_other_weights_when_built_again_is_the_users_error_not_the_targets(tmp_path):
    home = _copies("tests.fixtures.tiny:unseeded_cnn")
    home.model()  # the first build: no second one yet to differ from it
    with pytest.raises(NotRebuilt, match="model 'm': building it again for a backend's copy gave other weights"):
        home.model()
    exp = tiny_experiment([{"backend": "eager", "name": "t"}],
                          models=[{"name": "m", "source": "python", "entry": "tests.fixtures.tiny:unseeded_cnn"}])
    with pytest.raises(NotRebuilt, match="not deterministic for a seed"):  # exit 2 on the command line
        run_experiment(exp, out=tmp_path / "out")


@pytest.mark.parametrize("available", [1, 10**12], ids=["one at a time", "together"])
def test_the_runner_holds_no_model_while_a_backend_prepares(tmp_path, monkeypatch, available):
    """Every model alive counted, however made: one at a time, the backend's copy is the only one (the old schedule
    held the runner's model beside it); together, every backend's copy and the model they are deep-copied from."""
    monkeypatch.setattr(executors, "available_memory", lambda: available)
    copies.HELD.clear()
    targets = [{"backend": COPIES, "name": f"t{i}"} for i in (1, 2)]
    exp = tiny_experiment(targets, repeats=2, reference={"backend": COPIES, "name": "ref"},
                          models=[{"name": "tiny", "source": "python", "entry": "tests.fixtures.copies:counted"}])
    records = run_experiment(exp, out=tmp_path / "out")
    assert [c["passed"] for c in records if c["kind"] == "check"] == [True, True]
    expected = [1, 1, 1] if available == 1 else [2, 3, 4]
    assert copies.HELD == [(name, n) for name, n in zip(("ref", "t1", "t2"), expected, strict=True)]


def test_tier_2_localizes_on_a_copy_from_the_same_home(tmp_path, monkeypatch):
    """The runner holds no model when a target fails: localization gets its own copy, with the model's weights."""
    monkeypatch.setattr(executors, "available_memory", lambda: 1)
    perturbed = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}
    records = run_experiment(tiny_experiment([perturbed], tiers={"activations": True}), out=tmp_path / "out")
    [layers] = [r for r in records if r["kind"] == "layers"]
    assert not layers.get("error") and layers["culprit"] == "conv"
