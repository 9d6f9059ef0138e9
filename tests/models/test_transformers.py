"""`source: transformers` and text inputs: a tiny BERT from a config (seeded init) or from a save_pretrained
folder, token ids from a tokenizer folder or synthetic specs; nothing downloaded, every mistake one line at
validate."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import yaml

from parity.api import run_experiment
from parity.cli import main
from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from parity.models import build_model, source_fingerprint

transformers = pytest.importorskip("transformers")

BERT = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 16}
TOKENS = {"input_ids": {"shape": [2, 8], "dtype": "int64", "distribution": "randint", "high": 100},
          "attention_mask": {"shape": [2, 8], "dtype": "int64", "distribution": "ones"}}
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
LEAVES = ["out['last_hidden_state']", "out['pooler_output']"]


def _data(model: dict, inputs: dict | None = None, targets: list[dict] | None = None) -> dict:
    return {"name": "bert", "seed": 0, "repeats": 1,
            "models": [{"name": "bert", "source": "transformers", **model}],
            "inputs": [inputs or {"name": "tokens", "synthetic": TOKENS}],
            "targets": targets or [{"backend": "onnxruntime"}]}


def _passed(records) -> dict[str, list[str]]:
    """Each check's target -> its leaves' names, asserting every check passed."""
    checks = [r for r in records if r["kind"] == "check" and r["tier"] == 1]
    assert checks and all(c["passed"] for c in checks), [(c["target"], c["detail"]) for c in checks]
    return {c["target"]: [leaf["name"] for leaf in c["leaves"]] for c in checks}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A save_pretrained BertForSequenceClassification (weights of seed 7) and a BERT tokenizer made offline from
    a vocabulary file."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(7)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT, num_labels=3))
    model.save_pretrained(root / "model")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(root / "tokenizer")
    return root, model.eval()


@pytest.mark.numerics
def test_a_bert_from_a_config_gets_a_verdict_on_compile_onnxruntime_and_openvino(tmp_path, caplog):
    """Every backend rebuilds the ModelOutput into the same leaves, named by field. compile runs dynamo's capture
    without inductor's code generation (aot_eager): inductor takes minutes on 2 cores; examples/bert.yaml runs it.
    OpenVINO's trace lists the model's attributes, and transformers' notice about a training loss stays off the
    console."""
    targets = [{"backend": "compile", "options": {"backend": "aot_eager"}}, {"backend": "onnxruntime"},
               {"backend": "openvino"}]
    leaves = _passed(run_experiment(_data({"config": BERT}, targets=targets), out=tmp_path / "out"))
    assert leaves == {"compile-cpu": LEAVES, "onnxruntime-cpu": LEAVES, "openvino-cpu": LEAVES}
    assert not [r for r in caplog.records if "loss_type" in r.getMessage()]


def test_a_config_model_is_a_seeded_init_with_eager_attention():
    exp = experiment_from_dict(_data({"config": BERT}))
    a, b = build_model(exp.models[0], exp), build_model(exp.models[0], exp)
    assert type(a).__name__ == "BertModel" and a.config._attn_implementation == "eager"
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 32
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    exp.seed = 1
    c = build_model(exp.models[0], exp)
    assert not torch.equal(a.embeddings.word_embeddings.weight, c.embeddings.word_embeddings.weight)
    assert source_fingerprint(exp.models[0], exp)["files"] == ""


def _refuse_network(monkeypatch) -> list[str]:
    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(str(args[1:2]))
        raise OSError("network disabled in this test")

    for name in ("connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def test_a_save_pretrained_folder_and_text_run_offline(saved, tmp_path, monkeypatch, capfd):
    """The folder's own weights (not the seed's), the class `architecture` names, the tokenizer's keyword
    tensors padded to the longest sentence; no socket is even tried."""
    root, original = saved
    attempts = _refuse_network(monkeypatch)
    text = {"name": "sentences", "text": ["the cat sat on the mat", "a dog ran"], "tokenizer": str(root / "tokenizer")}
    data = _data({"path": str(root / "model"), "architecture": "BertForSequenceClassification"}, text)
    exp = experiment_from_dict(data)
    model = build_model(exp.models[0], exp)
    assert all(torch.equal(x, y) for x, y in
               zip(model.state_dict().values(), original.state_dict().values(), strict=True))
    inputs = build_inputs(exp.inputs[0], exp)
    assert list(inputs.kwargs) == ["input_ids", "token_type_ids", "attention_mask"]
    assert inputs.kwargs["input_ids"].shape == (2, 8) and inputs.kwargs["input_ids"].dtype == torch.int64
    assert inputs.kwargs["attention_mask"].tolist()[1] == [1] * 5 + [0] * 3  # [CLS] a dog ran [SEP], padded
    assert _passed(run_experiment(data, out=tmp_path / "out")) == {"onnxruntime-cpu": ["out['logits']"]}
    assert attempts == []
    assert "Loading weights" not in capfd.readouterr().err  # transformers' bar, among parity's own


def test_the_files_digest_follows_every_file_of_the_folder(saved, tmp_path):
    root, _ = saved
    folder = tmp_path / "model"
    folder.mkdir()
    for f in (root / "model").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    exp = experiment_from_dict(_data({"path": str(folder)}))
    before = source_fingerprint(exp.models[0], exp)["files"]
    assert before and before == source_fingerprint(exp.models[0], exp)["files"]
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\1")
    assert source_fingerprint(exp.models[0], exp)["files"] != before


@pytest.mark.parametrize("model, key, message", [
    ({"path": "nowhere"}, "models[0].path", "transformers model folder not found: "),
    ({"path": "."}, "models[0].path", "no config.json in "),
    ({"path": "config-only"}, "models[0].path", "no weights in "),
    ({"config": {**BERT, "model_type": "bret"}}, "models[0].config", "unknown transformers model_type 'bret'; "
                                                                     "did you mean 'bert'?"),
    ({"config": {"num_hidden_layers": 2}}, "models[0].config", "'config' needs 'model_type'"),
    ({"config": BERT, "architecture": "BertForSequenceClasification"}, "models[0].architecture",
     "unknown transformers model class 'BertForSequenceClasification'; did you mean 'BertForSequenceClassification'?"),
    ({"config": BERT, "path": "."}, "models[0]", "exactly one of 'path'"),
    ({}, "models[0]", "exactly one of 'path'"),
    ({"path": ".", "init": "fan_in"}, "models[0]", "'init' applies only to a seeded init ('config:')"),
    ({"path": ".", "seed": 3}, "models[0]", "'seed' applies only to a seeded init ('config:')"),
])
def test_a_model_transformers_cannot_build_here_is_one_line_at_validate(tmp_path, capsys, monkeypatch, model, key,
                                                                       message):
    attempts = _refuse_network(monkeypatch)
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text(json.dumps(BERT))
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_data(model)))
    assert main(["validate", str(path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert key in line and message in line, line
    assert attempts == []


@pytest.mark.parametrize("inputs, key, message", [
    ({"text": ["a cat"], "tokenizer": "nowhere"}, "inputs[0].tokenizer", "tokenizer folder not found: "),
    ({"text": ["a cat"], "tokenizer": "."}, "inputs[0].tokenizer", "no tokenizer transformers can read in "),
    ({"text": ["a cat"]}, "inputs[0]", "'text' and 'text_file' need 'tokenizer'"),
    ({"text": ["a cat"], "tokenizer": ".", "synthetic": TOKENS}, "inputs[0]", "exactly one of 'images', 'synthetic', 'text', 'text_file', 'audio' or 'tensors'"),
])
def test_a_text_input_set_parity_cannot_tokenize_is_one_line_at_validate(tmp_path, monkeypatch, inputs, key, message):
    attempts = _refuse_network(monkeypatch)
    with pytest.raises(ParityError) as exc:
        experiment_from_dict(_data({"config": BERT}, {"name": "sentences", **inputs}), "<dict>", tmp_path)
    [problem] = exc.value.problems
    assert key in problem and message in problem, problem
    assert attempts == []


def test_a_class_whose_own_dependencies_are_missing_is_one_line(monkeypatch):
    """transformers imports a model's module when the class is first looked up: a missing dependency of that
    module (LayoutLMv2 needs detectron2) is one line, not a traceback."""
    from parity.models.sources import transformers as source

    class Lazy:
        PreTrainedModel = torch.nn.Module

        def __getattr__(self, name):
            raise ImportError(f"{name} requires the detectron2 library but it was not found\nmore lines")

    monkeypatch.setattr(source, "_transformers", Lazy)
    with pytest.raises(ParityError) as exc:
        source.model_class("LayoutLMv2Model")
    assert exc.value.problems == ["transformers class 'LayoutLMv2Model' cannot be imported here: LayoutLMv2Model "
                                  "requires the detectron2 library but it was not found"]


# -- a folder's own code is never run (trust_remote_code) ---------------------------------------------

def _with_remote_code(source, folder, config_name: str):
    """A copy of a save_pretrained folder whose `config_name` names a class in the folder's own .py file
    (`auto_map`): transformers would import it under trust_remote_code, and importing it writes a marker."""
    import shutil

    shutil.copytree(source, folder)
    marker = folder.parent / "marker"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom transformers import *\n")
    config = json.loads((folder / config_name).read_text())
    config["auto_map"] = {"AutoModel": "evil.EvilModel", "AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / config_name).write_text(json.dumps(config))
    return marker


@pytest.mark.parametrize("verb", ["validate", "run"])
def test_a_model_folder_that_needs_remote_code_is_refused_naming_its_auto_map(saved, tmp_path, capsys, verb):
    root, _ = saved
    marker = _with_remote_code(root / "model", tmp_path / "remote", "config.json")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_data({"path": "remote", "architecture": "AutoModel"})))
    argv = [verb, str(path), *(["--out", str(tmp_path / "out"), "--quiet"] if verb == "run" else [])]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "models[0].path" in line and f"{tmp_path / 'remote' / 'config.json'} has an auto_map" in line, line
    assert '"AutoModel": "evil.EvilModel"' in line and "trust_remote_code" in line
    assert not marker.exists()


def test_a_tokenizer_folder_that_needs_remote_code_is_refused(saved, tmp_path):
    root, _ = saved
    marker = _with_remote_code(root / "tokenizer", tmp_path / "remote", "tokenizer_config.json")
    with pytest.raises(ParityError) as exc:
        experiment_from_dict(_data({"config": BERT}, {"name": "sentences", "text": ["a cat"], "tokenizer": "remote"}),
                             "<dict>", tmp_path)
    [problem] = exc.value.problems
    assert "inputs[0].tokenizer" in problem and "tokenizer_config.json has an auto_map" in problem, problem
    assert not marker.exists()


def test_params_may_not_turn_trust_remote_code_on(tmp_path):
    exp = experiment_from_dict(_data({"config": BERT, "params": {"trust_remote_code": True}}))
    with pytest.raises(ParityError, match="'params' may not set trust_remote_code"):
        build_model(exp.models[0], exp)


GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 16,
        "bos_token_id": 0, "eos_token_id": 0}


def test_a_decoder_runs_on_exporters_with_its_cache_off_and_the_record_says_so(tmp_path):
    """A decoder returns a DynamicCache that no exporter takes: parity turns the cache off unless `params` set
    `use_cache`, compares the logits, and the model record says why the cache is not compared."""
    data = _data({"config": GPT2, "architecture": "AutoModelForCausalLM"},
                 targets=[{"backend": "export"}, {"backend": "onnxruntime"}])
    records = run_experiment(data, out=tmp_path / "out")
    assert _passed(records) == {"export-cpu": ["out['logits']"], "onnxruntime-cpu": ["out['logits']"]}
    model = next(r for r in records if r["kind"] == "model")
    assert model["notes"] and model["notes"][0].startswith("use_cache off")


def test_a_decoder_s_cache_is_compared_leaf_by_leaf_when_params_keep_it(tmp_path):
    """`params: {use_cache: true}`: the cache is an output, flattened into each layer's keys and values."""
    data = _data({"config": GPT2, "architecture": "AutoModelForCausalLM", "params": {"use_cache": True}},
                 targets=[{"backend": "eager", "dtype": "float64"}])
    records = run_experiment(data, out=tmp_path / "out")
    cache = [f"out['cache'].layers[{i}].{part}" for i in range(2) for part in ("keys", "values")]
    assert _passed(records) == {"eager-cpu-float64": ["out['logits']", *cache]}
    assert next(r for r in records if r["kind"] == "model")["notes"] is None


def test_parity_check_takes_an_hf_folder_as_the_yaml_does(tmp_path):
    """`parity check hf:FOLDER`: the class config.json names, seeded token ids below its vocabulary."""
    from parity.check_command import check_experiment

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**GPT2)).save_pretrained(tmp_path / "lm")
    data = check_experiment(f"hf:{tmp_path / 'lm'}", ["onnxruntime"])
    assert data["models"][0] | {"path": None} == {"name": "lm", "source": "transformers", "path": None,
                                                   "architecture": "GPT2LMHeadModel"}
    ids = data["inputs"][0]["synthetic"]["input_ids"]
    assert ids["high"] == 100 and ids["dtype"] == "int64"
    assert main(["check", f"hf:{tmp_path / 'lm'}", "--target", "onnxruntime", "--out", str(tmp_path / "out"),
                 "--quiet"]) == 0


class _Opaque:
    """An output object parity has no rule for (as a DynamicCache was)."""


class OpaqueOutput(torch.nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "cache": _Opaque()}


def test_a_structural_failure_has_no_oracle_verdict(tmp_path, capsys):
    """An output that cannot be compared fails `uncomparable` whatever the numbers: the float64 oracle says
    nothing of it, never "the reference is the imprecise one"."""
    data = {"name": "opaque", "seed": 0, "repeats": 1, "oracle": True,
            "models": [{"name": "m", "source": "python", "entry": "tests.models.test_transformers:OpaqueOutput"}],
            "inputs": [{"name": "x", "synthetic": {"shape": [2, 4]}}], "targets": [{"backend": "eager", "dtype": "float64"}]}
    path = tmp_path / "opaque.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    check = next(json.loads(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()
                 if '"tier": 1' in line and '"check"' in line)
    assert check["failure_class"] == "uncomparable" and check["oracle"] is None
    assert "imprecise" not in capsys.readouterr().out


def test_openvino_is_not_fed_an_input_the_model_never_reads(tmp_path, caplog):
    """LLaMA's forward takes `**kwargs`: a tokenizer's token_type_ids run in eager and are ignored, so OpenVINO's
    converted model has no port for them. They are not fed (said once); the check gets its verdict."""
    pytest.importorskip("openvino")
    llama = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
             "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 16}
    tokens = {**TOKENS, "token_type_ids": {"shape": [2, 8], "dtype": "int64", "distribution": "zeros"}}
    data = _data({"config": llama, "architecture": "AutoModelForCausalLM"}, {"name": "tokens", "synthetic": tokens},
                 targets=[{"backend": "openvino"}])
    assert _passed(run_experiment(data, out=tmp_path / "out")) == {"openvino-cpu": ["out['logits']"]}
    said = [r.getMessage() for r in caplog.records if "never reads" in r.getMessage()]
    assert said == ["openvino-cpu: the model never reads token_type_ids (its forward takes and ignores it): not fed to OpenVINO"]


T5 = {"model_type": "t5", "vocab_size": 32, "d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1,
      "num_decoder_layers": 1, "num_heads": 2, "decoder_start_token_id": 0, "pad_token_id": 0}
T5_TOKENS = {"input_ids": {"shape": [2, 6], "dtype": "int64", "distribution": "randint", "high": 32},
             "decoder_input_ids": {"shape": [2, 6], "dtype": "int64", "distribution": "randint", "high": 32}}


def test_an_encoder_decoder_cache_is_compared_by_its_self_and_cross_attention_layers(tmp_path):
    """T5 with `params: {use_cache: true}` returns an EncoderDecoderCache: two caches, each flattened by its layers."""
    data = _data({"config": T5, "architecture": "T5ForConditionalGeneration", "params": {"use_cache": True}},
                 {"name": "tokens", "synthetic": T5_TOKENS}, targets=[{"backend": "eager", "dtype": "float64"}])
    leaves = _passed(run_experiment(data, out=tmp_path / "out"))["eager-cpu-float64"]
    assert {f"out['cache'].{part}.layers[0].{kv}" for part in ("self_attention_cache", "cross_attention_cache")
            for kv in ("keys", "values")} <= set(leaves)


def test_t5_continues_its_decoder_input_ids_free_running(tmp_path):
    """An encoder-decoder generates into `decoder_input_ids`, its encoder's inputs unchanged: 6 decoder positions and
    3 new tokens leave 3-token prompts."""
    data = _data({"config": T5, "architecture": "T5ForConditionalGeneration", "task": "text-generation"},
                 {"name": "tokens", "synthetic": T5_TOKENS}, targets=[{"backend": "eager", "dtype": "float64"}])
    data["tiers"] = {"tasks": {"text-generation": {"new_tokens": 3}}}
    records = run_experiment(data, out=tmp_path / "out")
    generation = next(r for r in records if r["kind"] == "check" and r["tier"] == 3)["generation"]
    assert generation["new_tokens"] == 3 and generation["exact_match"] == 1.0
    assert [p["prompt_tokens"] for p in generation["prompts"]] == [3, 3]
