"""`source: python`: an importable callable (`entry: package.module:attr`) that returns the model, imported
with the experiment file's folder first on `sys.path` (as a `repo` folder is), so a file runs the same from
any working directory."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from parity import fingerprint
from parity.config.schema import ModelSpecBase
from parity.errors import ParityError
from parity.models.sources import Source, call_factory, folder_first
from parity.registry import import_object, split_ref


class PythonSpec(ModelSpecBase):
    source: Literal["python"]
    entry: str


def import_entry(entry: str, folder: Path):
    """The callable `entry` names, looked up from `folder` first; a module found nowhere says where it looked.
    Its modules stay imported (the artifact cache digests the entry's module file after the build)."""
    with folder_first(folder):
        try:
            return import_object(entry, "model entry")
        except ParityError as exc:
            missing = getattr(exc.__cause__, "name", None) if isinstance(exc.__cause__, ModuleNotFoundError) else None
            module = split_ref(entry)[0]
            if not missing or not (module == missing or module.startswith(missing + ".")):
                raise  # the entry's module was found; something it imports was not
            raise ParityError(f"{exc.problems[0]} (looked in {folder}, the experiment file's folder, then on "
                              "sys.path; `entry` is module:callable with the module importable from there, e.g. "
                              "models:build for models.py next to the file)") from exc.__cause__


def build_python(entry: str, params: dict, folder: Path):
    return call_factory(import_entry(entry, folder), params, f"'{entry}'")


class PythonSource(Source):
    name = "python"
    Spec = PythonSpec

    def build(self, spec, experiment):
        return build_python(spec.entry, spec.params, experiment.base_dir)

    def files_digest(self, spec, experiment):
        """The entry's module file (imported by `build`)."""
        return fingerprint.module_digest(split_ref(spec.entry)[0])

    def problems(self, spec, experiment):
        try:
            import_entry(spec.entry, experiment.base_dir)
        except ParityError as exc:
            return [(("entry",), exc.problems[0])]
        return []


SOURCE = PythonSource()
