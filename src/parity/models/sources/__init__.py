"""Where models come from: one `Source` per module here (torchvision, repo, python), registered in the
`parity.sources` entry-point group; a third-party package registers its own the same way.

Nothing here downloads: a source reads files on this machine only.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from parity.errors import ParityError
from parity.files import file_problem

if TYPE_CHECKING:
    import torch

    from parity.config.schema import ModelSpecBase

Problem = tuple[tuple, str]

# What a source builds (`Source.kind`), in words for messages: a Python module whose forward calls its
# submodules, or a module that runs a file of another kind. A backend says which it takes
# (`Backend.model_kinds`, `Backend.model_problem`).
MODEL_KINDS = {"module": "a PyTorch module", "exported": "a torch.export program (.pt2)",
               "torchscript": "a TorchScript module (.pt)", "onnx": "an ONNX graph file"}  # (key path under the model, message), as experiment/validate.py reports them


class Source(ABC):
    """A model source. Its module is imported when an experiment names it (config/ validates `models[i]`
    with `Spec`), so it imports torch and the libraries it builds with inside its methods."""

    name: ClassVar[str]
    # This source's keys: a subclass of config.schema.ModelSpecBase with `source: Literal["<name>"]`.
    Spec: ClassVar[type[ModelSpecBase]]
    # The distributions (as pip names them) the models of this source are built with: their versions are
    # part of the key of every artifact exported from such a model (execute/cache.py).
    libraries: ClassVar[tuple[str, ...]] = ()
    # Whether `weights: DEFAULT` means something: the source's own pretrained weights, found on this machine.
    default_weights: ClassVar[bool] = False
    # What `build` returns (MODEL_KINDS): "module", a Python module whose forward calls its
    # submodules, is what every backend runs and tier 2 hooks; a module that runs a file ("torchscript",
    # "exported", "onnx") is run only by the backends that take that kind, and runs no module hooks.
    kind: ClassVar[str] = "module"
    # Whether building a spec of this source imports or runs code the spec names (a `python` entry, a `repo`
    # folder, a TorchScript program). `parity reduce` rebuilds a model from a records file only when its
    # source names none, unless the user vouches for that code (reduce.records_code). A source that does not
    # say is taken to name code.
    names_code: ClassVar[bool] = True

    @abstractmethod
    def build(self, spec: Any, experiment: Any) -> torch.nn.Module:
        """A new module for `spec` (seeded by the caller; weights files and eval mode are the caller's)."""

    def notes(self, spec: Any, model: torch.nn.Module) -> list[str]:
        """What this source changed in the built `model` so that every backend can run it, for the model
        record (transformers: a decoder's cache turned off)."""
        return []

    def files_digest(self, spec: Any, experiment: Any) -> str | None:
        """A digest of the files the model is read from, beyond the module objects ('' when there are none,
        None when they cannot be digested: then exports are never cached). Called after `build`."""
        return ""

    def problems(self, spec: Any, experiment: Any) -> list[Problem]:
        """What is wrong with `spec` on this machine (a folder, a name in a library), found before anything
        runs."""
        return []


@contextlib.contextmanager
def folder_first(folder: Path):
    """`folder` first on sys.path while in the block; only sys.path is restored after it."""
    saved_path = list(sys.path)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved_path


def loaded_from(module: Any, folder: Path) -> bool:
    """Whether `module` was imported from a file (or is a package) below `folder`."""
    own = getattr(module, "__dict__", {})  # not getattr: some modules (torch.classes) answer every name
    places = [own.get("__file__")]
    try:
        places += list(own.get("__path__") or [])  # a package's folders (a namespace package has no file)
    except TypeError:
        pass
    for place in places:
        if isinstance(place, str) and Path(place).resolve().is_relative_to(folder):
            return True
    return False


@contextlib.contextmanager
def isolated_import_path(folder: Path):
    """Import from `folder`, then leave sys.path as it was and forget the modules imported from the folder:
    the next model may have a module of the same name (`model.py`, `utils`) that must not resolve to this
    one. Libraries the folder's code imported for the first time (torch's and transformers' internals) stay
    imported: unloading them half-way breaks what registered itself once per process (torch libraries,
    pytree nodes), and every export after it."""
    saved_modules = set(sys.modules)
    try:
        with folder_first(folder):
            yield
    finally:
        root = folder.resolve()
        for name in set(sys.modules) - saved_modules:
            if loaded_from(sys.modules[name], root):
                del sys.modules[name]
        importlib.invalidate_caches()


def call_factory(factory, params: dict, what: str) -> torch.nn.Module:
    """`factory(**params)`, which must return a module; a ParityError names `what` when it does not."""
    import torch

    try:
        model = factory(**params)
    except TypeError as exc:
        raise ParityError(f"{what} does not accept params {sorted(params)}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise ParityError(f"{what} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def model_file_problem(path: Path, suffixes: tuple[str, ...], what: str) -> str | None:
    """Why `path` cannot be the model file of a source that reads `what` from `suffixes` files, or None: not
    there, not a regular file (a FIFO would block), or another suffix (a `.onnx` given to `source:
    torchscript` is a mix-up better said now than as a loader's traceback)."""
    problem = file_problem(path, f"{what} file")
    if problem:
        return problem
    if path.suffix.lower() not in suffixes:
        return f"{what} file {path}: expected a {' or '.join(suffixes)} file, not '{path.suffix or path.name}'"
    return None


def file_digest(path: Path) -> str:
    """The sha256 of a model file's bytes: what the artifact cache keys that model's exports on."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
