"""Where does a target start to differ? Ranks layers by their own (local) error, top-level blocks first,
then inside the worst block, down to a leaf, so a deep model needs a few small runs per level rather
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
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch

from parity import taxonomy as tx
from parity.backends.base import BisectsCompiler, release_memory
from parity.config.schema import BackendSpec, tasks_spec
from parity.errors import ParityError, did_you_mean, exception_words
from parity.inputs import Inputs
from parity.records.models import CompilerPass, LayerError
from parity.verify.activations import (
    LevelResult,
    arguments,
    calibration_inputs,
    capture,
    capture_decode_step,
    differing,
    local_errors,
    looking_inside,
    observe_at_once,
    observes_layers,
    own_code_error,
    propagated_errors,
    step_errors,
)
from parity.verify.judge import judge
from parity.verify.tasks import TaskResult
from parity.verify.tasks.text_generation import TASK as TEXT_GENERATION
from parity.verify.tasks.text_generation import cached_prompt, decode_cached, judge_cached

log = logging.getLogger(__name__)

FLAT_CHUNK = 24  # layers per end-to-end run in a flat (leaf, depth:N, list) comparison; 96 in propagated mode
MODEL = "(model)"  # the culprit when the model's own top-level code is at fault
LEAVES = "(every leaf)"  # the parent named for the level of every leaf, when the descent met several suspects
REPEATS_MEASURED = 8  # the most instances of a repeated submodule measured beside the culprit
# Tier-1 failures that a layer's numbers can explain: a run localizes them (tiers.activations) and the reports
# offer `parity localize` for them; the one set of both.
LOCALIZABLE = (tx.NUMERIC_DRIFT, tx.NONFINITE, tx.ORDERING)
SPREAD_RATIO = 3.0  # the worst layer within this factor of the median: the error has no single source
COMPILER_PASS_BUDGET_S = 300.0  # a compiler-pass bisection compiles the model once per step: bounded


def children(model: torch.nn.Module, parent: str) -> list[str]:
    """The submodules one level down, looked through where a level would say nothing of its own: containers that
    are never called themselves (ModuleList, ModuleDict) to their members, a parent's only child (a wrapper) to its
    children, and a child that holds the repeated blocks (a ModuleList of two or more: Hugging Face's `model` inside
    a `*ForCausalLM`, beside `lm_head`) to its children, so that the blocks are ranked beside each other."""
    module = model.get_submodule(parent) if parent else model
    named = list(module.named_children())
    out = []
    for n, child in named:
        name = f"{parent}.{n}" if parent else n
        grand = list(child.children())
        if isinstance(child, torch.nn.ModuleList | torch.nn.ModuleDict) or (len(named) == 1 and grand) \
                or _holds_blocks(child):
            out += children(model, name)
        else:
            out.append(name)
    return out


def _holds_blocks(module: torch.nn.Module) -> bool:
    """Does `module` hold a stack of repeated blocks (a ModuleList of two or more modules of one class)?"""
    return any(isinstance(c, torch.nn.ModuleList) and len(c) > 1 and len({type(m) for m in c}) == 1
               for c in module.children())


def repeated(name: str, model: torch.nn.Module) -> str | None:
    """`layers.*.self_attn` for `layers.3.self_attn`: the path with its block index starred, when a ModuleList of
    two or more blocks of one class holds it; None when it lies in no such stack."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        holder = ".".join(parts[:i])
        if parts[i].isdigit():
            stack = model.get_submodule(holder)
            if isinstance(stack, torch.nn.ModuleList) and len(stack) > 1 and len({type(m) for m in stack}) == 1:
                return ".".join([*parts[:i], "*", *parts[i + 1:]])
    return None


def descendants(model: torch.nn.Module, parent: str) -> list[str]:
    """Every layer a descent from `parent` can reach: its `children`, theirs, and so on, depth first."""
    return [n for child in children(model, parent) for n in (child, *descendants(model, child))]


def layer_names(model: torch.nn.Module, granularity: str | list[str]) -> list[str]:
    """The layers of a flat (one-level) comparison: `leaf`, `depth:N`, or explicit module names."""
    named = [n for n, _ in model.named_modules(remove_duplicate=False) if n]
    if isinstance(granularity, list):
        unknown = [n for n in granularity if n not in named]
        if unknown:
            raise ParityError(f"the model has no module '{unknown[0]}'{did_you_mean(unknown[0], named)}")
        return list(granularity)
    if granularity == "leaf":
        return [n for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    depth = int(granularity.split(":", 1)[1])
    deepest = max((n.count(".") + 1 for n in named), default=0)
    if depth > deepest:
        raise ParityError(f"granularity depth:{depth}: the model's modules go {deepest} level(s) deep")
    return [n for n in named if n.count(".") + 1 == depth]


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


def introduction_rates(errors: list[LayerError]) -> list[float | None]:
    """CRADLE's R = (e_l - max e_prev) / (max e_prev + eps), e = relative RMSE, in call order."""
    rates: list[float | None] = []
    prev = 0.0
    for i, e in enumerate(errors):
        if e.error or not math.isfinite(e.rel_rmse):
            rates.append(None)
            continue
        rates.append(None if i == 0 else (e.rel_rmse - prev) / (prev + 1e-12))
        prev = max(prev, e.rel_rmse)
    return rates


def size(e: LayerError) -> float:
    """How large a layer's error is, for ranking: its relative RMSE, and infinity for an error that is not a finite
    number (Inf or NaN introduced: no atol passes it), which ranks above every finite error."""
    return e.rel_rmse if e.required_atol is not None and math.isfinite(e.rel_rmse) else math.inf


def within(e: LayerError, threshold: float) -> bool:
    """At the noise: compared, and its required atol at or below the threshold (exactly 0 included)."""
    return not e.error and e.required_atol is not None and e.required_atol <= threshold


def against_threshold(required_atol: float | None, threshold: float, rel_rmse: float, max_abs: float) -> str:
    """A layer's error against the threshold in the number that decides it (`within`: its required atol, or
    NaN/Inf that no atol passes), then its relative RMSE and max abs, which do not decide."""
    if required_atol is None:
        return f"NaN/Inf where the reference has numbers: no atol passes, above the threshold {threshold:g}"
    op = ">" if required_atol > threshold else "<="
    return f"required atol {required_atol:.2e} {op} threshold {threshold:g}, relative RMSE {rel_rmse:.2e}, max abs {max_abs:.2e}"


@dataclass
class Localization:
    target: str
    mode: str  # hierarchical | flat
    threshold: float
    levels: list[tuple[str, LevelResult]] = field(default_factory=list)
    culprit: str | None = None  # a layer (or own code) whose error exceeds the threshold, or a specialised trace's
    in_own_code: bool = False
    whole_graph: bool = False  # no layer (nor the model's own code) exceeds the threshold alone
    as_a_whole: bool = False  # the culprit exceeds it, but none of its submodules alone (nor its own code) does
    skipped: list[str] = field(default_factory=list)  # layers the target could not run alone
    first_divergent: str | None = None
    first_divergent_by: str | None = None  # the error that names it: "own" (local) or "propagated"
    suspects: list[LayerError] = field(default_factory=list)  # errors above the threshold, worst first
    elapsed_s: float = 0.0
    mode_used: str = "both"
    # The run's trace took one branch of a data-dependent condition (a `trace_specialized` note): the warned line
    # and the module whose code holds it (`specialized_at`), which names the culprit when no own error does.
    specialized: dict[str, Any] | None = None
    # No layer makes an error of its own on a compiler target: the compiler subsystem and pass that introduces the
    # drift (BisectsCompiler.compiler_pass: torch's CompilerBisector for compile), or why none was named.
    compiler_pass: dict[str, Any] | None = None
    # The culprit lies in a stack of repeated blocks: the same submodule in every block, measured alike (`pattern`:
    # `layers.*.self_attn`, `measured`: the instances measured, `over`: those above the threshold, `blocks`: how many).
    repeated: dict[str, Any] | None = None
    # Every layer's output inside the target's run, and each alone, equals the reference's (NaN where it has NaN):
    # there is no drift between them to localize, whatever the check failed on (a NaN both sides return).
    identical: bool = False
    # The culprit calls none of its submodules as modules (nn.MultiheadAttention computes with its out_proj's weight
    # in one function): it is a leaf here, with no layers to rank.
    uncalled: str | None = None
    # Compared on a decode step (`localize_decode_step`): `prompt_tokens`, `step`, `sequences`; `entered_through`, the
    # culprit's arguments that already differ (the departure reaches it from its caller); `model_arguments`, those of
    # the model's own call in that step that differ (what the decode loop hands the model: its position ids).
    decode_step: dict[str, Any] | None = None

    def verdict(self) -> str:
        if self.decode_step is not None:
            return self._decode_verdict()
        text = self._modules_verdict()
        found = self.compiler_pass
        if found and found.get("found"):
            text += ("; torch's compiler bisector names the pass that introduces it: "
                     f"{pass_path(CompilerPass.model_validate(found))}")
            if found.get("switch"):
                text += f" (the setting {switch_words(found['switch'])} removes the drift)"
        elif found:
            text += f"; torch's compiler bisector named no pass: {found['why']}"
        return text

    def _modules_verdict(self) -> str:
        if not any(not e.error for _, level in self.levels for e in [*level.local.values(), *level.propagated.values()]):
            why = f"; inconclusive: the target could not run {', '.join(self.skipped[:5])} alone" if self.skipped else ""
            return "no layer could be compared on the target" + why
        if self.identical:
            return ("the target equals the reference at every layer compared, alone and inside its end-to-end run "
                    "(NaN/Inf where the reference has them): there is no drift between them to localize; a check that "
                    "fails on NaN/Inf both sides return fails on the reference's own values")
        if self.specialized and not self.suspects:
            return self._specialized()
        if self.culprit is None:
            return self._nothing_exceeds()
        own = self.suspects[0]
        where = " (in its own code, between its submodules)" if self.in_own_code else ""
        name = "the model" if self.culprit == MODEL else self.culprit
        text = ""
        if self.evenly_spread():
            level = self._culprit_level()
            over = [e for e in level.local.values() if not e.error and not within(e, self.threshold)] if level else []
            text = (f"no single layer: {len(over)} layers exceed the threshold with own errors of the same order "
                    f"(relative RMSE within {SPREAD_RATIO:g}x of their median): the drift comes from the target as a "
                    "whole (its dtype, kernels or quantization), not from one layer; the largest: ")
        text += (f"{name}{where} introduces the largest relative error of its own (ranked by relative RMSE "
                 f"{own.rel_rmse:.2e}): " + against_threshold(own.required_atol, self.threshold, own.rel_rmse, own.max_abs))
        if self.mode_used == "propagated":
            text = text.replace("introduces the largest relative error of its own", "is where the error grows most (propagated mode)")
        if self.as_a_whole:
            own_code = next((lv.own_code for parent, lv in self.levels if parent == self.culprit), None)
            nor = ("nor its own code" if own_code is not None
                   else "its own code was not measured on this target")
            text += (f"; none of its submodules alone ({nor}) exceeds the threshold: the error comes from "
                     f"{self.culprit} as a whole (how the target transforms it, e.g. fusion across its submodules, or "
                     "small errors adding up)")
        if self.uncalled:
            text += (f"; {self.uncalled} calls none of its submodules as modules (it computes with their weights in "
                     "one function, as nn.MultiheadAttention does): it has no layers of its own to rank")
        if self.repeated:
            r = self.repeated
            more = f", {r['blocks'] - len(r['measured'])} not measured" if r["blocks"] > len(r["measured"]) else ""
            text += (f"; the same submodule ({r['pattern']}) exceeds the threshold in {len(r['over'])} of the "
                     f"{len(r['measured'])} blocks measured ({', '.join(r['over'][:6])}{more})")
        if self.skipped:
            text += (f"; inconclusive for {', '.join(self.skipped[:5])}: the target could not run "
                     f"{'it' if len(self.skipped) == 1 else 'them'} alone")
        if self.specialized:
            s = self.specialized
            text += (f"; the target's trace also warned at {s['where']} ({s.get('code', '')!r}), which is not offered "
                     "as the cause: no measurement ties that line to the diverging value")
        return text

    def _decode_verdict(self) -> str:
        """The finding of a decode step's comparison: the first module in call order whose output departs, and
        whether the departure reaches it through its arguments (from its caller) or is its own computation."""
        d = self.decode_step
        step = (f"on the decode step (one token fed after a {d['prompt_tokens']}-token prompt, each side through its "
                "own KV cache)")
        compared = [e for _, level in self.levels for e in level.propagated.values() if not e.error]
        if not compared:
            return f"{step}, no layer could be compared"
        if self.culprit is None:
            largest = max(compared, key=size)
            return (f"{step}, no module's output departs from the reference's beyond the threshold {self.threshold:g}: "
                    f"the largest is {largest.name}'s: "
                    + against_threshold(largest.required_atol, self.threshold, largest.rel_rmse, largest.max_abs))
        e = self.suspects[0]
        numbers = against_threshold(e.required_atol, self.threshold, e.rel_rmse, e.max_abs)
        entered = d.get("entered_through") or []
        args = f"{'arguments' if len(entered) > 1 else 'argument'} {', '.join(entered)}"
        name = "the model" if self.culprit == MODEL else self.culprit
        if self.in_own_code and entered:
            return (f"{step}, {name} is called with the same arguments on both sides, and the first of its submodules "
                    f"whose output departs, {self.first_divergent} ({numbers}), already receives a different {args}: "
                    f"the departure is in {name}'s own code before it (in an attention: the attention over the cache)")
        if self.in_own_code:
            return (f"{step}, {name}'s output departs with the same arguments on both sides while none of its "
                    f"submodules' outputs does: the departure is in its own code after them")
        text = (f"{step}, {self.culprit} is the first module whose output departs from the reference's ({numbers}; "
                "every module called before it agrees)")
        if entered:
            text += (f"; its {args} already differ{'' if len(entered) > 1 else 's'}: the difference reaches it from "
                     "the code that calls it, not from its own computation")
        else:
            text += ", with the same arguments on both sides: it computes differently itself"
        given = d.get("model_arguments") or []
        if given:
            text += (f"; the model itself is called with a different {', '.join(given)} on this step (what the decode "
                     "loop hands it)")
        return text

    def _culprit_level(self) -> LevelResult | None:
        """The level where the culprit was ranked: every leaf's, when one was measured, else the first whose layers
        include it (beside its siblings)."""
        holding = [(parent, level) for parent, level in self.levels if self.culprit in level.local]
        return next((level for parent, level in holding if parent == LEAVES), holding[0][1] if holding else None)

    def _specialized(self) -> str:
        """The verdict for a run whose trace was specialised and where no layer, traced alone on these inputs, makes
        an error of its own: the layers re-traced here take the branch these inputs take, the run's artifact took
        the example's, so what differs is the warned condition, not how the target transforms the graph."""
        s = self.specialized
        where = f" in {s['module']} ({s['module_code']})" if s.get("module") else " (in no module's class: a function it calls)"
        return (f"the target's trace is specialised: traced on the example, it took one branch of the data-dependent "
                f"condition at {s['where']} ({s.get('code', '')!r}){where}, and runs that branch for every input; "
                f"each layer traced alone on these inputs (taking their branch) gives the reference's output within the "
                f"threshold {self.threshold:g}: the drift is the branch baked into the run's trace, not how the target "
                "transforms the whole graph")

    def _nothing_exceeds(self) -> str:
        """The verdict when no layer's own error (or, in propagated mode alone, no layer's growth) exceeds
        the threshold: it names no culprit, says where the difference comes from instead and, when
        propagated errors exist, which layer they first exceed the threshold at."""
        first = self.levels[0][1]
        if not first.local:
            text = f"no layer's output inside the target's end-to-end run exceeds the threshold {self.threshold:g}"
            return text + (f"; it first exceeds it at {self.first_divergent}" if self.first_divergent else "")
        compared = [e for e in first.local.values() if not e.error]
        if not compared:
            return (f"no layer could be compared alone on the target; inconclusive: the target could not run "
                    f"{', '.join(self.skipped[:5])} alone") + self._propagated_instead()
        hierarchical = self.mode == "hierarchical"
        text = ("no layer" if hierarchical else f"none of the {len(compared)} compared layers") + \
            f" makes an error of its own above the threshold {self.threshold:g}"
        if hierarchical and first.own_code is not None:
            text += " (nor the model's own code)"
        largest = max(compared, key=size)
        if largest.rel_rmse == 0:
            each = "each that ran alone" if self.skipped else "each alone"
            text += f": {each} on the target, fed the reference's input, gives exactly the reference's output"
        else:
            text += (f": the largest relative RMSE is {largest.name}'s: "
                     + against_threshold(largest.required_atol, self.threshold, largest.rel_rmse, largest.max_abs))
        if self.whole_graph:
            drift = "the drift" if self.first_divergent_by == "propagated" else "any drift"  # seen, or not seen
            grows = "" if largest.rel_rmse == 0 else " or from small errors that grow downstream"
            text += (f"; {drift} comes from how the target transforms the whole graph (fusion, layout, quantization)"
                     + (f"{grows}, not from one layer" if hierarchical
                        else f"{grows} or from code outside these layers, not from one of them"))
        elif self.skipped:
            text += (f"; inconclusive for {', '.join(self.skipped[:5])}: the target could not run "
                     f"{'it' if len(self.skipped) == 1 else 'them'} alone, and the drift may come from there")
        return text + self._propagated_instead()

    def _propagated_instead(self) -> str:
        """What the propagated errors name when no own error does."""
        if self.first_divergent_by == "propagated" and self.first_divergent:
            e = next(level.propagated[self.first_divergent] for _, level in reversed(self.levels)
                     if self.first_divergent in level.propagated)
            return (f"; named instead: {self.first_divergent}, the first layer whose output inside the target's "
                    "end-to-end run (its propagated error) exceeds the threshold: "
                    + against_threshold(e.required_atol, self.threshold, e.rel_rmse, e.max_abs))
        if any(not e.error for _, level in self.levels for e in level.propagated.values()):
            return ("; no layer's output inside the target's end-to-end run exceeds the threshold either (observing "
                    "layer outputs can keep the target from fusing across them)")
        return ("; propagated errors were not measured (mode local, or a target that cannot show layer outputs from "
                "its own run), so no layer is named")

    def evenly_spread(self) -> bool:
        """True when no layer stands out where the culprit was ranked: `spread` holds for its level. Never without a
        suspect (a layer above the threshold): a culprit named otherwise (a specialised trace's module) is not one
        of many drifting alike; nor for own code, which is one place."""
        if not self.levels or self.culprit is None or not self.suspects or self.in_own_code:
            return False
        level = self._culprit_level()
        return level is not None and spread(level, self.threshold)

    def record(self) -> dict[str, Any]:
        levels = []
        for parent, level in self.levels:
            own = level.own_code.model_dump() if level.own_code else None
            ordered = [level.propagated[n] for n in level.names if n in level.propagated]
            rates = dict(zip([e.name for e in ordered], introduction_rates(ordered), strict=True))
            layers = []
            for order, name in enumerate(level.names):
                layers.append({
                    "name": name, "depth": name.count(".") + 1, "call_order": order,
                    "local": level.local[name].model_dump() if name in level.local else None,
                    "propagated": level.propagated[name].model_dump() if name in level.propagated else None,
                    "introduction_rate": rates.get(name),
                })
            levels.append({"parent": parent, "layers": layers, "own_code": own})
        return {
            "target": self.target, "mode": self.mode, "threshold": self.threshold, "culprit": self.culprit,
            "in_own_code": self.in_own_code, "whole_graph": self.whole_graph, "as_a_whole": self.as_a_whole,
            "evenly_spread": self.evenly_spread(), "first_divergent": self.first_divergent,
            "first_divergent_by": self.first_divergent_by,
            "suspects": [s.model_dump() for s in self.suspects], "verdict": self.verdict(), "skipped": self.skipped,
            "levels": levels, "elapsed_s": self.elapsed_s, "specialized": self.specialized,
            "compiler_pass": self.compiler_pass, "repeated": self.repeated, "identical": self.identical,
            "uncalled": self.uncalled, **({"decode_step": self.decode_step} if self.decode_step is not None else {}),
        }


def spread(level: LevelResult, threshold: float) -> bool:
    """No layer of `level` stands out: three or more exceed the threshold, and the largest of them is within
    SPREAD_RATIO of their median (all finite: an infinite error is of no finite one's order). Layers within the
    threshold (zeros, a clean embedding) take no part: a median over them and a few faulty blocks says nothing.
    Not when those above are one path repeated across a stack (`layers.0`, `layers.1`; `layers.0.mlp.down`,
    `layers.1.mlp.down`): a fault repeated in every block is one fault, said as such (`repeated`)."""
    above = [e for e in level.local.values() if not e.error and not within(e, threshold)]
    over = sorted(size(e) for e in above)
    if len(over) < 3 or not math.isfinite(over[-1]):
        return False
    paths = {re.sub(r"\.\d+(?=\.|$)", ".*", e.name) for e in above}
    if len(paths) == 1 and "*" in next(iter(paths)):
        return False
    return over[-1] <= SPREAD_RATIO * over[(len(over) - 1) // 2]


def _first_divergent(level: LevelResult, threshold: float, basis: str) -> str | None:
    """The first layer in call order whose error (`basis`: own or propagated) exceeds the threshold. A
    module called several times (a shared ReLU) has no single place in that order, so it is passed over."""
    errors = level.local if basis == "own" else level.propagated
    for name in level.names:
        if name in level.shared:
            continue
        e = errors.get(name)
        if e and not e.error and not within(e, threshold):
            return name
    return None


def _ranked(level: LevelResult, threshold: float) -> list[LayerError]:
    """The layers whose error exceeds the threshold, likeliest culprit first: by own (local) error; in
    propagated mode alone, by how much the error grows at each layer over the largest before it (an error
    carried on from an earlier layer does not make a layer a suspect)."""
    if level.local:
        over = (e for e in level.local.values() if not e.error and not within(e, threshold))
        return sorted(over, key=size, reverse=True)
    growth, largest = {}, 0.0
    for name in level.names:
        e = level.propagated.get(name)
        if e is None or e.error or name in level.shared:  # a shared module's worst call may come much later
            continue
        growth[name] = e.rel_rmse - largest
        largest = max(largest, e.rel_rmse)
    over = (level.propagated[n] for n in growth if not within(level.propagated[n], threshold))
    return sorted(over, key=lambda e: growth[e.name], reverse=True)


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
        loc = Localization(target.id, "flat", threshold, [("", level)], mode_used=mode)
        loc.skipped = [e.name for e in level.local.values() if e.error]
        ranked = _ranked(level, threshold)
        loc.suspects = ranked[:3]
        loc.culprit = ranked[0].name if ranked else None
        loc.whole_graph = not ranked and bool(level.local) and not loc.skipped
        basis = "own" if ranked and level.local else "propagated"
        loc.first_divergent = _first_divergent(level, threshold, basis)
        loc.first_divergent_by = basis if loc.first_divergent else None
    else:
        loc = _descend(reference, target, model, inputs, rtol, threshold, mode, example, say)
        loc.mode_used = mode
    if _identical(loc):
        loc.identical, loc.whole_graph, loc.culprit, loc.first_divergent, loc.first_divergent_by = True, False, None, None, None
    return loc


def _identical(loc: Localization) -> bool:
    """Every layer compared, alone and inside the target's end-to-end run, gives exactly the reference's output
    (NaN where the reference has NaN): nothing differs between the sides."""
    errors = [e for _, level in loc.levels for e in (*level.local.values(), *level.propagated.values())]
    own = [level.own_code for _, level in loc.levels if level.own_code is not None]
    return (any(level.propagated for _, level in loc.levels)
            and all(not e.error and e.max_abs == 0 and e.required_atol == 0 for e in [*errors, *own]))


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
        ranked = _ranked(level, threshold)
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
        first = _first_divergent(level, threshold, basis)
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
    ranked = _ranked(level, threshold)
    if not ranked or ((loc.in_own_code or loc.as_a_whole) and size(loc.suspects[0]) >= size(ranked[0])):
        return
    loc.levels.append((LEAVES, level))
    loc.culprit, loc.in_own_code, loc.as_a_whole = ranked[0].name, False, False
    loc.suspects = ranked[:3]
    first = _first_divergent(level, threshold, "own")
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
    loc.repeated = {"pattern": pattern, "measured": level.names, "over": over, "blocks": len(names)}
    if loc.first_divergent is None or over[0].startswith(loc.first_divergent + ".") or over[0] == loc.first_divergent:
        loc.first_divergent, loc.first_divergent_by = over[0], "own"


def _follow_propagated(loc: Localization, reference, target, model, inputs, rtol, threshold, example, say) -> None:
    """No own error names a layer: from the top level down, the first layer in call order whose
    propagated error (its output inside the target's own end-to-end run) exceeds the threshold."""
    level = loc.levels[0][1]
    while (first := _first_divergent(level, threshold, "propagated")) is not None:
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
    loc.decode_step = {"prompt_tokens": int(prompt.shape[1]), "step": 1, "sequences": int(prompt.shape[0]),
                       "entered_through": None, "model_arguments": given}
    parent = ""
    while level_names := [n for n in ref.calls if n in set(children(model, parent))]:  # in call order
        level = LevelResult(names=level_names, shared=[n for n in level_names if len(ref.calls[n]) > 1],
                            propagated=step_errors(ref.calls, tgt.calls, level_names, rtol))
        loc.levels.append((parent, level))
        first = _first_divergent(level, threshold, "propagated")
        if first is None:  # the parent departs, none of its submodules does: its own code (none at the top level)
            loc.in_own_code = bool(parent)
            break
        loc.first_divergent, loc.first_divergent_by = first, "propagated"
        module = model.get_submodule(first)
        entered = differing(arguments(module, ref.calls[first][0].inputs), arguments(module, tgt.calls[first][0].inputs),
                            rtol, threshold)
        if entered:
            loc.decode_step["entered_through"] = entered
            if parent or not given:  # computed by code whose own arguments agree: that code is the culprit
                loc.culprit, loc.in_own_code = parent or MODEL, True
                loc.suspects = [level.propagated[first]]
            else:  # the model was handed other arguments: the first module they reach is named
                loc.culprit, loc.suspects = first, [level.propagated[first]]
            break
        loc.culprit, loc.suspects = first, [level.propagated[first]]
        parent = first
    loc.elapsed_s = time.perf_counter() - start
    return loc


def localize_decode_check(job, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, experiment,
                          cached: dict[str, Any], example: Inputs | None = None,
                          on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The fields of a `layers` record for a check whose cached decoding fails on the target (`cached`, the verdict
    `gate_check` found): compared on the first decode step of that decoding, after the same prompt."""
    settings = experiment.tiers.activations
    tol = experiment.tolerance_for(target)
    threshold = settings.threshold if settings.threshold is not None else tol.gate
    base = {"tier": 2, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id}
    found = cached_prompt(inputs, cached["steps"])
    if isinstance(found, str):
        return {**base, "target": target.id, "error": found}
    prompt, forced = found
    try:
        loc = localize_decode_step(job.reference, target, model, prompt, forced[:, 0], tol.rtol, threshold,
                                   example if example is not None else inputs, on_step)
    except ParityError:
        raise
    except Exception as exc:  # localization is evidence; a failure to gather it says why
        return {**base, "target": target.id, "error": f"{type(exc).__name__}: {exc}"[:500]}
    loc.decode_step["cached"] = {k: cached.get(k) for k in ("passed", "steps", "detail")}
    return {**base, **loc.record(), "culprit_code": module_code(model, loc.culprit), "error": None}


def localize_check(job, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, experiment,
                   example: Inputs | None = None, notes: list[dict[str, Any]] = (),
                   bisect: bool = True, on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The fields of a `layers` record for one failing check; end to end, each side is prepared from `example`
    (the job's example inputs; None: `inputs`), as the run prepared it. `notes`: what the target warned of in the
    run (execute/notes.py); a `trace_specialized` note names the warned line and its module. `bisect`: look for the
    compiler pass when no layer makes an error of its own (a fallback search, which wants only the layers, does not).
    `on_step`: hears what is being done, for progress."""
    settings = experiment.tiers.activations
    tol = experiment.tolerance_for(target)
    threshold = settings.threshold if settings.threshold is not None else tol.gate
    base = {"tier": 2, "model": job.model.name, "inputs": job.inputs.name, "reference": job.reference.id}
    try:
        loc = localize(job.reference, target, model, inputs, tol.rtol, threshold,
                       settings.granularity, settings.mode, example, on_step)
    except ParityError:
        raise
    except Exception as exc:  # localization is evidence; a failure to gather it must not end the run
        return {**base, "target": target.id, "error": f"{type(exc).__name__}: {exc}"[:500]}
    loc.specialized = None if loc.identical else specialized_at(model, notes)
    if loc.specialized and not loc.suspects:
        loc.culprit, loc.whole_graph = loc.specialized.get("module"), False
    if bisect and not loc.suspects and not loc.specialized and not loc.identical and any(e.error is None for _, lv in loc.levels for e in lv.local.values()):
        if on_step is not None:
            on_step("torch's compiler bisector")
        loc.compiler_pass = compiler_pass_of(job, target, model, inputs, experiment, example)
    return {**base, **loc.record(), "culprit_code": module_code(model, loc.culprit), "error": None}


def pass_path(found: CompilerPass) -> str:
    """`inductor / emulate_precision_casts`, or `inductor / lowerings / application 3 (aten.add)`."""
    path = f"{found.backend} / {found.subsystem}" if found.subsystem else found.backend
    if found.subsystem and not found.switch and found.application:
        path += f" / application {found.application}" + (f" ({found.debug_info})" if found.debug_info else "")
    return path


def switch_words(switch: dict[str, Any]) -> str:
    """A setting as the experiment file writes it: `emulate_precision_casts: true`."""
    return ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in switch.items())


def compiler_pass_of(job, target: BackendSpec, model: torch.nn.Module, inputs: Inputs, experiment,
                     example: Inputs | None) -> dict[str, Any] | None:
    """The compiler pass that makes the check fail at the gate (`BisectsCompiler.compiler_pass`), for a target whose backend
    bisects its passes and whose check fails as it runs; None otherwise. The predicate runs the target as the run did
    (prepared from `example`) and judges it against the reference at the check's gate."""
    from parity.backends import backend_class
    from parity.execute.execution import execute

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
        return cls.compiler_pass(target, passes, COMPILER_PASS_BUDGET_S)
    except Exception as exc:  # evidence, not the run: say why there is none
        return {"found": False, "why": f"the bisection failed: {exception_words(exc)}"}


def specialized_at(model: torch.nn.Module, notes) -> dict[str, Any] | None:
    """The first `trace_specialized` note's line (`where`, `code`) and the innermost module whose class's source
    holds it (`module`, `module_code`; none when the line is in a function outside every module's class)."""
    import inspect

    note = next((n for n in notes if n.get("kind") == "trace_specialized" and n.get("where")), None)
    if note is None:
        return None
    file, _, line = note["where"].rpartition(":")
    found = {"where": note["where"], **({"code": note["code"]} if note.get("code") else {})}
    if not line.isdigit():
        return found
    holders = []
    for name, module in model.named_modules():
        try:
            lines, start = inspect.getsourcelines(type(module))
            source = inspect.getsourcefile(type(module))
        except (OSError, TypeError):
            continue
        if source and Path(source).resolve() == Path(file).resolve() and start <= int(line) < start + len(lines):
            holders.append(name or MODEL)
    if holders:
        module = max(holders, key=lambda n: (n != MODEL) + n.count("."))  # the innermost
        found.update(module=module, module_code=module_code(model, module))
    return found


def module_code(model: torch.nn.Module, name: str | None) -> str | None:
    """Where a culprit's code is: `Conv2d (torch/nn/modules/conv.py:448)`, so that a report can say what to
    read or to attach to a bug report; None when there is no culprit or its class has no source file."""
    import inspect

    if not name:
        return None
    try:
        cls = type(model if name == MODEL else model.get_submodule(name))
        return f"{cls.__qualname__} ({inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]})"
    except (AttributeError, OSError, TypeError):  # a class made at run time, or built in
        return None


class GateCheck(NamedTuple):
    """What `gate_check` found: the tier-1 verdict at the gate, the target's notes, and for a text-generation model
    the cached decoding's verdict (`judge_cached`'s `cached`; None when it was not compared)."""

    verdict: dict[str, Any]
    notes: list[dict[str, Any]]
    cached: dict[str, Any] | None


def gate_check(job, target: BackendSpec, model_for: Callable[[BackendSpec], torch.nn.Module], inputs: Inputs,
               experiment, example: Inputs | None = None) -> GateCheck:
    """The tier-1 verdict of `target` at the gate (one run of each side, as `parity run` judges it with one
    repeat, no oracle), so that `parity localize` says first whether the check it explains passes; and what the
    target warned of in that run (its notes: a specialised trace), which the localization explains with. For a
    text-generation model, each side also decodes through its cache after its run (tier 3's `decode_cached`), judged
    as tier 3 judges it, so that a check whose cached decoding fails is localized on the decode step.
    `model_for(spec)`: the model as `spec` runs it (the runner's, with that target's fallback modules); each
    side prepared from `example` (None: `inputs`), as the run prepared it."""
    from parity.execute import follow_up
    from parity.execute.execution import execute

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
        cached = judge_cached(TaskResult(TEXT_GENERATION.name), reference.follow_up, ran.follow_up,
                              thresholds).get("cached")
    return GateCheck({k: getattr(verdict, k) for k in ("passed", "failure_class", "detail", "required_atol", "gate", "rtol")},
                ran.notes, cached)

