"""Ways a differing target could pass, or a user error could end in a traceback, that must not."""

from __future__ import annotations

import pytest
import torch

from parity import assert_backends_agree
from parity.api import run_experiment
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.errors import ParityError
from parity.execute.execution import execute
from parity.experiment import load_experiment
from parity.inputs import Inputs
from parity.records import tolerance_key
from parity.verify.tensors import compare
from tests.fixtures.tiny import Pair, TwoInputs, WithNone
from tests.support import tiny_experiment

PERTURBED = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}


def one_check(records, target):
    return next(r for r in records if r["kind"] == "check" and r["target"] == target)


def test_a_model_that_returns_its_input_scaled_in_place_cannot_hide_a_perturbed_target(tmp_path):
    data = tiny_experiment([PERTURBED, {"backend": "eager", "name": "same"}], repeats=2)
    data["models"][0]["entry"] = "tests.fixtures.tiny:in_place"
    records = run_experiment(data, out=tmp_path)
    assert one_check(records, "perturbed")["failure_class"] == "numeric_drift"
    same = one_check(records, "same")
    assert same["passed"] and same["max_abs"] == 0.0 and same["nondeterminism"] == {"reference": 0.0, "target": 0.0}


def test_a_model_whose_output_changes_every_run_is_nondeterministic(tmp_path):
    data = tiny_experiment([{"backend": "eager", "name": "same"}], repeats=3)
    data["models"][0]["entry"] = "tests.fixtures.tiny:accumulator"
    data["inputs"] = [{"name": "x", "synthetic": {"shape": [2, 3]}}]
    check = one_check(run_experiment(data, out=tmp_path), "same")
    assert check["failure_class"] == "nondeterministic" and check["nondeterminism"]["reference"] > 0


def test_assert_backends_agree_leaves_the_callers_input_alone():
    torch.manual_seed(0)
    from tests.fixtures.tiny import InPlace

    x = torch.ones(2, 3)
    assert_backends_agree(InPlace(), x, targets=["eager"])
    assert torch.equal(x, torch.ones(2, 3))


def test_integers_are_compared_exactly():
    c = compare(torch.tensor([150000]), torch.tensor([150001]), 1e-5, 1e-4)
    assert c.failure_class == "numeric_drift" and c.required_atol > 1e9 and "compared exactly" in c.detail
    assert compare(torch.tensor([2**53]), torch.tensor([2**53 + 1]), 0.0, 1.0).failure_class == "numeric_drift"
    assert compare(torch.tensor([True, False]), torch.tensor([True, True]), 0.0, 1.0).failure_class == "numeric_drift"


def test_complex_against_real_is_a_dtype_mismatch():
    assert compare(torch.randn(3, dtype=torch.cfloat), torch.randn(3), 0, 1e-4).failure_class == "dtype_mismatch"


def test_tolerance_keys_never_collide():
    atols = [1e-3, 1.5e-3, 2e-3, 2.5e-3, 1e-6]
    keys = [tolerance_key(a) for a in atols]
    assert len(set(keys)) == len(keys) and keys[-1] == "1e-06" and keys[1] == "0.0015"


@pytest.mark.numerics
def test_torchscript_and_onnx_rebuild_the_eager_structure():
    torch.manual_seed(0)

    class Named(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            y = self.lin(x)
            return Pair(y, y * 2)

    x = Inputs((torch.randn(3, 4),))
    for model, backends in ((Named().eval(), ("torchscript", "onnxruntime")), (WithNone().eval(), ("onnxruntime",))):
        reference = execute(BackendSpec(backend="eager"), model, x, 1).outputs[0]
        for backend in backends:
            result = execute(BackendSpec(backend=backend), model, x, 1)
            assert result.ok, result.error
            assert compare(reference, result.outputs[0], 1e-5, 1e-5).failure_class is None, backend


@pytest.mark.numerics
def test_openvino_feeds_keyword_inputs_by_name():
    from parity.backends import backend_class

    if backend_class("openvino").available(BackendSpec(backend="openvino")):
        pytest.skip("openvino is not installed")
    torch.manual_seed(0)
    model = TwoInputs().eval()
    x = Inputs((), {"mask": torch.rand(2, 4), "image": torch.randn(2, 4)})  # not the signature's order
    reference = execute(BackendSpec(backend="eager"), model, x, 1).outputs[0]
    result = execute(BackendSpec(backend="openvino"), model, x, 1)
    assert compare(reference, result.outputs[0], 1e-5, 1e-5).failure_class is None


def test_a_plugin_whose_availability_check_raises_fails_only_its_own_check(tmp_path):
    raising = {"backend": "tests.fixtures.tiny:RaisingAvailability", "name": "raising"}
    records = run_experiment(tiny_experiment([raising, {"backend": "torchscript"}]), out=tmp_path)
    assert one_check(records, "raising")["failure_class"] == "backend_error"
    assert one_check(records, "torchscript-cpu")["passed"]


@pytest.mark.parametrize("text, expected", [
    ("from: library\nmodel: resnet18\ninputs: [a.jpg]\nverification: {tol: {atol: abc}}\n", "verification.tol.atol: expected a finite number"),
    ("from: library\nmodel: resnet18\ninputs: [a.jpg]\nverification: 5\n", "verification: expected a mapping"),
    ("from: library\nmodel: resnet18\ninputs: [a.jpg]\noptions: [1]\n", "options: expected a mapping"),
    ("name: a\nname: b\n", "key 'name' appears twice in one mapping (first on line 1)"),
])
def test_bad_files_are_user_errors(write_yaml, capsys, text, expected):
    assert main(["validate", str(write_yaml(text))]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_non_utf8_file(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    assert main(["validate", str(path)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("synthetic, expected", [
    ({"shape": [2], "seed": 10**24}, "seed"),
    ({"shape": [2], "high": 1e30}, "high"),
    ({"shape": [100000, 100000, 100000]}, "more than parity builds"),
    ({"shape": [2], "dtype": "int64"}, "needs distribution randint"),
    ({"shape": [2], "dtype": "int64", "distribution": "randint"}, "needs 'high'"),
])
def test_synthetic_values_torch_cannot_take_are_rejected_up_front(write_yaml, synthetic, expected):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["inputs"] = [{"name": "x", "synthetic": synthetic}]
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(data))
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_boolean_masks_are_random_not_all_false(tmp_path):
    from parity.experiment import experiment_from_dict
    from parity.inputs import build_inputs

    data = tiny_experiment([{"backend": "torchscript"}])
    data["inputs"] = [{"name": "m", "synthetic": {"shape": [64], "dtype": "bool"}}]
    exp = experiment_from_dict(data)
    mask = build_inputs(exp.inputs[0], exp).args[0]
    assert mask.dtype == torch.bool and 0 < int(mask.sum()) < 64


@pytest.mark.parametrize("change, expected", [
    ({"models": [{"name": "m", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnnn"}]}, "models[0].entry"),
    ({"models": [{"name": "m", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "inputs": []}]}, "models[0].inputs"),
    ({"models": [{"name": "m", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "inputs": ["noise", "noise"]}]},
     "names an input set twice"),
    ({"oracle": True, "targets": [{"backend": "eager", "name": "oracle"}]}, "'oracle' is the id of the float64 oracle"),
])
def test_more_config_mistakes_are_named(write_yaml, change, expected):
    data = tiny_experiment([{"backend": "torchscript"}])
    data.update(change)
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(data))
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_the_cli_imports_user_modules_from_the_current_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2))\n")
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"][0]["entry"] = "mymodels:build"
    data["inputs"] = [{"name": "x", "synthetic": {"shape": [2, 3, 2, 2]}}]
    import yaml

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert main(["run", "exp.yaml", "--out", "out", "--quiet"]) == 0, capsys.readouterr()


def test_two_files_with_one_name_cannot_share_an_output_folder(write_yaml, tmp_path, capsys):
    a = write_yaml(tiny_experiment([{"backend": "torchscript"}]), "a.yaml")
    b = write_yaml(tiny_experiment([{"backend": "torchscript"}]), "b.yaml")
    assert main(["run", str(a), str(b), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "distinct names" in capsys.readouterr().err


def test_api_runs_copies_in_eval_mode():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    assert_backends_agree(model, torch.randn(3, 4), targets=["torchscript"])
    assert model.training  # the caller's model keeps its mode
