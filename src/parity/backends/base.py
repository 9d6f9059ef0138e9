"""The backend protocol: one way to execute a model, on a device, in a dtype, with options.

A backend receives its *own* copy of the model in `prepare` and may change it freely (move it, cast it,
compile it); nothing is shared with other backends. `run` returns outputs on the CPU, in the model's
own structure, so that the verifier flattens every backend's outputs the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import sys
import tempfile
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.config.schema import MAX_THREADS  # the bound of every backend's `threads` option
from parity.inputs import Inputs
from parity.models.sources import MODEL_KINDS
from parity.offline import state_folder
from parity.outputs import map_tensors

# A Python module, and an exported program's module (a torch module whose forward runs an FX graph: whatever
# takes a module takes it). What a backend that exports, traces or compiles the Python forward runs.
MODULE_KINDS = ("module", "exported")


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ThreadsOptions(BaseModel):
    """The options of a backend whose one setting is how many threads its runtime uses."""

    model_config = ConfigDict(extra="forbid")
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)


def not_installed(module: str, install: str, name: str | None = None) -> str | None:
    """A backend's reason not to run when its library is missing (found without importing it: some take
    seconds to import), else None. `install` is the pip argument that brings it; `name` its pip name."""
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a submodule's parent package is missing (`optimum.intel` without `optimum`)
        found = None
    if found is None:
        return f"{name or module} is not installed (pip install {install})"
    return None


def onnx_file(model: torch.nn.Module) -> Path | None:
    """The ONNX file a model built by `source: onnx` runs (its `onnx_file` attribute), or None for any other
    model: backends that read ONNX graphs (ONNX Runtime, OpenVINO, onnx2torch) take it from the file itself."""
    return getattr(model, "onnx_file", None)


class Backend(ABC):
    name: ClassVar[str]
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    Options: ClassVar[type[BaseModel]] = NoOptions
    # True when `run` executes the modules' Python forward, so module hooks see every layer (tier 2).
    runs_module_hooks: ClassVar[bool] = False
    # How long `prepare` takes, as a rank: 0 nothing much, 1 a trace, 2 an export, 3 a compilation. The
    # ray executor starts the costliest executions first, so that no long one is left to run at the end
    # while the other workers wait.
    preparation_cost: ClassVar[int] = 0
    # Whether `prepare` makes something for inputs like its example (an export, a trace, a compiled graph)
    # that inputs of other shapes may not run: a raise while running such inputs is then `shape_specialized`
    # (execute/execution.py). False for a backend that runs the model's own forward on every call.
    specializes_on_example: ClassVar[bool] = True
    # The distributions (as pip names them) whose versions decide this backend's artifacts: the artifact
    # cache keys on them (execute/cache.py). A plugin's own package and the libraries its model code reaches
    # are found by the cache's walk; a backend that exports with another library names it here.
    libraries: ClassVar[tuple[str, ...]] = ("torch",)
    # What `parity fallback` runs the chosen modules as on this backend in float32 (`backends.fallback_kind`):
    # "eager" (outside a compiled graph), or None when it cannot take modules out of its fast path. A
    # bfloat16/float16 target of any backend can run modules in float32.
    fallback_kind: ClassVar[str | None] = None
    # Process-wide state that `prepare` or `close` resets (compile: "dynamo", whose caches torch._dynamo.reset()
    # clears for every compiled model): two backends that name the same state are never prepared at once, so
    # the timed runs of a job interleave across the others only (execute/execution.py's execute_together).
    resets_state: ClassVar[str | None] = None
    # The devices on which an experiment in the published tool's format (experiment/legacy.py), which names no
    # targets, checks this backend when it is available here.
    legacy_devices: ClassVar[tuple[str, ...]] = ()
    # The kinds of model (models/sources' MODEL_KINDS) this backend runs (default: a Python module).
    model_kinds: ClassVar[tuple[str, ...]] = MODULE_KINDS
    # Options that change only how an artifact is run (a session's settings), not the artifact: left out of its
    # cache key, so that targets that differ only in them share one export.
    session_options: ClassVar[tuple[str, ...]] = ()
    # The `quantize:` schemes this backend runs (backends/quantize.py); an int8 target of another is refused
    # when the experiment is checked. Read from the class's own body only (`schemes_run`): a subclass (torchscript,
    # export of eager) whose `prepare` does not quantize would otherwise inherit them and run float under an int8 id.
    quantize_schemes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def localizes(cls, spec) -> bool:
        """Whether `parity localize` and `parity fallback` can look inside what `spec` runs: its modules, the layers of
        its own artifact, or the tensor groups of a file it converts (TensorTypes). False for a file of the user's run
        as it is, which has neither."""
        return True

    @classmethod
    def schemes_run(cls) -> tuple[str, ...]:
        """The quantize schemes this very class declares it runs (not inherited)."""
        return vars(cls).get("quantize_schemes", ())

    def __init__(self, spec):
        self.spec = spec
        self.options = self.options_of(spec)
        self.device = torch.device(spec.device)
        self.dtype: torch.dtype = getattr(torch, spec.dtype)

    @classmethod
    def options_of(cls, spec) -> BaseModel:
        """The target's `options:`, read by this backend's `Options` (the experiment was checked against them)."""
        return cls.Options.model_validate(spec.options)

    @classmethod
    def available(cls, spec) -> str | None:
        """None when `spec` can run on this machine, else the reason it cannot."""
        return cuda_reason(spec.device)

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        """A problem with this combination of options, device and dtype, found before anything runs."""
        return None

    @classmethod
    def model_problem(cls, spec, kind: str) -> str | None:
        """Why this backend, as `spec` sets it, cannot run a model of `kind` (MODEL_KINDS), or None. Found when
        the experiment is checked; experiment/validate.py adds the backends that can."""
        if kind not in cls.model_kinds:
            return f"backend '{cls.name}' cannot run {MODEL_KINDS.get(kind, kind)}"
        return None

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        """For `parity reduce`: Python lines that run one module the way this backend runs it, with only
        torch and this backend's library. They start from `module` (a private copy on the CPU, as the model
        was built, in eval mode), `args` (a list) and `kwargs` (a dict) as the reference captured them, may call
        `cast(value, device, dtype)` (tensors to the device, floating ones to the dtype; dtype None keeps
        it), and leave the outputs in `out`. None: this backend cannot say how, so reduce writes no script
        rather than one that compares eager with eager."""
        return None

    @abstractmethod
    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        """Take ownership of `model` (a private copy) and get ready to run inputs like `example`."""

    @abstractmethod
    def run(self, inputs: Inputs) -> Any:
        """Outputs for `inputs`, on the CPU."""

    def close(self) -> None:
        """Release what `prepare` made (sessions, compiled graphs, temporary files). Subclasses that
        override it call it too."""
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            scratch.cleanup()
            self._scratch = None

    # What `prepare` found out that the execution record should say, as notes (execute/notes.py shows them
    # beside the warnings): `{"kind": "exporter", "message": ...}`. Set through `note`.
    notes: tuple[dict[str, str], ...] = ()

    def note(self, kind: str, message: str) -> None:
        """Keep something about how this backend prepared the model that no warning says (the ONNX exporter
        fell back to another capture): recorded with the execution and shown beside its check."""
        self.notes = (*self.notes, {"kind": kind, "message": message})

    # Whether `prepare` found its artifact in the cache (None: this backend caches nothing).
    cache_hit: bool | None = None
    # Where `artifact` keeps what it makes: set by the execution layer before `prepare` (execute/execution.py
    # hands over the running model's artifacts in the cache); None: nothing is cached.
    artifacts: ArtifactStore | None = None
    # A quantized target's calibration inputs (its `quantize.calibration` input set, or for a layer alone in tier
    # 2 that layer's inputs in the model's calibration runs): set by the execution layer before `prepare`.
    calibration: list[Inputs] | None = None

    def artifact(self, kind: str, model: torch.nn.Module, example: Inputs, build) -> Path:
        """A folder holding the artifact `kind` (an exported graph, a traced module) of `model` for inputs
        like `example`: from the artifact cache when it has it, else made by `build(folder)` (and cached
        when the model has an identity; see execute/cache.py). What building it warned of (a tracer's
        "might cause the trace to be incorrect", an exporter's warnings) and noted (`note`) is kept beside it
        and said again each time it is used, so that an artifact from the cache says what a fresh one says."""
        build = self._recording(build)
        found = self.artifacts.fetch(kind, model, self, example, build) if self.artifacts is not None else None
        if found is not None:
            folder, hit = found
            self.cache_hit = hit if self.cache_hit is None else self.cache_hit and hit
        else:
            if getattr(self, "_scratch", None) is None:
                self._scratch = tempfile.TemporaryDirectory(prefix=f"{self.name}-", dir=state_folder())
            folder = Path(self._scratch.name) / kind
            folder.mkdir()
            build(folder)
        self._say_again(folder)
        return folder

    def _recording(self, build: Callable[[Path], None]) -> Callable[[Path], None]:
        """`build`, what it warns of and notes written to the artifact's folder instead (`_say_again` says them)."""

        def build_recording(folder: Path) -> None:
            before = self.notes
            with warnings.catch_warnings(record=True) as caught:
                build(folder)
            noted, self.notes = self.notes[len(before):], before
            kept = [{"message": str(w.message), "category": f"{w.category.__module__}:{w.category.__qualname__}",
                     "filename": w.filename, "lineno": w.lineno} for w in caught[:MAX_BUILD_WARNINGS]]
            (folder / BUILD_RECORD).write_text(json.dumps({"warnings": kept, "notes": list(noted)}))

        return build_recording

    def _say_again(self, folder: Path) -> None:
        """What building the artifact in `folder` warned of, warned again where it was warned first, and what
        it noted, noted again."""
        path = folder / BUILD_RECORD
        record = BuildRecord.model_validate_json(path.read_text()) if path.exists() else BuildRecord()
        for w in record.warnings:
            module, _, name = w.category.partition(":")
            # a name read from a cache entry: looked up among the modules imported already, never imported
            category = getattr(sys.modules.get(module), name, None)
            if not (isinstance(category, type) and issubclass(category, Warning)):
                category = UserWarning
            warnings.warn_explicit(w.message, category, w.filename, w.lineno)
        for note in record.notes:
            self.note(note.kind, note.message)


BUILD_RECORD = "build-record.json"  # beside an artifact: what building it warned of and noted


class BuiltWarning(BaseModel):
    """A warning building an artifact raised, as BUILD_RECORD keeps it (`category`: 'module:QualName')."""

    model_config = ConfigDict(strict=True, frozen=True)
    message: str
    category: str
    filename: str
    lineno: int


class BuiltNote(BaseModel):
    """A note a backend kept while building an artifact (`Backend.note`)."""

    model_config = ConfigDict(strict=True, frozen=True)
    kind: str
    message: str


class BuildRecord(BaseModel):
    """What building an artifact warned of and noted (BUILD_RECORD beside it), validated once where it is read."""

    model_config = ConfigDict(strict=True, frozen=True)
    warnings: tuple[BuiltWarning, ...] = ()
    notes: tuple[BuiltNote, ...] = ()
MAX_BUILD_WARNINGS = 100


class ArtifactStore(Protocol):
    """What a backend keeps its artifacts in (execute/cache.py's ModelArtifacts is the one parity uses)."""

    def fetch(self, kind: str, model: torch.nn.Module, backend: Backend, example: Inputs,
              build: Callable[[Path], None]) -> tuple[Path, bool] | None:
        """(folder, whether it was there) of the artifact, made by `build(folder)` when missing; None when it
        may not be kept."""


@dataclass(frozen=True)
class Decoded:
    """What a cached decoding returns: `tokens` [B, steps] int64, the token fed after each step (its own greedy
    choice, or the forced one); `logits` [B, steps, vocab] float32 on the CPU, step i's next-token logits (step 0:
    after the prefill over the prompt; step i > 0: after feeding tokens[:, i - 1] through the cache); `cache` the KV
    cache at the end, each layer's (keys, values) [B, heads, positions, head_dim] float32 on the CPU, where the
    decoding runs a cache in this process that parity can read (eager, compile); None where the runtime keeps it in
    another process and does not expose it (ONNX Runtime GenAI, OpenVINO, llama.cpp)."""

    tokens: torch.Tensor
    logits: torch.Tensor
    cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None


@runtime_checkable
class CachedDecoding(Protocol):
    """A capability: a backend that decodes as a language model is deployed, a prefill over the prompt and then one
    token at a time through its KV cache (detected with isinstance, as every optional capability should be)."""

    def decode(self, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None) -> Decoded:
        """`steps` tokens after `prompt` ([B, T] int64 ids, no padding) from this backend's prepared artifact;
        greedy, or with `forced` ([B, steps]) fed the forced tokens instead of its own choices (teacher forcing
        through the cache), so that every step compares with the reference's at the same position."""


@dataclass(frozen=True)
class TensorGroup:
    """A group of the tensors of a file a backend runs (a GGUF's `blk.3.ffn`: its gate, up and down projections),
    with the type they have in it and their bytes."""

    name: str
    tensors: tuple[str, ...]
    type: str
    nbytes: int


# Optional capabilities: a backend has one when its class defines the methods (isinstance on a backend, issubclass on
# its class; a subclass that sets a method to None has it not). Tier 2 and the execution ask for them; nothing else.

@runtime_checkable
class CapturesLayers(Protocol):
    """A capability: tier 2's propagated mode reads layer outputs from inside this backend's own run (a backend that
    `runs_module_hooks` is read through hooks instead). ONNX Runtime."""

    def capture_layers(self, model: torch.nn.Module, example: Inputs, names: list[str],
                       inputs: Inputs | None = None) -> dict[str, list | str]:
        """Each named module's outputs (one per call) inside one run of this backend on `inputs` (None:
        `example`), prepared from `example` as `prepare` is, or a string saying why that module's cannot be
        seen."""


@runtime_checkable
class SlicesLayers(Protocol):
    """A capability: tier 2's local mode runs each layer (and a parent's own code) as a slice of the one artifact of
    the whole model instead of preparing every layer alone (which stays the fallback for layers it cannot slice).
    ONNX Runtime."""

    def slice_layers(self, model: torch.nn.Module, example: Inputs,
                     layers: dict[str, list[tuple[Inputs, Any]]]) -> dict[str, list[Any] | str]:
        """Each named module alone on this backend, cut from the artifact of the whole `model` prepared from `example`:
        for each of its calls (the inputs it was fed, the output whose structure the result takes), its output; or a
        string saying why that module cannot be cut out (the caller then prepares it alone)."""

    def slice_own_code(self, model: torch.nn.Module, example: Inputs, parent: str, call: tuple[Inputs, Any],
                       members: dict[str, list[tuple[Inputs, Any]]]) -> dict[str, list[tuple[Any, Any]]] | str:
        """The own code of `parent` (what it computes between its `members`) cut from the same artifact, fed the
        parent's recorded call and each member's recorded outputs: (reference, target) pairs of what it returns (under
        `parent`) and hands each member (under the member's name); or why it cannot be cut out."""


@runtime_checkable
class RunsLayersTogether(Protocol):
    """A capability: tier 2's local mode prepares a level's layers as one artifact in which each is fed its own
    recorded inputs (compile: one compilation instead of one per layer)."""

    def run_layers_together(self, model: torch.nn.Module, layers: dict[str, list[Inputs]]) -> dict[str, list[Any]]:
        """Each named module of `model` on this backend, prepared side by side with the others as one artifact in which
        nothing flows from one to another: for each of its calls (the inputs it was fed), its output. Raises when they
        cannot be prepared together (the caller then prepares each alone)."""


@runtime_checkable
class BisectsCompiler(Protocol):
    """A capability of a compiler backend: tier 2 asks it for the compiler pass behind a drift no layer makes alone
    (compile: torch's CompilerBisector)."""

    @classmethod
    def compiler_pass(cls, spec, passes: Callable[[], bool], budget_s: float) -> dict[str, Any] | None:
        """The compiler subsystem and pass that makes `passes()` (the check passes at the gate) false, as a record
        (`backend`, `subsystem`, `application`, `switch`: the setting that removes it), found in at most about
        `budget_s` seconds; None when `spec` has no passes to bisect."""


@runtime_checkable
class OwnTokenizer(Protocol):
    """A capability: the backend brings its own tokenizer (a GGUF file's, run by llama.cpp): a text input set is then
    tokenized by both sides, and different ids are a failure of their own (verify/tokenizers.py); the logits are
    still compared on the reference's ids."""

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """The ids this backend's own tokenizer gives each text, with the special tokens its model adds."""

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each id's text, as this backend's own tokenizer writes it."""


@runtime_checkable
class TensorTypes(Protocol):
    """A capability: a backend that runs a file of typed tensors (llama.cpp's GGUF) and can run it again with chosen
    tensor groups kept at another type, so that localization and fallback speak of its tensors and their types
    (runner/tensor_types.py) where they cannot look inside a module."""

    def tensor_groups(self) -> list[TensorGroup]:
        """The prepared file's tensor groups, in file order."""

    def keep(self, groups: list[str], type: str) -> int:
        """Run, from now on, the prepared file with the tensors of `groups` at `type` instead (none: the file as
        prepared); returns the bytes of the file it now runs."""


class OutputSpec:
    """The structure of a model's output (from one eager run of the backend's own copy), to rebuild it
    around the flat tensors that exported or traced programs return. Non-tensor leaves (None, numbers)
    are not in those programs; they are taken from that run and named in `constants`."""

    def __init__(self, model: torch.nn.Module, example: Inputs):
        from torch.utils._pytree import tree_flatten

        with torch.no_grad():
            leaves, self.spec = tree_flatten(model(*example.args, **example.kwargs))
        self.tensor_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.constants = {i: leaf for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor)}

    def rebuild(self, tensors: list[torch.Tensor], who: str) -> Any:
        from torch.utils._pytree import tree_unflatten

        if len(tensors) != len(self.tensor_positions):
            raise RuntimeError(f"{who} returns {len(tensors)} tensors; the model returns {len(self.tensor_positions)}")
        leaves: list[Any] = [None] * self.spec.num_leaves
        for i, value in self.constants.items():
            leaves[i] = value
        for i, tensor in zip(self.tensor_positions, tensors, strict=True):
            leaves[i] = tensor
        return tree_unflatten(leaves, self.spec)


def release_memory() -> None:
    """Hand memory that is free but still held back to the system: what a closed backend freed (an ONNX Runtime
    session's weights and buffers, an export's graphs) stays in the C allocator's heap, where it still counts in
    the process's resident memory, and the next step's peak starts above it (docs/benchmarks.md, issue 29: 170 MB
    after the gate check's session). glibc's malloc_trim returns the free pages (no-op on other C libraries); it
    takes well under a millisecond. What is freed only by the cycle collector must be collected first
    (gc.collect, about 0.2 s with torch loaded: after an export, whose graph is made of cycles)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def cuda_reason(device: str) -> str | None:
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine (torch.cuda.is_available() is False)"
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            return f"{device} does not exist ({torch.cuda.device_count()} CUDA device(s))"
    return None


def to_cpu(outputs: Any) -> Any:
    """Outputs as CPU copies: a model may return its input or a buffer it later writes into again."""
    return map_tensors(outputs, lambda t: t.detach().to("cpu", copy=True))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def runtime_threads(told: int | None) -> int:
    """Threads for a runtime with a pool of its own (ONNX Runtime, OpenVINO): as told, else as many as torch
    uses here, which is what the reference gets and a Ray task's CPUs (their own default is every core)."""
    return told or torch.get_num_threads()


@contextlib.contextmanager
def num_threads(n: int | None):
    """Run with `n` intra-op threads, then restore the process setting."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def tf32(enabled: bool | None):
    """Allow (or forbid) TensorFloat-32 in CUDA float32 convolutions and matmuls, then restore. PyTorch
    allows it in convolutions by default: on Ampere and later GPUs a float32 CUDA target then computes
    convolutions with 10-bit mantissas, a drift of ~1e-3 that no float32 CPU backend shows."""
    if enabled is None:
        yield
        return
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
