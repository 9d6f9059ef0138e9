"""The Python API: run an experiment, or assert in your own tests that backends agree."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parity.config.schema import BackendSpec, Experiment, TargetTolerances, Tolerances
from parity.config.tolerances import Tolerance, resolve
from parity.digest import feed_value
from parity.errors import ParityError, clip, field_errors
from parity.execute.execution import Execution, execute
from parity.experiment import experiment_from_dict, load_experiment
from parity.experiment.targets import parse_target
from parity.experiment.validate import backend_problems
from parity.experiment.yaml_io import format_path
from parity.inputs import Inputs
from parity.records.summary import RunResult
from parity.verify.judge import judge
from parity.verify.tensors import compared_exactly


def _experiment(source: str | Path | dict | Experiment) -> Experiment:
    if isinstance(source, Experiment):
        return source
    if isinstance(source, dict):
        return experiment_from_dict(source, "<dict>", Path.cwd())
    return load_experiment(source)


def default_out_dir(exp: Experiment) -> Path:
    import time

    return Path("parity-out") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_experiment(source: str | Path | dict | Experiment, out: str | Path | None = None,
                   progress: bool = False, reports: tuple[str, ...] = ("report.md",),
                   fresh: bool = False) -> RunResult:
    """Run an experiment (a YAML path, a dict in the same shape, or an Experiment); write records.jsonl,
    summary.json and `reports` under `out` (any of report.md, report.html, junit.xml: `parity run` writes
    every registered writer's, `parity.report.report_writers()`; the HTML costs about a second of plotting).
    Returns a `RunResult`, the verdict `parity run` gives: `passed`, `exit_code` (as `parity run` exits,
    3 when a planned check has no verdict or summary.json was not written), `checks` and `failures` (typed
    tier-1 checks), `summary`, `missing`; it is also the list of the records, as before.
    When `out` already holds records of the same experiment the run continues from them, re-running the
    checks whose model code, weights, inputs or libraries changed, and the records returned are all of them;
    `fresh` discards them and starts over. Nothing is cached (the command line's `--cache-dir` gives its
    Runner an artifact cache)."""
    from parity.runner.runner import Runner

    exp = _experiment(source)
    out_dir = Path(out) if out is not None else default_out_dir(exp)
    result = Runner(exp, out_dir).run(progress=progress, fresh=fresh)
    if reports:
        from parity.report import write_reports

        write_reports(out_dir, result.records, result.summary, names=reports)
    return result


def localize(source: str | Path | dict | Experiment, model: str | None = None, target: str | None = None,
             inputs: str | None = None, out: str | Path | None = None) -> dict[str, Any]:
    """Tier 2 for one check of an experiment, as `parity localize` runs it: the `layers` record (the
    culprit, the suspects, every layer's numbers, and `tier1`: whether the check fails at the gate at all; a
    text-generation check whose forward passes and whose cached decoding fails is compared on a decode step,
    `decode_step`). `model`, `target` (its id) and `inputs` choose the check (None: the only one; inputs: the model's first);
    `out` also writes the record to OUT/records.jsonl."""
    from parity.runner.runner import Runner

    runner = Runner(_experiment(source), Path(out) if out is not None else None)
    return runner.localize(*runner.one_check(model, target, inputs, option="{}=")).model_dump(exclude_unset=True,
                                                                                           exclude={"kind"})


def fallback(source: str | Path | dict | Experiment, model: str | None = None, target: str | None = None,
             inputs: str | None = None, tier: int = 1, out: str | Path | None = None) -> dict[str, Any]:
    """The smallest set of modules to run eager (compile) or in float32 (bfloat16, float16) so that one
    check passes at its gate (`tier=3`: and its task metrics hold), as `parity fallback` finds it: the
    `fallback` record (`modules`, `passed`, required atol and latency before and after, `next_step`).
    Choosing the check and `out` as in `localize`."""
    from parity.runner.runner import Runner

    runner = Runner(_experiment(source), Path(out) if out is not None else None)
    found = runner.find_fallback(*runner.one_check(model, target, inputs, option="{}="), tier)
    return found.model_dump(exclude={"kind", "schema_version"})


def _as_inputs(inputs: Any) -> Inputs:
    if isinstance(inputs, Inputs):
        return inputs
    if isinstance(inputs, dict):
        return Inputs((), dict(inputs))
    if isinstance(inputs, tuple):
        return Inputs(inputs)
    return Inputs((inputs,))


def target_spec(target: str | dict | BackendSpec) -> BackendSpec:
    """A target id as the tables print it (`eager-cpu-bfloat16`, `compile`, `eager:bfloat16`: the grammar
    of `parity.experiment.targets`), a backend entry as in an experiment file, or a BackendSpec."""
    from pydantic import ValidationError

    if isinstance(target, BackendSpec):
        return target
    if not isinstance(target, str | dict):
        raise ParityError(f"target {clip(repr(target))}: a target is an id such as 'compile' or a backend entry (a "
                          f"mapping), not a {type(target).__name__}")
    try:
        if isinstance(target, str):
            return BackendSpec.model_validate(parse_target(target).entry())
        return BackendSpec.model_validate(target)
    except ValidationError as exc:
        error = field_errors(exc)[0]
        where = ".".join(map(str, error.loc)) or "target"
        raise ParityError(f"target {clip(repr(target))}: {where}: {error.msg}") from exc


@dataclass
class TargetAgreement:
    """One target against the reference: its verdict at the call's atol and rtol, and every leaf's numbers
    (`name`, `shape`, `dtype`, `max_abs`, `max_rel`, `mismatch_fraction`, `required_atol`, `failure_class`,
    `detail`: the leaves of a check record). `status` is `error` when the target raised and `unavailable`
    when it cannot run here: then `passed` is False and `leaves` is empty."""

    target: str
    status: str
    passed: bool
    atol: float | None = None  # what it was judged at: the call's, else the dtype's default
    rtol: float | None = None
    failure_class: str | None = None
    detail: str | None = None
    required_atol: float | None = None  # the smallest atol at which every leaf passes at this rtol; None: none does
    max_abs: float | None = None
    leaves: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Agreement:
    """What `assert_backends_agree` found: per target (by id, in the order given), per leaf."""

    reference: str
    atol: float | None  # as the call gave them; None: each target's dtype's default (TargetAgreement says which)
    rtol: float | None
    targets: dict[str, TargetAgreement] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.targets.values())

    def __getitem__(self, target: str) -> TargetAgreement:
        return self.targets[target]


class Disagreement(AssertionError):
    """The AssertionError of `assert_backends_agree`, carrying the whole `Agreement` in `result`."""

    def __init__(self, message: str, result: Agreement):
        super().__init__(message)
        self.result = result


def _tolerance(spec: BackendSpec, reference: BackendSpec, atol: float | None, rtol: float | None) -> Tolerance:
    """What a target is judged at: the call's atol (the gate) and rtol as the target's own, each one not given
    what `parity run` resolves for the pair by default (config/tolerances.py: the dtype's, else rtol 1e-5 and
    gate 1e-4). A target entry's own `tolerances:` are not read: the call's apply to every target alike."""
    from pydantic import ValidationError

    given = {key: value for key, value in (("gate", atol), ("rtol", rtol)) if value is not None}
    try:
        own = TargetTolerances(**given) if given else None
    except ValidationError as exc:
        error = field_errors(exc)[0]
        name = {"gate": "atol"}.get(str(error.loc[0]), error.loc[0])
        raise ParityError(f"{name}: {error.message}") from exc
    if own is not None and own.gate == "tier3":
        raise ParityError("atol: a number, not 'tier3': assert_backends_agree judges tier 1 (no task is evaluated)")
    return resolve(Tolerances(), spec.model_copy(update={"tolerances": own}), reference.dtype)


def _reference_key(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs) -> tuple | None:
    """What a reference's outputs depend on, for `reference_cache`: the reference backend; every module's
    class (the class objects, so that two `Net`s of two test files never share outputs), its plain
    attributes (`self.scale = 2.0`, hooks) and its parameters' and buffers' content (`parity.digest`, as the
    artifact cache keys them: a quantized tensor's scale, a sparse one's indices); and the inputs by value. None when an input is of a type parity cannot compare (it has no value to key on): nothing is cached."""
    from parity.outputs import Opaque, flatten

    leaves = flatten((inputs.args, inputs.kwargs))
    if any(isinstance(v, Opaque) for v in leaves.values()):
        return None
    h = hashlib.sha256()
    seen: set[int] = set()
    feed_value(h, model, seen)
    feed_value(h, leaves, seen)
    return spec.model_dump_json(), tuple(type(m) for m in model.modules()), h.hexdigest()


def _specs(reference, targets) -> tuple[BackendSpec, list[BackendSpec]]:
    """The reference's and the targets' specs; unknown names, bad options and a target id given twice fail
    loudly, all at once, before anything runs."""
    problems, specs = [], []
    for path, target in [(("reference",), reference), *((("targets", i), t) for i, t in enumerate(targets))]:
        try:
            spec = target_spec(target)
        except ParityError as exc:
            problems.append(f"{format_path(path)}: {exc.problems[0]}")
            continue
        specs.append(spec)
        problems += [f"{format_path(where)}: {msg}" for where, msg in backend_problems(spec, path)]
    ids = [spec.id for spec in specs[1:]]
    problems += [f"target id '{i}' appears twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    if problems:
        raise ParityError(*problems)
    return specs[0], specs[1:]


def assert_backends_agree(model: torch.nn.Module, inputs: Any, targets: list[str | dict | BackendSpec],
                          atol: float | None = None, rtol: float | None = None,
                          reference: str | dict | BackendSpec = "eager",
                          reference_cache: dict | None = None) -> Agreement:
    """Raise AssertionError (a `Disagreement`, whose `result` holds the numbers), in the style of
    torch.testing.assert_close, unless every target's outputs match the reference's:
    |t - r| <= atol + rtol * |r| on every leaf; else return the `Agreement`, per target and per leaf.
    `atol` and `rtol` apply to every target; each one not given is what `parity run` and `parity check`
    judge the pair at by default: atol 1e-4, rtol 1e-5 for float32 and float64, torch.testing's defaults
    for a bfloat16 (1e-5 / 1.6e-2) or float16 (1e-5 / 1e-3) side.
    A target is an id as the tables print it (`compile-cpu`, `eager-cpu-bfloat16`, `eager:bfloat16`), a
    backend entry as in an experiment file, or a BackendSpec. `inputs` is a tensor, a tuple of positional
    tensors or a dict of keyword tensors. The model itself is never modified; the copies that the
    backends run are put in eval mode (dropout off, batch-norm statistics frozen), as `parity run` does.
    `reference_cache`, a dict kept between calls, holds the reference's outputs by what they depend on
    (the model's classes, attributes and weights, the inputs' values, the reference backend), so that
    checking one model target by target runs the reference once."""
    __tracebackhide__ = True  # pytest shows the caller's line and the message, not this function

    ref_spec, specs = _specs(reference, targets)
    tolerances = {spec.id: _tolerance(spec, ref_spec, atol, rtol) for spec in specs}
    inputs = _as_inputs(inputs)
    model = copy.deepcopy(model).eval()
    reference_run = _reference_run(ref_spec, model, inputs, reference_cache)
    result = Agreement(ref_spec.id, atol, rtol)
    problems = []
    for spec in specs:
        got = execute(spec, model, inputs, 1)
        check = judge(reference_run, got, tolerances[spec.id], model=type(model).__qualname__, inputs="inputs")
        leaves = [leaf.model_dump(exclude_unset=True) for leaf in check.leaves]  # the API's values are the records'
        result.targets[spec.id] = TargetAgreement(spec.id, got.status, check.passed is True, check.gate, check.rtol,
                                                  check.failure_class, check.detail, check.required_atol, check.max_abs,
                                                  leaves)
        if not got.ok:
            problems.append(f"Target {spec.id} did not run ({got.status}): {got.error}")
            continue
        if check.passed:
            continue
        atol, rtol = check.gate, check.rtol
        bad = [leaf for leaf in check.leaves if leaf.failure_class]
        lines = [f"Target {spec.id} does not match reference {ref_spec.id} ({check.failure_class}) "
                 f"at atol={atol:g}, rtol={rtol:g}:"]
        for leaf in bad:
            if leaf.max_abs is not None and leaf.shape is not None:
                n = 1
                for d in leaf.shape:
                    n *= d
                exact = compared_exactly(leaf)  # integers and booleans: no tolerance applies
                how = f", {leaf.dtype} compared exactly (atol and rtol do not apply)" if exact else ""
                lines.append(
                    f"  {leaf.name}: Mismatched elements: {round(leaf.mismatch_fraction * n)} / {n} "
                    f"({leaf.mismatch_fraction:.1%}){how}\n"
                    f"    Greatest absolute difference: {leaf.max_abs:.6g} "
                    f"({'none' if exact else f'up to {atol:g}'} allowed)\n"
                    f"    Greatest relative difference: {leaf.max_rel:.6g} ({'none' if exact else f'up to {rtol:g}'} allowed)"
                )
            else:
                lines.append(f"  {leaf.name}: {leaf.detail or leaf.failure_class}")
        problems.append("\n".join(lines))
    if problems:
        raise Disagreement("\n".join(problems), result)
    return result


def _reference_run(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs, cache: dict | None) -> Execution:
    """The reference's execution, from `cache` when it holds one of the same model, inputs and backend."""
    key = _reference_key(spec, model, inputs) if cache is not None else None
    if key is not None and key in cache:
        return cache[key]
    ref = execute(spec, model, inputs, 1)
    if not ref.ok:
        raise AssertionError(f"the reference {spec.id} failed: {ref.error or ref.status}")
    if key is not None:
        cache[key] = ref
    return ref
