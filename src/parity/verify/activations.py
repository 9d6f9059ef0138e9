"""Tier 2's comparisons of layers: a layer's output against the reference's (`layer_error`, `worst` of its calls), a
level's errors (`LevelResult`), the arguments of two calls (`arguments`, `differing`), a decode step's outputs
(`step_errors`); and the forward hooks that record a module's calls (`install_hooks`), which only record. What runs a
backend to read the layers (end to end, alone, as slices, the own code, the decode step) is runner/layer_runs.py's.

Layers are modules, named by their path in the model (`layer2.0.conv1`). A module called several times
in one forward (a shared ReLU) has one entry per call; its error is the largest over its calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from parity.inputs import Inputs
from parity.outputs import flatten, map_tensors
from parity.records.models import LayerError
from parity.verify.tensors import error_stats

EPS = 1e-12


@dataclass
class Call:
    """One call of a module in a forward pass: what went in and what came out (on the CPU)."""

    name: str
    index: int
    inputs: Inputs
    output: Any


def new_layer_error(name: str, **found: Any) -> LayerError:
    """A layer's error (the `layers` record's own part), every field given: nothing differs until `found` says
    otherwise. `rel_rmse` is rmse / rms(reference), comparable across layers of any scale; `required_atol` None:
    nothing passes (NaN introduced, shapes differ); `error`: the layer could not be run or compared on the target;
    `measured_by`: how a local error's layer alone ran on the target (slice, together, export and why), None for a
    propagated error. (The record's own defaults are a reader's, for older records.)"""
    return LayerError(**{"name": name, "max_abs": 0.0, "rmse": 0.0, "rel_rmse": 0.0, "cosine": 1.0, "sqnr_db": None,
                         "required_atol": 0.0, "error": None, "measured_by": None, **found})


@dataclass
class LevelResult:
    """Errors of a set of sibling (or chosen) layers, in call order."""

    names: list[str]
    local: dict[str, LayerError] = field(default_factory=dict)
    propagated: dict[str, LayerError] = field(default_factory=dict)
    own_code: LayerError | None = None  # the parent's own operations, its submodules replayed
    shared: list[str] = field(default_factory=list)  # modules called more than once in one forward


def on_cpu(obj: Any) -> Any:
    """The hooks cloned these values already: no second copy when they are on the CPU."""
    return map_tensors(obj, lambda t: t.detach().cpu())


def _floats(obj: Any) -> torch.Tensor:
    """Every tensor leaf of an output as one flat vector: a view of a single leaf (error_stats converts
    it a chunk at a time), one float64 vector of several."""
    leaves = [v.detach() for v in flatten(obj).values() if isinstance(v, torch.Tensor)]
    if not leaves:
        return torch.zeros(0, dtype=torch.float64)
    if len(leaves) == 1 and not leaves[0].is_complex():
        return leaves[0].reshape(-1)
    return torch.cat([leaf.to("cpu", torch.float64).flatten() for leaf in leaves])


def layer_error(name: str, reference: Any, target: Any, rtol: float) -> LayerError:
    ref_leaves, tgt_leaves = flatten(reference), flatten(target)
    shapes = lambda leaves: [tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for v in leaves.values()]  # noqa: E731
    if shapes(ref_leaves) != shapes(tgt_leaves):
        return new_layer_error(name, required_atol=None, error=f"outputs differ in structure or shape: {shapes(tgt_leaves)} vs {shapes(ref_leaves)}")
    r, t = _floats(reference), _floats(target)
    stats = error_stats(r, t, rtol, gate=math.inf, full=False)
    noise = stats.rmse ** 2 * max(r.numel(), 1)
    rms = math.sqrt(stats.reference_energy / max(r.numel(), 1))
    return new_layer_error(
        name,
        max_abs=stats.max_abs,
        rmse=stats.rmse,
        rel_rmse=stats.rmse / (rms + EPS) if stats.required_atol is not None else math.inf,
        cosine=stats.cosine,
        sqnr_db=10 * math.log10((stats.reference_energy + EPS) / noise) if noise > 0 else None,
        required_atol=stats.required_atol,
    )


def worst(errors: list[LayerError]) -> LayerError:
    """One entry for a layer called several times: its largest error."""
    failed = [e for e in errors if e.error]
    if failed:
        return failed[0]
    return max(errors, key=lambda e: (math.inf if e.required_atol is None else e.required_atol, e.rel_rmse))


def cloned(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.detach().clone())


def install_hooks(model: torch.nn.Module, names: list[str], sink: list, with_inputs: bool,
                   when: Callable[[], bool] = lambda: True) -> None:
    """Append (name, inputs, output) to `sink` on every call of the named modules (while `when()` holds: a decode
    capture keeps one step's). Values are cloned at once: an in-place op later in the forward (ReLU(inplace=True))
    would otherwise rewrite them. Plain list appends: torch.compile traces them as side effects and returns the
    values as graph outputs."""
    for name in names:
        module = model.get_submodule(name)  # a module registered under two names is listed under one only
        pending: list = []

        def pre_hook(mod, args, kwargs, _pending=pending):
            if when():
                _pending.append(cloned((args, kwargs)) if with_inputs else None)

        def hook(mod, args, kwargs, output, _name=name, _pending=pending):
            if when():
                sink.append((_name, _pending.pop(), cloned(output)))

        module.register_forward_pre_hook(pre_hook, with_kwargs=True)
        module.register_forward_hook(hook, with_kwargs=True)


def arguments(module: torch.nn.Module, inputs: Inputs) -> dict[str, Any]:
    """A call's arguments by the names of `module`'s forward; those that are neither tensors, None, nor lists of
    tensors (a key-value cache: the state a decode step reads and writes, mutated after the call) left out."""
    import inspect

    bound: dict[str, Any] = {**{f"args[{i}]": a for i, a in enumerate(inputs.args)}, **inputs.kwargs}
    try:
        signature = inspect.signature(module.forward)
        found = signature.bind(*inputs.args, **inputs.kwargs).arguments
    except (TypeError, ValueError):  # a forward whose signature does not take what it was called with
        found = None
    if found is not None:
        bound = {}
        for name, value in found.items():  # **kwargs by their own names
            var = signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD
            bound.update(value if var else {name: value})
    named: dict[str, Any] = {}
    for name, value in bound.items():
        leaves = value if isinstance(value, list | tuple) else [value]
        if value is None or all(isinstance(leaf, torch.Tensor) for leaf in leaves):
            named[name] = value
    return named


def differing(reference: dict[str, Any], target: dict[str, Any], rtol: float, threshold: float) -> list[str]:
    """The names of the arguments (`arguments`) that differ between two calls: given on one side only, of another
    shape, integers not equal, or floats whose required atol exceeds `threshold`."""
    out = []
    for name in [*reference, *(n for n in target if n not in reference)]:
        r, t = reference.get(name), target.get(name)
        if r is None or t is None:
            if (r is None) != (t is None):
                out.append(name)
            continue
        rs, ts = (list(x) if isinstance(x, list | tuple) else [x] for x in (r, t))
        if [x.shape for x in rs] != [x.shape for x in ts]:
            out.append(name)
        elif any(not x.is_floating_point() for x in rs):
            if not all(torch.equal(x, y) for x, y in zip(rs, ts, strict=True)):
                out.append(name)
        else:
            e = layer_error(name, r, t, rtol)
            if e.required_atol is None or e.required_atol > threshold:
                out.append(name)
    return out


def step_errors(reference: dict[str, list[Call]], target: dict[str, list[Call]], names: list[str],
                rtol: float) -> dict[str, LayerError]:
    """Each named layer's output in the target's decode step against the reference's, call by call (its worst)."""
    out = {}
    for name in names:
        ref_calls, seen = reference[name], target.get(name, [])
        if len(seen) != len(ref_calls):
            out[name] = new_layer_error(name, required_atol=None,
                                        error=f"{len(seen)} call(s) on the target, {len(ref_calls)} on the reference")
            continue
        out[name] = worst([layer_error(name, r.output, t.output, rtol) for r, t in zip(ref_calls, seen, strict=True)])
    return out


