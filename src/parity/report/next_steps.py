"""The next command for a failing check, from the records alone: what helps a user who reads that a
target fails (localize where it diverges, find a fallback, or look at the culprit tier 2 already named)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from parity import taxonomy as tx
from parity.records.view import RunView
from parity.verify.localize import LOCALIZABLE as RUN_LOCALIZES
from parity.verify.tasks import headline_of

LOCALIZABLE = (*RUN_LOCALIZES, tx.ORDERING)  # tier-1 failures that a layer's numbers can explain


def _targets(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run's targets by id, as the experiment wrote them."""
    from parity.config.schema import BackendSpec

    out = {}
    for entry in (run.get("config") or {}).get("targets") or []:
        try:
            out[BackendSpec.model_validate(entry).id] = entry
        except ValueError:  # records written by hand: no command rather than a wrong one
            continue
    return out


def oracle_finding(check: dict[str, Any]) -> list[str]:
    """What the float64 oracle says of a failed check: which side is the imprecise one."""
    oracle = check.get("oracle")
    if not oracle:
        return []
    rmse = (f" (rmse from float64: target {oracle['target_rmse']:.3g}, reference {oracle['reference_rmse']:.3g})"
            if oracle.get("target_rmse") is not None and oracle.get("reference_rmse") is not None else "")
    if oracle["target_worse"]:
        leaves = ", ".join(oracle.get("leaves_target_worse") or [])
        return [f"oracle: the target is worse than the reference{f' at {leaves}' if leaves else ''}{rmse}"]
    return [f"oracle: the reference is the imprecise one: the target is as close to float64{rmse}"]


def localize_out(run_dir: str | Path, model: str, inputs: str, target: str) -> str:
    """Where the printed `parity localize` writes its record: a folder of its own in the run's, so that the
    `parity reduce` it prints next finds it."""
    return str(Path(run_dir) / f"localize-{model}-{inputs}-{target}")


def reduce_step(run_dir: str | Path, model: str, inputs: str, target: str) -> str:
    """The `parity reduce` line for a localized check whose record is in `run_dir`."""
    which = shlex.quote("/".join((model, inputs, target)))
    return f"next: parity reduce {shlex.quote(str(run_dir))} --check {which} (a standalone repro script)"


def next_steps(check: dict[str, Any], view: RunView, run_dir: str | Path) -> list[str]:
    """Lines for a failed (or errored) check of the run in `run_dir`: the culprit tier 2 named, then the
    commands that help, each runnable as printed (a run without an experiment file is told to save one)."""
    if check["status"] == "skipped" or check.get("passed"):
        return []
    if check["status"] == "error":
        return ["fix the model or the input set so that the reference runs; no target was judged"]
    run = view.run
    found = view.layers_for(check)
    config = run.get("config") or {}
    task = next((m.get("task") for m in config.get("models") or [] if m.get("name") == check["model"]), None)
    file = shlex.quote(run["file"]) if run.get("file") else None
    which = f"--model {shlex.quote(check['model'])} --target {shlex.quote(check['target'])} --inputs {shlex.quote(check['inputs'])}"
    lines = oracle_finding(check)
    target = _targets(run).get(check["target"], {})
    if found and not found.get("error") and found.get("culprit"):
        where = f" ({found['culprit_code']})" if found.get("culprit_code") else ""
        lines.append(f"diverges at {found['culprit']}{where}")
    if found and not found.get("error") and found.get("culprit") and not target.get("quantize"):  # no int8 repro
        lines.append(reduce_step(run_dir, check["model"], check["inputs"], check["target"]))
    failure = check.get("failure_class")
    reduced = target.get("dtype") in ("bfloat16", "float16") or target.get("quantize")
    commands = []
    if failure in LOCALIZABLE and not found:
        out = shlex.quote(localize_out(run_dir, check["model"], check["inputs"], check["target"]))
        commands.append(("localize", f"parity localize {file} {which} --out {out}"))
    if failure in (*LOCALIZABLE, tx.DECISION_FLIP) and (reduced or target.get("backend") == "compile"):
        tier = " --tier 3" if task and headline_of(task) is not None else ""
        commands.append(("fallback", f"parity fallback {file} {which}{tier}"))
    if commands and file is None:  # parity check without --save-experiment, the Python API on a dict
        verbs = " and ".join(f"parity {verb}" for verb, _ in commands)
        return [*lines, f"next: save the experiment (parity check --save-experiment FILE): {verbs} start from an "
                        "experiment file, and this run was given none; the next: lines then name it"]
    return [*lines, *(f"next: {command}" for _, command in commands)]
