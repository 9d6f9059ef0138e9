"""The fallback search: the smallest set of modules whose fallback (adapters/fallback.py: run eager, in
float32 or in float) makes a failing check pass. It runs executions and judges them, as the Runner does,
so it sits beside it; `Runner.find_fallback` prepares the model and calls `search_fallback`.

Candidates are tried in the order of their own (tier-2, local) error, added until the check passes (tier 1
at the gate, or the tier-3 task verdict), then the set is shrunk to a minimal one (each module dropped in
turn if the check still passes without it). A set that is in fact the whole model (every top-level module,
or modules that hold every parameter) is said to be so: it is no partial fallback, and `next_step` says
what to try instead, as it does when no set passes.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from parity.adapters.fallback import apply_fallback
from parity.backends import fallback_kind
from parity.config.schema import BackendSpec
from parity.config.tolerances import Tolerance, rounded_up
from parity.errors import ParityError
from parity.execute.execution import execute, new_backend
from parity.inputs import Inputs
from parity.records.models import Fallback, Layers
from parity.verify.judge import judge
from parity.verify.localize import children
from parity.verify.tasks import evaluate, tier3_check


@dataclass
class Trial:
    """One run of the target with a set of modules outside its fast path."""

    passed: bool
    required_atol: float
    task: dict[str, Any] | None = None
    tier1_passed: bool = False  # tier 1's own verdict, which the tier-3 aim does not need
    ran: Any = None  # the target's execution, judged again at another gate (`_passing_gate`)


def _latencies(runs_on: list[tuple[BackendSpec, torch.nn.Module]], inputs, runs: int, example=None) -> list[float]:
    """The median run time of each (backend spec, model), prepared from `example` (None: `inputs`), runs
    interleaved (one of each in turn), so that a slow spell of the machine falls on all of them alike. Their
    exports come from the running model's artifacts, as the search's executions' do."""
    backends = []
    try:
        for spec, model in runs_on:
            backend = new_backend(spec)
            backends.append(backend)
            backend.prepare(copy.deepcopy(model), (example if example is not None else inputs).clone())
        times: list[list[float]] = [[] for _ in runs_on]
        for _ in range(runs):
            for backend, spent in zip(backends, times, strict=True):
                fresh = inputs.clone()
                start = time.perf_counter()
                backend.run(fresh)
                spent.append(time.perf_counter() - start)
        return [statistics.median(t) for t in times]
    except Exception:  # the search already ran them; a failure here only loses the timing
        return [float("nan")] * len(runs_on)
    finally:
        for backend in backends:
            backend.close()


def search_fallback(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                    candidates: list[str] | Callable[[], list[str]], tolerance: Tolerance, latency_runs: int = 7,
                    task: tuple[str, Any] | None = None, example: Inputs | None = None, *,
                    names: tuple[str, str]) -> Fallback:
    """The smallest set of `candidates` (tried in the order given) whose fallback makes the check pass, each
    trial judged by the run's judge at the target's `tolerance`: tier 1 at its gate, or with `task` = (task
    name, tier-3 thresholds) as under `gate: tier3` (the task-level verdict decides numeric drift), which a
    reduced-precision target can often regain where no set brings every output within a tight gate.
    `candidates` may be a function that finds them (tier 2, minutes on a large model): it is called only
    when the check fails without fallback. Every trial is prepared from `example` (the run's example inputs;
    None: `inputs`) and judged on `inputs`, as the run prepared and judged the check. Returns the `fallback`
    record of the check `names` (model, input set), its `next_step` left for the caller (`next_step`)."""
    kind = fallback_kind(target)
    ref = execute(reference, model, inputs, 1, example=example)
    if not ref.ok:
        raise ParityError(f"the reference {reference.id} failed: {ref.error}")
    reference_out = ref.outputs[0]

    aimed = dataclasses.replace(tolerance, by_task=task is not None)

    def run_trial(modules: list[str]) -> Trial:
        ran = execute(target, apply_fallback(model, modules, target) if modules else model, inputs, 1, example=example)
        if not ran.ok:
            return Trial(False, float("inf"))
        verdict = evaluate(task[0], reference_out, ran.outputs[0], task[1], tolerance.gate, inputs) if task else None
        tier3 = verdict and tier3_check(verdict, model="", inputs="", reference=reference.id, target=target.id,
                                        thresholds=None)
        check = judge(ref, ran, aimed, task=tier3)
        required = check.required_atol if check.required_atol is not None else float("inf")
        tier1 = check.passed if check.tier1_passed is None else check.tier1_passed
        return Trial(bool(check.passed), required, verdict.metrics if verdict else None, bool(tier1), ran)

    def found(modules: list[str], last: Trial, passed: bool = False,
              latencies: tuple[float | None, ...] = (None, None, None)) -> Fallback:
        """The record: `modules` with `last`, their trial (the set found, or the last set tried)."""
        before_s, after_s, float_s = latencies
        ceiling_atol, ceiling_modules = ceiling if ceiling is not None else (None, None)
        return fallback_record(model=names[0], inputs=names[1], reference=reference.id, target=target.id,
                               runs_in=kind, aim="tier 3" if task else "tier 1", modules=modules, passed=passed,
                               required_atol_before=first.required_atol, required_atol_after=last.required_atol,
                               tier1_passed_after=last.tier1_passed, task_before=first.task, task_after=last.task,
                               latency_before_s=before_s, latency_after_s=after_s, latency_float_s=float_s, tried=tried,
                               whole_model=passed and is_whole_model(model, modules), ceiling_atol=ceiling_atol,
                               ceiling_modules=ceiling_modules, passing_gate=passing_gate)

    first = trial = run_trial([])
    passing_gate = None if trial.passed else _passing_gate(ref, trial.ran, tolerance)
    tried = 0
    ceiling: tuple[float, int] | None = None  # its required atol, and how many modules it put in fallback
    if callable(candidates):
        candidates = [] if trial.passed else candidates()
    if not trial.passed and candidates:  # the ceiling: every candidate at once; if that fails, no subset passes
        outermost = [c for c in candidates if not any(c.startswith(o + ".") for o in candidates if o != c)]
        every = run_trial(outermost)
        tried += 1
        ceiling = (every.required_atol, len(outermost))
        if not every.passed:
            return found(outermost, every)
    chosen: list[str] = []
    for name in candidates:  # grow: add the next suspect until the check passes
        if trial.passed:
            break
        if any(name.startswith(c + ".") for c in chosen):
            continue
        chosen = [c for c in chosen if not c.startswith(name + ".")] + [name]
        trial = run_trial(chosen)
        tried += 1
    if not trial.passed:
        return found(chosen, trial)
    for name in list(chosen):  # shrink: drop each module the check passes without
        if len(chosen) == 1:  # without it, no module: the check ran so first, and failed
            break
        smaller = run_trial([c for c in chosen if c != name])
        tried += 1
        if smaller.passed:
            chosen, trial = [c for c in chosen if c != name], smaller
    timed = [(target, model), (target, apply_fallback(model, chosen, target))]
    if target.quantize is not None:  # what int8 saves at all: the float model on the same backend
        timed.append((target.model_copy(update={"quantize": None}), model))
    before_s, after_s, *float_s = _latencies(timed, inputs, latency_runs, example)
    return found(chosen, trial, passed=True, latencies=(before_s, after_s, float_s[0] if float_s else None))


def fallback_record(*, latency_before_s: float | None = None, latency_after_s: float | None = None,
                    **fields: Any) -> Fallback:
    """The `fallback` record of what a search found (this one, or runner/tensor_types.py's): a field it did not
    measure is null, and `latency_ratio` is after / before when both were timed."""
    unmeasured = {name: None for name, f in Fallback.model_fields.items() if f.is_required() and name not in fields}
    ratio = latency_after_s / latency_before_s if latency_before_s and latency_after_s else None
    return Fallback(**{**unmeasured, "kind": "fallback", **fields, "latency_before_s": latency_before_s,
                       "latency_after_s": latency_after_s, "latency_ratio": ratio})


def _passing_gate(reference, ran, tolerance: Tolerance) -> float | None:
    """The gate to suggest for the target as it is: its required atol rounded up, kept only when the judge,
    given the same executions again at that gate (the target's own, as the suggested entry sets it), passes the
    check (a shape or NaN failure passes at no gate)."""
    if ran is None or not ran.ok:
        return None
    required = judge(reference, ran, tolerance).required_atol
    if required is None:
        return None
    gate = rounded_up(required)
    at_gate = dataclasses.replace(tolerance, gate=gate, by_task=False, source="target", relative=None)
    return gate if judge(reference, ran, at_gate).passed else None


def candidates_from(localized: Layers) -> list[str]:
    """Every layer a localization looked at, by its own error, largest first (suspects lead, then the first
    layer over the threshold, which is all a whole-graph verdict names)."""
    seen: dict[str, float] = {}
    for level in localized.levels or ():
        for layer in level.layers:
            if not (layer.local and layer.local.error):
                own = (layer.local.rel_rmse if layer.local else None) or 0.0
                seen[layer.name] = max(seen.get(layer.name, 0.0), own)
    named = [s.name for s in localized.suspects or ()] + [localized.first_divergent]
    leading = list(dict.fromkeys(n for n in named if n in seen))
    rest = sorted((n for n in seen if n not in leading), key=lambda n: -seen[n])
    return leading + rest


def is_whole_model(model: torch.nn.Module, modules: list[str]) -> bool:
    """Is this set the whole model in all but name: every top-level module (or a container of it), or
    modules that together hold every parameter the model has?"""
    if not modules:
        return False
    top = children(model, "")
    if all(any(t == m or t.startswith(m + ".") for m in modules) for t in top):
        return True
    every = {id(p) for p in model.parameters()}
    held = {id(p) for m in modules for p in model.get_submodule(m).parameters()}
    return bool(every) and every <= held


def next_step(result: Fallback, command: str, task: str | None, target: BackendSpec | None = None) -> str | None:
    """What to try when the search found no partial fallback, in lines (a `next:` line is a command and nothing
    else): the task-level aim (`command --tier 3`) when the aim was tier 1 and the model has a task tier 3
    evaluates; the gate at which the target as it is passes, as the target's own entry with it (`target`: its
    spec), which is where it takes effect (a reduced dtype's default wins over the experiment's gate); else lower
    task thresholds. None when a partial fallback (or none) is the answer."""
    if result.passed and not result.whole_model:
        return None
    lines = []
    if result.aim == "tier 1" and task:
        lines += [f"aim at the {task} decisions instead of every output within the gate:", f"next: {command} --tier 3"]
    if result.aim == "tier 1" and result.passing_gate is not None:
        lines.append(f"{'or ' if task else ''}widen the gate if the drift is acceptable: the target as it is passes at atol "
                     f"{result.passing_gate:g} (its run judged again at it); in the target's own entry, where it wins "
                     "over its dtype's default and the experiment's:")
        lines += target_entry_yaml(target, {"gate": result.passing_gate}) if target is not None else \
            [f"  tolerances: {{gate: {result.passing_gate:g}}}"]
        lines.append("or keep this model at the reference's precision")
    elif result.aim == "tier 1" and not task:
        lines.append("no atol passes the target as it is: keep this model at the reference's precision")
    if result.aim == "tier 3":
        lines.append("lower the thresholds in tiers.tasks if the task metrics above are acceptable, or keep this model "
                     "at the reference's precision")
    return "\n".join(lines)


def target_entry_yaml(target: BackendSpec, tolerances: dict[str, Any]) -> list[str]:
    """The target's entry of an experiment file, with `tolerances` set in it, as YAML lines under `targets:`."""
    import yaml

    entry = target.model_dump(mode="json", exclude_defaults=True)
    entry["tolerances"] = {**(entry.get("tolerances") or {}), **tolerances}
    text = yaml.safe_dump({"targets": [entry]}, sort_keys=False, default_flow_style=None)
    return ["  " + line for line in text.splitlines()]
