"""`source: torchscript` (a `.pt` that `torch.jit.save` wrote, read with `torch.jit.load` on the CPU) and
`source: exported` (a `.pt2` that `torch.export.save` wrote; its `ExportedProgram.module()` is the model): a
saved model file as the model, its weights and code both from the file.

Both give torch modules, so the backends that take modules run them; what each backend can do with one is
its `model_kinds` (a ScriptModule cannot be compiled or exported by the dynamo exporter). Neither runs module
hooks: the file's modules hold weights, but its graph, not their Python forward, computes (tier 2 is refused).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from parity.config.schema import LocalPath, ModelSpecBase
from parity.errors import ParityError
from parity.models.sources import Source, file_digest, model_file_problem


class FileSpecBase(ModelSpecBase):
    """A model read whole from one file: `path`; the file holds its weights and its code."""

    path: LocalPath

    @model_validator(mode="after")
    def _whole_file(self) -> FileSpecBase:
        if self.weights is not None:
            raise ValueError(f"source '{self.source}' reads the weights from 'path'; leave 'weights' out")
        if self.init != "default" or self.seed is not None:
            raise ValueError(f"source '{self.source}' keeps the file's weights; "
                             f"'{'init' if self.init != 'default' else 'seed'}' does not apply")
        if self.params:
            raise ValueError(f"source '{self.source}' builds nothing; 'params' does not apply")
        return self


class FileSource(Source):
    """A source whose model is one file of `suffixes`, read by `load`."""

    suffixes: ClassVar[tuple[str, ...]]
    what: ClassVar[str]  # the kind of file, for messages

    @abstractmethod
    def load(self, path):
        """The model in the file at `path` (a module on the CPU)."""

    def build(self, spec, experiment):
        path = experiment.resolve(spec.path)
        problem = model_file_problem(path, self.suffixes, self.what)
        if problem:
            raise ParityError(f"model '{spec.name}': {problem}")
        try:
            return self.load(path)
        except ParityError as exc:  # refused: it would run code
            raise ParityError(f"model '{spec.name}': {exc}") from exc
        except Exception as exc:  # a corrupt or foreign file: the loader's first line says what it found
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ParityError(f"model '{spec.name}': {path} is not a {self.what} file this torch can read "
                              f"({type(exc).__name__}: {first})") from exc

    def files_digest(self, spec, experiment):
        """The file's bytes: code and weights are both in it."""
        return file_digest(experiment.resolve(spec.path))

    def problems(self, spec, experiment):
        problem = model_file_problem(experiment.resolve(spec.path), self.suffixes, self.what)
        return [(("path",), problem)] if problem else []


class TorchScriptSpec(FileSpecBase):
    source: Literal["torchscript"]


class TorchScriptSource(FileSource):
    name = "torchscript"
    Spec = TorchScriptSpec
    kind = "torchscript"
    suffixes = (".pt", ".pth", ".ts")
    what = "TorchScript"

    def load(self, path):
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
            return torch.jit.load(str(path), map_location="cpu")


class ExportedSpec(FileSpecBase):
    source: Literal["exported"]


class ExportedSource(FileSource):
    name = "exported"
    names_code = False
    Spec = ExportedSpec
    kind = "exported"
    suffixes = (".pt2",)
    what = "torch.export"

    def load(self, path):
        """The program's module, with the train()/eval() it refuses given back: its graph computes as it was
        exported (in whichever mode), and parity's eval() then only sets the flags it would have set."""
        module = load_exported(path).module()
        del module.train, module.eval  # ExportedProgram.module() sets both to raise NotImplementedError
        return module


# What a .pt2 archive may hold that loading it would run as code: compiled AOTInductor models (a shared
# library), and constants unpickled with plain pickle (opaque objects) or TorchScript's (custom objects).
CODE_IN_PT2 = ("data/aotinductor/", "data/constants/opaque_obj", "data/constants/custom_obj")


def load_exported(path) -> Any:
    """`torch.export.load` with `weights_only` semantics: torch.export.load unpickles weights, constants and
    sample inputs, falling back to `weights_only=False` (code runs) when the safe unpickler refuses one. Here
    every torch.load inside it is forced to weights_only (TORCH_FORCE_WEIGHTS_ONLY_LOAD), and an archive
    holding native code or objects unpickled otherwise is refused before it is opened: a ParityError."""
    import logging
    import os
    import pickle
    import zipfile

    import torch

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:  # said by the caller as a file this torch cannot read
        raise ValueError(f"not a zip archive ({exc})") from exc
    code = next((n for n in names if any(f"/{part}" in f"/{n}" for part in CODE_IN_PT2)), None)
    if code is not None:
        raise ParityError(f"{path}: holds {code}, which loading would run as code (compiled native code or a "
                          "pickled object); parity loads only exported programs whose weights are tensors")
    export_log = logging.getLogger("torch.export")
    saved = {k: os.environ.pop(k, None) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    level = export_log.level
    export_log.setLevel(logging.CRITICAL)  # it logs a traceback before trying the older format, then raises
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        return torch.export.load(str(path))
    except pickle.UnpicklingError as exc:
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ParityError(f"{path}: holds a pickle that is not only tensors and plain values, refused unloaded "
                          f"(weights_only: {detail[:200]})") from exc
    finally:
        export_log.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


TORCHSCRIPT = TorchScriptSource()
EXPORTED = ExportedSource()
