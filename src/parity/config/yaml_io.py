"""Safe YAML loading that keeps line numbers and reads `1e-5` as a number.

PyYAML follows YAML 1.1, where a float needs a dot (`1.0e-5`); `1e-5` would arrive as a string.
Users write `1e-5`, so this loader resolves it as a float, as YAML 1.2 does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from parity.errors import ParityError

KeyPath = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping (first on line {seen[key]})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


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


def load_yaml(path: Path) -> tuple[Any, dict[KeyPath, int]]:
    """The document and a map from key path to line number (1-based)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ParityError(f"{path}: no such file") from exc
    except UnicodeDecodeError as exc:
        raise ParityError(f"{path}: not UTF-8 text (byte {exc.start}): save the file as UTF-8") from exc
    except OSError as exc:
        raise ParityError(f"{path}: cannot read: {exc}") from exc
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ParityError(f"{path}{where}: not valid YAML: {problem}") from exc
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
