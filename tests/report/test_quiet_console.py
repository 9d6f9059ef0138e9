"""torch's (and the other libraries') logging goes to the run's log file, not above the table; --verbose
shows it on stderr too (issue 24, seen-item 9)."""

from __future__ import annotations

import logging

import pytest

from parity.cli import LOG_FILE, main
from tests.fixtures.chatty import DYNAMO_SAYS, ONNX_SAYS
from tests.support import tiny_experiment


@pytest.mark.parametrize("verbose", [False, True])
def test_what_torch_logs_while_a_model_runs_goes_to_the_runs_log_file(write_yaml, tmp_path, capsys, verbose):
    exp = tiny_experiment([{"backend": "eager", "name": "same"}],
                          models=[{"name": "tiny", "source": "python", "entry": "tests.fixtures.chatty:chatty"}])
    dynamo = logging.getLogger("torch._dynamo")
    before = (list(dynamo.handlers), dynamo.propagate)
    out = tmp_path / "out"
    code = main(["run", str(write_yaml(exp)), "--out", str(out), "--no-report", *(["--verbose"] if verbose else [])])
    printed = capsys.readouterr()
    assert code == 0 and "1 passed" in printed.out
    assert (DYNAMO_SAYS in printed.err, ONNX_SAYS in printed.err) == (verbose, verbose)
    assert DYNAMO_SAYS not in printed.out and ONNX_SAYS not in printed.out
    logged = (out / LOG_FILE).read_text()
    assert f"WARNING torch._dynamo.eval_frame: {DYNAMO_SAYS}" in logged and ONNX_SAYS in logged
    assert (list(dynamo.handlers), dynamo.propagate) == before  # torch's loggers are put back as they were


@pytest.mark.parametrize("command", ["localize", "fallback"])
def test_localize_and_fallback_keep_the_libraries_logging_off_the_console_too(write_yaml, tmp_path, capsys, command):
    exp = tiny_experiment([{"backend": "eager", "dtype": "bfloat16", "tolerances": {"rtol": 1e-5, "gate": 1e-4}}],
                          models=[{"name": "tiny", "source": "python", "entry": "tests.fixtures.chatty:chatty"}])
    out = tmp_path / "out"
    main([command, str(write_yaml(exp)), "--out", str(out)])
    printed = capsys.readouterr()
    assert DYNAMO_SAYS not in printed.err + printed.out and ONNX_SAYS not in printed.err + printed.out
    assert DYNAMO_SAYS in (out / LOG_FILE).read_text()
