"""The shape of src/parity at two commits, side by side: what issue #25 ("the verdict in one home") asks to
see before and after.

- lines per package (every line of its .py files);
- the five longest functions (lines from `def` to the end of the body);
- imports of parity's own modules inside functions, in library code (the front ends cli.py, api.py,
  pytest_plugin.py, check_command.py, reduce.py and completion.py excluded: a command imports what it runs
  when it runs);
- upward edges: imports (at module level or inside a function) from a layer to a layer above it, in every
  `layers` contract of pyproject.toml's import-linter section (the top-level one and each folder's, within its
  `containers`), read at that commit or, with `--contracts REF`, at one commit for all (the later contracts
  judge the earlier code); its `ignore_imports` are what let such edges through;
- string-key reads: `x["k"]` (a subscript by a string constant, read; not `Literal["k"]`) and `x.get("k", ...)`, in src/parity and in
  report/ alone (issue 40: readers use attributes);
- twin types: a class name (or a type alias: a capitalized name bound at module level to a subscripted type, a
  union or a class) defined in more than one module, and how many modules define each;
- circles per folder: in each package, its `__init__` and its direct children (a subpackage standing for all
  its modules), an arrow where one imports the other; a circle is a strongly connected set of two or more
  (`inputs/__init__` importing `inputs/text` inside a function, which imports `Inputs` from `inputs/__init__`).

    .venv/bin/python benchmarks/code_shape.py 13aa4a7 HEAD
    .venv/bin/python benchmarks/code_shape.py da56ee7 HEAD --contracts HEAD
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import shutil
import subprocess
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

import tomllib

FRONT_ENDS = {"parity.cli", "parity.api", "parity.pytest_plugin", "parity.check_command", "parity.reduce",
              "parity.completion"}


def checkout(ref: str, into: Path) -> Path:
    """src/ and pyproject.toml of commit `ref`, unpacked into `into` (the working tree's own for `ref` "."),"""
    if ref == ".":
        shutil.copytree("src", into / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        shutil.copy("pyproject.toml", into / "pyproject.toml")
        return into
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


def orders(contracts: list[dict]) -> list[list[list[str]]]:
    """Every `layers` contract's layers as absolute module names, one list per container (or the root)."""
    found = []
    for contract in contracts:
        if contract.get("type") != "layers":
            continue
        for container in contract.get("containers") or [""]:
            prefix = container + "." if container else ""
            found.append([[prefix + m.strip() for m in entry.replace("|", ":").split(":")]
                          for entry in contract["layers"]])
    return found


def targets(name: str, node: ast.Import | ast.ImportFrom, package: bool, found: dict) -> set[str]:
    """The modules of parity an import statement reaches: `from parity.x import y` is `parity.x.y` when that is a
    module, else `parity.x` (whose attribute y is)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in found}
    base, *names = imported(name, node, package)
    reached = {n if n in found else base for n in names}
    return {t for t in reached if t in found and t != name}


def edges(found: dict) -> set[tuple[str, str]]:
    """(importer, imported module) for every import of parity's own modules, at any depth of the code."""
    arrows = set()
    for name, (path, tree) in found.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                arrows |= {(name, t) for t in targets(name, node, path.name == "__init__.py", found)}
    return arrows


def _child(package: str, module: str) -> str | None:
    """What stands for `module` among `package`'s `__init__` (the package's name) and children, or None."""
    if module == package:
        return package
    if module.startswith(package + "."):
        return package + "." + module[len(package) + 1:].split(".")[0]
    return None


def circles(found: dict, arrows: set[tuple[str, str]]) -> list[list[str]]:
    """Per package: the strongly connected sets of two or more among its `__init__` and its children."""
    packages = [n for n, (path, _) in found.items() if path.name == "__init__.py"]
    result = []
    for package in packages:
        node = functools.partial(_child, package)
        graph: dict[str, set[str]] = {}
        for a, b in arrows:
            na, nb = node(a), node(b)
            # the package's own arrows come from its __init__ only; a child's from anything under it
            if na and nb and na != nb and not (na == package and a != package):
                graph.setdefault(na, set()).add(nb)
        result += [sorted(c) for c in strongly_connected(graph) if len(c) > 1]
    return sorted(result)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            out.append(component)

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def string_keys(tree: ast.Module) -> int:
    """`x["k"]` read and `x.get("k"...)` calls in `tree`; `Literal["k"]`, a type, is not a read."""
    found = 0
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                and not _is_literal(node.value)):
            found += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found += 1
    return found


def _is_literal(node: ast.expr) -> bool:
    """`Literal` or `typing.Literal`."""
    return (isinstance(node, ast.Name) and node.id == "Literal") or (
        isinstance(node, ast.Attribute) and node.attr == "Literal")


def type_names(tree: ast.Module) -> set[str]:
    """The classes and type aliases a module defines at its top level."""
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript | ast.BinOp | ast.Name | ast.Attribute):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name) and t.id[:1].isupper() and not t.id.isupper()}
    return names


def shape(root: Path, contracts_root: Path) -> dict:
    contracts = tomllib.loads((contracts_root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    found = modules(root)
    arrows = edges(found)
    upward = set()
    for layers in orders(contracts):
        for a, b in arrows:
            mine, theirs = layer_of(a, layers), layer_of(b, layers)
            if mine is not None and theirs is not None and theirs < mine:
                upward.add((a, b))
    lines: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    defined: dict[str, list[str]] = {}
    functions, nested = [], []
    for name, (path, tree) in found.items():
        keys[name] = string_keys(tree)
        for type_name in type_names(tree):
            defined.setdefault(type_name, []).append(name)
        top = name.split(".")[:2] if "." in name else ["-"]
        package = ".".join(top) if (root / "src" / Path(*top)).is_dir() else "parity (top level)"
        lines[package] += len(path.read_text().splitlines())
        inside = set()  # each import statement in a function once, however deep the functions nest
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
                inside |= {s for s in ast.walk(node) if isinstance(s, ast.Import | ast.ImportFrom)}
        if not any(name == f or name.startswith(f + ".") for f in FRONT_ENDS):  # parity.cli is a package
            nested += [name for s in inside if targets(name, s, path.name == "__init__.py", found)]
    return {"lines": lines, "total": sum(lines.values()), "modules": len(found),
            "longest": sorted(functions, reverse=True)[:5], "nested": Counter(nested), "upward": sorted(upward),
            "circles": circles(found, arrows),
            "keys": sum(keys.values()), "report_keys": sum(n for m, n in keys.items() if m.startswith("parity.report")),
            "twins": {t: ms for t, ms in sorted(defined.items()) if len(ms) > 1},
            "ignored": sum(len(c.get("ignore_imports", [])) for c in contracts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help="commits to compare (e.g. 13aa4a7 HEAD; '.' the working tree)")
    parser.add_argument("--contracts", help="read every commit's layers from this commit's pyproject.toml")
    args = parser.parse_args()
    shapes = {}
    with tempfile.TemporaryDirectory() as tmp:
        contracts = checkout(args.contracts, Path(tmp) / "contracts") if args.contracts else None
        for ref in args.refs:
            tree = checkout(ref, Path(tmp) / ref.replace("/", "_"))
            shapes[ref] = shape(tree, contracts or tree)
    refs = list(shapes)
    print("| | " + " | ".join(refs) + " |\n|---|" + "---|" * len(refs))
    print("| modules | " + " | ".join(str(shapes[r]["modules"]) for r in refs) + " |")
    print("| lines | " + " | ".join(str(shapes[r]["total"]) for r in refs) + " |")
    for package in sorted(set().union(*(shapes[r]["lines"] for r in refs))):
        print(f"| {package} | " + " | ".join(str(shapes[r]["lines"].get(package, 0)) for r in refs) + " |")
    print("| function-level imports of parity in library code | "
          + " | ".join(str(sum(shapes[r]["nested"].values())) for r in refs) + " |")
    print("| upward import edges | " + " | ".join(str(len(shapes[r]["upward"])) for r in refs) + " |")
    print("| string-key reads in src/parity | " + " | ".join(str(shapes[r]["keys"]) for r in refs) + " |")
    print("| string-key reads in report/ | " + " | ".join(str(shapes[r]["report_keys"]) for r in refs) + " |")
    print("| twin type names (modules defining them) | " + " | ".join(
        f"{len(shapes[r]['twins'])} ({sum(map(len, shapes[r]['twins'].values()))})" for r in refs) + " |")
    print("| circles per folder | " + " | ".join(str(len(shapes[r]["circles"])) for r in refs) + " |")
    print("| ignore_imports lines | " + " | ".join(str(shapes[r]["ignored"]) for r in refs) + " |")
    for ref in refs:
        print(f"\n{ref}: five longest functions: "
              + "; ".join(f"{name} ({n})" for n, name in shapes[ref]["longest"]))
        print(f"{ref}: function-level imports by module: "
              + ", ".join(f"{m} {n}" for m, n in shapes[ref]["nested"].most_common(6)))
        print(f"{ref}: upward edges: " + (", ".join(f"{a} -> {b}" for a, b in shapes[ref]["upward"]) or "none"))
        print(f"{ref}: twin types: " + ("; ".join(f"{t} ({', '.join(ms)})" for t, ms in shapes[ref]["twins"].items())
                                             or "none"))
        print(f"{ref}: circles: " + ("; ".join(" <-> ".join(c) for c in shapes[ref]["circles"]) or "none"))


if __name__ == "__main__":
    main()
