"""The Python API for users' own tests."""

from __future__ import annotations

import copy

import pytest
import torch

from parity import ParityError, assert_backends_agree, run_experiment
from tests.conftest import tiny_experiment
from tests.fixtures.tiny import Structured, TinyCNN


def model_and_input():
    torch.manual_seed(0)
    return TinyCNN().eval(), torch.randn(2, 3, 12, 12)


@pytest.mark.numerics
def test_agreeing_backends_pass_and_the_model_is_untouched():
    model, x = model_and_input()
    before = copy.deepcopy(model.state_dict())
    assert_backends_agree(model, x, targets=["torchscript", "onnxruntime", {"backend": "eager", "dtype": "float64"}],
                          atol=1e-5, rtol=1e-5)
    assert all(torch.equal(v, before[k]) and v.dtype == before[k].dtype for k, v in model.state_dict().items())
    assert model.conv.weight.dtype == torch.float32


def test_disagreement_reads_like_assert_close():
    model, x = model_and_input()
    with pytest.raises(AssertionError) as info:
        assert_backends_agree(model, x, targets=[{"backend": "eager", "dtype": "bfloat16"}], atol=1e-6, rtol=1e-6)
    message = str(info.value)
    assert "Target eager-cpu-bfloat16 does not match reference eager-cpu (numeric_drift)" in message
    assert "out: Mismatched elements:" in message and "/ 10 (" in message
    assert "Greatest absolute difference:" in message and "Greatest relative difference:" in message


def test_structure_problems_are_reported_by_leaf():
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="did not run|unsupported_op"):
        assert_backends_agree(Structured(True).eval(), torch.randn(3, 4), targets=["onnxruntime"])


def test_bad_targets_are_user_errors_before_anything_runs():
    model, x = model_and_input()
    with pytest.raises(ParityError) as info:
        assert_backends_agree(model, x, targets=["onnxruntim", {"backend": "compile", "options": {"mod": "default"}}])
    assert "targets[0].backend: unknown backend 'onnxruntim'; did you mean 'onnxruntime'?" in info.value.problems[0]
    assert "targets[1].options.mod: unknown option for backend 'compile'; did you mean 'mode'?" in info.value.problems[1]


def test_run_experiment_from_a_dict(tmp_path):
    records = run_experiment(tiny_experiment([{"backend": "torchscript"}]), out=tmp_path)
    assert [r["kind"] for r in records].count("check") == 1
    assert (tmp_path / "report.md").exists() and (tmp_path / "summary.json").exists()
