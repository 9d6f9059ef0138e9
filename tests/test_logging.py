"""parity's modules log through `logging`; the command line shows what they log on stderr (`warning: ...`
lines where stderr is not a terminal, INFO as it is, DEBUG only with --verbose), and only the command line
and the reports print."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from parity.cli import main, show_logs

SRC = Path(__file__).resolve().parent.parent / "src" / "parity"


def _is_main_block(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`: a module run as a command (`python -m parity.records.schema_doc`)."""
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)


def test_only_the_command_line_and_the_reports_print():
    printing = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("cli/", "report/")):
            continue
        library = ast.Module([n for n in ast.parse(path.read_text(), rel).body if not _is_main_block(n)], [])
        for node in ast.walk(library):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                printing.append(f"{rel}:{node.lineno}")
    assert printing == [], f"print outside cli/ and report/ (log instead): {printing}"


@pytest.mark.parametrize("verbose", [False, True])
def test_the_command_line_shows_warnings_and_info_and_debug_only_when_verbose(capsys, verbose):
    show_logs(verbose)
    log = logging.getLogger("parity.runner.runner")
    log.debug("the cache key of %s", "x")
    log.info("resuming %s", "out")
    log.warning("%s: the previous run ended without a summary", "out")
    lines = capsys.readouterr().err.splitlines()
    assert lines == (["debug: the cache key of x"] if verbose else []) + [
        "resuming out", "warning: out: the previous run ended without a summary"]
    show_logs(False)


def test_a_library_warning_reaches_stderr_through_the_command_line(tmp_path, capsys, write_yaml):
    """records.py warns of duplicate lines when `parity report` reads a records file."""
    from tests.support import tiny_experiment

    out = tmp_path / "out"
    assert main(["run", str(write_yaml(tiny_experiment([{"backend": "eager", "name": "same"}]))), "--out", str(out), "--quiet",
                 "--no-report"]) == 0
    records = out / "records.jsonl"
    lines = records.read_text().splitlines()
    records.write_text("\n".join([*lines, lines[-1]]) + "\n")  # the last record twice, exactly
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {records}: line(s) {len(lines) + 1} repeat a record of an earlier line exactly" in err, err
