"""The import contract (pyproject.toml's [tool.importlinter], `make lint`) covers every module of parity and
makes no exceptions: a module left out of every layer, or an `ignore_imports` line, would let an import point
up the layers of docs/architecture.md without `lint-imports` saying so."""

from __future__ import annotations

import tomllib

from tests.support import ROOT

CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _modules() -> list[str]:
    src = ROOT / "src"
    return sorted(".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
                  for p in (src / "parity").rglob("*.py"))


def test_the_import_contract_makes_no_exceptions():
    assert [c["name"] for c in CONTRACTS if c.get("ignore_imports")] == []


def test_every_module_of_parity_is_in_a_layer():
    layers = next(c for c in CONTRACTS if not c.get("containers"))["layers"]
    placed = [m.strip() for layer in layers for m in layer.split(":")]
    unplaced = [m for m in _modules() if m not in ("parity", "parity.__main__")
                and not any(m == p or m.startswith(p + ".") for p in placed)]
    assert unplaced == [], f"add these to a layer of pyproject.toml's import contract: {unplaced}"
