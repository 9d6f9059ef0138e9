"""A text cut into windows as llama-perplexity cuts it (`text_file`, inputs/text.py `make_windows`): tokenized
once, `n_ctx` tokens per window, each window's first token the BOS when the tokenizer adds one, no padding, and
the second half of each window scored (`Inputs.scored_from`)."""

from __future__ import annotations

import pytest

from parity.errors import ParityError

pytest.importorskip("transformers")

WORDS = "the cat sat on a mat and the dog ran to the park while a bird sang in the old tree".split()


def _tokenizer(folder, bos: bool):
    """A word-level tokenizer of WORDS saved in `folder`, which starts every text with [BOS] when `bos`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "[BOS]", *dict.fromkeys(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]").save_pretrained(folder)
    return vocab


@pytest.mark.parametrize("bos", [True, False])
def test_a_text_is_cut_into_windows_of_n_ctx_tokens_each_starting_with_the_bos(tmp_path, bos):
    from parity.inputs.text import make_windows

    vocab = _tokenizer(tmp_path, bos)
    text = " ".join(WORDS)  # 20 words, 21 tokens with the BOS
    inputs = make_windows(text, tmp_path, n_ctx=6, windows=None)
    ids, mask = inputs.kwargs["input_ids"], inputs.kwargs["attention_mask"]
    assert tuple(ids.shape) == (3, 6) and bool(mask.all()) and inputs.scored_from == 3
    stream = ([1] if bos else []) + [vocab[w] for w in WORDS]
    for w in range(3):
        expected = stream[6 * w:6 * (w + 1)]
        if bos:
            expected[0] = 1  # llama.cpp: the first token of every window becomes the BOS
        assert ids[w].tolist() == expected
    assert inputs.ids_cut and inputs.text_ids == (tuple(stream[:18]),)  # what tokenizer parity compares: the span run
    two = make_windows(text, tmp_path, n_ctx=6, windows=2)
    assert tuple(two.kwargs["input_ids"].shape) == (2, 6) and len(two.text_ids[0]) == len(two.pieces[0]) == 12
    with pytest.raises(ParityError, match="hold 3 windows of 6 tokens, fewer than the 4 asked for"):
        make_windows(text, tmp_path, n_ctx=6, windows=4)


class _Experiment:
    def resolve(self, path, what="path"):
        from pathlib import Path

        return Path(path)


def test_a_text_file_is_a_file_or_one_an_installed_package_bundles(tmp_path):
    """The standard library's pydoc_data/topics.py: Python's documentation as English prose, read as its string
    literals (parsed, not run)."""
    from parity.config.schema import PackageFile
    from parity.inputs.text import read_text

    prose = read_text(PackageFile(package="pydoc_data", path="topics.py"), _Experiment())
    assert len(prose) > 100_000 and 'The "assert" statement' in prose and "topics = {" not in prose
    (tmp_path / "t.txt").write_text("plain words", encoding="utf-8")
    assert read_text(str(tmp_path / "t.txt"), _Experiment()) == "plain words"
    with pytest.raises(ParityError, match="outside package 'pydoc_data'"):
        read_text(PackageFile(package="pydoc_data", path="../os.py"), _Experiment())
    with pytest.raises(ParityError, match="is not installed here"):
        read_text(PackageFile(package="no_such_package_here", path="a.txt"), _Experiment())
    with pytest.raises(ParityError, match="text_file not found"):
        read_text(str(tmp_path / "missing.txt"), _Experiment())


def test_a_text_file_set_needs_its_window_length_and_tokenizer():
    from pydantic import ValidationError

    from parity.config.schema import InputSetSpec

    ok = InputSetSpec(name="t", text_file={"package": "pydoc_data", "path": "topics.py"}, tokenizer="tok", n_ctx=64)
    assert ok.windows is None
    for bad, says in (({"tokenizer": "tok"}, "needs 'n_ctx'"), ({"n_ctx": 64}, "need 'tokenizer'"),
                      ({"tokenizer": "tok", "n_ctx": 64, "text": ["a"]}, "exactly one of")):
        with pytest.raises(ValidationError, match=says):
            InputSetSpec(name="t", text_file="a.txt", **bad)


def test_validate_names_a_text_file_it_cannot_read(tmp_path, capsys):
    from parity.cli import main

    _tokenizer(tmp_path / "tok", bos=False)
    (tmp_path / "exp.yaml").write_text(
        "name: t\nmodels: [{name: m, source: torchvision, builder: resnet18}]\n"
        "inputs: [{name: prose, text_file: missing.txt, tokenizer: tok, n_ctx: 8}]\ntargets: [{backend: eager}]\n")
    assert main(["validate", str(tmp_path / "exp.yaml")]) == 2
    out = capsys.readouterr()
    assert "text_file not found" in out.out + out.err
