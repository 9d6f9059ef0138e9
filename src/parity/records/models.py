"""The record kinds of a run's records.jsonl, one pydantic model each: the schema, and (each field's
description) the records reference (docs/records.md is generated from these classes: records/schema_doc.py).

A record is one JSON object with a `kind` (and, for checks, a `tier`); `RECORDS` maps those to the model
that validates it. The models are strict (a string is never a number, `true` never an integer) and open
to fields they do not declare when reading (a record written by hand or by a newer minor version);
the writer refuses undeclared fields (io.undeclared_fields), so every field parity writes is declared here.
Fields that records written by earlier versions lack (the archived study records) are optional.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer, model_validator

SCHEMA_VERSION = 1


class Part(BaseModel):
    """A part of a record: strict types; fields it does not declare are kept on reading. The parts are also the
    values that modules hand each other (the judge's check, a layer's error), frozen."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    # A part whose fields are another module's (the experiment's settings): not checked for undeclared ones.
    open: ClassVar[bool] = False


def _in_order(dumped: Any, given: Any) -> Any:
    """`dumped` with the keys of each mapping in the order that `given` (what it was made from) has them."""
    if isinstance(dumped, dict) and isinstance(given, dict):
        first = {key: _in_order(dumped[key], given[key]) for key in given if key in dumped}
        return {**first, **{key: value for key, value in dumped.items() if key not in first}}
    if isinstance(dumped, list) and isinstance(given, list | tuple) and len(dumped) == len(given):
        return [_in_order(d, g) for d, g in zip(dumped, given, strict=True)]
    return dumped


class InOrder(Part):
    """A part that `model_dump(exclude_unset=True)` gives back with the fields it was made from, in the order they
    were given, its parts' too, not in the declarations' order (the mapping it was made from is kept for that
    order alone: one reference, no copy). `made` makes one so; a `Check` is also made so when it is read, so that a
    record's line keeps its key order through a read and a write."""

    _given: Any = PrivateAttr(default=None)

    @classmethod
    def made(cls, fields: dict[str, Any]) -> Self:
        """Validated from `fields`, and dumped in their order."""
        made = cls.model_validate(fields)
        made._given = fields
        return made

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: Any) -> Any:
        return _in_order(handler(self), self._given)


class Record(Part):
    """The fields every record has."""

    kind: str = Field(description="What the record is: run, resume, model, execution, check, layers, fallback, warning.")
    schema_version: int = Field(SCHEMA_VERSION, description="The version of this schema the record was written in; "
                                                             "a parity refuses records newer than its own.")

    @property
    def record_key(self) -> tuple | None:
        """The identity of this record within one run, or None for kinds that may repeat (`resume`, `fallback`):
        a run holds one record of each key (records/io.py refuses a second, different one and writes none twice).
        Each kind that has one says it below: one `run`, one `model` per model, one `execution` per (model, input
        set, backend, repeat), one `check` per (model, input set, target, tier), one `layers` per check, one
        `warning` per (model, input set, message)."""
        return None


# -- run -------------------------------------------------------------------------------------------------

class RunTolerances(Part):
    """The experiment's tolerances (config/schema.py): what the reports read of them."""

    open: ClassVar[bool] = True
    atol: list[float] = Field(description="The atol sweep: every check gets a verdict at each.")
    rtol: float = Field(description="The relative tolerance of every verdict.")
    gate: float | str | None = Field(None, description="The atol of the verdicts, or tier3; null: the default gate "
                                                       "of the sweep.")


class PlannedModel(Part):
    """A model of the experiment (config/schema.py): what the plan reads of it."""

    open: ClassVar[bool] = True
    name: str = Field(description="The model's name.")
    inputs: list[str] | None = Field(None, description="The input sets it runs on; null: every one.")
    task: str | None = Field(None, description="Its task (classification, detection, ...), when it has one.")


class RunConfig(Part):
    """The resolved experiment, as config/schema.py's Experiment dumps it (its reference is config/schema.py)."""

    open: ClassVar[bool] = True
    tolerances: RunTolerances = Field(description="The experiment's tolerances.")
    models: list[PlannedModel] = Field(description="The models: with `inputs` and `targets`, the checks the run plans.")
    inputs: list[dict[str, Any]] = Field(description="The input sets.")
    targets: list[dict[str, Any]] = Field(description="The targets.")

    def setting(self, *path: str, default: Any = None) -> Any:
        """A setting of the experiment that this schema leaves to config/schema.py, by its path
        (`setting("tiers", "tasks", "enabled")`); `default` where the record has none (records of earlier
        versions, or written by hand)."""
        value: Any = self.model_extra or {}
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return default
            value = value[key]
        return value


class CpuInfo(Part):
    """The machine and its CPU (records/environment.py `cpu_info`)."""

    open: ClassVar[bool] = True
    machine: str | None = Field(None, description="platform.machine().")
    count: int | None = Field(None, description="How many CPUs the OS shows.")
    model: str | None = Field(None, description="The CPU's model name, where /proc/cpuinfo says it.")
    flags: list[str] | None = Field(None, description="The vector extensions numbers depend on (avx2, avx512f, ...).")


class CudaInfo(Part):
    """CUDA, when torch has it."""

    open: ClassVar[bool] = True
    version: str | None = Field(None, description="torch.version.cuda.")
    devices: list[str] = Field(default_factory=list, description="Each device's name.")


class Environment(Part):
    """What the numbers depend on (records/environment.py): python, platform, the versions of parity and of every
    library the backends use (each a field of its own, named as pip names it, listed in `libraries`), cpu,
    threads, tf32, cuda, git_commit."""

    open: ClassVar[bool] = True
    python: str | None = Field(None, description="Python's version.")
    platform: str | None = Field(None, description="platform.platform().")
    parity: str | None = Field(None, description="parity's version.")
    libraries: list[str] | None = Field(None, description="The libraries whose versions are recorded, in order; "
                                                          "older records: none (torch, torchvision, onnxruntime).")
    cpu: CpuInfo | None = Field(None, description="The machine and its CPU.")
    threads: int | None = Field(None, description="The torch threads the executions ran with.")
    tf32: dict[str, bool] | None = Field(None, description="Whether TF32 was allowed (cudnn, matmul).")
    cuda: CudaInfo | None = Field(None, description="CUDA's version and devices; null: none.")
    git_commit: str | None = Field(None, description="The experiment folder's git commit, when it is in a repository.")

    def version(self, library: str) -> str | None:
        """The recorded version of `library` (a field of its own, named as pip names it); None: not installed, or
        not recorded."""
        if library in type(self).model_fields:
            return getattr(self, library)
        return (self.model_extra or {}).get(library)


class Run(Record):
    """The first line of every run: the resolved experiment, its digest and the environment."""

    kind: Literal["run"] = Field(description="`run`.")
    experiment: str = Field(description="The experiment's name.")
    digest: str | None = Field(None, description="sha256 of the resolved experiment and base_dir (settings of how "
                                                  "it runs excepted): a run continues only records with the same.")
    config: RunConfig = Field(description="The resolved experiment, every default filled in.")
    file: str | None = Field(None, description="The experiment file, when it came from one.")
    base_dir: str = Field(description="The folder the experiment's relative paths start from.")
    cache_dir: str | None = Field(None, description="The artifact cache the run was given instead of the default "
                                                    "(--cache-dir): its next: commands name it again, so that they "
                                                    "find the run's exports and compiled kernels.")
    environment: Environment = Field(description="What the numbers depend on: python, platform, the versions of "
                                                 "parity and of every library the backends use, cpu, threads, tf32, "
                                                 "cuda, git_commit (records/environment.py).")

    @property
    def record_key(self) -> tuple:
        return ("run",)


class Resume(Record):
    """A later process continued the run (it may run on another machine: its own environment)."""

    kind: Literal["resume"] = Field(description="`resume`.")
    records: int | None = Field(None, description="How many records the file held when the run was continued.")
    checks_recorded: int | None = Field(None, description="How many planned checks were already judged.")
    environment: Environment | None = Field(None, description="The continuing process's environment (as `run`'s).")


# -- model and execution ---------------------------------------------------------------------------------

class ModelBuilt(Record):
    """One model, built once per run."""

    kind: Literal["model"] = Field(description="`model`.")
    model: str = Field(description="The model's name in the experiment.")
    parameters: int | None = Field(None, description="Its number of parameters.")
    build_s: float | None = Field(None, description="Seconds spent building it (adapters included).")
    adapters: list[Any] | None = Field(None, description="What each adapter changed in it.")
    notes: list[str] | None = Field(None, description="What its source changed so that every backend runs it "
                                                      "(transformers: a decoder's cache turned off).")

    @property
    def record_key(self) -> tuple:
        return "model", self.model


class Note(Part):
    """What a backend said while preparing or running (execute/notes.py): a warning it raised (a trace fixed to
    one branch, a graph break) or a note it kept (backends/base.py `note`)."""

    kind: str = Field(description="What it is: trace_specialized, graph_break, exporter, or a backend's own kind.")
    message: str | None = Field(None, description="What it said (clipped).")
    where: str | None = Field(None, description="The file:line it points at.")
    code: str | None = Field(None, description="The source line there.")
    count: int | None = Field(None, description="How many times it was said, when more than once (graph breaks).")


class TimedRun(Record):
    """One timed run (repeat) of one backend on one model and input set; a failure has one record, at the
    repeat that failed."""

    kind: Literal["execution"] = Field(description="`execution`.")
    model: str = Field(description="The model's name.")
    inputs: str = Field(description="The input set's name.")
    backend: str = Field(description="The backend's id (the reference, the oracle or a target).")
    device: str = Field(description="The device it ran on.")
    dtype: str = Field(description="The dtype it ran in.")
    repeat: int = Field(description="Which timed run, from 0.")
    status: str = Field(description="ok, failed, crashed, timeout or unavailable (it cannot run here).")
    prepare_s: float | None = Field(description="One-time cost (export, compile, load): on repeat 0, 0.0 after.")
    run_s: float | None = Field(description="Seconds of this run; null when it did not run.")
    error: str | None = Field(None, description="Why it failed or could not run.")
    failure_class: str | None = Field(None, description="The failure's class (taxonomy.py), when it failed.")
    cached: bool | None = Field(None, description="Whether its prepared artifact came from the cache.")
    prepared_from: str | None = Field(None, description="The input set it was prepared (exported, traced, compiled) "
                                                        "from: the model's `export_inputs`, else its first.")
    warmup: Any = Field(None, description="Its warm-up runs (before repeat 0): their count and seconds.")
    latency_interleaved: bool | None = Field(None, description="Whether its timed runs took turns with the other "
                                                               "backends' of its model and input set (the local "
                                                               "executor); false: timed alone (process and ray "
                                                               "executors, or a backend alone in its turn).")
    warnings: list[Note] | None = Field(None, description="What the backend said while preparing and "
                                                                    "running (trace specializations, graph breaks); "
                                                                    "complete on the last repeat.")
    traceback: str | None = Field(None, description="The whole traceback of a failure (`--verbose` prints it).")

    @property
    def record_key(self) -> tuple:
        return "execution", self.model, self.inputs, self.backend, self.repeat


# -- checks ----------------------------------------------------------------------------------------------

class LeafTolerance(Part):
    """An output rule that judged this leaf instead of the check's tolerances."""

    atol: float | None = Field(description="Its atol; null: the check's gate.")
    rtol: float = Field(description="Its rtol.")
    rule: str | None = Field(description="Which rule of the experiment's `outputs:`.")


class Leaf(InOrder):
    """One output leaf (a tensor or a value in the output's structure) of a tier-1 check, as verify/tensors.py
    `compare` measured it (its fields in that order)."""

    name: str = Field(description="Its path in the output (`out[0].boxes`).")
    failure_class: str | None = Field(None, description="Why this leaf fails, or null.")
    required_atol: float | None = Field(None, description="The smallest atol it passes at; null: none.")
    detail: str | None = Field(None, description="What differs, in words.")
    shape: list[int] | None = Field(None, description="The target's shape.")
    dtype: str | None = Field(None, description="The target's dtype.")
    reference_shape: list[int] | None = Field(None, description="The reference's shape, when it differs.")
    reference_dtype: str | None = Field(None, description="The reference's dtype, when it differs.")
    max_abs: float | None = Field(None, description="Largest absolute difference.")
    max_rel: float | None = Field(None, description="Largest relative difference.")
    mean_abs: float | None = Field(None, description="Mean absolute difference.")
    rmse: float | None = Field(None, description="Root mean square difference.")
    cosine: float | None = Field(None, description="Cosine similarity of the two.")
    reference_rms: float | None = Field(None, description="Root mean square of the reference's compared values: "
                                        "the scale that makes required_atol comparable across models.")
    nonfinite: int | None = Field(None, description="Elements NaN/Inf in one output only.")
    mismatch_fraction: float | None = Field(None, description="Share of elements beyond the gate.")
    value: str | None = Field(None, description="A non-tensor leaf's target value (repr).")
    reference_value: str | None = Field(None, description="A non-tensor leaf's reference value (repr).")
    oracle_rmse_target: float | None = Field(None, description="rmse of the target from the float64 oracle.")
    oracle_rmse_reference: float | None = Field(None, description="rmse of the reference from the float64 oracle.")
    oracle_nonfinite_target: int | None = Field(None, description="With NaN/Inf on one side only: elements where "
                                                "the target's NaN/Inf pattern differs from float64's.")
    oracle_nonfinite_reference: int | None = Field(None, description="The same for the reference.")
    tolerance: LeafTolerance | None = Field(None, description="The output rule that judged it, if one did.")


class OracleVerdict(Part):
    """Which side is farther from the float64 oracle: a side is when its rmse from float64 exceeds
    `multiplier` times the other's plus `floor` (a leaf with NaN/Inf on one side only: when float64 lacks its
    non-finite pattern)."""

    multiplier: float = Field(description="A side is farther when its rmse exceeds this many times the other's ...")
    floor: float = Field(description="... plus this.")
    target_rmse: float | None = Field(description="rmse of the worst leaf's target from the oracle.")
    reference_rmse: float | None = Field(description="rmse of that leaf's reference from the oracle.")
    scale: float | None = Field(None, description="rms of that leaf's reference values: the output's scale.")
    worse: str | None = Field(None, description="target, reference, both (float64 has neither side's NaN/Inf "
                                                "pattern) or neither (equally far from float64).")
    target_worse: bool = Field(description="Whether some leaf's target is farther than allowed.")
    leaves_target_worse: list[str] = Field(description="Which leaves are.")
    notable: bool | None = Field(None, description="Whether the target is farther and its rmse from float64 exceeds "
                                                   "1e-6 of the output's scale: said even when the check passes.")
    target_nonfinite_off: int | None = Field(None, description="Elements where the target's NaN/Inf pattern differs "
                                                               "from float64's (leaves with NaN/Inf on one side only).")
    reference_nonfinite_off: int | None = Field(None, description="The same for the reference.")
    nonfinite_alike: bool | None = Field(None, description="Whether both sides return the same NaN/Inf where float64 "
                                                           "has numbers: wrong alike, with no drift between them.")


class NoiseFloor(Part):
    """The reference's own error: no gate below it can be met."""

    atol: float = Field(description="As a required atol.")
    source: str = Field(description="Where it shows: the float64 oracle, or the reference's repeats.")


class Fingerprints(Part):
    """What a tier-1 check's verdict rests on (runner/resume.py): a run into the same folder re-runs the check
    when one of them changed since."""

    recorded_at: str = Field(description="When the check was judged (UTC).")
    model_code: str | None = Field(description="sha256 of the user code the model runs (parity/fingerprint.py) and "
                                               "of the files its source reads it from (a model file, a repository's "
                                               ".py files, the entry's module); null: past the fingerprint's bounds "
                                               "or unreadable, so the check is always re-run.")
    model_weights: str = Field(description="sha256 of every parameter's and buffer's name and bytes (the module tree is the code's).")
    inputs: str = Field(description="sha256 of the input set's values and of the example inputs the backends were "
                                    "prepared from.")
    target: str = Field(description="sha256 of the target's settings (backend, device, dtype, options, tolerances, ...).")
    backend_code: str | None = Field(None, description="sha256 of the user code of the reference's and the target's "
                                                        "backend classes (a plugin's, as the artifact cache keys it); "
                                                        "null: past the fingerprint's bounds, so the check is always "
                                                        "re-run. Absent in records of the first fingerprinting parity.")
    parity: str = Field(description="sha256 of parity's own source.")
    libraries: dict[str, str | None] = Field(description="The reference's, the target's and the model code's "
                                                         "libraries: version (digest of its installed files), "
                                                         "null when not installed.")


class Check(InOrder, Record):
    """One verdict about one target on one model and input set. The judge's verdict is this record itself, and the
    Runner writes it as it is, its fields in the order it was made from (InOrder): that of its line in
    records.jsonl, or the order the judge wrote them in, as parity always has."""

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: Any) -> Any:
        check = handler(data)
        if isinstance(data, dict):
            check._given = data
        return check

    kind: Literal["check"] = Field(description="`check`.")
    model: str = Field(description="The model's name.")
    inputs: str = Field(description="The input set's name.")
    target: str = Field(description="The target backend's id.")
    reference: str | None = Field(None, description="The reference backend's id.")
    status: str = Field(description="ok (judged), skipped (the target cannot run here) or error (the reference "
                                    "failed: no verdict).")
    passed: bool | None = Field(description="The verdict; null when not judged.")
    failure_class: str | None = Field(description="Why it failed (taxonomy.py), or null.")
    detail: str | None = Field(description="The failure or the reason it was not judged, in words.")
    warnings: list[Note] | None = Field(None, description="What the target's backend said while running "
                                                                    "(its execution's warnings).")

    @property
    def record_key(self) -> tuple:
        return "check", self.model, self.inputs, self.target, self.tier  # each tier's model declares its `tier`


class Tier1Check(Check):
    """Tier 1: every output leaf of the target against the reference's, at the gate and at each atol of the sweep."""

    tier: Literal[1] = Field(description="1.")
    rtol: float = Field(description="The rtol it was judged at.")
    gate: float = Field(description="The atol of its verdict.")
    tolerance_source: str | None = Field(None, description="Where the tolerances came from: experiment, target, "
                                                           "default-for-<dtype>.")
    gated_by: str | None = Field(None, description="tier1, or tier3 when the task-level verdict decides it.")
    required_atol: float | None = Field(description="The smallest atol it passes at; null: none.")
    max_abs: float | None = Field(None, description="The largest absolute difference over its leaves.")
    verdicts: dict[str, bool] = Field(description="The verdict at each atol of the sweep, keyed by "
                                                  "records.tolerance_key(atol).")
    nondeterminism: dict[str, float | None] | None = Field(None, description="How far each side's repeats "
                                                                             "stray from its first (reference, target).")
    leaves: list[Leaf] = Field(description="Every output leaf's comparison.")
    oracle: OracleVerdict | None = Field(None, description="The float64 oracle's verdict, when the experiment asks for it.")
    oracle_error: str | None = Field(None, description="Why there is no oracle verdict: the float64 oracle could not "
                                                       "run, and its error.")
    noise_floor: NoiseFloor | None = Field(None, description="The reference's own error, where the data show it.")
    tier1_passed: bool | None = Field(None, description="Tier 1's own verdict, when tier 3 decides (gate: tier3).")
    reference_failure_class: str | None = Field(None, description="How the reference failed (status error).")
    user_error: bool | None = Field(None, description="Whether the model as written raised on its inputs (the eager "
                                                      "reference failed): the user's to fix, exit 2.")
    fingerprints: Fingerprints | None = Field(None, description="What its verdict rests on; a resumed run re-runs the "
                                                                "check when one changed (records written before "
                                                                "parity recorded them have none: they are re-run).")


class FlipExample(Part):
    """One unmatched box of a detection check, classed."""

    image: int = Field(description="Which input image.")
    side: str = Field(description="reference (a box the target lacks) or target (a box the reference lacks).")
    index: int = Field(description="The box's index in that side's detections.")
    label: int = Field(description="Its label.")
    score: float = Field(description="Its score.")
    mechanism: str = Field(description="Its class, as in `counts`.")
    detail: str = Field(description="The numbers behind the class (scores, IoUs, the threshold).")


class Flips(Part):
    """Decision-flip attribution (verify/tasks/flips.py): every unmatched box of a detection check (a failing
    one, or a pass with some boxes unmatched) classed by the mechanism that made the sides differ."""

    counts: dict[str, int] = Field(description="Unmatched boxes per class: tie_order, score_threshold, nms_iou, "
                                               "top_k, score_order, label_change, geometry, unattributed (only "
                                               "those with some); they add up to every unmatched box of both sides.")
    candidates: str = Field(description="both: classed through both sides' captured post-processing inputs; "
                                        "none: a side had none, from the outputs alone.")
    examples: list[FlipExample] = Field(description="The first few unmatched boxes, classed, with their numbers.")


class GenerationText(Part):
    """A divergence's tokens in words, decoded with the input set's tokenizer."""

    context: str = Field(description="The tokens before the divergence.")
    reference: str = Field(description="The reference's tokens from the divergence on.")
    target: str = Field(description="The target's tokens from the divergence on.")


class TokenFlip(Part):
    """One scored position whose next-token decision differs (text generation's teacher-forced statistics), as a
    tier-3 check's `token_flips` lists it."""

    model_config = ConfigDict(populate_by_name=True)
    position: list[int] = Field(description="[sequence, position].")
    reference_token: int = Field(description="The reference's top-1 token.")
    target_token: int = Field(description="The target's top-1 token.")
    margin: float = Field(description="The reference's top-2 probability margin there.")
    flip: str = Field(alias="class", description="near_tie (the margin within near_tie_margin) or real.")


class GeneratedPrompt(InOrder):
    """One prompt's greedy continuations (text generation's free-running), the reference's against the target's."""

    prompt_tokens: int = Field(description="The prompt's length in tokens: the sequence's first tokens, as many as "
                                           "leave room for the new tokens in the input set's sequence length.")
    text_tokens: int | None = Field(None, description="The sequence's own length, when the prompt was cut shorter "
                                                      "to leave room for the new tokens (the record's `notes` say so).")
    first_divergence: int | None = Field(description="The first new token (0-based) at which the continuations "
                                                     "differ; null: they match to the last.")
    margin: float | None = Field(None, description="The reference's top-2 probability margin at that token (both "
                                                   "sides read the same tokens up to it).")
    flip: str | None = Field(None, description="What the divergence is: near_tie (the margin within near_tie_margin) "
                                               "or real.")
    context: list[int] | None = Field(None, description="The token ids before the divergence (its last few).")
    reference: list[int] | None = Field(None, description="The reference's token ids from the divergence on (a few).")
    target: list[int] | None = Field(None, description="The target's token ids from the divergence on (a few).")
    text: GenerationText | None = Field(None, description="context, reference and target decoded with the input "
                                                          "set's tokenizer, when it has one.")


class Generation(Part):
    """Text generation's free-running: each side's greedy continuation of every prompt, by its own artifact."""

    new_tokens: int | None = Field(None, description="The tokens each side generated per prompt.")
    exact_match: float | None = Field(None, description="The share of prompts whose continuations match exactly.")
    prompts: list[GeneratedPrompt] | None = Field(None, description="Per prompt, where the continuations differ.")
    error: str | None = Field(None, description="Why no continuation was compared (a side that could not generate: "
                                                "not a causal decoder, left padding, a backend that raised).")


class CachedDecodingCheck(Part):
    """Text generation's cached decoding (verify/tasks/text_generation.py `judge_cached`): each side's prefill and
    decode steps through its KV cache, teacher-forced on the text's tokens, compared step by step."""

    prompt_tokens: int | None = Field(None, description="The prompt's length (the same for every sequence).")
    steps: int | None = Field(None, description="The decode steps compared (step 0: the logits after the prefill).")
    passed: bool | None = Field(None, description="The cached path's own verdict; null when it was not compared.")
    # side, error, failure_class, detail: the order its records have always had them in (a line's keys on disk)
    side: str | None = Field(None, description="The side charged: reference (its cached decoding differs from its "
                                               "own uncached forward, or it could not decode) or target.")
    error: str | None = Field(None, description="Why nothing was compared, in one line.")
    failure_class: str | None = Field(None, description="decision_flip when it fails; when a side could not decode, "
                                                        "that side's class (unsupported_op: a target that cannot run "
                                                        "the cache), or null when the inputs or the model give no "
                                                        "cached decoding to compare.")
    detail: str | None = Field(None, description="Its failures, in words.")
    target: CachedMetrics | None = Field(None, description="The target's cached decoding against the reference's, "
                                                            "judged: positions, kl_mean, kl_max, same_top1, "
                                                            "top1_agreement, real_flips, near_tie_flips, max_abs, "
                                                            "first_flip (the earliest step that flips).")
    reference_self: CachedMetrics | None = Field(None, description="The reference's cached decoding against its "
                                                                    "own uncached forward, judged (same metrics).")
    target_self: CachedMetrics | None = Field(None, description="The target's cached decoding against its own "
                                                                 "uncached forward, shown, not judged (same metrics).")
    cache: CacheComparison | None = Field(None, description="Both sides' KV caches at the end of their cached "
                                                           "decodings, layer by layer, shown, not judged; absent "
                                                           "from records before it.")


class Tier3Check(Check):
    """Tier 3: the task-level verdict (same top-k, same boxes, ...) from the task's evaluator."""

    tier: Literal[3] = Field(description="3.")
    task: str = Field(description="The model's task (classification, detection, ...).")
    metrics: dict[str, Any] = Field(description="The evaluator's metrics.")
    thresholds: dict[str, Any] | None = Field(None, description="The thresholds they were judged at: the task's own (`tiers.tasks.<task>`); records written before tasks were plugins hold the flat set of every task's.")
    same_set: bool | None = Field(None, description="Whether both sides gave the same items in another order.")
    pictures: DetectionPictures | dict[str, Any] | None = Field(
        None, union_mode="left_to_right", description="Detection: the images and each side's boxes, for reports to "
                                                      "draw; a mapping that is not one (a record edited by hand) is "
                                                      "kept as read, and the report says it cannot be drawn.")
    token_flips: list[dict[str, Any]] | None = Field(
        None, description="Text generation, when a next-token decision differs: up to 20 positions ([sequence, "
                          "position]), real flips first, each with both sides' tokens, the reference's top-2 "
                          "probability margin and its class (near_tie or real).")
    generation: Generation | None = Field(None, description="Text generation with `new_tokens`: the free-running "
                                                            "greedy continuations of both sides compared.")
    cached: CachedDecodingCheck | None = Field(None, description="Text generation with `new_tokens`: both sides' "
                                                                 "decoding through the KV cache compared step by step.")
    notes: list[str] | None = Field(None, description="What a reader must know of the metrics: few scored "
                                                    "positions (under 100), no token ids, prompts cut for "
                                                    "free-running.")
    kld_histogram: KldHistogram | None = Field(None, description="Text generation: the scored positions' KL "
                                                                   "divergence counted per decade (`edges`, and "
                                                                   "`counts`: one more than the edges), for a "
                                                                   "report's picture.")
    token_ids: list[list[int]] | None = Field(None, description="Text generation on a text input set: the token ids "
                                                                 "both sides read, one list per sequence (a text_file's "
                                                                 "windows), so that the statistics can be computed "
                                                                 "again on the same tokens (llama-perplexity's "
                                                                 "--kl-divergence-base).")
    flips: Flips | None = Field(None, description="Detection, when a box is unmatched (a failed check, or a pass "
                                                  "short of every box): its unmatched boxes classed by mechanism "
                                                  "(`tiers.tasks.detection.attribution`).")


# -- localization and fallback ---------------------------------------------------------------------------

class LayerError(Part):
    """How far one layer's target output is from the reference's."""

    name: str = Field(description="The module's name.")
    max_abs: float | None = Field(None, description="Largest absolute difference.")
    rmse: float | None = Field(None, description="Root mean square difference.")
    rel_rmse: float | None = Field(description="rmse / rms(reference): comparable across layers.")
    cosine: float | None = Field(None, description="Cosine similarity.")
    sqnr_db: float | None = Field(None, description="Signal to quantization noise, dB; null when identical.")
    required_atol: float | None = Field(None, description="The atol it passes at; null: none.")
    error: str | None = Field(None, description="Why it could not be run or compared on the target.")
    measured_by: str | None = Field(None, description="An own (local) error: how the layer alone ran on the target, "
                                                      "`slice` (cut from the artifact of the whole model), `together` "
                                                      "(compile: prepared side by side with its level's other layers as "
                                                      "one graph, each fed its own inputs) or `export` (prepared alone; "
                                                      "with why it was not sliced or together, in brackets, when the "
                                                      "target does either); null for a propagated error.")


class Layer(Part):
    """One layer of a level, in call order."""

    name: str = Field(description="The module's name.")
    depth: int | None = Field(None, description="How deep in the model it is (1: top level).")
    call_order: int | None = Field(None, description="Its place in the forward pass.")
    local: LayerError | None = Field(None, description="Its own error: run on the reference's inputs.")
    propagated: LayerError | None = Field(None, description="Its error inside the target's end-to-end run.")
    introduction_rate: float | None = Field(None, description="How much of the error it introduces.")


class Level(Part):
    """The children of one module (the top level: parent null), compared layer by layer."""

    parent: str | None = Field(description="The module whose children these are; null: the model.")
    layers: list[Layer] = Field(description="Its children, in call order.")
    own_code: LayerError | None = Field(None, description="The parent's own operations, its submodules replayed.")


class Specialized(Part):
    """The line where the target's trace took one branch of a data-dependent condition (a `trace_specialized`
    note), and the innermost module whose class holds it."""

    where: str = Field(description="The warned file:line.")
    code: str | None = Field(None, description="The source line there.")
    module: str | None = Field(None, description="The innermost module whose class's source holds it; absent when "
                                                 "the line is in a function outside every module's class.")
    module_code: str | None = Field(None, description="Where that module's class is defined.")


class Repeated(Part):
    """A culprit in a stack of repeated blocks: the same submodule measured alone in each block."""

    pattern: str = Field(description="The submodule's path with its block index starred (`layers.*.self_attn`).")
    measured: list[str] = Field(description="The instances measured, in block order.")
    over: list[str] = Field(description="Those whose own error exceeds the threshold.")
    blocks: int = Field(description="How many blocks the stack has.")


class GroupTrial(Part):
    """One run of a file of typed tensors with chosen groups at another type, as tier 3 judged it."""

    open: ClassVar[bool] = True  # runner/tensor_types.py's
    kl_mean: float | None = Field(None, description="Mean KL divergence from the reference.")
    kl_mean_se: float | None = Field(None, description="Its standard error.")
    same_top1: float | None = Field(None, description="Share of positions with the reference's top-1 token.")
    top1_agreement: float | None = Field(None, description="Tier 3's top-1 agreement.")
    passed: bool | None = Field(None, description="Tier 3's verdict on it.")
    nbytes: int | None = Field(None, description="The file's bytes.")


class GroupRow(InOrder, GroupTrial):
    """One tensor group alone at the target's type, the rest at the trial type."""

    name: str = Field(description="The group (token_embd, output, blk.N, blk.N.attn, blk.N.ffn).")
    parent: str | None = Field(None, description="The block a split group belongs to; null: a block-level group.")
    type: str = Field(description="Its type in the target's file.")
    kl_added: float = Field(description="The mean KL it adds over the floor (every group at the trial type).")
    share: float | None = Field(None, description="Its share of what the block-level groups add; null: a split group, "
                                                  "or none add anything.")


class TensorGroups(Part):
    """A tensor-group localization (runner/tensor_types.py): each group of the file alone at the target's type."""

    open: ClassVar[bool] = True  # runner/tensor_types.py's
    statistic: str | None = Field(None, description="What ranks the groups (kl_mean).")
    trial_type: str = Field(description="The type every other group is at in a trial.")
    trials: int = Field(description="How many files were run.")
    whole: GroupTrial = Field(description="The file as it is.")
    floor: GroupTrial = Field(description="Every group at the trial type.")
    added: float | None = Field(None, description="What the block-level groups add over the floor, together.")
    groups: list[GroupRow] = Field(description="Each group alone at its type, in the order they were run.")


class GateVerdict(Part):
    """`parity localize`: the tier-1 verdict at the gate of the check it explains."""

    passed: bool | None = Field(None, description="Whether the check passes at the gate.")
    failure_class: str | None = Field(None, description="Why it fails (taxonomy.py), or null.")
    detail: str | None = Field(None, description="The failure, in words.")
    required_atol: float | None = Field(None, description="The smallest atol it passes at; null: none.")
    gate: float | None = Field(None, description="The gate's atol.")
    rtol: float | None = Field(None, description="The rtol it was judged at.")


class Layers(InOrder, Record):
    """Tier 2 for one failing check: which layer introduces the difference."""

    kind: Literal["layers"] = Field(description="`layers`.")
    tier: int | None = Field(None, description="2.")
    model: str = Field(description="The model's name.")
    inputs: str = Field(description="The input set's name.")
    target: str = Field(description="The target's id.")
    reference: str | None = Field(None, description="The reference's id.")
    error: str | None = Field(None, description="Why localization failed (then none of the fields below).")
    mode: str | None = Field(None, description="own or propagated errors.")
    threshold: float | None = Field(None, description="The error a layer must exceed to be a suspect.")
    verdict: str | None = Field(None, description="The finding, in words.")
    culprit: str | None = Field(None, description="The layer that introduces the difference, if one does.")
    culprit_code: str | None = Field(None, description="Where its class is defined.")
    in_own_code: bool | None = Field(None, description="Whether it is in a parent's own operations.")
    whole_graph: bool | None = Field(None, description="Whether every layer passes alone (a whole-graph effect).")
    as_a_whole: bool | None = Field(None, description="Whether only the compiled whole differs.")
    evenly_spread: bool | None = Field(None, description="Whether the error is spread evenly over the layers.")
    first_divergent: str | None = Field(None, description="The first layer over the threshold, in call order.")
    first_divergent_by: str | None = Field(None, description="By which error: own or propagated.")
    suspects: list[LayerError] | None = Field(None, description="The likeliest culprits, worst first.")
    skipped: list[Any] | None = Field(None, description="Layers that could not be compared, and why.")
    levels: list[Level] | None = Field(None, description="Each level looked at, from the top down.")
    elapsed_s: float | None = Field(None, description="Seconds spent localizing.")
    tier1: GateVerdict | None = Field(None, description="`parity localize`: the check's tier-1 verdict at the gate.")
    specialized: Specialized | None = Field(
        None, description="The target's trace took one branch of a data-dependent condition: the warned line and the "
                          "innermost module whose class holds it.")
    compiler_pass: CompilerPass | None = Field(
        None, description="No layer makes an error of its own on a compiler target: the pass torch's CompilerBisector "
                          "names (`found`, `backend`, `subsystem`, `application`, `debug_info`, `switch`: the setting "
                          "that removes the drift, `steps`, `elapsed_s`), or why it named none (`why`).")
    repeated: Repeated | None = Field(
        None, description="The culprit lies in a stack of repeated blocks: the same submodule measured in each "
                          "(`pattern`: `layers.*.self_attn`, `measured`, `over`: those above the threshold, `blocks`).")
    identical: bool | None = Field(None, description="Whether every layer compared equals the reference's output "
                                                     "(NaN where it has NaN): no drift between the sides.")
    uncalled: str | None = Field(None, description="A culprit that calls none of its submodules as modules "
                                                   "(nn.MultiheadAttention): a leaf, with no layers to rank.")
    decode_step: DecodeStepCompared | None = Field(
        None, description="Localized on a decode step (mode `decode step`: the check's forward passes at the gate, its "
                          "cached decoding fails on the target): `prompt_tokens`, `step` (1: the first token fed after "
                          "the prompt), `sequences`; `entered_through`, the culprit's arguments that already differ (the "
                          "departure reaches it from its caller); `model_arguments`, the arguments of the model's own "
                          "call in that step that differ; `cached`, the cached decoding's verdict it explains "
                          "(`passed`, `steps`, `detail`).")
    tensor_groups: TensorGroups | None = Field(
        None, description="A target that runs a file of typed tensors (llama.cpp's GGUF; mode `tensor groups`, "
                          "runner/tensor_types.py): `groups`, each group of the file alone at the target's type and "
                          "the rest at `trial_type`: `name`, `parent` (a block split into attn and ffn), `type`, "
                          "`kl_mean` ± `kl_mean_se`, `kl_added` over the `floor` (every group at `trial_type`), "
                          "`share` of what the groups add, `same_top1`; `whole` (the file as it is), `trials`.")

    @model_validator(mode="after")
    def _complete(self) -> Layers:
        """A localization that did not fail has its finding."""
        if not self.error:
            for name in ("verdict", "mode", "threshold", "suspects", "levels"):
                if name not in self.model_fields_set:
                    raise ValueError(f"{name}: missing")
        return self

    @property
    def record_key(self) -> tuple:
        return "layers", self.model, self.inputs, self.target


class Fallback(Record):
    """`parity fallback`: the smallest set of modules to run outside the target's fast path."""

    kind: Literal["fallback"] = Field(description="`fallback`.")
    model: str = Field(description="The model's name.")
    inputs: str = Field(description="The input set's name.")
    reference: str = Field(description="The reference's id.")
    target: str = Field(description="The target's id.")
    runs_in: str = Field(description="Where the modules run instead: eager (out of torch.compile) or float32.")
    aim: str = Field(description="What must pass: tier 1 at the gate, or tier 3.")
    modules: list[str] = Field(description="The modules found (or tried last, when none passes).")
    passed: bool = Field(description="Whether the check passes with them.")
    required_atol_before: float | None = Field(description="The target's required atol without fallback.")
    required_atol_after: float | None = Field(description="... and with it.")
    tier1_passed_after: bool | None = Field(None, description="Whether tier 1 alone passes with them (the judge's "
                                                                 "verdict; the tier-3 aim may pass without it).")
    task_before: dict[str, Any] | None = Field(description="Tier-3 metrics without fallback (aim tier 3).")
    task_after: dict[str, Any] | None = Field(description="... and with it.")
    latency_before_s: float | None = Field(description="Median run time without fallback.")
    latency_after_s: float | None = Field(description="... and with it.")
    latency_float_s: float | None = Field(
        description="int8 targets: the float model's median run time on the same backend, timed alongside.")
    tried: int = Field(description="How many sets were tried.")
    whole_model: bool = Field(description="Whether the set is the whole model: no partial fallback exists.")
    ceiling_atol: float | None = Field(None, description="The required atol with every candidate module in fallback at "
                                                         "once, measured before the search (None: not measured).")
    ceiling_modules: int | None = Field(None, description="How many modules that ceiling trial put in fallback.")
    passing_gate: float | None = Field(None, description="The smallest gate (3 digits, rounded up) at which the target "
                                                         "as it is passes, verified by judging its run again at it.")
    next_step: str | None = Field(description="What to try when no partial fallback exists, one line each; a line "
                                              "starting `next: ` is a command.")
    tensor_types: KeptGroups | None = Field(
        None, description="A target that runs a file of typed tensors (llama.cpp's GGUF): `modules` are tensor "
                          "groups kept at `keep_type`; `bytes_before`/`bytes_after` of the file, "
                          "`tokens_per_s_before`/`after` (the two files run in turns), `snippet` (the target entry "
                          "that reproduces it), `localization` (the ranking the search followed).")
    latency_ratio: float | None = Field(description="latency_after_s / latency_before_s.")


class InputWarning(Record):
    """An input set that proves little: it came out constant."""

    kind: Literal["warning"] = Field(description="`warning`.")
    model: str = Field(description="The model's name.")
    inputs: str = Field(description="The input set's name.")
    message: str = Field(description="What is wrong with it.")

    @property
    def record_key(self) -> tuple:
        return "warning", self.model, self.inputs, self.message


# (kind, tier) -> model; tier None for the kinds that have none.
RECORDS: dict[tuple[str, int | None], type[Record]] = {
    ("run", None): Run, ("resume", None): Resume, ("model", None): ModelBuilt, ("execution", None): TimedRun,
    ("check", 1): Tier1Check, ("check", 3): Tier3Check, ("layers", None): Layers, ("fallback", None): Fallback,
    ("warning", None): InputWarning,
}
KINDS = tuple(dict.fromkeys(kind for kind, _ in RECORDS))
TIERS = tuple(tier for kind, tier in RECORDS if kind == "check")

# The same, as one type discriminated on `kind` (and `tier` for checks), for pydantic users and the reference.
AnyCheck = Annotated[Tier1Check | Tier3Check, Field(discriminator="tier")]
AnyRecord = Annotated[Run | Resume | ModelBuilt | TimedRun | AnyCheck | Layers | Fallback | InputWarning,
                      Field(discriminator="kind")]


# -- parts of the findings above, typed so that the reports read them by attribute (declared after the records;
# the records that hold them are rebuilt below) --------------------------------------------------------------

class CompilerPass(Part):
    """The compiler pass torch's CompilerBisector names (backends/compile.py `compiler_pass`), or why it named none."""

    found: bool = Field(description="Whether it named a pass.")
    steps: int | None = Field(None, description="How many compilations it ran.")
    elapsed_s: float | None = Field(None, description="Seconds it took.")
    why: str | None = Field(None, description="Why it named none.")
    backend: str | None = Field(None, description="The compiler backend it stops at (inductor, aot_eager, ...).")
    subsystem: str | None = Field(None, description="Its subsystem (or the inductor setting that is the pass).")
    application: int | None = Field(None, description="Which application of that subsystem.")
    debug_info: str | None = Field(None, description="What that application did (clipped).")
    switch: dict[str, Any] | None = Field(None, description="The inductor setting that removes the drift "
                                                            "({field: value}), when the pass is one.")


class DecodeCached(Part):
    """The cached decoding's verdict a decode-step localization explains."""

    passed: bool | None = Field(None, description="Whether the cached decoding passed.")
    steps: int | None = Field(None, description="The decode steps it compared.")
    detail: str | None = Field(None, description="Its failures, in words.")


class DecodeStepCompared(Part):
    """A localization on a decode step: one token fed after the prompt through each side's own KV cache."""

    prompt_tokens: int = Field(description="The prompt's length in tokens.")
    step: int | None = Field(None, description="Which decode step (1: the first token fed after the prompt).")
    sequences: int | None = Field(None, description="How many sequences.")
    entered_through: list[str] | None = Field(None, description="The culprit's arguments that already differ (the "
                                                                "departure reaches it from its caller).")
    model_arguments: list[str] | None = Field(None, description="The arguments of the model's own call in that step "
                                                                "that differ.")
    cached: DecodeCached | None = Field(None, description="The cached decoding's verdict it explains.")


class CacheTensorError(Part):
    """How far one cache tensor of the target (a layer's keys or values) is from the reference's, measured as tier 2
    measures a layer."""

    max_abs: float = Field(description="Largest absolute difference.")
    rel_rmse: float = Field(description="rmse / rms(reference): comparable across layers.")
    required_atol: float | None = Field(description="The atol it passes at, at the target's rtol; null: none (NaN or "
                                                    "Inf on one side only).")
    exceeds: bool = Field(description="Whether it exceeds the target's gate (scale-aware where the target's is).")


class CachedLayer(Part):
    """One layer's cache, keys and values apart."""

    layer: int = Field(description="The layer's index in the cache (0: the first block's).")
    keys: CacheTensorError = Field(description="Its keys [batch, heads, positions, head dim].")
    values: CacheTensorError = Field(description="Its values.")


class CacheComparison(Part):
    """Both sides' KV caches at the end of their cached decodings (text generation's `compare_caches`): the prompt
    and every decode step's token but the last, compared layer by layer."""

    layers: list[CachedLayer] | None = Field(None, description="Every layer, first to last.")
    first_layer: int | None = Field(None, description="The first layer whose keys or values exceed the gate; absent: "
                                                      "none does.")
    first_parts: list[str] | None = Field(None, description="Which of that layer's exceed it: keys, values or both.")
    error: str | None = Field(None, description="Why they were not compared (a side whose runtime does not expose its "
                                                "cache: ONNX Runtime GenAI, OpenVINO, llama.cpp).")


class CachedMetrics(Part):
    """One comparison of cached decodings (text generation's `_cached_statistics`): the teacher-forced statistics of
    the decode steps."""

    positions: int | None = Field(None, description="The decode steps compared, over every sequence.")
    kl_mean: float | None = Field(None, description="Mean KL divergence.")
    kl_max: float | None = Field(None, description="Largest KL divergence.")
    same_top1: float | None = Field(None, description="Share of steps with the same top-1 token.")
    top1_agreement: float | None = Field(None, description="Top-1 agreement as judged (near ties counted or not).")
    real_flips: int | None = Field(None, description="Steps whose decision differs beyond a near tie.")
    near_tie_flips: int | None = Field(None, description="Steps whose decision differs within a near tie.")
    max_abs: float | None = Field(None, description="Largest absolute difference of the logits.")
    first_flip: int | None = Field(None, description="The earliest step that flips; absent: none does.")


class NextTokenMetrics(Part):
    """A text-generation check's `metrics` (verify/tasks/text_generation.py `next_token_statistics`, then the
    verdict's counts and the free-running's): llama-perplexity's `--kl-divergence` statistics, Q the target and base
    the reference, in the order the record has them; NaN (null in the records) where a statistic has no value. A
    check's `metrics` stay an open mapping (every task has its own): this is how text generation writes and reads
    its own."""

    positions: int | None = Field(None, description="Scored positions.")
    kl_mean: float | None = Field(None, description="Mean KL divergence ...")
    kl_mean_se: float | None = Field(None, description="... and its standard error.")
    same_top1: float | None = Field(None, description="Share of positions with the same top-1 token ...")
    same_top1_se: float | None = Field(None, description="... and its standard error.")
    kl_median: float | None = Field(None, description="KL divergence percentiles: median, ...")
    kl_p90: float | None = Field(None, description="... 90th, ...")
    kl_p95: float | None = Field(None, description="... 95th, ...")
    kl_p99: float | None = Field(None, description="... 99th, ...")
    kl_p999: float | None = Field(None, description="... 99.9th ...")
    kl_max: float | None = Field(None, description="... and the largest.")
    ppl_target: float | None = Field(None, description="The target's perplexity on the text's next tokens ...")
    ppl_target_se: float | None = Field(None, description="... and its standard error.")
    ppl_reference: float | None = Field(None, description="The reference's perplexity ...")
    ppl_reference_se: float | None = Field(None, description="... and its standard error.")
    ln_ppl_ratio: float | None = Field(None, description="ln(PPL(target) / PPL(reference)) ...")
    ln_ppl_ratio_se: float | None = Field(None, description="... and its standard error.")
    perplexity_ratio: float | None = Field(None, description="PPL(target) / PPL(reference) ...")
    perplexity_ratio_se: float | None = Field(None, description="... and its standard error.")
    ln_ppl_correlation: float | None = Field(None, description="Correlation of the two sides' ln PPL.")
    delta_p_mean: float | None = Field(None, description="Mean of the target's probability of the next token less "
                                                         "the reference's ...")
    delta_p_mean_se: float | None = Field(None, description="... and its standard error.")
    delta_p_rms: float | None = Field(None, description="RMS of that difference ...")
    delta_p_rms_se: float | None = Field(None, description="... and its standard error.")
    delta_p_min: float | None = Field(None, description="Its percentiles: the smallest, ...")
    delta_p_p01: float | None = Field(None, description="... 1st, ...")
    delta_p_p05: float | None = Field(None, description="... 5th, ...")
    delta_p_median: float | None = Field(None, description="... median, ...")
    delta_p_p95: float | None = Field(None, description="... 95th, ...")
    delta_p_p99: float | None = Field(None, description="... 99th ...")
    delta_p_max: float | None = Field(None, description="... and the largest.")
    top1_agreement: float | None = Field(None, description="Top-1 agreement as judged (near ties counted or not).")
    flips: int | None = Field(None, description="Scored positions whose top-1 differs ...")
    real_flips: int | None = Field(None, description="... beyond a near tie ...")
    near_tie_flips: int | None = Field(None, description="... and within one.")
    exact_match: float | None = Field(None, description="Free-running: the share of continuations that match.")
    first_divergence: int | None = Field(None, description="Free-running: the earliest divergent new token.")


class KldHistogram(Part):
    """The scored positions' KL divergence counted per decade, for a report's picture; read leniently (a record
    edited by hand, or written before it had one, may lack either list)."""

    edges: list[float] | None = Field(None, description="The decades' edges.")
    counts: list[int] | None = Field(None, description="Positions per bin: one more than the edges.")


class KeptGroups(Part):
    """A tensor-group fallback (runner/tensor_types.py `fallback_groups`): what keeping the groups costs, and the
    target entry that reproduces it."""

    keep_type: str = Field(description="The type the groups are kept at.")
    groups: int = Field(description="How many groups the file has.")
    bytes_before: int = Field(description="The file's bytes as it is.")
    bytes_after: int = Field(description="... and with the groups kept.")
    tokens: int = Field(description="The tokens each timed run reads.")
    tokens_per_s_before: float = Field(description="Tokens per second of the file as it is ...")
    tokens_per_s_after: float = Field(description="... and with the groups kept (the two run in turns).")
    snippet: str | None = Field(None, description="The target entry that reproduces it; null: no set passes.")
    localization: dict[str, Any] | None = Field(None, description="The ranking the search followed (as a `layers` "
                                                                  "record's `tensor_groups`).")


class PictureImage(Part):
    """One input image of a detection check's pictures."""

    source: str = Field(description="The input set's name for it (a file, `sample:...`, or synthetic).")
    path: str | None = Field(None, description="The file, resolved; null: a synthetic input.")
    size: list[int] | None = Field(None, description="[H, W] the model saw it at; null: unknown.")


class PictureGeometry(Part):
    """The input set's preprocessing that moves pixels (config/schema.py `Preprocess`)."""

    resize: list[int] | None = Field(None, description="[S]: the shorter side; [H, W].")
    center_crop: list[int] | None = Field(None, description="[S]: a square; [H, W].")
    resize_multiple: int | None = Field(None, description="Each side resized to a multiple of it.")


class DrawnDetections(Part):
    """One side's detections on one image, as drawn: its highest-scoring boxes, rounded, and how many it had."""

    boxes: list[list[float | None]] = Field(description="xyxy, to 0.01 px, highest score first.")
    labels: list[int] = Field(description="Their labels.")
    scores: list[float | None] = Field(description="Their scores, to 1e-4.")
    total: int = Field(description="How many boxes the side found on the image.")


class DetectionPictures(Part):
    """What a report needs to draw reference and target boxes on each input image (verify/tasks/detection.py
    `detection_pictures`)."""

    images: list[PictureImage] = Field(description="The input images, in order.")
    preprocess: PictureGeometry | None = Field(None, description="The geometry that took each file to the model's view.")
    cap: int | None = Field(None, description="The most boxes kept per image and side.")
    reference: list[DrawnDetections] = Field(description="The reference's detections, one per image.")
    target: list[DrawnDetections] = Field(description="The target's detections, one per image.")


for _model in (CachedDecodingCheck, Tier3Check, Layers, Fallback):  # they name the parts declared after them
    _model.model_rebuild()
