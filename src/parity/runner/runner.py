"""The Runner: one experiment into one output folder. It builds each model, runs every backend on its own
copy through an executor (each copy built again from the model's spec: runner/prepared.py `ModelCopies`), judges,
localizes, records (`run`); and, for one failing check, explains it
layer by layer (`localize`) or finds modules to fall back (`find_fallback`). Every execution keeps its
exports in the Runner's artifact cache. The command line and the Python API only parse, call it and render.

Memory stays bounded by one model and input set (and its example) at a time, and the runner holds no model
while a backend holds its copy (the first build is the first backend's copy): the backends of a job are
prepared together (their timed repeats interleave, under the local executor) when their copies of the model
fit in memory together, else one at a time (runner/executors.py); each target is judged as soon as its backend
is closed and the reference's (and oracle's) outputs are in, and its outputs are dropped once its check is written,
so that one at a time, a job holds the reference's outputs and one target's, never every target's.

Resuming. A run into a folder that already holds records of the same experiment continues it. The unit
of resumption is a *judgement*: one target on one (model, input set), that is its tier-1 check together
with the tier-3 check and the `layers` record that belong to it. The tier-1 check is written last, so a
recorded tier-1 check means the whole judgement is recorded; such targets are not executed again while the
fingerprints the check records still hold (runner/resume.py: each model with recorded judgements is built
to compare them, and the stale judgements' records are removed, so they are made again). A job
(model, input set) with a judgement missing re-executes its reference (and oracle), because a verdict
needs their outputs and outputs are not recorded, and the missing targets. Records whose key is already
in the file (an execution repeat, a model, a tier-3 check) are not written again, so nothing appears
twice. A model whose judgements are all recorded and unchanged is built only to fingerprint it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parity.backends import backend_class, fallback_kind
from parity.config.schema import Activations, BackendSpec, Experiment, InputSetSpec, ModelSpec, tasks_spec
from parity.errors import ParityError, did_you_mean
from parity.execute import follow_up
from parity.execute.cache import ArtifactCache
from parity.execute.execution import Execution
from parity.inputs import Inputs, build_inputs
from parity.models import source_fingerprint, source_notes
from parity.models.sources import MODEL_KINDS
from parity.outdir import IN_PLACE, OUTPUT_FILES, prepare
from parity.plugins import SOURCES
from parity.records import NOT_DIGESTED, RecordWriter, environment, experiment_digest
from parity.records.io import typed
from parity.records.models import Fallback, Fingerprints, Layers, Run
from parity.records.summary import RunResult, summarize, write_summary
from parity.records.view import RunView
from parity.runner.base import Executor
from parity.runner.executors import make_executor
from parity.runner.localization import gate_check, localize_check, localize_decode_check
from parity.runner.plan import Job, example_for, plan
from parity.runner.prepared import (
    ModelCopies,
    built_model_problems,
    configured_model,
    model_scope,
    prepared_model,
    task_follow_up,
)
from parity.runner.resume import (
    ModelPart,
    changes,
    check_fingerprints,
    model_fingerprints,
    re_running,
    resuming,
    without_stale,
)
from parity.runner.search import candidates_from, fallback_record, next_step, search_fallback
from parity.runner.tensor_types import TASK, fallback_groups, has_tensor_types, localize_groups
from parity.verify.judge import judge
from parity.verify.localize import LOCALIZABLE, localizes_decode_step
from parity.verify.tasks import evaluated, task_check

log = logging.getLogger(__name__)


WIDTH = 56  # the progress description: the rest of an 80-column line holds the bar, the counts and the time


class _Progress:
    """A rich progress bar over executions; silent when not wanted."""

    def __init__(self, total: int | None, enabled: bool):
        """`enabled`: a bar on stderr, its description WIDTH characters (an 80-column terminal keeps the bar); `total`
        None: a bar with no end (a localization's steps are not known ahead)."""
        self.enabled = enabled
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(f"{{task.description:<{WIDTH}}}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self.task = self.bar.add_task("starting", total=total)

    @contextlib.contextmanager
    def running(self) -> Iterator[_Progress]:
        if not self.enabled:
            yield self
            return
        with self.bar:
            yield self

    def describe(self, text: str) -> None:
        if self.enabled:
            # a line too long for the column is cut visibly ("timed runs of eager-cpu, comp…"), never mid-word unseen
            self.bar.update(self.task, description=text if len(text) <= WIDTH else text[:WIDTH - 1] + "…")

    def advance(self, n: int = 1) -> None:
        if self.enabled:
            self.bar.advance(self.task, n)


def _record_execution(writer: RecordWriter, job: Job, ex: Execution, repeat: int | None) -> None:
    fields: dict[str, Any] = {"model": job.model.name, "inputs": job.inputs.name, "backend": ex.backend.id,
                              "device": ex.backend.device, "dtype": ex.backend.dtype,
                              "prepared_from": job.prepared_from.name, "latency_interleaved": ex.interleaved}
    if repeat is None:  # a failure or an unavailable backend: one record, at the repeat that failed
        writer.write("execution", **fields, repeat=len(ex.run_s), status=ex.status, prepare_s=ex.prepare_s,
                     run_s=None, error=ex.error, failure_class=ex.failure_class, cached=ex.cached,
                     warmup=ex.warmup, warnings=ex.notes, traceback=ex.traceback)
    else:  # the warm-up runs are before repeat 0; the backend's warnings are complete at the last repeat
        last = {"warnings": ex.notes} if repeat == job.repeats - 1 else {}
        writer.write("execution", **fields, repeat=repeat, status="ok", prepare_s=ex.prepare_s if repeat == 0 else 0.0,
                     run_s=ex.run_s[repeat], error=None, failure_class=None, cached=ex.cached,
                     **({"warmup": ex.warmup} if repeat == 0 else {}), **last)


def judged(writer: RecordWriter, job: Job, target) -> bool:
    """Whether the records already hold this target's judgement (its tier-1 check is written last)."""
    return writer.has("check", job.model.name, job.inputs.name, target.id, 1)


def _build(input_set: InputSetSpec, exp: Experiment, model_spec: ModelSpec):
    try:
        return build_inputs(input_set, exp, model_spec.batch_mode)
    except ParityError:
        raise
    except Exception as exc:  # e.g. a tensor too large for this machine's memory
        raise ParityError(f"input set '{input_set.name}': cannot build it: {type(exc).__name__}: {exc}") from exc


class _Examples:
    """Each model's example inputs (its `export_inputs`, else its first input set), built once when a job
    needs them: every backend of every job of the model is prepared from them."""

    def __init__(self, exp: Experiment):
        self.exp, self._built = exp, {}

    def __call__(self, job: Job):
        key = job.model.name, job.prepared_from.name
        if key not in self._built:
            self._built = {key: _build(job.prepared_from, self.exp, job.model)}  # one model's at a time
        return self._built[key]


def _job_inputs(job: Job, exp: Experiment, examples: _Examples) -> tuple[Inputs, Inputs]:
    """The job's inputs and its example inputs (the same object when the job runs on its example)."""
    example = examples(job)
    return example if job.inputs.name == job.prepared_from.name else _build(job.inputs, exp, job.model), example


def _fingerprints(exp: Experiment, model_part: ModelPart, inputs: Inputs, example: Inputs,
                  target: BackendSpec) -> Fingerprints:
    """A check's fingerprints (runner/resume.py), with the libraries its verdict rests on: torch, torchvision,
    numpy, the reference's and the target's."""
    backends = (backend_class(exp.reference.backend), backend_class(target.backend))
    libraries = ["torch", "torchvision", "numpy", *(lib for cls in backends for lib in cls.libraries)]
    return check_fingerprints(model_part, inputs, example, target.model_dump(mode="json"), libraries, backends)


def _stale(writer: RecordWriter, exp: Experiment, jobs: list[Job]) -> dict[tuple[str, str, str], tuple[list[str], str]]:
    """The recorded judgements whose fingerprints no longer hold (runner/resume.py), with why and since when:
    each model with a recorded judgement is built, and each of its input sets, to fingerprint them now."""
    recorded = {RunView.identity(c): c for c in RunView(writer.records).checks(1)}
    stale, examples = {}, _Examples(exp)
    for model_spec in exp.models:
        model_jobs = [j for j in jobs if j.model is model_spec and any(judged(writer, j, t) for t in j.targets)]
        if not model_jobs:
            continue
        model, _ = prepared_model(model_spec, exp)
        part = model_fingerprints(model, source_fingerprint(model_spec, exp))
        del model
        for job in model_jobs:
            inputs, example = _job_inputs(job, exp, examples)
            for spec in job.targets:
                check = recorded.get((job.model.name, job.inputs.name, spec.id))
                why = check and changes(check, _fingerprints(exp, part, inputs, example, spec))
                if why:
                    stale[RunView.identity(check)] = why, check.fingerprints.recorded_at if check.fingerprints else ""
    return stale


def _run_job(job: Job, copies: ModelCopies, exp: Experiment, writer: RecordWriter, progress: _Progress,
             executor: Executor, examples: _Examples, model_part: ModelPart) -> None:
    pending = [spec for spec in job.targets if not judged(writer, job, spec)]
    if not pending:
        progress.advance(job.executions)
        return
    inputs, example = _job_inputs(job, exp, examples)
    fingerprints = {spec.id: _fingerprints(exp, model_part, inputs, example, spec)
                    for spec in pending}  # before anything runs on the inputs
    for note in inputs.notes:  # a constant input: every backend agrees on it, so its checks prove little
        writer.write("warning", model=job.model.name, inputs=job.inputs.name, message=note)

    # The reference, the oracle and the targets together: their timed repeats interleave where they run here.
    specs = [*job.baselines, *pending]
    names = {"model": job.model.name, "inputs": job.inputs.name}
    baselines: dict[int, Execution] = {}
    judged_early: set[int] = set()
    advanced = 0

    def on_run(ex: Execution, repeat: int) -> None:
        nonlocal advanced
        _record_execution(writer, job, ex, repeat)
        advanced += 1
        progress.advance(1)

    def judge_target(spec: BackendSpec, target: Execution, reference: Execution, oracle: Execution | None) -> None:
        if not target.ok:
            _record_execution(writer, job, target, None)
        task = task_check(job, target, reference, exp, inputs) if exp.tiers.evaluate_tasks else None
        if task:
            writer.write("check", **task.model_dump(exclude_unset=True, exclude={"kind"}))
        check = judge(reference, target, exp.tolerance_for(spec), **names, oracle=oracle, oracle_rule=exp.oracle,
                      task=task)
        # a cached decoding that fails with the forward passing: its step
        cached = task.cached if task is not None else None
        decode_step = localizes_decode_step(check.passed if check.tier1_passed is None else check.tier1_passed, cached)
        if exp.tiers.localize and (decode_step or check.failure_class in LOCALIZABLE) and not writer.has(
                "layers", job.model.name, job.inputs.name, spec.id):
            progress.describe(f"localizing {job.model.name} / {job.inputs.name} / {spec.id}")
            configured = copies.own(spec)  # its own copy, with this target's fallback modules
            step = lambda text, spec=spec: progress.describe(f"localizing {spec.id}: {text}")  # noqa: E731
            layers = (localize_decode_check(job, spec, configured, inputs, exp, cached, example, step) if decode_step
                      else localize_check(job, spec, configured, inputs, exp, example, target.notes, on_step=step))
            writer.write("layers", **layers.model_dump(exclude_unset=True, exclude={"kind"}))
        writer.write("check", **check.model_dump(exclude_unset=True, exclude={"kind"}), fingerprints=fingerprints[spec.id].model_dump())  # last: the judgement is complete

    def on_done(index: int, ex: Execution) -> None:
        """A target is judged as soon as it ends, once the reference (and the oracle) have, and its outputs let go:
        a job never holds every target's outputs at once (a language model's logits: hundreds of MB each)."""
        if index < len(job.baselines):
            baselines[index] = ex
            return
        reference = baselines.get(0)
        if reference is None or not reference.ok or (job.oracle and 1 not in baselines):
            return
        judge_target(specs[index], ex, reference, baselines[1] if job.oracle else None)
        judged_early.add(index)
        ex.outputs, ex.warmup_outputs, ex.follow_up = [], [], None

    with follow_up.asking(task_follow_up(job.model, exp)):  # a worker asks the same of its own executions
        done = executor.execute_together(job, specs, copies, inputs, example=example, on_run=on_run, on_done=on_done,
                                         on_step=lambda text: progress.describe(f"{job.model.name} / {job.inputs.name} / {text}"))
    reference = done[0]
    for index, ex in enumerate(done if reference.ok else done[:1]):
        if not ex.ok and index not in judged_early:
            _record_execution(writer, job, ex, None)
    progress.advance(job.executions - advanced)  # the repeats of failed and skipped executions
    if reference.status == "unavailable":
        raise ParityError(f"the reference backend {job.reference.id} cannot run here: {reference.error}")
    if not reference.ok:  # nothing to judge the targets against: their checks say so, and they are not run
        for spec in pending:
            check = judge(reference, spec, exp.tolerance_for(spec), **names)
            writer.write("check", **check.model_dump(exclude_unset=True, exclude={"kind"}), fingerprints=fingerprints[spec.id].model_dump())
        return
    oracle = done[1] if job.oracle else None
    for index in range(len(job.baselines), len(done)):
        if index not in judged_early:  # an executor that hands back every execution at the end
            judge_target(specs[index], done[index], reference, oracle)
            done[index] = None  # its outputs are dropped once its check is written


def _open_records(out_dir: Path, config: dict, base_dir: str, digest: str, fresh: bool) -> RecordWriter:
    """The run's records: new, or (the same experiment, not `fresh`) the ones already there, ready to append.
    A summary.json is the mark of a finished run: records without one are a run that ended early (killed,
    or model code that ended the process: os._exit), which is said; and the mark is removed until this
    run writes its own, with the previous reports (a junit.xml that passed checks a resumed run may remove and
    judge again), so no summary or report ever stands for records it does not count."""
    writer = RecordWriter(out_dir / "records.jsonl", resume=not fresh)
    try:
        summary = out_dir / "summary.json"
        if writer.records:
            _same_experiment(writer, config, base_dir, digest)
            if not summary.exists():
                log.warning("%s: the previous run ended without a summary (an error stopped it, it was killed, or "
                            "model code ended the process: os._exit); continuing it. The process executor "
                            "(--executor process) runs model code in a worker process, which cannot end the run", out_dir)
        for name in OUTPUT_FILES:  # the summary and the reports: this run writes its own
            if name not in IN_PLACE:
                _discard(out_dir / name)
        torn = writer.drop_torn_line()
        if torn:
            log.warning("%s: dropped a torn last line (%d bytes), the record an interrupted run was writing; it is "
                        "made again", writer.path, torn)
    except BaseException:
        writer.close()
        raise
    return writer


def _discard(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise ParityError(f"{path}: cannot remove the previous run's {path.name}: {exc.strerror or exc}") from exc


def _same_experiment(writer: RecordWriter, config: dict, base_dir: str, digest: str) -> None:
    """Refuses records of another experiment. Targets alone may differ: each check's fingerprints hold its
    target's settings, so the run re-runs the changed targets' checks (runner/resume.py)."""
    first, path = typed(writer.records[0]), writer.path  # the file's lines are valid records
    again = "give another --out, or pass --fresh to discard those records and start over"
    if not isinstance(first, Run):
        raise ParityError(f"{path}: does not start with a run record; {again}")
    if first.digest is None:
        raise ParityError(f"{path}: was written by a parity that did not record experiment digests, so it cannot "
                          f"be continued; {again}")
    if first.digest != digest:
        old = first.config.model_dump(exclude_unset=True)
        changed = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k) and k not in NOT_DIGESTED)
        if first.base_dir != base_dir:
            changed.append(f"base_dir {first.base_dir} -> {base_dir}")
        if changed == ["targets"]:
            return
        raise ParityError(f"{path.parent}: holds a run of experiment '{first.experiment}' with other settings "
                          f"(changed: {', '.join(changed) or 'details'}); a run continues only the same experiment: "
                          f"{again}")


def _keep_what_holds(writer: RecordWriter, exp: Experiment, jobs: list[Job], out_dir: Path, config: dict,
                     digest: str) -> None:
    """Resuming: say where the run stands, and remove the records of the judgements that no longer hold (their
    fingerprints changed, or their target left the experiment), so that they are made again; the run record
    then holds the experiment as it is now (its targets may have changed)."""
    checks = sum(len(j.targets) for j in jobs)
    stale = _stale(writer, exp, jobs)
    planned = {(j.model.name, j.inputs.name): [t.id for t in j.targets] for j in jobs}
    gone = {RunView.identity(c) for c in RunView(writer.records).checks(1)} - {
        (*pair, t) for pair, targets in planned.items() for t in targets}
    log.info("%s", resuming(out_dir, sum(judged(writer, j, t) for j in jobs for t in j.targets), checks, bool(stale)))
    if gone:
        log.info("removing the records of %d check(s) of target(s) no longer in the experiment: %s", len(gone),
                 ", ".join(sorted({t for _, _, t in gone})))
    if stale:
        log.info("%s", re_running(stale, checks))
    if stale or gone or typed(writer.records[0]).digest != digest:
        kept = without_stale(writer.records, set(stale) | gone, planned)
        if kept:
            kept[0] = {**kept[0], "digest": digest, "config": config}
        writer.keep_only(kept)


def run_experiment_to(exp: Experiment, out_dir: Path, progress: bool, fresh: bool, cache: ArtifactCache,
                      executor: Executor) -> RunResult:
    """`Runner.run`: every job of `exp` through `executor`, each model's exports kept in `cache`; the result
    checked against the plan, so that no front end can report a run that lost a check as a success."""

    prepare(out_dir)  # a folder parity can write in, and no link where it writes: before any work
    jobs = plan(exp)
    config = exp.model_dump(mode="json")
    digest = experiment_digest(config, str(exp.base_dir))
    bar = _Progress(sum(j.executions for j in jobs), progress)
    with _open_records(out_dir, config, str(exp.base_dir), digest, fresh) as writer, executor:
        checks = sum(len(j.targets) for j in jobs)
        if writer.records:
            _keep_what_holds(writer, exp, jobs, out_dir, config, digest)
        todo = [j for j in jobs if any(not judged(writer, j, t) for t in j.targets)]
        executor.on_status = bar.describe
        if not writer.records:
            writer.write("run", experiment=exp.name, digest=digest, config=config, file=exp.file,
                         base_dir=str(exp.base_dir), cache_dir=cache.given(), environment=run_environment(exp))
        elif todo:
            writer.write("resume", records=len(writer.records), checks_recorded=checks - sum(
                not judged(writer, j, t) for j in todo for t in j.targets), environment=run_environment(exp))
        # only what is left to judge: the reference, the oracle and the targets without a judgement
        executor.start(exp, [dataclasses.replace(j, targets=tuple(t for t in j.targets if not judged(writer, j, t)))
                             for j in todo], cache)
        examples = _Examples(exp)
        with bar.running():
            for model_spec in exp.models:
                model_jobs = [j for j in jobs if j.model is model_spec]
                if not any(j in todo for j in model_jobs):
                    bar.advance(sum(j.executions for j in model_jobs))
                    continue
                start = time.perf_counter()
                model, notes = prepared_model(model_spec, exp)
                model_part = model_fingerprints(model, source_fingerprint(model_spec, exp))
                built_notes = source_notes(model_spec, model)
                for note in built_notes:
                    log.info("model %s: %s", model_spec.name, note)
                writer.write("model", model=model_spec.name, parameters=sum(p.numel() for p in model.parameters()),
                             build_s=time.perf_counter() - start, adapters=notes, notes=built_notes or None)
                # holds the model until its first copy takes it; its weights digest is the fingerprints' own
                copies = ModelCopies.built(model_spec, exp, model, model_part.weights)
                del model
                with model_scope(cache, model_spec, exp):
                    for job in model_jobs:
                        _run_job(job, copies, exp, writer, bar, executor, examples, model_part)
                del copies
        records = writer.records
    summary = summarize(records)
    write_summary(summary, out_dir / "summary.json")
    result = RunResult(records, summary, [(j.model.name, j.inputs.name, t.id) for j in jobs for t in j.targets],
                       (out_dir / "summary.json").is_file())
    if not result.complete:
        log.error("internal error: the run into %s ended, but %s; no verdict is given (exit 3). This is a bug in "
                  "parity; please report it", out_dir, result.incomplete)
    return result


def run_environment(exp: Experiment) -> dict[str, Any]:
    """The environment a run (or its resumption) records: the executions' threads, the experiment's libraries."""
    return environment(exp.base_dir, exp.executor.execution_threads, libraries(exp))


def libraries(exp: Experiment) -> list[str]:
    """The libraries whose versions a run records: torch, torchvision and numpy, every library the
    experiment's reference and targets declare (`Backend.libraries`), and its models' sources' (transformers,
    timm: `Source.libraries`)."""
    found = ["torch", "torchvision", "numpy"]
    for spec in (exp.reference, *exp.targets):
        found += backend_class(spec.backend).libraries
    for model in exp.models:
        found += SOURCES.get(model.source).libraries
    return list(dict.fromkeys(found))


def _pick(kind: str, name: str | None, choices: list[str], option: str) -> str:
    if name is None:
        if len(choices) == 1:
            return choices[0]
        raise ParityError(f"the experiment has several {kind}s; choose one with {option.format(kind)} ({', '.join(choices)})")
    if name not in choices:
        raise ParityError(f"no {kind} '{name}'{did_you_mean(name, choices)} (the experiment has: {', '.join(choices)})")
    return name


class Runner:
    """One experiment into one output folder (`out_dir`: where `run` writes records.jsonl and summary.json, and
    where `localize` and `find_fallback` write their record when given). Every execution keeps its exports in
    `cache` (None: nothing is cached); `executor` runs the executions (None: the experiment's `executor:`)."""

    def __init__(self, exp: Experiment, out_dir: Path | None = None, cache: ArtifactCache | None = None,
                 executor: Executor | None = None):
        self.exp, self.out_dir = exp, out_dir
        self.cache = cache if cache is not None else ArtifactCache(None)
        self.executor = executor

    def run(self, progress: bool = True, fresh: bool = False) -> RunResult:
        """Run the experiment, writing OUT/records.jsonl and OUT/summary.json; returns the records with the
        summary and the verdict (`RunResult`: not `passed`, exit code 3, unless every planned check has a
        verdict and the summary was written). When OUT already holds records of this experiment, the run
        continues from them (see the module docstring); `fresh` discards them instead."""
        executor = self.executor if self.executor is not None else make_executor(self.exp.executor)
        return run_experiment_to(self.exp, self._out(), progress, fresh, self.cache, executor)

    def one_check(self, model: str | None = None, target: str | None = None, inputs: str | None = None,
                  option: str = "--{}") -> tuple[ModelSpec, BackendSpec, InputSetSpec]:
        """The model, target and input set that the names choose (None: the only one; inputs: the model's
        first), for `localize` and `find_fallback`. A name the experiment lacks is a ParityError with
        did-you-mean; `option` says how the caller chooses (`--model`, `model=`); a target that cannot run
        here says why."""
        exp = self.exp
        model_spec = next(m for m in exp.models if m.name == _pick("model", model, [m.name for m in exp.models], option))
        kind = SOURCES.get(model_spec.source).kind
        if kind != "module":
            raise ParityError(f"model '{model_spec.name}' is {MODEL_KINDS[kind]}, whose layers run no module hooks: "
                              "localize and fallback look inside a model through them")
        spec = next(t for t in exp.targets if t.id == _pick("target", target, [t.id for t in exp.targets], option))
        sets = exp.inputs_for(model_spec)
        input_spec = next(s for s in sets if s.name == _pick("inputs", inputs or sets[0].name, [s.name for s in sets], option))
        reason = backend_class(spec.backend).available(spec)
        if reason:
            raise ParityError(f"target {spec.id} cannot run here: {reason}")
        return model_spec, spec, input_spec

    def localize(self, model_spec: ModelSpec, target: BackendSpec, input_spec: InputSetSpec,
                 progress: bool = False) -> Layers:
        """The `layers` record of one model x target x input set, without running the whole experiment, with
        the tier-1 verdict it explains (`tier1`: does the check pass at the gate at all?). `progress`: a bar on stderr
        says what it does (the level, the layer k of n) and the time spent, as the run's does."""
        exp = self._tier2()
        model, _ = prepared_model(model_spec, exp)
        job, inputs, example = self._one_job(model_spec, target, input_spec)
        bar = _Progress(None, progress)
        if has_tensor_types(target):  # a file of typed tensors (llama.cpp): its groups, judged by tier 3's KLD
            self._typed_task(model_spec, target)
            with model_scope(self.cache, model_spec, exp), bar.running():
                record = localize_groups(exp.reference, target, model, inputs, example, exp.tiers.tasks or tasks_spec(),
                                         exp.tolerance_for(target).gate, lambda text: bar.describe(f"{target.id}: {text}"),
                                         names=(model_spec.name, input_spec.name))
            self._write_record("layers", record.model_dump(exclude_unset=True, exclude={"kind"}))
            return record
        with model_scope(self.cache, model_spec, exp), bar.running():
            bar.describe(f"{target.id}: the check at the gate")
            gate = gate_check(job, target, lambda spec: configured_model(model, spec, model_spec.name), inputs,
                              exp, example)
            configured = configured_model(model, target, model_spec.name)  # localize the target as it runs
            step = lambda text: bar.describe(f"{target.id}: {text}")  # noqa: E731
            if localizes_decode_step(gate.verdict.passed, gate.cached):
                # its forward agrees, its cached decoding does not: the decode step is what to look inside
                found = localize_decode_check(job, target, configured, inputs, exp, gate.cached, example, step)
            else:
                found = localize_check(job, target, configured, inputs, exp, example, gate.notes, on_step=step)
            record = Layers.made({**found.model_dump(exclude_unset=True), "tier1": gate.verdict.model_dump()})
        self._write_record("layers", record.model_dump(exclude_unset=True, exclude={"kind"}))
        return record

    def find_fallback(self, model_spec: ModelSpec, target: BackendSpec, input_spec: InputSetSpec, tier: int = 1,
                      command: str | None = None) -> Fallback:
        """A small set of modules to run eager (compile) or in float32 (bfloat16/float16) so that the check
        passes at the gate (`tier` 3: and its task metrics hold); `command` is the one that asked (its next
        step repeats it). Returns the `fallback` record it writes."""
        exp = self._tier2()
        if has_tensor_types(target):
            return self._fallback_groups(model_spec, target, input_spec)
        fallback_kind(target)  # a target that has no fallback fails here, before anything runs
        task = None
        if tier == 3:
            if model_spec.task not in evaluated():
                raise ParityError(f"--tier 3: model '{model_spec.name}' has task '{model_spec.task}'; tier 3 evaluates "
                                  f"{', '.join(evaluated())} (set the model's task:)")
            task = (model_spec.task, exp.tiers.tasks or tasks_spec())
        model, _ = prepared_model(model_spec, exp)  # adapters included, as parity run executes it
        job, inputs, example = self._one_job(model_spec, target, input_spec)
        tol = exp.tolerance_for(target)

        def candidates() -> list[str]:  # tier 2, only when the check fails without fallback
            layers = localize_check(job, target, model, inputs, exp, example, bisect=False)
            if layers.error:
                raise ParityError(f"localizing {target.id} failed, so there are no candidates: {layers.error}")
            return candidates_from(layers)

        with model_scope(self.cache, model_spec, exp):  # the trials' exports are cached as a run's
            result = search_fallback(exp.reference, target, model, inputs, candidates, tol, task=task,
                                     example=example, names=(model_spec.name, input_spec.name))
        if command is not None:
            result = result.model_copy(update={"next_step": next_step(
                result, command, model_spec.task if model_spec.task in evaluated() else None, target)})
        self._write_record("fallback", result.model_dump(exclude={"kind", "schema_version"}))
        return result

    def _typed_task(self, model_spec: ModelSpec, target: BackendSpec) -> None:
        if model_spec.task != TASK:
            raise ParityError(f"target {target.id} runs a file of typed tensors, which parity localizes by the {TASK} "
                              f"statistics (mean KLD); model '{model_spec.name}' has task '{model_spec.task}'")

    def _fallback_groups(self, model_spec: ModelSpec, target: BackendSpec,
                         input_spec: InputSetSpec) -> Fallback:
        """`find_fallback` for a file of typed tensors (llama.cpp): the fewest tensor groups to keep at a higher type
        so that tier 3 passes (runner/tensor_types.py), whatever `--tier` asked: its tier 1 has no fallback."""
        exp = self.exp
        self._typed_task(model_spec, target)
        model, _ = prepared_model(model_spec, exp)
        job, inputs, example = self._one_job(model_spec, target, input_spec)
        with model_scope(self.cache, model_spec, exp):
            found = fallback_groups(exp.reference, target, model, inputs, example, exp.tiers.tasks or tasks_spec(),
                                    exp.tolerance_for(target).gate)
        result = fallback_record(model=model_spec.name, inputs=input_spec.name, reference=exp.reference.id,
                                 target=target.id, **vars(found))
        if not result.passed:
            result = result.model_copy(update={"next_step": f"no set of tensor groups at {result.runs_in} passes tier 3: "
                                                            "keep them at a higher type (F16), or relax the "
                                                            "text-generation thresholds"})
        self._write_record("fallback", result.model_dump(exclude={"kind", "schema_version"}))
        return result

    def _tier2(self) -> Experiment:
        """The experiment as `localize` and `find_fallback` read it: tier 2 at its `tiers.activations`, or at
        the defaults when it sets none (a run then skips tier 2; these two are tier 2)."""
        tiers = self.exp.tiers
        if tiers.activations is not None:
            return self.exp
        return self.exp.model_copy(update={"tiers": tiers.model_copy(update={"activations": Activations()})})

    def problems_once_built(self) -> list[str]:
        """`parity validate --deep`: what `run` would refuse once it has built each model (a builder that raises,
        an adapter that raises or changes nothing, a fallback module the model lacks), every problem said, not the
        first. Models are built; nothing runs."""
        return [problem for spec in self.exp.models for problem in built_model_problems(spec, self.exp)]

    def _one_job(self, model_spec: ModelSpec, target: BackendSpec, input_spec: InputSetSpec) -> tuple[Job, Inputs, Inputs]:
        """The job of one check, its inputs and its example inputs (the model's `export_inputs`, else its first
        input set), from which `parity run` prepared every backend: localized or searched, the target is the
        artifact that failed, prepared from them and run on the inputs."""
        exp = self.exp
        job = Job(model_spec, input_spec, exp.reference, None, (target,), 1, example_for(exp, model_spec))
        inputs = _build(input_spec, exp, model_spec)
        example = inputs if job.prepared_from.name == input_spec.name else _build(job.prepared_from, exp, model_spec)
        return job, inputs, example

    def _out(self) -> Path:
        if self.out_dir is None:
            raise ParityError("a run needs an output folder (--out)")
        return self.out_dir

    def _write_record(self, kind: str, record: dict[str, Any]) -> None:
        """`localize` and `find_fallback` write their record (after the experiment's `run` record) into
        OUT/records.jsonl when the Runner has an output folder."""
        if self.out_dir is None:
            return
        exp = self.exp
        with RecordWriter(self.out_dir / "records.jsonl") as writer:
            writer.write("run", experiment=exp.name, config=exp.model_dump(mode="json"), base_dir=str(exp.base_dir),
                         environment=environment(exp.base_dir, libraries=libraries(exp)))
            writer.write(kind, **record)
