"""The local executor: builds each model once, runs every backend on its own copy, judges, records.

Memory stays bounded by one model and input set at a time: the reference's (and oracle's) outputs are
kept while that job's targets run, and each target's outputs are dropped once its check is written.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parity.adapters import apply_adapters
from parity.adapters.fallback import apply_fallback, fallback_for
from parity.config.schema import Experiment
from parity.errors import ParityError, did_you_mean
from parity.inputs import build_inputs
from parity.models import build_model
from parity.records import RecordWriter, environment
from parity.runner import cache
from parity.runner.execute import Execution
from parity.runner.executors import Executor, make_executor
from parity.runner.plan import Job, plan
from parity.verify.checks import repeat_spread, tier1_check
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
                     run_s=None, error=ex.error, failure_class=ex.failure_class, cached=ex.cached)
    else:
        writer.write("execution", **fields, repeat=repeat, status="ok", prepare_s=ex.prepare_s if repeat == 0 else 0.0,
                     run_s=ex.run_s[repeat], error=None, failure_class=None, cached=ex.cached)


def _run_job(job: Job, model, exp: Experiment, writer: RecordWriter, progress: _Progress, executor: Executor) -> None:
    try:
        inputs = build_inputs(job.inputs, exp, job.model.batch_mode)
    except ParityError:
        raise
    except Exception as exc:  # e.g. a tensor too large for this machine's memory
        raise ParityError(f"input set '{job.inputs.name}': cannot build it: {type(exc).__name__}: {exc}") from exc

    def as_configured(spec):
        """The model as this target runs it: with its fallback modules, when it has some."""
        names = fallback_for(spec, job.model.name)
        return apply_fallback(model, names, spec) if names else model

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
    oracle = run(job.oracle) if job.oracle else None
    ref_spread = repeat_spread(reference.outputs, exp.tolerances.rtol, exp.tolerances.gate_atol) if reference.ok else 0.0
    for spec in job.targets:
        target = run(spec)
        check = tier1_check(job, target, reference, oracle, exp, ref_spread)
        task = task_check(job, target, reference, exp, inputs) if exp.tiers.evaluate_tasks else None
        if task and task["same_set"] and check["failure_class"] == "numeric_drift":
            check["failure_class"] = "ordering"
            check["detail"] = f"the same {job.model.task} outputs in another order (tier 3 matched all): {check['detail']}"
        writer.write("check", **check)
        if task:
            writer.write("check", **task)
        if exp.tiers.localize and check["failure_class"] in LOCALIZABLE:
            progress.describe(f"localizing {job.model.name} / {job.inputs.name} / {spec.id}")
            writer.write("layers", **localize_check(job, spec, as_configured(spec), inputs, exp))


def run_experiment_to(exp: Experiment, out_dir: Path, progress: bool = True) -> list[dict[str, Any]]:
    """Run `exp`, writing OUT/records.jsonl and OUT/summary.json; returns the records."""
    from parity.report.summary import summarize, write_summary

    jobs = plan(exp)
    bar = _Progress(sum(j.executions for j in jobs), progress)
    with RecordWriter(out_dir / "records.jsonl") as writer, make_executor(exp.executor) as executor:
        writer.write("run", experiment=exp.name, config=exp.model_dump(mode="json"),
                     base_dir=str(exp.base_dir), environment=environment(exp.base_dir))
        executor.start(exp, jobs)
        with bar.running():
            for model_spec in exp.models:
                start = time.perf_counter()
                model, notes = prepared_model(model_spec, exp)
                writer.write("model", model=model_spec.name, parameters=sum(p.numel() for p in model.parameters()),
                             build_s=time.perf_counter() - start, adapters=notes)
                with model_identity(model_spec, exp):
                    for job in (j for j in jobs if j.model is model_spec):
                        _run_job(job, model, exp, writer, bar, executor)
                del model
        records = writer.records
    write_summary(summarize(records), out_dir / "summary.json")
    return records


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
    """Exports of this model may be cached (runner/cache.py): what the experiment says it is."""
    return cache.model_identity(spec.model_dump(mode="json"), [a.model_dump(mode="json") for a in exp.adapters_for(spec)])


def build_model_or_explain(spec, exp):
    try:
        return build_model(spec, exp)
    except ParityError:
        raise
    except Exception as exc:  # the user's model code raised while being built
        raise ParityError(f"model '{spec.name}': building it failed: {type(exc).__name__}: {exc}") from exc
