"""A reference (or oracle) that cannot run is never charged to a target: its checks have no verdict
(`reference_error`), the targets are not run, JUnit calls them errors, and the exit code says whose it is."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from parity.cli import main
from parity.records import read_records
from parity.records.view import RunView
from tests.support import tiny_experiment
from tests.support.cli import run_experiment

TARGETS = [{"backend": "eager", "name": "same"}, {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}]


def _run(write_yaml, tmp_path, exp, *extra):
    ran = run_experiment(exp, tmp_path, *extra)
    return ran.code, ran.out, ran.records()


def _tier1(records):
    return {r.target: r for r in RunView(records).checks(1)}


def test_a_model_that_raises_on_its_inputs_is_a_user_error_and_no_target_is_charged(write_yaml, tmp_path, capsys):
    """The tiny CNN wants 3 channels; a 1-channel input set makes the eager reference raise. Every check
    of that pair is `reference_error` with no verdict, no target executes, the run exits 2 with the
    reference's message printed once (on the table's `reference failed` line; stderr's error line names the class
    and where the message is), and the reports say the reference failed, not the targets."""
    exp = tiny_experiment(TARGETS, inputs=[{"name": "gray", "synthetic": {"shape": [2, 1, 16, 16]}}])
    code, out, records = _run(write_yaml, tmp_path, exp)
    captured = capsys.readouterr()
    assert code == 2
    assert ("error: model 'tiny' on input set 'gray': the reference eager-cpu raised (backend_error), so no target "
            "was judged (its error: the 'reference failed' line above, and ") in captured.err
    assert (captured.out + captured.err).count("expected input[2, 1, 16, 16]") == 1  # the reference's own message, once
    assert "Traceback" not in captured.err + captured.out
    checks = _tier1(records)
    assert set(checks) == {"same", "perturbed"}
    for check in checks.values():
        assert check.status == "error" and check.passed is None
        assert check.failure_class == "reference_error" and check.user_error is True
        assert check.verdicts == {}
    assert {r["backend"] for r in records if r["kind"] == "execution"} == {"eager-cpu"}  # no target ran
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"] == {"checks": 2, "passed": 0, "failed": 0, "skipped": 0, "errors": 2}
    assert summary["failure_classes"] == {}  # nothing is counted against a target
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert (suite.get("errors"), suite.get("failures")) == ("2", "0")
    assert all(case.find("failure") is None and case.find("error").get("type") == "reference_error"
               for case in suite.iter("testcase"))
    markdown = (out / "report.md").read_text()
    assert "ERROR (reference)" in markdown and "## Reference failures" in markdown and "FAIL" not in markdown
    html = (out / "report.html").read_text()
    assert "no verdict: the reference failed" in html and "the model as written raised" in html
    assert "reference failed" in captured.out and "ERROR" in captured.out


def test_a_reference_backend_that_fails_gives_no_verdict_and_exit_1(write_yaml, tmp_path, capsys):
    """A reference that is not the model as written (here a backend that raises) is not the user's model
    at fault: the checks are `reference_error` without the user-error mark, and the run exits 1, never 0."""
    exp = tiny_experiment(TARGETS, reference={"backend": "tests.fixtures.tiny:FailingEager", "name": "ref"})
    code, out, records = _run(write_yaml, tmp_path, exp)
    assert code == 1
    assert "error:" not in capsys.readouterr().err
    for check in _tier1(records).values():
        assert check.status == "error" and check.failure_class == "reference_error"
        assert check.user_error is False and "boom" in check.detail


def test_other_pairs_are_still_judged_when_one_reference_fails(write_yaml, tmp_path):
    """One input set the model cannot take does not cost the others their verdicts."""
    exp = tiny_experiment(TARGETS, inputs=[{"name": "gray", "synthetic": {"shape": [2, 1, 16, 16]}},
                                           {"name": "rgb", "synthetic": {"shape": [2, 3, 16, 16]}}])
    code, _, records = _run(write_yaml, tmp_path, exp)
    assert code == 2
    rgb = {r["target"]: r for r in records if r["kind"] == "check" and r["inputs"] == "rgb"}
    assert rgb["same"]["passed"] is True
    assert rgb["perturbed"]["passed"] is False and rgb["perturbed"]["failure_class"] == "numeric_drift"


def test_an_oracle_that_fails_is_said_and_the_target_is_still_judged(write_yaml, tmp_path, monkeypatch):
    """The float64 oracle is evidence: when it cannot run, the check says why it has no oracle verdict
    and is judged against the reference as usual."""
    from parity.runner import plan

    failing_oracle = plan.ORACLE.model_copy(update={"backend": "tests.fixtures.tiny:FailingEager"})
    monkeypatch.setattr(plan, "ORACLE", failing_oracle)
    exp = tiny_experiment(TARGETS, oracle=True)
    code, _, records = _run(write_yaml, tmp_path, exp)
    checks = _tier1(records)
    assert code == 1  # the perturbed target fails on its own merits
    assert checks["same"].passed is True and checks["same"].oracle is None
    assert "the float64 oracle could not run" in checks["same"].oracle_error and "boom" in checks["same"].oracle_error
    assert checks["perturbed"].failure_class == "numeric_drift"


def test_reference_errors_are_judgements_a_resumed_run_does_not_repeat(write_yaml, tmp_path):
    exp = tiny_experiment(TARGETS, inputs=[{"name": "gray", "synthetic": {"shape": [2, 1, 16, 16]}}])
    path = write_yaml(exp)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    before = read_records(out)
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    after = read_records(out)
    assert [r for r in after if r["kind"] == "check"] == [r for r in before if r["kind"] == "check"]
