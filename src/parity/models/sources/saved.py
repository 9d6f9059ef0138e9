"""`source: torchscript` (a `.pt` that `torch.jit.save` wrote, read with `torch.jit.load` on the CPU) and
`source: exported` (a `.pt2` that `torch.export.save` wrote; its `ExportedProgram.module()` is the model): a
saved model file as the model, its weights and code both from the file.

Both give torch modules, so the backends that take modules run them; what each backend can do with one is
its `model_kinds` (a ScriptModule cannot be compiled or exported by the dynamo exporter). Neither runs module
hooks: the file's modules hold weights, but its graph, not their Python forward, computes (tier 2 is refused).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Literal

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
    Spec = ExportedSpec
    kind = "exported"
    suffixes = (".pt2",)
    what = "torch.export"

    def load(self, path):
        """The program's module, with the train()/eval() it refuses given back: its graph computes as it was
        exported (in whichever mode), and parity's eval() then only sets the flags it would have set."""
        import logging

        import torch

        export_log = logging.getLogger("torch.export")
        level = export_log.level
        export_log.setLevel(logging.ERROR)  # it logs a traceback before trying the older format, then raises
        try:
            module = torch.export.load(str(path)).module()
        finally:
            export_log.setLevel(level)
        del module.train, module.eval  # ExportedProgram.module() sets both to raise NotImplementedError
        return module


TORCHSCRIPT = TorchScriptSource()
EXPORTED = ExportedSource()
