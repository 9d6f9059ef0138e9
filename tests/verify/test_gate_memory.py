"""`parity localize`'s gate check hands back what each side's run freed (the reference's copy of the model, the
target's closed session) before the next step builds on it (issue 29): watched as the order of the calls, never as a
memory figure."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import parity.execute.execution as execution
import parity.verify.localize as localize
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

    monkeypatch.setattr(execution, "execute", execute)
    monkeypatch.setattr(localize, "release_memory", lambda: said.append("released"))
    experiment = SimpleNamespace(tolerance_for=lambda target: resolve(Tolerances(), target, "float32"))
    model = tiny_cnn().eval()
    inputs = Inputs((torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),))
    verdict, _ = localize.gate_check(SimpleNamespace(reference=EAGER), ORT, lambda spec: model, inputs, experiment)
    assert verdict["passed"] is True
    assert said == ["executed eager", "released", "executed onnxruntime", "released"]
