"""The next command for a failing check, from the records alone: what helps a user who reads that a
target fails (localize where it diverges, find a fallback, or look at the culprit tier 2 already named)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from parity import taxonomy as tx
from parity.backends import backend_class, fallback_kind
from parity.backends.base import TensorTypes
from parity.config.schema import BackendSpec
from parity.records.models import Check, Layers, OracleVerdict, Run
from parity.records.view import RunView
from parity.verify.localize import LOCALIZABLE, pass_path, switch_words
from parity.verify.tasks import headline_of


def _targets(run: Run) -> dict[str, Any]:
    """The run's targets by id, as config/schema.py reads the experiment's entries (BackendSpec)."""
    out = {}
    for entry in run.config.targets:
        try:
            spec = BackendSpec.model_validate(entry)
        except ValueError:  # records written by hand: no command rather than a wrong one
            continue
        out[spec.id] = spec
    return out


def oracle_side(oracle: OracleVerdict) -> str:
    """The side farther from float64 (verify.tensors.oracle_verdict); records written before `worse` have the
    target's side and the worst leaf's numbers, from which the rule gives the rest."""
    if oracle.worse:
        return oracle.worse
    t, r = oracle.target_rmse, oracle.reference_rmse
    if oracle.target_worse or t is None or r is None:
        return "target" if oracle.target_worse else "neither"
    return "reference" if r > oracle.multiplier * t + oracle.floor else "neither"


def oracle_finding(oracle: OracleVerdict | None, passed: bool | None, error: str | None = None) -> list[str]:
    """What the float64 oracle (`oracle`, or `error`: why it has no verdict) says of a check that `passed` or
    not: for a failed one, which side is off or why it cannot say; for a passing one, a target much farther from
    float64 than the reference (`notable`), or why it cannot say."""
    if not oracle:
        return [f"oracle: no verdict: {error}"] if error else []
    t, r = oracle.target_rmse, oracle.reference_rmse
    rmse = f"rmse from float64: target {t:.3g}, reference {r:.3g}" if t is not None and r is not None else ""
    if passed:
        if not oracle.notable:
            return []
        times = f"{t / r:.3g}x" if r else "much"
        return [f"oracle: passes, but the target is {times} farther from float64 than the reference ({rmse}; "
                f"output rms {oracle.scale:.3g})"]
    worse = oracle_side(oracle)
    t_off, r_off = oracle.target_nonfinite_off, oracle.reference_nonfinite_off
    if t_off is not None and worse != "neither":  # NaN/Inf on one side only: the non-finite patterns decided
        if oracle.nonfinite_alike:
            return [f"oracle: both sides are wrong alike: they return the same NaN/Inf where float64 has numbers "
                    f"({r_off} element(s)), the reference's own NaN/Inf, which the target repeats; there is no drift "
                    "between them"]
        counts = f"differing from float64 at {t_off} element(s) in the target, {r_off} in the reference"
        return [{"target": f"oracle: float64 has the reference's NaN/Inf pattern, not the target's: the target's "
                           f"NaN/Inf are its own ({counts})",
                 "reference": f"oracle: float64 has the target's NaN/Inf pattern, not the reference's: the "
                              f"reference's values there are the artefact, the target is right ({counts})",
                 "both": f"oracle: float64 has neither side's NaN/Inf pattern ({counts})"}[worse]]
    if worse == "target":
        leaves = ", ".join(oracle.leaves_target_worse)
        return [f"oracle: the target is worse than the reference{f' at {leaves}' if leaves else ''} ({rmse})"]
    if worse == "reference":
        return [f"oracle: the reference is the imprecise one: the target is closer to float64 ({rmse})"]
    return [f"oracle: both sides are equally far from float64 ({rmse}; neither is beyond "
            f"{oracle.multiplier:g}x the other's + {oracle.floor:g})"]


def single_culprit(layers: Layers | None) -> bool:
    """Did the localization name one module that a standalone repro of it alone reproduces? Not when every layer
    drifts alike (evenly spread), nor for a specialised trace (the module re-traced alone on the captured inputs
    takes their branch): `parity reduce` refuses those, and no next step offers it. Nor a tensor group of a GGUF
    file (runner/tensor_types.py): no module to cut. Nor a culprit on a decode step: reduce cuts a module out of the
    forward, where that target agrees."""
    return bool(layers and not layers.error and layers.culprit and not layers.evenly_spread and not layers.specialized
                and not layers.tensor_groups and not layers.decode_step)


def localize_out(run_dir: str | Path, model: str, inputs: str, target: str) -> str:
    """Where the printed `parity localize` writes its record: a folder of its own in the run's, so that the
    `parity reduce` it prints next finds it."""
    return str(Path(run_dir) / f"localize-{model}-{inputs}-{target}")


def reduce_step(run_dir: str | Path, model: str, inputs: str, target: str,
                file: str | Path | None = None) -> list[str]:
    """The `parity reduce` lines for a localized check whose record is in `run_dir`: what it makes, then the
    command alone (a `next:` line is a command and nothing else). It names the experiment `file` the run ran, as
    the localize and fallback lines do: reduce imports model code only from a file the user passes (never one its
    records name)."""
    which = shlex.quote("/".join((model, inputs, target)))
    experiment = f" --experiment {shlex.quote(str(file))}" if file else ""
    return ["the culprit alone, as a standalone repro script:",
            f"next: parity reduce {shlex.quote(str(run_dir))} --check {which}{experiment}"]


def _capabilities(target) -> tuple[bool, bool, bool]:
    """Whether localize and fallback can look inside what `target` runs (Backend.localizes), whether it runs a
    file of typed tensors (TensorTypes: localized by tier 3's KLD, so a decision flip is localized too), and whether
    `parity fallback` has something to run its modules as (backends.fallback_kind: a reduced dtype, a quantized
    target, or a backend class with a fallback of its own); looking inside, not typed and no fallback of the class's
    own when the backend is not installed where the report is rendered."""
    try:
        cls = backend_class(target.backend)
        inside, typed = cls.localizes(target), issubclass(cls, TensorTypes)
    except Exception:  # a plugin missing here, a class reference that does not import
        inside, typed = True, False
    try:
        fallback_kind(target)
    except Exception:  # no fallback for this target (ParityError), or its backend is missing here
        return inside, typed, False
    return inside, typed, True


def next_steps(check: Check, view: RunView, run_dir: str | Path) -> list[str]:
    """Lines for a failed (or errored) check of the run in `run_dir`: the culprit tier 2 named, then the
    commands that help, each runnable as printed (a run without an experiment file is told to save one)."""
    if check.status == "skipped" or check.passed:
        return []
    if check.status == "error":
        return ["fix the model or the input set so that the reference runs; no target was judged"]
    run = view.run
    found = view.layers_for(check)
    task = next((m.task for m in run.config.models if m.name == check.model), None)
    file = shlex.quote(run.file) if run.file else None
    which = f"--model {shlex.quote(check.model)} --target {shlex.quote(check.target)} --inputs {shlex.quote(check.inputs)}"
    if run.cache_dir:  # the run's exports and compiled kernels: the next command starts from them
        which += f" --cache-dir {shlex.quote(run.cache_dir)}"
    lines = oracle_finding(check.oracle, check.passed, check.oracle_error) if check.tier == 1 else []
    target = _targets(run).get(check.target)
    quantized = bool(target and target.quantize)
    single = single_culprit(found)
    if found and not found.error and found.culprit:
        where = f" ({found.culprit_code})" if found.culprit_code else ""
        spread = " (the largest relative error of its own, but every layer drifts alike: no single culprit)" \
            if found.evenly_spread else ""
        step = " on the decode step (its cached decoding fails, its forward agrees)" if found.decode_step else ""
        lines.append(f"diverges at {found.culprit}{where}{spread}{step}")
    if found and found.specialized:
        s = found.specialized
        lines.append(f"the target's trace is specialised at {s.where}" + (f": {s.code}" if s.code else "")
                     + "; trace it on inputs that take this input set's branch (the model's export_inputs), or make the branch "
                     "traceable (torch.where; torch.cond under torch.export)")
    found_pass = found.compiler_pass if found else None
    if found_pass and found_pass.switch:
        lines.append(f"try the target with options: {{inductor_config: {{{switch_words(found_pass.switch)}}}}} "
                     f"(torch's compiler bisector: with it, {pass_path(found_pass)} no longer makes the drift)")
    if single and not quantized:  # no int8 repro
        lines += reduce_step(run_dir, check.model, check.inputs, check.target, run.file)
    failure = check.failure_class
    commands = []
    inside, typed, falls_back = _capabilities(target) if target else (True, False, False)
    if not inside:
        return lines
    localize = f"parity localize {file} {which} --out {shlex.quote(localize_out(run_dir, check.model, check.inputs, check.target))}"
    if (failure in LOCALIZABLE or (typed and failure == tx.DECISION_FLIP)) and not found:
        commands.append(("localize", localize))
    lines += _cached_lines(check, view, commands, localize)
    if failure in (*LOCALIZABLE, tx.DECISION_FLIP) and falls_back:
        tier = " --tier 3" if task and headline_of(task) is not None else ""
        commands.append(("fallback", f"parity fallback {file} {which}{tier}"))
    if commands and file is None:  # parity check without --save-experiment, the Python API on a dict
        verbs = " and ".join(f"parity {verb}" for verb, _ in commands)
        return [*lines, f"{verbs} start from an experiment file, and this run was given none: save it as one "
                        "(parity check --save-experiment FILE; the Python API: write the dict as YAML) and run them on it"]
    return [*lines, *(f"next: {command}" for _, command in commands)]


def _cached_lines(check: Check, view: RunView, commands: list[tuple[str, str]], localize: str) -> list[str]:
    """For a tier-3 check whose cached decoding fails: on the target, the `localize` command, which compares the decode
    step when the check's forward passes at the gate (its tier-1 check; when that fails, localize explains the forward
    first, and its own next steps say so); on the reference, why no command helps; nothing when the run localized the
    check already (tier 2 on: its layers record). Appends to `commands`."""
    cached = getattr(check, "cached", None)
    if cached is None or cached.passed is not False:
        return []
    if cached.side == "reference":
        return ["the reference's own cached decoding differs from its uncached forward: the model's decode path (its "
                "cache, its positions) is wrong on the reference itself, which localize (a target against the "
                "reference) does not show"]
    if view.layers_for(check) is not None:
        return []
    forward = view.checks(1, model=check.model, inputs=check.inputs, target=check.target)
    if forward and forward[0].passed and not any(verb == "localize" for verb, _ in commands):
        commands.append(("localize", localize))
        return ["its forward agrees and its cached decoding does not: localize compares the modules on a decode step"]
    return []
