"""What an ONNX Runtime target lets go of, so that localization's peak memory is not the sum of its steps (issue 29):
the exporter's graph, which onnxscript's rewrite rules kept alive until the next export; the backend's copy of the
model, freed before its session is opened; the gate check's memory, handed back before the localization's own
sessions. Each test watches the object itself (a weak reference), never a memory figure."""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from parity.backends.onnxruntime import OnnxRuntimeBackend, export_onnx
from parity.config.schema import BackendSpec
from parity.inputs import Inputs

ORT = BackendSpec(backend="onnxruntime")
X = Inputs((torch.randn(2, 4, generator=torch.Generator().manual_seed(0)),))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x)) - 0.0  # a subtraction of 0: a rule the optimizer matches and rewrites


def test_no_graph_outlives_its_export(tmp_path):
    """After an export, nothing still holds the model it was exported from: onnxscript's module-level rewrite rules
    kept the last node they matched, and through it the graph and the weights of the exported model."""
    model = Net().eval()
    export_onnx(model, X, tmp_path / "model.onnx", None)
    gone = weakref.ref(model.fc.weight)
    del model
    gc.collect()
    assert gone() is None


def test_the_backends_copy_is_freed_before_its_session(monkeypatch):
    """`prepare` lets go of its copy of the model (its weights are in the graph now) before the session is made, as
    the execution hands it over (execute/execution.py: made for the backend, held by nothing else); the session
    still computes the model."""
    alive_at_session, weights = [], []
    opened = OnnxRuntimeBackend._open_session

    def open_session(self, graph, weights_folder=None):
        gc.collect()
        alive_at_session.append(weights[0]() is not None)
        return opened(self, graph, weights_folder)

    def own_copy() -> nn.Module:
        made = Net().eval()
        made.load_state_dict(model.state_dict())
        weights.append(weakref.ref(made.fc.weight))
        return made

    monkeypatch.setattr(OnnxRuntimeBackend, "_open_session", open_session)
    model = Net().eval()
    backend = OnnxRuntimeBackend(ORT)
    backend.prepare(own_copy(), X)
    assert alive_at_session == [False]
    with torch.no_grad():
        torch.testing.assert_close(backend.run(X), model(*X.args))
