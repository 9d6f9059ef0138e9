"""Text input sets: sentences tokenized by a local tokenizer folder (transformers' AutoTokenizer, read with
`local_files_only`: nothing is downloaded), padded to the longest, handed to the model as the keyword
tensors the tokenizer gives (int64 `input_ids`, `attention_mask`, and `token_type_ids` when it has them)."""

from __future__ import annotations

import functools
from pathlib import Path

from parity.errors import ParityError
from parity.files import file_problem
from parity.inputs import Inputs
from parity.offline import quiet_library_imports

MAX_ENTRIES = 1000  # a save_pretrained folder holds a handful of files


def load_tokenizer(folder: Path):
    """The tokenizer saved in `folder` (`save_pretrained`); a folder it cannot read is one line. Every file in
    it must be a regular file (or a link to one): transformers opens the ones it looks for, and opening a FIFO
    blocks until someone writes to it."""
    if folder.suffix.lower() == ".gguf":  # the tokenizer a GGUF file carries
        return load_gguf_tokenizer(folder)
    if not folder.is_dir():
        raise ParityError(f"tokenizer folder not found: {folder} (a local save_pretrained folder; nothing is downloaded)")
    try:
        entries = sorted(folder.iterdir())[:MAX_ENTRIES]
    except OSError as exc:
        raise ParityError(f"tokenizer folder {folder}: cannot be read ({exc.strerror or exc})") from exc
    for entry in entries:
        problem = None if entry.is_dir() else file_problem(entry, "tokenizer file")
        if problem:
            raise ParityError(problem)
    try:
        with quiet_library_imports():  # transformers imports torchao, when installed
            from transformers import AutoTokenizer
    except ImportError as exc:
        raise ParityError("text inputs need the transformers package: pip install 'parity[transformers]'") from exc
    from parity.models.sources.transformers import remote_code_problem

    remote = remote_code_problem(folder, ("tokenizer_config.json", "config.json"))
    if remote:
        raise ParityError(remote)
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:  # no tokenizer files, a class it does
        # not know, a JSON file nested deeper than Python's parser recurses
        raise ParityError(f"no tokenizer transformers can read in {folder}: {str(exc).splitlines()[0]}") from exc


def load_gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file carries (its vocabulary, merges and special tokens, read by transformers with
    `gguf_file=`), the file's header checked first (models/gguf.py). Its chat template is kept as a string and
    never rendered."""
    from parity.models.sources.gguf import gguf_problem

    problem = gguf_problem(path)
    if problem:
        raise ParityError(problem)
    st = path.stat()
    return _gguf_tokenizer(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _gguf_tokenizer(path: Path, size: int, mtime_ns: int):
    """Read once per file and version in a process: transformers parses the whole vocabulary (seconds for 49,152
    tokens), and every input set of an experiment names the same file."""
    try:
        with quiet_library_imports():
            from transformers import AutoTokenizer
    except ImportError as exc:
        raise ParityError("a GGUF tokenizer needs the transformers and gguf packages: pip install 'parity[llamacpp]'") from exc
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError, ImportError, RuntimeError) as exc:
        raise ParityError(f"no tokenizer transformers can read in {path}: {str(exc).splitlines()[0]}") from exc


def tokenizer_problem(folder: Path) -> str | None:
    """What `parity validate` says of a `tokenizer:` folder: it loads, or why not."""
    try:
        load_tokenizer(folder)
    except ParityError as exc:
        return exc.problems[0]
    return None


def make_text(texts: list[str], folder: Path) -> Inputs:
    """The keyword tensors of `texts`, padded to the longest, in the tokenizer's order."""
    tokenizer = load_tokenizer(folder)
    encoded = tokenizer(list(texts), padding="longest", return_tensors="pt")
    pieces = tuple(tuple(tokenizer.decode([i]) for i in tokenizer(t)["input_ids"]) for t in texts)
    return Inputs((), dict(encoded), texts=tuple(texts), pieces=pieces)
