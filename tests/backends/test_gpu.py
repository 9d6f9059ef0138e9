"""CUDA targets (run where a GPU exists; skipped cleanly elsewhere). The published tool moved one module
to the GPU in place for reference and target alike; here the CPU reference must stay on the CPU, in
float32, untouched, while CUDA targets run on their own copies."""

from __future__ import annotations

import copy

import pytest
import torch

from parity.api import run_experiment
from parity.execute.execution import execute
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from parity.models import build_model
from tests.support import tiny_experiment

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CUDA_TARGETS = [{"backend": "eager", "device": "cuda"},
                {"backend": "eager", "device": "cuda", "dtype": "bfloat16", "tolerances": {"rtol": 1e-5, "gate": 1e-3}},
                {"backend": "compile", "device": "cuda"}]


def test_cuda_targets_leave_the_cpu_reference_untouched():
    exp = experiment_from_dict(tiny_experiment(CUDA_TARGETS))
    model = build_model(exp.models[0], exp)
    before = copy.deepcopy(model.state_dict())
    inputs = build_inputs(exp.inputs[0], exp)
    for target in exp.targets:
        result = execute(target, model, inputs, 1)
        assert result.ok, result.error
        assert result.outputs[0].device.type == "cpu"  # outputs come back to the CPU
    for name, value in model.state_dict().items():
        assert value.device.type == "cpu" and value.dtype == before[name].dtype and torch.equal(value, before[name]), name
    reference = execute(exp.reference, model, inputs, 1)
    with torch.no_grad():
        assert torch.equal(reference.outputs[0], build_model(exp.models[0], exp)(*inputs.args))


def test_cuda_bfloat16_is_caught_and_float32_targets_run(tmp_path):
    records = run_experiment(tiny_experiment(CUDA_TARGETS, tolerances={"atol": [1e-5, 1e-3], "gate": 1e-3}), out=tmp_path)
    checks = {r["target"]: r for r in records if r["kind"] == "check"}
    assert checks["eager-cuda-bfloat16"]["passed"] is False
    assert checks["eager-cuda-bfloat16"]["failure_class"] == "numeric_drift"
    for target in ("eager-cuda", "compile-cuda"):
        assert checks[target]["status"] == "ok" and checks[target]["required_atol"] < 1e-2, checks[target]


def test_tensorfloat32_is_a_setting_parity_can_pin(tmp_path):
    """`tf32: false` forbids TensorFloat-32 inside the target's forward and `tf32: true` allows it, in
    convolutions and matmuls alike (tests/fixtures/tiny.py's Probe reports both), and PyTorch's settings
    are put back afterwards. Only GPUs from Ampere on (compute capability 8.0) have TF32: there, and only
    there, the drift against the CPU is larger with it than without."""
    from parity.config.schema import BackendSpec
    from parity.inputs import Inputs
    from tests.fixtures.tiny import Probe

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    x = Inputs((torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)),))
    for pinned in (True, False):
        result = execute(BackendSpec(backend="eager", device="cuda", options={"tf32": pinned}), Probe().eval(), x, 1)
        assert result.ok, result.error
        assert result.outputs[0]["tf32"] == [pinned, pinned]
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before

    targets = [{"backend": "eager", "device": "cuda", "name": "tf32", "options": {"tf32": True}},
               {"backend": "eager", "device": "cuda", "name": "no-tf32", "options": {"tf32": False}}]
    records = run_experiment(tiny_experiment(targets), out=tmp_path)
    checks = {r["target"]: r for r in records if r["kind"] == "check"}
    assert checks["no-tf32"]["required_atol"] < 1e-5  # float32 rounding, whatever the GPU
    if torch.cuda.get_device_capability() >= (8, 0):
        assert checks["no-tf32"]["required_atol"] < checks["tf32"]["required_atol"]
