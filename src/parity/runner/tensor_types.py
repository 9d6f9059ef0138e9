"""Localization and fallback in the terms of a target that runs a file of typed tensors (llama.cpp's GGUF: the
TensorTypes capability), where tier 2 cannot look inside a module: the file's tensor groups and their types,
judged by tier 3's own statistic, the mean KL divergence of the next-token distributions from the reference's on
the input set (text generation's, as `llama-perplexity --kl-divergence` computes it).

Localization (`localize_groups`): the file with every group at a higher type (F16) but one, which has the target's
own type: one trial per group. A group's share is its KLD above the all-F16 floor over the sum of those (the
groups' effects add up only roughly: the whole target's KLD is recorded beside their sum). Blocks first
(`token_embd`, `output`, `blk.N`), then the worst blocks' attention and FFN apart.

Fallback (`fallback_groups`): groups kept at `keep_type` (Q8_0 by default) in the order localization ranks them;
the shortest prefix of that order with which the task's verdict passes, found by bisection (keeping more groups
lowers the KLD, as far as the measurement says), then its bytes and tokens per second against the target as it
is, timed in turns in the same run, and the target entry that reproduces it (`snippet`).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from parity.backends import backend_class
from parity.backends.base import TensorTypes
from parity.config.schema import BackendSpec
from parity.errors import ParityError
from parity.execute.execution import execute, new_backend
from parity.inputs import Inputs
from parity.records.models import GroupRow, GroupTrial, Layers, NextTokenMetrics, TensorGroups
from parity.verify.tasks import TaskResult, evaluate

TASK = "text-generation"  # the task whose statistic judges a trial
LOCALIZE_TYPE = "F16"  # what the rest of the file is kept at while one group has the target's type
SPLIT_BLOCKS = 3  # the worst blocks measured again as attention and FFN apart
TIMED_RUNS = 3  # runs of each file, in turns, for tokens per second


def has_tensor_types(spec: BackendSpec) -> bool:
    """Whether `spec`'s backend runs a file of typed tensors (the TensorTypes capability)."""
    return issubclass(backend_class(spec.backend), TensorTypes)


@dataclass(frozen=True)
class _Trial:
    """One run of the file with some groups at another type: the task's verdict on it, the file's bytes, its time, and
    what a record keeps of it (`summary`)."""

    verdict: TaskResult
    nbytes: int
    run_s: float
    summary: GroupTrial

    @classmethod
    def judged(cls, verdict: TaskResult, nbytes: int, run_s: float) -> _Trial:
        """A trial with its summary, read once from the task's metrics (text generation's, as its `NextTokenMetrics`
        says them)."""
        m = NextTokenMetrics.model_validate(verdict.metrics)
        return cls(verdict, nbytes, run_s, GroupTrial(
            kl_mean=m.kl_mean, kl_mean_se=m.kl_mean_se, same_top1=m.same_top1,
            top1_agreement=m.top1_agreement, passed=verdict.passed, nbytes=nbytes))

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def kl_mean(self) -> float:
        return self.summary.kl_mean


class _Trials:
    """The target prepared once; each trial loads it with some groups at another type and judges one run."""

    def __init__(self, reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                 example: Inputs, tasks_spec, gate: float):
        ref = execute(reference, model, inputs, 1, example=example)
        if not ref.ok:
            raise ParityError(f"the reference {reference.id} failed: {ref.error}")
        self.reference_out, self.inputs, self.tasks_spec, self.gate = ref.outputs[0], inputs, tasks_spec, gate
        self.backend = new_backend(target)
        self.backend.prepare(copy.deepcopy(model), example.clone())
        if not isinstance(self.backend, TensorTypes):
            raise ParityError(f"target {target.id}: its backend has no tensor groups to keep at another type")
        self.groups = self.backend.tensor_groups()
        self.count = 0

    def judge(self, keep: list[str], type: str) -> _Trial:
        """One trial: `keep` at `type`, the rest as prepared; its task verdict, file bytes and run time."""
        nbytes = self.backend.keep(keep, type)
        start = time.perf_counter()
        out = self.backend.run(self.inputs.clone())
        spent = time.perf_counter() - start
        verdict = evaluate(TASK, self.reference_out, out, self.tasks_spec, self.gate, self.inputs)
        self.count += 1
        return _Trial.judged(verdict, nbytes, spent)

    def close(self) -> None:
        self.backend.close()


def localize_groups(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                    example: Inputs, tasks_spec, gate: float, on_step: Callable[[str], None] | None = None, *,
                    names: tuple[str, str]) -> Layers:
    """The `layers` record of a TensorTypes target on `names` (its model's and its input set's): each tensor group's
    KLD alone at the target's type (the rest at F16), its share, ranked; the worst blocks split into attention and FFN."""
    trials = _Trials(reference, target, model, inputs, example, tasks_spec, gate)
    try:
        return _localize(trials, reference, target, tasks_spec, on_step, names)
    finally:
        trials.close()


def _localize(trials: _Trials, reference: BackendSpec, target: BackendSpec, tasks_spec,
              on_step: Callable[[str], None] | None, names: tuple[str, str]) -> Layers:
    step = on_step or (lambda text: None)
    start = time.perf_counter()
    groups = trials.groups
    all_groups = [g.name for g in groups]
    blocks = _blocks(all_groups)
    step("the whole file, and every group at F16")
    whole = trials.judge([], LOCALIZE_TYPE)
    floor = trials.judge(blocks, LOCALIZE_TYPE)
    types = {g.name: g.type for g in groups}
    rows = []
    for i, block in enumerate(blocks):
        step(f"{block} alone at the target's type ({i + 1} of {len(blocks)})")
        rows.append(_Row(block, None, trials.judge([b for b in blocks if b != block], LOCALIZE_TYPE)))
    worst = [r.name for r in sorted(rows, key=lambda r: -r.trial.kl_mean) if r.name.startswith("blk.")][:SPLIT_BLOCKS]
    for block in worst:
        for part in (f"{block}.attn", f"{block}.ffn"):
            if part in types:
                step(f"{part} alone at the target's type")
                rows.append(_Row(part, block, trials.judge([n for n in all_groups if n != part], LOCALIZE_TYPE)))
    added = sum(r.added(floor) for r in rows if r.parent is None)
    measured = [r.record(types, floor, added) for r in rows]
    ranked = sorted((r for r in measured if r.parent is None), key=lambda r: -r.kl_added)
    culprit = ranked[0].name if ranked and added > 0 else None
    kl_threshold = tasks_spec.thresholds_for(TASK).kl_mean
    verdict = (f"{culprit} departs most: alone at the target's type it adds {ranked[0].kl_added:.3g} of the "
               f"{added:.3g} mean KLD the groups add one at a time over the all-{LOCALIZE_TYPE} file's "
               f"{floor.kl_mean:.3g} (share {ranked[0].share:.0%}); the whole file's: "
               f"{whole.kl_mean:.3g} (threshold {kl_threshold:g})" if culprit else
               f"no group adds KLD over the all-{LOCALIZE_TYPE} file's {floor.kl_mean:.3g}: "
               "llama.cpp's kernels, not the types, make the difference")
    located = TensorGroups(statistic="kl_mean", trial_type=LOCALIZE_TYPE, trials=trials.count, whole=whole.summary,
                           floor=floor.summary, added=added, groups=measured)
    return Layers.made({
        "kind": "layers", "model": names[0], "inputs": names[1], "target": target.id, "reference": reference.id,
        "tier": 2, "mode": "tensor groups", "threshold": kl_threshold, "verdict": verdict, "culprit": culprit,
        "suspects": [],  # layers' own errors: a group's number is its KLD, in `tensor_groups`
        "levels": [], "elapsed_s": time.perf_counter() - start, "tensor_groups": located})


@dataclass(frozen=True)
class _Row:
    """One group alone at the target's type (`parent`: the block a split group belongs to), as it was run."""

    name: str
    parent: str | None
    trial: _Trial

    def added(self, floor: _Trial) -> float:
        return max(self.trial.kl_mean - floor.kl_mean, 0.0)

    def record(self, types: dict[str, str], floor: _Trial, added: float) -> GroupRow:
        """Its record, with its share of what the block-level groups add together (`added`)."""
        m, kl_added = self.trial.summary, self.added(floor)
        own = sorted({t for g, t in types.items() if g == self.name or g.startswith(self.name + ".")})
        return GroupRow.made({
            "name": self.name, "parent": self.parent, "type": "+".join(own), "kl_mean": m.kl_mean,
            "kl_mean_se": m.kl_mean_se, "kl_added": kl_added, "same_top1": m.same_top1,
            "top1_agreement": m.top1_agreement, "share": kl_added / added if added > 0 else None})


def _blocks(names: list[str]) -> list[str]:
    """The groups at block level: token_embd, output, blk.N (its attention and FFN together), in file order."""
    out: list[str] = []
    for name in names:
        block = ".".join(name.split(".")[:2]) if name.startswith("blk.") else name
        if block not in out:
            out.append(block)
    return out


@dataclass(frozen=True)
class GroupsFallback:
    """What `fallback_groups` found: the fields of a `fallback` record that the search of tensor groups decides."""

    runs_in: str
    modules: list[str]
    passed: bool
    task_before: dict[str, Any]
    task_after: dict[str, Any]
    tried: int
    latency_before_s: float
    latency_after_s: float
    whole_model: bool
    tensor_types: dict[str, Any]  # the record's open mapping (records.models.Fallback.tensor_types)
    aim: str = "tier 3"


def fallback_groups(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                    example: Inputs, tasks_spec, gate: float, keep_type: str = "Q8_0",
                    on_step: Callable[[str], None] | None = None) -> GroupsFallback:
    """The fewest groups, in localization's order, to keep at `keep_type` so that the task's verdict passes, with
    bytes and tokens per second before and after and the snippet (`tensor_types`)."""
    step = on_step or (lambda text: None)
    trials = _Trials(reference, target, model, inputs, example, tasks_spec, gate)
    try:
        located = _localize(trials, reference, target, tasks_spec, on_step, ("", "")).tensor_groups
        order = [r.name for r in sorted((r for r in located.groups if r.parent is None), key=lambda r: -r.kl_added)]
        before = trials.judge([], keep_type)
        tried: dict[int, _Trial] = {0: before}
        if not before.passed:
            step(f"every group at {keep_type}")
            tried[len(order)] = trials.judge(order, keep_type)
            low, high = 0, len(order)  # low fails, high passes (when anything does)
            if tried[high].passed:
                while high - low > 1:
                    mid = (low + high) // 2
                    step(f"the first {mid} of {len(order)} groups at {keep_type}")
                    tried[mid] = trials.judge(order[:mid], keep_type)
                    low, high = (low, mid) if tried[mid].passed else (mid, high)
            chosen = order[:high]
        else:
            chosen = []
        after = tried[len(chosen)]
        step("tokens per second of both files, in turns")
        speeds = _speeds(trials, chosen, keep_type, inputs)
    finally:
        trials.close()
    tokens = int(inputs.kwargs["input_ids"].numel())
    return GroupsFallback(
        runs_in=keep_type, modules=chosen, passed=after.passed, task_before=_metrics(before),
        task_after=_metrics(after), tried=len(tried) + located.trials, latency_before_s=speeds[0],
        latency_after_s=speeds[1], whole_model=bool(chosen) and len(chosen) == len(order),
        tensor_types={"keep_type": keep_type, "groups": len(order), "bytes_before": before.nbytes,
                      "bytes_after": after.nbytes, "tokens": tokens,
                      "tokens_per_s_before": tokens / speeds[0], "tokens_per_s_after": tokens / speeds[1],
                      "snippet": snippet(target, chosen, keep_type) if chosen and after.passed else None,
                      "localization": located.model_dump(exclude_unset=True)})


def _speeds(trials: _Trials, chosen: list[str], keep_type: str, inputs: Inputs) -> tuple[float, float]:
    """The median run time of the file as it is and with `chosen` kept, loaded and run in turns."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(TIMED_RUNS):
        for keep, spent in (([], times[0]), (chosen, times[1])):
            trials.backend.keep(keep, keep_type)
            start = time.perf_counter()
            trials.backend.run(inputs.clone())
            spent.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _metrics(trial: _Trial) -> dict[str, Any]:
    return {k: v for k, v in trial.verdict.metrics.items() if k in ("kl_mean", "kl_mean_se", "top1_agreement", "same_top1",
                                                                 "perplexity_ratio", "positions")}


def snippet(target: BackendSpec, keep: list[str], keep_type: str) -> str:
    """The target entry that runs the target with `keep` at `keep_type`, for an experiment's `targets:` list: the
    target's own entry (its tolerances, its quantize scheme's settings: what its verdict is judged at) with a name
    of its own and the kept groups added to its options."""
    import yaml

    own = target.model_dump(mode="json", exclude_defaults=True, exclude={"backend", "name", "options"})
    options = {k: v for k, v in target.options.items() if k not in ("keep", "keep_type")}
    entry: dict[str, Any] = {"backend": target.backend, "name": f"{target.id}-kept", **own,
                             "options": {**options, "keep": list(keep), "keep_type": keep_type}}
    return "- " + yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6).strip()
