"""Experiment files in, validated `Experiment` out; every problem is one line naming file, line and key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from parity.config import checks, legacy
from parity.config.schema import Experiment
from parity.config.yaml_io import KeyPath, format_path, line_of, load_yaml
from parity.errors import ParityError, did_you_mean


def _message(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    if kind in ("literal_error", "enum") and "input" in err:
        expected = err.get("ctx", {}).get("expected", "")
        choices = [c.strip().strip("'") for c in expected.replace(" or ", ",").split(",") if c.strip()]
        msg += did_you_mean(str(err["input"]), choices)
    return msg


def _pydantic_problems(exc: ValidationError, model_cls: type) -> list[tuple[KeyPath, str]]:
    out = []
    for err in exc.errors():
        # Drop the union-branch names pydantic inserts (`Synthetic`, `list[Synthetic]`) from the path.
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and (p[:1].isupper() or "[" in p)))
        msg = _message(err)
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(model_cls, loc)
        out.append((loc, msg))
    return out


def _unknown_key(model_cls: type, loc: KeyPath) -> str:
    """'unknown key' with the keys allowed there and a did-you-mean."""
    cls = model_cls
    for part in loc[:-1]:
        if isinstance(part, int) or cls is None:
            continue
        field = cls.model_fields.get(part)
        cls = _model_in(field.annotation) if field else None
    if cls is None:
        return "unknown key"
    allowed = list(cls.model_fields)
    return f"unknown key{did_you_mean(str(loc[-1]), allowed)} (allowed here: {', '.join(allowed)})"


def _model_in(annotation: Any) -> type | None:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


def _raise(path: Path | str, problems: list[tuple[KeyPath, str]], lines: dict[KeyPath, int]) -> None:
    msgs = []
    for key, msg in problems:
        line = line_of(key, lines)
        where = f"{path}:{line}" if line else f"{path}"
        msgs.append(f"{where}: {format_path(key)}: {msg}")
    raise ParityError(*msgs)


def experiment_from_dict(data: Any, source: str | Path = "<dict>", base_dir: Path | None = None,
                         lines: dict[KeyPath, int] | None = None) -> Experiment:
    """Validate a mapping (the new format or the published tool's) into an Experiment."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise ParityError(f"{source}: expected a mapping of keys (name, models, inputs, targets, ...), got {type(data).__name__}")
    if legacy.is_legacy(data):
        translated, problems, warnings = legacy.translate(data, Path(str(source)))
        if problems:
            _raise(source, problems, lines)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        data, lines = translated, {}
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        _raise(source, _pydantic_problems(exc, Experiment), lines)
    if base_dir is not None:
        exp._base_dir = base_dir
    if exp.name is None:
        exp.name = Path(str(source)).stem if source != "<dict>" else "experiment"
    problems = checks.check(exp)
    if problems:
        _raise(source, problems, lines)
    return exp


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    data, lines = load_yaml(path)
    return experiment_from_dict(data, path, path.resolve().parent, lines)
