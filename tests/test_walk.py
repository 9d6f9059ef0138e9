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

NEXT = re.compile(r"^\s*next: (parity \S.*?)(?: \(a standalone repro script\))?$", re.MULTILINE)


def _commands(printed: str) -> list[str]:
    """The commands among the `next:` lines (some next: lines are advice in words, not commands)."""
    return NEXT.findall(printed)


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
    assert reduce == "parity reduce run/localize-net-2x8-eager-cpu-bfloat16 --check net/2x8/eager-cpu-bfloat16"

    code, printed = _run(fallback, capsys)
    assert code in (0, 1) and "eager-cpu-bfloat16: required atol" in printed  # 1: no fallback makes it pass
    assert ("apply it:" in printed) == (code == 0)

    code, printed = _run(reduce, capsys)
    assert code == 0, printed
    [script] = re.findall(r"\(python (\S+repro\.py):", printed)
    repro = subprocess.run([sys.executable, *shlex.split(script)], capture_output=True, text=True, cwd=tmp_path,
                           timeout=120)
    assert repro.returncode == 1 and "DIVERGES" in repro.stdout  # exit 1 when the culprit diverges


def test_a_check_without_a_saved_experiment_says_to_save_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["check", "tests.fixtures.tiny:tiny_cnn", "--input", "2x3x16x16", "--target", "eager-cpu-bfloat16",
                 "--gate", "1e-4", "--rtol", "1e-5", "--out", "run", "--quiet", "--no-report"])
    printed = capsys.readouterr().out
    assert code == 1 and not _commands(printed) and "EXPERIMENT.yaml" not in printed
    assert ("next: save the experiment (parity check --save-experiment FILE): parity localize and parity fallback "
            "start from an experiment file") in printed
