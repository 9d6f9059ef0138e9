"""Each CPU backend runs the tiny models, keeps the output structure, and agrees with eager."""

from __future__ import annotations

import pytest
import torch

from parity.backends import BACKENDS, backend_class
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.errors import ParityError
from parity.execute.execution import execute
from parity.inputs import Inputs
from parity.verify.tensors import compare
from tests.fixtures.tiny import DataclassOut, Structured, TinyCNN, TwoInputs

IMAGE = Inputs((torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0)),))
VECTOR = Inputs((torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),))
CPU_BACKENDS = ["eager", "compile", "onnxruntime", "torchscript",
                pytest.param("openvino", marks=pytest.mark.skipif(
                    backend_class("openvino").available(BackendSpec(backend="openvino")) is not None,
                    reason="openvino is not installed"))]


def seeded(cls, *args):
    torch.manual_seed(0)
    return cls(*args).eval()


def run(backend: str, model, inputs, **spec):
    result = execute(BackendSpec(backend=backend, **spec), model, inputs, 1)
    assert result.ok, result.error
    return result.outputs[0]


@pytest.mark.numerics
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cpu_backend_matches_eager(backend):
    model = seeded(TinyCNN)
    reference = run("eager", model, IMAGE)
    comparison = compare(reference, run(backend, model, IMAGE), 1.3e-6, 1e-5)
    assert comparison.failure_class is None, comparison.detail


@pytest.mark.numerics
@pytest.mark.parametrize("backend", ["eager", "onnxruntime", "compile"])
def test_nested_outputs_keep_their_structure(backend):
    model = seeded(Structured, backend != "onnxruntime")
    reference, target = run("eager", model, VECTOR), run(backend, model, VECTOR)
    assert isinstance(target, dict) and isinstance(target["dets"][0], dict)
    comparison = compare(reference, target, 1.3e-6, 1e-5)
    names = [leaf.name for leaf in comparison.leaves]
    assert "out['dets'][0]['boxes']" in names and "out['pair'].features" in names
    assert comparison.failure_class is None, comparison.detail


def test_an_output_onnx_cannot_express_is_unsupported_op():
    result = execute(BackendSpec(backend="onnxruntime"), seeded(Structured, True), VECTOR, 1)
    assert result.status == "error" and result.failure_class == "unsupported_op"
    assert "ConversionError" in result.error and "caused by AttributeError" in result.error
    assert "\x1b[" not in result.error


@pytest.mark.numerics
def test_keyword_inputs_reach_every_backend():
    model = seeded(TwoInputs)
    inputs = Inputs((), {"image": torch.randn(2, 4), "mask": torch.ones(2, 4)})
    reference = run("eager", model, inputs)
    for backend in ("onnxruntime", "torchscript"):
        assert compare(reference, run(backend, model, inputs), 1.3e-6, 1e-5).failure_class is None


def test_torchscript_cannot_carry_a_dataclass_output_and_says_so():
    result = execute(BackendSpec(backend="torchscript"), seeded(DataclassOut), VECTOR, 1)
    assert result.status == "error" and result.failure_class == "unsupported_op"
    assert "Tracer cannot infer type of Output" in result.error


def test_eager_variants_change_numbers_not_structure():
    model = seeded(TinyCNN)
    reference = run("eager", model, IMAGE)
    for spec in ({"dtype": "float64"}, {"options": {"channels_last": True}}, {"options": {"threads": 1}},
                 {"dtype": "bfloat16", "options": {"autocast": True}}):
        out = run("eager", model, IMAGE, **spec)
        assert out.shape == reference.shape
    assert run("eager", model, IMAGE, dtype="float64").dtype == torch.float64
    assert run("eager", model, IMAGE, dtype="bfloat16").dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_targets_are_unavailable_with_a_reason():
    for name in ("eager", "compile", "torchscript"):
        assert "CUDA is not available" in backend_class(name).available(BackendSpec(backend=name, device="cuda"))
    result = execute(BackendSpec(backend="eager", device="cuda"), seeded(TinyCNN), IMAGE, 1)
    assert result.status == "unavailable"


def test_registry_lists_builtins_and_rejects_unknown_names():
    assert {"eager", "compile", "onnxruntime", "torchscript", "openvino"} <= set(BACKENDS.names())
    with pytest.raises(ParityError, match="did you mean 'torchscript'"):
        backend_class("torchscrip")
    with pytest.raises(ParityError, match="not a subclass"):
        backend_class("tests.fixtures.tiny:TinyCNN")


def test_backends_command_lists_availability(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime" in out and "torchscript" in out and "yes" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_eager_matches_cpu_within_tolerance():
    """TF32 pinned off: with PyTorch's default, Ampere and later GPUs compute float32 convolutions with 10-bit
    mantissas and older ones do not, so the drift would depend on the GPU's generation."""
    model = seeded(TinyCNN)
    cuda = run("eager", model, IMAGE, device="cuda", options={"tf32": False})
    comparison = compare(run("eager", model, IMAGE), cuda, 1e-5, 1e-4)
    assert comparison.failure_class is None, comparison.detail


THREADS_OF = {"onnxruntime": lambda backend: backend.session.get_session_options().intra_op_num_threads,
              "openvino": lambda backend: backend.compiled.get_property("INFERENCE_NUM_THREADS")}
# (torch's threads, the `threads` option, the runtime's threads). OpenVINO caps a count at the cores it finds
# (which need not be os.cpu_count()), so for it only counts of one mean the same on every machine.
THREAD_CASES = [(1, None, 1), (3, 1, 1), pytest.param(1, 2, 2, id="1-2-2")]


@pytest.mark.parametrize("torch_threads, told, expected", THREAD_CASES)
@pytest.mark.parametrize("backend", ["onnxruntime", CPU_BACKENDS[-1]])
def test_runtimes_run_as_many_threads_as_torch_unless_told(backend, torch_threads, told, expected):
    """A one-CPU Ray task runs torch with one thread; ONNX Runtime's and OpenVINO's own default (every
    core) would not keep to it. The option, when given, wins over torch's setting."""
    from parity.backends import create_backend

    if backend == "openvino" and expected > 1:
        pytest.skip("OpenVINO caps a thread count at the cores it finds")
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    runtime = create_backend(BackendSpec(backend=backend, options={"threads": told} if told else {}))
    try:
        runtime.prepare(seeded(TinyCNN), IMAGE)
        assert THREADS_OF[backend](runtime) == expected
    finally:
        runtime.close()
        torch.set_num_threads(before)


def test_eager_options_reach_the_models_forward():
    """channels_last, threads and autocast each change what the model's forward sees (tests/fixtures/tiny.py's
    Probe returns it): the memory format of its input and weights, torch's thread count, and the dtype
    its weights are in and a matmul computes in."""
    from tests.fixtures.tiny import Probe

    model = seeded(Probe)
    x = Inputs((torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)),))
    plain = run("eager", model, x)
    assert plain["input_channels_last"] is plain["weight_channels_last"] is False
    assert plain["weight_dtype"] == plain["matmul_dtype"] == "torch.float32"
    layout = run("eager", model, x, options={"channels_last": True})
    assert layout["input_channels_last"] is layout["weight_channels_last"] is True
    before = torch.get_num_threads()
    assert [run("eager", model, x, options={"threads": n})["threads"] for n in (1, 3)] == [1, 3]  # one is not the default
    assert torch.get_num_threads() == before  # and the setting is put back
    autocast = run("eager", model, x, dtype="bfloat16", options={"autocast": True})
    assert autocast["weight_dtype"] == "torch.float32" and autocast["matmul_dtype"] == "torch.bfloat16"
    cast = run("eager", model, x, dtype="bfloat16")
    assert cast["weight_dtype"] == cast["matmul_dtype"] == "torch.bfloat16"


def test_a_missing_library_is_said_even_when_named_by_a_submodule_of_a_missing_package():
    """`optimum.intel` where `optimum` itself is not installed: find_spec raises for the parent; the backend is
    unavailable with the install line, never an error at import of a test or at `parity backends`."""
    from parity.backends.base import not_installed

    assert not_installed("no_such_package_here.intel", "'parity[x]'", "x-intel") == (
        "x-intel is not installed (pip install 'parity[x]')")
    assert not_installed("json", "json") is None
