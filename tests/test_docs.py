"""The docs are the front door: every link in README.md and docs/ resolves, and every command the README
shows exists and answers --help."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from parity.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _links(page: Path) -> list[str]:
    return [m for m in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()) if "://" not in m and ":" not in m]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    missing = [link for link in _links(page) if not (page.parent / link).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def _readme_commands() -> list[tuple[str, ...]]:
    """`parity SUB [SUB2]` as the README writes it, in code blocks and inline code."""
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.S))
    found = set()
    for m in re.finditer(r"(?:^|[`\s(])parity ([a-z]+)(?: ([a-z]+))?", "\n".join(code), re.M):
        sub, second = m.group(1), m.group(2)
        found.add((sub, second) if sub == "cache" and second in ("info", "clear") else (sub,))
    return sorted(found)


def test_the_readme_shows_the_commands():
    assert {("run",), ("check",), ("localize",), ("fallback",), ("reduce",), ("report",)} <= set(_readme_commands())


@pytest.mark.parametrize("command", _readme_commands(), ids=" ".join)
def test_every_readme_command_answers_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0, capsys.readouterr().err
    assert "usage:" in capsys.readouterr().out


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_experiment_reference_is_generated_from_the_schema():
    from parity.experiment.schema_doc import reference

    assert (ROOT / "docs" / "experiment-reference.md").read_text() == reference(), (
        "docs/experiment-reference.md is stale: run `python -m parity.experiment.schema_doc > docs/experiment-reference.md`")


def test_every_key_of_the_schema_and_of_every_plugin_spec_is_in_the_reference():
    """Found apart from the generator: every pydantic model of config/schema.py, and every installed source's,
    task's, adapter's and backend's spec."""
    import inspect

    from pydantic import BaseModel

    from parity import plugins
    from parity.config import schema

    models = [c for _, c in inspect.getmembers(schema, inspect.isclass)
              if issubclass(c, BaseModel) and c.__module__ == schema.__name__]
    models += [plugins.SOURCES.get(n).Spec for n in plugins.SOURCES.names()]
    models += [plugins.TASKS.get(n).Thresholds for n in plugins.TASKS.names()]
    models += [plugins.ADAPTERS.get(n).Spec for n in plugins.ADAPTERS.names()]
    models += [plugins.BACKENDS.get(n).Options for n in plugins.BACKENDS.names()]
    text = (ROOT / "docs" / "experiment-reference.md").read_text()
    missing = sorted({f"{m.__name__}.{k}" for m in models for k in m.model_fields if f"| `{k}` |" not in text})
    assert not missing, f"keys the reference lacks: {missing}"


def _arguments_without_help(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            for name, sub in action.choices.items():
                if name not in helped:
                    yield f"{path} {name}"
                yield from _arguments_without_help(sub, f"{path} {name}")
        elif not action.help and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_argument_of_every_subcommand_has_help_text():
    assert list(_arguments_without_help(build_parser(), "parity")) == []
