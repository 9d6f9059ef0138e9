"""Text input sets, tokenized by a local tokenizer folder (transformers' AutoTokenizer, read with
`local_files_only`: nothing is downloaded), handed to the model as keyword tensors (int64 `input_ids`,
`attention_mask`, and `token_type_ids` when the tokenizer gives them):

- `text`: sentences, padded to the longest;
- `text_file`: one text (a file, or a file an installed package bundles) tokenized once and cut into windows of
  `n_ctx` tokens as `llama-perplexity` cuts it (`make_windows`): no padding, and a language model is scored on the
  second half of each window (`Inputs.scored_from`)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from parity.errors import ParityError, first_line
from parity.files import file_problem, special_file_problem
from parity.gguf import gguf_problem
from parity.inputs.base import Inputs
from parity.offline import quiet_library_imports
from parity.remote_code import remote_code_problem


def load_tokenizer(folder: Path):
    """The tokenizer saved in `folder` (`save_pretrained`); a folder it cannot read is one line. Every file in
    it must be a regular file (or a link to one): transformers opens the ones it looks for, and opening a FIFO
    blocks until someone writes to it."""
    if folder.suffix.lower() == ".gguf":  # the tokenizer a GGUF file carries
        return load_gguf_tokenizer(folder)
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


def load_gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file carries (its vocabulary, merges and special tokens, read by transformers with
    `gguf_file=`), the file's header checked first (parity/gguf.py). Its chat template is kept as a string and
    never rendered."""
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
        raise ParityError(f"no tokenizer transformers can read in {path}: {first_line(exc)}") from exc


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
    mask = encoded.get("attention_mask")
    ids = tuple(tuple(row[m.bool()].tolist() if mask is not None else row.tolist())
                for row, m in zip(encoded["input_ids"], mask if mask is not None else encoded["input_ids"], strict=True))
    return Inputs((), dict(encoded), notes=(note,) if note else (), texts=tuple(texts), text_ids=ids,
                  pieces=tuple(token_pieces(tokenizer, i) for i in ids))


def token_pieces(tokenizer, ids) -> tuple[str, ...]:
    """Each id's text, as `tokenizer.decode([id])` writes it; a fast tokenizer's whole list in one call of its Rust
    backend (a text_file's 100k ids: one call instead of 100k)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tuple(backend.decode_batch([[i] for i in ids], skip_special_tokens=False))
    return tuple(tokenizer.decode([i]) for i in ids)


MAX_TEXT_BYTES = 64 * 2**20  # a text file read whole: more than any window count needs


def read_text(source, experiment) -> str:
    """The text of a `text_file:`: a UTF-8 file (a path, relative to the experiment), or `{package, path}`: a file
    an installed package bundles, found without importing the package. A Python file gives its string literals of
    more than one word (not its dictionary keys) joined by blank lines, parsed and never run: the standard
    library's `pydoc_data/topics.py` holds Python's language reference as English prose."""
    if isinstance(source, str):
        path = experiment.resolve(source, "text_file")
    else:
        from importlib.util import find_spec

        try:
            spec = find_spec(source.package)
        except (ImportError, ValueError):
            spec = None
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        if not folders:
            raise ParityError(f"text_file: package '{source.package}' is not installed here (or is a module, not a "
                              "package with a folder)")
        path = Path(folders[0]) / source.path
        if not path.resolve().is_relative_to(Path(folders[0]).resolve()):
            raise ParityError(f"text_file: {source.path!r} is outside package '{source.package}'")
    problem = file_problem(path, "text_file")
    if problem:
        raise ParityError(problem)
    if path.stat().st_size > MAX_TEXT_BYTES:
        raise ParityError(f"text_file {path}: larger than {MAX_TEXT_BYTES // 2**20} MiB; cut it")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParityError(f"text_file {path}: not readable as UTF-8 text ({exc})") from exc
    if path.suffix == ".py":
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError) as exc:
            raise ParityError(f"text_file {path}: a .py file is read for its string literals, and it does not "
                              f"parse ({exc})") from exc
        text = "\n\n".join(node.value.strip() for node in ast.walk(tree)  # prose: more than one word
                            if isinstance(node, ast.Constant) and isinstance(node.value, str)
                            and len(node.value.split()) > 1)
    return text


def text_file_problem(source, experiment) -> str | None:
    """What `parity validate` says of a `text_file:`: it reads, or why not."""
    try:
        read_text(source, experiment)
    except ParityError as exc:
        return exc.problems[0]
    return None


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer starts a text with its BOS token (llama.cpp's `llama_vocab_get_add_bos`)."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("", add_special_tokens=True)["input_ids"][:1] == [bos]


def make_windows(text: str, folder: Path, n_ctx: int, windows: int | None) -> Inputs:
    """`text` tokenized once, as llama-perplexity tokenizes it (`common_tokenize(ctx, text, true)`: the tokenizer's
    special tokens added, a BOS first when it adds one), cut into `windows` consecutive windows of `n_ctx` tokens
    (None: as many as the text holds, `tokens / n_ctx`; the rest is dropped), each window's first token made the
    BOS when the tokenizer adds one (perplexity.cpp `kl_divergence`). No padding: the attention mask is all ones.
    The scored positions start at `n_ctx // 2` (perplexity.cpp's `first`)."""
    import torch

    tokenizer = load_tokenizer(folder)
    ids = tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]
    fit = len(ids) // n_ctx
    if fit < (windows or 1):
        raise ParityError(f"text_file: {len(ids)} tokens hold {fit} windows of {n_ctx} tokens, fewer than the "
                          f"{windows or 1} asked for; give a longer text or a smaller n_ctx")
    count = windows or fit
    cut = torch.tensor(ids[:count * n_ctx], dtype=torch.int64).view(count, n_ctx)
    if adds_bos(tokenizer):
        cut[:, 0] = tokenizer.bos_token_id
    # tokenizer parity compares the span the windows take: a difference further on changes nothing this set runs
    span = ids[:count * n_ctx]
    return Inputs((), {"input_ids": cut, "attention_mask": torch.ones_like(cut)}, scored_from=n_ctx // 2,
                  texts=(text,), text_ids=(tuple(span),), pieces=(token_pieces(tokenizer, span),), ids_cut=True)
