"""What tier 2's per-layer errors say: a localization's finding (`Localization`: the culprit, the first layer that
diverges and by which error, whole graph, as a whole, spread, repeated, identical) and its verdict in words; how layers
are ranked (`rank`, `size`, `within`) and walked (`children`, `descendants`, `repeated`, `layer_names`); which
failures a layer's numbers can explain (`LOCALIZABLE`). Nothing here runs a backend: the runs that measure the errors
(the descent, the gate check, the decode step, the compiler-pass bisection) are runner/localization.py's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parity import taxonomy as tx
from parity.errors import ParityError, did_you_mean
from parity.records.models import (
    CachedDecodingCheck,
    CompilerPass,
    DecodeStepCompared,
    Layer,
    LayerError,
    Layers,
    Level,
    Note,
    Repeated,
    Specialized,
)
from parity.verify.activations import LevelResult

MODEL = "(model)"  # the culprit when the model's own top-level code is at fault
LEAVES = "(every leaf)"  # the parent named for the level of every leaf, when the descent met several suspects
# Tier-1 failures that a layer's numbers can explain: a run localizes them (tiers.activations) and the reports
# offer `parity localize` for them; the one set of both.
LOCALIZABLE = (tx.NUMERIC_DRIFT, tx.NONFINITE, tx.ORDERING)
SPREAD_RATIO = 3.0  # the worst layer within this factor of the median: the error has no single source


def localizes_decode_step(forward_passed: bool | None, cached: CachedDecodingCheck | None) -> bool:
    """Is a check explained on a decode step? When its forward passes at the gate (tier 1's own verdict) and its cached
    decoding (tier 3's `cached`) fails on the target's side: what differs is the decode path, which the forward does not
    run. The reference's own cached decoding failing is no target's to localize. A run and `parity localize` both ask
    it here."""
    return forward_passed is True and cached is not None and cached.passed is False and cached.side == "target"


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
    specialized: Specialized | None = None
    # No layer makes an error of its own on a compiler target: the compiler subsystem and pass that introduces the
    # drift (BisectsCompiler.compiler_pass: torch's CompilerBisector for compile), or why none was named.
    compiler_pass: CompilerPass | None = None
    # The culprit lies in a stack of repeated blocks: the same submodule in every block, measured alike.
    repeated: Repeated | None = None
    # Every layer's output inside the target's run, and each alone, equals the reference's (NaN where it has NaN):
    # there is no drift between them to localize, whatever the check failed on (a NaN both sides return).
    identical: bool = False
    # The culprit calls none of its submodules as modules (nn.MultiheadAttention computes with its out_proj's weight
    # in one function): it is a leaf here, with no layers to rank.
    uncalled: str | None = None
    # Compared on a decode step (`localize_decode_step`): the step, the culprit's arguments that already differ
    # (`entered_through`) and those of the model's own call in that step (`model_arguments`: its position ids).
    decode_step: DecodeStepCompared | None = None

    def verdict(self) -> str:
        if self.decode_step is not None:
            return self._decode_verdict()
        text = self._modules_verdict()
        found = self.compiler_pass
        if found and found.found:
            text += f"; torch's compiler bisector names the pass that introduces it: {pass_path(found)}"
            if found.switch:
                text += f" (the setting {switch_words(found.switch)} removes the drift)"
        elif found:
            text += f"; torch's compiler bisector named no pass: {found.why}"
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
            more = f", {r.blocks - len(r.measured)} not measured" if r.blocks > len(r.measured) else ""
            text += (f"; the same submodule ({r.pattern}) exceeds the threshold in {len(r.over)} of the "
                     f"{len(r.measured)} blocks measured ({', '.join(r.over[:6])}{more})")
        if self.skipped:
            text += (f"; inconclusive for {', '.join(self.skipped[:5])}: the target could not run "
                     f"{'it' if len(self.skipped) == 1 else 'them'} alone")
        if self.specialized:
            s = self.specialized
            text += (f"; the target's trace also warned at {s.where} ({s.code or ''!r}), which is not offered "
                     "as the cause: no measurement ties that line to the diverging value")
        return text

    def _decode_verdict(self) -> str:
        """The finding of a decode step's comparison: the first module in call order whose output departs, and
        whether the departure reaches it through its arguments (from its caller) or is its own computation."""
        d = self.decode_step
        step = (f"on the decode step (one token fed after a {d.prompt_tokens}-token prompt, each side through its "
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
        entered = d.entered_through or []
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
        given = d.model_arguments or []
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
        where = f" in {s.module} ({s.module_code})" if s.module else " (in no module's class: a function it calls)"
        return (f"the target's trace is specialised: traced on the example, it took one branch of the data-dependent "
                f"condition at {s.where} ({s.code or ''!r}){where}, and runs that branch for every input; "
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

    def record(self, model: str, inputs: str, reference: str | None = None, culprit_code: str | None = None) -> Layers:
        """The `layers` record of this finding for the check of `model` on `inputs` against `reference`, its fields in
        the order parity has always written them (a layer's error dumps every field: `new_layer_error` gives them all)."""
        levels = []
        for parent, level in self.levels:
            ordered = [level.propagated[n] for n in level.names if n in level.propagated]
            rates = dict(zip([e.name for e in ordered], introduction_rates(ordered), strict=True))
            levels.append(Level(parent=parent, own_code=level.own_code, layers=[
                Layer(name=name, depth=name.count(".") + 1, call_order=order, local=level.local.get(name),
                      propagated=level.propagated.get(name), introduction_rate=rates.get(name))
                for order, name in enumerate(level.names)]))
        return Layers.made({
            "kind": "layers", "tier": 2, "model": model, "inputs": inputs, "reference": reference,
            "target": self.target, "mode": self.mode, "threshold": self.threshold, "culprit": self.culprit,
            "in_own_code": self.in_own_code, "whole_graph": self.whole_graph, "as_a_whole": self.as_a_whole,
            "evenly_spread": self.evenly_spread(), "first_divergent": self.first_divergent,
            "first_divergent_by": self.first_divergent_by,
            "suspects": list(self.suspects), "verdict": self.verdict(), "skipped": self.skipped,
            "levels": levels, "elapsed_s": self.elapsed_s, "specialized": self.specialized,
            "compiler_pass": self.compiler_pass, "repeated": self.repeated, "identical": self.identical,
            "uncalled": self.uncalled, **({"decode_step": self.decode_step} if self.decode_step is not None else {}),
            "culprit_code": culprit_code, "error": None,
        })


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


def first_divergent(level: LevelResult, threshold: float, basis: str) -> str | None:
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


def rank(level: LevelResult, threshold: float) -> list[LayerError]:
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


def flat_finding(target: str, level: LevelResult, threshold: float, mode: str) -> Localization:
    """What a flat comparison (one level: every leaf, a depth, or named modules) finds: the largest own error above the
    threshold is the culprit (in propagated mode alone, the largest growth); none while every layer was compared alone:
    the whole graph; and the first layer in call order above it, by the error that ranked them."""
    loc = Localization(target, "flat", threshold, [("", level)], mode_used=mode)
    loc.skipped = [e.name for e in level.local.values() if e.error]
    ranked = rank(level, threshold)
    loc.suspects = ranked[:3]
    loc.culprit = ranked[0].name if ranked else None
    loc.whole_graph = not ranked and bool(level.local) and not loc.skipped
    basis = "own" if ranked and level.local else "propagated"
    loc.first_divergent = first_divergent(level, threshold, basis)
    loc.first_divergent_by = basis if loc.first_divergent else None
    return loc


def settled_identical(loc: Localization) -> Localization:
    """`loc`, marked `identical` (no culprit, no first divergent layer, not the whole graph) when every layer compared,
    alone and inside the target's end-to-end run, gives exactly the reference's output (NaN where the reference has
    NaN): nothing differs between the sides."""
    errors = [e for _, level in loc.levels for e in (*level.local.values(), *level.propagated.values())]
    own = [level.own_code for _, level in loc.levels if level.own_code is not None]
    if (any(level.propagated for _, level in loc.levels)
            and all(not e.error and e.max_abs == 0 and e.required_atol == 0 for e in [*errors, *own])):
        loc.identical, loc.whole_graph, loc.culprit, loc.first_divergent, loc.first_divergent_by = True, False, None, None, None
    return loc


def pass_path(found: CompilerPass) -> str:
    """`inductor / emulate_precision_casts`, or `inductor / lowerings / application 3 (aten.add)`."""
    path = f"{found.backend} / {found.subsystem}" if found.subsystem else found.backend
    if found.subsystem and not found.switch and found.application:
        path += f" / application {found.application}" + (f" ({found.debug_info})" if found.debug_info else "")
    return path


def switch_words(switch: dict[str, Any]) -> str:
    """A setting as the experiment file writes it: `emulate_precision_casts: true`."""
    return ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in switch.items())


def specialized_at(model: torch.nn.Module, notes) -> Specialized | None:
    """The first `trace_specialized` note's line (`where`, `code`) and the innermost module whose class's source
    holds it (`module`, `module_code`; none when the line is in a function outside every module's class)."""
    import inspect

    note = next((n for n in map(Note.model_validate, notes) if n.kind == "trace_specialized" and n.where), None)
    if note is None:
        return None
    file, _, line = note.where.rpartition(":")
    found = {"where": note.where, **({"code": note.code} if note.code else {})}
    if not line.isdigit():
        return Specialized(**found)
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
    return Specialized(**found)


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
