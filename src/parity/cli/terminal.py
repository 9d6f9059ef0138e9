"""What a command writes to: the exit codes, the rich console, and a stdout that a closed pipe cannot turn into
another exit code."""

from __future__ import annotations

import io
import logging

EXIT_OK, EXIT_FAILED, EXIT_USER, EXIT_BUG = 0, 1, 2, 3


def make_console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:  # CI logs and pipes: wide enough that the table is not cut
        console = Console(stderr=stderr, highlight=False, width=160)
    return console



class Stdout(io.TextIOBase):
    """sys.stdout for the time of a command: when it is closed (`>&-`) or a pipe whose reader ended, what parity
    prints there is dropped with one warning, and the exit code stays the verdict's. Without it, rich turned the
    broken pipe into SystemExit(1), which read as the model calling sys.exit(1) after a passing run."""

    def __init__(self, stream):
        self._stream = stream
        self._lost = stream is None or getattr(stream, "closed", False)
        if self._lost:
            self._warn()

    def _warn(self) -> None:
        self._lost = True
        logging.getLogger("parity").warning("stdout is closed (a pipe whose reader ended?): what parity prints there is "
                                            "lost; the records and reports are written as usual")

    def _guarded(self, action, default):
        if self._lost:
            return default
        try:
            return action()
        except (BrokenPipeError, ValueError):  # a pipe whose reader ended; a closed file
            self._warn()
            return default

    def write(self, text: str) -> int:
        return self._guarded(lambda: self._stream.write(text), len(text))

    def flush(self) -> None:
        self._guarded(lambda: self._stream.flush(), None)

    def isatty(self) -> bool:
        return self._guarded(lambda: self._stream.isatty(), False)

    def close(self) -> None:
        """Not ours to close (nor to flush when this wrapper is collected: the stream may be gone by then)."""

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"
