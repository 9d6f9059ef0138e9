"""The local executor: builds each model once, runs every backend on its own copy, judges, records.

Memory stays bounded by one model and input set at a time: the reference's (and oracle's) outputs are
kept while that job's targets run, and each target's outputs are dropped once its check is written.

Resuming. A run into a folder that already holds records of the same experiment continues it. The unit
of resumption is a *judgement*: one target on one (model, input set), that is its tier-1 check together
with the tier-3 check and the `layers` record that belong to it. The tier-1 check is written last, so a
recorded tier-1 check means the whole judgement is recorded; such targets are not executed again. A job
(model, input set) with a judgement missing re-executes its reference (and oracle), because a verdict
needs their outputs and outputs are not recorded, and the missing targets. Records whose key is already
in the file (an execution repeat, a model, a tier-3 check) are not written again, so nothing appears
twice. A model whose judgements are all recorded is not even built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parity import taxonomy as tx
from parity.adapters import apply_adapters
from parity.adapters.fallback import fallback_for
from parity.config.schema import Experiment
from parity.errors import ParityError, did_you_mean
from parity.execute import cache
from parity.execute.execution import Execution, ends_the_program
from parity.inputs import build_inputs
from parity.models import build_model, source_fingerprint
from parity.records import NOT_DIGESTED, RecordWriter, environment, experiment_digest
from parity.records.summary import summarize, write_summary
from parity.runner.executors import Executor, configured_model, make_executor
from parity.runner.plan import Job, plan
from parity.verify.checks import gate_on_task, reference_error_check, tier1_check
from parity.verify.localize import LOCALIZABLE, localize_check
from parity.verify.tasks import task_check


class _Progress:
    """A rich progress bar over executions; silent when not wanted."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
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
            self.bar.update(self.task, description=text[:48])

    def advance(self, n: int = 1) -> None:
        if self.enabled:
            self.bar.advance(self.task, n)


def _record_execution(writer: RecordWriter, job: Job, ex: Execution, repeat: int | None) -> None:
    fields: dict[str, Any] = {"model": job.model.name, "inputs": job.inputs.name, "backend": ex.backend.id,
                              "device": ex.backend.device, "dtype": ex.backend.dtype}
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


def _run_job(job: Job, model, exp: Experiment, writer: RecordWriter, progress: _Progress,
            executor: Executor) -> None:
    pending = [spec for spec in job.targets if not judged(writer, job, spec)]
    if not pending:
        progress.advance(job.executions)
        return
    try:
        inputs = build_inputs(job.inputs, exp, job.model.batch_mode)
    except ParityError:
        raise
    except Exception as exc:  # e.g. a tensor too large for this machine's memory
        raise ParityError(f"input set '{job.inputs.name}': cannot build it: {type(exc).__name__}: {exc}") from exc
    for note in inputs.notes:  # a constant input: every backend agrees on it, so its checks prove little
        writer.write("warning", model=job.model.name, inputs=job.inputs.name, message=note)

    def run(spec) -> Execution:
        progress.describe(f"{job.model.name} / {job.inputs.name} / {spec.id}")
        ex = executor.execute(job, spec, model, inputs, on_run=lambda e, r: _record_execution(writer, job, e, r))
        if not ex.ok:
            _record_execution(writer, job, ex, None)
        progress.advance(job.repeats)
        return ex

    reference = run(job.reference)
    if reference.status == "unavailable":
        raise ParityError(f"the reference backend {job.reference.id} cannot run here: {reference.error}")
    if not reference.ok:  # nothing to judge the targets against: their checks say so, and they are not run
        progress.advance(job.executions - job.repeats)
        for spec in pending:
            writer.write("check", **reference_error_check(job, spec, reference, exp))
        return
    oracle = run(job.oracle) if job.oracle else None
    for spec in job.targets:
        if spec not in pending:
            progress.advance(job.repeats)
            continue
        target = run(spec)
        check = tier1_check(job, target, reference, oracle, exp)
        task = task_check(job, target, reference, exp, inputs) if exp.tiers.evaluate_tasks else None
        if task and task["same_set"] and check["failure_class"] == tx.NUMERIC_DRIFT:
            check["failure_class"] = tx.ORDERING
            check["detail"] = f"the same {job.model.task} outputs in another order (tier 3 matched all): {check['detail']}"
        if task:
            writer.write("check", **task)
            if check["gated_by"] == "tier3":
                gate_on_task(check, task)
        localize = exp.tiers.localize and check["failure_class"] in LOCALIZABLE
        if localize and not writer.has("layers", job.model.name, job.inputs.name, spec.id):
            progress.describe(f"localizing {job.model.name} / {job.inputs.name} / {spec.id}")
            writer.write("layers", **localize_check(job, spec, configured_model(model, spec, job.model.name), inputs, exp))
        writer.write("check", **check)  # last: once it is in the file, this judgement is complete


def _open_records(out_dir: Path, config: dict, base_dir: str, digest: str, fresh: bool) -> RecordWriter:
    """The run's records: new, or (the same experiment, not `fresh`) the ones already there, ready to append.
    A summary.json is the mark of a finished run: records without one are a run that ended early (killed,
    or model code that ended the process: os._exit), which is said; and the mark is removed until this
    run writes its own, so no summary ever stands for records it does not count."""
    writer = RecordWriter(out_dir / "records.jsonl", resume=not fresh)
    try:
        summary = out_dir / "summary.json"
        if writer.records:
            _same_experiment(writer, config, base_dir, digest)
            if not summary.exists():
                print(f"warning: {out_dir}: the previous run ended without a summary (an error stopped it, it was "
                      "killed, or model code ended the process: os._exit); continuing it. The process executor (--executor process) "
                      "runs model code in a worker process, which cannot end the run", file=sys.stderr)
        _discard(summary)
        torn = writer.drop_torn_line()
        if torn:
            print(f"{writer.path}: dropped a torn last line ({torn} bytes), the record an interrupted run was "
                  "writing; it is made again", file=sys.stderr)
    except BaseException:
        writer.close()
        raise
    return writer


def _discard(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise ParityError(f"{path}: cannot remove the previous run's summary: {exc.strerror or exc}") from exc


def _same_experiment(writer: RecordWriter, config: dict, base_dir: str, digest: str) -> None:
    first, path = writer.records[0], writer.path
    again = "give another --out, or pass --fresh to discard those records and start over"
    if first.get("kind") != "run":
        raise ParityError(f"{path}: does not start with a run record; {again}")
    if "digest" not in first:
        raise ParityError(f"{path}: was written by a parity that did not record experiment digests, so it cannot "
                          f"be continued; {again}")
    if first["digest"] != digest:
        old = first.get("config") or {}
        changed = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k) and k not in NOT_DIGESTED)
        if first.get("base_dir") != base_dir:
            changed.append(f"base_dir {first.get('base_dir')} -> {base_dir}")
        raise ParityError(f"{path.parent}: holds a run of experiment '{first.get('experiment')}' with other settings "
                          f"(changed: {', '.join(changed) or 'details'}); a run continues only the same experiment: "
                          f"{again}")


def run_experiment_to(exp: Experiment, out_dir: Path, progress: bool = True, fresh: bool = False) -> list[dict[str, Any]]:
    """Run `exp`, writing OUT/records.jsonl and OUT/summary.json; returns the records. When OUT already
    holds records of this experiment, the run continues from them (see the module docstring); `fresh`
    discards them instead."""
    from parity.outdir import prepare

    prepare(out_dir)  # a folder parity can write in, and no link where it writes: before any work
    jobs = plan(exp)
    config = exp.model_dump(mode="json")
    digest = experiment_digest(config, str(exp.base_dir))
    bar = _Progress(sum(j.executions for j in jobs), progress)
    with _open_records(out_dir, config, str(exp.base_dir), digest, fresh) as writer, \
            make_executor(exp.executor) as executor:
        todo = [j for j in jobs if any(not judged(writer, j, t) for t in j.targets)]
        executor.on_status = bar.describe
        if not writer.records:
            writer.write("run", experiment=exp.name, digest=digest, config=config, file=exp.file,
                         base_dir=str(exp.base_dir), environment=run_environment(exp))
        elif todo:
            checks = sum(len(j.targets) for j in jobs)
            left = sum(not judged(writer, j, t) for j in todo for t in j.targets)
            print(f"resuming {out_dir}: {checks - left} of {checks} checks already recorded", file=sys.stderr)
            writer.write("resume", records=len(writer.records), checks_recorded=checks - left,
                         environment=run_environment(exp))
        # only what is left to judge: the reference, the oracle and the targets without a judgement
        executor.start(exp, [dataclasses.replace(j, targets=tuple(t for t in j.targets if not judged(writer, j, t)))
                             for j in todo])
        with bar.running():
            for model_spec in exp.models:
                model_jobs = [j for j in jobs if j.model is model_spec]
                if not any(j in todo for j in model_jobs):
                    bar.advance(sum(j.executions for j in model_jobs))
                    continue
                start = time.perf_counter()
                model, notes = prepared_model(model_spec, exp)
                writer.write("model", model=model_spec.name, parameters=sum(p.numel() for p in model.parameters()),
                             build_s=time.perf_counter() - start, adapters=notes)
                with model_identity(model_spec, exp):
                    for job in model_jobs:
                        _run_job(job, model, exp, writer, bar, executor)
                del model
        records = writer.records
    write_summary(summarize(records), out_dir / "summary.json")
    return records


def run_environment(exp: Experiment) -> dict[str, Any]:
    """The environment a run (or its resumption) records: the executions' threads, the experiment's libraries."""
    return environment(exp.base_dir, exp.executor.execution_threads, libraries(exp))


def libraries(exp: Experiment) -> list[str]:
    """The libraries whose versions a run records: torch, torchvision and numpy, and every library the
    experiment's reference and targets declare (`Backend.libraries`)."""
    from parity.backends import backend_class

    found = ["torch", "torchvision", "numpy"]
    for spec in (exp.reference, *exp.targets):
        found += backend_class(spec.backend).libraries
    return list(dict.fromkeys(found))


def prepared_model(spec, exp) -> tuple:
    """The model as every command runs it: built, adapters applied, and each target's fallback checked
    against its modules before anything executes. Returns (model, what the adapters changed)."""
    model = build_model_or_explain(spec, exp)
    notes = apply_adapters(model, exp.adapters_for(spec), exp)
    known = {n for n, _ in model.named_modules()}
    for target in exp.targets:
        for name in fallback_for(target, spec.name):
            if name not in known:
                raise ParityError(f"target {target.id}: fallback names '{name}', which model '{spec.name}' does not "
                                  f"have{did_you_mean(name, sorted(known))}")
    return model, notes


def model_identity(spec, exp):
    """Exports of this model may be cached (execute/cache.py): what the experiment says it is, and what its
    source reads it from."""
    return cache.model_identity(spec.model_dump(mode="json"), [a.model_dump(mode="json") for a in exp.adapters_for(spec)],
                                source_fingerprint(spec, exp))


def build_model_or_explain(spec, exp):
    """The model, or a ParityError naming it: whatever its builder raised, including a SystemExit (a
    command-line parser in the builder, `exit()`), which would otherwise end parity without a verdict."""
    try:
        return build_model(spec, exp)
    except ParityError:
        raise
    except Exception as exc:  # the user's model code raised while being built
        raise ParityError(f"model '{spec.name}': building it failed: {type(exc).__name__}: {exc}") from exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise ParityError(f"model '{spec.name}': building it failed: {ends_the_program(exc)} in its builder; "
                          "parity needs a builder that returns the model") from exc
