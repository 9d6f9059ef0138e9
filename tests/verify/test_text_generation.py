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


# -- free-running: each side's greedy continuation by its own artifact ---------------------------------------

VOCABULARY = 10


class Successor(torch.nn.Module):
    """A causal 'language model' whose next token is always the current one plus 1 (mod 10), sure of it."""

    def forward(self, input_ids, attention_mask=None):
        return {"logits": 5.0 * torch.nn.functional.one_hot((input_ids + 1) % VOCABULARY, VOCABULARY).float()}


class Bidirectional(torch.nn.Module):
    """Not causal: every position's scores read every token of the sequence (their sum)."""

    def forward(self, input_ids):
        total = input_ids.sum(-1, keepdim=True)
        return {"logits": torch.nn.functional.one_hot((input_ids + total) % VOCABULARY, VOCABULARY).float()}


class SwapsAtPosition5(EagerBackend):
    """A target that prefers token 0 at position 5 (by 5 logits over the model's choice): every decision read
    there flips, a real flip (the reference is sure of its token)."""

    name = "swaps-at-5"

    def run(self, inputs):
        out = super().run(inputs)
        out["logits"][:, 5, 0] += 10.0
        return out


def _run(model):
    from parity.inputs import Inputs

    return lambda inputs: model(*inputs.args, **inputs.kwargs) if isinstance(inputs, Inputs) else None


def test_a_continuation_is_generated_greedily_in_a_buffer_of_the_inputs_shape():
    """Each new token is the model's choice after the previous one it chose (fed back), written after a prompt that
    leaves room for the new tokens: 8 positions, 3 new tokens, so prompts of up to 5 tokens; a right-padded
    sequence of 3 tokens keeps all 3."""
    from parity.inputs import Inputs
    from parity.verify.tasks.text_generation import generate

    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [7, 8, 9, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]])
    found = generate(_run(Successor()), Inputs((), {"input_ids": ids, "attention_mask": mask}), new_tokens=3)
    assert found["new_tokens"] == 3 and found["prompts"] == [[1, 2, 3, 4, 5], [7, 8, 9]]
    assert found["tokens"] == [[6, 7, 8], [0, 1, 2]]
    assert all(m > 0.9 for row in found["margins"] for m in row)
    assert generate(_run(Successor()), Inputs((), {"input_ids": ids}), new_tokens=20)["new_tokens"] == 7  # 1-token prompts


def test_a_model_that_is_not_a_causal_decoder_or_left_padding_gets_no_continuation_and_says_why():
    from parity.inputs import Inputs
    from parity.verify.tasks.text_generation import generate

    ids = torch.tensor([[1, 2, 3, 4, 5, 7]])  # the first new token (5) is not the 4 that was there
    assert "not a causal decoder" in generate(_run(Bidirectional()), Inputs((), {"input_ids": ids}), 3)["error"]
    left = {"input_ids": ids, "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1]])}
    assert "right-padded" in generate(_run(Successor()), Inputs((), left), 3)["error"]
    assert "input_ids" in generate(_run(Successor()), Inputs((ids,), {}), 3)["error"]  # ids given by position


def test_continuations_are_judged_by_their_first_divergence_and_exact_match():
    """Prompt 0 matches; prompt 1 diverges at new token 2 where the reference was sure (a real flip); prompt 2 at
    new token 0 on a near tie. exact_match 1/3, first_divergence 0; reported, not judged, unless exact_match is set."""
    from parity.verify.tasks.text_generation import judge_continuations

    reference = {"new_tokens": 3, "prompts": [[1], [2, 3], [4]], "tokens": [[5, 6, 7], [4, 5, 6], [8, 8, 8]],
                 "margins": [[0.9] * 3, [0.9, 0.9, 0.8], [0.001, 0.5, 0.5]]}
    target = {**reference, "tokens": [[5, 6, 7], [4, 5, 9], [9, 8, 8]]}
    result = evaluate(_logits([1.0, 0.0]), _logits([1.0, 0.0]), DEFAULTS, 1e-4)
    fields = judge_continuations(result, reference, target, DEFAULTS)
    prompts = fields["generation"]["prompts"]
    assert [p["first_divergence"] for p in prompts] == [None, 2, 0]
    assert (prompts[1]["flip"], prompts[2]["flip"]) == ("real", "near_tie")
    assert (prompts[1]["context"], prompts[1]["reference"], prompts[1]["target"]) == ([2, 3, 4, 5], [6], [9])
    assert result.metrics["exact_match"] == pytest.approx(1 / 3) and result.metrics["first_divergence"] == 0
    assert result.passed
    strict = TextGenerationThresholds(exact_match=0.5)
    judge_continuations(result, reference, target, strict)
    assert not result.passed and result.failure_class == "decision_flip" and "exact match" in result.detail
    broken = judge_continuations(result, reference, {"error": "not a causal decoder: ..."}, DEFAULTS)
    assert broken == {"generation": {"error": "the target: not a causal decoder: ..."}}


def _successor_experiment(executor: str = "local") -> dict:
    return {"name": "gen", "seed": 0, "repeats": 1, "executor": {"kind": executor},
            "models": [{"name": "succ", "source": "python", "entry": "tests.verify.test_text_generation:Successor",
                        "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": {
                "input_ids": {"shape": [2, 8], "dtype": "int64", "distribution": "randint", "high": VOCABULARY}}}],
            "targets": [{"backend": "eager", "dtype": "float64"},
                        {"backend": "tests.verify.test_text_generation:SwapsAtPosition5", "name": "swaps-at-5"}],
            "tiers": {"tasks": {"text-generation": {"new_tokens": 4}}}}


@pytest.mark.parametrize("executor", ["local", "process"])
def test_a_target_that_flips_one_decision_diverges_at_that_new_token(tmp_path, executor):
    """8 positions, 4 new tokens: prompts of 4 tokens, the new tokens read positions 3, 4, 5, 6; the target flips the
    decision at position 5, so each continuation first differs at new token 2, computed by the target's own
    artifact (in a worker process too)."""
    records = run_experiment(_successor_experiment(executor), out=tmp_path / "out", reports=("report.md", "report.html"))
    tier3 = {r["target"]: r for r in records if r["kind"] == "check" and r["tier"] == 3}
    same, swapped = tier3["eager-cpu-float64"], tier3["swaps-at-5"]
    assert same["generation"]["exact_match"] == 1.0 and "first_divergence" not in same["metrics"]
    assert swapped["generation"]["new_tokens"] == 4
    assert [p["first_divergence"] for p in swapped["generation"]["prompts"]] == [2, 2]
    assert {p["flip"] for p in swapped["generation"]["prompts"]} == {"real"}
    assert swapped["metrics"]["first_divergence"] == 2 and swapped["metrics"]["exact_match"] == 0.0
    assert swapped["generation"]["prompts"][0]["target"][0] == 0  # the target's own choice at the divergence
    line = "free-running: 0 of 2 continuations of 4 tokens match exactly; first divergence: prompt 0 at new token 2"
    for report in ("report.md", "report.html"):
        assert line in (tmp_path / "out" / report).read_text()
