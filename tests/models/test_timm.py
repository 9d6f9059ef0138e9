"""`source: timm`: a timm architecture built with pretrained=False (a seeded init, never a download), as a
file's model and as `parity check timm:NAME`. timm's own tiny `test_*` architectures keep it cheap."""

from __future__ import annotations

import pytest
import torch

from parity.cli import main
from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.models import build_model
from parity.records import RunView
from tests.support import tiny_experiment

pytest.importorskip("timm")


def _experiment(model: dict, seed: int = 0):
    data = tiny_experiment([{"backend": "torchscript"}], seed=seed)
    data["models"] = [{"name": "m", "source": "timm", **model}]
    data["inputs"] = [{"name": "noise", "synthetic": {"shape": [1, 3, 32, 32]}}]
    return experiment_from_dict(data)


def test_a_timm_architecture_is_built_from_the_experiments_seed_without_weights():
    exp = _experiment({"architecture": "test_resnet"})
    a, b = build_model(exp.models[0], exp), build_model(exp.models[0], exp)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    other = _experiment({"architecture": "test_resnet"}, seed=1)
    c = build_model(other.models[0], other)
    assert any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values(), strict=True))


@pytest.mark.parametrize("architecture, message", [
    ("test_resnte", "unknown timm architecture 'test_resnte'; did you mean 'test_resnet'?"),
    ("resnet50.a1_in1k", "names pretrained weights ('.a1_in1k'); give the architecture 'resnet50' and weights: a local file"),
])
def test_a_name_timm_cannot_build_here_is_one_line_at_validation(architecture, message):
    with pytest.raises(ParityError, match="models\\[0\\].architecture") as exc:
        _experiment({"architecture": architecture})
    assert message in str(exc.value)


def test_parity_check_takes_a_timm_model(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["check", "timm:test_resnet", "--input", "1x3x32x32", "--target", "torchscript", "--out", str(out),
                 "--quiet", "--no-report"])
    assert code == 0, capsys.readouterr().err
    [check] = RunView.read(out).checks(1)
    assert check.model == "test_resnet" and check.passed is True
    model = RunView.read(out).run.config.models[0].model_dump()
    assert model == {**model, "source": "timm", "architecture": "test_resnet"}
