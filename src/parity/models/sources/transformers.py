"""`source: transformers`: a Hugging Face transformers model from a local `save_pretrained` folder (`path:`,
read with `local_files_only`) or from a config mapping (`config:`, a seeded random init); never a download.
Needs `pip install 'parity[transformers]'`.

Every model is built with `attn_implementation="eager"`: the plain matmul-softmax attention every exporter
(torch.export, ONNX, OpenVINO's tracer) takes as it is, where SDPA's fused kernel and its masks differ from
one exporter to the next. The model returns its `ModelOutput`, whose leaves are named by field
(`out['last_hidden_state']`, `out['logits']`).

A decoder's key-value cache (`use_cache`, a `DynamicCache` among its outputs, an `EncoderDecoderCache` for T5) is
turned off unless the model's `params` set `use_cache`: no exporter takes the cache object as an output, and a
single forward over the whole sequence computes the same logits without it. The model record says so (`notes`).
With `use_cache: true` the cache is compared leaf by leaf (outputs.py) wherever a backend returns it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from parity.config.schema import LocalPath, ModelSpecBase
from parity.errors import ParityError, did_you_mean, first_line
from parity.files import special_file_problem
from parity.models.sources import Source
from parity.offline import quiet_library_imports
from parity.remote_code import remote_code_problem

ATTENTION = "eager"
# What from_pretrained reads weights from: one file, or the index of a sharded checkpoint.
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class TransformersSpec(ModelSpecBase):
    source: Literal["transformers"]
    path: LocalPath | None = None  # a save_pretrained folder (config.json and the weights) on this machine
    config: dict[str, Any] | None = Field(default=None, min_length=1)  # AutoConfig.for_model's keys, model_type first
    architecture: str = "AutoModel"  # a transformers class: AutoModelForSequenceClassification, BertForMaskedLM, ...

    @model_validator(mode="after")
    def _one_origin(self) -> TransformersSpec:
        if (self.path is None) == (self.config is None):
            raise ValueError("source 'transformers' needs exactly one of 'path' (a save_pretrained folder) or "
                             "'config' (a mapping with model_type)")
        if self.path is not None and (self.init != "default" or self.seed is not None):
            key = "init" if self.init != "default" else "seed"
            raise ValueError(f"'{key}' applies only to a seeded init ('config:'); a 'path:' folder has its own weights")
        return self


def _transformers():
    try:
        with quiet_library_imports():  # transformers imports torchao, when installed
            import transformers
    except ImportError as exc:
        raise ParityError("source 'transformers' needs the transformers package: "
                          "pip install 'parity[transformers]'") from exc
    return transformers


def _model_classes(transformers) -> list[str]:
    """The names an `architecture:` can take, for did-you-mean: the Auto classes and the model classes."""
    return [n for n in dir(transformers) if n[:1].isupper() and (n.endswith("Model") or "For" in n)]


def model_class(name: str):
    """The transformers class `name` names: an Auto class or a PreTrainedModel subclass."""
    transformers = _transformers()
    try:
        with quiet_library_imports():  # a model class's module imports transformers' quantizers, torchao among them
            cls = getattr(transformers, name, None) if name.isidentifier() else None
    except (ImportError, RuntimeError) as exc:  # a class whose own dependencies are not installed here
        raise ParityError(f"transformers class '{name}' cannot be imported here: {first_line(exc)}") from exc
    if not isinstance(cls, type) or not (hasattr(cls, "from_config") or issubclass(cls, transformers.PreTrainedModel)):
        raise ParityError(f"unknown transformers model class '{name}'{did_you_mean(name, _model_classes(transformers))}")
    return cls


def model_config(mapping: dict[str, Any]):
    """`AutoConfig.for_model(**mapping)`; an unknown model_type or a missing one is one line."""
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = mapping.get("model_type")
    known = list(CONFIG_MAPPING.keys())
    if not isinstance(model_type, str):
        raise ParityError("'config' needs 'model_type' (e.g. bert, gpt2, vit): the transformers model family")
    if model_type not in known:
        raise ParityError(f"unknown transformers model_type '{model_type}'{did_you_mean(model_type, known)}")
    rest = {k: v for k, v in mapping.items() if k != "model_type"}
    try:
        return transformers.AutoConfig.for_model(model_type, **rest)
    except (TypeError, ValueError) as exc:
        raise ParityError(f"transformers config for model_type '{model_type}': {first_line(exc)}") from exc


def folder_problem(folder: Path) -> str | None:
    """Why `folder` is not a save_pretrained folder parity can read, or None."""
    if not folder.is_dir():
        return f"transformers model folder not found: {folder} (a local save_pretrained folder; nothing is downloaded)"
    special = special_file_problem(folder, "transformers model folder: file")  # before any file is opened
    if special:
        return special
    if not (folder / "config.json").is_file():
        return f"no config.json in {folder}: not a save_pretrained folder"
    remote = remote_code_problem(folder)
    if remote:
        return remote
    if not any((folder / name).is_file() for name in WEIGHTS_FILES):
        return f"no weights in {folder} ({' or '.join(WEIGHTS_FILES[::2])}, as save_pretrained writes them)"
    return None


def _from_config(cls, config, params: dict):
    if hasattr(cls, "from_config"):  # an Auto class
        return cls.from_config(config, trust_remote_code=False, attn_implementation=ATTENTION, **params)
    return cls._from_config(config, attn_implementation=ATTENTION, **params)


def build_transformers(spec, folder: Path | None):
    cls = model_class(spec.architecture)
    if "trust_remote_code" in spec.params:
        raise ParityError("'params' may not set trust_remote_code: parity never runs a model folder's own code")
    params = {k: v for k, v in spec.params.items() if k != "use_cache"}
    if folder is None:
        model = _from_config(cls, model_config(spec.config), params)
    else:
        problem = folder_problem(folder)
        if problem:
            raise ParityError(problem)
        try:
            model = cls.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                        attn_implementation=ATTENTION, **params)
        except (OSError, ValueError) as exc:  # no weights file, a config the class does not take
            raise ParityError(f"transformers could not load {folder} as {spec.architecture}: {first_line(exc)}") from exc
    return cache_off(model, spec)


def cache_off(model, spec):
    """`model` with its key-value cache turned off, unless the spec's `params` set `use_cache`."""
    keep = bool(spec.params.get("use_cache", False))
    # An encoder-decoder's encoder has no cache (T5's encoder stack refuses use_cache): off on its modules' configs.
    encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else None
    encoder_configs = set() if encoder is None else {id(getattr(m, "config", None)) for m in encoder.modules()}
    for module in model.modules():  # an encoder-decoder's stacks have configs of their own (T5's decoder)
        if getattr(getattr(module, "config", None), "use_cache", None) is not None:
            module.config.use_cache = keep and id(module.config) not in encoder_configs
    return model


def cache_note(spec, model) -> list[str]:
    """What the record says of a model whose cache parity turned off (every model that has one, unless its
    `params` set `use_cache`)."""
    if getattr(model.config, "use_cache", None) is False and "use_cache" not in spec.params:
        return ["use_cache off: the decoder's key-value cache is not among the outputs compared (no exporter "
                "takes the cache object); set params: {use_cache: true} to compare it where a backend can"]
    return []


def files_digest(folder: Path) -> str:
    """Every file below `folder` (config, weights, tokenizer), outside hidden folders, by relative path and
    content, read in chunks: weights files are large."""
    h = hashlib.sha256()
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(here, name)
            h.update(str(path.relative_to(folder)).encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


class _NoLossNotice(logging.Filter):
    """transformers says a model without a training loss has "`loss_type=None` ... unrecognized" whenever its
    attributes are listed (torch.jit.trace does, for TorchScript and OpenVINO): parity computes no loss."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("`loss_type=")


def _drop_loss_notice() -> None:
    logger = logging.getLogger("transformers.modeling_utils")
    if not any(isinstance(f, _NoLossNotice) for f in logger.filters):
        logger.addFilter(_NoLossNotice())


class TransformersSource(Source):
    name = "transformers"
    names_code = False
    Spec = TransformersSpec
    libraries = ("transformers",)

    def build(self, spec, experiment):
        with quiet_library_imports():  # transformers imports torchao, when installed, as it builds a model
            transformers = _transformers()
            _drop_loss_notice()
            bar = transformers.utils.logging.is_progress_bar_enabled()
            transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar, among parity's own
            try:
                return build_transformers(spec, None if spec.path is None else experiment.resolve(spec.path))
            finally:
                if bar:
                    transformers.utils.logging.enable_progress_bar()

    def notes(self, spec, model):
        return cache_note(spec, model)

    def files_digest(self, spec, experiment):
        """The folder's files when `path:`; a `config:` model is the library's code and the seed alone."""
        return "" if spec.path is None else files_digest(experiment.resolve(spec.path))

    def problems(self, spec, experiment):
        try:
            _transformers()
        except ParityError as exc:
            return [(("source",), exc.problems[0])]
        out = []
        try:
            model_class(spec.architecture)
        except ParityError as exc:
            out.append((("architecture",), exc.problems[0]))
        if spec.path is not None:
            problem = folder_problem(experiment.resolve(spec.path))
            if problem:
                out.append((("path",), problem))
        else:
            try:
                model_config(spec.config)
            except ParityError as exc:
                out.append((("config",), exc.problems[0]))
        return out


SOURCE = TransformersSource()
