"""Tier 2's runs: where does a target start to differ? Ranks layers by their own (local) error, top-level blocks
first, then inside the worst block, down to a leaf, so a deep model needs a few small runs per level rather
than every layer compiled separately.

At every level the parent's own code (the additions and reshapes between its submodules, measured with
the submodules replayed from the reference) competes with its submodules; when it is the worst, the
parent is the culprit *in its own code* and the descent stops there.

Only an own error above the threshold makes a culprit. When no top-level layer (nor the model's own code)
exceeds it alone, the difference comes from how the target transforms the whole graph (fusion, layout,
quantization), not from one layer: the localization says so (`whole_graph`) and names instead the first
layer whose *propagated* error exceeds the threshold. When no part of a block exceeds it alone while the
block does, the block is the culprit as a whole (`as_a_whole`).

A quantized target (`quantize:`) is ranked by each layer's own quantization error, as torch.ao.ns's shadow
loggers measure it: the layer alone quantized (calibrated on its inputs in the float model's calibration
runs) and fed the reference's inputs, against the float layer. Its own code is not measured (a parent of
replays has no ranges of its own) nor its propagated errors (the exported int8 graph has no module hooks).

What the errors say (the ranking, the finding and its words) is verify/localize.py's; how each layer is read on a
backend, runner/layer_runs.py's.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import torch

from parity.backends import backend_class
from parity.backends.base import BisectsCompiler, release_memory
from parity.config.schema import BackendSpec, tasks_spec
from parity.errors import ParityError, exception_words
from parity.execute import follow_up
from parity.execute.execution import execute
from parity.inputs import Inputs
from parity.records.models import (
    CachedDecodingCheck,
    CompilerPass,
    DecodeCached,
    DecodeStepCompared,
    GateVerdict,
    LayerError,
    Layers,
    Repeated,
)
from parity.runner.layer_runs import (
    calibration_inputs,
    capture,
    capture_decode_step,
    local_errors,
    looking_inside,
    observe_at_once,
    observes_layers,
    own_code_error,
    propagated_errors,
)
from parity.verify.activations import LevelResult, arguments, differing, step_errors
from parity.verify.judge import judge
from parity.verify.localize import (
    LEAVES,
    MODEL,
    Localization,
    children,
    descendants,
    first_divergent,
    flat_finding,
    layer_names,
    module_code,
    rank,
    repeated,
    settled_identical,
    size,
    specialized_at,
    spread,
    within,
)
from parity.verify.tasks import TaskResult
from parity.verify.tasks.text_generation import TASK as TEXT_GENERATION
from parity.verify.tasks.text_generation import cached_prompt, decode_cached, judge_cached, unraised

log = logging.getLogger(__name__)

FLAT_CHUNK = 24  # layers per end-to-end run in a flat (leaf, depth:N, list) comparison; 96 in propagated mode
REPEATS_MEASURED = 8  # the most instances of a repeated submodule measured beside the culprit
COMPILER_PASS_BUDGET_S = 300.0  # a compiler-pass bisection compiles the model once per step: bounded


def evaluate(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
             names: list[str], rtol: float, mode: str, parent: str = "", example: Inputs | None = None,
             say: Callable[[str], None] = lambda text: None) -> LevelResult:
    """Local and/or propagated errors of `names`, in call order. Holds the reference's inputs and
    outputs of these layers only, and each target output only while it is compared. End to end, both sides
    are prepared from `example` (the run's example inputs; None: `inputs`) and run `inputs`, as the run
    did: the target's layers are seen inside the artifact that failed. A layer alone (local mode) is a slice of
    the whole model's artifact where the target slices (`local_errors`), else prepared from its own inputs.
    `say` hears what is being done (for progress)."""
    where = f"{parent or 'top level'} ({len(names)} layers)"
    say(f"{where}: the reference")
    calls = capture(reference, model, inputs, names, with_inputs=mode != "propagated",  # only local mode needs them
                    example=example)
    result = LevelResult(names=list(calls), shared=[n for n, c in calls.items() if len(c) > 1])
    if mode in ("local", "both"):
        observed = calibration_inputs(reference, target, model, list(calls))  # a quantized target's, per layer
        result.local = local_errors(target, model, calls, rtol, example if example is not None else inputs, observed,
                                    say=lambda text: say(f"{parent or 'top level'}: {text}"))
    if mode in ("propagated", "both") and observes_layers(target):
        say(f"{where}: inside the target's run")
        result.propagated = propagated_errors(target, model, inputs, calls, rtol, example)
    del calls
    return result


def localize(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, rtol: float,
             threshold: float, granularity: str | list[str] = "blocks", mode: str = "both",
             example: Inputs | None = None, on_step: Callable[[str], None] | None = None) -> Localization:
    """Where `target` starts to differ from `reference` (the module docstring). `on_step` hears what is being done
    (the level, the layer k of n), which is also logged (debug: --verbose) with the time spent so far."""
    start = time.perf_counter()

    def say(text: str) -> None:
        log.debug("localizing %s: %s (%.1f s)", target.id, text, time.perf_counter() - start)
        if on_step is not None:
            on_step(text)

    with looking_inside(target):
        loc = _localize(reference, target, model, inputs, rtol, threshold, granularity, mode, example, say)
    loc.elapsed_s = time.perf_counter() - start
    return loc


def _localize(reference, target, model, inputs, rtol, threshold, granularity, mode, example, say) -> Localization:
    if granularity != "blocks":
        level = LevelResult(names=[])
        names = layer_names(model, granularity)
        chunk = FLAT_CHUNK if mode != "propagated" else 4 * FLAT_CHUNK  # outputs only: four times the layers
        for i in range(0, len(names), chunk):  # a chunk at a time: memory bounded however many layers
            say(f"layers {i + 1}-{min(i + chunk, len(names))} of {len(names)}")
            part = evaluate(reference, target, model, inputs, names[i:i + chunk], rtol, mode, example=example, say=say)
            level.names += part.names
            level.shared += part.shared
            level.local.update(part.local)
            level.propagated.update(part.propagated)
        loc = flat_finding(target.id, level, threshold, mode)
    else:
        loc = _descend(reference, target, model, inputs, rtol, threshold, mode, example, say)
        loc.mode_used = mode
    return settled_identical(loc)


def _descend(reference, target, model, inputs, rtol, threshold, mode, example, say) -> Localization:
    """Top-level modules first, then inside the one with the largest own error, down to a leaf. At each
    level the parent's own code (its operations between submodules, measured with the submodules
    replayed from the reference) competes with its submodules: when it is the worst, the search stops
    there. Only errors above the threshold are followed: when none at the top level exceeds it, the
    drift belongs to the whole graph; when none inside a block does, to the block as a whole."""
    loc = Localization(target.id, "hierarchical", threshold)
    parent = ""
    several = False  # more than one layer above the threshold at some level
    if mode in ("propagated", "both"):
        reachable = descendants(model, "")
        say(f"every level's layers ({len(reachable)}) inside one run of the target")
        observe_at_once(target, model, inputs, reachable, example)
    while True:
        names = children(model, parent)
        if not names:
            break
        level = evaluate(reference, target, model, inputs, names, rtol, mode, parent, example, say)
        if parent and not level.names:  # nn.MultiheadAttention: its out_proj's weight used, the module never called
            loc.uncalled = parent
            break
        loc.levels.append((parent, level))
        ranked = rank(level, threshold)
        skipped = [e.name for e in level.local.values() if e.error]
        loc.skipped += skipped
        if level.local:
            say(f"{parent or 'top level'}: its own code")
        own = own_code_error(reference, target, model, inputs, parent, names, rtol, example) if level.local else None
        if own is not None and not own.error:
            level.own_code = own
            # a non-finite own error (a float16 Q·K^T that overflows) ranks first, beside a non-finite submodule too
            if not within(own, threshold) and (not ranked or size(own) > size(ranked[0]) or math.isinf(size(own))):
                loc.culprit, loc.in_own_code = parent or MODEL, True
                loc.suspects = [own] + ranked[:2]
                break
        if not ranked:
            if loc.culprit is None:  # the top level: no layer exceeds the threshold alone
                loc.whole_graph = bool(level.local) and not skipped
                _follow_propagated(loc, reference, target, model, inputs, rtol, threshold, example, say)
            else:
                loc.as_a_whole = bool(level.local) and not skipped
            break
        best = ranked[0]
        loc.culprit, parent = best.name, best.name
        loc.suspects = ranked[:3]
        basis = "own" if level.local else "propagated"
        first = first_divergent(level, threshold, basis)
        # in execution order over every layer measured: a deeper level refines the first layer only inside it
        if first and (loc.first_divergent is None or first.startswith(loc.first_divergent + ".")):
            loc.first_divergent, loc.first_divergent_by = first, basis
        several = several or len(ranked) > 1
        if level.local and spread(level, threshold):  # no layer of this level stands out: none to follow down
            break
    if several and loc.suspects and mode != "propagated":
        _every_leaf(loc, reference, target, model, inputs, rtol, threshold, example, say)
    if loc.culprit not in (None, MODEL) and loc.suspects and mode != "propagated" and not loc.evenly_spread():
        _repeated(loc, reference, target, model, inputs, rtol, threshold, example, say)
    return loc


def _every_leaf(loc: Localization, reference, target, model, inputs, rtol, threshold, example, say) -> None:
    """More than one layer exceeded the threshold on the way down: whether the error is one layer's or everywhere
    alike is judged over every leaf's own error, as `granularity: leaf` ranks them (a block's error is diluted by
    its residual, a leaf's is not), so that both granularities name the same culprit: the largest leaf, unless
    the descent's own code or block as a whole is larger; and spread when the leaves are."""
    names = layer_names(model, "leaf")
    level = LevelResult(names=[])
    for i in range(0, len(names), FLAT_CHUNK):
        part = evaluate(reference, target, model, inputs, names[i:i + FLAT_CHUNK], rtol, "local", LEAVES, example, say)
        level.names += part.names
        level.shared += part.shared
        level.local.update(part.local)
    ranked = rank(level, threshold)
    if not ranked or ((loc.in_own_code or loc.as_a_whole) and size(loc.suspects[0]) >= size(ranked[0])):
        return
    loc.levels.append((LEAVES, level))
    loc.culprit, loc.in_own_code, loc.as_a_whole = ranked[0].name, False, False
    loc.suspects = ranked[:3]
    first = first_divergent(level, threshold, "own")
    if first and (loc.first_divergent is None or first.startswith(loc.first_divergent + ".")
                  or not spread(level, threshold)):
        loc.first_divergent, loc.first_divergent_by = first, "own"


def _repeated(loc: Localization, reference, target, model, inputs, rtol, threshold, example, say) -> None:
    """The culprit lies in one block of a stack (`layers.1.self_attn`): the same submodule in the other blocks, each
    measured alone as the culprit was (its own code, when the culprit is in its own code), so that a fault repeated in
    every block is said as one (`layers.*.self_attn`), and the first layer in execution order is the first block's."""
    pattern = repeated(loc.culprit, model)
    if pattern is None or pattern.endswith("*"):  # the culprit is a block itself: its siblings were ranked beside it
        return
    head, _, tail = pattern.partition(".*")
    stack = model.get_submodule(head)
    names = [f"{head}.{i}{tail}" for i in range(len(stack))]
    measured = names[:REPEATS_MEASURED]
    if loc.culprit not in measured:
        measured[-1] = loc.culprit
    say(f"{pattern}: the same submodule in {len(measured)} blocks")
    errors: dict[str, LayerError] = {}
    if loc.in_own_code:
        for name in measured:
            members = children(model, name)
            own = own_code_error(reference, target, model, inputs, name, members, rtol, example) if members else None
            if own is not None:
                errors[name] = own
    else:
        seen = {n: e for _, level in loc.levels for n, e in level.local.items()}
        errors = {n: seen[n] for n in measured if n in seen}
        if len(errors) < len(measured):
            errors = evaluate(reference, target, model, inputs, measured, rtol, "local", example=example, say=say).local
    level = LevelResult(names=[n for n in measured if n in errors], local={n: errors[n] for n in measured if n in errors})
    over = [n for n in level.names if not level.local[n].error and not within(level.local[n], threshold)]
    if len(over) < 2:
        return
    loc.levels.append((pattern, level))
    loc.repeated = Repeated(pattern=pattern, measured=level.names, over=over, blocks=len(names))
    if loc.first_divergent is None or over[0].startswith(loc.first_divergent + ".") or over[0] == loc.first_divergent:
        loc.first_divergent, loc.first_divergent_by = over[0], "own"


def _follow_propagated(loc: Localization, reference, target, model, inputs, rtol, threshold, example, say) -> None:
    """No own error names a layer: from the top level down, the first layer in call order whose
    propagated error (its output inside the target's own end-to-end run) exceeds the threshold."""
    level = loc.levels[0][1]
    while (first := first_divergent(level, threshold, "propagated")) is not None:
        loc.first_divergent, loc.first_divergent_by = first, "propagated"
        names = children(model, first)
        if not names:
            break
        level = evaluate(reference, target, model, inputs, names, rtol, "propagated", first, example, say)
        loc.levels.append((first, level))


def localize_decode_step(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, prompt: torch.Tensor,
                         token: torch.Tensor, rtol: float, threshold: float, example: Inputs,
                         on_step: Callable[[str], None] | None = None) -> Localization:
    """Where `target`'s decode step departs from the reference's: each side prefilled with the same `prompt` through
    its own KV cache, then fed `token`, every module a descent can reach observed in that step (one decode per side:
    a step's activations are one token's). From the top level down, the first module in call order whose output
    departs beyond `threshold` is followed down while its arguments agree on both sides. When its arguments differ,
    they were computed by its parent's own code from arguments that agree, so the parent is named in its own code; at
    the top level, where the model's own arguments (what the decode loop hands it) may differ, the module is named
    with the arguments the departure reaches it through. A module that departs while none of its submodules does is
    named in its own code. Own (local) errors are not measured: a layer alone would need the cache it reads as it
    stood."""
    start = time.perf_counter()
    say = on_step or (lambda text: None)
    names = descendants(model, "")
    say("the reference's decode step")
    ref = capture_decode_step(reference, model, prompt, token, names, example)
    say("the target's decode step")
    tgt = capture_decode_step(target, model, prompt, token, names, example)
    loc = Localization(target.id, "decode step", threshold, mode_used="propagated")
    given = differing(ref.model_arguments, tgt.model_arguments, rtol, threshold)
    entered: list[str] | None = None
    parent = ""
    while level_names := [n for n in ref.calls if n in set(children(model, parent))]:  # in call order
        level = LevelResult(names=level_names, shared=[n for n in level_names if len(ref.calls[n]) > 1],
                            propagated=step_errors(ref.calls, tgt.calls, level_names, rtol))
        loc.levels.append((parent, level))
        first = first_divergent(level, threshold, "propagated")
        if first is None:  # the parent departs, none of its submodules does: its own code (none at the top level)
            loc.in_own_code = bool(parent)
            break
        loc.first_divergent, loc.first_divergent_by = first, "propagated"
        module = model.get_submodule(first)
        entered = differing(arguments(module, ref.calls[first][0].inputs), arguments(module, tgt.calls[first][0].inputs),
                            rtol, threshold)
        if entered:
            if parent or not given:  # computed by code whose own arguments agree: that code is the culprit
                loc.culprit, loc.in_own_code = parent or MODEL, True
                loc.suspects = [level.propagated[first]]
            else:  # the model was handed other arguments: the first module they reach is named
                loc.culprit, loc.suspects = first, [level.propagated[first]]
            break
        loc.culprit, loc.suspects = first, [level.propagated[first]]
        parent = first
    loc.decode_step = DecodeStepCompared(prompt_tokens=int(prompt.shape[1]), step=1, sequences=int(prompt.shape[0]),
                                         entered_through=entered or None, model_arguments=given)
    loc.elapsed_s = time.perf_counter() - start
    return loc


def _failed(job, target: BackendSpec, why: str) -> Layers:
    """The `layers` record of a check whose localization failed: why."""
    return Layers.made({"kind": "layers", "tier": 2, "model": job.model.name, "inputs": job.inputs.name,
                        "reference": job.reference.id, "target": target.id, "error": why})


def _found(loc: Localization, job, model: torch.nn.Module) -> Layers:
    return loc.record(job.model.name, job.inputs.name, job.reference.id, module_code(model, loc.culprit))


def localize_decode_check(job, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, experiment,
                          cached: CachedDecodingCheck, example: Inputs | None = None,
                          on_step: Callable[[str], None] | None = None) -> Layers:
    """The `layers` record of a check whose cached decoding fails on the target (`cached`, the verdict `gate_check`
    found): compared on the first decode step of that decoding, after the same prompt."""
    settings = experiment.tiers.activations
    tol = experiment.tolerance_for(target)
    threshold = settings.threshold if settings.threshold is not None else tol.gate
    found = cached_prompt(inputs, cached.steps)
    if isinstance(found, str):
        return _failed(job, target, found)
    prompt, forced = found
    try:
        loc = localize_decode_step(job.reference, target, model, prompt, forced[:, 0], tol.rtol, threshold,
                                   example if example is not None else inputs, on_step)
    except ParityError:
        raise
    except Exception as exc:  # localization is evidence; a failure to gather it says why
        return _failed(job, target, f"{type(exc).__name__}: {exc}"[:500])
    loc.decode_step = loc.decode_step.model_copy(update={"cached": DecodeCached(
        passed=cached.passed, steps=cached.steps, detail=cached.detail)})
    return _found(loc, job, model)


def localize_check(job, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, experiment,
                   example: Inputs | None = None, notes: list[dict[str, Any]] = (),
                   bisect: bool = True, on_step: Callable[[str], None] | None = None) -> Layers:
    """The `layers` record of one failing check; end to end, each side is prepared from `example`
    (the job's example inputs; None: `inputs`), as the run prepared it. `notes`: what the target warned of in the
    run (execute/notes.py); a `trace_specialized` note names the warned line and its module. `bisect`: look for the
    compiler pass when no layer makes an error of its own (a fallback search, which wants only the layers, does not).
    `on_step`: hears what is being done, for progress."""
    settings = experiment.tiers.activations
    tol = experiment.tolerance_for(target)
    threshold = settings.threshold if settings.threshold is not None else tol.gate
    try:
        loc = localize(job.reference, target, model, inputs, tol.rtol, threshold,
                       settings.granularity, settings.mode, example, on_step)
    except ParityError:
        raise
    except Exception as exc:  # localization is evidence; a failure to gather it must not end the run
        return _failed(job, target, f"{type(exc).__name__}: {exc}"[:500])
    loc.specialized = None if loc.identical else specialized_at(model, notes)
    if loc.specialized and not loc.suspects:
        loc.culprit, loc.whole_graph = loc.specialized.module, False
    if bisect and not loc.suspects and not loc.specialized and not loc.identical and any(e.error is None for _, lv in loc.levels for e in lv.local.values()):
        if on_step is not None:
            on_step("torch's compiler bisector")
        loc.compiler_pass = compiler_pass_of(job, target, model, inputs, experiment, example)
    return _found(loc, job, model)


def compiler_pass_of(job, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, experiment,
                     example: Inputs | None) -> CompilerPass | None:
    """The compiler pass that makes the check fail at the gate (`BisectsCompiler.compiler_pass`), for a target whose backend
    bisects its passes and whose check fails as it runs; None otherwise. The predicate runs the target as the run did
    (prepared from `example`) and judges it against the reference at the check's gate."""
    cls = backend_class(target.backend)
    if not issubclass(cls, BisectsCompiler):
        return None
    tol = experiment.tolerance_for(target)
    reference = execute(job.reference, model, inputs, 1, example=example)
    if not reference.ok:
        return None

    def passes() -> bool:
        return judge(reference, execute(target, model, inputs, 1, example=example), tol).passed is True

    if passes():  # nothing to bisect
        return None
    try:
        found = cls.compiler_pass(target, passes, COMPILER_PASS_BUDGET_S)
    except Exception as exc:  # evidence, not the run: say why there is none
        return CompilerPass(found=False, why=f"the bisection failed: {exception_words(exc)}")
    return None if found is None else CompilerPass.model_validate(found)  # the backend's mapping, read once


class GateCheck(NamedTuple):
    """What `gate_check` found: the tier-1 verdict at the gate, the target's notes, and for a text-generation model
    the cached decoding's verdict (`judge_cached`'s `cached`; None when it was not compared)."""

    verdict: GateVerdict
    notes: list[dict[str, Any]]
    cached: CachedDecodingCheck | None


def gate_check(job, target: BackendSpec, model_for: Callable[[BackendSpec], torch.nn.Module], inputs: Inputs,
               experiment, example: Inputs | None = None) -> GateCheck:
    """The tier-1 verdict of `target` at the gate (one run of each side, as `parity run` judges it with one
    repeat, no oracle), so that `parity localize` says first whether the check it explains passes; and what the
    target warned of in that run (its notes: a specialised trace), which the localization explains with. For a
    text-generation model, each side also decodes through its cache after its run (tier 3's `decode_cached`), judged
    as tier 3 judges it, so that a check whose cached decoding fails is localized on the decode step.
    `model_for(spec)`: the model as `spec` runs it (the runner's, with that target's fallback modules); each
    side prepared from `example` (None: `inputs`), as the run prepared it."""
    ask = thresholds = None
    if job.model.task == TEXT_GENERATION.name:
        tasks = experiment.tiers.tasks or tasks_spec()
        thresholds = tasks.thresholds_for(TEXT_GENERATION.name)
        ask = partial(decode_cached, steps=thresholds.new_tokens, leaf=tasks.output) if thresholds.new_tokens else None
    with follow_up.asking(ask):
        reference = execute(job.reference, model_for(job.reference), inputs, 1, example=example)
        if not reference.ok:  # nothing to localize against, as find_fallback says too
            raise ParityError(f"the reference {job.reference.id} failed: {reference.error}")
        release_memory()  # what the reference's run freed: the target's session starts from what is in use
        ran = execute(target, model_for(target), inputs, 1, example=example)
    release_memory()  # the target's closed session: the localization's own sessions start from what is in use
    verdict = judge(reference, ran, experiment.tolerance_for(target))
    cached = None
    if ask is not None and reference.follow_up and ran.follow_up:
        cached = judge_cached(TaskResult(TEXT_GENERATION.name), unraised(reference.follow_up), unraised(ran.follow_up),
                              thresholds, experiment.tolerance_for(target))[1]
    gate = GateVerdict(passed=verdict.passed, failure_class=verdict.failure_class, detail=verdict.detail,
                       required_atol=verdict.required_atol, gate=verdict.gate, rtol=verdict.rtol)
    return GateCheck(gate, ran.notes, cached)
