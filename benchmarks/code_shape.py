"""The shape of src/parity at two commits, side by side: what issue #25 ("the verdict in one home") asks to
see before and after.

- lines per package (every line of its .py files);
- the five longest functions (lines from `def` to the end of the body);
- imports of parity's own modules inside functions, in library code (the front ends cli.py, api.py,
  pytest_plugin.py, quick.py and check_command.py excluded: a command imports what it runs when it runs);
- upward edges: imports (at module level or inside a function) from a layer to a layer above it, in the layers
  of pyproject.toml's first import-linter contract read at that commit (its `ignore_imports` are what let
  such edges through).

    .venv/bin/python benchmarks/code_shape.py 13aa4a7 HEAD
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

import tomllib

FRONT_ENDS = {"parity.cli", "parity.api", "parity.pytest_plugin", "parity.quick", "parity.check_command"}


def checkout(ref: str, into: Path) -> Path:
    """src/ and pyproject.toml of commit `ref`, unpacked into `into`."""
    data = subprocess.run(["git", "archive", ref, "src", "pyproject.toml"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(into, filter="data")
    return into


def modules(root: Path) -> dict[str, ast.Module]:
    found = {}
    for path in sorted((root / "src" / "parity").rglob("*.py")):
        parts = path.relative_to(root / "src").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = (path, ast.parse(path.read_text()))
    return found


def imported(name: str, node: ast.Import | ast.ImportFrom, package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = name.split(".") if package else name.split(".")[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    for index, layer in enumerate(layers):
        if any(module == m or module.startswith(m + ".") for m in layer):
            return index
    return None


def shape(root: Path) -> dict:
    contract = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    layers = [[m.strip() for m in entry.replace("|", ":").split(":")] for entry in contract["layers"]]
    found = modules(root)
    lines: Counter[str] = Counter()
    functions, nested, upward = [], [], set()
    for name, (path, tree) in found.items():
        top = name.split(".")[:2] if "." in name else ["-"]
        package = ".".join(top) if (root / "src" / Path(*top)).is_dir() else "parity (top level)"
        lines[package] += len(path.read_text().splitlines())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom) and name not in FRONT_ENDS:
                        if any(t.startswith("parity") for t in imported(name, inner, path.name == "__init__.py")):
                            nested.append(name)
            if isinstance(node, ast.Import | ast.ImportFrom):
                mine = layer_of(name, layers)
                for target in imported(name, node, path.name == "__init__.py"):
                    theirs = layer_of(target, layers) if target in found or target.rsplit(".", 1)[0] in found else None
                    if mine is not None and theirs is not None and theirs < mine:
                        upward.add((name, target.rsplit(".", 1)[0] if target not in found else target))
    return {"lines": lines, "total": sum(lines.values()), "modules": len(found),
            "longest": sorted(functions, reverse=True)[:5], "nested": Counter(nested), "upward": sorted(upward),
            "ignored": len(contract.get("ignore_imports", []))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help="commits to compare (e.g. 13aa4a7 HEAD)")
    args = parser.parse_args()
    shapes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ref in args.refs:
            shapes[ref] = shape(checkout(ref, Path(tmp) / ref))
    refs = list(shapes)
    print("| | " + " | ".join(refs) + " |\n|---|" + "---|" * len(refs))
    print("| modules | " + " | ".join(str(shapes[r]["modules"]) for r in refs) + " |")
    print("| lines | " + " | ".join(str(shapes[r]["total"]) for r in refs) + " |")
    for package in sorted(set().union(*(shapes[r]["lines"] for r in refs))):
        print(f"| {package} | " + " | ".join(str(shapes[r]["lines"].get(package, 0)) for r in refs) + " |")
    print("| function-level imports of parity in library code | "
          + " | ".join(str(sum(shapes[r]["nested"].values())) for r in refs) + " |")
    print("| upward import edges | " + " | ".join(str(len(shapes[r]["upward"])) for r in refs) + " |")
    print("| ignore_imports lines | " + " | ".join(str(shapes[r]["ignored"]) for r in refs) + " |")
    for ref in refs:
        print(f"\n{ref}: five longest functions: "
              + "; ".join(f"{name} ({n})" for n, name in shapes[ref]["longest"]))
        print(f"{ref}: function-level imports by module: "
              + ", ".join(f"{m} {n}" for m, n in shapes[ref]["nested"].most_common(6)))
        print(f"{ref}: upward edges: " + (", ".join(f"{a} -> {b}" for a, b in shapes[ref]["upward"]) or "none"))


if __name__ == "__main__":
    main()
