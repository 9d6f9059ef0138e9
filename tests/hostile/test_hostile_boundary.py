"""Model code that ends the program (sys.exit, exit(), a BaseException of its own, os._exit), in its
builder or in forward, under every executor: a run never exits 0 without a verdict for every planned
check, the failure is the execution's (`crash`, saying what the model did) or, in a builder, exit 2
naming the model. A few real subprocesses prove what only a process can show: os._exit, and a daemon
the model starts that holds the worker's output (a CI step must not wait for it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parity.records.view import RunView
from parity.runner import runner as local
from tests.fixtures.exiting import ACTIONS
from tests.support import ROOT
from tests.support.hostile import assert_user_error, experiment, run_parity, write_experiment

IN_PROCESS = [a for a in ACTIONS if not a.startswith("os._exit")]
SAID = {"sys.exit(0)": "sys.exit(0)", "sys.exit(1)": "sys.exit(1)", "sys.exit(3)": "sys.exit(3)",
        "sys.exit(None)": "sys.exit(None)", "sys.exit('message')": "bye from the model", "exit()": "sys.exit(None)",
        "raise Halt": "Halt: stop everything", "raise GeneratorExit": "GeneratorExit",
        "os._exit(0)": "exited with code 0", "os._exit(7)": "exited with code 7"}
ARMED = {"backend": "tests.fixtures.exiting:ArmedEager", "name": "armed"}
SAME = {"backend": "eager", "name": "same"}


def tripwire(action: str) -> list[dict]:
    return [{"name": "trip", "source": "python", "entry": "tests.fixtures.exiting:tripwire", "params": {"action": action}}]


def run_case(tmp_path: Path, data: dict, *flags: str):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = write_experiment(work, data)
    result = run_parity(["run", str(path), "--out", str(work / "out"), "--quiet", "--no-report", *flags],
                        tmp_path, work, ["work/out"])
    return result, work / "out"


def checks(out: Path) -> dict[str, dict]:
    lines = (out / "records.jsonl").read_text().splitlines()
    return {r.target: r for r in RunView(map(json.loads, lines)).checks(1)}


def assert_crash_verdict(result, out: Path, said: str) -> None:
    """Exit 1, the summary written, the armed target failed as a crash that says what the model did, the
    unarmed one passed: verdicts for every check, charged to the side that failed."""
    assert result.code == 1, result.err[-3000:]
    assert "Traceback" not in result.err and result.outside == [], (result.err[-3000:], result.outside)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"] == {"checks": 2, "passed": 1, "failed": 1, "skipped": 0, "errors": 0}
    got = checks(out)
    assert got["same"].passed is True
    assert got["armed"].passed is False and got["armed"].failure_class == "crash", got["armed"]
    assert said in got["armed"].detail, got["armed"].detail


@pytest.mark.parametrize("action", IN_PROCESS)
def test_model_code_that_ends_the_program_in_forward_is_a_crash(tmp_path, action):
    result, out = run_case(tmp_path, experiment([SAME, ARMED], models=tripwire(action)))
    assert_crash_verdict(result, out, SAID[action])


@pytest.mark.parametrize("action", IN_PROCESS)
def test_a_builder_that_ends_the_program_is_a_user_error_naming_the_model(tmp_path, action):
    models = [{"name": "quits", "source": "python", "entry": "tests.fixtures.exiting:exits_in_builder",
               "params": {"action": action}}]
    result, out = run_case(tmp_path, experiment([SAME], models=models))
    assert_user_error(result, "model 'quits'", "building it failed", SAID[action])
    assert not (out / "summary.json").exists()


def test_the_process_executor_isolates_model_code_that_ends_its_process(tmp_path):
    """One run, three models, each with its own way to end the worker (os._exit last: it costs a fresh
    worker): every armed check is a crash that says how, every unarmed one passes."""
    actions = ["sys.exit(0)", "raise Halt", "os._exit(0)"]
    models = [{**tripwire(a)[0], "name": f"trip{i}"} for i, a in enumerate(actions)]
    result, out = run_case(tmp_path, experiment([SAME, ARMED], models=models), "--executor", "process")
    assert result.code == 1, result.err[-3000:]
    assert "Traceback" not in result.err and result.outside == [], (result.err[-3000:], result.outside)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"] == {"checks": 6, "passed": 3, "failed": 3, "skipped": 0, "errors": 0}
    lines = (out / "records.jsonl").read_text().splitlines()
    got = {(r["model"], r["target"]): r for r in map(json.loads, lines) if r["kind"] == "check"}
    for i, action in enumerate(actions):
        assert got[(f"trip{i}", "same")]["passed"] is True
        armed = got[(f"trip{i}", "armed")]
        assert armed["failure_class"] == "crash" and SAID[action] in armed["detail"], armed


def test_a_builder_that_exits_under_the_process_executor_is_a_user_error(tmp_path):
    """The parent builds every model first (the worker's build is checked against it): exit 2 there."""
    models = [{"name": "quits", "source": "python", "entry": "tests.fixtures.exiting:exits_in_builder"}]
    result, _ = run_case(tmp_path, experiment([SAME], models=models), "--executor", "process")
    assert_user_error(result, "model 'quits'", "sys.exit(0)")


def test_a_run_that_lost_a_check_never_exits_0(tmp_path, monkeypatch):
    """The last line of defence: were the runner to skip a target (a bug), the planned checks outnumber
    the verdicts and the run exits 3, saying which check is missing."""
    run_job = local._run_job

    def loses_a_target(job, *args, **kwargs):
        return run_job(job.__class__(job.model, job.inputs, job.reference, job.oracle, job.targets[:1], job.repeats),
                       *args, **kwargs)

    monkeypatch.setattr(local, "_run_job", loses_a_target)
    result, _ = run_case(tmp_path, experiment([SAME, {"backend": "eager", "name": "second"}]))
    assert result.code == 3, result.err
    assert "1 of 2 planned checks have no verdict (plain / noise / second first)" in result.err


def test_summary_json_is_the_mark_of_a_finished_run(tmp_path):
    """A finished run leaves summary.json; a run continuing records without one says the last run ended
    early, and a stale summary never stands next to records it does not count."""
    result, out = run_case(tmp_path, experiment([SAME]))
    assert result.code == 0 and (out / "summary.json").is_file()
    again, _ = run_case(tmp_path, experiment([SAME]))
    assert again.code == 0 and "ended without a summary" not in again.err
    (out / "summary.json").unlink()
    resumed, _ = run_case(tmp_path, experiment([SAME]))
    assert resumed.code == 0 and "warning: " in resumed.err and "the previous run ended without a summary" in resumed.err
    assert "--executor process" in resumed.err


def _subprocess(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "PARITY_CACHE_DIR": "off"}
    env.update(kw.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, **kw)


def test_os_exit_in_the_local_executor_never_exits_0_and_the_next_run_says_so(tmp_path):
    """os._exit(0) ends the command's process before anything in it can run (no summary). Before, the `parity`
    command exited 0 with no verdict; now its first process, which waits for the verdict, exits 1 and says
    so. The next run into the folder says the previous one ended early and points to the process executor.
    (The model exits only in the subprocess; the run that continues it judges every check.)"""
    work = tmp_path / "work"
    work.mkdir()
    data = experiment([SAME, ARMED], models=tripwire("os._exit(0) when asked"))
    path = write_experiment(work, data)
    killed = _subprocess(["run", str(path), "--out", "out", "--quiet", "--no-report"], work, timeout=300,
                         env={"PARITY_TEST_OS_EXIT": "1"})
    assert killed.returncode == 1 and not (work / "out" / "summary.json").exists(), killed.stderr[-3000:]
    assert "error: the command's process ended with exit 0 before parity gave its verdict" in killed.stderr
    assert (work / "out" / "records.jsonl").is_file()
    result, out = run_case(tmp_path, data)
    assert "warning: " in result.err and "the previous run ended without a summary" in result.err, result.err
    assert "os._exit" in result.err and "--executor process" in result.err
    assert result.code == 0 and json.loads((out / "summary.json").read_text())["totals"]["checks"] == 2


def _fd_target(pid: int, fd: int) -> str:
    return os.readlink(f"/proc/{pid}/fd/{fd}")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc to see what the daemon holds")
def test_a_daemon_the_model_starts_does_not_hold_parity_s_output(tmp_path, monkeypatch):
    """The model starts `setsid sleep 600`, which inherits the worker's stdout and stderr and outlives
    the worker (a session of its own escapes the kill of the worker's group). Were those parity's own
    (a CI step's pipe), the step would wait for it; they are files in parity's scratch folder instead,
    and what the model printed still reaches parity's output."""
    pid_file = tmp_path / "daemon.pid"
    monkeypatch.setenv("PARITY_TEST_DAEMON_PID", str(pid_file))
    models = [{"name": "daemon", "source": "python", "entry": "tests.fixtures.exiting:spawns_daemon"}]
    try:
        result, _ = run_case(tmp_path, experiment([SAME], models=models), "--executor", "process")
        assert pid_file.exists(), "the model did not start its daemon: the test proves nothing"
        daemon = int(pid_file.read_text())
        held = {_fd_target(daemon, fd) for fd in (1, 2)}
        ours = {_fd_target(os.getpid(), fd) for fd in (1, 2)}
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert result.code == 0, result.err[-3000:]
    assert held.isdisjoint(ours) and not any(t.startswith("pipe:") for t in held), (held, ours)
    assert "the model started a daemon" in result.out


def test_the_parity_command_exits_with_its_commands_code(tmp_path):
    """The two processes of the `parity` command change no exit code: 0, 2 (one line), argparse's 0 and 2."""
    work = tmp_path / "work"
    work.mkdir()
    path = write_experiment(work, experiment([SAME]))
    assert _subprocess(["run", str(path), "--out", "out", "--quiet", "--no-report"], work, timeout=300).returncode == 0
    refused = _subprocess(["validate", str(work / "missing.yaml")], work, timeout=300)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr
    assert _subprocess(["--version"], work, timeout=300).returncode == 0
    assert _subprocess(["no-such-verb"], work, timeout=300).returncode == 2
