"""Tier 2's local mode on ONNX Runtime without an export per layer: each layer (and each parent's own code) is cut
out of the one exported graph of the whole model by the module scopes the dynamo exporter tags its nodes with, fed
the reference's recorded inputs. A layer the slice cannot express is exported alone, and every local error says
which way it was measured (`measured_by`)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn

from parity.backends.onnxruntime import OnnxRuntimeBackend
from parity.config.schema import BackendSpec
from parity.execute.cache import ENTRY_FILE, ArtifactCache, entry_problem
from parity.inputs import Inputs
from parity.runner.localization import localize
from parity.verify.localize import MODEL
from tests.fixtures.faults import inject

EAGER = BackendSpec(backend="eager")
ORT = BackendSpec(backend="onnxruntime")
IMAGE = Inputs((torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)),))
VECTORS = Inputs((torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),))


class Mix(nn.Module):
    """Two inputs of one shape: a slice's inputs cannot be told apart by dtype and shape."""

    def forward(self, a, b):
        return a * 2 + b


class Sliced(nn.Module):
    """Layers a slice expresses (stem, block and its members, `act` called twice, head) beside one it cannot:
    `mix`, whose two inputs have one shape."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.act = nn.ReLU()
        self.mix = Mix()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = self.act(self.stem(x))
        y = self.act(self.block(x))
        return self.head(self.mix(x, y).mean(dim=(2, 3)))


class ExportedOwnCode(nn.Module):
    """The model's own code between two clean layers scales by 1.01 in the exported graph only; a Dropout (in eval
    mode: no node of its own in the graph) stands between them."""

    def __init__(self):
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        return self.b(self.drop(y * 1.01 if torch.compiler.is_exporting() else y))


def faulted(fault: str) -> nn.Module:
    torch.manual_seed(0)
    return inject(Sliced().eval(), fault, 1e-2, "exporting")


@functools.cache
def localized(fault: str):
    """The ONNX Runtime localization of `fault`, and the progress it said: one descent, which the tests here only
    read (each costs exports and a session per layer)."""
    heard: list[str] = []
    return localize(EAGER, ORT, faulted(fault), IMAGE, 1e-5, 1e-4, on_step=heard.append), heard


def local(loc, parent: str = "") -> dict:
    return next(level for p, level in loc.levels if p == parent).local


@pytest.mark.parametrize("fault", ["stem", "block.0", "head"])
def test_a_slice_names_the_faulty_layer_and_says_how_each_layer_was_measured(fault):
    loc, _ = localized(fault)
    assert loc.culprit == fault, loc.verdict()
    top = local(loc)
    assert top[fault.split(".")[0]].measured_by == "slice"
    if "." in fault:
        assert local(loc, "block")[fault].measured_by == "slice"
    assert top["act"].measured_by == "slice"  # called twice, one tensor in and out each: sliced call by call
    # what a slice cannot express is exported alone, and the record says why
    assert top["mix"].measured_by.startswith("export (its slice's inputs cannot be told apart")
    assert loc.levels[0][1].own_code.measured_by.startswith("export (mix: its slice's inputs cannot be told apart")
    record = loc.record("m", "x").levels[0].layers
    assert {layer.name: layer.local.measured_by for layer in record}["stem"] == "slice"
    assert all(layer.propagated.measured_by is None for layer in record)


class Unsliced(OnnxRuntimeBackend):
    """ONNX Runtime without the SlicesLayers capability: a method set to None is one the class does not have."""

    slice_layers = None


def test_exported_alone_the_same_layer_is_named():
    """The per-layer export (what a target without slices, or a layer a slice cannot express, gets) agrees."""
    loc = localize(EAGER, BackendSpec(backend=f"{__name__}:Unsliced"), faulted("block.0"), IMAGE, 1e-5, 1e-4)
    assert loc.culprit == "block.0", loc.verdict()
    measured = [e.measured_by for _, level in loc.levels for e in [*level.local.values(), level.own_code] if e]
    assert measured and set(measured) == {"export"}


def test_a_slice_is_fed_the_reference_input_so_a_carried_error_is_not_its_own():
    """Downstream of the fault, `block` carries its error inside the target's run (propagated) but, fed the
    reference's recorded input, makes none of its own (local)."""
    loc, _ = localized("stem")
    level = loc.levels[0][1]
    assert level.propagated["block"].rel_rmse > 1e-3
    assert level.local["block"].measured_by == "slice" and level.local["block"].rel_rmse < 1e-5
    assert level.local["stem"].rel_rmse > 1e-3


def test_the_own_code_slice_finds_a_fault_between_layers():
    torch.manual_seed(0)
    loc = localize(EAGER, ORT, ExportedOwnCode().eval(), VECTORS, 1e-5, 1e-4)
    assert loc.culprit == MODEL and loc.in_own_code, loc.verdict()
    own = loc.levels[0][1].own_code
    assert own.measured_by == "slice" and own.rel_rmse > 1e-3
    layers = loc.levels[0][1].local
    assert all(layers[n].rel_rmse < 1e-5 and layers[n].measured_by == "slice" for n in ("a", "b"))
    assert layers["drop"].measured_by.startswith("export (not in the exported graph")


def test_the_graph_is_exported_once_its_cache_entry_stays_intact_and_the_observed_graph_is_read_not_edited(
        tmp_path, monkeypatch):
    """Every level is sliced out of one export, which the artifact cache keeps: a second localization exports
    nothing, and the entry it reads is never written to (edited graphs are held in memory). The graph with each
    level's boundary values made outputs is an artifact of its own: the second localization neither parses the
    layers graph nor edits it, and reads the same propagated errors. (One pair of localizations checks both: each
    costs a whole tier-2 descent.)"""
    from parity.backends import onnxruntime

    exports = []
    real = onnxruntime.export_onnx
    monkeypatch.setattr(onnxruntime, "export_onnx", lambda *a, **k: exports.append(k.get("optimize")) or real(*a, **k))
    cache = ArtifactCache(tmp_path).open()
    with cache.for_model("sliced"):
        first = localize(EAGER, ORT, faulted("block.0"), IMAGE, 1e-5, 1e-4)

    def no_edit(*args, **kwargs):
        raise AssertionError("the observed graph was edited again")

    monkeypatch.setattr(onnxruntime, "module_boundaries", no_edit)
    monkeypatch.setattr(onnxruntime, "add_outputs", no_edit)
    with cache.for_model("sliced"):
        again = localize(EAGER, ORT, faulted("block.0"), IMAGE, 1e-5, 1e-4)
    assert again.culprit == first.culprit == "block.0"
    assert exports.count(False) == 1  # the graph tier 2 looks inside, for both localizations and every level
    entries = [p for p in (tmp_path / "artifacts").iterdir() if not p.name.startswith(".")]
    assert entries and all(entry_problem(p, p.name, json.loads((p / ENTRY_FILE).read_text())["parts"]) is None
                           for p in entries)
    for (_, a), (_, f) in zip(again.levels, first.levels, strict=True):
        assert a.propagated and {n: e.rel_rmse for n, e in a.propagated.items()} == {
            n: e.rel_rmse for n, e in f.propagated.items()}


def test_a_localization_says_where_it_is():
    """Progress: each level, each layer k of n, the parent's own code, the target's end-to-end run."""
    from tests.fixtures.tiny import DeepCNN

    torch.manual_seed(0)
    heard: list[str] = []
    loc = localize(EAGER, BackendSpec(backend="tests.fixtures.faults:FaultyEager", name="faulty"),
                   inject(DeepCNN().eval(), "block2.0.0", 1e-2), IMAGE, 1e-5, 1e-4, on_step=heard.append)
    assert loc.culprit == "block2.0.0"
    assert "top level: layer 2 of 4, block1" in heard and "block2.0: layer 1 of 3, block2.0.0" in heard
    assert "top level: its own code" in heard and "block2 (2 layers): inside the target's run" in heard
    _, sliced = localized("head")
    assert "top level: 5 layers as slices of the whole model's artifact" in sliced and "top level: layer 4 of 5, mix (not sliced)" in sliced
