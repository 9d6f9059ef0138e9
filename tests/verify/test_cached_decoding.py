"""Text generation's cached decoding (#38): a prefill and decode steps through the KV cache on every torch target
(`CachedDecoding`), teacher-forced on the text and compared step by step with the reference's, and the reference's
with its own uncached forward. The cache bug is constructed (tests/fixtures/decoders.py): the rotary position of
each cached step off by one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.backends.base import CachedDecoding
from parity.backends.eager import EagerBackend
from parity.config.tolerances import Tolerance
from parity.execute.follow_up import FollowUpRaised
from parity.inputs import Inputs
from parity.verify.tasks.text_generation import (
    TextGenerationThresholds,
    compare_caches,
    decode_cached,
    evaluate,
    judge_cached,
    scores_of,
)

pytest.importorskip("transformers")

from tests.fixtures.decoders import VOCABULARY, OffByOneCache, decoder, shifted_llama  # noqa: E402

DEFAULTS = TextGenerationThresholds()
STEPS = 4
FLOAT32 = Tolerance(sweep=(1e-4,), rtol=1e-5, gate=1e-4)  # the caches are judged at the target's tolerance


def _backend(cls, model, dtype: str = "float32"):
    from parity.config.schema import BackendSpec

    backend = cls(BackendSpec(backend="eager", dtype=dtype))
    backend.prepare(model, _inputs())
    return backend


def _inputs(batch: int = 2, length: int = 10) -> Inputs:
    ids = torch.randint(0, VOCABULARY, (batch, length), generator=torch.Generator().manual_seed(1))
    return Inputs((), {"input_ids": ids})


def _judged(reference, target):
    inputs = _inputs()
    result = evaluate(reference.run(inputs), target.run(inputs), DEFAULTS, 1e-4, inputs=inputs)
    return judge_cached(result, decode_cached(reference, inputs, STEPS), decode_cached(target, inputs, STEPS),
                        DEFAULTS, FLOAT32)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_eager_decodes_through_the_cache_as_its_uncached_forward_computes(kind):
    """Each step's logits are those of the uncached forward over the prompt and the tokens fed so far (greedy: its
    own argmax fed back), and teacher forcing feeds the forced tokens; a LLaMA, a Qwen2 and a GPT-2 decoder."""
    eager = _backend(EagerBackend, decoder(kind))
    assert isinstance(eager, CachedDecoding)
    prompt = _inputs().kwargs["input_ids"][:, :5]
    greedy = eager.decode(prompt, 3)
    whole = torch.cat([prompt, greedy.tokens], 1)
    uncached = scores_of(eager.run(Inputs((), {"input_ids": whole})))[:, 4:7].float()
    assert greedy.logits.shape == (2, 3, VOCABULARY) and greedy.logits.dtype == torch.float32
    torch.testing.assert_close(greedy.logits, uncached, atol=1e-5, rtol=1e-5)
    assert torch.equal(greedy.tokens, greedy.logits.argmax(-1))
    forced = torch.zeros(2, 3, dtype=torch.long)
    assert torch.equal(eager.decode(prompt, 3, forced).tokens, forced)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_a_bfloat16_target_gets_a_cached_verdict(kind):
    """The reference in float32, the target in bfloat16: both decode, and the record has the cached path's verdict
    with its statistics beside the teacher-forced ones (the thresholds loose: bfloat16's own drift is not judged)."""
    model = decoder(kind)
    loose = TextGenerationThresholds(kl_mean=1.0, top1_agreement=0.0)
    reference, target = _backend(EagerBackend, model), _backend(EagerBackend, decoder(kind), "bfloat16")
    inputs = _inputs()
    result = evaluate(reference.run(inputs), target.run(inputs), loose, 1e-4, inputs=inputs)
    cached = judge_cached(result, decode_cached(reference, inputs, STEPS), decode_cached(target, inputs, STEPS),
                          loose, FLOAT32)[1]
    assert cached.passed and cached.steps == STEPS and cached.prompt_tokens == 10 - STEPS
    assert cached.target.positions == 2 * STEPS and cached.target.max_abs > 0  # bfloat16 drifts
    assert cached.reference_self.max_abs < 1e-4


def test_an_off_by_one_rotary_offset_fails_the_cached_check_and_passes_the_uncached_one():
    """The target's decode steps read their rotary position one too far: the teacher-forced (uncached) statistics
    agree exactly, the cached decoding fails against the reference's, charged to the target, and the target's cached
    decoding differs from its own uncached forward (its cache path), while the reference's matches its own."""
    reference, target = _backend(EagerBackend, decoder()), _backend(OffByOneCache, decoder())
    result, cached = _judged(reference, target)
    assert result.metrics["kl_mean"] == 0.0 and result.metrics["top1_agreement"] == 1.0  # uncached: the same
    assert not cached.passed and cached.side == "target" and cached.failure_class == "decision_flip"
    assert cached.target.kl_mean > DEFAULTS.kl_mean and cached.target_self.kl_mean > DEFAULTS.kl_mean
    assert cached.reference_self.kl_mean < 1e-9
    assert "its cache path" in cached.detail
    assert not result.passed and result.detail.startswith("cached decoding: the target's cached decoding")
    fine, cached = _judged(reference, _backend(EagerBackend, decoder()))
    assert fine.passed and cached.passed and cached.target.max_abs == 0.0


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_kv_caches_are_compared_layer_by_layer_and_name_where_the_target_s_first_differs(kind):
    """Both sides' caches at the end of the decoding, keys and values apart, at the target's tolerance. The off-by-one
    position of a LLaMA decode step moves the rotary angle of its keys only: layer 0's keys differ and its values
    agree exactly (they read no position), layer 1's both (it reads layer 0's output); GPT-2's position embedding
    row enters the block's input, so layer 0's keys and values both differ. A correct target's caches agree."""
    reference = _backend(EagerBackend, decoder(kind))
    _, cached = _judged(reference, _backend(OffByOneCache, decoder(kind)))
    cache = cached.cache
    assert len(cache.layers) == 2 and cache.first_layer == 0
    first, second = cache.layers
    assert second.keys.exceeds and second.values.exceeds
    if kind == "llama":
        assert cache.first_parts == ["keys"] and first.keys.exceeds and first.keys.rel_rmse > 0.01
        assert first.values.max_abs == 0.0 and not first.values.exceeds
    else:
        assert cache.first_parts == ["keys", "values"] and first.keys.exceeds and first.values.exceeds
    _, fine = _judged(reference, _backend(EagerBackend, decoder(kind)))
    assert fine.cache.first_layer is None and fine.cache.error is None
    assert all(not (e.exceeds or e.max_abs) for layer in fine.cache.layers for e in (layer.keys, layer.values))


def test_a_cache_not_exposed_is_said_and_each_cache_is_judged_at_the_target_s_gate():
    """A runtime that keeps its cache in its own process (ONNX Runtime GenAI, OpenVINO, llama.cpp: `Decoded.cache`
    None) is not compared, and says so; a difference within the gate does not exceed it, one beyond it does, and a
    scale-aware gate (a quantized target's) is made an atol of each tensor's own RMS."""
    from dataclasses import replace

    reference = decode_cached(_backend(EagerBackend, decoder()), _inputs(), STEPS)
    hidden = judge_cached(evaluate(_logits(), _logits(), DEFAULTS, 1e-4), reference, replace(reference, cache=None),
                          DEFAULTS, FLOAT32)[1]
    assert hidden.passed and hidden.cache.layers is None
    assert hidden.cache.error.startswith("the target: its runtime does not expose its KV cache")
    nudged = tuple((keys + 1e-5, values + (1e-3 if i == 1 else 0.0)) for i, (keys, values) in enumerate(reference.cache))
    cache = compare_caches(reference.cache, nudged, FLOAT32)
    assert [(layer.keys.exceeds, layer.values.exceeds) for layer in cache.layers] == [(False, False), (False, True)]
    assert cache.first_layer == 1 and cache.first_parts == ["values"]
    assert cache.layers[0].keys.required_atol == pytest.approx(1e-5, rel=0.2)
    scaled = compare_caches(reference.cache, nudged, replace(FLOAT32, relative=0.01))  # a gate 1% of each tensor's RMS
    assert scaled.first_layer is None and min(layer.values.rel_rmse for layer in scaled.layers) == 0.0


def test_a_follow_up_that_raised_gives_no_continuation_and_no_cached_verdict():
    """execute/follow_up.py keeps what a follow-up raised as `FollowUpRaised`: judged, that side has no continuation
    (the record's generation says why) and the cached decoding is not compared (no `cached` field), as before."""
    from parity.verify.tasks.text_generation import TASK, follow

    eager = _backend(EagerBackend, decoder())
    inputs = _inputs()
    result = evaluate(eager.run(inputs), eager.run(inputs), DEFAULTS, 1e-4, inputs=inputs)
    followed = follow(eager, inputs, STEPS)
    judged, fields = TASK.judge_follow_ups(result, followed, FollowUpRaised("RuntimeError: boom"), DEFAULTS, None, None,
                                           FLOAT32)
    assert list(fields) == ["generation"] and fields["generation"].error == "the target: RuntimeError: boom"
    assert judged.passed
    _, both = TASK.judge_follow_ups(result, followed, followed, DEFAULTS, None, None, FLOAT32)
    assert list(both) == ["generation", "cached"] and both["cached"].passed and both["generation"].exact_match == 1.0


def _logits():
    return {"logits": torch.zeros(1, 2, 3)}


def test_a_cached_record_keeps_the_key_order_its_records_had_before_it_was_typed():
    """`cached` written from the CachedDecodingCheck model has its keys in the order the dict it replaced wrote them
    (side before failure_class), the cache comparison added last: a records.jsonl line compared with an older run's
    differs only by what is new."""
    _, cached = _judged(_backend(EagerBackend, decoder()), _backend(OffByOneCache, decoder()))
    assert list(cached.model_dump(exclude_unset=True)) == [
        "prompt_tokens", "steps", "passed", "side", "failure_class", "detail", "target", "reference_self",
        "target_self", "cache"]


def test_a_cache_bug_in_the_reference_is_charged_to_the_reference():
    """The same bug in the model: every side has it, so the target agrees with the reference, and the reference's
    cached decoding against its own uncached forward is what fails."""
    reference, target = _backend(EagerBackend, shifted_llama()), _backend(EagerBackend, shifted_llama())
    result, cached = _judged(reference, target)
    assert not cached.passed and cached.side == "reference"
    assert cached.target.kl_mean == 0.0 and cached.reference_self.kl_mean > DEFAULTS.kl_mean
    assert "the reference's cached decoding against its own uncached forward" in result.detail


def test_a_target_that_cannot_run_the_cache_says_why_in_one_line_as_unsupported_op():
    """A backend without CachedDecoding (torchscript runs a trace captured without the cache) and a model without a
    cache (its forward takes no cache argument) are one class: unsupported_op, with the reason in one line."""
    from parity.backends.torchscript import TorchScriptBackend

    assert not isinstance(TorchScriptBackend.__new__(TorchScriptBackend), CachedDecoding)
    traced = decode_cached(TorchScriptBackend.__new__(TorchScriptBackend), _inputs(), STEPS)
    plain = torch.nn.Sequential(torch.nn.Embedding(VOCABULARY, 8), torch.nn.Linear(8, VOCABULARY))
    no_cache = decode_cached(_backend(EagerBackend, _KeywordIds(plain)), _inputs(), STEPS)
    for found in (traced, no_cache):
        assert found.failure_class == "unsupported_op" and "\n" not in found.error
    assert "torchscript" in traced.error and "no KV cache" in no_cache.error
    result = evaluate({"logits": torch.zeros(1, 2, 3)}, {"logits": torch.zeros(1, 2, 3)}, DEFAULTS, 1e-4)
    reference = decode_cached(_backend(EagerBackend, decoder()), _inputs(), STEPS)
    judged, cached = judge_cached(result, reference, traced, DEFAULTS, FLOAT32)
    assert cached.model_dump(exclude_unset=True) == {
        "failure_class": "unsupported_op", "side": "target", "error": f"the target: {traced.error}"}
    assert list(cached.model_dump(exclude_unset=True)) == ["side", "error", "failure_class"]  # as records had it
    assert judged.passed  # not compared is said, not failed: the uncached statistics judge the target
    from parity.report.console import cached_line

    record = SimpleNamespace(cached=cached)
    assert cached_line(record) == f"cached decoding: not compared (unsupported_op: the target: {traced.error})"


class _KeywordIds(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids):
        return {"logits": self.inner(input_ids)}


@pytest.mark.parametrize("backend", ["export", "torchscript"])
def test_a_cache_among_the_outputs_is_unsupported_op_on_every_exporting_target(backend):
    """`params: {use_cache: true}` puts the DynamicCache among a decoder's outputs: torch.export (its AOTAutograd
    trace raises) and the TorchScript tracer both refuse it while preparing, one class on both (it was backend_error
    on export, unsupported_op elsewhere)."""
    from parity import taxonomy as tx
    from parity.backends import backend_class
    from parity.config.schema import BackendSpec

    model = decoder()
    model.config.use_cache = True
    target = backend_class(backend)(BackendSpec(backend=backend))
    with pytest.raises(Exception) as caught:
        target.prepare(model, _inputs())
    assert tx.classify_exception(caught.value, tx.PREPARE) == tx.UNSUPPORTED_OP


def test_a_run_records_the_cached_verdict_and_every_report_prints_it(tmp_path):
    """End to end on a tiny LLaMA: the off-by-one target passes tier 1 and fails tier 3 on its cached decoding only
    (decoded in the execution, after its timed runs); the records validate and report.md prints the cached line."""
    from parity.api import run_experiment
    from tests.fixtures.decoders import CONFIGS

    data = {"name": "lm", "seed": 0, "repeats": 1,
            "models": [{"name": "lm", "source": "transformers", "config": CONFIGS["llama"],
                        "architecture": "AutoModelForCausalLM", "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": {
                "input_ids": {"shape": [2, 10], "dtype": "int64", "distribution": "randint", "high": VOCABULARY}}}],
            "targets": [{"backend": "tests.fixtures.decoders:OffByOneCache", "name": "off-by-one"}],
            "tiers": {"tasks": {"text-generation": {"new_tokens": STEPS}}}}
    records = run_experiment(data, out=tmp_path / "out")
    checks = {(r["tier"], r["target"]): r for r in records if r["kind"] == "check"}
    assert checks[1, "off-by-one"]["passed"]
    shifted = checks[3, "off-by-one"]
    assert not shifted["passed"] and shifted["detail"].startswith("cached decoding:")
    assert shifted["cached"]["side"] == "target" and shifted["cached"]["target"]["first_flip"] >= 1  # not the prefill
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"cached decoding, {STEPS} steps after a {10 - STEPS}-token prompt: fails (target)" in report
    assert shifted["cached"]["cache"]["first_layer"] == 0 and shifted["cached"]["cache"]["first_parts"] == ["keys"]
    assert "its cache first differs at layer 0's keys (values agree)" in report
