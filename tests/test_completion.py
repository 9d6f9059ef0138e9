"""`parity completion bash|zsh`: scripts generated from the parser, which complete subcommands (nested),
their options and the choices of an option."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from parity.cli import build_parser, main
from parity.completion import _commands, _words


def script(shell: str, capsys) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def complete(script_text: str, *words: str) -> list[str]:
    """What bash offers after `words` (the last one is the word being completed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = (f"{script_text}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _parity_complete; "
               'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


def test_the_script_names_every_subcommand_and_option_of_the_parser(capsys):
    text = script("bash", capsys)
    for path, parser in _commands(build_parser()):
        subcommands, options, _ = _words(parser)
        assert all(word in text for word in [*subcommands, *options]), path


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_subcommands_options_and_choices(capsys):
    text = script("bash", capsys)
    assert complete(text, "parity", "ru") == ["run"]
    assert complete(text, "parity", "run", "--exec") == ["--executor"]
    assert complete(text, "parity", "run", "--executor", "") == ["local", "process", "ray"]
    assert complete(text, "parity", "cache", "") == ["info", "clear"]
    assert complete(text, "parity", "cache", "clear", "--") == ["--help", "--cache-dir"]
    assert complete(text, "parity", "completion", "") == ["bash", "zsh"]
    assert complete(text, "parity", "validate", "--d") == ["--deep"]
    assert "completion" in complete(text, "parity", "")


def test_zsh_runs_the_same_function_through_bashcompinit(capsys):
    bash, zsh = script("bash", capsys), script("zsh", capsys)
    assert "bashcompinit" in zsh and bash.split("\n", 1)[1] in zsh
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n", "-c", zsh], check=True, timeout=30)
