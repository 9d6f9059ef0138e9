"""`parity check`: an experiment from the command line, run as `parity run` runs a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from parity.check_command import PREPROCESS, check_experiment
from parity.cli import PREPROCESS_CHOICES, main
from tests.support import ROOT

TINY = "tests.fixtures.tiny:tiny_cnn"


def checks(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("model", "inputs", "target", "status", "passed", "failure_class", "max_abs", "required_atol",
                               "tolerance_source", "gate")}
            for r in lines if r["kind"] == "check"]


def test_check_prints_the_table_and_exits_as_run_does(tmp_path, capsys):
    code = main(["check", TINY, "--target", "torchscript", "--target", "eager-cpu-bfloat16", "--target", "eager-cuda",
                 "--input", "2x3x16x16", "--out", str(tmp_path), "--quiet", "--gate", "1e-4", "--rtol", "1e-5"])
    out = capsys.readouterr().out
    assert code == 1  # the bfloat16 target drifts beyond float32's gate, which --gate and --rtol set for every target
    assert "tiny_cnn: tier 1 at atol=0.0001" in out and "tiny_cnn / 2x3x16x16" in out
    assert "torchscript-cpu" in out and "eager-cpu-bfloat16" in out and "FAIL" in out
    found = {c["target"]: c for c in checks(tmp_path)}
    assert found["torchscript-cpu"]["passed"] and found["eager-cpu-bfloat16"]["failure_class"] == "numeric_drift"
    if not torch.cuda.is_available():
        assert found["eager-cuda"]["status"] == "skipped" and "not run here eager-cuda: CUDA is not available" in out
    assert {p.name for p in tmp_path.iterdir()} >= {"records.jsonl", "summary.json", "report.md", "report.html", "junit.xml"}


def test_the_gate_decides_the_exit_code(tmp_path, capsys):
    args = ["check", TINY, "--target", "eager:bf16", "--input", "2x3x16x16", "--quiet", "--no-report", "--rtol", "1e-5"]
    assert main([*args, "--out", str(tmp_path / "a"), "--gate", "0.1"]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--gate", "1e-6"]) == 1


def test_the_saved_experiment_runs_the_same_checks(tmp_path, monkeypatch, capsys):
    from PIL import Image

    (tmp_path / "pics").mkdir()
    for i, size in enumerate([(20, 24), (30, 18)]):
        Image.new("RGB", size, (40 * i, 90, 200)).save(tmp_path / "pics" / f"{i}.png")
    (tmp_path / "exps").mkdir()
    monkeypatch.chdir(tmp_path)
    code = main(["check", TINY, "--target", "torchscript", "--target", "eager:float64", "--images", "pics/*.png",
                 "--resize", "16", "--crop", "16", "--out", "a", "--quiet", "--no-report",
                 "--save-experiment", "exps/grown.yaml"])
    assert code == 0
    saved = yaml.safe_load((tmp_path / "exps" / "grown.yaml").read_text())
    assert saved["inputs"][0]["images"] == ["../pics/*.png"]  # relative to the file: the folder can move
    assert saved["inputs"][0]["preprocess"] == {"resize": [16], "center_crop": [16]}
    monkeypatch.chdir(tmp_path / "exps")  # run from elsewhere: the file's paths start at the file
    assert main(["run", "grown.yaml", "--out", str(tmp_path / "b"), "--quiet", "--no-report"]) == 0
    assert checks(tmp_path / "a") == checks(tmp_path / "b") and len(checks(tmp_path / "a")) == 2


def test_saving_never_overwrites_a_file(tmp_path, capsys):
    grown = tmp_path / "grown.yaml"
    grown.write_text("mine")
    code = main(["check", TINY, "--target", "torchscript", "--input", "1x3x8x8", "--out", str(tmp_path / "o"),
                 "--save-experiment", str(grown)])
    assert code == 2 and "the file exists" in capsys.readouterr().err
    assert grown.read_text() == "mine" and not (tmp_path / "o").exists()


def test_a_repository_folder_with_an_entry(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "their-repo"
    repo.mkdir()
    (repo / "net.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    monkeypatch.chdir(tmp_path)
    code = main(["check", "their-repo", "--entry", "net:build", "--target", "torchscript", "--input", "3x4",
                 "--out", "o", "--quiet", "--no-report", "--save-experiment", "e.yaml"])
    assert code == 0 and "their-repo / 3x4" in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "e.yaml").read_text())["models"][0] == {
        "name": "their-repo", "source": "repo", "path": "their-repo", "entry": "net:build"}


def test_a_torchvision_classifier_defaults_to_a_bundled_photo_with_imagenet_preprocessing():
    data = check_experiment("torchvision:resnet18", ["compile", "onnxruntime"])
    assert data["models"] == [{"name": "resnet18", "source": "torchvision", "builder": "resnet18", "task": "classification"}]
    assert data["inputs"] == [{"name": "images", "images": ["sample:chelsea"], "preprocess": PREPROCESS["imagenet"]}]
    assert data["targets"] == [{"backend": "compile"}, {"backend": "onnxruntime"}] and "reference" not in data
    assert PREPROCESS["imagenet"]["center_crop"] == [224]
    detector = check_experiment("torchvision:fasterrcnn_resnet50_fpn", ["compile"])
    assert detector["models"][0]["task"] == "detection" and detector["inputs"][0]["preprocess"] == {}
    assert set(PREPROCESS) == set(PREPROCESS_CHOICES)


@pytest.mark.parametrize("argv, message", [
    (["timm:resnt50", "--target", "compile"], "MODEL 'timm:resnt50': unknown timm architecture 'resnt50'; did you mean 'resnet50'?"),
    (["timm:resnet50.a1_in1k", "--target", "compile"], "names pretrained weights ('.a1_in1k'); give the architecture 'resnet50'"),
    (["hf:bert-base-uncased", "--target", "compile"], "MODEL 'hf:bert-base-uncased': transformers model folder not found"),
    (["model.onnx", "--target", "onnxruntime"], "MODEL 'model.onnx': no such file here"),
    (["torchvision:resnt18", "--target", "compile"], "unknown torchvision builder 'resnt18'; did you mean 'resnet18'?"),
    (["resnet18", "--target", "compile"], "did you mean 'torchvision:resnet18'?"),
    (["tests.fixtures.tiny:tiny_cn", "--target", "compile"], "has no attribute 'tiny_cn'; did you mean 'tiny_cnn'?"),
    ([TINY, "--target", "compile"], "model 'tiny_cnn' has no default input: give --input SHAPE"),
    ([TINY, "--target", "compile", "--input", "1x3xfoo"], "--input '1x3xfoo': expected a shape like 1x3x224x224"),
    ([TINY, "--target", "compile", "--input", "a=1x4", "--input", "1x4"], "every input as SHAPE (positional) or"),
    ([TINY, "--target", "compile", "--input", "1x4", "--images", "sample:chelsea"], "give one kind of input"),
    ([TINY, "--target", "compile", "--input", "1x4", "--crop", "8"], "apply to images, not to --input tensors"),
    ([TINY, "--target", "onnxruntme", "--input", "1x4"], "--target onnxruntme: unknown target 'onnxruntme': no backend 'onnxruntme'; did you mean 'onnxruntime'?"),
    ([TINY, "--target", "onnxruntime:bf16", "--input", "1x4"], "--target onnxruntime:bf16: backend 'onnxruntime' supports dtypes float32, float16, not 'bfloat16'"),
    ([TINY, "--target", "eager-cpu", "--input", "1x4"], "--target eager-cpu: its id eager-cpu is the reference"),
    ([TINY, "--target", "compile", "--target", "compile-cpu", "--input", "1x4"], "its id compile-cpu is given twice (compile and compile-cpu)"),
    ([".", "--target", "compile"], "MODEL '.' is a folder: say what builds the model in it with --entry"),
    (["torchvision:resnet18", "--entry", "a:b", "--target", "compile"], "--entry/--hubconf go with a repository folder"),
    ([TINY, "--target", "compile", "--input", "1x4:int64:\u00b2"], "an int64 input needs its bound"),
    ([TINY, "--target", "compile", "--input", "1x4:int64:" + "9" * 5000], "an int64 input needs its bound"),
])
def test_command_line_mistakes_are_one_message_and_exit_2(argv, message, capsys):
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_python_dash_m_parity_is_the_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "parity", "check", "hf:bert-base-uncased", "--target", "compile"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": f"{ROOT / 'src'}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: MODEL 'hf:bert-base-uncased': transformers model folder not found"), done.stderr


def test_gate_and_rtol_on_the_command_line_apply_to_every_target(tmp_path):
    """In a file the experiment's gate is float32's and a bfloat16 target keeps its dtype's default; on the
    command line `--gate` is said for every target, so each target records it as its own."""
    base = ["check", TINY, "--target", "torchscript", "--target", "eager:bf16", "--input", "2x3x16x16", "--quiet",
            "--no-report"]
    main([*base, "--out", str(tmp_path / "default")])
    sources = {c["target"]: (c["tolerance_source"], c["gate"]) for c in checks(tmp_path / "default")}
    assert sources == {"torchscript-cpu": ("experiment", 1e-4), "eager-cpu-bfloat16": ("default-for-bfloat16", 1e-5)}
    main([*base, "--out", str(tmp_path / "given"), "--gate", "0.5"])
    sources = {c["target"]: (c["tolerance_source"], c["gate"]) for c in checks(tmp_path / "given")}
    assert sources == {"torchscript-cpu": ("target", 0.5), "eager-cpu-bfloat16": ("target", 0.5)}


def test_a_model_file_is_a_model_and_runs_as_its_source_does(tmp_path, capsys):
    onnx = ROOT / "examples" / "models" / "tiny_cnn.onnx"
    data = check_experiment(str(onnx), ["onnxruntime"], shapes=["2x3x16x16"])
    assert data["models"] == [{"name": "tiny_cnn", "source": "onnx", "path": str(onnx)}]
    assert check_experiment(str(ROOT / "examples" / "models" / "tiny_cnn.pt2"), ["compile"],
                            shapes=["2x3x16x16"])["models"][0]["source"] == "exported"
    assert main(["check", str(onnx), "--input", "2x3x16x16", "--target", "onnxruntime", "--out", str(tmp_path / "o"),
                 "--quiet", "--no-report"]) == 0
    assert checks(tmp_path / "o")[0]["passed"]
    assert main(["check", str(tmp_path / "nowhere.onnx"), "--input", "2x3x16x16", "--target", "onnxruntime"]) == 2
    assert "nowhere.onnx': no such file here" in capsys.readouterr().err


def test_the_experiment_keeps_the_key_order_its_saved_file_is_written_in():
    """save_experiment dumps the dict as it is (sort_keys=False): each entry's keys in the order the file has
    always had them."""
    data = check_experiment("torchvision:resnet18", ["compile-cpu-int8-pt2e-x86", "eager-cpu-bfloat16"],
                            weights="DEFAULT", name="net")
    assert [list(m) for m in data["models"]] == [["name", "source", "builder", "task", "weights"]]
    assert [list(t) for t in data["targets"]] == [["backend", "quantize", "device"], ["backend", "device", "dtype"]]
    assert list(data["targets"][0]["quantize"]) == ["scheme", "calibration"]


def test_an_int8_column_header_typed_back_is_a_target_calibrated_on_the_checked_inputs():
    from parity.experiment.targets import parse_target

    assert parse_target("compile-cpu-int8-pt2e-x86").entry() == {"backend": "compile", "device": "cpu",
                                                                 "quantize": {"scheme": "pt2e-x86"}}
    assert parse_target("eager-int8-dynamic").entry() == {"backend": "eager",
                                                          "quantize": {"scheme": "torchao-int8-dynamic"}}
    data = check_experiment(TINY, ["compile-cpu-int8-pt2e-x86", "eager-int8-weight"], shapes=["2x3x16x16"])
    assert [t.get("quantize") for t in data["targets"]] == [{"scheme": "pt2e-x86", "calibration": "2x3x16x16"},
                                                             {"scheme": "torchao-int8-weight"}]


@pytest.mark.parametrize("text", ['{"architectures": ["LlamaForCausalLM"],', "[1, 2]"], ids=["torn", "a list"])
def test_an_hf_folder_whose_config_json_is_no_json_object_is_one_line(tmp_path, capsys, text):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    (folder / "model.safetensors").write_bytes(b"")
    assert main(["check", f"hf:{folder}", "--target", "compile"]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'config.json'}" in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_an_onnx_file_is_checked_on_its_graphs_input_shapes_and_says_onnx_runtime_is_the_reference(tmp_path, capsys):
    """No --input: the graph declares float32[2, 3, 16, 16]; the console says so, and that the reference is ONNX
    Runtime; the experiment it ran is in the output folder, as its next: lines would name it."""
    onnx = ROOT / "examples" / "models" / "tiny_cnn.onnx"
    assert check_experiment(str(onnx), ["onnxruntime"])["inputs"] == [
        {"name": "graph_shapes", "synthetic": {"x": {"shape": [2, 3, 16, 16], "dtype": "float32"}}}]
    assert main(["check", str(onnx), "--target", "onnxruntime", "--out", str(tmp_path / "o"), "--quiet",
                 "--no-report"]) == 0
    err = capsys.readouterr().err
    assert "reference: ONNX Runtime (CPU, float32)" in err
    assert "inputs: seeded random tensors of the graph's declared shapes (x float32[2x3x16x16]" in err
    saved = yaml.safe_load((tmp_path / "o" / "experiment.yaml").read_text())
    assert saved["models"][0]["source"] == "onnx" and saved["inputs"][0]["name"] == "graph_shapes"


def test_a_check_writes_the_experiment_it_ran_into_its_folder_each_time(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["check", TINY, "--target", "torchscript", "--input", "1x3x8x8", "--out", "o", "--quiet", "--no-report"]
    assert main(args) == 0 and main(args) == 0  # again into the same folder: its own file is replaced
    assert "experiment: o/experiment.yaml (parity run o/experiment.yaml runs it again)" in capsys.readouterr().err
    assert main(["run", "o/experiment.yaml", "--out", "again", "--quiet", "--no-report"]) == 0
    assert checks(tmp_path / "o") == checks(tmp_path / "again")
