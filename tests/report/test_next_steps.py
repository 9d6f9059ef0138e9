"""Every failing check says what to do next, in the console, report.md, report.html and junit.xml, and
the command it names runs."""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET

from parity.cli import main
from parity.records.view import RunView
from parity.report.html import _failures
from tests.fixtures.tiny import PerturbedEager as PerturbedEagerClass
from tests.support import BF16_AT_FLOAT32, tiny_experiment
from tests.support.cli import run_experiment

PERTURBED = {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}


def _run(write_yaml, tmp_path, capsys, exp, *extra):
    ran = run_experiment(exp, tmp_path, *extra, capsys=capsys)
    return ran.code, ran.path, ran.out, ran.printed


def test_a_drift_names_the_localize_command_everywhere_and_that_command_runs(write_yaml, tmp_path, capsys):
    code, path, out, printed = _run(write_yaml, tmp_path, capsys, tiny_experiment([PERTURBED]))
    command = f"parity localize {path} --model tiny --target perturbed --inputs noise --out {out}/localize-tiny-noise-perturbed"
    assert code == 1 and f"next: {command}" in printed.replace("\n  ", " ")
    assert "parity fallback" not in printed  # an eager float32 target has no fallback to offer
    assert f"`{command}`" in (out / "report.md").read_text()
    assert command in (out / "report.html").read_text()
    [failure] = [c.find("failure") for c in ET.parse(out / "junit.xml").getroot().iter("testcase")]
    assert command in failure.text
    assert main(shlex.split(command)[1:]) in (0, 1)  # the suggested command runs: not a usage error (2)


def test_a_reduced_precision_target_with_a_task_is_offered_a_tier3_fallback(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([BF16_AT_FLOAT32])
    exp["models"][0]["task"] = "classification"
    code, path, _, printed = _run(write_yaml, tmp_path, capsys, exp, "--no-report")
    assert code == 1
    assert (f"next: parity fallback {path} --model tiny --target eager-cpu-bfloat16 --inputs noise --tier 3"
            in printed.replace("\n  ", " "))


def test_a_localized_failure_names_its_culprit_and_where_its_code_is(write_yaml, tmp_path, capsys):
    code, path, out, printed = _run(write_yaml, tmp_path, capsys,
                                    tiny_experiment([PERTURBED], tiers={"activations": True}), "--no-report")
    assert code == 1 and "parity localize" not in printed  # tier 2 already ran: its finding instead
    assert "diverges at conv (Conv2d (" in printed and "conv.py:" in printed


def test_a_reference_that_fails_says_what_to_fix(write_yaml, tmp_path, capsys):
    exp = tiny_experiment([PERTURBED], inputs=[{"name": "gray", "synthetic": {"shape": [2, 1, 16, 16]}}])
    code, _, out, _ = _run(write_yaml, tmp_path, capsys, exp)
    assert code == 2
    [error] = [c.find("error") for c in ET.parse(out / "junit.xml").getroot().iter("testcase")]
    assert "fix the model or the input set" in error.text
    assert "fix the model or the input set" in (out / "report.md").read_text()


def test_the_oracles_finding_is_said_beside_a_failed_check_everywhere(write_yaml, tmp_path, capsys):
    """PerturbedEager nudges a weight: the float64 oracle finds the target, not the reference, off."""
    code, _, out, printed = _run(write_yaml, tmp_path, capsys, tiny_experiment([PERTURBED], oracle=True))
    finding = "oracle: the target is worse than the reference at out"
    assert code == 1 and finding in printed.replace("\n  ", " ")
    assert finding in (out / "report.md").read_text() and finding in (out / "report.html").read_text()
    [failure] = [c.find("failure") for c in ET.parse(out / "junit.xml").getroot().iter("testcase")]
    assert finding in failure.text


def test_an_oracle_verdict_of_a_record_without_a_side_follows_the_rule():
    """Records written before `worse`: the side comes from the worst leaf's numbers and the rule, so a target
    2e-7 from float64 beside a reference 3e-7 away is as far, not "the reference is the imprecise one"."""
    from parity.records.models import OracleVerdict
    from parity.report.next_steps import oracle_finding

    old = {"target_worse": False, "leaves_target_worse": [], "multiplier": 2.0, "floor": 1e-8}
    assert oracle_finding(OracleVerdict.model_validate({**old, "target_rmse": 2e-7, "reference_rmse": 3e-7}), None) == [
        "oracle: both sides are equally far from float64 (rmse from float64: target 2e-07, reference 3e-07; "
        "neither is beyond 2x the other's + 1e-08)"]
    assert oracle_finding(OracleVerdict.model_validate({**old, "target_rmse": 2e-7, "reference_rmse": 3e-6}), None)[0].startswith(
        "oracle: the reference is the imprecise one: the target is closer to float64")
    assert oracle_finding(None, None) == []


def test_a_run_given_a_cache_names_it_in_its_next_commands(write_yaml, tmp_path, capsys):
    """A run with --cache-dir kept its exports and compiled kernels there: the localize it prints must look there,
    or it starts from nothing (a compile target compiles the whole model again)."""
    cache = tmp_path / "my cache"
    code, path, out, printed = _run(write_yaml, tmp_path, capsys, tiny_experiment([PERTURBED]), "--cache-dir", str(cache))
    command = (f"parity localize {path} --model tiny --target perturbed --inputs noise --cache-dir '{cache}' "
               f"--out {out}/localize-tiny-noise-perturbed")
    assert code == 1 and f"next: {command}" in printed.replace("\n  ", " ")
    assert main(shlex.split(command)[1:]) in (0, 1)


class FallsBack(PerturbedEagerClass):
    """A third party's backend whose class declares a fallback of its own, under a name parity does not know."""

    fallback_kind = "eager"


def _failed(backend: str, failure_class: str) -> list[str]:
    """next_steps of one failed tier-1 check, from records alone, of a float32 target running `backend`."""
    from parity.records.view import RunView
    from parity.report.next_steps import next_steps

    target = {"backend": backend, "name": "t"}
    run = {"kind": "run", "experiment": "x", "digest": "d", "base_dir": ".", "environment": {}, "file": "e.yaml",
           "config": {"tolerances": {"atol": [1e-5], "rtol": 0.0}, "models": [{"name": "m"}], "inputs": [],
                      "targets": [target]}}
    check = {"kind": "check", "model": "m", "inputs": "i", "target": "t", "tier": 1, "status": "ok", "passed": False,
             "failure_class": failure_class, "detail": "d", "rtol": 0.0, "gate": 1e-5, "required_atol": 0.1,
             "verdicts": {}, "leaves": []}
    view = RunView([run, check])
    return next_steps(view.checks(1)[0], view, "out")


def test_fallback_is_offered_by_the_backend_classs_capability_not_its_name():
    """A class with a fallback of its own (Backend.fallback_kind) is offered `parity fallback` under any name; one
    without is not; an ordering failure is localizable as drift is (verify.localize.LOCALIZABLE, the one set)."""
    offered = _failed(f"{__name__}:FallsBack", "numeric_drift")
    assert any(line.startswith("next: parity fallback e.yaml --model m --target t") for line in offered)
    assert not any("parity fallback" in line for line in _failed("tests.fixtures.tiny:PerturbedEager", "numeric_drift"))
    assert any(line.startswith("next: parity localize") for line in _failed("tests.fixtures.tiny:PerturbedEager", "ordering"))


def test_a_check_gated_on_tier3_says_its_failure_and_next_steps_once(write_yaml, tmp_path, capsys):
    """`gate: tier3`: the tier-1 check fails by its tier-3 check's verdict. The console's failed line and
    report.html's failures say it with its next steps; the console's tier-3 line gives its figures and points up,
    not a second copy of the detail and the commands."""
    flip = {"backend": "tests.fixtures.tiny:FlipLogits", "name": "flip", "dtype": "bfloat16", "tolerances": {"gate": "tier3"}}
    exp = tiny_experiment([flip], tiers={"tasks": {"output": "out[1]"}},
                          inputs=[{"name": "x", "synthetic": {"shape": [4, 3, 2, 2]}}])
    exp["models"][0].update(entry="tests.fixtures.tiny:features_and_logits", task="classification")
    code, path, out, printed = _run(write_yaml, tmp_path, capsys, exp, "--no-report")
    command = f"next: parity fallback {path} --model tiny --target flip --inputs x --tier 3"
    said = printed.replace("\n  ", " ")
    assert code == 1 and printed.count("next: ") == 1 and command in said
    assert said.count("decisions flipped") == 1 and "tier 3 decision_flip tiny / x / flip: top1_agreement 0" in said
    assert [(f["tier"], f["next"]) for f in _failures(RunView.read(out), out)] == [(1, [command])]
