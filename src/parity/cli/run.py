"""`parity run`, `parity check` and `parity validate`: experiments judged or checked, each command on an
experiment of its own (options narrow or override a copy, never the experiment it was given)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from parity.cli.logs import LOG_FILE, library_logs
from parity.cli.terminal import EXIT_OK, make_console
from parity.errors import ParityError, did_you_mean
from parity.files import user_path
from parity.outdir import prepare

if TYPE_CHECKING:
    from parity.config.schema import Experiment


def cmd_run(args: argparse.Namespace, experiments: list | None = None) -> int:
    """Run the files of `args` or, from `parity check`, the validated `experiments`: print the table, write
    the reports, return the exit code."""
    from parity.api import default_out_dir
    from parity.experiment import load_experiment
    from parity.report import write_reports
    from parity.report.console import render
    from parity.runner.runner import Runner

    if experiments is None:
        experiments = [load_experiment(f) for f in args.files]  # every file is validated before anything runs
        if args.model_filter or args.target_filter or args.inputs_filter:  # else the experiment as written
            experiments = [narrowed(exp, args) for exp in experiments]
    experiments = [with_executor_options(exp, args) for exp in experiments]
    names = [exp.name for exp in experiments]
    if len(experiments) > 1 and len(set(names)) < len(names):
        raise ParityError(f"experiments need distinct names to share --out (got {', '.join(names)}); set 'name:' in each file")
    out = None if args.out is None else user_path(args.out, "--out")
    out_dirs = [default_out_dir(exp) if out is None else out / exp.name if len(experiments) > 1 else out
                for exp in experiments]
    for out_dir in out_dirs:  # every folder is checked before anything runs, as every file is
        prepare(out_dir)
    code = EXIT_OK
    for exp, out_dir in zip(experiments, out_dirs, strict=True):
        with library_logs(out_dir / LOG_FILE, args.verbose):
            result = Runner(exp, out_dir, args.artifact_cache).run(progress=not args.quiet, fresh=args.fresh)
        records, summary = result.records, result.summary
        reports = [] if args.no_report else write_reports(out_dir, records, summary)
        render(records, summary, out_dir, make_console(), reports, args.allow_unavailable)
        if args.verbose:
            _print_tracebacks(records)
        for e in summary.reference_errors:
            if e.user_error:
                # the error itself is on the table's `reference failed` line: a runtime's message (ONNX Runtime's
                # quotes its whole C++ error) is not printed twice
                print(f"error: model '{e.model}' on input set '{e.inputs}': the reference {e.reference} raised "
                      f"({e.failure_class}), so no target was judged (its error: the 'reference failed' "
                      f"line above, and {out_dir / 'records.jsonl'})", file=sys.stderr)
        code = max(code, result.code(args.allow_unavailable))  # 3 when the run lost a check (the Runner says which)
    return code


def narrowed(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """`parity run --model/--target/--inputs` (each repeatable): a copy of `exp` with only the checks they
    choose, as the whole run would judge them (each model keeps its example input set), so that CI jobs can
    share an experiment out. A name the experiment lacks, or filters that leave no check, is exit 2."""
    from parity.experiment.targets import choose
    from parity.runner.plan import example_for

    where = f"{exp.file}: " if exp.file else ""

    def chosen(option: str, names: list[str], given: list[str]) -> set[str]:
        """The names `option` chose (all of them when it is not given); a name the experiment lacks is refused."""
        for name in given:
            if name not in names:
                raise ParityError(f"{where}{option} {name}: the experiment has no such {option[2:]}"
                                  f"{did_you_mean(name, names)} (it has: {', '.join(names)})")
        return set(given or names)

    model_names = chosen("--model", [m.name for m in exp.models], args.model_filter or [])
    # the grammar `parity check --target` takes: `onnxruntime` is onnxruntime-cpu
    target_ids = chosen("--target", [t.id for t in exp.targets],
                        [choose(text, exp.targets, f"{where}--target").id for text in args.target_filter or []])
    input_names = chosen("--inputs", [s.name for s in exp.inputs], args.inputs_filter or [])
    models = []
    for m in exp.models:
        sets = [s.name for s in exp.inputs_for(m) if s.name in input_names]
        if m.name in model_names and sets:
            models.append(m.model_copy(update={"inputs": sets, "export_inputs": example_for(exp, m).name}))
    if not models:
        raise ParityError(f"{where}--model/--inputs: no model of the experiment runs on the input sets chosen "
                          "(a model's `inputs:` names the sets it runs on)")
    return exp.model_copy(update={"models": models,
                                  "targets": [t for t in exp.targets if t.id in target_ids]})


def _print_tracebacks(records: list[dict]) -> None:
    """`--verbose`: each failed execution's whole traceback, as its record keeps it."""
    from parity.records.view import RunView

    for r in RunView.of(records).executions():
        if r.traceback:
            print(f"\n--- {r.model} / {r.inputs} / {r.backend} (repeat {r.repeat}): {r.error}\n{r.traceback}",
                  file=sys.stderr)


def with_executor_options(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """A copy of `exp` with the executor --executor, --address, --workers and --timeout set: they win over the
    file's `executor:`; the file's other settings stay where they still apply (its timeout and threads unless the
    executor becomes local). --address and --workers each replace the other's setting in the file: a cluster to
    join, or the size of a Ray started here."""
    from pydantic import ValidationError

    from parity.config.schema import ExecutorSpec
    from parity.errors import field_errors

    settings = exp.executor.model_dump(exclude_none=True)
    if args.executor and args.executor != exp.executor.kind:
        keep = ("timeout", "threads") if args.executor != "local" else ()
        settings = {"kind": args.executor, **{k: v for k, v in settings.items() if k in keep}}
    if args.address is not None:
        settings.pop("workers", None)
    if args.workers is not None:
        settings.pop("address", None)
    for key in ("address", "workers", "timeout"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    try:
        executor = ExecutorSpec.model_validate(settings)
    except ValidationError as exc:
        error = field_errors(exc)[0]
        where = ".".join(map(str, error.loc)) or "executor"
        raise ParityError(f"--executor/--address/--workers/--timeout: {where}: {error.message}") from exc
    return exp.model_copy(update={"executor": executor})


def cmd_check(args: argparse.Namespace) -> int:
    """One model against one or more targets from the command line alone: the experiment it makes is run
    as `parity run` runs a file (same table, records, reports and exit codes)."""
    from parity.api import default_out_dir
    from parity.check_command import RAN, check_experiment, check_notes, save_experiment, save_ran
    from parity.experiment import experiment_from_dict

    data = check_experiment(args.model, args.target, reference=args.reference, entry=args.entry,
                            hubconf=args.hubconf, weights=args.weights, shapes=args.input or [],
                            images=args.images or [], preprocess=args.preprocess, resize=args.resize,
                            crop=args.crop, gate=args.gate, rtol=args.rtol, seed=args.seed, name=args.name)
    exp = experiment_from_dict(data, "parity check", Path.cwd())
    for note in check_notes(exp):
        print(note, file=sys.stderr)
    if args.save_experiment:  # refused (an existing file) before the output folder is made
        save_experiment(data, Path(args.save_experiment))
    args = argparse.Namespace(**{**vars(args), "out": args.out or str(default_out_dir(exp))})  # the experiment goes
    # in the output folder: the next: lines start from it
    prepare(user_path(args.out, "--out"))
    save_ran(data, user_path(args.out, "--out"))
    exp._file = args.save_experiment or str(Path(args.out) / RAN)  # as typed: the next: lines name it, to run from here
    print(f"experiment: {exp._file} (parity run {shlex.quote(exp._file)} runs it again)", file=sys.stderr)
    return cmd_run(args, [exp])


def cmd_validate(args: argparse.Namespace) -> int:
    from parity.experiment import load_experiment
    from parity.runner.prepared import checked_on_built_models
    from parity.runner.runner import Runner

    problems: list[str] = []
    deep_would_check = False
    for f in args.files:
        try:
            exp = load_experiment(f)
        except ParityError as exc:
            problems += exc.problems
            continue
        found = [f"{f}: {problem}" for problem in Runner(exp).problems_once_built()] if args.deep else []
        problems += found
        deep_would_check |= not args.deep and checked_on_built_models(exp)
        if not found:
            print(f"{f}: valid ({len(exp.models)} model(s), {len(exp.inputs)} input set(s), {len(exp.targets)} target(s))")
    if deep_would_check:
        print("note: fallback module names and adapters are checked on the built models: add --deep")
    if problems:
        raise ParityError(*problems)
    return EXIT_OK
