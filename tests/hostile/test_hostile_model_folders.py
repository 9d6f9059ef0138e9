"""A model folder's side files made special: a FIFO, a socket, a link to a character device, where a
save_pretrained folder (transformers opens generation_config.json, adapter_config.json, the tokenizer's files, ...
by name), a tokenizer folder, a repo folder or an .onnx file's external data hold a file. Opening a FIFO blocks
until someone writes to it, and reading /dev/zero never ends: each case is exit 2 in one line naming what the
file is, at `validate`, `run` and `check hf:` alike, and nothing is written outside --out.

Every case runs under an alarm: a regression blocks in open(), and the alarm's exception ends that open, so a
hang fails its own test instead of the suite.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest
import yaml

from tests.support.hostile import assert_user_error, run_parity

transformers = pytest.importorskip("transformers")

BERT = {"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
        "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 16}
WORDS = ["the", "cat", "sat"]
LIMIT_S = 60


@contextlib.contextmanager
def alarm(seconds: int = LIMIT_S):
    def ring(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A save_pretrained BertModel with a generation config, and a BERT tokenizer made offline from a vocabulary."""
    import torch

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**{k: v for k, v in BERT.items() if k != "model_type"}))
    model.save_pretrained(root / "model")
    transformers.GenerationConfig().save_pretrained(root / "model")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(root / "tokenizer")
    return root


def _special(path: Path, kind: str) -> str:
    """Make `path` a `kind` of special file; the word parity's message names it by."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "FIFO"
    if kind == "device":
        path.symlink_to("/dev/zero")
        return "character device"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()
    return "socket"


def _experiment(work: Path, model: dict, inputs: dict | None = None) -> Path:
    data = {"name": "hf", "seed": 0, "models": [{"name": "m", **model}],
            "inputs": [inputs or {"name": "tokens", "synthetic": {
                "input_ids": {"shape": [1, 4], "dtype": "int64", "distribution": "randint", "high": 50}}}],
            "targets": [{"backend": "eager", "name": "same"}]}
    path = work / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _argv(verb: str, path: Path, work: Path, folder: Path) -> list[str]:
    if verb == "check":
        return ["check", f"hf:{folder}", "--target", "eager", "--out", str(work / "out")]
    return ["validate", str(path)] if verb == "validate" else ["run", str(path), "--out", str(work / "out"), "--quiet"]


MODEL_FILES = ["config.json", "model.safetensors", "generation_config.json", "adapter_config.json",
               "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "preprocessor_config.json",
               "chat_template.jinja", "sub/processor_config.json"]


@pytest.mark.parametrize("verb", ["validate", "run", "check"])
@pytest.mark.parametrize("name", MODEL_FILES)
def test_a_fifo_among_a_save_pretrained_folders_files_is_named(saved, tmp_path, name, verb):
    work = tmp_path / "work"
    folder = work / "model"
    shutil.copytree(saved / "model", folder)
    (folder / name).parent.mkdir(exist_ok=True)
    word = _special(folder / name, "fifo")
    path = _experiment(work, {"source": "transformers", "path": "model"})
    with alarm():
        result = run_parity(_argv(verb, path, work, folder), tmp_path, work, ["work/out"])
    assert_user_error(result, str(folder / name), word)


@pytest.mark.parametrize("kind", ["device", "socket"])
@pytest.mark.parametrize("name", ["generation_config.json", "config.json"])
def test_a_device_or_a_socket_among_them_is_named_too(saved, tmp_path, name, kind):
    work = tmp_path / "work"
    folder = work / "model"
    shutil.copytree(saved / "model", folder)
    word = _special(folder / name, kind)
    path = _experiment(work, {"source": "transformers", "path": "model"})
    with alarm():
        result = run_parity(_argv("run", path, work, folder), tmp_path, work, ["work/out"])
    assert_user_error(result, str(folder / name), word)


@pytest.mark.parametrize("verb", ["validate", "run"])
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "vocab.txt", "added_tokens.json"])
def test_a_fifo_in_a_tokenizer_folder_is_named(saved, tmp_path, name, verb):
    work = tmp_path / "work"
    shutil.copytree(saved / "model", work / "model")
    shutil.copytree(saved / "tokenizer", work / "tokenizer")
    word = _special(work / "tokenizer" / name, "fifo")
    path = _experiment(work, {"source": "transformers", "path": "model"},
                       {"name": "words", "text": ["the cat sat"], "tokenizer": "tokenizer"})
    with alarm():
        result = run_parity(_argv(verb, path, work, work / "model"), tmp_path, work, ["work/out"])
    assert_user_error(result, str(work / "tokenizer" / name), word)


@pytest.mark.parametrize("verb", ["validate", "run"])
@pytest.mark.parametrize("name", ["helpers.py", "README.md"])
def test_a_fifo_in_a_repo_folder_is_named(tmp_path, name, verb):
    work = tmp_path / "work"
    (work / "repo").mkdir(parents=True)
    (work / "repo" / "hubconf.py").write_text("import torch\n\ndef net(**kw):\n    return torch.nn.Linear(8, 2)\n")
    word = _special(work / "repo" / name, "fifo")
    path = _experiment(work, {"source": "repo", "path": "repo", "hubconf": "net"},
                       {"name": "noise", "synthetic": {"shape": [2, 8]}})
    with alarm():
        result = run_parity(_argv(verb, path, work, work / "repo"), tmp_path, work, ["work/out"])
    assert_user_error(result, str(work / "repo" / name), word)


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory) -> Path:
    """A Linear exported to m.onnx with its weights in the external data file m.onnx.data."""
    import onnx
    import torch

    root = tmp_path_factory.mktemp("onnx")
    torch.onnx.export(torch.nn.Linear(8, 2), (torch.randn(2, 8),), str(root / "m.onnx"), dynamo=False,
                      input_names=["x"])
    model = onnx.load(str(root / "m.onnx"))
    onnx.save_model(model, str(root / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.onnx.data", size_threshold=0)
    return root


def _relocated(root: Path, work: Path, location: str) -> None:
    import onnx

    model = onnx.load(str(root / "m.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, str(work / "m.onnx"))


@pytest.mark.parametrize("reference", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("location", ["../m.onnx.data", "/etc/passwd", "sub/../../m.onnx.data"])
def test_external_data_outside_the_model_folder_is_exit_2_for_every_reference(onnx_files, tmp_path, reference, location):
    work = tmp_path / "work" / "model"
    work.mkdir(parents=True)
    shutil.copy(onnx_files / "m.onnx.data", tmp_path / "work" / "m.onnx.data")
    _relocated(onnx_files, work, location)
    data = {"name": "x", "models": [{"name": "m", "source": "onnx", "path": "model/m.onnx"}],
            "inputs": [{"name": "noise", "synthetic": {"x": {"shape": [2, 8]}}}],
            "reference": {"backend": reference}, "targets": [{"backend": "onnxruntime", "name": "t"}]}
    path = tmp_path / "work" / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_parity(["run", str(path), "--out", str(tmp_path / "work" / "out"), "--quiet"], tmp_path,
                        tmp_path / "work", ["work/out"])
    assert_user_error(result, "outside the model's folder", location)


@pytest.mark.parametrize("what", ["m.onnx", "m.onnx.data"])
def test_an_onnx_file_or_its_external_data_as_a_fifo_is_named(onnx_files, tmp_path, what):
    work = tmp_path / "work"
    shutil.copytree(onnx_files, work / "model")
    _special(work / "model" / what, "fifo")
    data = {"name": "x", "models": [{"name": "m", "source": "onnx", "path": "model/m.onnx"}],
            "inputs": [{"name": "noise", "synthetic": {"x": {"shape": [2, 8]}}}],
            "reference": {"backend": "onnxruntime"}, "targets": [{"backend": "onnxruntime", "name": "t"}]}
    path = work / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with alarm():
        result = run_parity(["validate", str(path)], tmp_path, work, [])
        checked = run_parity(["check", str(work / "model" / what), "--target", "onnxruntime"], tmp_path, work, [])
    assert_user_error(result, what, "FIFO")
    if what == "m.onnx":  # `parity check m.onnx` names the FIFO (it once said "no such file here")
        assert_user_error(checked, "m.onnx", "FIFO")


def _no_pad_tokenizer(folder: Path, eos: str | None) -> None:
    """A word-level tokenizer without a pad token (as GPT-2's), with `eos` as its end-of-sequence token or none."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "<eos>", *WORDS])}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tokens = {"eos_token": eos} if eos else {}
    transformers.PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", **tokens).save_pretrained(folder)


@pytest.mark.parametrize("eos, texts, outcome", [
    ("<eos>", ["the cat"], "no padding"),
    (None, ["the cat"], "no padding"),
    ("<eos>", ["the cat", "the cat sat"], "eos as pad"),
    (None, ["the cat", "the cat sat"], "refused"),
])
def test_a_tokenizer_without_a_pad_token(saved, tmp_path, eos, texts, outcome):
    """A single sentence needs no padding; several are padded with the end-of-sequence token, said in a note; a
    tokenizer with neither is refused, by validate as by run."""
    from parity.errors import ParityError
    from parity.inputs.text import make_text, tokenizer_problem

    _no_pad_tokenizer(tmp_path / "tok", eos)
    problem = tokenizer_problem(tmp_path / "tok", len(texts))
    if outcome == "refused":
        assert "has no pad token and no end-of-sequence token" in problem
        with pytest.raises(ParityError, match="has no pad token"):
            make_text(texts, tmp_path / "tok")
        return
    assert problem is None
    inputs = make_text(texts, tmp_path / "tok")
    ids = inputs.kwargs["input_ids"]
    assert ids.shape[0] == len(texts)
    if outcome == "eos as pad":
        assert ids[0, -1].item() == 1 and inputs.kwargs["attention_mask"][0, -1].item() == 0  # <eos> pads, masked
        assert inputs.notes and "padded with its end-of-sequence token '<eos>'" in inputs.notes[0]
    else:
        assert inputs.notes == ()


def test_a_transformers_error_is_one_clipped_line(saved, tmp_path, monkeypatch):
    from parity.errors import ParityError
    from parity.models.sources import transformers as source

    def refuse(*args, **kwargs):
        raise OSError("first line of the error\n\n" + "advice " * 200 + "\nthird line")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refuse)
    spec = type("Spec", (), {"architecture": "AutoModel", "params": {}, "config": None})()
    with pytest.raises(ParityError) as raised:
        source.build_transformers(spec, saved / "model")
    [problem] = raised.value.problems
    assert problem.endswith(": first line of the error") and "\\n" not in problem and len(problem) < 300
