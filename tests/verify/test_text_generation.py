"""Tier 3 for language models (`task: text-generation`): teacher-forced next-token statistics as llama.cpp's
`llama-perplexity --kl-divergence` reports them, and each flip told a near tie or a real one. The logits are
constructed here, so every number is known."""

from __future__ import annotations

import math

import pytest
import torch

from parity.api import run_experiment
from parity.backends.eager import EagerBackend
from parity.verify.tasks.text_generation import TextGenerationThresholds, evaluate

DEFAULTS = TextGenerationThresholds()


def _logits(*rows: list[float]) -> dict[str, torch.Tensor]:
    """One sequence of next-token scores, as a causal LM returns them: {'logits': [1, positions, vocabulary]}."""
    return {"logits": torch.tensor([rows], dtype=torch.float32)}


def test_a_near_tie_flip_and_a_real_flip_are_told_apart():
    """Position 0: the reference's two best tokens are 0.0005 apart in probability and the target swaps them (a
    near tie); position 1: the reference is sure of token 2, the target of token 3 (a real flip); position 2
    agrees."""
    reference = _logits([1.0, 0.999, -5, -5], [0, 0, 5, 0], [3, 0, 0, 0])
    target = _logits([0.999, 1.0, -5, -5], [0, 0, 0, 5], [3, 0, 0, 0])
    result = evaluate(reference, target, DEFAULTS, 1e-4)
    m = result.metrics
    assert (m["positions"], m["flips"], m["real_flips"], m["near_tie_flips"]) == (3, 2, 1, 1)
    assert m["top1_agreement"] == pytest.approx(1 / 3)
    assert not result.passed and result.failure_class == "decision_flip"
    from parity.verify.tasks.text_generation import TASK

    flips = TASK.explain(reference, target, DEFAULTS, [], [])["token_flips"]
    assert [(f["position"], f["class"], f["reference_token"], f["target_token"]) for f in flips] == [
        ([0, 1], "real", 2, 3), ([0, 0], "near_tie", 0, 1)]
    assert flips[1]["margin"] < DEFAULTS.near_tie_margin < flips[0]["margin"]


def test_kl_delta_p_and_the_perplexity_ratio_are_the_textbook_values():
    """Position 0: reference p = (0.8, 0.2), target q = (0.6, 0.4); position 1: identical. KL(p||q) = 0.8 ln(0.8/0.6)
    + 0.2 ln(0.2/0.4); delta p of the reference's token (0) is -0.2 then 0; the perplexity ratio on the
    reference's tokens is exp(mean(ln 0.8 - ln 0.6, 0))."""
    reference = _logits([math.log(0.8), math.log(0.2)], [2.0, 0.0])
    target = _logits([math.log(0.6), math.log(0.4)], [2.0, 0.0])
    m = evaluate(reference, target, DEFAULTS, 1e-4).metrics
    kl = 0.8 * math.log(0.8 / 0.6) + 0.2 * math.log(0.2 / 0.4)
    assert m["kl_max"] == pytest.approx(kl, rel=1e-5)
    assert m["kl_mean"] == pytest.approx(kl / 2, rel=1e-5)
    assert m["kl_median"] == pytest.approx(0.0, abs=1e-7)  # the lower of two, as torch.median gives it
    assert m["kl_p99"] == pytest.approx(0.99 * kl, rel=1e-5)  # linear between the two positions
    assert m["delta_p_mean"] == pytest.approx(-0.1, rel=1e-5)
    assert m["delta_p_rms"] == pytest.approx(math.sqrt(0.02), rel=1e-5)
    assert m["perplexity_ratio"] == pytest.approx(math.sqrt(0.8 / 0.6), rel=1e-5)
    assert m["top1_agreement"] == 1.0


def test_the_mean_kl_threshold_fails_a_check_whose_decisions_all_agree():
    reference = _logits([math.log(0.8), math.log(0.2)])
    target = _logits([math.log(0.6), math.log(0.4)])
    result = evaluate(reference, target, TextGenerationThresholds(kl_mean=0.1), 1e-4)
    assert result.passed
    result = evaluate(reference, target, DEFAULTS, 1e-4)
    assert not result.passed and "mean KL" in result.detail and "top-1" not in result.detail


def test_nan_in_the_targets_scores_never_agrees():
    """200 positions, one of them NaN in the target: top-1 agreement 0.995 clears 0.99, and NaN > kl_mean is
    False, so the NaN alone must fail tier 3."""
    rows = [[2.0, 0.0]] * 200
    target = _logits(*rows)
    target["logits"][0, 0] = float("nan")
    result = evaluate(_logits(*rows), target, DEFAULTS, 1e-4)
    assert not result.passed and "NaN or Inf" in result.detail


class NegatedLogits(EagerBackend):
    """A target whose language model's logits come out negated: every next-token decision flips."""

    name = "negated"

    def run(self, inputs):
        out = super().run(inputs)
        out["logits"] = -out["logits"]
        return out


def test_a_decoder_with_the_text_generation_task_gets_tier_3_in_every_report(tmp_path):
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 16,
            "bos_token_id": 0, "eos_token_id": 0}
    pytest.importorskip("transformers")
    data = {"name": "lm", "seed": 0, "repeats": 1,
            "models": [{"name": "lm", "source": "transformers", "config": gpt2, "architecture": "AutoModelForCausalLM",
                        "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": {
                "input_ids": {"shape": [2, 8], "dtype": "int64", "distribution": "randint", "high": 100}}}],
            "targets": [{"backend": "eager", "dtype": "float64"},
                        {"backend": "tests.verify.test_text_generation:NegatedLogits", "name": "negated"}],
            "tiers": {"tasks": {"text-generation": {"top1_agreement": 0.9}}}}
    records = run_experiment(data, out=tmp_path / "out")
    tier3 = {r["target"]: r for r in records if r["kind"] == "check" and r["tier"] == 3}
    assert tier3["eager-cpu-float64"]["passed"] and tier3["eager-cpu-float64"]["metrics"]["top1_agreement"] == 1.0
    negated = tier3["negated"]
    assert not negated["passed"] and negated["failure_class"] == "decision_flip"
    assert negated["metrics"]["positions"] == 16 and negated["metrics"]["top1_agreement"] == 0.0
    assert negated["token_flips"] and negated["thresholds"]["top1_agreement"] == 0.9
    report = (tmp_path / "out" / "report.md").read_text()
    assert "kl_mean" in report and "real_flips" in report


def test_an_int4_weight_only_target_quantizes_a_decoder_s_linears_and_gets_both_tiers(tmp_path):
    """`torchao-int4-weight`: every nn.Linear of a LLaMA block with int4 weights; tier 1 sees the rounding, tier 3
    judges the next-token decisions."""
    pytest.importorskip("torchao")
    pytest.importorskip("transformers")
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
             "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 16}
    data = {"name": "lm", "seed": 0, "repeats": 1,
            "models": [{"name": "lm", "source": "transformers", "config": llama, "architecture": "AutoModelForCausalLM",
                        "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": {
                "input_ids": {"shape": [1, 8], "dtype": "int64", "distribution": "randint", "high": 64}}}],
            "targets": [{"backend": "eager", "quantize": {"scheme": "torchao-int4-weight"}}],
            "tolerances": {"atol": [1e-4, 1e-2, 1], "gate": 1e-4}, "tiers": {"tasks": True}}
    records = run_experiment(data, out=tmp_path / "out")
    tier1 = next(r for r in records if r["kind"] == "check" and r["tier"] == 1)
    tier3 = next(r for r in records if r["kind"] == "check" and r["tier"] == 3)
    assert tier1["target"] == tier3["target"] == "eager-cpu-int4-weight"
    assert tier1["status"] == "ok" and tier1["max_abs"] > 0 and tier3["metrics"]["positions"] == 8


def test_the_llm_example_is_valid(tmp_path, capsys):
    """examples/llm.yaml reads what `make llm-demo`'s training writes under parity-out/ (not in a clone): valid
    with stand-ins for those folders (an untrained LLaMA and the training script's own tokenizer), beside a copy."""
    import runpy

    from parity.cli import main
    from tests.support import ROOT

    transformers = pytest.importorskip("transformers")
    (tmp_path / "examples").mkdir()
    example = tmp_path / "examples" / "llm.yaml"
    example.write_text((ROOT / "examples" / "llm.yaml").read_text())
    lm = tmp_path / "parity-out" / "tiny-lm"
    config = transformers.LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    transformers.LlamaForCausalLM(config).save_pretrained(lm / "model")
    script = runpy.run_path(str(ROOT / "examples" / "models" / "train_tiny_lm.py"))
    tokenizer = script["make_tokenizer"](["a small fish", "a large shark"])
    tokenizer.save_pretrained(lm / "tokenizer")
    assert tokenizer(["a fish"])["input_ids"] == [[3, 5]] and "token_type_ids" not in tokenizer(["a"])
    assert main(["validate", str(example)]) == 0
    assert "valid" in capsys.readouterr().out
