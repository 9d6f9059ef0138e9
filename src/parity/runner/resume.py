"""Resume that cannot be stale. Every tier-1 check records the fingerprints its verdict rests on (`Fingerprints`
in records/models.py): the model's code and weights, its input set (and the example every backend was
prepared from), the target's settings, parity's own source and the versions of the libraries involved. A run into a folder that
holds records compares them with what would run now, and the judgements whose fingerprints changed (or that
an older parity recorded without any) are re-run: their records are removed from records.jsonl and made
again, and the console says which and why. The experiment's other settings are the `run` record's digest
(records/io.py: a run refuses another experiment's records); this covers what the settings name (a file's
contents, a module's code) and the targets, which may change between runs into one folder.

Code and libraries are fingerprinted as the artifact cache keys them (parity/fingerprint.py), weights and
inputs by value (execute/cache.py): one home for each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import defaultdict
from typing import Any

import torch

from parity import fingerprint
from parity.execute.cache import inputs_digest, weights_digest
from parity.inputs import Inputs
from parity.records.models import (
    Check,
    Fallback,
    Fingerprints,
    InputWarning,
    Layers,
    ModelBuilt,
    Record,
    Tier1Check,
    TimedRun,
)
from parity.records.view import RunView

Line = dict[str, Any]  # one record as records.jsonl holds it (without_stale rewrites the file's lines, read as their models)
# The parts compared, and how a change of each is said (model, inputs: the check's names).
SAID = {"model_code": "model code of {model}", "model_weights": "weights of {model}",
        "inputs": "input set {inputs} of {model}", "target": "settings of target {target}",
        "backend_code": "code of the reference's or {target}'s backend", "parity": "parity's source"}
UNVERIFIABLE = ("model code of {model} cannot be fingerprinted (past the fingerprint's bounds, or a file its source "
                "reads cannot be digested), so it cannot be told unchanged")
UNRECORDED = "recorded by a parity that did not fingerprint its checks"


@dataclasses.dataclass(frozen=True)
class ModelPart:
    """The model's part of its checks' fingerprints (`model_fingerprints`): `code` (None: it cannot be told
    unchanged), `weights`, and the libraries its code `reached`."""

    code: str | None
    weights: str
    reached: tuple[str, ...]


def model_fingerprints(model: torch.nn.Module, files: dict[str, Any] | None) -> ModelPart:
    """The model's part of its checks' fingerprints: its code, the user code it runs together with `files`
    (what its source reads it from: a model file, a repository's .py files, the entry's module; the
    source's `files_digest`) (None: past the walk's bounds or unreadable, so it can never be told
    unchanged); its weights; and the libraries its code reaches."""
    code = fingerprint.code_fingerprint(model)
    digest = None if code is None or files is None else hashlib.sha256(
        f"{code[0]} {json.dumps(files, sort_keys=True, default=str)}".encode()).hexdigest()
    return ModelPart(digest, weights_digest(model), tuple(sorted(code[1])) if code else ())


def check_fingerprints(model_part: ModelPart, inputs: Inputs, example: Inputs, target: dict[str, Any],
                       libraries: list[str], backends: tuple[type, ...] = ()) -> Fingerprints:
    """The `fingerprints` of one check: `model_part` (model_fingerprints), the input set and the example the
    backends were prepared from, by value; the target's settings (its spec, as JSON); the code of the
    reference's and the target's `backends` (a plugin's class is user code, as the artifact cache keys it);
    parity's source; the versions (and installed file lists) of `libraries` (the reference's and the target's)
    and of those the model's and the backends' code reach."""
    code = fingerprint.code_fingerprint(None, *backends)
    found = fingerprint.versions([*libraries, *model_part.reached, *(sorted(code[1]) if code else [])])
    return Fingerprints(
        recorded_at=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        model_code=model_part.code, model_weights=model_part.weights,
        inputs=hashlib.sha256(f"{inputs_digest(inputs)} {inputs_digest(example)}".encode()).hexdigest(),
        target=hashlib.sha256(json.dumps(target, sort_keys=True).encode()).hexdigest(),
        backend_code=code[0] if code else None,
        parity=fingerprint.parity_digest(),
        libraries={name: None if v is None else f"{v} ({files})" for name, (v, files) in found.items()})


def changes(recorded: Tier1Check, now: Fingerprints) -> list[str]:
    """Why the recorded tier-1 check `recorded` no longer holds for what would run now (`now`, its
    check_fingerprints), in words; [] when it still holds."""
    old = recorded.fingerprints
    names = {"model": recorded.model, "inputs": recorded.inputs, "target": recorded.target}
    if not old:
        return [UNRECORDED]
    found = [UNVERIFIABLE.format(**names)] if now.model_code is None else []
    if now.backend_code is None:
        found.append(f"the code of {recorded.target}'s backend cannot be fingerprinted, so it cannot be told unchanged")
    found += [said.format(**names) + " changed" for part, said in SAID.items()
              if getattr(now, part) is not None and getattr(old, part) != getattr(now, part)]
    libraries = old.libraries
    moved = [f"{name} {_version(libraries.get(name))} -> {_version(v)}" for name, v in now.libraries.items()
             if libraries.get(name) != v]
    if moved:
        found.append(f"library versions changed ({', '.join(moved)})")
    return found


def _version(value: str | None) -> str:
    return "not installed" if value is None else value.split(" (")[0] if " (" in value else value


def _checks(n: int) -> str:
    return f"{n} check" if n == 1 else f"{n} checks"


def resuming(out_dir: object, recorded: int, total: int, stale: bool) -> str:
    """The line every resumed run prints: 'resuming DIR: 7 of 12 checks recorded', 'resuming DIR: all 12
    checks recorded, unchanged' (nothing runs) or, when some are stale, 'resuming DIR: all 12 checks recorded'."""
    if recorded < total:
        return f"resuming {out_dir}: {recorded} of {_checks(total)} recorded"
    return f"resuming {out_dir}: all {_checks(total)} recorded{'' if stale else ', unchanged'}"


def re_running(stale: dict[tuple[str, str, str], tuple[list[str], str]], total: int) -> str:
    """The line that says which recorded checks are re-run and why: 're-running 3 checks of 12: model code of
    net changed since 2026-12-02 00:48:39 UTC'; a reason that holds for only some of them says for how many.
    `stale`: (model, inputs, target) -> (why, recorded_at)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for why, since in stale.values():
        for reason in why:
            by_reason[reason].append(since)
    parts = []
    for reason, since in by_reason.items():
        when = f" since {min(since)}" if any(since) else ""
        count = f" ({_checks(len(since))})" if len(since) < len(stale) else ""
        parts.append(f"{reason}{when}{count}")
    return f"re-running {_checks(len(stale))} of {total}: {'; '.join(parts)}"


def without_stale(records: list[Line], stale: set[tuple[str, str, str]],
                  planned: dict[tuple[str, str], list[str]]) -> list[Line]:
    """`records` less those of the `stale` judgements (model, inputs, target): their checks, layers, fallback
    records and the target's executions; a (model, input set) whose judgements are all stale also loses its
    baselines' executions and its warnings, a model whose judgements are all stale its `model` record, and
    when every judgement is stale nothing is kept (the run starts over, with this process's `run` record).
    `planned`: (model, inputs) -> the targets of its job."""
    pairs = {pair for pair, targets in planned.items() if all((*pair, t) in stale for t in targets)}
    if pairs == set(planned):
        return []
    models = {m for m, _ in planned} - {m for m, i in planned if (m, i) not in pairs}

    def stale_record(r: Record) -> bool:
        if isinstance(r, Check | Layers | Fallback):
            return (r.model, r.inputs, r.target) in stale
        if isinstance(r, TimedRun):
            return (r.model, r.inputs, r.backend) in stale or (r.model, r.inputs) in pairs
        if isinstance(r, InputWarning):
            return (r.model, r.inputs) in pairs
        return isinstance(r, ModelBuilt) and r.model in models

    return [line for line, r in zip(records, RunView(records), strict=True) if not stale_record(r)]
