"""User errors versus bugs.

A `ParityError` is the user's to fix (a bad config, a missing file, an unknown name): the command line
prints its message and exits 2, never a traceback. Anything else is a bug in parity: traceback, exit 3.

A message quotes what the user gave (a name, a path, a value), and what the user gave may be a megabyte
long: every problem is clipped where it is made, so no value fills more than `VALUE_LIMIT` characters of
a message and no problem more than `PROBLEM_LIMIT`.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

VALUE_LIMIT = 200
PROBLEM_LIMIT = 2000
_LONG_WORD = re.compile(rf"\S{{{VALUE_LIMIT + 1},}}")


class PlainLines(logging.Formatter):
    """A log message on a plain stream (CI logs, pipes, a worker's stderr copied to its parent's) as
    `warning: ...`: the words scripts and tests read from parity's stderr; INFO as it is."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno == logging.INFO else f"{record.levelname.lower()}: {text}"


def clip(text: str, limit: int = VALUE_LIMIT) -> str:
    """`text`, or its start and end around a note of how much was left out."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 6
    return f"{text[:head]}...[{len(text) - head - tail} characters]...{text[-tail:]}"


def exception_words(exc: BaseException, limit: int = 200) -> str:
    """An exception in one line for a record's `why`: its type, then its message's words, cut at `limit`."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def clip_problem(problem: str) -> str:
    """Every run of more than VALUE_LIMIT non-space characters clipped (a value quoted in full), then the
    whole problem to PROBLEM_LIMIT."""
    return clip(_LONG_WORD.sub(lambda m: clip(m.group()), visible(problem)), PROBLEM_LIMIT)


# Control characters (every C0 character, DEL and C1) as a reader sees them: \x00, \n, \x1b. A name or a quoted
# text from a file (a records.jsonl, a model's output keys, a runtime's error) may hold NUL, a backspace that
# rubs out what came before, an escape sequence that recolours a terminal, a newline that starts a table row.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SHOWN = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """`text` with every control character written out as its escape: the one helper through which the
    console, report.html and report.md show a name or a quoted text (and every user error, clip_problem)."""
    return _CONTROL.sub(lambda m: _SHOWN.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


class ParityError(Exception):
    """A problem the user can fix; `problems` holds one message per problem, each clipped (clip_problem)."""

    def __init__(self, *problems: str):
        self.problems = [clip_problem(str(p)) for p in problems] or ["unknown error"]
        super().__init__("\n".join(self.problems))


class CacheLost(ParityError):
    """The artifact cache failed under a running job (an entry removed as it was built, its disk full): exit 2
    naming the cache, never a failure charged to the target (execute/execution.py lets it through)."""


class NotRebuilt(ParityError):
    """A backend's copy of a model, built again from its spec, is not the model its first build was (its builder
    raised this time, or gave other weights): exit 2 naming the model, never a failure charged to the target."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    if len(str(name)) > VALUE_LIMIT:  # nothing a user meant is that long, and comparing it costs seconds
        return ""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def first_line(exc: BaseException) -> str:
    """A transformers error in one line: its first non-empty line, clipped (its messages run to several lines
    of advice and hundreds of characters)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return clip(lines[0] if lines else type(exc).__name__)


@dataclass(frozen=True)
class FieldError:
    """One error of a pydantic ValidationError, read once from the mapping pydantic gives (`errors()`): its key
    path, pydantic's error type, its message, the input it refused (`has_input`: pydantic named one) and, from its
    context, the choices a literal expected and a validator's own exception."""

    loc: tuple
    kind: str
    msg: str
    has_input: bool
    input: Any
    expected: str  # a literal's or an enum's choices, in pydantic's words; "" for other errors
    error: BaseException | None  # what a validator raised (a value_error)

    @property
    def message(self) -> str:
        """The message without the prefix pydantic puts before a validator's own sentence."""
        return self.msg.removeprefix("Value error, ")


def field_errors(exc: ValidationError) -> list[FieldError]:
    """Each error of `exc`, typed: the one place that reads pydantic's error mappings (the experiment's checks and
    the records' reader both speak of them)."""
    out = []
    for err in exc.errors():
        context = err.get("ctx") or {}
        out.append(FieldError(tuple(err["loc"]), err["type"], err["msg"], "input" in err, err.get("input"),
                              context.get("expected", ""), context.get("error")))
    return out
