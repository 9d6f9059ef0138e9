"""Tier 3 for language models (`task: text-generation`): teacher-forced next-token statistics as llama.cpp's
`llama-perplexity --kl-divergence` reports them, and each flip told a near tie or a real one. The logits are
constructed here, so every number is known."""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from parity.api import run_experiment
from parity.backends.eager import EagerBackend
from parity.verify.tasks.text_generation import TextGenerationThresholds, evaluate

DEFAULTS = TextGenerationThresholds()


def _logits(*rows: list[float]) -> dict[str, torch.Tensor]:
    """One sequence of next-token scores, as a causal LM returns them: {'logits': [1, positions, vocabulary]}."""
    return {"logits": torch.tensor([rows], dtype=torch.float32)}


def _text(*ids: list[int], mask: list[list[int]] | None = None, scored_from: int = 0):
    """The inputs the logits were computed on: token ids [sequences, positions] (and an attention mask)."""
    from parity.inputs import Inputs

    kwargs = {"input_ids": torch.tensor(ids)}
    if mask is not None:
        kwargs["attention_mask"] = torch.tensor(mask)
    return Inputs((), kwargs, scored_from=scored_from)


def test_a_near_tie_flip_and_a_real_flip_are_told_apart():
    """Position 0: the reference's two best tokens are 0.0005 apart in probability and the target swaps them (a
    near tie); position 1: the reference is sure of token 2, the target of token 3 (a real flip); position 2
    agrees."""
    reference = _logits([1.0, 0.999, -5, -5], [0, 0, 5, 0], [3, 0, 0, 0])
    target = _logits([0.999, 1.0, -5, -5], [0, 0, 0, 5], [3, 0, 0, 0])
    result = evaluate(reference, target, DEFAULTS, 1e-4)
    m = result.metrics
    assert (m["positions"], m["flips"], m["real_flips"], m["near_tie_flips"]) == (3, 2, 1, 1)
    assert m["top1_agreement"] == pytest.approx(2 / 3) and m["same_top1"] == pytest.approx(1 / 3)
    assert not result.passed and result.failure_class == "decision_flip"
    flips = result.record["token_flips"]
    assert [(f["position"], f["class"], f["reference_token"], f["target_token"]) for f in flips] == [
        ([0, 1], "real", 2, 3), ([0, 0], "near_tie", 0, 1)]
    assert flips[1]["margin"] < DEFAULTS.near_tie_margin < flips[0]["margin"]


def test_near_ties_do_not_gate_top_1_by_default_and_the_verdict_says_so():
    """200 positions, 3 near-tie flips and 1 real flip: top-1 agreement on real flips 0.995 passes at 0.99; every
    flip counted (count_near_ties) 0.98 fails, and a failure's line says which flips it counted."""
    sure, tie, swapped = [5.0, 0.0, 0.0], [1.0, 0.9999, 0.0], [0.9999, 1.0, 0.0]
    reference = _logits(*[sure] * 196, tie, tie, tie, sure)
    target = _logits(*[sure] * 196, swapped, swapped, swapped, [0.0, 5.0, 0.0])
    loose = TextGenerationThresholds(kl_mean=1.0)
    result = evaluate(reference, target, loose, 1e-4)
    assert result.metrics["top1_agreement"] == pytest.approx(0.995) and result.passed
    assert result.metrics["same_top1"] == pytest.approx(0.98)
    strict = evaluate(reference, target, TextGenerationThresholds(kl_mean=1.0, count_near_ties=True), 1e-4)
    assert strict.metrics["top1_agreement"] == pytest.approx(0.98) and not strict.passed
    assert "every flip counted" in strict.detail
    gated = evaluate(reference, target, TextGenerationThresholds(kl_mean=1.0, top1_agreement=0.999), 1e-4)
    assert not gated.passed and "real flips only: 3 near ties" in gated.detail


def test_perplexity_and_delta_p_are_on_the_text_s_next_token_not_the_reference_s_choice():
    """Two scored positions; the text's next tokens are 1 then 0, and at position 0 the reference chooses 0.
    Reference p = (0.8, 0.2), target q = (0.6, 0.4) there: the text's token 1 has p 0.2, q 0.4, so delta p +0.2
    and a target perplexity lower than the reference's (on the reference's choice it would be higher)."""
    reference = _logits([math.log(0.8), math.log(0.2)], [math.log(0.5), math.log(0.5)], [0.0, 0.0])
    target = _logits([math.log(0.6), math.log(0.4)], [math.log(0.5), math.log(0.5)], [0.0, 0.0])
    m = evaluate(reference, target, DEFAULTS, 1e-4, inputs=_text([7, 1, 0])).metrics
    assert m["positions"] == 2  # the last position has no next token in the text
    assert m["delta_p_mean"] == pytest.approx((0.4 - 0.2 + 0.0) / 2)
    assert m["delta_p_rms"] == pytest.approx(math.sqrt(0.2 ** 2 / 2))
    assert m["ppl_reference"] == pytest.approx(math.exp(-(math.log(0.2) + math.log(0.5)) / 2))
    assert m["ppl_target"] == pytest.approx(math.exp(-(math.log(0.4) + math.log(0.5)) / 2))
    assert m["perplexity_ratio"] == pytest.approx(math.sqrt(0.4 / 0.2) ** -1) and m["perplexity_ratio"] < 1
    kl = 0.8 * math.log(0.8 / 0.6) + 0.2 * math.log(0.2 / 0.4)
    assert m["kl_mean"] == pytest.approx(kl / 2) and m["kl_max"] == pytest.approx(kl)
    assert m["kl_median"] == pytest.approx(kl / 2)  # the mean of the middle two, as perplexity.cpp takes it


def test_padding_and_a_window_s_first_half_are_never_scored():
    """Sequence 1 is right-padded after 2 tokens: where it is padding (or its next token is), the target's scores
    are anything (a real flip, a huge KL) and nothing counts; the same logits as windows scored from position 2
    count only positions 2 and 3 of each (the last has no next token)."""
    sure = [4.0, 0.0, 0.0]
    reference = {"logits": torch.tensor([[sure] * 5, [sure] * 5])}
    target = {"logits": reference["logits"].clone()}
    target["logits"][1, 1:] = torch.tensor([0.0, 0.0, 9.0])  # position 1 predicts padding; 2, 3, 4 are padding
    target["logits"][0, 0] = torch.tensor([0.0, 0.0, 9.0])  # a real flip, in a window's unscored first half
    mask = [[1] * 5, [1, 1, 0, 0, 0]]
    padded = evaluate(reference, target, DEFAULTS, 1e-4, inputs=_text([0] * 5, [0] * 5, mask=mask))
    assert padded.metrics["positions"] == 4 + 1 and padded.metrics["real_flips"] == 1  # sequence 0's position 0
    windows = evaluate(reference, target, DEFAULTS, 1e-4,
                       inputs=_text([0] * 5, [0] * 5, mask=[[1] * 5, [1] * 5], scored_from=2))
    assert windows.metrics["positions"] == 4 and windows.metrics["real_flips"] == 2  # sequence 1, positions 2, 3
    unflipped = {"logits": target["logits"].clone()}
    unflipped["logits"][0, 0] = torch.tensor(sure)
    clean = evaluate(reference, unflipped, DEFAULTS, 1e-4, inputs=_text([0] * 5, [0] * 5, mask=mask))
    assert clean.passed and clean.metrics["kl_max"] == 0.0 and clean.metrics["same_top1"] == 1.0


def test_few_scored_positions_or_no_token_ids_leave_a_note():
    reference = _logits([1.0, 0.0], [1.0, 0.0])
    few = evaluate(reference, reference, DEFAULTS, 1e-4, inputs=_text([0, 1]))
    assert few.metrics["positions"] == 1 and any("only 1 scored positions" in n for n in few.notes)
    blind = evaluate(reference, reference, DEFAULTS, 1e-4)
    assert blind.metrics["positions"] == 2 and math.isnan(blind.metrics["ppl_target"])
    assert any("no token ids" in n for n in blind.notes)


def _mean_and_uncertainty(values: list[float]) -> tuple[float, float]:
    """perplexity.cpp's mean_and_uncertainty, written out from its C++ (sums first, then the formula)."""
    n, s, s2 = len(values), sum(values), sum(v * v for v in values)
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def _percentile(values: list[float], fraction: float) -> float:
    """perplexity.cpp's percentile lambda, on sorted values."""
    p = fraction * (len(values) - 1)
    ip = int(p)
    p -= ip
    return (1 - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)]


def test_the_statistics_are_perplexity_cpp_s_formulas_by_hand():
    """40 positions of seeded logits over 6 tokens, the text a seeded draw: every statistic recomputed position by
    position in plain Python, exactly as perplexity.cpp's kl_divergence accumulates and reports them."""
    torch.manual_seed(0)
    ref = torch.randn(1, 41, 6, dtype=torch.float64) * 2
    tgt = ref + torch.randn(1, 41, 6, dtype=torch.float64) * 0.5
    ids = torch.randint(0, 6, (1, 41))
    m = evaluate({"logits": ref}, {"logits": tgt}, DEFAULTS, 1e-4, inputs=_text(*ids.tolist())).metrics
    nll, nll_base, kld, dp, same = [], [], [], [], 0
    for i in range(40):
        log_q = [x - math.log(sum(math.exp(y) for y in tgt[0, i].tolist())) for x in tgt[0, i].tolist()]
        log_p = [x - math.log(sum(math.exp(y) for y in ref[0, i].tolist())) for x in ref[0, i].tolist()]
        tok = int(ids[0, i + 1])
        nll.append(-log_q[tok])
        nll_base.append(-log_p[tok])
        kld.append(sum(math.exp(lp) * (lp - lq) for lp, lq in zip(log_p, log_q, strict=True)))
        dp.append(math.exp(log_q[tok]) - math.exp(log_p[tok]))
        same += log_q.index(max(log_q)) == log_p.index(max(log_p))
    n = 40
    lq, lq_se = _mean_and_uncertainty(nll)
    lb, lb_se = _mean_and_uncertainty(nll_base)
    cov = (sum(a * b for a, b in zip(nll, nll_base, strict=True)) / n - lq * lb) / (n - 1)
    assert lq_se > 0 and lb_se > 0 and cov != 0
    assert m["ppl_target"] == pytest.approx(math.exp(lq)) and m["ppl_target_se"] == pytest.approx(math.exp(lq) * lq_se)
    assert m["ppl_reference"] == pytest.approx(math.exp(lb))
    assert m["ppl_reference_se"] == pytest.approx(math.exp(lb) * lb_se)
    assert m["ln_ppl_correlation"] == pytest.approx(cov / (lq_se * lb_se))
    ratio_se = math.sqrt(lq_se ** 2 + lb_se ** 2 - 2 * cov)
    assert m["ln_ppl_ratio"] == pytest.approx(lq - lb) and m["ln_ppl_ratio_se"] == pytest.approx(ratio_se)
    assert m["perplexity_ratio_se"] == pytest.approx(math.exp(lq - lb) * ratio_se)
    kl_mean, kl_se = _mean_and_uncertainty(kld)
    assert m["kl_mean"] == pytest.approx(kl_mean) and m["kl_mean_se"] == pytest.approx(kl_se) and kl_se > 0
    ordered = sorted(kld)
    assert m["kl_median"] == pytest.approx(0.5 * (ordered[19] + ordered[20]))
    for key, fraction in (("kl_p90", 0.9), ("kl_p95", 0.95), ("kl_p99", 0.99), ("kl_p999", 0.999)):
        assert m[key] == pytest.approx(_percentile(ordered, fraction)), key
    assert m["kl_max"] == pytest.approx(ordered[-1])
    dp_mean, dp_se = _mean_and_uncertainty(dp)
    mse, mse_se = _mean_and_uncertainty([d * d for d in dp])
    assert m["delta_p_mean"] == pytest.approx(dp_mean) and m["delta_p_mean_se"] == pytest.approx(dp_se)
    assert m["delta_p_rms"] == pytest.approx(math.sqrt(mse))
    assert m["delta_p_rms_se"] == pytest.approx(0.5 / math.sqrt(mse) * mse_se) and mse_se > 0
    assert m["delta_p_p99"] == pytest.approx(_percentile(sorted(dp), 0.99))
    p = same / n
    assert m["same_top1"] == pytest.approx(p) and m["same_top1_se"] == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)))


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


class LargestFloat64(TorchFunctionMode):
    """Counts the elements of the largest float64 tensor any torch function or tensor method returns while it is
    active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


def test_the_statistics_work_a_chunk_of_positions_at_a_time_and_give_the_same_numbers_bit_for_bit(monkeypatch):
    """A text's whole logits in float64 are larger than the model (2,048 positions of a 49,152-token vocabulary:
    0.8 GB a side): the statistics take float64 CHUNK_ELEMENTS scores at a time, so the largest float64 tensor
    made is a chunk's however many positions are scored, and every metric and record equals the one-chunk result
    to the last bit (each value is a reduction over one row)."""
    from parity.verify.tasks import text_generation

    g = torch.Generator().manual_seed(0)
    positions, vocabulary = 64, 400
    reference = {"logits": torch.randn(2, positions, vocabulary, generator=g) * 3}
    target = {"logits": reference["logits"] + 0.5 * torch.randn(2, positions, vocabulary, generator=g)}
    mask = torch.ones(2, positions, dtype=torch.long)
    mask[1, 50:] = 0
    inputs = _text(*torch.randint(0, vocabulary, (2, positions), generator=g).tolist(), mask=mask.tolist(), scored_from=8)
    monkeypatch.setattr(text_generation, "CHUNK_ELEMENTS", 10 * vocabulary)
    with LargestFloat64() as seen:
        chunked = evaluate(reference, target, DEFAULTS, 1e-4, inputs=inputs)
    assert chunked.metrics["positions"] == 2 * (positions - 9) - (positions - 50) and chunked.metrics["real_flips"]
    assert seen.largest <= 10 * vocabulary
    monkeypatch.setattr(text_generation, "CHUNK_ELEMENTS", 2 * positions * vocabulary)
    whole = evaluate(reference, target, DEFAULTS, 1e-4, inputs=inputs)
    assert chunked.metrics.keys() == whole.metrics.keys()
    assert all(str(chunked.metrics[k]) == str(whole.metrics[k]) for k in whole.metrics)  # NaN equals NaN here
    assert chunked.record == whole.record


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
    assert negated["metrics"]["positions"] == 14 and negated["metrics"]["same_top1"] == 0.0  # 7 next tokens a row
    assert negated["token_flips"] and negated["thresholds"]["top1_agreement"] == 0.9
    assert list(negated["token_flips"][0]) == ["position", "reference_token", "target_token", "margin", "class"]
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
    assert tier1["status"] == "ok" and tier1["max_abs"] > 0 and tier3["metrics"]["positions"] == 7


def test_the_llm_example_is_valid(tmp_path, capsys):
    """examples/llm.yaml reads what `make tiny-llm-demo`'s training writes under parity-out/ (not in a clone): valid
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
    assert found.new_tokens == 3 and found.prompts == [[1, 2, 3, 4, 5], [7, 8, 9]]
    assert found.tokens == [[6, 7, 8], [0, 1, 2]]
    assert all(m > 0.9 for row in found.margins for m in row)
    assert generate(_run(Successor()), Inputs((), {"input_ids": ids}), new_tokens=20).new_tokens == 7  # 1-token prompts


def test_a_model_that_is_not_a_causal_decoder_or_left_padding_gets_no_continuation_and_says_why():
    from parity.inputs import Inputs
    from parity.verify.tasks.text_generation import generate

    ids = torch.tensor([[1, 2, 3, 4, 5, 7]])  # the first new token (5) is not the 4 that was there
    assert "not a causal decoder" in generate(_run(Bidirectional()), Inputs((), {"input_ids": ids}), 3).error
    left = {"input_ids": ids, "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1]])}
    assert "right-padded" in generate(_run(Successor()), Inputs((), left), 3).error
    assert "input_ids" in generate(_run(Successor()), Inputs((ids,), {}), 3).error  # ids given by position


def test_continuations_are_judged_by_their_first_divergence_and_exact_match():
    """Prompt 0 matches; prompt 1 diverges at new token 2 where the reference was sure (a real flip); prompt 2 at
    new token 0 on a near tie. exact_match 1/3, first_divergence 0; reported, not judged, unless exact_match is set."""
    from dataclasses import replace

    from parity.verify.tasks.text_generation import Continuations, Unavailable, judge_continuations

    reference = Continuations(new_tokens=3, prompts=[[1], [2, 3], [4]], text_tokens=[1, 2, 1],
                              tokens=[[5, 6, 7], [4, 5, 6], [8, 8, 8]],
                              margins=[[0.9] * 3, [0.9, 0.9, 0.8], [0.001, 0.5, 0.5]])
    target = replace(reference, tokens=[[5, 6, 7], [4, 5, 9], [9, 8, 8]])
    result = evaluate(_logits([1.0, 0.0]), _logits([1.0, 0.0]), DEFAULTS, 1e-4)
    judged, generation = judge_continuations(result, reference, target, DEFAULTS)
    prompts = generation.prompts
    assert [p.first_divergence for p in prompts] == [None, 2, 0]
    assert (prompts[1].flip, prompts[2].flip) == ("real", "near_tie")
    assert (prompts[1].context, prompts[1].reference, prompts[1].target) == ([2, 3, 4, 5], [6], [9])
    assert list(prompts[1].model_dump(exclude_unset=True)) == [  # the keys in the order parity always wrote them
        "prompt_tokens", "first_divergence", "margin", "flip", "context", "reference", "target"]
    assert judged.metrics["exact_match"] == pytest.approx(1 / 3) and judged.metrics["first_divergence"] == 0
    assert judged.passed and "exact_match" not in result.metrics  # a new result: the task's own is left as it was
    strict = TextGenerationThresholds(exact_match=0.5)
    failed, _ = judge_continuations(result, reference, target, strict)
    assert not failed.passed and failed.failure_class == "decision_flip" and "exact match" in failed.detail
    assert result.passed
    _, broken = judge_continuations(result, reference, Unavailable("not a causal decoder: ..."), DEFAULTS)
    assert broken.model_dump(exclude_unset=True) == {"error": "the target: not a causal decoder: ..."}


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


def test_a_prompt_cut_to_make_room_for_the_new_tokens_is_said():
    """13-token sequences and the default 16 new tokens: 12 fit, so each prompt keeps 1 of its 13 tokens. The
    continuations record it and the check carries a note that says so (it used to be silent); 9-token prompts
    padded to 13 with 4 new tokens are whole, and nothing is said."""
    from parity.inputs import Inputs
    from parity.verify.tasks.text_generation import generate, judge_continuations

    ids = torch.arange(26).view(2, 13) % VOCABULARY
    found = generate(_run(Successor()), Inputs((), {"input_ids": ids}), new_tokens=DEFAULTS.new_tokens)
    assert found.new_tokens == 12 and [len(p) for p in found.prompts] == [1, 1]
    result = evaluate(_logits([1.0, 0.0]), _logits([1.0, 0.0]), DEFAULTS, 1e-4)
    result, generation = judge_continuations(result, found, found, DEFAULTS)
    prompts = generation.prompts
    assert [(p.prompt_tokens, p.text_tokens) for p in prompts] == [(1, 13), (1, 13)]
    assert list(prompts[0].model_dump(exclude_unset=True))[:3] == ["prompt_tokens", "first_divergence", "text_tokens"]
    assert any("2 of 2 prompts cut" in n and "13 -> 1" in n for n in result.notes)
    mask = torch.tensor([[1] * 9 + [0] * 4] * 2)  # 9-token prompts, padded: 4 new tokens fit after them
    whole = generate(_run(Successor()), Inputs((), {"input_ids": ids, "attention_mask": mask}), new_tokens=4)
    result = evaluate(_logits([1.0, 0.0]), _logits([1.0, 0.0]), DEFAULTS, 1e-4)
    result, _ = judge_continuations(result, whole, whole, DEFAULTS)
    assert not any("cut" in n for n in result.notes)


def test_a_text_cut_into_windows_gets_the_statistics_table_in_every_report(tmp_path, capsys):
    """A text file cut into 3 windows of 8 tokens: each window scores positions 4 to 6 (9 in all), and every report
    shows the statistics table per target with a note on so few positions, and report.html a picture of each
    target's KL distribution."""
    pytest.importorskip("transformers")
    from parity.cli import main
    from tests.inputs.test_text_windows import WORDS, _tokenizer

    _tokenizer(tmp_path / "tok", bos=True)
    (tmp_path / "text.txt").write_text(" ".join(WORDS * 2), encoding="utf-8")
    gpt2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32, "n_positions": 8}
    data = {"name": "lm", "seed": 0, "repeats": 1,
            "models": [{"name": "lm", "source": "transformers", "config": gpt2, "architecture": "AutoModelForCausalLM",
                        "task": "text-generation"}],
            "inputs": [{"name": "prose", "text_file": str(tmp_path / "text.txt"), "tokenizer": str(tmp_path / "tok"),
                        "n_ctx": 8, "windows": 3}],
            "targets": [{"backend": "eager", "dtype": "float64"},
                        {"backend": "tests.verify.test_text_generation:NegatedLogits", "name": "negated"}],
            "tiers": {"tasks": {"text-generation": {"new_tokens": 0}}}}
    import yaml

    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(data))
    main(["run", str(tmp_path / "lm.yaml"), "--out", str(tmp_path / "out")])
    console = capsys.readouterr().out
    import json

    records = [json.loads(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    tier3 = {r["target"]: r for r in records if r["kind"] == "check" and r["tier"] == 3}
    assert {r["metrics"]["positions"] for r in tier3.values()} == {9}
    assert tier3["negated"]["metrics"]["same_top1"] == 0.0 and tier3["negated"]["kld_histogram"]["counts"]
    assert any("only 9 scored positions" in n for n in tier3["negated"]["notes"])
    from parity.inputs.text import load_tokenizer

    ids = load_tokenizer(tmp_path / "tok")(" ".join(WORDS * 2))["input_ids"]  # the windows' ids, BOS first in each
    assert tier3["negated"]["token_ids"] == [[ids[0], *ids[8 * i + 1:8 * i + 8]] for i in range(3)]
    markdown = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    for shown in (console, markdown, html):
        assert "PPL(target)/PPL(reference)" in shown and "mean KLD" in shown and "same top p" in shown
    assert "KL divergence per position, negated" in html


def test_a_statistic_without_a_value_prints_nan_never_none():
    """A record keeps NaN as null (JSON has no NaN): the table prints it as `nan`."""
    from parity.verify.tasks.text_generation import statistics_rows

    m = evaluate(_logits([1.0, 0.0], [0.0, 1.0]), _logits([1.0, 0.0], [0.0, 1.0]), DEFAULTS, 1e-4).metrics
    recorded = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()}
    rows = dict(statistics_rows(recorded, DEFAULTS.model_dump()))
    assert rows["PPL(target)"] == "nan ± nan" and rows["mean Δp"] == "nan ± nan %"
    assert not any("None" in v for v in rows.values())


def test_the_table_says_which_flips_were_judged_from_the_thresholds_it_was_judged_at():
    """The record's thresholds as written (this task's own), the flat set of every task's that records before tasks
    were plugins hold, and one edited by hand (the defaults): the top-1 row says which flips it counted."""
    from parity.verify.tasks.text_generation import statistics_rows

    m = evaluate(_logits([1.0, 0.0]), _logits([1.0, 0.0]), DEFAULTS, 1e-4).metrics
    label = lambda thresholds: next(k for k, _ in statistics_rows(m, thresholds) if k.startswith("top-1"))  # noqa: E731
    assert label(DEFAULTS.model_dump()) == "top-1 agreement (judged: real flips only)"
    assert label({**DEFAULTS.model_dump(), "count_near_ties": True}) == "top-1 agreement (judged: every flip)"
    assert label({"count_near_ties": True, "detection_iou": 0.5, "miou": 0.9}) == "top-1 agreement (judged: every flip)"
    assert label({"count_near_ties": "yes", "kl_mean": -1}) == "top-1 agreement (judged: real flips only)"


def test_the_kl_leaves_out_reference_tokens_below_minus_16_as_llama_cpp_does():
    """The reference puts 0.4% of its mass on 100,000 tokens of log probability about -17 (below perplexity.cpp's
    floor of -16), the target is uniform: the KL is the kept token's term alone, 0.02 above the full sum."""
    ref = torch.full((1, 1, 100_001), -17.0, dtype=torch.float64)
    ref[0, 0, 0] = 0.0
    tgt = torch.zeros_like(ref)
    m = evaluate({"logits": ref}, {"logits": tgt}, DEFAULTS, 1e-4).metrics
    log_p, log_q = ref.log_softmax(-1)[0, 0], tgt.log_softmax(-1)[0, 0]
    kept = float(log_p[0].exp() * (log_p[0] - log_q[0]))
    full = float((log_p.exp() * (log_p - log_q)).sum())
    assert m["kl_mean"] == pytest.approx(kept) and abs(kept - full) > 0.01
