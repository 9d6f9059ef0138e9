"""Experiment files in, validated `Experiment` out; every problem is one line naming file, line and key."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from parity.config.schema import Experiment, flat_thresholds, plain_name, spec_class_for
from parity.config.tolerances import shadowed
from parity.errors import FieldError, ParityError, did_you_mean, field_errors
from parity.experiment import legacy
from parity.experiment.validate import experiment_problems
from parity.experiment.yaml_io import KeyPath, format_path, line_of, load_yaml

log = logging.getLogger(__name__)

_EXPECTED = {"string_type": "a string", "list_type": "a list", "model_type": "a mapping (key: value)",
             "dict_type": "a mapping (key: value)", "int_type": "an integer", "int_parsing": "an integer",
             "int_from_float": "an integer", "float_type": "a number", "float_parsing": "a number",
             "bool_type": "true or false", "bool_parsing": "true or false", "literal_error": None}
# The branch names pydantic puts into an error's location inside a union field, by field.
_UNION_TAGS = {"synthetic": {"Synthetic", "list[Synthetic]", "dict[str,Synthetic]"}, "granularity": {"str", "list[str]"}}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(err: FieldError) -> str:
    if err.kind == "extra_forbidden":
        return "unknown key"
    if err.kind == "missing":
        return "required key is missing"
    if _EXPECTED.get(err.kind) and err.has_input:
        return f"expected {_EXPECTED[err.kind]}, got {_shown(err.input)}"
    msg = err.message
    if err.kind in ("literal_error", "enum") and err.has_input:
        choices = [c.strip().strip("'") for c in err.expected.replace(" or ", ",").split(",") if c.strip()]
        msg += did_you_mean(str(err.input), choices)
    return msg


def _clean_loc(loc: tuple) -> KeyPath:
    """The key path as the user wrote it: without the union-branch names pydantic inserts
    (`synthetic.list[Synthetic][1]` -> `synthetic[1]`) or its `[key]` marker for a bad mapping key."""
    out: list = []
    for i, part in enumerate(loc):
        if i and isinstance(loc[i - 1], str) and part in _UNION_TAGS.get(loc[i - 1], ()):
            continue
        if part == "[key]" and i == len(loc) - 1:
            continue
        out.append(part)
    return tuple(out)


def _pydantic_problems(exc: ValidationError, model_cls: type, data: Any) -> list[tuple[KeyPath, str]]:
    """One problem per key path: the branches of a union that all failed become one 'expected X or Y'."""
    by_loc: dict[KeyPath, list[FieldError]] = {}
    for err in field_errors(exc):
        by_loc.setdefault(_clean_loc(err.loc), []).append(err)
    out = []
    for loc, errs in by_loc.items():
        first = errs[0]
        # `1:`, `~:`, `1e5:` are numbers or null to YAML, not names: at the top level pydantic says
        # invalid_key, in a mapping field (`options`, `params`) string_type at `KEY.[key]`
        if first.kind == "invalid_key" or (first.kind == "string_type" and first.loc[-1] == "[key]"):
            out.append((loc[:-1], f"key {first.input!r} is {type(first.input).__name__}, not a name; put it in quotes"))
            continue
        if first.kind == "extra_forbidden":
            msg = _unknown_key(model_cls, loc, data)
        elif len(errs) > 1 and all(_EXPECTED.get(e.kind) for e in errs):
            wanted = list(dict.fromkeys(_EXPECTED[e.kind] for e in errs))
            msg = f"expected {' or '.join(wanted)}, got {_shown(first.input)}"
        else:
            msg = "; ".join(dict.fromkeys(_message(e) for e in errs))
        out.append((loc, msg))
    return out


def _unknown_key(model_cls: type, loc: KeyPath, data: Any) -> str:
    """'unknown key' with the keys allowed there and a did-you-mean. Where a plugin's spec decides the keys
    (a model's source, an adapter's name, `tiers.tasks`), the spec of what `data` names there."""
    cls, annotation = model_cls, None
    for part in loc[:-1]:
        data = _item(data, part)
        if not isinstance(part, int):
            field = cls.model_fields.get(part) if cls is not None else None
            annotation = field.annotation if field else None
        cls = (_plugin_spec(annotation, data) or _model_in(annotation)) if annotation is not None else None
    if cls is None or not loc:
        return "unknown key"
    allowed = list(cls.model_fields)
    return f"unknown key{did_you_mean(str(loc[-1]), allowed)} (allowed here: {', '.join(allowed)})"


def _item(data: Any, part: Any) -> Any:
    if isinstance(data, dict):
        return data.get(part)
    if isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
        return data[part]
    return None


def _plugin_spec(annotation: Any, data: Any) -> type | None:
    """The spec class a plugin-dispatched field (or the list of them) gives `data`."""
    for arg in (annotation, *getattr(annotation, "__args__", ())):
        found = spec_class_for(arg, data)
        if found is not None:
            return found
        if arg is not annotation and getattr(arg, "__args__", ()):
            found = _plugin_spec(arg, data)
            if found is not None:
                return found
    return None


def _model_in(annotation: Any) -> type | None:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # what splits or moves a line


def one_line(text: str) -> str:
    """Control characters (a newline in a key the user wrote) shown escaped: one problem, one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _raise(path: Path | str, problems: list[tuple[KeyPath, str]], lines: dict[KeyPath, int]) -> None:
    msgs = []
    for key, msg in problems:
        line = line_of(key, lines)
        where = f"{path}:{line}" if line else f"{path}"
        msgs.append(one_line(f"{where}: {format_path(key)}: {msg}"))
    raise ParityError(*msgs)


def _warn_flat_thresholds(data: dict, source: str | Path, lines: dict[KeyPath, int]) -> None:
    """One line per threshold in the old flat spelling (`tiers.tasks.top1_agreement`): it still counts
    (the schema moves it), and the warning names the key it now lives under."""
    tiers = data.get("tiers")
    tasks = tiers.get("tasks") if isinstance(tiers, dict) else None
    for old, new in flat_thresholds(tasks)[1]:
        line = line_of(("tiers", "tasks", old), lines)
        where = f"{source}:{line}" if line else f"{source}"
        log.warning("%s", one_line(f"{where}: tiers.tasks.{old} is deprecated; write {new}"))


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
            log.warning("%s", w)
        data, lines = translated, {}
    _warn_flat_thresholds(data, source, lines)
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        _raise(source, _pydantic_problems(exc, Experiment, data), lines)
    if base_dir is not None:
        exp._base_dir = base_dir
    if exp.name is None:  # the file's stem, made a plain name (`...yaml` would otherwise be `..`)
        exp.name = plain_name(Path(str(source)).stem, "experiment") if source != "<dict>" else "experiment"
    problems = experiment_problems(exp)
    if problems:
        _raise(source, problems, lines)
    for target in exp.targets:  # an experiment-level gate that a dtype's or scheme's default overrides
        why = shadowed(exp.tolerances, target, exp.reference.dtype)
        if why:
            where = f":{lines[('tolerances', 'gate')]}" if ("tolerances", "gate") in lines else ""
            log.warning("%s", one_line(f"{source}{where}: {why}"))
    return exp


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    data, lines = load_yaml(path)
    exp = experiment_from_dict(data, path, path.resolve().parent, lines)
    exp._file = str(path)  # as the user named it: the commands reports suggest use it again
    return exp
