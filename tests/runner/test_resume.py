"""A run into a folder that holds records of the same experiment continues it: nothing recorded is
judged or executed again, nothing appears twice, a torn last line is cut off, and another experiment's
records are refused unless --fresh."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from parity.api import run_experiment
from parity.cli import main
from parity.errors import ParityError
from parity.records import RecordWriter, read_records
from parity.records.io import typed
from parity.records.view import RunView
from tests.support import tiny_experiment
from tests.support.cli import process_command

LOGGED = "tests.fixtures.tiny:LoggedEager"
# The fields a `run` record must hold to be read back (records/models.py), for tests that write records by hand.
RUN = {"experiment": "x", "digest": "d", "base_dir": ".", "environment": {},
       "config": {"tolerances": {"atol": [1e-5], "rtol": 0.0}, "models": [], "inputs": [], "targets": []}}


def logged_experiment(log: Path, sleep_s: float = 0.0) -> dict:
    """Two models x two input sets; a logged reference and three logged targets (one identical, one
    perturbed, one bfloat16), two repeats, the oracle and tier 3: 4 jobs, 12 tier-1 and 12 tier-3 checks."""
    def logged(name, **extra):
        return {"backend": LOGGED, "name": name, **extra, "options": {"log": str(log), "sleep_s": sleep_s,
                                                                      **extra.pop("options", {})}}

    return {
        "name": "resumable",
        "repeats": 2,
        "warmup": 0,  # the log counts runs: one per repeat
        "oracle": True,
        "models": [{"name": "wide", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "task": "classification"},
                   {"name": "narrow", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "task": "classification",
                    "params": {"width": 4}}],
        "inputs": [{"name": "two", "synthetic": {"shape": [2, 3, 8, 8]}},
                   {"name": "three", "synthetic": {"shape": [3, 3, 8, 8]}}],
        "reference": logged("ref"),
        "targets": [logged("same"), logged("perturbed", options={"perturb": True}),
                    logged("bf16", dtype="bfloat16", tolerances={"rtol": 1e-5, "gate": 1e-4})],  # at float32's: it drifts
        "tiers": {"tasks": True},
    }


def verdicts(records: list[dict]) -> dict[tuple, object]:
    """(model, inputs, target, tier, tolerance) -> verdict, for every check."""
    out: dict[tuple, object] = {}
    for r in records:
        if r["kind"] != "check":
            continue
        if r["tier"] == 1:
            for tol, verdict in r["verdicts"].items():
                out[(r["model"], r["inputs"], r["target"], 1, tol)] = verdict
            out[(r["model"], r["inputs"], r["target"], 1, "class")] = r["failure_class"]
        else:
            out[(r["model"], r["inputs"], r["target"], r["tier"], None)] = r["passed"]
    return out


def duplicates(records: list[dict]) -> list[tuple]:
    counts = Counter(typed(r).record_key for r in records)
    return [key for key, n in counts.items() if key is not None and n > 1]


def test_a_torn_last_line_is_cut_off_before_appending(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write("run", **RUN)
        writer.write("model", model="m")
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"kind": "execution", "model": "m", "inp')  # what a killed process was writing
    assert [r["kind"] for r in read_records(path)] == ["run", "model"]  # readers skip it
    with RecordWriter(path, resume=True) as writer:
        assert [r["kind"] for r in writer.records] == ["run", "model"] and writer.torn == 40
        with pytest.raises(RuntimeError, match="torn line"):  # never glued onto the torn line
            writer.write("warning", model="m", inputs="i", message="constant")
        assert writer.drop_torn_line() == 40
        assert path.read_bytes() == whole
        assert writer.write("model", model="m") is None  # already there: not written again
        writer.write("model", model="n")
    lines = path.read_text().splitlines()
    assert [json.loads(line)["model"] for line in lines[1:]] == ["m", "n"]


def test_a_line_that_is_not_a_record_is_refused(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"kind": "run", **RUN}) + '\nnot json\n{"kind": "model", "model": "m"}\n')
    with pytest.raises(ParityError, match=r"records.jsonl:2: not a JSON record .*pass --fresh"):
        RecordWriter(path, resume=True)


def test_two_writers_cannot_share_a_run(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write("run", **RUN)
        with pytest.raises(ParityError, match="another parity process is writing"):
            RecordWriter(path, resume=True)
        with pytest.raises(ParityError, match="another parity process is writing"):
            RecordWriter(path)  # a fresh writer would truncate it: refused before that
    assert len(read_records(path)) == 1


def test_running_a_finished_experiment_again_executes_nothing(tmp_path):
    log = tmp_path / "runs.log"
    data = logged_experiment(log)
    first = run_experiment(data, out=tmp_path / "out")
    runs = log.read_text().splitlines()
    assert len(runs) == 4 * 4 * 2  # 4 jobs x (reference + 3 targets) x 2 repeats
    before = (tmp_path / "out" / "records.jsonl").read_bytes()
    again = run_experiment(data, out=tmp_path / "out")
    assert log.read_text().splitlines() == runs  # not one execution
    assert (tmp_path / "out" / "records.jsonl").read_bytes() == before
    assert again == first and duplicates(again) == []


def test_a_missing_judgement_re_runs_only_its_job(tmp_path):
    """Cut the records after the first job's tier-1 check of `same`: that job's other targets (and its
    reference, whose outputs the verdicts need) run again; the other three jobs run in full once."""
    log = tmp_path / "runs.log"
    data = logged_experiment(log)
    full = run_experiment(data, out=tmp_path / "full")
    path = tmp_path / "cut" / "records.jsonl"
    path.parent.mkdir()
    lines = (tmp_path / "full" / "records.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"tier": 1' in line and '"target": "same"' in line) + 1
    path.write_text("".join(lines[:cut]))
    log.unlink()
    resumed = run_experiment(data, out=tmp_path / "cut")
    ran = Counter(tuple(line.split()[1:]) for line in log.read_text().splitlines())
    first_job = str([r for r in full if r["kind"] == "model"][0]["parameters"]), "2x3x8x8"
    assert ran[("same", *first_job)] == 0  # its judgement was recorded
    assert ran[("ref", *first_job)] == 2 and ran[("perturbed", *first_job)] == 2 and ran[("bf16", *first_job)] == 2
    assert sum(ran.values()) == 6 + 3 * 8
    assert duplicates(resumed) == [] and verdicts(resumed) == verdicts(full)
    assert sum(r["kind"] == "execution" for r in resumed) == sum(r["kind"] == "execution" for r in full)


@pytest.mark.parametrize("cut_after", ["check", "layers"])
def test_a_run_cut_between_a_targets_tier3_and_tier1_records_writes_neither_twice(tmp_path, cut_after):
    """A judgement is written tier-3 check, then layers (tier 2), then tier-1 check. Cut after the first
    bfloat16 target's tier-3 check, or after its layers: that target is judged again, and its records
    already there are not written a second time."""
    data = logged_experiment(tmp_path / "runs.log")
    data["tiers"]["activations"] = True
    full = run_experiment(data, out=tmp_path / "full")
    lines = (tmp_path / "full" / "records.jsonl").read_text().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    cut = next(i for i, r in enumerate(records) if r["kind"] == cut_after and r["target"] == "bf16"
               and r["tier"] in (2, 3)) + 1
    assert records[cut]["target"] == "bf16" and records[cut]["tier"] in (1, 2)  # its tier-1 check is still to come
    path = tmp_path / "cut" / "records.jsonl"
    path.parent.mkdir()
    path.write_text("".join(lines[:cut]))
    resumed = run_experiment(data, out=tmp_path / "cut")
    assert duplicates(resumed) == [] and verdicts(resumed) == verdicts(full)
    assert {typed(r).record_key for r in resumed} - {None} == {typed(r).record_key for r in full} - {None}  # nothing missing
    assert [r["kind"] for r in resumed].count("layers") == [r["kind"] for r in full].count("layers") > 0


def test_a_run_killed_while_writing_its_last_record_is_completed(tmp_path, caplog):
    data = tiny_experiment([{"backend": "eager", "name": "same"}, {"backend": "tests.fixtures.tiny:PerturbedEager",
                                                                    "name": "perturbed"}])
    full = run_experiment(data, out=tmp_path / "out")
    path = tmp_path / "out" / "records.jsonl"
    text = path.read_bytes()
    last = text.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(text[:last + 25])  # the last check, torn after 25 bytes
    with caplog.at_level(logging.INFO, logger="parity"):  # the API logs; the command line shows it (test_logging.py)
        resumed = run_experiment(data, out=tmp_path / "out")
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert any(level == "WARNING" and "dropped a torn last line (25 bytes)" in m for level, m in said), said
    assert any(level == "INFO" and m.startswith("resuming") for level, m in said), said
    assert verdicts(resumed) == verdicts(full) and duplicates(resumed) == []
    assert read_records(path) == resumed


def test_another_experiment_in_the_same_folder_is_refused_unless_fresh(tmp_path, write_yaml, capsys):
    data = tiny_experiment([{"backend": "eager", "name": "same"}])
    path = write_yaml(data)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    path.write_text("# a comment changes nothing\n" + path.read_text().replace("seed: 0", "seed: 0  # still 0"))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0  # the same experiment: nothing to do
    before = (out / "records.jsonl").read_bytes()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--executor", "process"]) == 0  # only where it runs
    assert (out / "records.jsonl").read_bytes() == before
    data["tolerances"] = {"atol": [1e-3]}
    write_yaml(data)
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "holds a run of experiment 'tiny' with other settings (changed: tolerances)" in line and "--fresh" in line
    assert (out / "records.jsonl").read_bytes() == before  # untouched
    assert main(["run", str(path), "--out", str(out), "--quiet", "--fresh"]) == 0
    [check] = [r for r in read_records(out) if r["kind"] == "check"]
    assert list(check["verdicts"]) == ["1e-03"]


def _cli(args: list[str], cwd: Path) -> subprocess.Popen:
    command, env = process_command("run", *args)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_after(proc: subprocess.Popen, path: Path, lines: int) -> int:
    """SIGKILL `proc` as soon as `path` has at least `lines` lines; the count when it died."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= lines:
            break
        if proc.poll() is not None:
            raise AssertionError(f"finished before {lines} records: {proc.communicate()[1]}")
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return path.read_bytes().count(b"\n")


def test_killed_at_any_moment_and_resumed_the_records_match_an_uninterrupted_run(tmp_path):
    """One uninterrupted run (in this process), and one run (parity run, in its own process) killed with
    SIGKILL four times, after 2, 15, 33 and 52 of its 67 records, and started again each time. The checks
    and their verdicts are the same, no record appears twice, no execution is missing, and no process
    executed a target whose judgement was already recorded."""
    expected = run_experiment(logged_experiment(tmp_path / "full.log"), out=tmp_path / "full")
    assert len(expected) == 67
    log_killed = tmp_path / "killed.log"
    (tmp_path / "killed.yaml").write_text(yaml.safe_dump(logged_experiment(log_killed, sleep_s=0.01)))

    path = tmp_path / "killed" / "records.jsonl"
    judged_before: list[set] = []  # per process: the judgements already recorded when it started
    pids: list[int] = []
    for lines in (2, 15, 33, 52):
        judged_before.append({RunView.identity(c) for c in RunView(read_records(path) if path.exists() else []).checks(1)})
        proc = _cli(["killed.yaml", "--out", "killed", "--quiet"], tmp_path)
        pids.append(proc.pid)
        _kill_after(proc, path, lines)
    judged_before.append({RunView.identity(c) for c in RunView(read_records(path)).checks(1)})
    last = _cli(["killed.yaml", "--out", "killed", "--quiet"], tmp_path)
    pids.append(last.pid)
    last_err = last.communicate(timeout=300)[1]
    assert last.returncode == 1 and "Traceback" not in last_err, last_err  # perturbed and bfloat16 fail
    assert "resuming" in last_err

    got = read_records(path)
    assert duplicates(got) == []
    assert verdicts(got) == verdicts(expected)
    for kind in ("execution", "check", "model"):
        assert sum(r["kind"] == kind for r in got) == sum(r["kind"] == kind for r in expected), kind
    assert json.loads((tmp_path / "killed" / "summary.json").read_text())["totals"] == \
        json.loads((tmp_path / "full" / "summary.json").read_text())["totals"]

    sizes = {r["parameters"]: r["model"] for r in expected if r["kind"] == "model"}
    shapes = {"2x3x8x8": "two", "3x3x8x8": "three"}
    for pid, judged in zip(pids, judged_before, strict=True):
        for line in log_killed.read_text().splitlines():
            who, target, size, shape = line.split()
            if int(who) == pid and target != "ref":
                assert (sizes[int(size)], shapes[shape], target) not in judged, f"process {pid} re-ran {line}"


def test_a_resumed_run_takes_the_previous_summary_and_reports_away_until_it_writes_its_own(tmp_path):
    """A resumed run may remove checks (their fingerprints changed) and be stopped before it judges them again:
    a junit.xml left from the run before would still say they passed, to a CI step that publishes it always."""
    from parity.runner.runner import _open_records

    out, path = tmp_path / "out", tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment([{"backend": "eager", "name": "same"}])))
    main(["run", str(path), "--out", str(out), "--quiet"])
    reports = ["summary.json", "junit.xml", "report.md", "report.html"]
    assert all((out / name).exists() for name in reports)
    run = read_records(out)[0]
    _open_records(out, run["config"], run["base_dir"], run["digest"], fresh=False).close()
    assert [name for name in reports if (out / name).exists()] == []
    assert (out / "records.jsonl").exists()
