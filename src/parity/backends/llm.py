"""What the LLM runtimes' backends share (llama.cpp, ONNX Runtime GenAI, optimum-intel's OpenVINO): the token ids
an input set feeds them, and the reference written as the Hugging Face folder their exporters read.

The exporters (ONNX Runtime GenAI's model builder, optimum-intel's `export=True`) read a `save_pretrained` folder,
not a module: the folder is written from the backend's own copy of the reference, whatever source built it (a
folder, a seeded `config:`, a GGUF file, which transformers refuses to `save_pretrained`), so that what is exported
is what the reference runs. Both exporters also insist on a tokenizer beside the weights (to copy it and read its
special tokens); parity feeds token ids and never asks the runtime to tokenize, so the folder gets a word-level
tokenizer of the ids themselves (`<0>`, `<1>`, ...) rather than a copy of the user's files.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from parity.inputs import Inputs
from parity.offline import state_folder


def token_ids(inputs: Inputs, runtime: str) -> torch.Tensor:
    """The [B, T] token ids of `inputs` (`input_ids`, with an all-ones `attention_mask` when there is one), for a
    runtime that takes ids and no attention mask."""
    kwargs = dict(inputs.kwargs)
    ids = kwargs.pop("input_ids", None)
    if ids is None and len(inputs.args) == 1 and not kwargs:
        ids = inputs.args[0]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ValueError(f"{runtime} takes token ids: an `input_ids` tensor [batch, tokens] of integers")
    mask = kwargs.pop("attention_mask", None)
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError(f"{runtime} has no attention mask and these sentences are padded to one length: give "
                         "sentences of one token length (a text input cut into equal windows), or one sentence per "
                         "input set")
    kwargs.pop("token_type_ids", None)
    if kwargs:
        raise ValueError(f"{runtime} takes input_ids and attention_mask only, not {', '.join(sorted(kwargs))}")
    return ids.to(torch.int64)


def decoder_problem(model: torch.nn.Module, runtime: str) -> str | None:
    """Why `model` cannot be written as a Hugging Face folder for `runtime`'s exporter (not a transformers causal
    language model), or None."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "save_pretrained"):
        return f"{runtime} exports a transformers language model (source: transformers or gguf); this is {type(model).__name__}"
    return None


@contextlib.contextmanager
def hf_folder(model: torch.nn.Module) -> Iterator[Path]:
    """A temporary folder (in the command's own temporary folder, never beside an artifact in the cache) holding
    `model` as `write_hf_folder` writes it, and a scratch folder `cache` beside it for the exporter; removed after."""
    with tempfile.TemporaryDirectory(prefix="hf-", dir=state_folder()) as scratch:
        folder = Path(scratch) / "model"
        write_hf_folder(model, folder)
        (Path(scratch) / "cache").mkdir()
        yield folder


def write_hf_folder(model: torch.nn.Module, folder: Path) -> None:
    """`model` (a transformers causal LM) as a `save_pretrained` folder in float32 with its cache on (the runtimes
    decode with one), and the tokenizer of its ids."""
    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)
    config.use_cache = True
    config.architectures = [type(model).__name__]
    config.torch_dtype = "float32"
    for key in ("_name_or_path", "quantization_config"):
        if hasattr(config, key):
            delattr(config, key)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    tied = getattr(config, "tie_word_embeddings", False)
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # transformers ties it to the embedding again when it loads the folder
        if tensor.data_ptr() in seen:  # another name of a tensor written already
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().to(torch.float32).contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _write_id_tokenizer(config, folder)


def _write_id_tokenizer(config, folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()

    def token(i):
        i = i[0] if isinstance(i, list) else i
        return f"<{i if i is not None else 0}>"

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=token(getattr(config, "eos_token_id", None)),
                                   bos_token=token(getattr(config, "bos_token_id", None)))
    fast.save_pretrained(folder)
