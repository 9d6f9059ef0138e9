"""A newcomer's walk: `parity check` with --save-experiment, then every `next:` command each step prints, run
exactly as printed (parsed from the output, never retyped), through localize, fallback and reduce, and the
repro script reduce writes. The drift is constructed: a bfloat16 target judged at float32's gate, on a model
one of whose modules loses its input in bfloat16 (tests/fixtures/culprit.py: Cancel), so that localize names a
single culprit and offers reduce (every layer drifting alike would have no repro to cut)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from parity.cli import main
from tests.report.test_next_lines import is_parity_command

NEXT = re.compile(r"^\s*next: (.*)$", re.MULTILINE)


def _commands(printed: str) -> list[str]:
    """The `next:` lines' commands: each line is a command and nothing else (tests/report/test_next_lines.py)."""
    found = NEXT.findall(printed)
    assert all(is_parity_command(f"next: {line}") for line in found), found
    return found


def _run(command: str, capsys) -> tuple[int, str]:
    argv = shlex.split(command)
    assert argv[0] == "parity"
    code = main(argv[1:])
    return code, capsys.readouterr().out


def test_every_printed_next_command_runs_as_printed_down_to_the_repro(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user in their folder types them
    code = main(["check", "tests.fixtures.culprit:cancelling", "--name", "net", "--input", "2x8",
                 "--target", "eager-cpu-bfloat16", "--gate", "1e-4", "--rtol", "1e-5",
                 "--save-experiment", "exp.yaml", "--out", "run", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 1  # bfloat16 drifts beyond float32's gate
    localize, fallback = _commands(printed)
    assert localize == ("parity localize exp.yaml --model net --target eager-cpu-bfloat16 --inputs 2x8 "
                        "--out run/localize-net-2x8-eager-cpu-bfloat16")
    assert fallback.startswith("parity fallback exp.yaml --model net ")

    code, printed = _run(localize, capsys)
    assert code == 0, printed  # localize exits 0 when it localized
    assert "verdict: cancel introduces the largest relative error of its own" in printed
    [reduce] = _commands(printed)
    assert reduce == ("parity reduce run/localize-net-2x8-eager-cpu-bfloat16 --check net/2x8/eager-cpu-bfloat16 "
                      "--experiment exp.yaml")  # reduce imports model code only from a file the user passes

    code, printed = _run(fallback, capsys)
    assert code in (0, 1) and "eager-cpu-bfloat16: required atol" in printed  # 1: no fallback makes it pass
    assert ("apply it:" in printed) == (code == 0)

    code, printed = _run(reduce, capsys)
    assert code == 0, printed
    [script] = re.findall(r"\(python (\S+repro\.py):", printed)
    repro = subprocess.run([sys.executable, *shlex.split(script)], capture_output=True, text=True, cwd=tmp_path,
                           timeout=120)
    assert repro.returncode == 1 and "DIVERGES" in repro.stdout  # exit 1 when the culprit diverges


def test_a_check_without_a_saved_experiment_writes_it_into_its_folder_and_its_next_lines_run(tmp_path, monkeypatch,
                                                                                              capsys):
    """No --save-experiment: the check still writes the experiment it ran (run/experiment.yaml), its next:
    lines name that file, and the first runs as printed (it used to say to save one and re-run the check)."""
    monkeypatch.chdir(tmp_path)
    code = main(["check", "tests.fixtures.tiny:tiny_cnn", "--input", "2x3x16x16", "--target", "eager-cpu-bfloat16",
                 "--gate", "1e-4", "--rtol", "1e-5", "--out", "run", "--quiet", "--no-report"])
    printed = capsys.readouterr().out
    assert code == 1 and (tmp_path / "run" / "experiment.yaml").is_file()
    localize, fallback = _commands(printed)
    assert localize.startswith("parity localize run/experiment.yaml --model tiny_cnn ")
    assert fallback.startswith("parity fallback run/experiment.yaml ")
    code, printed = _run(localize, capsys)
    assert code == 0, printed
