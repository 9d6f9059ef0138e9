"""`parity reduce`: a failing check cut down to its culprit module, as a folder whose standalone script
reproduces the divergence (exit 1) and agrees once the fault is gone (exit 0)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from parity.cli import main
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from parity.repro import snippet
from parity.runner.prepared import prepared_model
from tests.support import tiny_experiment
from tests.support.cli import run_experiment

# The Offset of tests/fixtures/culprit.py adds its `fault` only while traced: compile (aot_eager, no C++
# compiler: fast) sees it, eager does not. The gate 1e-2 lies between the fault below it and the one above.
CHAIN = {
    "name": "chain", "seed": 0,
    "models": [{"name": "chain", "source": "python", "entry": "tests.fixtures.culprit:chain"}],
    "inputs": [{"name": "noise", "synthetic": {"shape": [2, 8]}}],
    "targets": [{"backend": "compile", "options": {"backend": "aot_eager"}}],
    "tolerances": {"atol": [1e-2], "gate": 1e-2},
    "tiers": {"activations": {"granularity": ["first", "odd"], "mode": "local"}},  # two layers compiled alone
}
CHECK = "chain/noise/compile-cpu"
PERTURBED = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}


def _run(write_yaml, tmp_path, capsys, exp, name="exp.yaml"):
    ran = run_experiment(exp, tmp_path, "--no-report", capsys=capsys, name=f"out-{name}", file_name=name)
    return ran.code, ran.out, ran.printed


def _set_fault(folder, value: float) -> None:
    weights = load_file(folder / "weights.safetensors")
    weights["fault"] = torch.tensor(value)
    save_file(weights, folder / "weights.safetensors")


def _repro(folder, tmp_path) -> subprocess.CompletedProcess:
    """repro.py as a user runs it: its own interpreter, no PYTHONPATH; -X importtime lists every module
    it imports (on stderr), so that a script that needs parity shows."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    return subprocess.run([sys.executable, "-X", "importtime", str(folder / "repro.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_script_reproduces_a_fault_only_the_target_sees_and_agrees_without_it(write_yaml, tmp_path, capsys):
    code, run_dir, printed = _run(write_yaml, tmp_path, capsys, CHAIN)
    experiment = tmp_path / "exp.yaml"
    assert code == 1 and (f"next: parity reduce {run_dir} --check {CHECK} --experiment {experiment}"
                          in printed.replace("\n  ", " "))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["reduce", str(run_dir), "--check", CHECK, "--out", str(tmp_path / "full")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    folder = tmp_path / "repro"
    assert main(["reduce", str(run_dir), "--check", CHECK, "--out", str(folder), "--experiment", str(experiment)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["inputs.safetensors", "weights.safetensors", "module.pt", "module.txt", "repro.py", "README.txt"])
    described = (folder / "module.txt").read_text()
    assert "class: tests.fixtures.culprit.Offset" in described and "name: odd" in described
    assert "culprit.py:15" in described  # `class Offset` is on that line
    assert "required atol" in (folder / "README.txt").read_text() and "python repro.py" in (folder / "README.txt").read_text()
    root = str(Path(__file__).resolve().parents[1])  # what tests.fixtures.culprit imports from
    assert f"it puts {root} first on sys.path" in (folder / "README.txt").read_text()
    assert f"sys.path.insert(0, {root!r})" in (folder / "repro.py").read_text()  # the README says what the script does

    # the hook sat on the culprit: the input saved is what the reference fed odd, relu(first(x))
    exp = experiment_from_dict(CHAIN, "chain", tmp_path)
    model, _ = prepared_model(exp.models[0], exp)
    with torch.no_grad():
        expected = model.act(model.first(build_inputs(exp.inputs[0], exp).args[0]))
    assert list(load_file(folder / "inputs.safetensors")) == ["args.0"]
    assert torch.equal(load_file(folder / "inputs.safetensors")["args.0"], expected)
    script = (folder / "repro.py").read_text()
    assert "{'scale': 2.0}" in script  # the keyword number, written out
    assert "backend='aot_eager'" in script and "GATE, RTOL = 0.01, 1e-05" in script

    diverging = _repro(folder, tmp_path)
    assert diverging.returncode == 1, diverging.stdout + diverging.stderr
    assert "max abs difference 0.494 (beyond the gate)" in diverging.stdout and "DIVERGES" in diverging.stdout
    assert "parity" not in {line.split("|")[-1].strip().split(".")[0] for line in diverging.stderr.splitlines()}

    for fault, why in ((0.0, "the fault removed"), (2e-3, "beyond the default atol 1e-4, within the gate 1e-2")):
        _set_fault(folder, fault)  # the same script in this process (torch is imported already): exit 0
        with pytest.raises(SystemExit) as ended:
            runpy.run_path(str(folder / "repro.py"), run_name="__main__")
        assert ended.value.code == 0, why
    assert "agrees at the check's gate" in capsys.readouterr().out
    save_file({"args.0": torch.ones(2, 5)}, folder / "inputs.safetensors")  # a side that raises: no verdict
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(folder / "repro.py"), run_name="__main__")
    assert ended.value.code == 2 and "RuntimeError" in capsys.readouterr().err


def test_what_reduce_refuses(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([{"backend": "eager", "name": "same"}, PERTURBED, {"backend": "tests.fixtures.tiny:NeverAvailable",
                                                                            "name": "never"}], tiers={"activations": True})
    code, run_dir, _ = _run(write_yaml, tmp_path, capsys, exp)
    assert code == 1

    def refused(*argv) -> str:
        assert main(["reduce", str(run_dir), *argv]) == 2
        return capsys.readouterr().err

    assert "no check tiny/noise/nope" in refused("--check", "tiny/noise/nope")
    assert "expected MODEL/INPUTS/TARGET" in refused("--check", "tiny/noise")
    assert "check tiny/noise/same passed" in refused("--check", "tiny/noise/same")
    assert "check tiny/noise/never has no verdict (skipped" in refused("--check", "tiny/noise/never")
    # PerturbedEager nudges the first weight of whatever it runs, so every layer alone drifts alike: localize names
    # no single culprit, and a repro of one module would show only its share (the refusal of a plugin backend's
    # eager-vs-eager script is test_only_a_backend_that_runs_as_its_snippet_says_has_one's)
    assert "found no single culprit" in refused("--check", "tiny/noise/perturbed")
    assert not (run_dir / "reduce-tiny-noise-perturbed").exists()


def test_a_check_never_localized_names_the_command_that_localizes_it(write_yaml, tmp_path, capsys):
    code, run_dir, _ = _run(write_yaml, tmp_path, capsys, tiny_experiment([PERTURBED]))
    assert code == 1
    assert main(["reduce", str(run_dir), "--check", "tiny/noise/perturbed"]) == 2
    error = capsys.readouterr().err
    command = (f"parity localize {tmp_path / 'exp.yaml'} --model tiny --target perturbed --inputs noise "
               f"--out DIR")
    assert f"run `{command}` first" in error
    localized = tmp_path / "localized"
    assert main([*command.replace("DIR", str(localized)).split()[1:]]) == 0
    capsys.readouterr()
    # the localize folder is a RUN_DIR too: the check is found (and refused only for its localization's verdict)
    assert main(["reduce", str(localized), "--check", "tiny/noise/perturbed"]) == 2
    assert "found no single culprit" in capsys.readouterr().err


def test_only_a_backend_that_runs_as_its_snippet_says_has_one():
    from parity.backends import backend_class
    from parity.config.schema import BackendSpec
    from tests.fixtures.faults import FaultyEager
    from tests.fixtures.tiny import PerturbedEager

    for name in ("eager", "compile", "onnxruntime", "torchscript", "openvino"):
        spec = BackendSpec(backend=name)
        lines = snippet(backend_class(name), spec)
        compile(lines, name, "exec")  # valid Python
        assert "out = " in lines
    assert snippet(PerturbedEager, BackendSpec(backend="eager")) is None
    assert snippet(FaultyEager, BackendSpec(backend="eager")) is None
    bf16 = snippet(backend_class("eager"), BackendSpec(backend="eager", dtype="bfloat16", options={"autocast": True}))
    assert 'torch.autocast("cpu", dtype=torch.bfloat16)' in bf16 and 'module.to("cpu")' in bf16



def test_arguments_are_written_as_source_and_tensors_stored_by_key():
    from parity.errors import ParityError
    from parity.repro import _expression

    tensors: dict = {}
    value = [torch.ones(2), (3, float("inf")), {"mask": torch.zeros(1), "mode": None}]
    text = _expression(value, "args.0", tensors)
    assert text == "[saved['args.0.0'], (3, float('inf')), {'mask': saved['args.0.2.mask'], 'mode': None}]"
    assert sorted(tensors) == ["args.0.0", "args.0.2.mask"]
    with pytest.raises(ParityError, match="args.1 is a object"):
        _expression(object(), "args.1", tensors)


def test_a_module_called_twice_is_reduced_to_the_call_that_differs_most():
    from parity.config.schema import BackendSpec
    from parity.inputs import Inputs
    from parity.reduce import _worst_call
    from parity.verify.activations import Call

    x = torch.arange(4.0)
    calls = [Call("relu", 0, Inputs((x,)), x), Call("relu", 1, Inputs((x,)), x + 1), Call("relu", 2, Inputs((x,)), x)]
    assert _worst_call(BackendSpec(backend="eager"), torch.nn.ReLU(), calls, 1e-5) == 1


def test_the_script_adds_the_folder_a_class_imports_from():
    from collections import OrderedDict
    from pathlib import Path

    from parity.repro import import_root
    from tests.fixtures.culprit import Offset

    assert Path(import_root(Offset)) / "tests" / "fixtures" / "culprit.py" == Path(sys.modules[Offset.__module__].__file__)
    assert (Path(import_root(OrderedDict)) / "collections" / "__init__.py").is_file()  # a package's own class



def _onnx_snippet(options: dict) -> str:
    from parity.backends import backend_class
    from parity.config.schema import BackendSpec

    return snippet(backend_class("onnxruntime"), BackendSpec(backend="onnxruntime", options=options))


def _onnx_snippet_exports(options: dict, tmp_path, capsys) -> tuple[str, str]:
    """The onnxruntime snippet run as repro.py runs it (with the script's own `cast`, `HERE`, `tree_leaves`), on
    a Linear captured on a batch of 2: (the exported graph's batch dim, what the script said on stderr)."""
    import sys

    import onnx
    from torch.utils._pytree import tree_leaves

    def cast(value, device, dtype):
        return [v.to(device, dtype) for v in value] if isinstance(value, list) else value

    space = {"torch": torch, "sys": sys, "tree_leaves": tree_leaves, "cast": cast, "HERE": tmp_path,
             "module": torch.nn.Linear(8, 4).eval(), "args": [torch.randn(2, 8)], "kwargs": {}}
    exec(compile(_onnx_snippet(options), "repro.py", "exec"), space)
    graph = onnx.load(str(tmp_path / "module.onnx"))
    return graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param, capsys.readouterr().err


def test_the_onnx_repro_exports_with_the_targets_exporter_and_dynamic_dims(tmp_path, capsys):
    """`dynamic: true`, and `dynamic_shapes` that name the module's inputs, give a graph whose batch dim is
    symbolic, as the target's export; `dynamic_shapes` that name the whole model's inputs (a culprit inside it
    takes others) fall back to `dynamic: true`'s dims, and the script says so. Without either, the batch is
    the captured one's; the TorchScript exporter is kept with its opset."""
    assert _onnx_snippet_exports({"dynamic_shapes": {"input": {0: "batch"}}}, tmp_path, capsys) == ("batch", "")
    dim, err = _onnx_snippet_exports({"dynamic_shapes": {"image": {0: "batch"}}}, tmp_path, capsys)
    assert dim and "do not name this module's inputs (input)" in err  # dynamic: true's dims, as below
    assert _onnx_snippet({"dynamic": True}).startswith(_onnx_snippet({"dynamic_shapes": {"image": {}}}).split("given =")[0])
    assert "dynamic_shapes" not in _onnx_snippet({})
    torchscript = _onnx_snippet({"exporter": "torchscript", "opset": 17})
    assert "dynamo=False, opset_version=17" in torchscript and "dynamic_shapes" not in torchscript


def test_reduce_imports_nothing_its_records_name(write_yaml, tmp_path, capsys):
    """A RUN_DIR may be someone else's (a CI artifact): records that name model code are refused before anything
    is imported, unless the user passes the experiment file that holds the same model (its folder's code is
    then the one imported) or says --trust-records; and the default repro folder planted as a link to elsewhere
    is refused, never written through. tests/hostile/test_hostile_reduce.py holds the attacks."""
    code, run_dir, _ = _run(write_yaml, tmp_path, capsys, CHAIN)
    assert code == 1
    experiment = tmp_path / "exp.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = run_dir / "reduce-chain-noise-compile-cpu"
    planted.symlink_to(elsewhere, target_is_directory=True)
    assert main(["reduce", str(run_dir), "--check", CHECK, "--experiment", str(experiment)]) == 2
    assert capsys.readouterr().err == (f"error: {planted}: is a symbolic link; parity writes the repro into a folder of "
                                       "RUN_DIR, never through a link to elsewhere: remove it, or give --out\n")
    assert list(elsewhere.iterdir()) == []
    planted.unlink()

    assert main(["reduce", str(run_dir), "--check", CHECK, "--out", str(tmp_path / "r1")]) == 2
    assert capsys.readouterr().err == (
        f"error: {run_dir / 'records.jsonl'}: names code that rebuilding its model would import (python model 'chain' "
        "(tests.fixtures.culprit:chain)); reduce imports nothing a records file names: pass the experiment file the "
        "run ran (--experiment FILE), or --trust-records if you wrote these records\n")
    assert not (tmp_path / "r1").exists()
    experiment.write_text(experiment.read_text() + "# edited\n")  # comments: the same experiment
    assert main(["reduce", str(run_dir), "--check", CHECK, "--out", str(tmp_path / "r2"), "--experiment", str(experiment)]) == 0
    assert main(["reduce", str(run_dir), "--check", CHECK, "--out", str(tmp_path / "r3"), "--trust-records"]) == 0
    capsys.readouterr()
    edited = yaml.safe_load(experiment.read_text())
    edited["models"][0]["seed"] = 1  # not the run's model
    other = write_yaml(edited, "other.yaml")
    assert main(["reduce", str(run_dir), "--check", CHECK, "--out", str(tmp_path / "r4"), "--experiment", str(other)]) == 2
    assert (f"--experiment {other}: differs from the records' in the model 'chain' the records ran"
            in capsys.readouterr().err)
    assert not (tmp_path / "r4").exists()


def test_records_code_names_every_model_and_backend_that_would_be_imported():
    from parity.records.io import typed
    from parity.reduce import records_code

    def run(models, targets, reference=None):
        return typed({"kind": "run", "experiment": "x", "base_dir": "/", "environment": {},
                      "config": {"tolerances": {"atol": [1e-4], "rtol": 1e-5}, "models": models, "inputs": [], "targets": targets,
                                 "reference": reference or {"backend": "eager"}}})

    named = records_code(run([{"name": "p", "source": "python", "entry": "os:system"},
                              {"name": "r", "source": "repo", "path": "../theirs", "hubconf": "net"},
                              {"name": "t", "source": "torchvision", "builder": "resnet18"},
                              {"name": "h", "source": "transformers", "path": "m"},
                              {"name": "u", "source": "their_source"}],
                             [{"backend": "eager"}, {"backend": "evil:Backend"}], {"backend": "x.y:Ref"}))
    assert named == ["python model 'p' (os:system)", "repo model 'r' (../theirs)", "their_source model 'u'",
                     "backend 'x.y:Ref'", "backend 'evil:Backend'"]
    assert records_code(run([{"name": "t", "source": "torchvision", "builder": "resnet18"}], [{"backend": "onnxruntime"}])) == []


def test_a_torch_class_gets_no_sys_path_line_and_the_readme_says_so():
    from parity.repro import CodeReference, _path_root

    assert _path_root(CodeReference("torch.nn.modules.conv.Conv2d", "conv.py:1", "conv", "/venv/lib/site-packages")) == ""
    assert _path_root(CodeReference("mymodels.Block", "block.py:1", "block", "/home/me/code")) == "/home/me/code"
