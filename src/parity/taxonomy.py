"""Failure classes: why a check failed. The order of SEVERITY decides a check's class when its leaves
fail for different reasons (a structure difference explains more than a numeric one)."""

from __future__ import annotations

STRUCTURE_MISMATCH = "structure_mismatch"  # different leaves (names, containers, tensor vs not)
SHAPE_MISMATCH = "shape_mismatch"
DTYPE_MISMATCH = "dtype_mismatch"  # different non-floating dtypes (float precisions may differ by design)
UNCOMPARABLE = "uncomparable"  # an output of a type parity cannot compare
NONFINITE = "nonfinite"  # NaN/Inf where the reference has none, or the other way round; or NaN throughout both
NUMERIC_DRIFT = "numeric_drift"
NONDETERMINISTIC = "nondeterministic"  # a backend's repeats disagree beyond the gate
ORDERING = "ordering"
DECISION_FLIP = "decision_flip"
UNSUPPORTED_OP = "unsupported_op"
BACKEND_ERROR = "backend_error"
SHAPE_SPECIALIZED = "shape_specialized"  # prepared from an example of other shapes, it cannot run these
CRASH = "crash"
TIMEOUT = "timeout"
REFERENCE_ERROR = "reference_error"  # the reference could not run: no verdict about the target

SEVERITY = [
    REFERENCE_ERROR, CRASH, TIMEOUT, UNSUPPORTED_OP, SHAPE_SPECIALIZED, BACKEND_ERROR, STRUCTURE_MISMATCH, SHAPE_MISMATCH, DTYPE_MISMATCH,
    UNCOMPARABLE, NONFINITE, NONDETERMINISTIC, DECISION_FLIP, ORDERING, NUMERIC_DRIFT,
]

_UNSUPPORTED_HINTS = (
    "unsupported", "not supported", "not implemented", "notimplemented", "no kernel", "could not export",
    "failed to export", "failed to convert", "conversionerror", "onnxexportererror", "torchexporterror", "unsupportednodeerror", "does not support",
    "output from traced functions", "by tracing", "tracer cannot",
)


def most_severe(classes) -> str | None:
    present = [c for c in classes if c]
    return min(present, key=SEVERITY.index) if present else None


def classify_exception(exc: BaseException) -> str:
    """`unsupported_op` when a backend cannot express the model (export, tracing, missing kernels),
    `backend_error` for anything else it raised."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(f"{type(seen).__module__}.{type(seen).__name__} {seen}")
        seen = seen.__cause__
    text = " ".join(chain).lower()
    if isinstance(exc, NotImplementedError) or any(h in text for h in _UNSUPPORTED_HINTS):
        return UNSUPPORTED_OP
    return BACKEND_ERROR


MEANINGS = {  # one line per class, for reports (docs/tiers.md's table says the same)
    NUMERIC_DRIFT: "same structure, values farther apart than the gate allows",
    NONFINITE: "NaN or Inf in one output where the other has a finite value, or NaN throughout both (nothing compared)",
    SHAPE_MISMATCH: "a leaf's shape differs",
    DTYPE_MISMATCH: "a leaf's dtype differs beyond float precision",
    STRUCTURE_MISMATCH: "different leaves (missing, extra, tensor vs non-tensor, another non-tensor value)",
    UNCOMPARABLE: "an output of a type parity cannot compare",
    ORDERING: "the same answer in another order (tier 3 matched every item within the gate)",
    DECISION_FLIP: "a task metric fell below its threshold: the target decides differently",
    NONDETERMINISTIC: "a backend's repeats disagree with its first run beyond the gate",
    UNSUPPORTED_OP: "the backend cannot express the model (export or tracing failed, a kernel is missing)",
    SHAPE_SPECIALIZED: "prepared (exported, traced) from inputs of other shapes, the artifact cannot run these",
    BACKEND_ERROR: "the backend raised while running",
    CRASH: "the backend's process died",
    TIMEOUT: "the backend ran past its time limit",
    REFERENCE_ERROR: "the reference could not run, so the target was not judged (not the target's fault)",
}
