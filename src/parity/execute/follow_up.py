"""What a task asks of a prepared backend after its timed runs: text-generation's greedy continuations, which run
the artifact again on inputs of its own (one token more each time), and its decoding through the KV cache where the
backend can (`CachedDecoding`, backends/base.py).

Whoever runs a run's executions (the Runner, a process or Ray worker) says what to ask (`asking`), for the model's
task; `execution.py` calls it with the prepared backend and the execution's inputs once the timed repeats are done,
before the backend is closed. So each side's follow-up runs on its own artifact, in the process that holds it, and
what it returns (small and picklable: token ids, not tensors) travels back with the execution
(`Execution.follow_up`). A context, as the calibration inputs are (calibration.py), so that no layer between the
Runner and `execute` passes it on.

A follow-up returns what its task reads; what it raises is kept as `FollowUpRaised` (the exception's first line):
the execution's own outputs, and so tier 1, stand whatever the follow-up does.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from parity.backends.base import Backend
from parity.inputs import Inputs

FollowUp = Callable[[Backend, Inputs], Any]  # the prepared backend (its `run`, its capabilities)


@dataclass(frozen=True)
class FollowUpRaised:
    """What a follow-up raised, in one line: the execution's `follow_up` then, in place of what it returns."""

    error: str


_active: contextvars.ContextVar[FollowUp | None] = contextvars.ContextVar("parity_follow_up", default=None)


@contextlib.contextmanager
def asking(follow_up: FollowUp | None) -> Iterator[None]:
    """Executions inside this block end with `follow_up(backend, inputs)` (None: with nothing)."""
    token = _active.set(follow_up)
    try:
        yield
    finally:
        _active.reset(token)


def active() -> FollowUp | None:
    return _active.get()
