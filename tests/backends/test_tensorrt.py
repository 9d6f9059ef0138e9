"""The TensorRT backends (torch-tensorrt, and ONNX Runtime's TensorRT execution provider) and ONNX Runtime's
provider choice: what can be checked without a GPU (options, availability, ids, providers). The GPU runs
are at the end, marked `gpu` and skipped here."""

from __future__ import annotations

import pytest
import torch

from parity.backends import BACKENDS, backend_class
from parity.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeTensorRTBackend
from parity.backends.tensorrt import TensorRTBackend, compile_settings
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.experiment import experiment_from_dict
from tests.support import tiny_experiment


def _validate(write_yaml, capsys, target: dict) -> tuple[int, str]:
    code = main(["validate", str(write_yaml(tiny_experiment([target])))])
    return code, capsys.readouterr().err


def test_both_are_registered_through_entry_points():
    assert backend_class("tensorrt") is TensorRTBackend
    assert backend_class("onnxruntime-tensorrt") is OnnxRuntimeTensorRTBackend
    assert {"tensorrt", "onnxruntime-tensorrt"} <= set(BACKENDS.names())


@pytest.mark.parametrize("target, says", [
    ({"backend": "tensorrt", "device": "cuda", "options": {"precision": "fp8"}}, "precision"),
    ({"backend": "tensorrt", "device": "cuda", "options": {"workspace_size": -1}}, "workspace_size"),
    ({"backend": "tensorrt", "device": "cuda", "options": {"fp16": True}}, "fp16"),
    ({"backend": "tensorrt"}, "runs on cuda, not 'cpu'"),
    ({"backend": "tensorrt", "device": "cuda", "dtype": "bfloat16"}, "bfloat16"),
    ({"backend": "tensorrt", "device": "cuda", "dtype": "float16", "options": {"precision": "fp16"}},
     "precision: fp16 is for float32 targets"),
    ({"backend": "onnxruntime-tensorrt", "device": "cuda", "options": {"fp16": "sometimes"}}, "fp16"),
    ({"backend": "onnxruntime-tensorrt"}, "runs on cuda, not 'cpu'"),
    ({"backend": "onnxruntime", "options": {"tf32": False}}, "option tf32 applies to CUDA devices only"),
    ({"backend": "onnxruntime", "device": "cuda", "options": {"fp16": True}}, "fp16"),
])
def test_bad_options_are_one_line_and_exit_2(write_yaml, capsys, target, says):
    code, err = _validate(write_yaml, capsys, target)
    assert code == 2 and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_good_options_validate(write_yaml, capsys):
    for target in ({"backend": "tensorrt", "device": "cuda", "options": {"precision": "fp16", "tf32": False,
                                                                          "workspace_size": 1 << 30}},
                   {"backend": "onnxruntime-tensorrt", "device": "cuda", "options": {"fp16": True, "tf32": False}},
                   {"backend": "onnxruntime", "device": "cuda", "options": {"tf32": True}}):
        assert _validate(write_yaml, capsys, target)[0] == 0, target


def test_the_ids_tell_the_providers_apart():
    exp = experiment_from_dict(tiny_experiment([{"backend": "onnxruntime", "device": "cuda"},
                                                {"backend": "onnxruntime-tensorrt", "device": "cuda"},
                                                {"backend": "tensorrt", "device": "cuda"}]))
    assert [t.id for t in exp.targets] == ["onnxruntime-cuda", "onnxruntime-tensorrt-cuda", "tensorrt-cuda"]


def _without_torch_tensorrt(monkeypatch, present: bool = False) -> None:
    import importlib.util

    real = importlib.util.find_spec
    fake = object() if present else None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: fake if name == "torch_tensorrt" else real(name, *a))


def test_tensorrt_says_what_is_missing(monkeypatch):
    spec = BackendSpec(backend="tensorrt", device="cuda")
    _without_torch_tensorrt(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert TensorRTBackend.available(spec) == ("torch-tensorrt is not installed (pip install torch-tensorrt); CUDA is "
                                               "not available on this machine (torch.cuda.is_available() is False)")
    _without_torch_tensorrt(monkeypatch, present=True)
    assert TensorRTBackend.available(spec).startswith("CUDA is not available")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert TensorRTBackend.available(spec) is None
    assert "does not exist" in TensorRTBackend.available(BackendSpec(backend="tensorrt", device="cuda:1"))


def test_onnxruntime_says_which_provider_is_missing(monkeypatch):
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert OnnxRuntimeBackend.available(BackendSpec(backend="onnxruntime", device="cuda")) is None
    assert OnnxRuntimeTensorRTBackend.available(BackendSpec(backend="onnxruntime-tensorrt", device="cuda")) == (
        "onnxruntime has no TensorrtExecutionProvider here (pip install onnxruntime-gpu)")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert "no CUDAExecutionProvider" in OnnxRuntimeBackend.available(BackendSpec(backend="onnxruntime", device="cuda"))


def test_providers_carry_the_options():
    def providers(backend, options, device="cuda:1"):
        cls = backend_class(backend)
        return cls.providers(BackendSpec(backend=backend, device=device), cls.Options.model_validate(options))

    assert providers("onnxruntime", {}, "cpu") == ["CPUExecutionProvider"]
    assert providers("onnxruntime", {}) == [("CUDAExecutionProvider", {"device_id": 1})]
    assert providers("onnxruntime", {"tf32": False}) == [("CUDAExecutionProvider", {"device_id": 1, "use_tf32": "0"})]
    assert providers("onnxruntime-tensorrt", {"fp16": True, "tf32": True}) == [
        ("TensorrtExecutionProvider", {"device_id": 1, "trt_fp16_enable": "1"}),
        ("CUDAExecutionProvider", {"device_id": 1, "use_tf32": "1"})]
    assert providers("onnxruntime-tensorrt", {})[0][1]["trt_fp16_enable"] == "0"


def test_a_session_that_fell_back_to_another_provider_fails(monkeypatch, tmp_path):
    """ONNX Runtime's Python API retries on the next providers when the first fails to start: the target would
    run on the CPU under a CUDA or TensorRT name."""
    import onnxruntime as ort

    class FellBack:
        def __init__(self, *args, providers, **kwargs):
            pass

        def get_providers(self):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

        def get_inputs(self):
            return []

    monkeypatch.setattr(ort, "InferenceSession", FellBack)
    backend = OnnxRuntimeTensorRTBackend(BackendSpec(backend="onnxruntime-tensorrt", device="cuda"))
    with pytest.raises(RuntimeError, match="could not start TensorrtExecutionProvider .*runs on CUDAExecutionProvider"):
        backend._open_session(tmp_path / "model.onnx")
    cuda = OnnxRuntimeBackend(BackendSpec(backend="onnxruntime", device="cuda"))
    cuda._open_session(tmp_path / "model.onnx")  # the CUDA target got the CUDA provider it asked for
    assert cuda.session.get_providers()[0] == "CUDAExecutionProvider"


def test_tensorrt_compile_settings():
    options = TensorRTBackend.Options
    assert compile_settings(options(), torch.float32) == {"enabled_precisions": {torch.float32}, "disable_tf32": False,
                                                          "workspace_size": 0, "require_full_compilation": False}
    fp16 = compile_settings(options(precision="fp16", tf32=False), torch.float32)
    assert fp16["enabled_precisions"] == {torch.float32, torch.float16} and fp16["disable_tf32"] is True
    assert compile_settings(options(), torch.float16)["enabled_precisions"] == {torch.float16}


def test_parity_backends_lists_tensorrt_with_its_reason(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _without_torch_tensorrt(monkeypatch)
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    for backend, reason in (("tensorrt", "no: torch-tensorrt is not installed"),
                            ("onnxruntime-tensorrt", "no: onnxruntime has no")):
        row = _row(out, backend)
        assert "│ cuda " in row[0] and reason in " ".join(_cell(line, 2) for line in row)


def _row(table: str, name: str) -> list[str]:
    """The lines of a table's row whose first cell is `name`: its first line and the ones a wrapped cell adds."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"│ {name} "))
    rest = lines[start + 1:]
    more = next((i for i, line in enumerate(rest) if not (line.startswith("│") and _cell(line, 0) == "")), len(rest))
    return [lines[start], *rest[:more]]


def _cell(line: str, index: int) -> str:
    return line.split("│")[index + 1].strip()


def test_repro_snippet_compiles_as_the_backend_does():
    spec = BackendSpec(backend="tensorrt", device="cuda", options={"precision": "fp16", "tf32": False})
    snippet = TensorRTBackend.repro_snippet(spec)
    assert "torch_tensorrt.dynamo.compile(exported" in snippet
    assert "enabled_precisions={torch.float16, torch.float32}" in snippet and "disable_tf32=True" in snippet
    compile(snippet, "repro", "exec")
    ort_snippet = OnnxRuntimeTensorRTBackend.repro_snippet(
        BackendSpec(backend="onnxruntime-tensorrt", device="cuda", options={"fp16": True}))
    assert "'TensorrtExecutionProvider', {'device_id': 0, 'trt_fp16_enable': '1'}" in ort_snippet


def test_outputs_are_rebuilt_into_the_model_s_structure():
    """A compiled module returns its tensors flat (or structured): each goes back to its own leaf, and the
    constant leaves come from the eager run. Checked on the CPU with a stand-in for the compiled module."""
    from torch.utils._pytree import tree_leaves

    from parity.backends.base import OutputSpec
    from parity.inputs import Inputs
    from tests.fixtures.tiny import Structured

    model, inputs = Structured().eval(), Inputs(args=(torch.randn(2, 4),))
    backend = TensorRTBackend(BackendSpec(backend="tensorrt", device="cpu"))  # cpu: the rebuild alone, no engine
    backend.outputs = OutputSpec(model, inputs)
    flat = lambda x: [t for t in tree_leaves(model(x)) if isinstance(t, torch.Tensor)]  # noqa: E731
    out = backend.call(flat, inputs)
    with torch.no_grad():
        expected = model(*inputs.args)
    assert out["count"] == 2
    torch.testing.assert_close(out["dets"][0]["boxes"], expected["dets"][0]["boxes"])
    torch.testing.assert_close(out["pair"], expected["pair"])
    assert torch.equal(out["dets"][0]["labels"], expected["dets"][0]["labels"])


CUDA_OK = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_OK, reason="needs CUDA")
@pytest.mark.parametrize("target", [
    {"backend": "tensorrt", "device": "cuda", "options": {"tf32": False}},
    {"backend": "onnxruntime-tensorrt", "device": "cuda", "options": {"tf32": False}},
])
def test_tiny_cnn_on_tensorrt_agrees_with_eager_cuda(target):
    """The tiny CNN on each TensorRT path against eager CUDA float32 (TF32 off on both sides)."""
    from parity.execute.execution import execute
    from parity.inputs import build_inputs
    from parity.models import build_model

    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "device": "cuda", "options": {"tf32": False}},
                                                target]))
    reason = backend_class(target["backend"]).available(exp.targets[1])
    if reason:
        pytest.skip(reason)
    model, inputs = build_model(exp.models[0], exp), build_inputs(exp.inputs[0], exp)
    eager, trt = (execute(t, model, inputs, 1) for t in exp.targets)
    assert eager.ok and trt.ok, trt.error
    assert trt.outputs[0].device.type == "cpu"
    torch.testing.assert_close(trt.outputs[0], eager.outputs[0], atol=1e-3, rtol=1e-3)
