"""docs/records.md, generated from records/models.py: every record kind, every field, its type and its
description. `python -m parity.records.schema_doc > docs/records.md` rewrites it; tests/records/test_records.py
fails when the file and the models differ."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from parity.records.models import RECORDS, SCHEMA_VERSION, Record
from parity.typewords import type_in_words

COMMAND = "python -m parity.records.schema_doc > docs/records.md"

def _type(annotation: Any, parts: list[type[BaseModel]]) -> str:
    """A field's type in words; the record parts it names are collected into `parts`, to be listed after."""
    def link(model: type[BaseModel]) -> str:
        if model not in parts:
            parts.append(model)
        return f"[{model.__name__}](#{model.__name__.lower()})"

    return type_in_words(annotation, link)


def _table(fields: dict[str, Any], parts: list[type[BaseModel]]) -> list[str]:
    lines = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, field in fields.items():
        required = "yes" if field.is_required() else ""
        text, kind = (field.description or "").replace("|", "\\|"), _type(field.annotation, parts).replace("|", "\\|")
        lines.append(f"| `{name}` | {kind} | {required} | {text} |")
    return lines


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def schema_doc() -> str:
    """The whole of docs/records.md."""
    parts: list[type[BaseModel]] = []
    lines = [
        "# Records reference",
        "",
        f"<!-- generated from src/parity/records/models.py by `{COMMAND}`: edit the models, not this file -->",
        "",
        "A run writes `OUT/records.jsonl`: one JSON object per line, flushed as results come, in the order they",
        "are made. Every report, the summary and `parity report` are rendered from these lines alone. Each line",
        f"has a `kind` (a check also a `tier`) and the `schema_version` it was written in ({SCHEMA_VERSION} today).",
        "parity validates every line it reads (a wrong type or a missing field names the file and the line) and",
        "every record it writes. Non-finite numbers (an infinite required atol) are written as null. Fields not",
        "listed here are kept when reading (records written by hand or by a newer minor version); a record of a",
        "newer `schema_version` is refused. Read them in Python with `parity.records.RunView.read(OUT)`.",
        "",
        "Fields every record has:",
        "",
        *_table(Record.model_fields, parts),
    ]
    for (kind, tier), model in RECORDS.items():
        title = f"`{kind}`" + (f", tier {tier}" if tier is not None else "")
        own = {n: f for n, f in model.model_fields.items() if n not in Record.model_fields}  # what this kind adds
        lines += ["", f"## {title}", "", _doc(model), "", *_table(own, parts)]
    lines += ["", "## Parts of records", ""]
    done: list[type[BaseModel]] = []
    while len(done) < len(parts):
        part = next(p for p in parts if p not in done)
        done.append(part)
        open_note = " Other fields are the experiment's, as config/schema.py defines them." if getattr(part, "open", False) else ""
        lines += [f"### {part.__name__}", "", _doc(part) + open_note, "", *_table(part.model_fields, parts), ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(schema_doc(), end="")
