"""Tier 2: a fault injected into one named layer on the target only must be named first by
localization, in a CNN, a transformer block and a model with branches."""

from __future__ import annotations

import pytest
import torch

from parity.api import run_experiment
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.inputs import Inputs
from parity.records import read_records
from parity.runner.layer_runs import capture
from parity.runner.localization import localize
from parity.verify.activations import layer_error
from parity.verify.localize import introduction_rates, layer_names
from tests.fixtures.faults import inject
from tests.fixtures.tiny import Branchy, DeepCNN, TinyCNN, TransformerBlock
from tests.support import tiny_experiment

EAGER = BackendSpec(backend="eager")
FAULTY = BackendSpec(backend="tests.fixtures.faults:FaultyEager", name="faulty")
GRAPH_QUANT = BackendSpec(backend="tests.fixtures.whole_graph:GraphQuantEager", name="graph-quant")
IMAGE = Inputs((torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(0)),))
TOKENS = Inputs((torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0)),))


def build(cls, fault: str, magnitude: float, condition: str = "flag"):
    torch.manual_seed(0)
    return inject(cls().eval(), fault, magnitude, condition)


@pytest.mark.parametrize("fault", ["stem", "block1.0.0", "block1.1.1", "block2.0.0", "block2.1.0", "head"])
def test_hierarchical_descent_names_the_faulty_layer_in_a_cnn(fault):
    loc = localize(EAGER, FAULTY, build(DeepCNN, fault, 1e-3), IMAGE, 0.0, 1e-6)
    assert loc.culprit == fault and loc.suspects[0].name == fault
    assert loc.first_divergent == fault
    assert [parent for parent, _ in loc.levels][0] == ""  # top-level blocks first
    assert not loc.evenly_spread()
    assert not loc.whole_graph and not loc.as_a_whole and loc.first_divergent_by == "own"
    assert loc.verdict().startswith(f"{fault} introduces the largest relative error of its own")


@pytest.mark.numerics
@pytest.mark.parametrize("fault", ["attn.v", "attn.out", "ln2", "mlp.2"])
def test_bfloat16_only_fault_in_a_transformer_block(fault):
    """Every layer drifts a little in bfloat16; the faulty one drifts far more and is named first."""
    target = BackendSpec(backend="eager", dtype="bfloat16")
    loc = localize(EAGER, target, build(TransformerBlock, fault, 0.2, "bfloat16"), TOKENS, 1e-5, 1e-4)
    assert loc.culprit == fault, loc.verdict()


@pytest.mark.parametrize("fault", ["left.0", "right.0", "right.2"])
def test_fault_in_a_branch(fault):
    loc = localize(EAGER, FAULTY, build(Branchy, fault, 1e-2), IMAGE, 1e-5, 1e-4)
    assert loc.culprit == fault


def test_compile_only_fault_is_found_through_compiled_layers():
    compile_target = BackendSpec(backend="compile")
    loc = localize(EAGER, compile_target, build(Branchy, "right.2", 1e-2, "compiling"), IMAGE, 1e-5, 1e-4)
    assert loc.culprit == "right.2"
    top = loc.levels[0][1]
    assert top.propagated["right"].rel_rmse > 1e-3 and top.propagated["left"].rel_rmse < 1e-5


@pytest.mark.parametrize("fault", ["block2.0.1"])  # one depth: each costs a whole layerwise ONNX localization
def test_export_only_fault_is_found_in_the_onnx_graph(fault):
    target = BackendSpec(backend="onnxruntime")
    loc = localize(EAGER, target, build(DeepCNN, fault, 1e-2, "exporting"), IMAGE, 1e-5, 1e-4)
    assert loc.culprit == fault
    top = loc.levels[0][1]  # propagated: the ONNX graph's own intermediate values
    assert top.propagated["block2"].rel_rmse > 1e-4 and top.propagated["stem"].rel_rmse < 1e-5


@pytest.mark.numerics
def test_onnx_layers_are_observed_at_their_own_boundaries():
    """The observed graph is exported without the exporter's optimizer, so a convolution keeps its own
    output (the optimizer would fold it into the batch norm after it), and a layer with no computation
    of its own (an Identity) is reported, not matched to a neighbour's value."""
    from parity.runner.layer_runs import propagated_errors

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Identity(),
                                torch.nn.ReLU()).eval()
    calls = capture(EAGER, model, IMAGE, ["0", "1", "2", "3"])
    errors = propagated_errors(BackendSpec(backend="onnxruntime"), model, IMAGE, calls, 1e-5)
    assert errors["0"].error is None and errors["0"].rel_rmse < 1e-5
    assert errors["1"].error is None and errors["3"].error is None
    assert "not in the exported graph" in errors["2"].error


def test_without_a_fault_nothing_stands_out_against_the_threshold():
    loc = localize(EAGER, FAULTY, build(DeepCNN, "stem", 0.0), IMAGE, 1e-5, 1e-4)
    assert loc.first_divergent is None
    assert all(e.max_abs == 0.0 for _, level in loc.levels for e in level.local.values())


def test_flat_granularities():
    model = build(DeepCNN, "block2.1.0", 1e-3)
    assert layer_names(model, "depth:1") == ["stem", "block1", "block2", "head"]
    assert "block1.0.0" in layer_names(model, "leaf") and "block1" not in layer_names(model, "leaf")
    for granularity in ("leaf", "depth:3", ["stem", "block2.1.0", "head"]):  # the fault's own error: 7.4e-5
        loc = localize(EAGER, FAULTY, model, IMAGE, 1e-5, 1e-6, granularity=granularity)
        assert loc.mode == "flat" and loc.culprit == "block2.1.0", granularity


def test_local_mode_separates_own_error_from_carried_error():
    """Downstream of the fault, layers carry its error (propagated) but make none of their own (local)."""
    loc = localize(EAGER, FAULTY, build(DeepCNN, "block1.0.0", 1e-3), IMAGE, 1e-5, 1e-4, granularity="depth:1")
    level = loc.levels[0][1]
    assert level.local["block2"].max_abs == 0.0 and level.propagated["block2"].max_abs > 0.0
    assert level.local["block1"].max_abs > 0.0
    rates = dict(zip(level.names, introduction_rates([level.propagated[n] for n in level.names]), strict=True))
    assert rates["block1"] > 1e3  # the error appears here...
    assert abs(rates["block2"]) < 10  # ...and is only carried on here


def test_in_place_ops_do_not_rewrite_captured_values():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True)).eval()
    calls = capture(EAGER, model, Inputs((torch.randn(3, 4),)), ["0", "1"])
    assert (calls["0"][0].output < 0).any()  # the Linear's output, before the in-place ReLU
    assert torch.equal(calls["1"][0].inputs.args[0], calls["0"][0].output)


def test_layer_statistics():
    e = layer_error("x", torch.ones(100), torch.ones(100) * 1.01, 0.0)
    assert e.max_abs == pytest.approx(0.01) and e.rel_rmse == pytest.approx(0.01)
    assert e.sqnr_db == pytest.approx(40.0, abs=0.01)
    assert layer_error("x", torch.ones(2), torch.ones(3), 0.0).error


def test_run_localizes_failing_checks_and_records_layers(tmp_path, write_yaml, capsys):
    data = tiny_experiment([{"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"},
                            {"backend": "eager", "name": "same"}],
                           tiers={"activations": {"granularity": "blocks"}})
    records = run_experiment(data, out=tmp_path / "run")
    [layers] = [r for r in records if r["kind"] == "layers"]  # only the failing check is localized
    assert layers["target"] == "perturbed" and layers["tier"] == 2
    assert layers["culprit"] == "conv" and layers["suspects"][0]["name"] == "conv"  # its first weight is nudged
    assert {lay["name"] for lay in layers["levels"][0]["layers"]} == {"conv", "bn", "head"}

    path = write_yaml(data)
    assert main(["localize", str(path), "--target", "perturbed", "--out", str(tmp_path / "loc")]) == 0
    out = capsys.readouterr().out
    # every layer's first weight is nudged: spread, said first, then the largest
    assert "verdict: no single layer: " in out and "the largest: conv introduces the largest relative error" in out
    gate = out.index("the check fails at the gate: required atol ")  # first, before any table
    assert gate < out.index("layers of the model") and "x the gate (numeric_drift: " in out[gate:]
    [record] = [r for r in read_records(tmp_path / "loc") if r["kind"] == "layers"]
    assert record["tier1"]["passed"] is False and record["tier1"]["required_atol"] > record["tier1"]["gate"]
    assert main(["localize", str(path), "--target", "perturbd"]) == 2
    assert "did you mean 'perturbed'" in capsys.readouterr().err


VECTORS = Inputs((torch.randn(3, 4, generator=torch.Generator().manual_seed(1)),))


def test_layers_inside_a_module_list_are_reached():
    from tests.fixtures.tiny import ListModel

    loc = localize(EAGER, FAULTY, build(ListModel, "layers.1.0", 1e-2), VECTORS, 1e-5, 1e-4)
    assert loc.culprit == "layers.1.0"


def test_a_fault_in_the_models_own_code_is_blamed_on_that_code():
    from tests.fixtures.tiny import OwnCode

    torch.manual_seed(0)
    loc = localize(EAGER, FAULTY, OwnCode().eval(), VECTORS, 1e-5, 1e-4)
    assert loc.in_own_code and loc.culprit == "(model)"
    assert "the model (in its own code" in loc.verdict()
    assert loc.levels[0][1].local["a"].max_abs == 0.0 and loc.levels[0][1].local["b"].max_abs == 0.0


def test_an_amplified_error_is_not_mistaken_for_the_parents_own_code():
    from tests.fixtures.tiny import Amplifier

    loc = localize(EAGER, FAULTY, build(Amplifier, "blk.0", 1e-4), VECTORS, 0.0, 1e-9)
    assert loc.culprit == "blk.0" and not loc.in_own_code


def test_propagated_mode_alone_blames_where_the_error_grows_not_where_it_is_carried():
    loc = localize(EAGER, FAULTY, build(DeepCNN, "block1.0.0", 1e-3), IMAGE, 1e-5, 1e-4, mode="propagated")
    assert loc.culprit == "block1.0.0"
    assert "is where the error grows most (propagated mode)" in loc.verdict()


def test_a_module_under_two_names():
    from tests.fixtures.tiny import SharedNames

    loc = localize(EAGER, FAULTY, build(SharedNames, "proj", 1e-2), VECTORS, 1e-5, 1e-4)
    assert loc.culprit in ("seq.0", "proj")


def test_granularity_names_are_checked():
    from parity.errors import ParityError

    model = build(DeepCNN, "stem", 0.0)
    with pytest.raises(ParityError, match="did you mean 'block1.0.0'"):
        layer_names(model, ["block1.0.00"])
    with pytest.raises(ParityError, match="go 3 level"):
        layer_names(model, "depth:9")


def test_layers_the_target_cannot_run_alone_make_the_verdict_inconclusive():
    from tests.fixtures.tiny import WithAttention

    torch.manual_seed(0)
    model = WithAttention().eval()
    tokens = Inputs((torch.randn(2, 3, 8),))
    loc = localize(EAGER, BackendSpec(backend="tests.fixtures.tiny:FailingEager", name="failing"), model, tokens,
                   1e-5, 1e-4, mode="local")
    assert set(loc.skipped) == {"ln", "attn"} and "inconclusive" in loc.verdict()


def test_torchscript_traces_a_layer_called_with_keywords():
    """MultiheadAttention is called with need_weights=False: the tracer gets that keyword (it used to be
    dropped: 'expected at most 4 arguments'). Its (output, None) result is then beyond TorchScript, which
    is reported as the reason the layer cannot run alone."""
    from tests.fixtures.tiny import WithAttention

    torch.manual_seed(0)
    loc = localize(EAGER, BackendSpec(backend="torchscript"), WithAttention().eval(), Inputs((torch.randn(2, 3, 8),)),
                   1e-5, 1e-4, mode="local")
    error = loc.levels[0][1].local["attn"].error
    assert "argument" not in error and "output from traced functions" in error
    assert loc.skipped == ["attn"] and "inconclusive for attn" in loc.verdict()


def test_a_shared_module_called_after_the_fault_is_not_named_first_in_propagated_mode():
    """torchvision's BasicBlock calls one ReLU before conv2 and again after the residual add: its worst
    call carries conv2's fault, but it is not where the error starts."""
    import torchvision

    torch.manual_seed(0)
    model = inject(torchvision.models.resnet18(num_classes=10).eval(), "layer3.0.conv2", 1e-3)
    x = Inputs((torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)),))
    loc = localize(EAGER, FAULTY, model, x, 1e-5, 1e-4, granularity="leaf", mode="propagated")
    assert loc.culprit == "layer3.0.conv2" and loc.first_divergent in ("layer3.0.conv2", "layer3.0.bn2")


@pytest.mark.parametrize("granularity", ["blocks", "leaf"])
def test_a_whole_graph_drift_is_not_blamed_on_one_layer(granularity):
    """Every layer alone is exact on the target; inside the whole model each computes a little otherwise (a
    whole-graph pass): no layer is a culprit, the verdict says so, and it names the first layer whose
    propagated error exceeds the threshold, saying that this is what it names."""
    torch.manual_seed(0)
    loc = localize(EAGER, GRAPH_QUANT, TinyCNN().eval(), IMAGE, 1e-5, 1e-5, granularity=granularity)
    assert all(e.max_abs == 0.0 for e in loc.levels[0][1].local.values())
    assert loc.whole_graph and loc.culprit is None and loc.suspects == []
    assert loc.first_divergent == "conv" and loc.first_divergent_by == "propagated"
    verdict = loc.verdict()
    assert "introduces" not in verdict and "gives exactly the reference's output" in verdict
    assert "the drift comes from how the target transforms the whole graph (fusion, layout, quantization)" in verdict
    assert "named instead: conv, the first layer whose output inside the target's end-to-end run" in verdict
    record = loc.record("m", "x")
    assert record.whole_graph and record.first_divergent == "conv" and record.first_divergent_by == "propagated"


def test_the_whole_graph_verdict_follows_the_propagated_error_down_to_a_leaf():
    """Both top-level blocks are exact alone (the target quantizes only the whole model): the layer named
    is the first leaf, inside the first block, whose propagated error exceeds the threshold."""
    from tests.fixtures.whole_graph import nested_cnn

    torch.manual_seed(0)
    target = BackendSpec(backend="tests.fixtures.whole_graph:WholeModelQuantEager", name="whole-model-quant")
    loc = localize(EAGER, target, nested_cnn().eval(), IMAGE, 1e-5, 1e-5)
    assert loc.whole_graph and loc.culprit is None
    assert [parent for parent, _ in loc.levels] == ["", "0"]  # the descent follows the propagated error
    assert loc.first_divergent == "0.0" and loc.first_divergent_by == "propagated"
    assert "named instead: 0.0," in loc.verdict()


def test_a_whole_graph_verdict_without_propagated_errors_names_no_layer():
    torch.manual_seed(0)
    loc = localize(EAGER, GRAPH_QUANT, TinyCNN().eval(), IMAGE, 1e-5, 1e-5, mode="local")
    assert loc.whole_graph and loc.first_divergent is None and loc.culprit is None
    assert "any drift comes from how the target transforms the whole graph" in loc.verdict()
    assert "propagated errors were not measured" in loc.verdict() and "introduces" not in loc.verdict()


def test_an_own_error_below_the_threshold_makes_no_culprit():
    """The same small fault is named at a threshold below it and not at one above it."""
    model = build(DeepCNN, "block1.0.0", 1e-6)
    assert localize(EAGER, FAULTY, model, IMAGE, 0.0, 1e-9).culprit == "block1.0.0"
    loc = localize(EAGER, FAULTY, model, IMAGE, 0.0, 1e-3)
    assert loc.culprit is None and loc.whole_graph and loc.suspects == []
    verdict = loc.verdict()
    assert "introduces" not in verdict and "the largest relative RMSE is block1's" in verdict
    assert "no layer's output inside the target's end-to-end run exceeds the threshold either" in verdict


def test_a_block_whose_parts_are_exact_alone_is_the_culprit_as_a_whole():
    """Inside DeepCNN's conv-bn-relu pairs every layer is exact alone, the pair is not: the descent stops at
    the pair, never at a part whose own error is zero."""
    torch.manual_seed(0)
    loc = localize(EAGER, GRAPH_QUANT, DeepCNN().eval(), IMAGE, 1e-5, 1e-5)
    assert loc.as_a_whole and not loc.whole_graph
    assert loc.culprit in {"block1.0", "block1.1", "block2.0", "block2.1"}
    inside = loc.levels[-1][1]
    assert loc.levels[-1][0] == loc.culprit and all(e.max_abs == 0.0 for e in inside.local.values())
    assert loc.verdict().startswith(f"{loc.culprit} introduces the largest relative error of its own")
    assert f"the error comes from {loc.culprit} as a whole" in loc.verdict()


def test_localize_says_first_that_a_passing_check_passes(tmp_path, write_yaml, capsys):
    """The target drifts within the gate (0.1) but above the tier-2 threshold (1e-5): localize says the
    check passes before its tables, and the whole-graph verdict names the first propagated divergence."""
    data = tiny_experiment([{"backend": "tests.fixtures.whole_graph:GraphQuantEager", "name": "graph-quant"}],
                           tolerances={"atol": [1e-1], "gate": 1e-1}, tiers={"activations": {"threshold": 1e-5}})
    assert main(["localize", str(write_yaml(data)), "--out", str(tmp_path / "loc")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.index("the check passes at the gate (required atol ") < out.index("layers of the model")
    assert "<= gate 0.1); the tables below show where the small differences are" in out
    assert "verdict: no layer makes an error of its own above the threshold 1e-05" in out
    assert "first layer whose propagated error exceeds 1e-05: conv" in out and "suspects:" not in out
    [record] = [r for r in read_records(tmp_path / "loc") if r["kind"] == "layers"]
    assert record["tier1"]["passed"] and record["whole_graph"] and record["culprit"] is None


def test_a_whole_graph_verdict_is_rendered_in_every_report(tmp_path):
    import io

    from rich.console import Console

    from parity.records.summary import summarize
    from parity.report.console import render
    from parity.report.html import render_html

    data = tiny_experiment([{"backend": "tests.fixtures.whole_graph:GraphQuantEager", "name": "graph-quant"}],
                           tiers={"activations": True})
    records = run_experiment(data, out=tmp_path, reports=("report.md",))
    [layers] = [r for r in records if r["kind"] == "layers"]
    assert layers["whole_graph"] and layers["first_divergent"] == "conv"
    markdown = (tmp_path / "report.md").read_text()
    assert "whole graph: no layer's own error exceeds the threshold" in markdown
    assert "first layer whose propagated error exceeds the threshold: `conv`" in markdown
    assert "introduces the largest relative error" not in markdown and "suspects:" not in markdown
    [check] = [r for r in records if r["kind"] == "check"]
    check["required_atol"] = None  # as an integer leaf that differs, which no atol passes, would have it
    html = render_html(records, summarize(records), "run")
    assert "diverges in the whole graph, not one layer" in html and "no atol passes it" in html
    assert "first layer whose propagated error is over it: <code>conv</code>" in html
    console = Console(file=io.StringIO(), width=300)
    render(records, summarize(records), tmp_path, console)
    assert ("diverges at tiny / noise / graph-quant: the whole graph (no layer alone exceeds the threshold); its "
            "propagated error first exceeds it at conv") in console.file.getvalue()


def test_localize_against_a_reference_that_fails_is_a_clear_error(write_yaml, capsys):
    data = tiny_experiment([{"backend": "eager", "name": "same"}],
                           reference={"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"})
    assert main(["localize", str(write_yaml(data))]) == 2
    assert "the reference failing failed: RuntimeError: boom" in capsys.readouterr().err


def test_a_replay_hands_back_the_recorded_output_however_the_parent_adds_into_it():
    """torchvision's InvertedResidual adds its input into its body's output in place; a replay that handed out
    its recorded tensor itself was rewritten by every run (torch.compile's warm-up and run), and the parent's
    own code was blamed for the sum (MobileNetV3 on compile: relative RMSE 0.78 in its own code, where every
    layer's table row was below 1e-6)."""
    from parity.runner.layer_runs import Replay

    replay = Replay([torch.ones(3)])
    for _ in range(3):
        out = replay(torch.zeros(3))
        out += 1
    assert torch.equal(replay(torch.zeros(3)), torch.ones(3))


def test_the_own_code_error_is_named_for_its_parent_with_in_place_residuals():
    from parity.runner.layer_runs import own_code_error
    from tests.fixtures.tiny import InPlaceResidual

    torch.manual_seed(0)
    body = ["blocks.1.body.0", "blocks.1.body.1", "blocks.1.body.2"]
    vectors = Inputs((torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),))
    own = own_code_error(EAGER, FAULTY, InPlaceResidual().eval(), vectors, "blocks.1", body, 1e-5)
    assert own.name == "blocks.1 (own code)" and own.max_abs == 0.0
