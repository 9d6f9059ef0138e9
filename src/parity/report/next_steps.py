"""The next command for a failing check, from the records alone: what helps a user who reads that a
target fails (localize where it diverges, find a fallback, or look at the culprit tier 2 already named)."""

from __future__ import annotations

import shlex
from typing import Any

from parity import taxonomy as tx
from parity.records.view import RunView
from parity.verify.localize import LOCALIZABLE as RUN_LOCALIZES
from parity.verify.localize import pass_path, switch_words
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


def single_culprit(layers: dict[str, Any] | None) -> bool:
    """Did the localization name one module that a standalone repro of it alone reproduces? Not when every layer
    drifts alike (evenly spread), nor for a specialised trace (the module re-traced alone on the captured inputs
    takes their branch): `parity reduce` refuses those, and no next step offers it."""
    return bool(layers and not layers.get("error") and layers.get("culprit") and not layers.get("evenly_spread")
                and not layers.get("specialized"))


def next_steps(check: dict[str, Any], view: RunView) -> list[str]:
    """Lines for a failed (or errored) check: the culprit tier 2 named, then the commands that help."""
    if check["status"] == "skipped" or check.get("passed"):
        return []
    if check["status"] == "error":
        return ["fix the model or the input set so that the reference runs; no target was judged"]
    run = view.run
    found = view.layers_for(check)
    config = run.get("config") or {}
    task = next((m.get("task") for m in config.get("models") or [] if m.get("name") == check["model"]), None)
    file = shlex.quote(run["file"]) if run.get("file") else "EXPERIMENT.yaml"
    which = f"--model {shlex.quote(check['model'])} --target {shlex.quote(check['target'])} --inputs {shlex.quote(check['inputs'])}"
    lines = oracle_finding(check)
    target = _targets(run).get(check["target"], {})
    single = single_culprit(found)
    if found and not found.get("error") and found.get("culprit"):
        where = f" ({found['culprit_code']})" if found.get("culprit_code") else ""
        spread = " (the largest error of its own, but every layer drifts alike: no single culprit)" \
            if found.get("evenly_spread") else ""
        lines.append(f"diverges at {found['culprit']}{where}{spread}")
    if found and found.get("specialized"):
        s = found["specialized"]
        lines.append(f"the target's trace is specialised at {s['where']}" + (f": {s['code']}" if s.get("code") else "")
                     + "; trace it on inputs that take this input set's branch (the model's export_inputs), or make the branch "
                     "traceable (torch.where; torch.cond under torch.export)")
    found_pass = (found or {}).get("compiler_pass") or {}
    if found_pass.get("switch"):
        lines.append(f"next: try the target with options: {{inductor_config: {{{switch_words(found_pass['switch'])}}}}} "
                     f"(torch's compiler bisector: with it, {pass_path(found_pass)} no longer makes the drift)")
    if single and not target.get("quantize"):  # no int8 repro
        lines.append(f"next: parity reduce RUN_DIR --check {shlex.quote('/'.join((check['model'], check['inputs'], check['target'])))} (a standalone repro script)")
    failure = check.get("failure_class")
    if failure in LOCALIZABLE and not found:
        lines.append(f"next: parity localize {file} {which}")
    reduced = target.get("dtype") in ("bfloat16", "float16") or target.get("quantize")
    if failure in (*LOCALIZABLE, tx.DECISION_FLIP) and (reduced or target.get("backend") == "compile"):
        tier = " --tier 3" if task and headline_of(task) is not None else ""
        lines.append(f"next: parity fallback {file} {which}{tier}")
    return lines

