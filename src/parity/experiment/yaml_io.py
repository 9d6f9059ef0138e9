"""Safe YAML loading that keeps line numbers and reads `1e-5` as a number.

PyYAML follows YAML 1.1, where a float needs a dot (`1.0e-5`); `1e-5` would arrive as a string.
Users write `1e-5`, so this loader resolves it as a float, as YAML 1.2 does.

Only the safe loader is used: tags that name Python objects (`!!python/object/apply:os.system`) are
refused. The document is composed first and checked before anything is constructed: aliases that
expand it beyond `MAX_VALUES` values ("billion laughs"), an alias inside itself, nesting deeper than
`MAX_DEPTH`, and keys that are lists or mappings are each one clear error, not a hang or a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from parity.errors import ParityError

KeyPath = tuple[str | int, ...]

MAX_FILE_BYTES = 1 << 20  # an experiment file is a page or two; this is far beyond any real one
MAX_VALUES = 100_000  # values in the document once every alias is expanded
MAX_DEPTH = 64  # levels of nesting
MAX_INT_DIGITS = 100  # of an integer: far beyond any seed, size or count
_MERGE = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        """Refuse keys that appear twice (a merge key `<<: *base` may be overridden, as YAML says)."""
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain name, not a list or a mapping", key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping (first on line {seen[key]})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        """An integer longer than any size or count: refused by its line, before Python's int(), which raises on
        over 4300 digits and takes quadratic time below that."""
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits} digits", node.start_mark)
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _lines(node: yaml.Node, path: KeyPath, out: dict[KeyPath, int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value
            out[path + (k,)] = key.start_mark.line + 1
            _lines(value, path + (k,), out)
            out[path + (k,)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, path + (i,), out)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _shape_problem(root: yaml.Node) -> tuple[yaml.Node, str] | None:
    """(node, problem) when the composed document loops into itself, nests deeper than MAX_DEPTH or
    expands beyond MAX_VALUES values through aliases; None when it is fine. Iterative, and each node is
    sized once, so a hostile document costs as much as its text, not as much as its expansion."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            size[key] = min(1 + sum(size[id(c)] for c in _children(node)), MAX_VALUES + 1)
            if size[key] > MAX_VALUES:
                return node, (f"the document expands to more than {MAX_VALUES} values (through anchors and aliases); "
                              "an experiment needs far fewer")
            continue
        if key in size:
            continue
        if key in on_path:
            return node, "an alias refers to a value that contains it (a loop)"
        if depth > MAX_DEPTH:
            return node, f"nested more than {MAX_DEPTH} levels deep"
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node) if id(child) not in size)
    return None


def _read_text(path: Path) -> str:
    try:
        if not path.exists():
            raise ParityError(f"{path}: no such file")
        if path.is_dir():
            raise ParityError(f"{path}: is a folder, not an experiment file")
        if not path.is_file():
            raise ParityError(f"{path}: not a regular file (a device, pipe or socket); give an experiment file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ParityError(f"{path}: {size} bytes; an experiment file is at most {MAX_FILE_BYTES} bytes")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParityError(f"{path}: not UTF-8 text (byte {exc.start}): save the file as UTF-8") from exc
    except OSError as exc:
        raise ParityError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def load_yaml(path: Path) -> tuple[Any, dict[KeyPath, int]]:
    """The document and a map from key path to line number (1-based)."""
    text = _read_text(path)
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is not None:
            problem = _shape_problem(node)
            if problem:
                bad, message = problem
                raise ParityError(f"{path}:{bad.start_mark.line + 1}: {message}")
        data = loader.construct_document(node) if node is not None else None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, most control characters)
        line = text.count("\n", 0, exc.position) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        raise ParityError(f"{path}:{line}: not valid YAML: character {char!r} is not allowed") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        context = getattr(exc, "context", None)
        raise ParityError(f"{path}{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")) from exc
    except RecursionError as exc:  # the parser recurses per level, before the depth check can run
        raise ParityError(f"{path}: nested more than {MAX_DEPTH} levels deep") from exc
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[KeyPath, int] = {}
    if node is not None:
        _lines(node, (), lines)
    return data, lines


def format_path(path: KeyPath) -> str:
    """('models', 1, 'builder') -> 'models[1].builder'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def line_of(path: KeyPath, lines: dict[KeyPath, int]) -> int | None:
    """The line of the longest prefix of `path` that the file has."""
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None
