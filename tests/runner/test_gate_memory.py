"""`parity localize`'s memory (issue 29): its gate check hands back what each side's run freed (the reference's copy
of the model, the target's closed session) before the next step builds on it, and its front end imports no model or
exporter library. Watched as the order of the calls and the imported modules, never as a memory figure."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import parity.execute.execution as execution
import parity.runner.localization as localization
from parity.config.schema import BackendSpec, Tolerances
from parity.config.tolerances import resolve
from parity.inputs import Inputs
from tests.fixtures.tiny import tiny_cnn

EAGER = BackendSpec(backend="eager")
ORT = BackendSpec(backend="onnxruntime")


def test_the_gate_check_releases_memory_after_each_side(monkeypatch):
    said = []
    ran = execution.execute

    def execute(spec, *args, **kwargs):
        result = ran(spec, *args, **kwargs)
        said.append(f"executed {spec.backend}")
        return result

    monkeypatch.setattr(localization, "execute", execute)
    monkeypatch.setattr(localization, "release_memory", lambda: said.append("released"))
    experiment = SimpleNamespace(tolerance_for=lambda target: resolve(Tolerances(), target, "float32"))
    model = tiny_cnn().eval()
    inputs = Inputs((torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),))
    verdict, _, _ = localization.gate_check(SimpleNamespace(reference=EAGER, model=SimpleNamespace(task=None)), ORT, lambda spec: model, inputs, experiment)
    assert verdict.passed is True
    assert said == ["executed eager", "released", "executed onnxruntime", "released"]


def test_localizes_front_end_imports_no_model_or_exporter_library():
    """What `parity localize` imports before it builds the model (the CLI, the runner, tier 2, the report) pulls in
    none of the libraries a model or a backend brings when it needs them: torchvision alone is 167 MB of resident
    memory (with torch._dynamo, torch._inductor and sympy), onnx, onnxruntime and onnxscript 50 more."""
    import subprocess
    import sys

    code = ("import sys, parity.cli, parity.runner.runner, parity.runner.localization, parity.report.console, "
            "parity.records.io; print(sorted(m for m in ('torchvision', 'onnx', 'onnxruntime', 'onnxscript', "
            "'torch._dynamo', 'torch._inductor', 'sympy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
