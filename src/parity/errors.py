"""User errors versus bugs.

A `ParityError` is the user's to fix (a bad config, a missing file, an unknown name): the command line
prints its message and exits 2, never a traceback. Anything else is a bug in parity: traceback, exit 3.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ParityError(Exception):
    """A problem the user can fix; `problems` holds one message per problem."""

    def __init__(self, *problems: str):
        self.problems = list(problems) or ["unknown error"]
        super().__init__("\n".join(self.problems))


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
