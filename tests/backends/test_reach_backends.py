"""export, aotinductor and executorch: each runs a tiny CNN through its own artifact, agrees with eager, and
catches a change that only the exported graph carries. One export (or compilation, or lowering) per backend,
shared by the tests through module fixtures."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from parity.backends import backend_class
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.execute.cache import ArtifactCache
from parity.execute.execution import execute
from parity.inputs import Inputs
from parity.verify.tensors import compare
from tests.fixtures.tiny import TinyCNN

IMAGE = Inputs((torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0)),))
OTHER_BATCH = Inputs((torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(1)),))
NUDGE = 1e-3
REACH = ["export", "aotinductor", "executorch"]


class ExportNudged(nn.Module):
    """TinyCNN's logits twice: as they are, and nudged by NUDGE inside an export only
    (`torch.compiler.is_exporting()`), a change that eager never shows and every exported graph carries."""

    def __init__(self):
        super().__init__()
        self.cnn = TinyCNN()

    def forward(self, x):
        logits = self.cnn(x)
        return {"logits": logits, "nudged": logits + NUDGE if torch.compiler.is_exporting() else logits}


def seeded(cls):
    torch.manual_seed(0)
    return cls().eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ArtifactCache(tmp_path_factory.mktemp("cache")).open()


@pytest.fixture(scope="module")
def reference():
    return execute(BackendSpec(backend="eager"), seeded(ExportNudged), IMAGE, 1).outputs[0]


@pytest.fixture(scope="module")
def runs(cache):
    """backend -> its executions of ExportNudged on IMAGE then OTHER_BATCH (prepared from IMAGE), through the
    artifact cache: made when a test first asks, so that `-k executorch` exports nothing for the others."""
    done: dict[str, list] = {}

    def executions(backend: str) -> list:
        if backend not in done:
            with cache.for_model("nudged"):
                done[backend] = [execute(BackendSpec(backend=backend), seeded(ExportNudged), inputs, 1, example=IMAGE)
                                 for inputs in (IMAGE, OTHER_BATCH)]
        return done[backend]

    return executions


@pytest.mark.parametrize("backend", REACH)
def test_matches_eager_and_catches_a_change_only_the_exported_graph_carries(reference, runs, backend):
    result = runs(backend)[0]
    assert result.ok, result.error
    leaves = {leaf.name: leaf for leaf in compare(reference, result.outputs[0], 1e-5, 1e-5).leaves}
    assert leaves["out['logits']"].failure_class is None
    assert leaves["out['nudged']"].failure_class == "numeric_drift"
    assert leaves["out['nudged']"].required_atol == pytest.approx(NUDGE, rel=1e-2)


@pytest.mark.parametrize("backend", REACH)
def test_inputs_of_another_shape_than_the_example_are_shape_specialized(runs, backend):
    """AOTInductor checks the shapes only when told to (AOTI_RUNTIME_CHECK_INPUTS): without it, this batch of 3
    would run as a batch of 2."""
    result = runs(backend)[1]
    assert result.status == "error" and result.failure_class == "shape_specialized", result.error
    assert "prepared from inputs of shape 2x3x12x12, it cannot run inputs of shape 3x3x12x12" in result.error


def test_executorch_says_why_it_refused_an_input_and_keeps_its_log_off_the_console(runs, cache, capfd):
    """The runtime's reason is in its log, not in its exception: the lines are added to the error, and the
    console (Python's stderr and file descriptor 2) gets none of them. The program comes from the cache."""
    runs("executorch")
    capfd.readouterr()
    with cache.for_model("nudged"):
        result = execute(BackendSpec(backend="executorch"), seeded(ExportNudged), OTHER_BATCH, 1, example=IMAGE)
    assert result.cached is True
    assert "Attempted to resize a static tensor. Expected shape (2, 3, 12, 12), but received (3, 3, 12, 12)" \
        in result.error, result.error
    captured = capfd.readouterr()
    assert "cpp:" not in captured.err + captured.out, captured


def test_executorch_reads_its_program_back_from_the_cache_and_its_outputs_outlive_the_next_run(runs, cache):
    """The runtime plans its outputs' memory once per program and writes it again on every run; its Python
    bindings return copies (executorch 1.5), which the backend relies on: a run's outputs must not change when
    the same backend runs other inputs."""
    first = runs("executorch")[0]
    backend = backend_class("executorch")(BackendSpec(backend="executorch"))
    with cache.for_model("nudged") as artifacts:
        backend.artifacts = artifacts
        backend.prepare(seeded(ExportNudged), IMAGE.clone())
    try:
        assert (first.cached, backend.cache_hit) == (False, True)
        out = backend.run(IMAGE)
        assert torch.equal(out["nudged"], first.outputs[0]["nudged"])
        backend.run(Inputs((IMAGE.args[0] + 1,)))
        assert torch.equal(out["nudged"], first.outputs[0]["nudged"])
    finally:
        backend.close()


def test_a_dynamic_export_runs_every_batch_size():
    model = seeded(TinyCNN)
    result = execute(BackendSpec(backend="export", options={"dynamic": True}), model, OTHER_BATCH, 1, example=IMAGE)
    assert result.ok, result.error
    reference = execute(BackendSpec(backend="eager"), model, OTHER_BATCH, 1).outputs[0]
    assert compare(reference, result.outputs[0], 1e-5, 1e-5).failure_class is None


def test_an_export_in_bfloat16_runs_as_eager_bfloat16_does():
    model = seeded(TinyCNN)
    result = execute(BackendSpec(backend="export", dtype="bfloat16"), model, IMAGE, 1)
    assert result.ok, result.error
    assert result.outputs[0].dtype == torch.bfloat16
    reference = execute(BackendSpec(backend="eager", dtype="bfloat16"), model, IMAGE, 1).outputs[0]
    assert compare(reference, result.outputs[0], 1e-2, 1e-2).failure_class is None


def test_portable_kernels_only_are_an_option():
    """`delegate: none` lowers without the XNNPACK partitioner: no delegate in the program, and still eager's
    numbers."""
    from parity.backends.executorch import lower

    exported = torch.export.export(nn.Linear(4, 2), (torch.randn(2, 4),))
    delegates = {d: len(lower(exported, d).executorch_program.execution_plan[0].delegates) for d in ("none", "xnnpack")}
    assert delegates["none"] == 0 and delegates["xnnpack"] > 0, delegates
    model = seeded(TinyCNN)
    result = execute(BackendSpec(backend="executorch", options={"delegate": "none"}), model, IMAGE, 1)
    assert result.ok, result.error
    reference = execute(BackendSpec(backend="eager"), model, IMAGE, 1).outputs[0]
    assert compare(reference, result.outputs[0], 1e-5, 1e-5).failure_class is None


def test_without_executorch_the_target_is_unavailable_with_the_pip_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "executorch", None)
    reason = "executorch is not installed (pip install 'parity[executorch]')"
    assert backend_class("executorch").available(BackendSpec(backend="executorch")) == reason
    result = execute(BackendSpec(backend="executorch"), seeded(TinyCNN), IMAGE, 1)
    assert (result.status, result.error) == ("unavailable", reason)
    assert main(["backends"]) == 0
    rows = [line.split("│") for line in capsys.readouterr().out.splitlines() if line.count("│") > 3]
    assert f"no: {reason}" in " ".join(row[3].strip() for row in rows)  # the 'available' column, cells unwrapped


@pytest.mark.parametrize("backend", REACH)
def test_reduce_gets_a_script_that_uses_only_torch_and_the_backend_s_library(backend):
    snippet = backend_class(backend).repro_snippet(BackendSpec(backend=backend))
    compile(snippet, backend, "exec")  # valid Python
    imported = {line.split()[1].split(".")[0] for line in snippet.splitlines() if line.startswith(("import ", "from "))}
    assert imported <= {"torch", "os", "executorch"}, imported
    assert "torch.export.export(module" in snippet and "out = " in snippet


def test_the_export_script_reproduces_what_the_export_changes():
    """The snippet run as reduce's script runs it: the nudge that only an export makes is in its outputs."""
    from torch.utils._pytree import tree_leaves

    model = seeded(ExportNudged)
    scope = {"torch": torch, "tree_leaves": tree_leaves, "module": model, "args": list(IMAGE.args), "kwargs": {},
             "cast": lambda value, device, dtype: value}  # already where and as the target runs them
    exec(backend_class("export").repro_snippet(BackendSpec(backend="export")), scope)
    with torch.no_grad():
        eager = model(*IMAGE.args)
    assert torch.equal(scope["out"]["logits"], eager["logits"])
    assert (scope["out"]["nudged"] - eager["nudged"]).abs().max().item() == pytest.approx(NUDGE, rel=1e-2)
