"""Every script of benchmarks/ and study/ imports (its `main` not run): a name it imports from parity that moved
or was removed fails here, not on the day someone runs the benchmark."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.support import ROOT

SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "study").glob("*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_script_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(path.parent))  # as it runs: its own folder first on the path
    monkeypatch.setattr(sys, "argv", [str(path)])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, module)  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
