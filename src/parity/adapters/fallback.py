"""Selective fallback: run a few modules outside the target's fast path to restore agreement.

- `compile` targets: the modules run eager (wrapped in a `torch.compiler.disable`d call, their hooks
  included), so inductor neither fuses nor reorders their arithmetic.
- reduced-precision targets (eager, compile or torchscript in bfloat16 or float16): the modules compute
  in float32 (inputs cast up, outputs cast back), the rest stays in the reduced dtype.
- quantized targets (`quantize:`): the modules are left out of quantization and compute in float
  (backends/quantize.py's `keep_float`), the rest in int8.

The set of modules is found by `find_fallback`: candidates in the order of their own (tier-2, local)
error, added until the check passes (tier 1 at the gate, or the tier-3 task verdict), then shrunk to a
minimal set (each module dropped in turn if the check still passes without it). A set that is in fact the
whole model (every top-level module, or modules that hold every parameter) is said to be so: it is no
partial fallback, and `next_step` says what to try instead, as it does when no set passes.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from parity.backends import fallback_kind
from parity.backends.quantize import keep_float
from parity.config.schema import BackendSpec
from parity.errors import ParityError
from parity.inputs import Inputs
from parity.outputs import map_tensors


class Float32Island(torch.nn.Module):
    """Runs a module in float32 inside a reduced-precision model. The float32 copy is kept outside the
    module tree, so the backend's `.to(bfloat16)` of the whole model cannot reach it."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "island", copy.deepcopy(module).float())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        first = next((t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
        if first is not None and next(self.island.parameters(), first).device != first.device:
            object.__setattr__(self, "island", self.island.to(first.device))
        up = lambda t: t.float() if t.is_floating_point() else t  # noqa: E731
        out = self.island(*map_tensors(args, up), **map_tensors(kwargs, up))
        return map_tensors(out, lambda t: t.to(dtype) if t.is_floating_point() else t)


class EagerIsland(torch.nn.Module):
    """Runs a module, hooks included, outside torch.compile: dynamo breaks the graph around it."""

    def __init__(self, module: torch.nn.Module):
        global _call_outside_compile
        super().__init__()
        self.inner = module
        if _call_outside_compile is None:  # made here, not on import: torch.compiler.disable imports dynamo (~2 s)
            _call_outside_compile = torch.compiler.disable(_call)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _call_outside_compile(self.inner, *args, **kwargs)


def _call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


_call_outside_compile = None


def fallback_for(spec: BackendSpec, model_name: str) -> list[str]:
    """The modules of `model_name` a target runs outside its fast path: entries `model:module` apply to
    that model only, plain `module` entries to every model the target runs."""
    out = []
    for entry in spec.fallback:
        owner, sep, module = entry.rpartition(":")
        if not sep or owner == model_name:
            out.append(module)
    return out


def apply_fallback(model: torch.nn.Module, names: list[str], spec: BackendSpec) -> torch.nn.Module:
    """A copy of `model` with `names` run outside the target's fast path."""
    kind = fallback_kind(spec)
    model = copy.deepcopy(model)
    known = {n for n, _ in model.named_modules()}
    for name in names:
        if name not in known:
            from parity.errors import did_you_mean

            raise ParityError(f"fallback: the model has no module '{name}'{did_you_mean(name, known)}")
        if kind == "float":  # left out of quantization (backends/quantize.py)
            keep_float(model.get_submodule(name))
            continue
        owner, _, attr = name.rpartition(".")
        parent = model.get_submodule(owner) if owner else model
        island = EagerIsland if kind == "eager" else Float32Island
        setattr(parent, attr, island(getattr(parent, attr)))
    return model


@dataclass
class FallbackResult:
    target: str
    runs_in: str  # eager (out of torch.compile), float32 (out of a reduced dtype) or float (out of int8)
    aim: str = "tier 1"  # what must pass: tier 1 at the gate, or tier 3 (the task-level verdict)
    modules: list[str] = field(default_factory=list)
    passed: bool = False
    required_atol_before: float | None = None
    required_atol_after: float | None = None
    task_before: dict[str, Any] | None = None  # tier-3 metrics, when the aim is tier 3
    task_after: dict[str, Any] | None = None
    latency_before_s: float | None = None
    latency_after_s: float | None = None
    latency_float_s: float | None = None  # int8 targets: the float model on the same backend, timed alongside
    tried: int = 0
    whole_model: bool = False  # the passing set is the whole model: no partial fallback exists
    next_step: str | None = None  # what to try when no partial fallback exists (set by the caller)

    def record(self) -> dict[str, Any]:
        ratio = (self.latency_after_s / self.latency_before_s
                 if self.latency_before_s and self.latency_after_s else None)
        return {**self.__dict__, "latency_ratio": ratio}


@dataclass
class Trial:
    """One run of the target with a set of modules outside its fast path."""

    passed: bool
    required_atol: float
    task: dict[str, Any] | None = None


def _latencies(runs_on: list[tuple[BackendSpec, torch.nn.Module]], inputs, runs: int, example=None) -> list[float]:
    """The median run time of each (backend spec, model), prepared from `example` (None: `inputs`), runs
    interleaved (one of each in turn), so that a slow spell of the machine falls on all of them alike. Their
    exports come from the running model's artifacts, as the search's executions' do."""
    from parity.execute.execution import new_backend

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


def find_fallback(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                  candidates: list[str] | Callable[[], list[str]], rtol: float, gate: float, latency_runs: int = 7,
                  task: tuple[str, Any] | None = None, leaf_tolerance=None,
                  example: Inputs | None = None) -> FallbackResult:
    """The smallest set of `candidates` (tried in the order given) whose fallback makes the check pass:
    tier 1 at `gate`, or with `task` = (task name, tier-3 thresholds) the task-level verdict, which a
    reduced-precision target can often regain where no set brings every output within a tight gate.
    `candidates` may be a function that finds them (tier 2, minutes on a large model): it is called only
    when the check fails without fallback. Every trial is prepared from `example` (the run's example inputs;
    None: `inputs`) and judged on `inputs`, as the run prepared and judged the check."""
    from parity.execute.execution import execute
    from parity.verify.tasks import evaluate
    from parity.verify.tensors import compare

    kind = fallback_kind(target)
    ref = execute(reference, model, inputs, 1, example=example)
    if not ref.ok:
        raise ParityError(f"the reference {reference.id} failed: {ref.error}")
    reference_out = ref.outputs[0]

    def judge(modules: list[str]) -> Trial:
        ran = execute(target, apply_fallback(model, modules, target) if modules else model, inputs, 1, example=example)
        if not ran.ok:
            return Trial(False, float("inf"))
        required = compare(reference_out, ran.outputs[0], rtol, gate, leaf_tolerance=leaf_tolerance).required_atol
        if task is None:
            return Trial(required <= gate, required)
        verdict = evaluate(task[0], reference_out, ran.outputs[0], task[1], gate)
        return Trial(verdict.passed, required, verdict.metrics)

    result = FallbackResult(target.id, kind, aim="tier 3" if task else "tier 1")
    trial = judge([])
    result.required_atol_before, result.task_before = trial.required_atol, trial.task
    if callable(candidates):
        candidates = [] if trial.passed else candidates()
    chosen: list[str] = []
    for name in candidates:  # grow: add the next suspect until the check passes
        if trial.passed:
            break
        if any(name.startswith(c + ".") for c in chosen):
            continue
        chosen = [c for c in chosen if not c.startswith(name + ".")] + [name]
        trial = judge(chosen)
        result.tried += 1
    if not trial.passed:
        result.modules, result.required_atol_after, result.task_after = chosen, trial.required_atol, trial.task
        return result
    for name in list(chosen):  # shrink: drop each module the check passes without
        if len(chosen) == 1:  # without it, no module: the check ran so first, and failed
            break
        smaller = judge([c for c in chosen if c != name])
        result.tried += 1
        if smaller.passed:
            chosen, trial = [c for c in chosen if c != name], smaller
    result.modules, result.passed = chosen, True
    result.whole_model = is_whole_model(model, chosen)
    result.required_atol_after, result.task_after = trial.required_atol, trial.task
    timed = [(target, model), (target, apply_fallback(model, chosen, target))]
    if target.quantize is not None:  # what int8 saves at all: the float model on the same backend
        timed.append((target.model_copy(update={"quantize": None}), model))
    result.latency_before_s, result.latency_after_s, *float_s = _latencies(timed, inputs, latency_runs, example)
    result.latency_float_s = float_s[0] if float_s else None
    return result


def candidates_from(localization_record: dict[str, Any]) -> list[str]:
    """Every layer a localization looked at, by its own error, largest first (suspects lead, then the first
    layer over the threshold, which is all a whole-graph verdict names)."""
    seen: dict[str, float] = {}
    for level in localization_record["levels"]:
        for layer in level["layers"]:
            local = layer["local"] or {}
            if not local.get("error"):
                seen[layer["name"]] = max(seen.get(layer["name"], 0.0), local.get("rel_rmse") or 0.0)
    named = [s["name"] for s in localization_record["suspects"]] + [localization_record.get("first_divergent")]
    leading = list(dict.fromkeys(n for n in named if n in seen))
    rest = sorted((n for n in seen if n not in leading), key=lambda n: -seen[n])
    return leading + rest


def is_whole_model(model: torch.nn.Module, modules: list[str]) -> bool:
    """Is this set the whole model in all but name: every top-level module (or a container of it), or
    modules that together hold every parameter the model has?"""
    from parity.verify.localize import children

    if not modules:
        return False
    top = children(model, "")
    if all(any(t == m or t.startswith(m + ".") for m in modules) for t in top):
        return True
    every = {id(p) for p in model.parameters()}
    held = {id(p) for m in modules for p in model.get_submodule(m).parameters()}
    return bool(every) and every <= held


def whole_model_note(result: FallbackResult) -> str:
    where = {"eager": "run entirely eager", "float": "left in float (no quantization)"}.get(
        result.runs_in, "at the reference's precision (float32)")
    return f"no partial fallback exists; this is the whole model {where}"


def next_step(result: FallbackResult, command: str, task: str | None) -> str | None:
    """What to try when the search found no partial fallback: the task-level aim (`command --tier 3`) when
    the aim was tier 1 and the model has a task tier 3 evaluates; otherwise a wider gate or lower task
    thresholds, with the numbers that would pass. None when a partial fallback (or none) is the answer."""
    if result.passed and not result.whole_model:
        return None
    if result.aim == "tier 1" and task:
        return (f"aim at the {task} decisions instead of every output within the gate: {command} --tier 3")
    before = result.required_atol_before
    if result.aim == "tier 1" and before is not None and before != float("inf"):
        return (f"the target as it is passes from atol {before:.3g}: widen the gate (tolerances: {{gate: {before:.3g}}}) "
                "if that drift is acceptable, or keep this model at the reference's precision")
    if result.aim == "tier 1":
        return "no atol passes the target as it is: keep this model at the reference's precision"
    return ("lower the thresholds in tiers.tasks if the task metrics above are acceptable, or keep this model at "
            "the reference's precision")

