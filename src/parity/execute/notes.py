"""What a backend said while it prepared and ran, kept with the execution: tracer warnings (a trace that
took one branch of a data-dependent `if` is right only for inputs that take it too), torch.compile's graph
breaks, and exporters' warnings. A check can pass and still rest on such a trace, so these are recorded
and shown beside the check, whatever its verdict.
"""

from __future__ import annotations

import contextlib
import linecache
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from parity.records.models import Note

MAX_NOTES = 20
QUIET = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)  # about the API, not this model
SPECIALIZED = ("might cause the trace to be incorrect", "converting a tensor to a python", "python value")
EXPORTERS = ("/torch/onnx/", "/onnxscript/", "/openvino/", "/torch/export/")


def _where(filename: str, lineno: int) -> dict[str, Any]:
    code = linecache.getline(filename, lineno).strip()
    return {"where": f"{filename}:{lineno}", **({"code": code[:200]} if code else {})}


def classify(message: warnings.WarningMessage) -> dict[str, Any] | None:
    """A note for one warning, or None for warnings about APIs rather than this model's trace."""
    text = " ".join(str(message.message).split())
    if type(message.message).__name__ == "TracerWarning" or message.category.__name__ == "TracerWarning":
        kind = "trace_specialized" if any(s in text.lower() for s in SPECIALIZED) else "tracer"
        return {"kind": kind, "message": text[:300], **_where(message.filename, message.lineno)}
    if issubclass(message.category, QUIET):
        return None
    if any(part in message.filename.replace("\\", "/") for part in EXPORTERS):
        return {"kind": "exporter", "message": text[:300], **_where(message.filename, message.lineno)}
    return None


def _dynamo_counts() -> dict[tuple[str, str], int]:
    """torch.compile's graph-break counters, when dynamo is loaded (never imported here: it costs seconds)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    return {(group, reason): n for group in ("graph_break", "unimplemented")
            for reason, n in utils.counters.get(group, {}).items()}


def _graph_breaks(before: dict, after: dict) -> list[dict[str, Any]]:
    notes = []
    reset = any(after.get(key, 0) < n for key, n in before.items())  # torch._dynamo.reset() clears them
    for (group, reason), n in after.items():
        more = n if reset else n - before.get((group, reason), 0)
        if more > 0:
            lines = [line.strip() for line in reason.splitlines() if line.strip()] or [reason]
            why = next((line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), None)
            where = next((line for line in lines if line.startswith("# File")), None)
            notes.append({"kind": "graph_break", "message": f"{lines[0]}{': ' + why if why else ''}"[:300], "count": more,
                          **({"where": where.removeprefix("# ")[:300]} if where else {})})
    return notes


class Collector:
    """What a backend warned of, step by step (`step`: its preparation, its runs), so that the steps of several
    backends can take turns and each keeps its own."""

    def __init__(self):
        self.caught: list[warnings.WarningMessage] = []
        self.told: list[dict[str, Any]] = []
        self.breaks: list[dict[str, Any]] = []

    def add(self, notes) -> None:
        """Notes a backend made itself (Backend.note): what no warning says, such as an exporter's fallback."""
        self.told.extend(notes)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Record the warnings raised inside the block (none reaches the console), and torch.compile's graph
        breaks counted inside it. The user's filters stand: a warning they turned into an error (`-W error`)
        still raises."""
        before = _dynamo_counts()
        with warnings.catch_warnings(record=True) as caught:
            try:
                yield
            finally:
                self.caught += caught
                self.breaks += _graph_breaks(before, _dynamo_counts())

    def notes(self) -> list[dict[str, Any]]:
        """The notes so far: deduplicated (a graph break seen in several steps counted once per step), at most
        MAX_NOTES."""
        found, seen = [], {}
        caught = [c for m in self.caught if (c := classify(m))]
        for note in self.told + caught + self.breaks:
            said = Note.model_validate(note)  # its mapping stays what the records write, in its key order
            key = (said.kind, said.where, said.message)
            if key in seen:
                if said.count is not None:
                    seen[key]["count"] += said.count
            elif len(found) < MAX_NOTES:
                seen[key] = dict(note)
                found.append(seen[key])
        return found
