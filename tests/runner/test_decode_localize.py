"""Tier 2 on the decode path (#38): a check whose forward agrees and whose cached decoding fails is localized on a
decode step, each side prefilled with the same prompt through its own KV cache and fed one token, hooks on that step
only. The cache bugs are constructed (tests/fixtures/decoders.py): positions off by one on every decode step, and the
first block's attention over the cache scaled wrong."""

from __future__ import annotations

import pytest
import torch

from parity.config.schema import BackendSpec
from parity.records.models import CachedDecodingCheck as Cached
from parity.runner.localization import localize_decode_step

pytest.importorskip("transformers")

from tests.fixtures.decoders import VOCABULARY, decoder  # noqa: E402

EAGER = BackendSpec(backend="eager")
OFF_BY_ONE = BackendSpec(backend="tests.fixtures.decoders:OffByOneCache")
SCALED = BackendSpec(backend="tests.fixtures.decoders:ScaledAttentionCache")
THRESHOLD = 1e-4


def _localized(kind: str, target: BackendSpec):
    from parity.inputs import Inputs

    ids = torch.randint(0, VOCABULARY, (2, 8), generator=torch.Generator().manual_seed(1))
    return localize_decode_step(EAGER, target, decoder(kind), ids[:, :6], ids[:, 6], 1e-5, THRESHOLD,
                                Inputs((), {"input_ids": ids}))


def _first_over(level) -> str:
    """The table's own answer: the first layer in call order whose propagated error exceeds the threshold."""
    return next(n for n in level.names if level.propagated[n].required_atol > THRESHOLD)


@pytest.mark.parametrize(("kind", "culprit", "argument"), [
    ("llama", "model.rotary_emb", "position_ids"), ("qwen2", "model.rotary_emb", "position_ids"),
    ("gpt2", "transformer.wpe", "input")])
def test_positions_off_by_one_on_the_decode_step_name_the_position_embedding(kind, culprit, argument):
    """The rotary embedding (LLaMA, Qwen2) or the learned position embedding (GPT-2) is the first module whose output
    departs on the decode step, as the top level's table says (every layer before it at 0), and it departs because the
    position ids it is handed differ: the model itself is called with other position ids on that step."""
    loc = _localized(kind, OFF_BY_ONE)
    top = loc.levels[0][1]
    assert loc.culprit == culprit == _first_over(top) == loc.first_divergent and not loc.in_own_code
    before = top.names[:top.names.index(culprit)]
    assert before and all(top.propagated[n].max_abs == 0 for n in before)  # the token embedding: the same token
    assert loc.decode_step.model_dump(exclude_unset=True) == {
        "prompt_tokens": 6, "step": 1, "sequences": 2, "entered_through": [argument], "model_arguments": ["position_ids"]}
    verdict = loc.verdict()
    assert verdict.startswith("on the decode step (one token fed after a 6-token prompt")
    assert f"{culprit} is the first module whose output departs" in verdict and f"argument {argument} already" in verdict
    assert loc.record("m", "x").decode_step == loc.decode_step


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_an_attention_over_the_cache_scaled_wrong_names_the_attention_in_its_own_code(kind):
    """The first block's attention scores over the cache scaled wrong on the decode step: the descent follows the
    first block, then its attention (each called with the same arguments on both sides), whose first departing
    submodule (its output projection) already receives a different input: the attention's own code."""
    loc = _localized(kind, SCALED)
    attention = {"llama": "model.layers.0.self_attn", "gpt2": "transformer.h.0.attn"}[kind]
    assert [parent for parent, _ in loc.levels] == ["", attention.rsplit(".", 1)[0], attention]
    assert loc.culprit == attention and loc.in_own_code
    assert loc.first_divergent == _first_over(loc.levels[-1][1]) and loc.first_divergent.endswith(("o_proj", "c_proj"))
    assert loc.decode_step.model_arguments == [] and loc.decode_step.entered_through
    assert f"the departure is in {attention}'s own code" in loc.verdict()


def test_a_target_whose_decode_step_agrees_names_nothing():
    """Eager against eager: every module's output on the decode step is the reference's; no culprit."""
    loc = _localized("llama", EAGER)
    assert loc.culprit is None and loc.decode_step.model_arguments == []
    assert all(e.max_abs == 0 for e in loc.levels[0][1].propagated.values())
    assert "no module's output departs from the reference's beyond the threshold" in loc.verdict()


def test_a_target_without_cached_decoding_says_why():
    """TorchScript runs a trace captured without the cache: no decode step to look inside, said in one line."""
    with pytest.raises(NotImplementedError, match="runs no module hooks|has no cached decoding"):
        _localized("llama", BackendSpec(backend="torchscript"))


def _experiment(kind: str) -> dict:
    from tests.fixtures.decoders import CONFIGS

    return {"name": "lm", "seed": 0, "repeats": 1,
            "models": [{"name": "lm", "source": "transformers", "config": CONFIGS[kind],
                        "architecture": "AutoModelForCausalLM", "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": {
                "input_ids": {"shape": [2, 10], "dtype": "int64", "distribution": "randint", "high": VOCABULARY}}}],
            "targets": [{"backend": "tests.fixtures.decoders:OffByOneCache", "name": "off-by-one"}],
            "tiers": {"tasks": {"text-generation": {"new_tokens": 4}}}}


def test_a_failing_cached_check_prints_the_localize_that_compares_the_decode_step(tmp_path, monkeypatch, capsys):
    """The run: tier 1 passes, tier 3 fails on the cached decoding only, and its one `next:` line is a localize,
    which, run as printed, says its forward passes, compares the decode step and names the rotary embedding; no
    reduce is offered (a module cut out of the forward agrees)."""
    import shlex

    from parity.cli import main
    from parity.records import read_records
    from tests.support.cli import run_experiment
    from tests.test_walk import _commands

    monkeypatch.chdir(tmp_path)
    ran = run_experiment(_experiment("llama"), tmp_path, "--no-report", capsys=capsys)
    assert ran.code == 1 and ran.checks(1)["off-by-one"]["passed"] and not ran.checks(3)["off-by-one"]["passed"]
    [localize] = _commands(ran.printed)
    assert localize.startswith(f"parity localize {tmp_path / 'exp.yaml'} --model lm --target off-by-one --inputs tokens")
    assert main(shlex.split(localize)[1:]) == 0
    raw = capsys.readouterr().out
    printed = " ".join(raw.split())  # the console's wrapped lines joined
    assert printed.startswith("the check's forward passes at the gate")
    assert "layers of the model on the decode step (after a 6-token prompt)" in printed
    assert "first layer whose propagated error on the decode step exceeds 0.0001: model.rotary_emb" in printed
    assert "verdict: on the decode step" in printed and "model.rotary_emb is the first module whose output departs" in printed
    assert not _commands(raw) and "parity reduce" not in printed
    out = shlex.split(localize)[-1]
    [layers] = [r for r in read_records(out) if r["kind"] == "layers"]
    assert layers["culprit"] == "model.rotary_emb" and layers["decode_step"]["cached"]["passed"] is False
    assert main(["reduce", out, "--check", "lm/tokens/off-by-one", "--experiment", str(tmp_path / "exp.yaml")]) == 2
    assert "compared a decode step through each side's KV cache" in capsys.readouterr().err


@pytest.mark.parametrize(("forward", "cached", "localized"), [
    (True, Cached(passed=False, side="target"), True),
    (False, Cached(passed=False, side="target"), False),  # the forward fails: localize explains it first
    (None, Cached(passed=False, side="target"), False),  # no forward verdict (the reference failed)
    (True, Cached(passed=False, side="reference"), False),  # the reference's own cache: no target's to localize
    (True, Cached(passed=True, side=None), False),
    (True, Cached(side="target", error="the target: no cached decoding"), False),  # could not decode: no verdict
    (True, None, False)])
def test_a_check_is_localized_on_its_decode_step_when_its_forward_passes_and_the_targets_cache_fails(
        forward, cached, localized):
    """The one decision a run and `parity localize` share (verify.localize.localizes_decode_step)."""
    from parity.verify.localize import localizes_decode_step

    assert localizes_decode_step(forward, cached) is localized


def test_a_run_with_tier_2_localizes_a_failing_cached_check_on_its_decode_step(tmp_path, capsys):
    """`parity run` with tiers.activations on: the off-by-one target's forward passes and its cached decoding fails, so
    the run itself compares the decode step, as `parity localize` does, and records it (the rotary embedding, entered
    through its position ids); the console says where it diverges on the decode step and offers no localize to run
    again."""
    from tests.support.cli import run_experiment

    exp = _experiment("llama")
    exp["tiers"]["activations"] = True
    ran = run_experiment(exp, tmp_path, "--no-report", capsys=capsys)
    assert ran.code == 1 and ran.checks(1)["off-by-one"]["passed"] and not ran.checks(3)["off-by-one"]["passed"]
    [layers] = [r for r in ran.records() if r["kind"] == "layers"]
    assert (layers["target"], layers["mode"], layers["culprit"]) == ("off-by-one", "decode step", "model.rotary_emb")
    assert layers["decode_step"]["entered_through"] == ["position_ids"] and layers["decode_step"]["cached"]["passed"] is False
    assert layers["verdict"].startswith("on the decode step")
    printed = " ".join(ran.printed.split())
    assert "diverges at model.rotary_emb" in printed and "on the decode step" in printed
    assert "/ off-by-one: model.rotary_emb on the decode step (its cached decoding fails, its forward agrees)" in printed
    assert "next: parity localize" not in printed


def test_the_api_localizes_gpt2s_decode_step_at_its_position_embedding():
    """parity.api.localize on GPT-2 (learned positions) with its positions off by one on decode steps: the record
    compares the decode step and names the position embedding; an eager target, whose cached decoding agrees, is
    localized on its forward as before."""
    from parity.api import localize

    record = localize(_experiment("gpt2"))
    assert record["mode"] == "decode step" and record["culprit"] == "transformer.wpe"
    assert record["decode_step"]["entered_through"] == ["input"] and record["tier1"]["passed"]
    plain = localize({**_experiment("gpt2"), "targets": [{"backend": "eager", "name": "same"}]})
    assert plain["mode"] == "hierarchical" and "decode_step" not in plain


def test_the_next_steps_of_a_cached_failure_follow_its_side_and_its_forward():
    """The reference's own cached decoding failing: no localize (it compares a target against the reference), a line
    saying why; the target's failing while its tier-1 check fails too: no decode-step localize (localize explains the
    forward first); while its tier-1 check passes: the localize command, unless the run localized it already (tier 2
    on: its layers record)."""
    from types import SimpleNamespace

    from parity.report.next_steps import _cached_lines

    def check(side):
        return SimpleNamespace(model="m", inputs="i", target="t", cached=SimpleNamespace(passed=False, side=side))

    def view(forward_passes, layers=None):
        return SimpleNamespace(checks=lambda tier, **which: [SimpleNamespace(passed=forward_passes)],
                               layers_for=lambda check: layers)

    commands = []
    [line] = _cached_lines(check("reference"), view(True), commands, "parity localize x")
    assert "wrong on the reference itself" in line and commands == []
    assert _cached_lines(check("target"), view(False), commands, "parity localize x") == [] and commands == []
    assert _cached_lines(check("target"), view(True, layers=SimpleNamespace()), commands, "parity localize x") == []
    assert commands == []
    assert _cached_lines(check("target"), view(True), commands, "parity localize x")
    assert commands == [("localize", "parity localize x")]
