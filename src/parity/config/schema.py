"""The experiment file, as pydantic models. Unknown keys are rejected everywhere.

This module checks shape and types only; names that need a registry or the file system (backends,
torchvision builders, files) are checked in `config.checks`, so that the schema stays import-light.

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
    PrivateAttr,
    StrictFloat,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)

from parity.config.tolerances import Tolerance, default_gate
from parity.config.tolerances import resolve as resolve_tolerance

DTYPES = ("float32", "float64", "bfloat16", "float16")
TASKS = ("classification", "detection", "segmentation", "other")

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
    if _REMOTE.match(ref):
        raise ValueError(f"{ref!r} is a URL or hub reference, and parity does not download; fetch it yourself "
                         "and give the local path")
    return ref


LocalPath = Annotated[str, AfterValidator(local_path)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelSpec(Strict):
    name: Name
    source: Literal["torchvision", "repo", "python"] = "torchvision"
    builder: str | None = None
    path: LocalPath | None = None  # source repo: a folder on this machine
    entry: str | None = None
    hubconf: str | None = None
    weights: LocalPath | None = None
    init: Literal["default", "fan_in"] = "default"
    params: dict[str, Any] = Field(default_factory=dict)
    task: Literal["classification", "detection", "segmentation", "other"] = "other"
    inputs: list[str] | None = Field(default=None, min_length=1)
    batch: Literal["stack", "list"] | None = None
    adapters: list[Adapter] | None = None  # this model's own; None: the experiment's

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapter_names(cls, value: Any) -> Any:
        return adapter_names(value)

    @model_validator(mode="after")
    def _source_keys(self) -> ModelSpec:
        needed = {"torchvision": ["builder"], "repo": ["path"], "python": ["entry"]}[self.source]
        for key in needed:
            if getattr(self, key) is None:
                raise ValueError(f"source '{self.source}' needs '{key}'")
        if self.source == "repo" and (self.entry is None) == (self.hubconf is None):
            raise ValueError("source 'repo' needs exactly one of 'entry' (module:attr) or 'hubconf' (name)")
        foreign = {"torchvision": ["path", "entry", "hubconf"], "repo": ["builder"], "python": ["builder", "path", "hubconf"]}
        if self.inputs is not None and len(set(self.inputs)) != len(self.inputs):
            raise ValueError("'inputs' names an input set twice")
        if self.init != "default" and self.weights is not None:
            raise ValueError("'init' applies only to a seeded init (weights: null)")
        for key in foreign[self.source]:
            if getattr(self, key) is not None:
                raise ValueError(f"'{key}' does not apply to source '{self.source}'")
        return self

    @property
    def batch_mode(self) -> str:
        """How images are handed over: one stacked batch, or a list of CHW tensors (detection)."""
        return self.batch or ("list" if self.task == "detection" else "stack")


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
    dtype: Literal["float32", "float64", "bfloat16", "float16", "int64", "int32", "bool"] = "float32"
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


class InputSetSpec(Strict):
    name: Name
    images: list[LocalPath] | None = Field(default=None, max_length=10_000)
    preprocess: Preprocess = Field(default_factory=Preprocess)
    synthetic: SyntheticSpec | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> InputSetSpec:
        if (self.images is None) == (self.synthetic is None):
            raise ValueError("an input set needs exactly one of 'images' or 'synthetic'")
        if self.images is not None and not self.images:
            raise ValueError("'images' is empty")
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
    atol: list[float] = Field(default_factory=lambda: [1e-6, 1e-5, 1e-4, 1e-3], min_length=1, max_length=100)
    rtol: float = Field(default=1e-5, ge=0)

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
        return self.gate if isinstance(self.gate, float) else default_gate(self.atol)


class TargetTolerances(GateAndRules):
    """A target's own tolerances (`targets[i].tolerances`): what it gives wins over the experiment's and
    over its dtype's default. The sweep stays the experiment's, so that every target is swept over the same
    atols and the sweep's table compares like with like."""

    rtol: float | None = Field(default=None, ge=0)


class BackendSpec(Strict):
    backend: str = Field(min_length=1)
    device: str = "cpu"
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    name: Name | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    fallback: list[str] = Field(default_factory=list)  # modules run outside the fast path (parity fallback)
    tolerances: TargetTolerances | None = None  # this target's own (see config/tolerances.py)

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
        return f"{backend}-{self.device.replace(':', '')}{suffix}"


class Oracle(Strict):
    enabled: bool = True
    multiplier: float = Field(default=2.0, gt=0)
    floor: float = Field(default=1e-8, ge=0)


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
    """Tier 3: thresholds of task-level agreement between target and reference."""

    enabled: bool = True
    output: str | None = None  # the output leaf holding the class scores when it is not the only one (out[1])
    top1_agreement: float = Field(default=0.99, ge=0, le=1)  # classification
    top5_overlap: float | None = Field(default=None, ge=0, le=1)
    detection_iou: float = Field(default=0.5, gt=0, le=1)  # a target box matches a reference box from this IoU
    detection_f1: float = Field(default=0.95, ge=0, le=1)
    pixel_agreement: float = Field(default=0.99, ge=0, le=1)  # segmentation
    miou: float | None = Field(default=None, ge=0, le=1)


class Tiers(Strict):
    activations: Activations | None = None
    tasks: Tasks | None = None

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


class Adapter(Strict):
    """A deterministic replacement for order-sensitive post-processing, applied on every backend alike."""

    name: Literal["deterministic_nms"]
    score_grid: float | None = Field(default=None, gt=0)  # default: 10 x the gate atol
    box_grid: float = Field(default=1.0, gt=0)  # pixels

    def score_grid_for(self, experiment) -> float:
        return self.score_grid if self.score_grid is not None else 10 * max(experiment.tolerances.gate_atol, 1e-7)


def adapter_names(value: Any) -> Any:
    """`adapters: [deterministic_nms]` is short for `[{name: deterministic_nms}]`."""
    return [{"name": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value


ModelSpec.model_rebuild()  # its `adapters` names Adapter, defined after it


DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week per execution; past that a number is a typo, and past ~1e9 s no clock holds it


class ExecutorSpec(Strict):
    """Where executions run: `local` (this process), `process` (a worker process, with a time limit) or
    `ray` (Ray tasks, several at a time, with a time limit). `executor: process` is short for `{kind: process}`."""

    kind: Literal["local", "process", "ray"] = "local"
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)  # seconds per execution; default DEFAULT_TIMEOUT_S
    address: str | None = Field(default=None, min_length=1)  # ray: the cluster to join; default: start one here
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)  # CPUs per execution: torch threads, compile processes (ray: default 1)
    workers: int | None = Field(default=None, ge=1, le=MAX_THREADS)  # ray, started here: tasks at a time (default: cores / threads)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _applies(self) -> ExecutorSpec:
        if self.kind == "local" and (self.timeout is not None or self.threads is not None):
            raise ValueError("'timeout' and 'threads' apply to the process and ray executors (the local executor "
                             "runs backends in this process and cannot stop one)")
        if self.address is not None and self.kind != "ray":
            raise ValueError("'address' applies to the ray executor")
        if self.workers is not None and (self.kind != "ray" or self.address is not None):
            raise ValueError("'workers' applies to the ray executor without an address (the Ray it starts here; "
                             "a cluster runs as many tasks as its resources allow)")
        return self

    @property
    def timeout_s(self) -> float:
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUT_S

    @property
    def execution_threads(self) -> int | None:
        """The torch threads of each execution; None: torch's default, as in the `parity run` process."""
        return self.threads or (1 if self.kind == "ray" else None)


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
    adapters: list[Adapter] = Field(default_factory=list)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)

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

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else self._base_dir / p

    def adapters_for(self, model: ModelSpec) -> list[Adapter]:
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
                                 f"model '{model.name}' has task 'other' (set its task: classification, detection "
                                 "or segmentation)")
        return self

    def inputs_for(self, model: ModelSpec) -> list[InputSetSpec]:
        if model.inputs is None:
            return list(self.inputs)
        by_name = {s.name: s for s in self.inputs}
        return [by_name[n] for n in model.inputs]
