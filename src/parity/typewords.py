"""A type annotation in words, for the references generated from pydantic models (docs/records.md from
records/models.py, docs/experiment-reference.md from config/schema.py and the plugins' specs)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

_NAMES = {str: "string", int: "integer", float: "number", bool: "true/false", dict: "mapping", list: "list",
          type(None): "null", Any: "any"}


def type_in_words(annotation: Any, model_word: Callable[[type[BaseModel]], str]) -> str:
    """`integer or null`, `list of string`, `"stack" or "list"`; a pydantic model is said by `model_word`
    (a link to its section, or "mapping")."""
    def words(a: Any) -> str:
        origin, args = typing.get_origin(a), typing.get_args(a)
        if origin is typing.Annotated:
            return words(args[0])
        if origin is typing.Literal:
            return " or ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v!r}`" for v in args)
        if origin in (typing.Union, types.UnionType):
            return " or ".join(dict.fromkeys(words(v) for v in args))
        if origin is list:
            return f"list of {words(args[0])}" if args else "list"
        if origin is dict:
            return f"mapping of {words(args[0])} to {words(args[1])}" if args else "mapping"
        if isinstance(a, type) and issubclass(a, BaseModel):
            return model_word(a)
        return _NAMES.get(a, getattr(a, "__name__", str(a)))

    return words(annotation)
