"""`source: repo`: someone's repository folder, its model made by `entry` (module:attr, imported from the
folder) or by a `hubconf.py` entry; imported in isolation, so the next model's modules of the same name
are its own."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Literal

from pydantic import model_validator

from parity import fingerprint
from parity.config.schema import LocalPath, ModelSpecBase
from parity.errors import ParityError, did_you_mean
from parity.files import special_file_problem
from parity.models.sources import Source, call_factory, isolated_import_path
from parity.registry import import_object


class RepoSpec(ModelSpecBase):
    source: Literal["repo"]
    path: LocalPath  # a folder on this machine
    entry: str | None = None
    hubconf: str | None = None

    @model_validator(mode="after")
    def _one_entry(self) -> RepoSpec:
        if (self.entry is None) == (self.hubconf is None):
            raise ValueError("source 'repo' needs exactly one of 'entry' (module:attr) or 'hubconf' (name)")
        return self


def build_repo(folder: Path, entry: str | None, hubconf: str | None, params: dict):
    if not folder.is_dir():
        raise ParityError(f"repository folder not found: {folder}")
    special = special_file_problem(folder, "repository folder: file")  # digested, imported: never a FIFO
    if special:
        raise ParityError(special)
    with isolated_import_path(folder):
        if hubconf is not None:
            module = importlib.import_module("hubconf")
            entries = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            if hubconf not in entries:
                raise ParityError(f"{folder}/hubconf.py has no entry '{hubconf}'{did_you_mean(hubconf, entries)}")
            factory = getattr(module, hubconf)
            what = f"hubconf entry '{hubconf}'"
        else:
            factory = import_object(entry, "model entry")
            what = f"'{entry}'"
        return call_factory(factory, params, what)


class RepoSource(Source):
    name = "repo"
    Spec = RepoSpec

    def build(self, spec, experiment):
        return build_repo(experiment.resolve(spec.path), spec.entry, spec.hubconf, spec.params)

    def files_digest(self, spec, experiment):
        """Every .py file of the folder, imported or not."""
        return fingerprint.folder_digest(experiment.resolve(spec.path))

    def problems(self, spec, experiment):
        repo = experiment.resolve(spec.path)
        if not repo.is_dir():
            return [(("path",), f"repository folder not found: {repo}")]
        special = special_file_problem(repo, "repository folder: file")
        if special:
            return [(("path",), special)]
        if spec.hubconf is not None and not (repo / "hubconf.py").is_file():
            return [(("hubconf",), f"no hubconf.py in {repo}")]
        return []


SOURCE = RepoSource()
