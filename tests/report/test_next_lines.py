"""Every line parity prints that starts with `next: ` is a `parity` command and nothing else, which the parser
takes as typed: a comment goes on a line of its own. Checked two ways: every literal in parity's source that
begins a `next: ` line begins a command, and the lines the commands print on constructed failures (localize,
fallback, reduce: tests/test_walk.py runs each as printed) and the fallback search's own next steps parse."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

from parity.cli import build_parser
from parity.runner.search import next_step
from tests.support import ROOT, fallback_found

COMMANDS = ("command", "which", "file")  # the names parity's next: lines format their command from


def is_parity_command(line: str) -> bool:
    """A `next: ` line whose rest splits as a shell line into `parity VERB ...` that the parser accepts."""
    argv = shlex.split(line.removeprefix("next: "))
    if not argv or argv[0] != "parity":
        return False
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit:
        return False
    return True


def _literal_starts(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string (or f-string) literal that begins with `next: `, with what follows it: the literal text, or
    `{name}` for a formatted value."""
    found = []
    inside = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if id(node) in inside:  # a part of an f-string: the f-string is judged whole
            continue
        if isinstance(node, ast.Constant) and node.value == "next: ":  # the prefix itself (`startswith("next: ")`)
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("next: "):
            found.append((node.lineno, node.value[6:]))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("next: "):
                rest = first.value[6:]
                if not rest and len(node.values) > 1 and isinstance(node.values[1], ast.FormattedValue):
                    value = node.values[1].value
                    rest = "{" + (value.id if isinstance(value, ast.Name) else ast.unparse(value)) + "}"
                found.append((node.lineno, rest))
    return found


def test_every_next_literal_in_parity_begins_a_command():
    """A `next: ` that parity's code writes is followed by `parity ` or by the command it formatted."""
    wrong = []
    for path in sorted((ROOT / "src" / "parity").rglob("*.py")):
        for line, rest in _literal_starts(ast.parse(path.read_text(encoding="utf-8"))):
            if not (rest.startswith("parity ") or rest.strip("{}") in COMMANDS):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: next: {rest[:60]}")
    assert not wrong, "next: lines that are no command:\n" + "\n".join(wrong)


@pytest.mark.parametrize("aim, task, passing_gate, whole", [
    ("tier 1", "classification", 3.7e-5, True), ("tier 1", None, 3.7e-5, True), ("tier 1", None, None, False),
    ("tier 3", "classification", None, False)])
def test_the_fallback_searchs_next_steps_are_commands_or_comments(aim, task, passing_gate, whole):
    """Every branch of the search's advice: a `next: ` line is the command alone, the advice is its own line."""
    from parity.config.schema import BackendSpec

    result = fallback_found("eager-cpu-bfloat16", "float32", aim=aim, passed=whole, whole_model=whole,
                            required_atol_before=3.6e-5, passing_gate=passing_gate)
    command = f"parity fallback {shlex.quote(str(Path('my exp.yaml')))} --model m --target eager-cpu-bfloat16 --inputs x"
    text = next_step(result, command, task, BackendSpec(backend="eager", dtype="bfloat16"))
    lines = text.splitlines()
    assert all(is_parity_command(line) for line in lines if line.startswith("next:")), lines
    assert ("next: " + command + " --tier 3" in lines) == (aim == "tier 1" and task is not None)
