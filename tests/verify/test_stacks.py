"""Localization on transformer stacks (issue 37): own code in the target's dtype, a fault repeated in every block,
Hugging Face wrappers, claims no stronger than the record, NaN equal to NaN, one ranking. Each case is constructed
(tests/fixtures/stacks.py): float16 arithmetic that overflows on any CPU, faults injected on the target only."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from parity.config.schema import BackendSpec
from parity.inputs import Inputs
from parity.records.models import Specialized
from parity.runner.localization import localize
from parity.verify.activations import LevelResult, new_layer_error
from parity.verify.localize import Localization
from tests.fixtures import stacks
from tests.fixtures.faults import inject

EAGER = BackendSpec(backend="eager")
FLOAT16 = BackendSpec(backend="eager", dtype="float16")
FAULTY = BackendSpec(backend="tests.fixtures.faults:FaultyEager", name="faulty")
INT8 = BackendSpec(backend="tests.fixtures.stacks:Int8WeightsEager", name="int8-weights")


def test_a_float16_qk_overflow_is_the_attentions_own_code_not_a_projection():
    """Q·K^T overflows float16 in the attention's own code. Replayed on the reference's float32 outputs of q/k/v/o,
    the own code once ran in float32, agreed, and the largest float16 rounding (v) was blamed; replayed in float16,
    its Inf/NaN ranks first."""
    model = stacks.overflowing()
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0))
    loc = localize(EAGER, FLOAT16, model, Inputs((x,)), 1e-3, 1e-2)
    assert loc.culprit == "attn" and loc.in_own_code, loc.verdict()
    assert not math.isfinite(loc.suspects[0].rel_rmse)
    assert loc.verdict().startswith("attn (in its own code, between its submodules) introduces the largest")


def _faulty_blocks() -> torch.nn.Module:
    """The attention of both blocks faulty on the target (0.05 and 0.08 of its output's scale), the head a hair
    (1e-7: a nonzero error far below the threshold, as float32 noise is)."""
    model = stacks.decoder()
    inject(model, "blocks.0.attn", 0.05)
    inject(model, "blocks.1.attn", 0.08)
    return inject(model, "head", 1e-7)


def test_a_fault_in_every_block_is_named_as_the_repeated_submodule_and_its_first_block():
    """blocks.0 and blocks.1 carry all the error, the head 1e-7: the spread rule once took the median of those three
    nonzero errors and said 'every layer makes an error of the same order', and the first layer over the threshold
    was read along the descended path (blocks.1's) only."""
    loc = localize(EAGER, FAULTY, _faulty_blocks(), Inputs((stacks.tokens(),)), 1e-5, 1e-4)
    assert loc.culprit == "blocks.1.attn" and not loc.evenly_spread(), loc.verdict()
    assert loc.repeated and loc.repeated.pattern == "blocks.*.attn"
    assert loc.repeated.over == ["blocks.0.attn", "blocks.1.attn"]
    assert loc.first_divergent == "blocks.0.attn"
    assert "same order" not in loc.verdict() and "(blocks.*.attn) exceeds the threshold in 2 of the 2" in loc.verdict()


def test_a_fault_in_one_block_is_not_said_to_repeat():
    model = inject(stacks.decoder(), "blocks.1.mlp.up", 0.05)
    loc = localize(EAGER, FAULTY, model, Inputs((stacks.tokens(),)), 1e-5, 1e-4)
    assert loc.culprit == "blocks.1.mlp.up" and loc.repeated is None and loc.first_divergent == "blocks.1.mlp.up"


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("transformers")
    return stacks.llama()


@pytest.mark.parametrize("granularity", ["blocks", "leaf"])
def test_a_causal_lm_quantized_whole_is_spread_at_either_granularity(llama, granularity):
    """Every Linear of a LlamaForCausalLM int8 weight-only (per channel): the first level was {model, lm_head}, too
    few for the spread rule, and one q_proj was named. Looked through to the blocks beside lm_head, it is spread; a
    leaf-level comparison says the same, not another culprit."""
    loc = localize(EAGER, INT8, llama, Inputs((stacks.tokens(vocab=64),)), 1e-5, 1e-4, granularity=granularity)
    assert loc.evenly_spread(), loc.verdict()
    assert loc.verdict().startswith("no single layer: ")
    if granularity == "blocks":
        top = loc.levels[0][1].names
        assert "lm.model.layers.0" in top and "lm.lm_head" in top and "lm.model" not in top


def test_an_unmeasured_own_code_and_an_unrelated_trace_warning_are_not_claimed():
    """A block exceeds the threshold, its submodules do not, and its own code was not measured (own_code null): the
    verdict once said 'none of its submodules alone (nor its own code)' and offered a tracer warning as the cause."""
    top = LevelResult(names=["a", "b"], local={"a": new_layer_error("a", max_abs=1e-2, rel_rmse=1e-2, required_atol=1e-2),
                                               "b": new_layer_error("b")})
    inner = LevelResult(names=["a.x"], local={"a.x": new_layer_error("a.x", max_abs=1e-6, rel_rmse=1e-6, required_atol=1e-6)})
    loc = Localization("t", "hierarchical", 1e-4, [("", top), ("a", inner)], culprit="a", as_a_whole=True,
                       suspects=[top.local["a"]],
                       specialized=Specialized(where="m.py:3", code="for row in x:", module="a"))
    verdict = loc.verdict()
    assert "nor its own code" not in verdict and "its own code was not measured on this target" in verdict
    assert "not offered as the cause" in verdict and "also specialised" not in verdict


class Explode(torch.nn.Module):
    """exp(x + 100) - exp(x + 100): Inf - Inf = NaN in float32 everywhere, 0 in float64."""

    def forward(self, x):
        y = torch.exp(x + 100)
        return y - y


def test_the_same_nan_on_both_sides_is_the_references_own_and_no_drift():
    """Both sides return the same NaN where float64 has numbers: the oracle said 'equally far (rmse 0, 0)' and
    localize 'from how the target transforms the whole graph', though the target equals the reference."""
    from parity.report.next_steps import oracle_finding
    from parity.verify.tensors import compare, oracle_verdict

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Explode()).eval()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, oracle = model(x), copy.deepcopy(model).double()(x.double())
    assert torch.isnan(ref).all() and torch.isfinite(oracle).all()
    found = oracle_verdict(compare(ref, ref.clone(), 1e-5, 1e-4, oracle), 3.0, 1e-8)
    assert found.worse == "both" and found.nonfinite_alike
    [line] = oracle_finding(found, passed=False)
    assert "both sides are wrong alike" in line and "no drift between them" in line
    twin = BackendSpec(backend="eager", name="twin")
    loc = localize(EAGER, twin, model, Inputs((x,)), 1e-5, 1e-4)
    assert loc.identical and loc.culprit is None and not loc.whole_graph
    assert "no drift between them" in loc.verdict() and "transforms the whole graph" not in loc.verdict()


def test_a_multihead_attention_is_a_leaf_that_says_why_it_has_no_table():
    """nn.MultiheadAttention uses its out_proj's weight without calling it: the descent once appended an empty
    'layers of attn' level."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            h = self.proj(x)
            return self.head(self.attn(h, h, h, need_weights=False)[0])

    torch.manual_seed(0)
    model = inject(Net().eval(), "attn", 0.05)
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0))
    loc = localize(EAGER, FAULTY, model, Inputs((x,)), 1e-5, 1e-4)
    assert loc.culprit == "attn" and loc.uncalled == "attn"
    assert all(level.names for _, level in loc.levels)
    assert "calls none of its submodules as modules" in loc.verdict()
    assert "ranked by relative RMSE" in loc.verdict()


def test_fan_in_init_keeps_every_normalization_gain():
    """`init: fan_in` redrew RMSNorm gains (only BatchNorm/LayerNorm/GroupNorm kept theirs), which changed the scale
    of a LLaMA's hidden states and hid a RoPE bug."""
    from parity.models.weights import redraw_fan_in

    norms = [torch.nn.RMSNorm(8), stacks.RMSNorm(8), torch.nn.LayerNorm(8)]
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        norms.append(LlamaRMSNorm(8))
    except ImportError:
        pass
    model = torch.nn.Sequential(*norms, torch.nn.Linear(8, 8))
    before = copy.deepcopy(model.state_dict())
    redraw_fan_in(model, 0)
    after = model.state_dict()
    for key in before:
        kept = torch.equal(before[key], after[key])
        assert kept == (not key.startswith(str(len(norms)))), key


def test_a_nan_statistic_is_printed_nan():
    """Records keep NaN as null: the tier-3 line printed 'None' beside 'mean KL nan'."""
    from types import SimpleNamespace

    from parity.report.wording import headline_figures

    check = SimpleNamespace(metrics={"kl_mean": None, "top1_agreement": 0.5}, task="no-such-task")
    assert headline_figures(check) == "kl_mean nan, top1_agreement 0.5"


def test_spread_is_judged_over_the_layers_above_the_threshold_and_not_over_one_repeated_path():
    """Spread needs three layers above the threshold of one order, not a median over zeros and faulty blocks; the
    same path in three blocks (`a.*.down`) is one repeated fault, not spread."""
    from parity.verify.localize import spread

    def level(errors: dict[str, float]) -> LevelResult:
        return LevelResult(names=list(errors), local={n: new_layer_error(n, max_abs=v, rel_rmse=v, required_atol=v)
                                                      for n, v in errors.items()})

    assert spread(level({"a": 1e-2, "b": 1.2e-2, "c": 1e-2}), 1e-4)
    assert not spread(level({"embed": 0.0, "blocks.0": 7e-2, "blocks.1": 9e-2, "head": 5e-8}), 1e-4)
    assert not spread(level({"a.0.down": 1e-2, "a.1.down": 1.2e-2, "a.2.down": 1e-2, "a.0.up": 0.0}), 1e-4)
