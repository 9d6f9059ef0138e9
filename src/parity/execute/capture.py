"""What instrumented model code records while one run of an execution is watched.

A task may instrument a model (`Task.instrument`: detection wraps a torchvision detector's post-processing
to keep its inputs, for flip attribution). The instrumented code calls `record` whatever runs it; only the
run that `execute` watches (the first timed repeat, the one tier 3 judges) keeps what it records, in
`Execution.captured`. Nothing is recorded outside a watched run, so other runs, exports and copies of
the model are unaffected."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_RECORDED: ContextVar[list[Any] | None] = ContextVar("parity_captured", default=None)


@contextmanager
def watching() -> Iterator[list[Any]]:
    """A list that receives everything `record`ed until the block ends."""
    recorded: list[Any] = []
    token = _RECORDED.set(recorded)
    try:
        yield recorded
    finally:
        _RECORDED.reset(token)


def watched() -> bool:
    return _RECORDED.get() is not None


def record(value: Any) -> None:
    recorded = _RECORDED.get()
    if recorded is not None:
        recorded.append(value)
