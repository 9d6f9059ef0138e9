"""Tier 2's local mode on torch.compile without a compilation per layer: a level's layers are compiled side by side
as one graph, each fed the reference's recorded inputs (`RunsLayersTogether`), so a level costs one compilation;
every local error says so (`measured_by: together`), and layers that cannot be compiled together are compiled alone
and say why. The propagated errors of every level come from one compiled run observing every layer a descent can reach
(`observe_at_once`), unless their outputs would take too much memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parity.backends.compile import CompileBackend
from parity.config.schema import BackendSpec
from parity.inputs import Inputs
from parity.runner import layer_runs
from parity.runner.localization import localize
from tests.fixtures.faults import inject

EAGER = BackendSpec(backend="eager")
COMPILE = BackendSpec(backend="compile")
VECTORS = Inputs((torch.randn(3, 8, generator=torch.Generator().manual_seed(0)),))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act = nn.Linear(8, 8), nn.ReLU()

    def forward(self, x):
        return x + self.act(self.lin(x))


class Repeated(nn.Module):
    """Four identical blocks between a stem and a head; a shared ReLU called twice."""

    def __init__(self):
        super().__init__()
        self.stem, self.act = nn.Linear(8, 8), nn.ReLU()
        self.b0, self.b1, self.b2, self.b3 = Block(), Block(), Block(), Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.act(self.stem(x))
        return self.head(self.act(self.b3(self.b2(self.b1(self.b0(x))))))


def faulted() -> nn.Module:
    torch.manual_seed(0)
    return inject(Repeated().eval(), "b2.lin", 1e-2, "compiling")


@pytest.fixture
def compilations(monkeypatch):
    """How many times a compile target is prepared (each is one torch.compile of a graph)."""
    count = {"n": 0}
    prepare = CompileBackend.prepare

    def counted(self, model, example):
        count["n"] += 1
        return prepare(self, model, example)

    monkeypatch.setattr(CompileBackend, "prepare", counted)
    return count


def test_a_level_is_one_compilation_and_the_compile_only_fault_is_named(compilations):
    loc = localize(EAGER, COMPILE, faulted(), VECTORS, 1e-5, 1e-4)
    assert loc.culprit == "b2.lin", loc.verdict()
    local = [e for _, level in loc.levels for e in level.local.values()]
    assert len(local) == 9  # stem, act, b0-b3, head; then lin, act inside b2
    assert {e.measured_by for e in local} == {"together"}
    # one run with hooks on every layer a descent can reach (propagated), then per level: the layers together and the
    # parent's own code
    assert compilations["n"] == 1 + 2 * len(loc.levels) < len(local)
    top = loc.levels[0][1].local
    assert top["b2"].rel_rmse > 1e-3 and all(top[n].rel_rmse < 1e-6 for n in ("stem", "act", "b0", "b1", "b3", "head"))


def test_layers_that_cannot_be_compiled_together_are_compiled_alone_say_why_and_give_the_same_errors(monkeypatch):
    together = localize(EAGER, COMPILE, faulted(), VECTORS, 1e-5, 1e-4)

    def refuse(self, model, layers):
        raise RuntimeError("no")

    monkeypatch.setattr(CompileBackend, "run_layers_together", refuse)
    alone = localize(EAGER, COMPILE, faulted(), VECTORS, 1e-5, 1e-4)
    assert alone.culprit == "b2.lin", alone.verdict()
    measured = {e.measured_by for _, level in alone.levels for e in level.local.values()}
    assert measured == {"export (the layers could not be prepared together: RuntimeError: no)"}
    for (_, a), (_, t) in zip(alone.levels, together.levels, strict=True):  # each layer computes as it does alone
        assert {n: e.rel_rmse for n, e in t.local.items()} == pytest.approx({n: e.rel_rmse for n, e in a.local.items()},
                                                                             rel=1e-3, abs=1e-7)


def test_every_level_reads_one_observed_run_and_each_level_its_own_run_past_the_budget(monkeypatch, compilations):
    at_once = localize(EAGER, COMPILE, faulted(), VECTORS, 1e-5, 1e-4)
    n_at_once = compilations["n"]
    monkeypatch.setattr(layer_runs, "OBSERVED_AT_ONCE_BYTES", 8 * 3 * 4 - 1)  # less than the head's output alone
    compilations["n"] = 0
    per_level = localize(EAGER, COMPILE, faulted(), VECTORS, 1e-5, 1e-4)
    assert (n_at_once, compilations["n"]) == (1 + 2 * len(at_once.levels), 3 * len(per_level.levels))
    assert per_level.culprit == at_once.culprit == "b2.lin"
    for (pa, a), (pp, p) in zip(at_once.levels, per_level.levels, strict=True):
        assert pa == pp and list(a.propagated) == list(p.propagated) == a.names
        assert {n: e.rel_rmse for n, e in a.propagated.items()} == pytest.approx(
            {n: e.rel_rmse for n, e in p.propagated.items()}, rel=1e-3, abs=1e-7)
    assert at_once.levels[1][1].propagated["b2.lin"].rel_rmse > 1e-3
