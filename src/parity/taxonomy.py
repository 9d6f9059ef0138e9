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
TOKENIZER_MISMATCH = "tokenizer_mismatch"  # the target's own tokenizer gives other ids for the same text
CRASH = "crash"
TIMEOUT = "timeout"
REFERENCE_ERROR = "reference_error"  # the reference could not run: no verdict about the target

SEVERITY = [
    REFERENCE_ERROR, CRASH, TIMEOUT, UNSUPPORTED_OP, SHAPE_SPECIALIZED, BACKEND_ERROR, TOKENIZER_MISMATCH, STRUCTURE_MISMATCH, SHAPE_MISMATCH, DTYPE_MISMATCH,
    UNCOMPARABLE, NONFINITE, NONDETERMINISTIC, DECISION_FLIP, ORDERING, NUMERIC_DRIFT,
]

PREPARE, RUN = "prepare", "run"  # the phases of an execution that raise (compare's classes come from verify)

# Libraries that capture a model into another form (export, trace, convert). What they raise while a backend is
# prepared says the backend cannot express the model: `unsupported_op`. Told by the raising exception's type (its
# module) or, for an error raised in C++ under them (a RuntimeError), by the Python file that called into it.
# torch._functorch: AOTAutograd, which traces torch.export's graph and refuses an output it cannot flatten (a decoder's
# DynamicCache with `use_cache: true`, which the ONNX exporter and the tracer refuse too: one class on every target).
CAPTURE = ("torch._dynamo", "torch.export", "torch._export", "torch.onnx", "torch.jit", "torch.fx", "torch._functorch",
           "torch._subclasses", "torch._higher_order_ops", "onnxscript", "openvino", "executorch", "torch_tensorrt")
# Compilers that lower a captured graph: what they raise is the backend failing on a graph it accepted.
COMPILER = ("torch._inductor",)
# Runtimes' own "this operator is not implemented" errors, as types (a missing kernel is a NotImplementedError).
MISSING_OP = ("onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented",)


class WorkerDied(RuntimeError):
    """What a backend raises when the process it runs its runtime in died (a segfault, an abort in C): the backend's
    process died, so the execution is a `crash`, as when parity's own worker process dies (runner/process.py)."""


def most_severe(classes) -> str | None:
    present = [c for c in classes if c]
    return min(present, key=SEVERITY.index) if present else None


def _chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__  # what wrapped it on purpose (an exporter's error raised from the tracer's)
    return chain


def _library(exc: BaseException) -> str:
    """Where `exc` comes from, as a dotted name: its type's module, or for a builtin type (an error raised in C++),
    the module of the innermost Python frame that raised it (torch/jit/_trace.py -> torch.jit._trace)."""
    module = type(exc).__module__
    if module != "builtins":
        return f"{module}.{type(exc).__qualname__}"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    inside = path.rsplit("/site-packages/", 1)[-1]
    return inside.removesuffix(".py").replace("/", ".")


def _from(name: str, libraries: tuple[str, ...]) -> bool:
    return any(name == lib or name.startswith(lib + ".") for lib in libraries)


def classify_exception(exc: BaseException, phase: str) -> str:
    """The class of what a backend raised, by the phase that failed and the library that raised (never by words in
    a message): a runtime's own process that died (WorkerDied) is `crash`; a missing operator or kernel (NotImplementedError, a runtime's NotImplemented) is `unsupported_op`
    in any phase; while preparing, an error from a capture library (export, trace, conversion) is `unsupported_op`,
    unless a compiler lowering the captured graph raised it; anything else is `backend_error`."""
    chain = _chain(exc)
    if any(isinstance(e, WorkerDied) for e in chain):
        return CRASH
    names = [_library(e) for e in chain]
    if any(isinstance(e, NotImplementedError) for e in chain) or any(_from(n, MISSING_OP) for n in names):
        return UNSUPPORTED_OP
    if phase == PREPARE and not any(_from(n, COMPILER) for n in names) and any(_from(n, CAPTURE) for n in names):
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
    UNSUPPORTED_OP: "the backend cannot express the model (an export, trace or conversion refused it while it was "
                    "prepared, or a kernel is missing)",
    SHAPE_SPECIALIZED: "prepared (exported, traced) from inputs of other shapes, the artifact cannot run these",
    BACKEND_ERROR: "the backend raised while running, or while prepared but not from a capture (a compiler failed)",
    CRASH: "the backend's process died",
    TOKENIZER_MISMATCH: "the target's own tokenizer (a GGUF file's) gives other token ids for the same text than the "
                        "reference's (the logits are still compared on the reference's ids)",
    TIMEOUT: "the backend ran past its time limit",
    REFERENCE_ERROR: "the reference could not run, so the target was not judged (not the target's fault)",
}
