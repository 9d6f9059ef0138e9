"""Text input sets: sentences tokenized by a local tokenizer folder (transformers' AutoTokenizer, read with
`local_files_only`: nothing is downloaded), padded to the longest, handed to the model as the keyword
tensors the tokenizer gives (int64 `input_ids`, `attention_mask`, and `token_type_ids` when it has them)."""

from __future__ import annotations

from pathlib import Path

from parity.errors import ParityError, first_line
from parity.files import special_file_problem
from parity.inputs.base import Inputs
from parity.offline import quiet_library_imports
from parity.remote_code import remote_code_problem


def load_tokenizer(folder: Path):
    """The tokenizer saved in `folder` (`save_pretrained`); a folder it cannot read is one line. Every file in
    it must be a regular file (or a link to one): transformers opens the ones it looks for, and opening a FIFO
    blocks until someone writes to it."""
    if not folder.is_dir():
        raise ParityError(f"tokenizer folder not found: {folder} (a local save_pretrained folder; nothing is downloaded)")
    try:
        problem = special_file_problem(folder, "tokenizer file")
    except OSError as exc:
        raise ParityError(f"tokenizer folder {folder}: cannot be read ({exc.strerror or exc})") from exc
    if problem:
        raise ParityError(problem)
    try:
        with quiet_library_imports():  # transformers imports torchao, when installed
            from transformers import AutoTokenizer
    except ImportError as exc:
        raise ParityError("text inputs need the transformers package: pip install 'parity[transformers]'") from exc
    remote = remote_code_problem(folder, ("tokenizer_config.json", "config.json"))
    if remote:
        raise ParityError(remote)
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:  # no tokenizer files, a class it does
        # not know, a JSON file nested deeper than Python's parser recurses
        raise ParityError(f"no tokenizer transformers can read in {folder}: {first_line(exc)}") from exc


def tokenizer_problem(folder: Path, sentences: int = 1) -> str | None:
    """What `parity validate` says of a `tokenizer:` folder for `sentences` sentences: it loads and can pad
    them (`padding`), or why not: the run's own answer, given before it."""
    try:
        padding(load_tokenizer(folder), sentences, folder)
    except ParityError as exc:
        return exc.problems[0]
    return None


def padding(tokenizer, sentences: int, folder: Path) -> tuple[str | bool, str | None]:
    """How `sentences` sentences are padded, and a note when parity chose the pad token: one sentence needs no
    padding; several are padded to the longest with the tokenizer's pad token or, when it has none, with its
    end-of-sequence token (what a decoder such as GPT-2 is usually padded with; the attention mask hides it).
    A tokenizer with neither cannot pad several: a ParityError."""
    if sentences <= 1:
        return False, None
    if tokenizer.pad_token is not None:
        return "longest", None
    if tokenizer.eos_token is None:
        raise ParityError(f"tokenizer {folder}: has no pad token and no end-of-sequence token, so {sentences} "
                          "sentences of different lengths cannot be padded into one batch; give one sentence per "
                          "input set, or save the tokenizer with a pad_token")
    return "longest", (f"the tokenizer has no pad token: the {sentences} sentences are padded with its "
                       f"end-of-sequence token {tokenizer.eos_token!r} (the attention mask hides it)")


def make_text(texts: list[str], folder: Path) -> Inputs:
    """The keyword tensors of `texts`, padded to the longest (`padding`), in the tokenizer's order."""
    tokenizer = load_tokenizer(folder)
    pad, note = padding(tokenizer, len(texts), folder)
    if note:
        tokenizer.pad_token = tokenizer.eos_token
    encoded = tokenizer(list(texts), padding=pad, return_tensors="pt")
    return Inputs((), dict(encoded), notes=(note,) if note else ())
