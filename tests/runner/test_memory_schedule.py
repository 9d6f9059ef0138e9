"""Memory that scales with the model (issue #26): when the copies of a job's backends would not fit in memory
together, the local executor prepares, runs and frees one backend at a time, each with its own copy made when it
runs; when they fit, their timed runs still take turns."""

from __future__ import annotations

import copy
import gc
import logging

import pytest
import torch
from torch import nn

from parity.api import run_experiment
from parity.config.schema import BackendSpec
from parity.execute.execution import execute_together
from parity.inputs import Inputs
from parity.runner import executors
from parity.runner.executors import SHARE, fits_together
from parity.runner.prepared import ModelCopies, model_bytes
from tests.fixtures import copies, traces
from tests.support import tiny_experiment

COPIES = "tests.fixtures.copies:CopiesEager"


def _run(tmp_path, monkeypatch, available: int | None, entry: str = "tests.fixtures.tiny:tiny_cnn", repeats: int = 2):
    """The model `entry` with a reference and three targets that count the copies alive, with `available` bytes
    of memory as the executor reads it."""
    monkeypatch.setattr(executors, "available_memory", lambda: available)
    copies.EVENTS.clear()
    targets = [{"backend": COPIES, "name": f"t{i}"} for i in (1, 2, 3)]
    exp = tiny_experiment(targets, repeats=repeats, warmup=1, reference={"backend": COPIES, "name": "ref"},
                          models=[{"name": "tiny", "source": "python", "entry": entry}])
    records = run_experiment(exp, out=tmp_path / "out")
    return records, [r for r in records if r["kind"] == "execution"]


def test_without_room_for_every_copy_one_backend_at_a_time_holds_its_copy(tmp_path, monkeypatch, caplog):
    """Each backend is prepared, run and closed before the next makes its copy: one copy alive at a time (the
    old schedule held the reference's and all three targets'), every check still judged, each timed alone, and
    the log says why."""
    caplog.set_level(logging.INFO, logger="parity")
    records, runs = _run(tmp_path, monkeypatch, available=1)
    assert "model tiny: its 4 backends run one at a time" in caplog.text
    assert copies.EVENTS == [(step, name, 1) for name in ("ref", "t1", "t2", "t3") for step in ("prepare", "close")]
    assert [c["passed"] for c in records if c["kind"] == "check"] == [True, True, True]
    assert len(runs) == 8 and all(r["latency_interleaved"] is False for r in runs)


def test_one_at_a_time_each_target_is_judged_and_its_outputs_let_go_before_the_next_runs(tmp_path, monkeypatch):
    """One backend at a time, a target's check is written as soon as it ends, before the next target's execution, and
    its outputs are let go: a job never holds every target's outputs (a language model's logits: 0.4 GB each)."""
    held = []
    real = executors.execute_together

    def watching(*args, on_done=None, **kwargs):
        def done(index, ex):
            on_done(index, ex)
            held.append((index, len(ex.outputs)))
        return real(*args, on_done=done, **kwargs)

    monkeypatch.setattr(executors, "execute_together", watching)
    records, _ = _run(tmp_path, monkeypatch, available=1)
    order = [(r["kind"], r.get("backend") or r.get("target")) for r in records if r["kind"] in ("execution", "check")]
    for earlier, later in (("t1", "t2"), ("t2", "t3")):
        assert order.index(("check", earlier)) < order.index(("execution", later))
    assert held == [(0, 2), (1, 0), (2, 0), (3, 0)]  # the reference's kept to judge against, each target's dropped


def test_a_copy_held_only_by_a_reference_cycle_is_freed_before_the_next_is_made(tmp_path, monkeypatch):
    """With Python's automatic collection off, so that only the schedule's own collection can free the cycle."""
    gc.disable()
    try:
        _run(tmp_path, monkeypatch, available=1, entry="tests.fixtures.copies:linked")
    finally:
        gc.enable()
    assert [n for step, _, n in copies.EVENTS if step == "prepare"] == [1, 1, 1, 1]


def test_with_room_for_every_copy_the_timed_runs_take_turns(tmp_path, monkeypatch):
    records, runs = _run(tmp_path, monkeypatch, available=10**12)
    prepared = [n for step, n, _ in copies.EVENTS if step == "prepare"]
    assert prepared == ["ref", "t1", "t2", "t3"] and copies.EVENTS[3] == ("prepare", "t3", 4)
    assert all(r["latency_interleaved"] is True for r in runs)


def test_one_timed_run_a_backend_means_one_at_a_time_whatever_the_room(tmp_path, monkeypatch):
    """With one timed run each there are no turns to take: every backend held at once would only hold every copy
    (and every language model's logits) together."""
    records, runs = _run(tmp_path, monkeypatch, available=10**12, repeats=1)
    assert max(n for _, _, n in copies.EVENTS) == 1 and not any(r["latency_interleaved"] for r in runs)
    assert [c["passed"] for c in records if c["kind"] == "check"] == [True, True, True]


def test_memory_unknown_means_one_at_a_time(tmp_path, monkeypatch):
    _, runs = _run(tmp_path, monkeypatch, available=None)
    assert max(n for _, _, n in copies.EVENTS) == 1 and not any(r["latency_interleaved"] for r in runs)


def test_copies_fit_together_within_their_share_of_the_available_memory():
    model = nn.Linear(8, 4)  # 36 float32 values: 144 bytes
    assert model_bytes(model) == 144
    room = int(4 * 144 / SHARE)
    copies = ModelCopies(model, "linear")
    assert fits_together(copies, 4, room) and not fits_together(copies, 4, room - 1)
    assert not fits_together(copies, 1, None)
    embed, head = nn.Embedding(10, 8), nn.Linear(8, 10, bias=False)
    head.weight = embed.weight  # tied, as a language model's embedding and output head often are: counted once
    assert model_bytes(nn.Sequential(embed, head)) == 320


@pytest.mark.parametrize("interleave", [True, False])
def test_a_reference_that_fails_in_its_timed_runs_stops_the_backends_after_it(interleave):
    """One at a time, the reference fails in its second timed run: no target is prepared after it."""
    traces.RUNS.clear()
    model = traces.dense()
    specs = [(BackendSpec(backend=f"tests.fixtures.traces:{cls}", name=name), lambda: copy.deepcopy(model))
             for name, cls in (("bad", "FailingCounter"), ("c", "CountingEager"))]
    done = execute_together(specs, Inputs((torch.ones(2, 8),), {}), 3, warmup=1, interleave=interleave)
    assert done[0].status == "error"
    assert done[1].prepare_s is None if not interleave else done[1].ok
    assert traces.RUNS == (["bad", "bad", "bad"] if not interleave else ["bad", "c", "bad", "c", "bad", "c"])
