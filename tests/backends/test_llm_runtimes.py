"""The LLM runtimes' targets, ONNX Runtime GenAI (backends/ortgenai.py) and optimum-intel's OpenVINO export
(backends/openvino_llm.py), on tiny seeded LLaMA, Qwen2 and GPT-2 decoders written in the test as Hugging Face
folders: each gives a verdict with tier 3's statistics, decodes through its cache (`CachedDecoding`), catches a fault
constructed in its own artifact, and says in one line why it cannot export what it cannot.

Tests that need a runtime skip with the reason when it is absent (pip install 'parity[onnxruntime-genai]',
'parity[optimum-openvino]'); the GenAI worker's crash needs neither.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from parity import taxonomy as tx
from parity.api import run_experiment
from parity.backends.base import CachedDecoding
from parity.backends.openvino_llm import OptimumOpenVinoBackend, group_size_problem
from parity.backends.ortgenai import OrtGenAIBackend, _GenAIRuntime
from parity.config.schema import BackendSpec
from parity.inputs import Inputs

# Why each runtime cannot run here (not installed, or optimum-intel beside a transformers it does not take), or None
GENAI_MISSING = OrtGenAIBackend.available(BackendSpec(backend="onnxruntime-genai"))
OPTIMUM_MISSING = OptimumOpenVinoBackend.available(BackendSpec(backend="optimum-openvino",
                                                               quantize={"scheme": "nncf-int8"}))
HAS_GENAI, HAS_OPTIMUM = GENAI_MISSING is None, OPTIMUM_MISSING is None
NEEDS_GENAI = pytest.mark.skipif(not HAS_GENAI, reason=str(GENAI_MISSING))
NEEDS_OPTIMUM = pytest.mark.skipif(not HAS_OPTIMUM, reason=str(OPTIMUM_MISSING))
VOCAB, LENGTH = 100, 24
SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "bos_token_id": 0,
         "eos_token_id": 1, "tie_word_embeddings": False}
CONFIGS = {
    "llama": {"model_type": "llama", **SMALL},
    "qwen2": {"model_type": "qwen2", **SMALL},
    "gpt2": {"model_type": "gpt2", "vocab_size": VOCAB, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128,
             "bos_token_id": 0, "eos_token_id": 1},
}


def _decoder(kind: str, seed: int = 0):
    """A seeded tiny causal LM of `kind`, its weights drawn wider than transformers' init (std 0.02 makes every
    next-token distribution nearly uniform, where any rounding flips the top-1)."""
    import transformers

    config = transformers.AutoConfig.for_model(**CONFIGS[kind])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15 if "emb" in name or "wte" in name or "wpe" in name else 0.08)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("decoders")
    for kind in CONFIGS:
        _decoder(kind).save_pretrained(root / kind)
    return {kind: root / kind for kind in CONFIGS}


def _experiment(folder: Path, targets: list[dict]) -> dict:
    tokens = {"input_ids": {"shape": [1, LENGTH], "dtype": "int64", "distribution": "randint", "low": 2, "high": VOCAB}}
    return {"name": "llm", "seed": 0, "repeats": 1,
            "models": [{"name": "m", "source": "transformers", "path": str(folder), "architecture": "AutoModelForCausalLM",
                        "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": tokens}],
            "targets": targets,
            "tiers": {"tasks": {"text-generation": {"new_tokens": 4, "top1_agreement": 0.9, "kl_mean": 0.05}}}}


def _tier3(records) -> dict[str, dict]:
    return {r["target"]: r for r in records if r["kind"] == "check" and r["tier"] == 3}


RUNTIMES = [pytest.param("onnxruntime-genai", {}, marks=NEEDS_GENAI, id="genai-fp32"),
            pytest.param("onnxruntime-genai", {"quantize": {"scheme": "ortgenai-int4"}}, marks=NEEDS_GENAI, id="genai-int4"),
            pytest.param("optimum-openvino", {}, marks=NEEDS_OPTIMUM, id="openvino-fp32"),
            pytest.param("optimum-openvino", {"quantize": {"scheme": "nncf-int8"}}, marks=NEEDS_OPTIMUM, id="openvino-int8"),
            pytest.param("optimum-openvino", {"quantize": {"scheme": "nncf-int4"}, "options": {"group_size": 16}},
                         marks=NEEDS_OPTIMUM, id="openvino-int4")]


def _available(target: dict) -> bool:
    return {"onnxruntime-genai": HAS_GENAI, "optimum-openvino": HAS_OPTIMUM}[target["backend"]]


GENAI_FP32 = {"backend": "onnxruntime-genai"}
GENAI_INT4 = {"backend": "onnxruntime-genai", "quantize": {"scheme": "ortgenai-int4"}}
OV_FP32 = {"backend": "optimum-openvino"}
OV_INT8 = {"backend": "optimum-openvino", "quantize": {"scheme": "nncf-int8"}}
OV_INT4 = {"backend": "optimum-openvino", "quantize": {"scheme": "nncf-int4"}, "options": {"group_size": 16}}
# Each config on the targets that export it (one export each: the exports are the slow part), GPT-2 on ONNX Runtime
# GenAI too, whose builder has no exporter for it.
CASES = {"llama": [GENAI_FP32, GENAI_INT4, OV_FP32], "qwen2": [GENAI_FP32, OV_INT8], "gpt2": [GENAI_FP32, OV_INT4]}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_runtime_gives_a_verdict_with_the_tier3_statistics(kind, folders, tmp_path):
    """Every target whose runtime is here has a tier-1 and a tier-3 verdict, and tier 3's teacher-forced statistics
    (KL, top-1 agreement, perplexity ratio) and free-running continuation: float32 passes; a quantized target has
    its statistics. GPT-2 on ONNX Runtime GenAI is `unsupported_op` in one line naming the builder."""
    targets = [t for t in CASES[kind] if _available(t)]
    if not targets:
        pytest.skip("neither onnxruntime-genai nor optimum-intel is installed")
    records = run_experiment(_experiment(folders[kind], targets), out=tmp_path / "out")
    executions = {r["backend"]: r for r in records if r["kind"] == "execution"}
    tier3 = _tier3(records)
    for target in targets:
        target_id = BackendSpec(**target).id
        if kind == "gpt2" and target["backend"] == "onnxruntime-genai":
            failed = executions[target_id]
            assert failed["failure_class"] == tx.UNSUPPORTED_OP
            assert "model builder cannot export GPT2LMHeadModel" in failed["error"].splitlines()[0]
            continue
        check = tier3[target_id]
        statistics = check["metrics"]
        assert {"kl_mean", "top1_agreement"} <= set(statistics), statistics
        if "quantize" not in target:
            assert check["passed"], statistics
            assert statistics["kl_mean"] < 1e-6 and statistics["top1_agreement"] == 1.0


@pytest.mark.parametrize("target", [pytest.param(GENAI_FP32, marks=NEEDS_GENAI, id="onnxruntime-genai"),
                                    pytest.param({**GENAI_FP32, "options": {"in_process": True}}, marks=NEEDS_GENAI,
                                                 id="onnxruntime-genai-in-process"),
                                    pytest.param(OV_FP32, marks=NEEDS_OPTIMUM, id="optimum-openvino")])
def test_cached_decoding_through_the_runtimes_own_cache(target):
    """`decode` is the runtime's own prefill and steps through its KV cache: teacher-forced, each step's logits are the
    reference's uncached logits at that position; free-running, it picks what the reference's greedy loop picks. In the
    worker process or in this one (`in_process`), each reply's header read into its typed value alike."""
    from parity.backends import backend_class

    model = _decoder("llama")
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    backend = backend_class(target["backend"])(BackendSpec(**target))
    assert isinstance(backend, CachedDecoding)
    try:
        backend.prepare(copy.deepcopy(model), Inputs((), {"input_ids": ids}))
        with torch.no_grad():
            expected = model(ids).logits
        forced = backend.decode(ids[:, :5], 7, forced=ids[:, 5:])
        assert forced.tokens.tolist() == ids[:, 5:].tolist()
        torch.testing.assert_close(forced.logits, expected[:, 4:11], atol=1e-4, rtol=1e-4)
        greedy = backend.decode(ids[:, :5], 4)
        buffer = ids[:, :5]
        with torch.no_grad():
            for _ in range(4):
                buffer = torch.cat([buffer, model(buffer).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert greedy.tokens.tolist() == buffer[:, 5:].tolist()
    finally:
        backend.close()


class PerturbedOrtGenAI(OrtGenAIBackend):
    """ONNX Runtime GenAI whose artifact has one weight changed after the builder wrote it (the second layer's attention
    output projection, its sign flipped): what a faulty export or a damaged file holds."""

    def _build(self, model, folder):
        import onnx
        from onnx import numpy_helper

        super()._build(model, folder)
        graph = onnx.load(folder / "model.onnx")
        [weight] = [w for w in graph.graph.initializer if w.name == "model.layers.1.attn.o_proj.MatMul.weight"]
        weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
        (folder / "model.onnx.data").unlink()
        onnx.save(graph, folder / "model.onnx", save_as_external_data=True, location="model.onnx.data")


class PerturbedOpenVino(OptimumOpenVinoBackend):
    """optimum-intel's OpenVINO export with the same weight's sign flipped in its IR after the export wrote it."""

    def _build(self, model, folder):
        import openvino as ov
        from openvino import op

        super()._build(model, folder)
        ir = ov.Core().read_model(folder / "openvino_model.xml")
        [weight] = [c for c in ir.get_ops() if c.get_type_name() == "Constant"
                    and "layers.1.self_attn.o_proj.weight" in c.get_friendly_name()]
        scaled = op.Constant(-weight.get_data())
        for consumer in weight.output(0).get_target_inputs():
            consumer.replace_source_output(scaled.output(0))
        ov.save_model(ir, folder / "perturbed.xml", compress_to_fp16=False)
        del ir
        for suffix in (".xml", ".bin"):
            (folder / f"perturbed{suffix}").replace(folder / f"openvino_model{suffix}")


@pytest.mark.parametrize("backend", [pytest.param("PerturbedOrtGenAI", marks=NEEDS_GENAI),
                                     pytest.param("PerturbedOpenVino", marks=NEEDS_OPTIMUM)])
def test_a_weight_changed_in_the_exported_artifact_fails_both_tiers(backend, folders, tmp_path):
    """A float32 target whose artifact holds one weight with its sign flipped fails tier 1 (numeric drift) and tier 3's
    statistics, where the same runtime's untouched export passes (test above)."""
    records = run_experiment(_experiment(folders["llama"], [{"backend": f"tests.backends.test_llm_runtimes:{backend}"}]),
                             out=tmp_path / "out")
    checks = {r["tier"]: r for r in records if r["kind"] == "check"}
    assert checks[1]["passed"] is False and checks[1]["failure_class"] == tx.NUMERIC_DRIFT
    assert checks[3]["passed"] is False and checks[3]["metrics"]["kl_mean"] > 0.05


class Conv1D(torch.nn.Module):
    """transformers' GPT-2 linear layer by its class name: its weight is [in, out]."""

    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(width_in, width_out))


def test_a_group_size_that_divides_no_width_names_one_that_does():
    """SmolLM2-135M's widths (576, 1536) do not divide by nncf-int4's default 128: the words name the widths it
    misses and 64, which divides both; a GPT-2 Conv1D's width is its weight's first axis."""
    model = torch.nn.Sequential(torch.nn.Linear(576, 1536), torch.nn.Linear(1536, 576), Conv1D(576, 8))
    assert group_size_problem(model, 128) == (
        "nncf-int4's group_size 128 does not divide the input width of each of the model's linear layers (576 of the "
        "widths 576, 1536): set options: {group_size: 64} (the largest power of two below 128 that divides every "
        "width) or {group_size: -1} (one group per channel)")
    assert "{group_size: 32}" in group_size_problem(torch.nn.Sequential(Conv1D(96, 8), torch.nn.Linear(64, 8)), 128)
    assert "a group size that divides them" in group_size_problem(torch.nn.Sequential(torch.nn.ReLU()), 128)


@NEEDS_OPTIMUM
def test_nncf_int4_at_a_group_size_the_model_refuses_says_which_to_set(folders, tmp_path):
    """The tiny decoder's widths are 64 and 128: nncf-int4 at its default group size (128) is refused by NNCF, and
    the execution's error is parity's one line naming the option to set, not NNCF's traceback."""
    target = {"backend": "optimum-openvino", "quantize": {"scheme": "nncf-int4"}}
    records = run_experiment(_experiment(folders["llama"], [target]), out=tmp_path / "out")
    failed = [r for r in records if r["kind"] == "execution" and r["status"] == "error"]
    assert len(failed) == 1, failed
    assert failed[0]["failure_class"] == tx.BACKEND_ERROR
    assert failed[0]["error"].startswith(
        "ParityError: target optimum-openvino-cpu-int4-nncf: nncf-int4's group_size 128 does not divide the input "
        "width of each of the model's linear layers (64 of the widths 64, 128): set options: {group_size: 64} (the "
        "largest power of two below 128 that divides every width) or {group_size: -1} (one group per channel)")


@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_a_request_the_genai_worker_does_not_know_is_the_runtimes_error(in_process):
    """An op the worker script has no request for is the backend's error in one line, from the worker process and
    from the script run in this process alike (needs no runtime: nothing is loaded)."""
    runtime = _GenAIRuntime(in_process=in_process)
    try:
        with pytest.raises(RuntimeError, match=r"^ONNX Runtime GenAI: ValueError: unknown request 'nope'$"):
            runtime.request({"op": "nope"})
    finally:
        runtime.close()


class AbortingOrtGenAI(OrtGenAIBackend):
    """ONNX Runtime GenAI whose worker aborts when it runs, as a failed assertion in C++ does."""

    @classmethod
    def available(cls, spec):
        return None

    def prepare(self, model, example):
        self.runtime = _GenAIRuntime(in_process=False)

    def run(self, inputs):
        return self.runtime.request({"op": "abort"})


def test_an_abort_in_the_genai_worker_is_a_crash_verdict_and_the_run_goes_on(folders, tmp_path):
    """The worker's SIGABRT is that target's `crash`, said with the signal; the next target still gets its verdict
    (needs neither runtime: the worker imports onnxruntime_genai only to load a model)."""
    targets = [{"backend": "tests.backends.test_llm_runtimes:AbortingOrtGenAI"}, {"backend": "eager", "dtype": "float64"}]
    records = run_experiment(_experiment(folders["llama"], targets), out=tmp_path / "out")
    crashed = [r for r in records if r["kind"] == "execution" and r["status"] == "error"]
    assert [(r["failure_class"], "died of SIGABRT" in r["error"]) for r in crashed] == [(tx.CRASH, True)]
    assert any(r["kind"] == "check" and r["target"] == "eager-cpu-float64" and r["passed"] for r in records)


def test_the_targets_ids_read_back_and_their_quantization_options_need_a_scheme():
    """Each quantized target's id is typed back by the target grammar, its short form too (`-int4` among the schemes
    that backend runs, though eager's torchao-int4-weight shares the word); a quantization option without
    `quantize:` is refused in one line naming what to add."""
    from parity.experiment.targets import parse_target

    assert BackendSpec(**GENAI_INT4).id == "onnxruntime-genai-cpu-int4-block"
    assert parse_target("onnxruntime-genai-cpu-int4-block").scheme == "ortgenai-int4"
    assert parse_target("onnxruntime-genai-int8").scheme == "ortgenai-int8"
    assert parse_target("optimum-openvino-int4").scheme == "nncf-int4"
    assert parse_target("eager-int4").scheme == "torchao-int4-weight"
    assert BackendSpec(**OV_INT8).id == "optimum-openvino-cpu-int8-nncf"
    problem = OrtGenAIBackend.spec_problem(BackendSpec(backend="onnxruntime-genai", options={"block_size": 64}))
    assert problem == ("target onnxruntime-genai-cpu: block_size set the model builder's weight quantization: give "
                       "quantize: {scheme: ortgenai-int4} (or ortgenai-int8) with them")
    problem = OptimumOpenVinoBackend.spec_problem(BackendSpec(backend="optimum-openvino", options={"group_size": 64}))
    assert problem.startswith("target optimum-openvino-cpu: group_size set NNCF's weight compression")
    assert OptimumOpenVinoBackend.spec_problem(BackendSpec(backend="optimum-openvino", options={"group_size": 64},
                                                           quantize={"scheme": "nncf-int4"})) is None


class _Decoder:
    """A backend whose `decode` continues every prompt with 7, 8, 9, ... and whose `run` must not be called."""

    def run(self, inputs):
        raise AssertionError("the continuation re-ran the whole buffer")

    def decode(self, prompt, steps, forced=None):
        from parity.backends.base import Decoded

        logits = torch.zeros(prompt.shape[0], steps, VOCAB)
        logits[:, torch.arange(steps), 7 + torch.arange(steps)] = 5.0
        return Decoded(7 + torch.arange(steps).repeat(prompt.shape[0], 1), logits)


def test_a_cached_decoder_continues_through_its_own_cache():
    """Tier 3's free-running continuation of a CachedDecoding backend is its `decode` of the same prompt (a prefill and
    steps through its cache), not `new_tokens` runs of the whole buffer."""
    from parity.verify.tasks.text_generation import generate

    ids = torch.arange(2, 14).reshape(2, 6)
    out = generate(_Decoder().run, Inputs((), {"input_ids": ids}), 3)
    assert out.tokens == [[7, 8, 9], [7, 8, 9]] and out.prompts == [[2, 3, 4], [8, 9, 10]]
    assert len(out.margins[0]) == 3 and out.margins[0][0] > 0.5
