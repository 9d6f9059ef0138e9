"""docs/experiment-reference.md: every key of an experiment file, generated from the schema and from the
specs of the plugins installed here (a model source's keys, a task's thresholds, an adapter's settings, a
backend's options), so the reference cannot drift from what `parity validate` accepts.

`python -m parity.experiment.schema_doc > docs/experiment-reference.md` writes it; a test fails when it is stale.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from parity.config import schema
from parity.plugins import ADAPTERS, BACKENDS, EXECUTORS, SOURCES, TASKS
from parity.typewords import type_in_words

_COMMENT = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+)$")


def _comments(cls: type) -> dict[str, str]:
    """The trailing comment of each field's line in the class body (and its bases'): the schema's own notes."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass.__module__.startswith("pydantic"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):  # a model made at run time (the tasks model) has no source
            continue
        for line in source.splitlines():
            m = _COMMENT.match(line)
            if m:
                found[m.group(1)] = m.group(2).strip()
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (X, X | None, list[X], dict[str, X], Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is list:
        return True
    return origin in (typing.Annotated, typing.Union, types.UnionType) and any(map(_is_list, typing.get_args(annotation)))


def _type(annotation: Any) -> str:
    return type_in_words(annotation, lambda model: "mapping")


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(its defaults)"
        return f"`{value!r}`".replace("None", "null")
    if field.default is PydanticUndefined:
        return "**required**"
    value = field.default
    shown = {None: "null", True: "true", False: "false"}.get(value, value) if isinstance(value, bool | None) else value
    return f"`{shown}`"


def _table(cls: type[BaseModel], skip: tuple[str, ...] = ()) -> list[str]:
    notes = _comments(cls)
    lines = ["| key | type | default | notes |", "|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        if name in skip:
            continue
        note = (field.description or notes.get(name, "")).replace("|", "\\|")
        lines.append(f"| `{name}` | {_type(field.annotation)} | {_default(field)} | {note} |")
    return lines


def _section(title: str, cls: type[BaseModel], lines: list[str], seen: set, skip: tuple[str, ...] = ()) -> None:
    """`cls`'s table under `title`, then a section for every nested model it holds, once each."""
    doc = inspect.getdoc(cls) if cls.__doc__ and cls.__doc__ is not BaseModel.__doc__ else ""
    lines += ["", f"## {title}", ""]
    if doc:
        lines += [doc.split("\n\n")[0].replace("\n", " "), ""]
    lines += _table(cls, skip)
    for name, field in cls.model_fields.items():
        if name in skip:
            continue
        for inner in _models_in(field.annotation):
            if inner not in seen:
                seen.add(inner)
                key = name + ("[i]" if _is_list(field.annotation) else "")
                _section(key if title == "top level" else f"{title}.{key}", inner, lines, seen)


def reference() -> str:
    """The whole reference, as markdown."""
    lines = ["# Experiment file reference", "",
             "Every key an experiment file may hold, generated from the schema and from the specs of the plugins",
             "installed where it was generated (`python -m parity.experiment.schema_doc > docs/experiment-reference.md`;",
             "a test fails when this file is stale). What each part means: [experiment-file.md](experiment-file.md).",
             "Unknown keys are refused everywhere."]
    seen: set = {schema.Tiers, schema.Tasks, schema.ModelSpecBase, schema.AdapterSpec, schema.ExecutorSpec,
                 schema.BackendSpec}
    _section("top level", schema.Experiment, lines, seen)
    _section("reference and targets[i]", schema.BackendSpec, lines, seen)
    for name in SOURCES.names():
        _section(f"models[i] with `source: {name}`", SOURCES.get(name).Spec, lines, seen)
    _section("tiers", schema.Tiers, lines, seen)
    _section("tiers.tasks", schema.Tasks, lines, seen)
    for name in TASKS.names():
        _section(f"tiers.tasks.{name}", TASKS.get(name).Thresholds, lines, seen)
    for name in ADAPTERS.names():
        _section(f"adapters[i] with `name: {name}`", ADAPTERS.get(name).Spec, lines, seen)
    for name in EXECUTORS.names():
        _section(f"executor with `kind: {name}`", EXECUTORS.get(name).Spec, lines, seen)
    for name in BACKENDS.names():
        options = BACKENDS.get(name).Options
        if options.model_fields:
            _section(f"targets[i].options with `backend: {name}`", options, lines, seen)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
