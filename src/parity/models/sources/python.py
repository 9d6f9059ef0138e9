"""`source: python`: an importable callable (`entry: package.module:attr`) that returns the model."""

from __future__ import annotations

from typing import Literal

from parity import fingerprint
from parity.config.schema import ModelSpecBase
from parity.errors import ParityError
from parity.models.sources import Source, call_factory
from parity.registry import import_object, split_ref


class PythonSpec(ModelSpecBase):
    source: Literal["python"]
    entry: str


def build_python(entry: str, params: dict):
    return call_factory(import_object(entry, "model entry"), params, f"'{entry}'")


class PythonSource(Source):
    name = "python"
    Spec = PythonSpec

    def build(self, spec, experiment):
        return build_python(spec.entry, spec.params)

    def files_digest(self, spec, experiment):
        """The entry's module file (imported by `build`)."""
        return fingerprint.module_digest(split_ref(spec.entry)[0])

    def problems(self, spec, experiment):
        try:
            import_object(spec.entry, "model entry")
        except ParityError as exc:
            return [(("entry",), exc.problems[0])]
        return []


SOURCE = PythonSource()
