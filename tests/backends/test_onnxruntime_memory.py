"""What an ONNX Runtime target lets go of, so that localization's peak memory is not the sum of its steps (issue 29):
the exporter's graph, which onnxscript's rewrite rules kept alive until the next export; the backend's copy of the
model, freed before its session is opened; the gate check's memory, handed back before the localization's own
sessions. Each test watches the object itself (a weak reference), never a memory figure."""

from __future__ import annotations

import copy
import gc
import weakref
from pathlib import Path

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


def test_the_run_graphs_weights_are_in_a_side_file():
    """The run's graph is exported with its weights in model.onnx.data, written one by one (no whole graph in memory
    as a proto and as bytes at once), and computes the model. (The exporter keeps tensors under 1 kB in the graph.)"""
    model = nn.Sequential(nn.Linear(4, 300)).eval()
    backend = OnnxRuntimeBackend(ORT)
    backend.prepare(copy.deepcopy(model), X)
    folder = Path(backend._scratch.name) / "onnx"
    assert (folder / "model.onnx.data").stat().st_size >= model[0].weight.numel() * 4
    with torch.no_grad():
        torch.testing.assert_close(backend.run(X), model(*X.args))


def test_a_looked_inside_graphs_session_keeps_no_arena(monkeypatch):
    """The sessions of tier 2's edited graphs, each run once, keep no memory arena nor a one-block plan; the run's
    session keeps ONNX Runtime's defaults (the artifact is run as the run ran it)."""
    import onnxruntime as ort

    seen = []
    made = ort.InferenceSession

    def session(graph, options, **kwargs):
        seen.append((options.enable_cpu_mem_arena, options.enable_mem_pattern))
        return made(graph, options, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", session)
    model = Net().eval()
    backend = OnnxRuntimeBackend(ORT)
    backend.prepare(copy.deepcopy(model), X)
    backend.capture_layers(model, X, ["fc"])
    assert seen == [(True, True), (False, False)]


def test_the_exporters_table_is_built_once_and_each_export_gets_its_own_copy(monkeypatch):
    """The dynamo exporter's ATen-to-ONNX table is built once per process: a second export builds nothing, and each
    export's table is a copy of its own, so what one export registers never reaches the next."""
    from torch.onnx._internal.exporter import _registration

    from parity.backends.onnxruntime import build_torchlib_registry_once

    build_torchlib_registry_once()
    first = _registration.ONNXRegistry.from_torchlib()
    monkeypatch.setattr(_registration.ONNXRegistry, "_register", lambda *a: (_ for _ in ()).throw(AssertionError("built again")))
    second = _registration.ONNXRegistry.from_torchlib()
    assert second.functions is not first.functions and second.functions == first.functions
    op = next(iter(first.functions))
    first.functions[op].append("registered by one export")
    assert _registration.ONNXRegistry.from_torchlib().functions[op] == second.functions[op]
