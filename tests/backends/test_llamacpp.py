"""The GGUF source and the llama.cpp backend, on a tiny seeded LLaMA written to a GGUF file in the test
(tests/fixtures/gguf_files.py): transformers reads it, parity writes it back from the module, llama.cpp runs both.

Tests that need llama-cpp-python or the gguf package skip with the reason when they are absent (pip install
'parity[llamacpp]'); the worker's crash and the padded-batch refusal need neither.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from parity import taxonomy as tx
from parity.backends.llamacpp import LlamaCppBackend, _LlamaRuntime
from parity.backends.llm import token_ids
from parity.config.schema import BackendSpec
from parity.inputs import Inputs
from parity.taxonomy import WorkerDied

NEEDS_GGUF = pytest.mark.skipif(importlib.util.find_spec("gguf") is None or importlib.util.find_spec("transformers") is None,
                                reason="the gguf and transformers packages are not installed (pip install 'parity[llamacpp]')")
NEEDS_LLAMACPP = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                    reason="llama-cpp-python is not installed (pip install 'parity[llamacpp]')")
TEXTS = ["the cat sat on the mat and the dog ran", "in the garden there were three red roses"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is not installed (pip install 'parity[llamacpp]')")
    from tests.fixtures.gguf_files import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_model(tiny_gguf):
    from parity.models.sources.gguf import GGUF_FILE, load_gguf

    model = load_gguf(tiny_gguf, "AutoModelForCausalLM", {}).eval()
    object.__setattr__(model, GGUF_FILE, tiny_gguf)
    return model


def _ids(tiny_gguf, text: str) -> Inputs:
    from parity.inputs.text import make_text

    return make_text([text], tiny_gguf)


@NEEDS_GGUF
def test_the_source_reads_the_file_and_its_tokenizer(tiny_gguf, tiny_model):
    from parity.inputs.text import make_text

    assert type(tiny_model).__name__ == "LlamaForCausalLM"
    assert tiny_model.config.num_hidden_layers == 2 and tiny_model.config.num_key_value_heads == 2
    inputs = make_text(TEXTS[:1], tiny_gguf)
    assert inputs.texts == (TEXTS[0],) and len(inputs.pieces[0]) == inputs.kwargs["input_ids"].shape[1]
    assert "".join(inputs.pieces[0]) == TEXTS[0]  # each token's text, as its tokenizer writes it


@NEEDS_GGUF
def test_the_written_file_holds_the_modules_tensors(tiny_gguf, tiny_model, tmp_path):
    """parity's GGUF of the module holds, bit for bit, the float32 tensors of the file the module was read from:
    names, shapes and the query/key rows in llama.cpp's rotary order (transformers undid it when it read them)."""
    import gguf
    import numpy as np

    from parity.backends.llamacpp import write_gguf

    written = tmp_path / "w.gguf"
    write_gguf(tiny_model, tiny_gguf, written)
    source = {t.name: np.array(t.data) for t in gguf.GGUFReader(tiny_gguf).tensors}
    again = gguf.GGUFReader(written)
    assert sorted(t.name for t in again.tensors) == sorted(source)
    for t in again.tensors:
        np.testing.assert_array_equal(np.array(t.data), source[t.name], err_msg=t.name)
    kept = {f.name: f.contents() for f in again.fields.values() if f.name.startswith("tokenizer.")}
    assert kept["tokenizer.ggml.tokens"][:3] == gguf.GGUFReader(tiny_gguf).fields["tokenizer.ggml.tokens"].contents()[:3]


def test_a_padded_batch_is_refused_naming_what_to_do():
    ids = torch.ones(2, 5, dtype=torch.int64)
    mask = torch.ones(2, 5, dtype=torch.int64)
    assert token_ids(Inputs((), {"input_ids": ids, "attention_mask": mask}), "llama.cpp").shape == (2, 5)
    mask[1, 3:] = 0
    with pytest.raises(ValueError, match="no attention mask.*one token length"):
        token_ids(Inputs((), {"input_ids": ids, "attention_mask": mask}), "llama.cpp")


def test_a_dead_worker_is_a_crash():
    """An abort inside the worker process (what GGML_ASSERT does) raises WorkerDied naming the signal, which the
    taxonomy classes `crash`, and this process goes on."""
    runtime = _LlamaRuntime(in_process=False)
    try:
        with pytest.raises(WorkerDied, match="SIGABRT") as caught:
            runtime.request({"op": "abort"})
    finally:
        runtime.close()
    assert tx.classify_exception(caught.value, tx.RUN) == tx.CRASH
    assert tx.classify_exception(RuntimeError("llama.cpp: bad"), tx.RUN) == tx.BACKEND_ERROR


@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_a_request_the_worker_does_not_know_is_the_runtimes_error(in_process):
    """An op the worker script has no request for: its refusal, raised as the backend's error in one line, by the
    worker process and the in-process stand-in alike; in this process an abort is refused, not done."""
    runtime = _LlamaRuntime(in_process=in_process)
    try:
        with pytest.raises(RuntimeError, match=r"^llama.cpp: unknown request 'nope'$"):
            runtime.request({"op": "nope"})
        if in_process:
            with pytest.raises(RuntimeError, match="cannot abort"):
                runtime.request({"op": "abort"})
    finally:
        runtime.close()


class AbortingLlamaCpp(LlamaCppBackend):
    """llama.cpp's backend whose worker aborts when it runs, as llama.cpp does on a file it asserts on."""

    @classmethod
    def available(cls, spec):
        return None

    def prepare(self, model, example):
        self.runtime = _LlamaRuntime(in_process=False)

    def run(self, inputs):
        return self.runtime.request({"op": "abort"})


def test_an_abort_in_the_worker_is_the_targets_crash_verdict():
    from parity.execute.execution import execute

    spec = BackendSpec(backend="tests.backends.test_llamacpp:AbortingLlamaCpp")
    model = torch.nn.Linear(2, 2)
    [result] = [execute(spec, model, Inputs((torch.ones(1, 2),)), repeats=1)]
    assert (result.status, result.failure_class) == ("error", tx.CRASH)
    assert "died of SIGABRT" in result.error


@NEEDS_GGUF
@NEEDS_LLAMACPP
@pytest.mark.parametrize("target, limit", [({"options": {"gguf": "FILE"}}, 1e-3), ({}, 1e-3), ({"dtype": "float16"}, 0.05),
                                           ({"quantize": {"scheme": "llamacpp-Q8_0"}}, 0.2)],
                         ids=["file-as-it-is", "f32-written", "f16", "q8_0"])
def test_llamacpp_runs_the_reference_and_its_conversions(tiny_gguf, tiny_model, target, limit):
    """llama.cpp's logits for every position, [B, T, vocab] like transformers': close to the float32 module's on
    the file as it is and on parity's F32 file (a wrong tensor name or rotary order would be off by the logits'
    own scale), and on F16 and Q8_0 near them."""
    import copy

    if "options" in target:
        target = {"options": {"gguf": str(tiny_gguf)}}
    spec = BackendSpec(backend="llamacpp", **target)
    inputs = _ids(tiny_gguf, TEXTS[0])
    with torch.no_grad():
        expected = tiny_model(**inputs.kwargs).logits
    backend = LlamaCppBackend(spec)
    backend.prepare(copy.deepcopy(tiny_model), inputs)
    assert backend.runtime.process is not None  # llama.cpp in a worker process by default: an abort is not the run's
    try:
        got = backend.run(inputs)["logits"]
        again = backend.run(inputs)["logits"]  # a second call starts from an empty KV cache too
        ids = backend.tokenize([TEXTS[0]])
    finally:
        backend.close()
    assert got.dtype == torch.float32 and got.shape == expected.shape
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() < limit * max(scale, 1)
    assert ids == [inputs.kwargs["input_ids"][0].tolist()]


@NEEDS_GGUF
@NEEDS_LLAMACPP
def test_kept_groups_come_from_the_higher_conversion_and_run_as_it(tiny_gguf, tiny_model, monkeypatch):
    """A Q4_0 target keeping blk.1 and output at F32: those groups' tensors have the F32 file's type in the mixed file,
    the rest Q4_0; keeping every group runs the F32 conversion's tensors, so its logits are the F32 target's bit for
    bit (the mix copies raw tensor data, nothing is converted again). Each of the two conversions is parsed once for
    all the mixes (gguf-py's reader: most of a mix's time)."""
    import copy

    import gguf

    from parity.backends.llamacpp import group_of, tensor_groups

    parsed = []

    class Counted(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)

    inputs = _ids(tiny_gguf, TEXTS[0])
    spec = BackendSpec(backend="llamacpp", quantize={"scheme": "llamacpp-Q4_0"}, options={"keep": ["blk.1", "output"],
                                                                                       "keep_type": "F32"})
    backend, f32 = LlamaCppBackend(spec), LlamaCppBackend(BackendSpec(backend="llamacpp"))
    try:
        backend.prepare(copy.deepcopy(tiny_model), inputs)
        types = {g.name: g.type for g in tensor_groups(backend.path)}
        assert sorted(g.name for g in backend.tensor_groups()) == ["blk.0.attn", "blk.0.ffn", "blk.1.attn", "blk.1.ffn",
                                                                   "output", "token_embd"]
        assert {g: t for g, t in types.items() if t == "F32"} == {"output": "F32", "blk.1.attn": "F32", "blk.1.ffn": "F32"}
        assert types["blk.0.attn"] == types["blk.0.ffn"] == "Q4_0"
        assert group_of("blk.1.attn_norm.weight") is None and group_of("blk.10.ffn_up.weight") == "blk.10.ffn"
        every = backend.keep([g.name for g in backend.tensor_groups()], "F32")
        kept = backend.run(inputs)["logits"]
        f32.prepare(copy.deepcopy(tiny_model), inputs)
        assert every > backend.prepared.stat().st_size  # F32 tensors take more bytes than Q4_0's
        torch.testing.assert_close(kept, f32.run(inputs)["logits"], rtol=0, atol=0)
        backend.keep([], "F32")  # none kept: the Q4_0 file as prepared
        assert backend.path == backend.prepared
        mixed = [path for path in parsed if path != str(tiny_gguf)]  # the source is read by each conversion
        assert len(mixed) == len(set(mixed)) == 2 and str(backend.prepared) in mixed  # two mixes, two files read
    finally:
        backend.close()
        f32.close()


def test_a_keep_option_is_checked_when_the_experiment_is():
    assert "names no tensor group: blk.x" in LlamaCppBackend.spec_problem(
        BackendSpec(backend="llamacpp", options={"keep": ["blk.x"]}))
    assert "keep_type 'Q9'" in LlamaCppBackend.spec_problem(BackendSpec(backend="llamacpp", options={"keep_type": "Q9"}))
    assert LlamaCppBackend.spec_problem(BackendSpec(backend="llamacpp", options={"keep": ["blk.3.ffn", "token_embd"]})) is None


@NEEDS_LLAMACPP
def test_a_model_from_another_source_is_refused_by_name():
    spec = BackendSpec(backend="llamacpp")
    backend = LlamaCppBackend(spec)
    with pytest.raises(Exception, match="source: gguf"):
        backend.prepare(torch.nn.Linear(2, 2), Inputs((), {"input_ids": torch.ones(1, 3, dtype=torch.int64)}))


def test_a_failing_llamacpp_check_is_sent_to_localize_and_fallback_unless_it_runs_a_file_as_it_is():
    """A conversion parity makes is localized by its tensor groups (a decision flip too: they are judged by tier 3's
    KLD); a file run as it is has no conversion to take a group from, so the next steps name neither command."""
    from parity.report.next_steps import _capabilities

    converted, as_is = BackendSpec(backend="llamacpp", dtype="float16"), BackendSpec(backend="llamacpp", options={"gguf": "/m.gguf"})
    assert (_capabilities(converted), _capabilities(as_is)) == ((True, True, True), (False, True, False))
    assert _capabilities(BackendSpec(backend="eager")) == (True, False, False)
    assert _capabilities(BackendSpec(backend="no_such_module:Backend")) == (True, False, False)


@NEEDS_GGUF
@NEEDS_LLAMACPP
def test_llama_cpp_in_this_process_answers_as_its_worker_does(tiny_gguf, tiny_model):
    """`in_process: true` parses and handles each request with the worker script's own code: the same logits, ids and
    token texts as the worker process replies, each reply read into its typed header."""
    import copy

    inputs = _ids(tiny_gguf, TEXTS[0])
    answers = []
    for in_process in (False, True):
        backend = LlamaCppBackend(BackendSpec(backend="llamacpp", options={"gguf": str(tiny_gguf), "in_process": in_process}))
        backend.prepare(copy.deepcopy(tiny_model), inputs)
        assert (backend.runtime.process is None) == in_process
        try:
            ids = backend.tokenize(TEXTS)
            answers.append((backend.run(inputs)["logits"], ids, backend.token_texts(ids[0])))
        finally:
            backend.close()
    (logits, ids, pieces), (local_logits, local_ids, local_pieces) = answers
    torch.testing.assert_close(local_logits, logits, rtol=0, atol=0)
    assert logits.shape[:2] == inputs.kwargs["input_ids"].shape and local_ids == ids and local_pieces == pieces
    assert ids[0] == inputs.kwargs["input_ids"][0].tolist() and "".join(pieces) == TEXTS[0]
