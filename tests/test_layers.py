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


def _folders() -> dict[str, list[str]]:
    """Each package of parity (but parity itself, whose layers are the first contract's) and its children."""
    found: dict[str, list[str]] = {}
    for module in _modules():
        parent = module.rpartition(".")[0]
        if parent and parent != "parity":
            found.setdefault(parent, []).append(module.rpartition(".")[2])
    return found


def test_every_folder_orders_its_own_modules():
    """Inside each folder too, imports point down: a folder of two or more modules has a layers contract that
    names every one of them (`exhaustive`), or an independence contract over all of them."""
    ordered = {container for c in CONTRACTS if c["type"] == "layers" and c.get("exhaustive")
               for container in c.get("containers", [])}
    apart = {tuple(sorted(c["modules"])) for c in CONTRACTS if c["type"] == "independence"}
    loose = [package for package, children in sorted(_folders().items()) if len(children) > 1
             and package not in ordered
             and tuple(sorted(f"{package}.{child}" for child in children)) not in apart]
    assert loose == [], f"give these folders a layers contract in pyproject.toml: {loose}"


def test_no_circle_goes_through_a_packages_init():
    """Every package is checked for circles between its children (acyclic_siblings from the root); and each
    package whose `__init__` imports its children forbids them to import it back, which acyclic_siblings,
    whose nodes are a package's children, cannot see."""
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["parity"] for c in CONTRACTS)
    src = ROOT / "src"
    above = sorted(".".join(p.parent.relative_to(src).parts) for p in (src / "parity").rglob("__init__.py")
                   if f"from {'.'.join(p.parent.relative_to(src).parts)}." in p.read_text())
    guarded = {m for c in CONTRACTS if c["type"] == "forbidden" and not c.get("as_packages", True)
               for m in c["forbidden_modules"]}
    assert [p for p in above if p != "parity" and p not in guarded] == []


def test_no_module_of_the_command_line_passes_400_lines():
    """The command line is a package of modules each small enough to read whole (issue 40): a verb's command goes
    in the module of its group, or in a new one placed in the command line's contract."""
    long = {p.name: n for p in (ROOT / "src" / "parity" / "cli").glob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}
