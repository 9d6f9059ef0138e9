"""The experiment file, as pydantic models. Unknown keys are rejected everywhere.

This module checks shape and types only; names that need the file system or a library (backends' options,
torchvision builders, files) are checked in `experiment.validate`. What a plugin owns (a model source's keys, a
task's thresholds, an adapter's and an executor's settings) is validated by the plugin's own spec, which
the registries in `parity.plugins` find when a file is validated (`plugin_spec`).

Numbers are bounded so that a typo cannot ask for a day of work or a terabyte of memory (`MAX_*`), every
float is finite, and every name that identifies something in records (experiment, model, input set,
target) is a plain name that can also be a file name: no `/`, no `..`, nothing that leaves a folder.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    PrivateAttr,
    SerializeAsAny,
    StrictFloat,
    StrictInt,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from parity.config.tolerances import DEFAULT_SWEEP, FLOAT_RTOL, Tolerance
from parity.config.tolerances import resolve as resolve_tolerance
from parity.dtypes import DTYPES, QUANTIZE_SCHEMES
from parity.errors import ParityError, did_you_mean
from parity.files import PACKAGE_SCHEME, user_path
from parity.plugins import ADAPTERS, EXECUTORS, SOURCES, TASKS
from parity.records.keys import gate_atol

MAX_REPEATS = 1000
MAX_ELEMENTS = 2**28  # per input set: 1 GiB of float32, more than any model test needs
MAX_DIMS = 16
MAX_IMAGE_SIDE = 16384
MAX_SEED = 2**63 - 1
MAX_THREADS = 1024  # a `threads` setting beyond this is a typo, and would try to start that many threads
MAX_NAME = 100
_NAME = re.compile(r"\w[\w.+-]*")  # a letter, digit or _ first; then also . + -


def check_name(name: str) -> str:
    """A name used in records, tables and file names: letters, digits, `_ . + -`, not starting with `.`
    or `-`, so it can never be `..`, a path or an option."""
    if not 1 <= len(name) <= MAX_NAME or not _NAME.fullmatch(name):
        raise ValueError(f"{name[:MAX_NAME]!r} is not a plain name: use 1-{MAX_NAME} letters, digits and _ . + -, "
                         "starting with a letter, digit or _ (names appear in records and file names)")
    return name


Name = Annotated[str, AfterValidator(check_name)]


def plain_name(text: str, fallback: str) -> str:
    """`text` made into a valid name (a file stem, an image stem): other characters become `_`."""
    name = re.sub(r"[^\w.+-]", "_", text).lstrip(".+-")[:MAX_NAME]
    return name or fallback


_REMOTE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://|(github|gh|hf|huggingface|hub|torchhub):)", re.IGNORECASE)


def local_path(ref: str) -> str:
    """A path on this machine. URLs and hub references are refused: parity never downloads (a run works
    offline and is the same tomorrow)."""
    if _REMOTE.match(ref) and not ref.startswith(PACKAGE_SCHEME):  # a file an installed package ships (files.py)
        raise ValueError(f"{ref!r} is a URL or hub reference, and parity does not download; fetch it yourself "
                         "and give the local path")
    return ref


LocalPath = Annotated[str, AfterValidator(local_path)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _error(loc: tuple, kind: str, message: str, value: Any) -> ValidationError:
    """A validation error at `loc` (relative to the value being validated), as pydantic would raise it."""
    return ValidationError.from_exception_data("parity", [
        {"type": PydanticCustomError(kind, message), "loc": loc, "input": value}])


def _not_a_mapping(value: Any) -> ValidationError:
    return ValidationError.from_exception_data("parity", [
        {"type": "model_type", "loc": (), "input": value, "ctx": {"class_name": "mapping"}}])


def plugin_spec(registry, key: str, default: str | None, base: type[BaseModel]):
    """A validator that hands a mapping to the spec class of the plugin its `key` names (`source: repo` to
    the repo source's spec): each plugin owns its keys. The plugin is looked up in `registry` when a file is
    validated, not when this module is imported, so a plugin put on the path later (and `refresh`ed) counts."""

    def validate(value: Any) -> BaseModel:
        if isinstance(value, base):
            return value
        if not isinstance(value, dict):
            raise _not_a_mapping(value)
        name = value.get(key, default)
        if name is None:
            raise _error((key,), "missing", "required key is missing", value)
        if not isinstance(name, str) or ":" in name:
            raise _error((key,), "plugin", f"expected the name of a registered {registry.kind}, got {name!r}", name)
        try:
            spec_class = registry.get(name).Spec
        except ParityError as exc:
            if name in registry.names():
                raise  # a registered plugin that cannot be loaded: its own message, as is
            raise _error((key,), "plugin", exc.problems[0], name) from None
        return spec_class.model_validate(value)

    return validate


def spec_class_for(annotation: Any, value: Any) -> type[BaseModel] | None:
    """The spec class a plugin-dispatched field gives `value` (for messages listing the allowed keys)."""
    for meta in getattr(annotation, "__metadata__", ()):
        lookup = getattr(getattr(meta, "func", None), "spec_class", None)
        if lookup is not None:
            return lookup(value)
    return None


def _dispatched(registry, key: str, default: str | None, base: type[BaseModel]):
    validate = plugin_spec(registry, key, default, base)

    def spec_class(value: Any) -> type[BaseModel] | None:
        name = value.get(key, default) if isinstance(value, dict) else None
        try:
            return registry.get(name).Spec if isinstance(name, str) and ":" not in name else None
        except ParityError:
            return None

    validate.spec_class = spec_class
    return PlainValidator(validate, json_schema_input_type=base)


class ModelSpecBase(Strict):
    """What every model spec has, whatever its source. A source plugin subclasses it with its own keys and
    `source: Literal["<its name>"]` (models/sources/); `models[i]` is validated by the spec of its source."""

    name: Name
    source: str
    weights: LocalPath | None = None
    init: Literal["default", "fan_in"] = "default"
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)  # this model's init seed; None: the experiment's
    params: dict[str, Any] = Field(default_factory=dict)
    task: str = "other"  # a registered task (tier 3 evaluates it) or `other`
    inputs: list[str] | None = Field(default=None, min_length=1)
    export_inputs: str | None = None  # the input set every backend is prepared from; None: the model's first
    batch: Literal["stack", "list"] | None = None
    adapters: list[AnyAdapterSpec] | None = None  # this model's own; None: the experiment's

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapter_names(cls, value: Any) -> Any:
        return adapter_names(value)

    @model_validator(mode="before")
    @classmethod
    def _other_sources_keys_unset(cls, value: Any) -> Any:
        """Another source's key left null (`entry: null` under torchvision) says nothing and is dropped, as
        when every source's keys were in one spec; the experiments recorded then (a run record's `config`)
        hold them all."""
        if not isinstance(value, dict):
            return value
        others = {k for name in SOURCES.names() for k in SOURCES.get(name).Spec.model_fields} - set(cls.model_fields)
        return {k: v for k, v in value.items() if not (v is None and k in others)}

    @field_validator("task")
    @classmethod
    def _task(cls, task: str) -> str:
        known = [*TASKS.names(), "other"]
        if task not in known:
            raise ValueError(f"unknown task '{task}'{did_you_mean(task, known)} (known: {', '.join(known)})")
        return task

    @model_validator(mode="after")
    def _common(self) -> ModelSpecBase:
        if self.inputs is not None and len(set(self.inputs)) != len(self.inputs):
            raise ValueError("'inputs' names an input set twice")
        if self.init != "default" and self.weights is not None:
            raise ValueError("'init' applies only to a seeded init (weights: null)")
        if self.seed is not None and self.weights is not None:
            raise ValueError("'seed' applies only to a seeded init (weights: null)")
        return self

    def init_seed(self, experiment_seed: int) -> int:
        """The seed this model's weights are drawn with: its own, else the experiment's."""
        return experiment_seed if self.seed is None else self.seed

    @property
    def batch_mode(self) -> str:
        """How images are handed over: one stacked batch, or a list of CHW tensors (a task's default)."""
        if self.batch:
            return self.batch
        if self.task == "other":
            return "stack"
        return TASKS.get(self.task).batch


# A model spec: validated by the spec of the source it names (default torchvision).
ModelSpec = Annotated[SerializeAsAny[ModelSpecBase], _dispatched(SOURCES, "source", "torchvision", ModelSpecBase)]


def model_spec(data: dict[str, Any]) -> ModelSpecBase:
    """One `models[i]` entry, validated as the experiment file validates it."""
    return TypeAdapter(ModelSpec).validate_python(data)


class Preprocess(Strict):
    """Numbers in input specs are strict: `true` is not 1, `2.0` is not a size, `"8"` is not 8. Lax
    coercion would silently turn a typo into a different input."""

    resize: list[StrictInt] | None = Field(default=None, min_length=1, max_length=2)  # [S] = shorter side, [H, W]
    center_crop: list[StrictInt] | None = Field(default=None, min_length=1, max_length=2)  # [S] = square
    resize_multiple: StrictInt | None = Field(default=None, gt=0, le=MAX_IMAGE_SIDE)
    mean: list[StrictFloat] | None = None
    std: list[StrictFloat] | None = None

    @field_validator("resize", "center_crop", mode="before")
    @classmethod
    def _size_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, int | float) else value

    @field_validator("resize", "center_crop")
    @classmethod
    def _positive_size(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(v <= 0 or v > MAX_IMAGE_SIDE for v in value):
            raise ValueError(f"sizes must be between 1 and {MAX_IMAGE_SIDE} pixels")
        return value

    @model_validator(mode="after")
    def _mean_std(self) -> Preprocess:
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both 'mean' and 'std', or neither")
        if self.std is not None and any(s == 0 for s in self.std):
            raise ValueError("'std' must not contain 0")
        return self


class Synthetic(Strict):
    """One seeded tensor. Numbers are strict (see Preprocess), and `low`/`high` must fit the dtype:
    a randint's bounds are integers within its range (int32 would wrap 2**40 to negative values) and
    exact in it (a float16 randint above 2048 would round), a uniform's bounds are finite in it."""

    shape: list[StrictInt] = Field(min_length=1, max_length=MAX_DIMS)
    dtype: Literal[(*DTYPES, "int64", "int32", "bool")] = "float32"
    distribution: Literal["normal", "uniform", "randint", "zeros", "ones"] = "normal"
    low: StrictFloat = Field(default=0.0, ge=-1e15, le=1e15)
    high: StrictFloat = Field(default=1.0, ge=-1e15, le=1e15)
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(d <= 0 for d in shape):
            raise ValueError("every dimension must be positive")
        if math.prod(shape) > MAX_ELEMENTS:
            raise ValueError(f"{math.prod(shape)} elements is more than parity builds ({MAX_ELEMENTS} per input set)")
        return shape

    @model_validator(mode="after")
    def _integer_draws(self) -> Synthetic:
        integral = self.dtype in ("int64", "int32")
        if integral and self.distribution in ("normal", "uniform"):
            raise ValueError(f"dtype {self.dtype} needs distribution randint (with low and high), zeros or ones")
        if self.distribution == "randint" and self.dtype != "bool" and "high" not in self.model_fields_set:
            raise ValueError("distribution randint needs 'high' (exclusive) and, if not 0, 'low'")
        if self.distribution in ("uniform", "randint") and self.high <= self.low:
            raise ValueError("'high' must be greater than 'low'")
        if self.distribution == "randint" and self.dtype != "bool":
            self._randint_bounds()
        if self.distribution == "uniform":
            top = _FLOAT_MAX[self.dtype]
            if max(abs(self.low), abs(self.high)) > top:
                raise ValueError(f"'low' and 'high' must lie within {self.dtype}'s range (+-{top:g}); "
                                 f"beyond it the draw is Inf")
        return self

    def _randint_bounds(self) -> None:
        """randint draws integers in [low, high): both integers, every value representable in the dtype."""
        for key in ("low", "high"):
            if getattr(self, key) != int(getattr(self, key)):
                raise ValueError(f"randint draws integers: '{key}' {getattr(self, key)!r} is not a whole number")
        low, largest = int(self.low), int(self.high) - 1
        smallest_ok, largest_ok = _RANDINT_RANGE[self.dtype]
        if low < smallest_ok or largest > largest_ok:
            raise ValueError(f"randint {self.dtype} draws from {low} to {largest}; {self.dtype} holds integers "
                             f"from {smallest_ok} to {largest_ok} exactly ('high' is exclusive)")


# The integers each dtype holds exactly (floats: up to 2**(mantissa bits + 1)), and the floats' largest finite values.
_RANDINT_RANGE = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "float16": (-2**11, 2**11),
                  "bfloat16": (-2**8, 2**8), "float32": (-2**24, 2**24), "float64": (-2**53, 2**53)}
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
              "float64": 1.7976931348623157e308, "int32": math.inf, "int64": math.inf, "bool": math.inf}


def _synthetic_kind(value: Any) -> str:
    """One spec (a mapping with spec keys), several positional specs (a list), or named specs (a mapping
    of names to specs): deciding up front keeps error messages to the branch the user meant."""
    if isinstance(value, list):
        return "list[Synthetic]"
    if isinstance(value, dict) and value and all(isinstance(v, dict | Synthetic) for v in value.values()):
        return "dict[str,Synthetic]"
    return "Synthetic"


def _keyword(name: str) -> str:
    if not name.isidentifier():
        raise ValueError(f"{name!r} is not a keyword argument name (letters, digits and _, not starting with a digit)")
    return name


SyntheticSpec = Annotated[
    Annotated[Synthetic, Tag("Synthetic")] | Annotated[list[Synthetic], Tag("list[Synthetic]"), Field(min_length=1)]
    | Annotated[dict[Annotated[str, AfterValidator(_keyword)], Synthetic], Tag("dict[str,Synthetic]")],
    Discriminator(_synthetic_kind),
]


class PackageFile(Strict):
    """A file an installed package bundles: `package` (an importable name, found without importing it) and its
    `path` inside the package's folder."""

    package: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=200)
    path: str = Field(min_length=1, max_length=500)


class InputSetSpec(Strict):
    name: Name
    images: list[LocalPath] | None = Field(default=None, max_length=10_000)
    preprocess: Preprocess = Field(default_factory=Preprocess)
    synthetic: SyntheticSpec | None = None
    text: list[Annotated[str, Field(max_length=100_000)]] | None = Field(default=None, min_length=1, max_length=10_000)
    # A text read from a file and cut into windows of `n_ctx` tokens as llama-perplexity cuts it (inputs/text.py):
    # a path (UTF-8 text) or {package, path}: a file an installed package bundles (a .py file: its string literals).
    text_file: LocalPath | PackageFile | None = Field(default=None, union_mode="left_to_right")
    n_ctx: int | None = Field(default=None, strict=True, ge=4, le=1_000_000)  # tokens per window (--ctx-size)
    windows: int | None = Field(default=None, strict=True, gt=0, le=100_000)  # how many (default: all that fit)
    tokenizer: LocalPath | None = None  # the folder a transformers tokenizer was saved to, or a .gguf file (text only)
    audio: list[LocalPath] | None = Field(default=None, min_length=1, max_length=10_000)  # PCM WAV files
    sample_rate: int | None = Field(default=None, strict=True, gt=0, le=1_000_000)  # what every audio file must have
    samples: int | None = Field(default=None, strict=True, gt=0, le=MAX_ELEMENTS)  # each clip cut or padded to this
    tensors: LocalPath | None = None  # saved tensors (.npy, .npz, .safetensors, .pt): inputs/tensors.py

    @model_validator(mode="after")
    def _one_kind(self) -> InputSetSpec:
        kinds = (self.images, self.synthetic, self.text, self.text_file, self.audio, self.tensors)
        if sum(kind is not None for kind in kinds) != 1:
            raise ValueError("an input set needs exactly one of 'images', 'synthetic', 'text', 'text_file', 'audio' "
                             "or 'tensors'")
        if self.images is not None and not self.images:
            raise ValueError("'images' is empty")
        if (self.text is None and self.text_file is None) != (self.tokenizer is None):
            raise ValueError("'text' and 'text_file' need 'tokenizer' (a local tokenizer folder), and 'tokenizer' is "
                             "for them only")
        if (self.text_file is None) != (self.n_ctx is None):
            raise ValueError("'text_file' needs 'n_ctx' (the tokens of each window), and 'n_ctx' is for 'text_file' "
                             "only")
        if self.windows is not None and self.text_file is None:
            raise ValueError("'windows' is for 'text_file' only")
        if self.n_ctx is not None and self.n_ctx * (self.windows or 1) > MAX_ELEMENTS:
            raise ValueError(f"{self.windows} windows of {self.n_ctx} tokens are more than parity builds "
                             f"({MAX_ELEMENTS} per input set)")
        if (self.audio is None) != (self.sample_rate is None):
            raise ValueError("'audio' needs 'sample_rate' (every file must have it: parity does not resample), and "
                             "'sample_rate' is for 'audio' only")
        if self.samples is not None and self.audio is None:
            raise ValueError("'samples' is for 'audio' only")
        if self.audio is not None and self.samples is not None and len(self.audio) * self.samples > MAX_ELEMENTS:
            raise ValueError(f"its clips hold {len(self.audio) * self.samples} samples together, more than parity "
                             f"builds ({MAX_ELEMENTS} per input set)")
        if self.synthetic is not None:
            specs = self.synthetic.values() if isinstance(self.synthetic, dict) else (
                self.synthetic if isinstance(self.synthetic, list) else [self.synthetic])
            total = sum(math.prod(s.shape) for s in specs)
            if total > MAX_ELEMENTS:
                raise ValueError(f"its tensors hold {total} elements together, more than parity builds "
                                 f"({MAX_ELEMENTS} per input set)")
        return self


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class OutputTolerance(Strict):
    """The tolerance of the output leaves a rule names (`tolerances.outputs`): its own atol (judged at it
    whatever the sweep) and/or its own rtol."""

    atol: float | None = Field(default=None, ge=0)
    rtol: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _something(self) -> OutputTolerance:
        if self.atol is None and self.rtol is None:
            raise ValueError("an output rule sets atol, rtol or both")
        return self


Gate = float | Literal["tier3"] | None
OutputRules = dict[Annotated[str, Field(min_length=1, max_length=500)], OutputTolerance]


class GateAndRules(Strict):
    """What the experiment's and a target's tolerances share: the gate (an atol, or `tier3`: the task-level
    verdict decides) and the output rules."""

    gate: Gate = Field(default=None, union_mode="left_to_right")
    outputs: OutputRules = Field(default_factory=dict, max_length=100)

    @field_validator("gate", mode="before")
    @classmethod
    def _gate(cls, gate: Any) -> Any:
        """Before validation, so that a wrong gate gets one message rather than one per member of the union."""
        if gate is None or gate == "tier3":
            return gate
        if isinstance(gate, bool) or not isinstance(gate, int | float):
            raise ValueError(f"the gate is a number (an atol) or 'tier3', not {str(gate)[:50]!r}")
        if not math.isfinite(gate) or gate < 0:
            raise ValueError("the gate must be >= 0 and finite (or 'tier3')")
        return float(gate)


class Tolerances(GateAndRules):
    atol: list[float] = Field(default_factory=lambda: list(DEFAULT_SWEEP), min_length=1, max_length=100)
    rtol: float = Field(default=FLOAT_RTOL, ge=0)

    @field_validator("atol", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, int | float | str) else value

    @field_validator("atol")
    @classmethod
    def _sorted(cls, atol: list[float]) -> list[float]:
        if any(a < 0 for a in atol):
            raise ValueError("tolerances must be >= 0")
        return sorted(set(atol))

    @property
    def gate_atol(self) -> float:
        """The atol that decides tier 1's pass/fail: `gate`, else 1e-4 when swept, else the largest."""
        return gate_atol(self.gate, self.atol)


class TargetTolerances(GateAndRules):
    """A target's own tolerances (`targets[i].tolerances`): what it gives wins over the experiment's and
    over its dtype's default. The sweep stays the experiment's, so that every target is swept over the same
    atols and the sweep's table compares like with like."""

    rtol: float | None = Field(default=None, ge=0)


class QuantizeSpec(Strict):
    """`quantize:` of a target: int8 (int4 weights: torchao-int4-weight) by a scheme, calibrated (static schemes) on an input set of the experiment."""

    scheme: Literal[tuple(QUANTIZE_SCHEMES)]
    calibration: Name | None = None  # an input set's name; the PT2E schemes need one

    @model_validator(mode="after")
    def _calibrated(self) -> QuantizeSpec:
        calibrated = QUANTIZE_SCHEMES[self.scheme].calibrated
        if calibrated and self.calibration is None:
            raise ValueError(f"scheme {self.scheme} quantizes activations with ranges observed on data: give "
                             "`calibration: INPUT_SET`")
        if not calibrated and self.calibration is not None:
            raise ValueError(f"scheme {self.scheme} observes no data (weights only, or activations quantized as they "
                             "come): remove `calibration`")
        return self


class BackendSpec(Strict):
    backend: str = Field(min_length=1)
    device: str = "cpu"
    dtype: Literal[DTYPES] = "float32"
    name: Name | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    fallback: list[str] = Field(default_factory=list)  # modules run outside the fast path (parity fallback)
    tolerances: TargetTolerances | None = None  # this target's own (see config/tolerances.py)
    quantize: QuantizeSpec | None = None  # an int8 target (backends/quantize.py)

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if not _DEVICE.match(device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', not '{device}'")
        return device

    @property
    def id(self) -> str:
        """The name used in records: `name`, else backend-device[-dtype]."""
        if self.name:
            return self.name
        backend = self.backend.rpartition(":")[2] if ":" in self.backend else self.backend
        suffix = "" if self.dtype == "float32" else f"-{self.dtype}"
        if self.quantize is not None:
            suffix += f"-{QUANTIZE_SCHEMES[self.quantize.scheme].word}"
        return f"{backend}-{self.device.replace(':', '')}{suffix}"


class Oracle(Strict):
    enabled: bool = True
    multiplier: float = Field(default=2.0, gt=0)
    floor: float = Field(default=1e-8, ge=0)


# The float64 oracle's backend (`oracle: true`): planned with every job (runner/plan.py), checked with the others.
ORACLE = BackendSpec(backend="eager", device="cpu", dtype="float64", name="oracle")


_GRANULARITY = re.compile(r"^(blocks|leaf|depth:[1-9][0-9]*)$")


class Activations(Strict):
    """Tier 2: localize where each failing tier-1 check starts to diverge."""

    enabled: bool = True
    granularity: str | list[str] = "blocks"  # blocks (hierarchical) | leaf | depth:N | [module names]
    mode: Literal["local", "propagated", "both"] = "both"
    threshold: float | None = Field(default=None, ge=0)  # a layer's own error above this is divergent; default: gate

    @field_validator("granularity")
    @classmethod
    def _granularity(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str) and not _GRANULARITY.match(value):
            raise ValueError("expected blocks, leaf, depth:N or a list of module names")
        if isinstance(value, list) and not value:
            raise ValueError("the list of module names is empty")
        return value


class Tasks(Strict):
    """Tier 3: thresholds of task-level agreement between target and reference, one mapping per task under
    `tiers.tasks.<task>` (each validated by its task's own spec), and what every task shares. The model
    that validates `tiers.tasks` is made from the registered tasks (`tasks_spec`)."""

    enabled: bool = True
    output: str | None = None  # the output leaf holding the task's result when it is not the only one (out[1])

    def thresholds_for(self, task: str) -> BaseModel:
        """The thresholds of `task`: as the file gives them, else its defaults."""
        return getattr(self, task)

    def __reduce__(self):
        """Pickled as its values, validated again where it is unpickled: the model is made at run time
        (`tasks_model`), so pickle cannot find its class by name (an experiment goes to process and Ray
        workers pickled)."""
        return tasks_spec, (self.model_dump(),)


_TASKS_MODELS: dict[tuple, type[Tasks]] = {}


def tasks_model() -> type[Tasks]:
    """`Tasks` with one field per registered task (its thresholds spec), made once per set of tasks."""
    names = tuple(TASKS.names())
    specs = tuple(TASKS.get(n).Thresholds for n in names)
    key = names + specs
    if key not in _TASKS_MODELS:
        fields = {n: (spec, Field(default_factory=spec)) for n, spec in zip(names, specs, strict=True)}
        _TASKS_MODELS[key] = create_model("Tasks", __base__=Tasks, **fields)
    return _TASKS_MODELS[key]


def flat_thresholds(value: Any) -> tuple[Any, list[tuple[str, str]]]:
    """The old spelling (`tiers.tasks.top1_agreement`) moved to the task that owns the threshold
    (`tiers.tasks.classification.top1_agreement`): (the moved mapping, [(old key, new key path)]). Each task
    says which flat keys were its own (`Task.flat_keys`)."""
    if not isinstance(value, dict):
        return value, []
    owners = {flat: (name, own) for name in TASKS.names() for flat, own in TASKS.get(name).flat_keys.items()}
    moved, renamed = dict(value), []
    for flat in [k for k in value if k in owners]:
        task, own = owners[flat]
        nested = moved.get(task)
        if nested is not None and not isinstance(nested, dict):
            continue  # the task's own entry is not a mapping: its own error says so
        nested = dict(nested or {})
        nested.setdefault(own, moved.pop(flat))
        moved[task] = nested
        renamed.append((flat, f"tiers.tasks.{task}.{own}"))
    return moved, renamed


def tasks_spec(value: Any = None) -> Tasks:
    """`tiers.tasks` validated against the registered tasks (the old flat spelling moved, see flat_thresholds)."""
    if isinstance(value, Tasks):
        return value
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise _not_a_mapping(value)
    return tasks_model().model_validate(flat_thresholds(value)[0])


tasks_spec.spec_class = lambda value: tasks_model()
TasksSpec = Annotated[SerializeAsAny[Tasks], PlainValidator(tasks_spec, json_schema_input_type=Tasks)]


class Tiers(Strict):
    activations: Activations | None = None
    tasks: TasksSpec | None = None

    @field_validator("activations", "tasks", mode="before")
    @classmethod
    def _bool(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @property
    def localize(self) -> bool:
        return self.activations is not None and self.activations.enabled

    @property
    def evaluate_tasks(self) -> bool:
        return self.tasks is not None and self.tasks.enabled


class AdapterSpec(Strict):
    """A deterministic replacement for order-sensitive post-processing, applied on every backend alike. An
    adapter plugin subclasses it with its own keys and `name: Literal["<its name>"]` (adapters/)."""

    name: str


# An adapter spec: validated by the spec of the adapter it names.
AnyAdapterSpec = Annotated[SerializeAsAny[AdapterSpec], _dispatched(ADAPTERS, "name", None, AdapterSpec)]


def adapter_names(value: Any) -> Any:
    """`adapters: [deterministic_nms]` is short for `[{name: deterministic_nms}]`."""
    return [{"name": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value


ModelSpecBase.model_rebuild()  # its `adapters` names AnyAdapterSpec, defined after it


DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week per execution; past that a number is a typo, and past ~1e9 s no clock holds it


class ExecutorSpec(Strict):
    """Where executions run: the executor `kind` names (a registered executor: local, process, ray, ...) and
    the settings executors share. Each executor's own spec subclasses this with `kind: Literal["<its name>"]`
    and says which settings apply to it (runner/); validating this class validates by the spec of the kind
    given. `executor: process` is short for `{kind: process}`."""

    kind: str = "local"
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)  # seconds per execution; default DEFAULT_TIMEOUT_S
    address: str | None = Field(default=None, min_length=1)  # ray: the cluster to join; default: start one here
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)  # CPUs per execution: torch threads, compile processes
    workers: int | None = Field(default=None, ge=1, le=MAX_THREADS)  # ray, started here: tasks at a time

    @model_validator(mode="wrap")
    @classmethod
    def _by_kind(cls, value: Any, handler: Any) -> Any:
        value = {"kind": value} if isinstance(value, str) else value
        if cls is ExecutorSpec and isinstance(value, dict):
            return _executor_spec(value)
        return handler(value)

    @property
    def timeout_s(self) -> float:
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUT_S

    @property
    def execution_threads(self) -> int | None:
        """The torch threads of each execution; None: torch's default, as in the `parity run` process."""
        return self.threads


_executor_spec = plugin_spec(EXECUTORS, "kind", "local", ExecutorSpec)


class Experiment(Strict):
    name: Name | None = None
    seed: StrictInt = Field(default=0, ge=0, le=MAX_SEED)  # strict: `seed: true` is not 1
    repeats: StrictInt = Field(default=1, ge=1, le=MAX_REPEATS)
    warmup: StrictInt = Field(default=1, ge=0, le=MAX_REPEATS)  # untimed runs of each backend before its repeats
    models: list[ModelSpec] = Field(min_length=1)
    inputs: list[InputSetSpec] = Field(min_length=1)
    reference: BackendSpec = Field(default_factory=lambda: BackendSpec(backend="eager"))
    oracle: Oracle = Field(default_factory=lambda: Oracle(enabled=False))
    targets: list[BackendSpec] = Field(min_length=1)
    tolerances: Tolerances = Field(default_factory=Tolerances)
    tiers: Tiers = Field(default_factory=Tiers)
    adapters: list[AnyAdapterSpec] = Field(default_factory=list)
    executor: SerializeAsAny[ExecutorSpec] = Field(default_factory=lambda: ExecutorSpec.model_validate("local"))

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapter_names(cls, value: Any) -> Any:
        return adapter_names(value)

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _file: str | None = PrivateAttr(default=None)  # the file it was loaded from, if any

    @property
    def file(self) -> str | None:
        return self._file

    @field_validator("oracle", mode="before")
    @classmethod
    def _oracle_bool(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @property
    def base_dir(self) -> Path:
        """Relative paths in the file are resolved against the file's folder."""
        return self._base_dir

    def resolve(self, path: str, what: str = "path") -> Path:
        p = user_path(path, what)
        return p if p.is_absolute() else self._base_dir / p

    def adapters_for(self, model: ModelSpec) -> list[AnyAdapterSpec]:
        """A model's own adapters when it lists some (an empty list: none), else the experiment's."""
        return self.adapters if model.adapters is None else model.adapters

    def tolerance_for(self, target: BackendSpec) -> Tolerance:
        """What `target`'s checks are judged at (config/tolerances.py)."""
        return resolve_tolerance(self.tolerances, target, self.reference.dtype)

    @model_validator(mode="after")
    def _task_gate(self) -> Experiment:
        """`gate: tier3` needs a tier-3 verdict for every check it decides."""
        gated = [t for t in self.targets if self.tolerance_for(t).by_task]
        if not gated:
            return self
        if not self.tiers.evaluate_tasks:
            raise ValueError(f"gate: tier3 (target {gated[0].id}) needs tier 3: add `tiers: {{tasks: true}}`")
        for model in self.models:
            if model.task == "other":
                        raise ValueError(f"gate: tier3 (target {gated[0].id}) needs a task with a tier-3 evaluator, and "
                                 f"model '{model.name}' has task 'other' (set its task: "
                                 f"{', '.join(TASKS.names())})")
        return self

    def inputs_for(self, model: ModelSpec) -> list[InputSetSpec]:
        if model.inputs is None:
            return list(self.inputs)
        by_name = {s.name: s for s in self.inputs}
        return [by_name[n] for n in model.inputs]
