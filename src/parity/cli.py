"""The command line: `parity run`, `parity check`, `parity report`, `parity validate`, `parity localize`,
`parity fallback`, `parity reduce`, `parity backends`, `parity cache info|clear`, `parity completion
bash|zsh`. One function per verb.

Exit codes: 0 every check passed at the gate; 1 some check failed or has no verdict (a target could not
run here, the reference crashed); 2 user error (bad file, unknown name, missing file, a model that raises on
its inputs in the eager reference); 3 internal error (a bug in parity: please report).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import io
import logging
import os
import shlex
import signal
import subprocess
import sys
import traceback
from pathlib import Path

from parity.dtypes import DTYPES, QUANTIZE_SCHEMES
from parity.errors import ParityError, clip, clip_problem, did_you_mean
from parity.files import user_path
from parity.offline import STATE_ENV, die_with_parent, keep_state_in
from parity.outdir import prepare

EXIT_OK, EXIT_FAILED, EXIT_USER, EXIT_BUG = 0, 1, 2, 3


def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:  # CI logs and pipes: wide enough that the table is not cut
        console = Console(stderr=stderr, highlight=False, width=160)
    return console


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
            for exp in experiments:
                _narrow(exp, args)
    for exp in experiments:
        _executor_options(exp, args)
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
        render(records, summary, out_dir, _console(), reports, args.allow_unavailable)
        if args.verbose:
            _print_tracebacks(records)
        for e in summary["reference_errors"]:
            if e["user_error"]:
                print(f"error: model '{e['model']}' on input set '{e['inputs']}': the reference {e['reference']} "
                      f"raised, so no target was judged: {e['detail'].split(': ', 1)[-1]}", file=sys.stderr)
        code = max(code, result.code(args.allow_unavailable))  # 3 when the run lost a check (the Runner says which)
    return code


def _narrow(exp, args: argparse.Namespace) -> None:
    """`parity run --model/--target/--inputs` (each repeatable): only the checks they choose, as the whole run
    would judge them (each model keeps its example input set), so that CI jobs can share an experiment out. A
    name the experiment lacks, or filters that leave no check, is exit 2."""
    from parity.runner.plan import example_for

    where = f"{exp.file}: " if exp.file else ""
    chosen = {}
    from parity.experiment.targets import choose

    for option, names in (("--model", [m.name for m in exp.models]), ("--target", [t.id for t in exp.targets]),
                          ("--inputs", [s.name for s in exp.inputs])):
        given = getattr(args, option.removeprefix("--") + "_filter") or []
        if option == "--target":  # the grammar `parity check --target` takes: `onnxruntime` is onnxruntime-cpu
            given = [choose(text, exp.targets, f"{where}--target").id for text in given]
        for name in given:
            if name not in names:
                raise ParityError(f"{where}{option} {name}: the experiment has no such {option[2:]}"
                                  f"{did_you_mean(name, names)} (it has: {', '.join(names)})")
        chosen[option] = set(given or names)
    models = []
    for m in exp.models:
        sets = [s.name for s in exp.inputs_for(m) if s.name in chosen["--inputs"]]
        if m.name in chosen["--model"] and sets:
            models.append(m.model_copy(update={"inputs": sets, "export_inputs": example_for(exp, m).name}))
    if not models:
        raise ParityError(f"{where}--model/--inputs: no model of the experiment runs on the input sets chosen "
                          "(a model's `inputs:` names the sets it runs on)")
    exp.models = models
    exp.targets = [t for t in exp.targets if t.id in chosen["--target"]]


def _print_tracebacks(records: list[dict]) -> None:
    """`--verbose`: each failed execution's whole traceback, as its record keeps it."""
    from parity.records.view import RunView

    for r in RunView.of(records).executions():
        if r.traceback:
            print(f"\n--- {r.model} / {r.inputs} / {r.backend} (repeat {r.repeat}): {r.error}\n{r.traceback}",
                  file=sys.stderr)


def _executor_options(exp, args: argparse.Namespace) -> None:
    """--executor, --address, --workers and --timeout win over the file's `executor:`; the file's other
    settings stay where they still apply (its timeout and threads unless the executor becomes local).
    --address and --workers each replace the other's setting in the file: a cluster to join, or the size
    of a Ray started here."""
    from pydantic import ValidationError

    from parity.config.schema import ExecutorSpec

    settings = exp.executor.model_dump(exclude_none=True)
    if args.executor and args.executor != settings["kind"]:
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
        exp.executor = ExecutorSpec.model_validate(settings)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"])) or "executor"
        raise ParityError(f"--executor/--address/--workers/--timeout: {where}: {error['msg'].removeprefix('Value error, ')}") from exc


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
    for note in check_notes(data):
        print(note, file=sys.stderr)
    if args.save_experiment:  # refused (an existing file) before the output folder is made
        save_experiment(data, Path(args.save_experiment))
    args.out = args.out or str(default_out_dir(exp))  # the experiment goes in it: the next: lines start from it
    prepare(user_path(args.out, "--out"))
    save_ran(data, user_path(args.out, "--out"))
    exp._file = args.save_experiment or str(Path(args.out) / RAN)  # as typed: the next: lines name it, to run from here
    print(f"experiment: {exp._file} (parity run {shlex.quote(exp._file)} runs it again)", file=sys.stderr)
    return cmd_run(args, [exp])


def cmd_report(args: argparse.Namespace) -> int:
    """Render summary.json, report.md, report.html and junit.xml again from a run's records.jsonl alone, and
    print the table the run printed."""
    from parity.records.io import being_written
    from parity.records.summary import summarize, write_summary
    from parity.records.view import RunView
    from parity.report import write_reports
    from parity.report.console import render

    out_dir = user_path(args.run_dir, "RUN_DIR")
    view = RunView.read(out_dir)
    refused = _name_problem(view, out_dir / "records.jsonl")
    if refused:
        raise ParityError(refused)
    if being_written(out_dir / "records.jsonl"):
        raise ParityError(f"RUN_DIR {out_dir}: the run is still in progress (a parity process is writing its "
                          "records.jsonl); report it once that run has ended")
    missing = view.unfinished()
    if missing:  # no summary.json (the mark of a finished run, which a continued run reads), no junit that passes
        file = shlex.quote(view.run.file) if view.run.file else "EXPERIMENT"
        raise ParityError(f"RUN_DIR {out_dir}: the run ended early: {missing}; no report is written, so that none reads "
                          f"as a pass. Continue it (parity run {file} --out {shlex.quote(str(out_dir))}), then report")
    prepare(out_dir, "RUN_DIR")  # where the reports go: no link, no folder in a report's place
    summary = summarize(view)
    write_summary(summary, out_dir / "summary.json")
    render(view, summary, out_dir, _console(), write_reports(out_dir, view, summary))
    return EXIT_OK


def _name_problem(view, path: Path) -> str | None:
    """Why the records at `path` hold a name no experiment file could (config.schema.check_name: a `<script>`,
    a newline, a pipe), or None: such records were not written by parity, and their report is not rendered."""
    from parity.config.schema import check_name

    named = [("model", m.name) for m in view.run.config.models]
    named += [("input set", i.get("name")) for i in view.run.config.inputs]
    for record in view:
        named += [(what, getattr(record, what, None)) for what in ("model", "inputs", "target")]
    for what, name in named:
        if name is None:
            continue
        try:
            check_name(name) if isinstance(name, str) else check_name("")
        except ValueError as exc:
            return f"{path}: names {what} {clip(repr(name), 80)}, which no experiment file can name ({exc}); not written by parity"
    return None


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


def _one_check(args: argparse.Namespace):
    """The experiment, and the model, target and input set that --model, --target, --inputs choose
    (with tier-2 settings overridden by --granularity and --mode where given)."""
    from pydantic import ValidationError

    from parity.config.schema import Activations
    from parity.experiment import load_experiment
    from parity.experiment.targets import choose
    from parity.runner.runner import Runner

    _refuse_existing_records(args.out)
    exp = load_experiment(args.file)
    chosen = choose(args.target, exp.targets).id if args.target else None  # the grammar every command takes
    model_spec, target, input_spec = Runner(exp).one_check(args.model, chosen, args.inputs)
    settings = (exp.tiers.activations or Activations()).model_dump()
    if getattr(args, "granularity", None):
        named = args.granularity not in ("blocks", "leaf") and not args.granularity.startswith("depth:")
        settings["granularity"] = args.granularity.split(",") if named else args.granularity
    if getattr(args, "mode", None):
        settings["mode"] = args.mode
    try:
        exp.tiers = exp.tiers.model_copy(update={"activations": Activations.model_validate(settings)})
    except ValidationError as exc:
        raise ParityError(f"--granularity/--mode: {exc.errors()[0]['msg']}") from exc
    return exp, model_spec, target, input_spec


def _refuse_existing_records(out: str | None) -> None:
    """localize and fallback write a records file of their own: never over a run's (checked before the
    minutes of work, not after)."""
    if not out:
        return
    prepare(user_path_of(out), files=("records.jsonl", LOG_FILE))
    if (user_path_of(out) / "records.jsonl").exists():
        raise ParityError(f"--out {out}: it already holds records.jsonl (a run's records?); "
                          "give a folder of its own to this command's record")


def _log_file(args: argparse.Namespace) -> Path | None:
    """Where localize and fallback keep the libraries' logging: run.log in their --out, else nowhere."""
    return user_path_of(args.out) / LOG_FILE if args.out else None


def user_path_of(out: str) -> Path:
    return user_path(out, "--out")


def _runner(args: argparse.Namespace, exp):
    from parity.runner.runner import Runner

    return Runner(exp, user_path_of(args.out) if args.out else None, args.artifact_cache)


def _said_records(args: argparse.Namespace) -> None:
    if args.out:
        print(f"records: {user_path_of(args.out) / 'records.jsonl'}")


def cmd_localize(args: argparse.Namespace) -> int:
    """Localize one model x target without running the whole experiment; print the per-layer tables, and
    the `parity reduce` command that cuts the culprit out (its record is in --out)."""
    from parity.records.io import typed
    from parity.report.console import escape, render_layers
    from parity.report.next_steps import reduce_step, single_culprit

    exp, model_spec, target, input_spec = _one_check(args)
    with library_logs(_log_file(args), getattr(args, "verbose", False)):
        record = typed({"kind": "layers", **_runner(args, exp).localize(model_spec, target, input_spec,
                                                                        progress=sys.stderr.isatty())})
    console = _console()
    render_layers(record, console)
    _said_records(args)
    if single_culprit(record) and target.quantize is None:  # reduce cuts one float module, as next_steps offers it
        if args.out:
            for line in reduce_step(args.out, model_spec.name, input_spec.name, target.id, args.file):
                console.print(escape(line), soft_wrap=True)
        else:
            console.print("parity reduce cuts a repro from this localization's record: run it again with --out DIR")
    return EXIT_OK if not record.error else EXIT_FAILED


def cmd_fallback(args: argparse.Namespace) -> int:
    """Find a small set of modules to run eager (compile), in float32 (bfloat16/float16) or in float (int8) so
    that the check passes at the gate; print it with its latency cost."""
    from parity.report.console import fallback_lines, render_fallback

    exp, model_spec, target, input_spec = _one_check(args)
    command = f"parity fallback {shlex.quote(str(args.file))} --model {model_spec.name} --target {target.id} --inputs {input_spec.name}"
    with library_logs(_log_file(args), getattr(args, "verbose", False)):
        result, record = _runner(args, exp).find_fallback(model_spec, target, input_spec, args.tier, command)
    tol = exp.tolerance_for(target)
    render_fallback(fallback_lines(result, record, tol.gate, tol.by_task, model_spec.name, model_spec.task), _console())
    _said_records(args)
    return EXIT_OK if result.passed and not result.whole_model else EXIT_FAILED


def cmd_reduce(args: argparse.Namespace) -> int:
    """Cut a failing check down to its culprit module: a folder with a standalone repro script."""
    from parity.reduce import reduce_check

    out = reduce_check(user_path(args.run_dir, "RUN_DIR"), args.check, user_path(args.out, "--out") if args.out else None,
                       user_path(args.experiment, "--experiment") if args.experiment else None, args.trust_records)
    print(f"repro: {out} (python {out / 'repro.py'}: exit 1 when it diverges; README.txt says what it is)")
    return EXIT_OK


def cmd_backends(args: argparse.Namespace) -> int:
    from parity.backends_command import backends_tables

    console = _console()
    for table in backends_tables():
        console.print(table)
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    from parity.completion import SCRIPTS

    print(SCRIPTS[args.shell](build_parser()), end="")
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    """Say where the artifact cache is and what it holds (info), or empty it (clear)."""
    from parity.execute import cache

    root = user_path(args.location, "--cache-dir") if args.location else cache.default_root()
    if root is None:
        print("the artifact cache is off (PARITY_CACHE_DIR=off); give --cache-dir DIR to name one")
        return EXIT_OK
    found = cache.usage(root) if args.action == "info" else cache.clear(root)
    entries = found["entries"]
    held = (f"{entries} artifact {'entry' if entries == 1 else 'entries'} ({_amount(found['artifact_bytes'])}), "
            f"inductor {found['inductor_files']} files ({_amount(found['inductor_bytes'])})")
    if not root.exists():
        print(f"cache {root}: does not exist (nothing cached yet)")
    elif args.action == "info":
        tagged = "" if found["tagged"] else f"; not tagged as parity's ({cache.TAG}), so `parity cache clear` leaves it"
        print(f"cache {root}: {held}{tagged}")
    else:
        print(f"cleared cache {root}: {held}; {_amount(found['freed'])} freed")
    left = [*found["foreign"], *found.get("left", [])]
    if left:
        print(f"not parity's, left alone: {', '.join(left)}")
    if found.get("in_use"):
        print(f"in use by a running parity process, left for it: {', '.join(found['in_use'])}")
    return EXIT_OK


def _amount(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def build_parser() -> argparse.ArgumentParser:
    from parity import __version__

    parser = argparse.ArgumentParser(prog="parity", description="Does your model give the same answers on every backend?")
    parser.add_argument("--version", action="version", version=f"parity {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run experiment files and judge every target against the reference",
                         description="Run experiment files: every target against the reference on every model and "
                                     "input set; print the table, write the records and reports. Exit 0 every check "
                                     "passed, 1 one failed or was not run here, 2 a mistake in the files or options.")
    run.add_argument("files", nargs="+", metavar="FILE", help="experiment YAML files")
    output_options(run, "NAME")
    for option, what in (("--model", "model name"), ("--target", "target id, as the table's column"),
                         ("--inputs", "input set name")):
        run.add_argument(option, dest=option.removeprefix("--") + "_filter", action="append", metavar="NAME",
                         help=f"run only the checks of this {what}, repeatable (CI sharding: one job per target "
                              "or model, each with its own --out)")
    run.add_argument("--executor", choices=["local", "process", "ray"],
                     help="where executions run: in this process (local, the default), each in a worker process with "
                          "a time limit (process), or as Ray tasks (ray); wins over the file's executor setting")
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="process and ray executors: the time limit of one execution (default 600); past it, its "
                          "checks fail as timeout and the run goes on")
    run.add_argument("--address", metavar="ADDR", help="ray executor: the Ray cluster to join (default: start one here)")
    run.add_argument("--workers", type=int, metavar="N",
                     help="ray executor without --address: run N tasks at a time on the Ray it starts here "
                          "(default: as many as the cores allow)")
    cache_options(run)
    run.set_defaults(func=cmd_run)

    check_parser(sub)

    report = sub.add_parser("report", help="render report.html, report.md and junit.xml from a run's records.jsonl")
    report.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of a parity run (holds records.jsonl)")
    report.set_defaults(func=cmd_report)

    validate = sub.add_parser("validate", help="check experiment files without running anything")
    validate.add_argument("files", nargs="+", metavar="FILE", help="experiment YAML files")
    validate.add_argument("--deep", action="store_true",
                          help="also build each model (nothing runs) and check its fallback module names and adapters")
    validate.set_defaults(func=cmd_validate)

    def one_check_parser(name: str, help_text: str, target_help: str, record: str, func) -> argparse.ArgumentParser:
        """A verb about one model x target x input set of an experiment."""
        verb = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        verb.add_argument("file", metavar="FILE", help="the experiment YAML file")
        verb.add_argument("--model", help="model name (default: the only one)")
        verb.add_argument("--target", help=f"{target_help} (default: the only one)")
        verb.add_argument("--inputs", help="input set (default: the model's first)")
        verb.add_argument("--out", metavar="DIR", help=f"also write DIR/records.jsonl with the {record} record")
        cache_options(verb)
        verb.set_defaults(func=func)
        return verb

    loc = one_check_parser("localize", "find the layer where a target starts to differ (tier 2)",
                           "target id, e.g. compile-cpu", "layers", cmd_localize)
    loc.add_argument("--granularity", help="blocks (default, hierarchical) | leaf | depth:N | name,name,...")
    loc.add_argument("--mode", choices=["local", "propagated", "both"],
                     help="local: each layer's own error; propagated: the error that reaches each layer; both "
                          "(default: the experiment's tiers.activations.mode)")
    fall = one_check_parser("fallback", "find modules to run eager, in float32 or in float so that a target passes",
                            "a compile, bfloat16, float16 or int8 target id", "fallback", cmd_fallback)
    fall.add_argument("--tier", type=int, choices=[1, 3], default=1,
                      help="what must pass: 1, every output within the gate (default); 3, the task-level verdict")

    reduce = sub.add_parser("reduce", help="cut a failing, localized check down to its culprit module: a "
                                           "standalone script, its inputs and weights, for a bug report")
    reduce.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of a parity run (or of parity localize)")
    reduce.add_argument("--check", required=True, metavar="MODEL/INPUTS/TARGET",
                        help="the failing check, as the table names it, e.g. resnet18/cat/compile-cpu")
    reduce.add_argument("--out", metavar="DIR",
                        help="a new or empty folder for the repro (default: RUN_DIR/reduce-MODEL-INPUTS-TARGET)")
    reduce.add_argument("--experiment", metavar="FILE",
                        help="the experiment file the run ran: the model is rebuilt from it (its code is yours), and "
                             "it must hold the check's model, inputs, reference and target as the records do")
    reduce.add_argument("--trust-records", action="store_true",
                        help="import the code RUN_DIR's records name (a python entry, a repo folder, a backend "
                             "module) without an experiment file: only for records you wrote")
    reduce.set_defaults(func=cmd_reduce)

    backends = sub.add_parser("backends", help="list every backend and whether it can run here")
    backends.set_defaults(func=cmd_backends)

    cache = sub.add_parser("cache", help="show or empty the artifact cache")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, help_text in (("info", "where the cache is, its entries and their size"),
                              ("clear", "remove what parity put in the cache (never the folder itself)")):
        verb = actions.add_parser(action, help=help_text)
        # not `cache_dir`: these verbs look at a folder, they do not configure (and tag) it as this run's cache
        verb.add_argument("--cache-dir", dest="location", metavar="DIR",
                          help="the cache folder (default: $PARITY_CACHE_DIR, else ~/.cache/parity)")
        verb.set_defaults(func=cmd_cache)

    completion = sub.add_parser("completion", help="print a shell completion script (docs/getting-started.md)")
    completion.add_argument("shell", choices=["bash", "zsh"], help="the shell the script is for")
    completion.set_defaults(func=cmd_completion)
    return parser


PREPROCESS_CHOICES = ("imagenet", "none")  # parity.check_command.PREPROCESS, named here so that --help imports nothing
TARGET_GRAMMAR = ("BACKEND[-DEVICE][-DTYPE] or BACKEND:DTYPE, as the tables print ids: compile, onnxruntime, "
                  "torchscript, openvino, eager-cpu-bfloat16, compile-cpu, eager-cuda, eager:float16 "
                  f"(DEVICE cpu|cuda|cudaN; DTYPE {'|'.join(DTYPES)}, or bf16|fp16|fp32|fp64); quantized: "
                  "compile-cpu-int8-pt2e-x86, eager-int8-dynamic "
                  f"({'|'.join('-' + s.word for s in QUANTIZE_SCHEMES.values())} last)")


def check_parser(sub) -> None:
    """`parity check`: the experiment is the command line."""
    check = sub.add_parser(
        "check", help="check one model on some targets, no experiment file needed",
        description="Check MODEL on each --target against the reference (eager CPU float32): the same table, "
                    "records, reports and exit codes as parity run. Example: parity check torchvision:resnet18 "
                    "--target compile --target onnxruntime")
    check.add_argument("model", metavar="MODEL",
                       help="torchvision:NAME (a torchvision builder), module:callable (an importable function or "
                            "class that returns the model), a model file (.onnx, .pt2, TorchScript .ts/.pt/.pth), "
                            "or a repository FOLDER with --entry or --hubconf")
    check.add_argument("--target", action="append", required=True, metavar="T",
                       help=f"a target to check, repeatable: {TARGET_GRAMMAR}")
    check.add_argument("--reference", metavar="T", help="what the targets are compared with (default: eager, "
                                                        "on the CPU in float32); the same grammar as --target")
    check.add_argument("--entry", metavar="MODULE:CALLABLE",
                       help="with a FOLDER as MODEL: the function or class in it that builds the model")
    check.add_argument("--hubconf", metavar="NAME", help="with a FOLDER as MODEL: an entry of its hubconf.py")
    check.add_argument("--weights", metavar="FILE",
                       help="a .safetensors or torch weights file, or DEFAULT (torchvision's, when in the local "
                            "torch hub cache: nothing is downloaded); default: a seeded random init")
    check.add_argument("--input", action="append", metavar="SHAPE",
                       help="a seeded random normal float32 tensor, e.g. 1x3x224x224; repeat it for several "
                            "positional inputs, or give NAME=SHAPE for keyword inputs; SHAPE:DTYPE for another "
                            "dtype, SHAPE:int64:HIGH for integers in [0, HIGH); or a saved tensors FILE (.npy, .npz, "
                            ".safetensors, .pt) as the whole input set")
    check.add_argument("--images", action="append", metavar="FILE|GLOB|sample:NAME",
                       help="images as one batch, repeatable: files, a quoted glob ('pics/*.jpg') or a photo "
                            "bundled with scikit-image (sample:chelsea). Default for torchvision classifiers, "
                            "segmenters and detectors: sample:chelsea, preprocessed as their weights expect")
    check.add_argument("--preprocess", choices=list(PREPROCESS_CHOICES),
                       help="images: imagenet (resize 256, center crop 224, ImageNet mean and std; the default for "
                            "classifiers and segmenters) or none (RGB in [0, 1] as read; the default otherwise)")
    check.add_argument("--resize", type=int, metavar="N", help="images: resize the shorter side to N pixels first")
    check.add_argument("--crop", type=int, metavar="N", help="images: then crop the N x N center")
    check.add_argument("--gate", type=float, metavar="ATOL",
                       help="the atol that decides pass or fail and the exit code, for every target (default: 1e-4; "
                            "a bfloat16 or float16 target: its dtype's default, 1e-5 at rtol 1.6e-2 or 1e-3)")
    check.add_argument("--rtol", type=float, metavar="RTOL",
                       help="the relative tolerance, for every target (default: 1e-5; bfloat16 1.6e-2, float16 1e-3)")
    check.add_argument("--name", metavar="NAME",
                       help="the model's name in the table, records and commands (default: from MODEL, e.g. "
                            "resnet18 for torchvision:resnet18, build for mymodels:build)")
    check.add_argument("--seed", type=int, default=0, metavar="N",
                       help="seeds the random init and the random inputs (default 0)")
    check.add_argument("--save-experiment", metavar="FILE",
                       help="also write the experiment as a YAML file (never over an existing one): parity run "
                            "FILE runs the same checks, and the file is there to grow")
    output_options(check, "MODEL")
    cache_options(check)
    check.set_defaults(func=cmd_check, executor=None, address=None, workers=None, timeout=None)



def output_options(verb: argparse.ArgumentParser, name: str) -> None:
    """Where a verb that runs checks writes, and what it says: `run` and `check` alike."""
    verb.add_argument("--out", metavar="DIR", help=f"output folder (default: parity-out/{name}-TIMESTAMP)")
    verb.add_argument("--quiet", action="store_true", help="no progress bar")
    verb.add_argument("--allow-unavailable", action="store_true",
                      help="exit 0 even when a target cannot run on this machine (it is still reported)")
    verb.add_argument("--no-report", action="store_true",
                      help="write only records.jsonl and summary.json, not report.md, report.html and junit.xml")
    verb.add_argument("--fresh", action="store_true",
                      help="discard the records already in --out and start over (by default a run continues them)")
    verb.add_argument("--verbose", action="store_true",
                      help="after the table, the whole traceback of every execution that failed (the records keep "
                           "them; the table and its lines show their first line); and parity's debug messages")


def cache_options(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--cache-dir", metavar="DIR",
                      help="artifact cache for exported and compiled models (default: $PARITY_CACHE_DIR, else ~/.cache/parity)")
    verb.add_argument("--no-cache", action="store_true", help="export and compile afresh; write nothing to the cache")


def _artifact_cache(args: argparse.Namespace):
    """The artifact cache this command's Runner keeps exports in, checked before anything runs: a cache that
    cannot be written is the user's to fix (exit 2), never an export failure charged to a target."""
    from parity.execute.cache import ArtifactCache, check_location, default_root

    if not hasattr(args, "cache_dir"):
        return ArtifactCache(None)
    inductor, state = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get(STATE_ENV)
    if inductor and not (state and Path(inductor).is_relative_to(state)):  # the user's (not parity's own, set by
        # an earlier command in this process): torch.compile fails in it later, charged to the target, unless said now
        prepare(user_path(inductor, "$TORCHINDUCTOR_CACHE_DIR"), "$TORCHINDUCTOR_CACHE_DIR (torch.compile's cache)",
                files=())
    if getattr(args, "no_cache", False):
        return ArtifactCache(None)
    if args.cache_dir:
        root, what = user_path(args.cache_dir, "--cache-dir"), "--cache-dir"
    else:
        root, what = default_root(), "the artifact cache ($PARITY_CACHE_DIR, else ~/.cache/parity)"
    if root is not None:
        check_location(root)
        prepare(root, what, files=())
    return ArtifactCache(root).open()


def _contain_library_state(args: argparse.Namespace) -> None:
    """Libraries' home-folder state (matplotlib's) goes into this command's cache, else a temporary folder."""
    from parity.execute.cache import default_root

    if hasattr(args, "cache_dir"):
        keep_state_in(args.artifact_cache.root)
        return
    try:
        keep_state_in(default_root())
    except ParityError:  # PARITY_CACHE_DIR=~nosuchuser/x, and this command has no cache to complain about
        keep_state_in(None)


# What the system says when the user's disk, folders or limits are the problem, not parity: such an
# OSError that reaches main is said in one line with its path, as a ParityError is (exit 2).
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                      errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EEXIST}


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a message comes (a test's capture, redirect_stderr swap it), as
    `warning: ...`: the words scripts and tests have read from parity's stderr."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Plain(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno == logging.INFO else f"{record.levelname.lower()}: {text}"


def show_logs(verbose: bool = False) -> None:
    """parity's messages (its modules log through `logging`) on stderr, at INFO (`--verbose`: DEBUG): through
    rich on a terminal, as plain `warning: ...` lines elsewhere (CI logs, pipes, tests). Once per process:
    each call replaces the handler it installed before."""
    logger = logging.getLogger("parity")
    for handler in [h for h in logger.handlers if getattr(h, "parity_cli", False)]:
        logger.removeHandler(handler)
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=_console(stderr=True), show_time=False, show_path=False)
    else:
        handler = _Stderr()
        handler.setFormatter(_Plain("%(message)s"))
    handler.parity_cli = True
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)


# Libraries whose logging goes to the run's log file (and onto stderr with --verbose), never above the table:
# torch (dynamo, inductor, export, the ONNX exporter's torch.onnx), onnxscript and onnx_ir (the ONNX exporter's
# passes), OpenVINO and NNCF, torchao, ExecuTorch, Torch-TensorRT.
LIBRARY_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnx", "onnxruntime", "openvino", "nncf", "torchao", "executorch",
                   "torch_tensorrt")
LOG_FILE = "run.log"


def _to_console(handler: logging.Handler) -> bool:
    """A handler that writes to the terminal (torch's own `_StderrHandler` follows sys.stderr), not to a file."""
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            or type(handler).__name__ == "_StderrHandler") and getattr(handler, "stream", None) in consoles


@contextlib.contextmanager
def library_logs(log_file: Path | None, verbose: bool):
    """While a command runs backends: what the libraries log (torch's `W1201 ...` lines, graph dumps logged at
    WARNING) appended to `log_file` with parity's own messages, instead of their console handlers (None: a
    command given no --out keeps no log); with `verbose` on stderr too. Every logger is put back afterwards."""
    import torch  # noqa: F401  torch installs its loggers' console handlers at import: these come after

    to_file = logging.FileHandler(log_file, encoding="utf-8", delay=True) if log_file else logging.NullHandler()
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = []
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    loggers += [lg for name, lg in list(logging.Logger.manager.loggerDict.items())
                if isinstance(lg, logging.Logger) and name.split(".")[0] in LIBRARY_LOGGERS and lg not in loggers]
    for logger in loggers:
        saved.append((logger, list(logger.handlers), logger.propagate))
        console = [h for h in logger.handlers if _to_console(h)]
        for handler in console:
            logger.removeHandler(handler)
        if logger.name in LIBRARY_LOGGERS:  # a library's root: the file (and --verbose's stderr), no further
            logger.addHandler(to_file)
            if verbose:
                logger.addHandler(_stderr_handler())
            logger.propagate = False
        elif console:  # torch's registered loggers (torch._dynamo, ...) stop at their own console handler
            logger.propagate = True
    parity_logger = logging.getLogger("parity")
    parity_logger.addHandler(to_file)
    try:
        yield
    finally:
        parity_logger.removeHandler(to_file)
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        to_file.close()


def _stderr_handler() -> logging.Handler:
    handler = _Stderr()
    handler.setFormatter(_Plain("%(name)s: %(message)s"))
    return handler


class _Stdout(io.TextIOBase):
    """sys.stdout for the time of a command: when it is closed (`>&-`) or a pipe whose reader ended, what parity
    prints there is dropped with one warning, and the exit code stays the verdict's. Without it, rich turned the
    broken pipe into SystemExit(1), which read as the model calling sys.exit(1) after a passing run."""

    def __init__(self, stream):
        self._stream = stream
        self._lost = stream is None or getattr(stream, "closed", False)
        if self._lost:
            self._warn()

    def _warn(self) -> None:
        self._lost = True
        logging.getLogger("parity").warning("stdout is closed (a pipe whose reader ended?): what parity prints there is "
                                            "lost; the records and reports are written as usual")

    def _guarded(self, action, default):
        if self._lost:
            return default
        try:
            return action()
        except (BrokenPipeError, ValueError):  # a pipe whose reader ended; a closed file
            self._warn()
            return default

    def write(self, text: str) -> int:
        return self._guarded(lambda: self._stream.write(text), len(text))

    def flush(self) -> None:
        self._guarded(lambda: self._stream.flush(), None)

    def isatty(self) -> bool:
        return self._guarded(lambda: self._stream.isatty(), False)

    def close(self) -> None:
        """Not ours to close (nor to flush when this wrapper is collected: the stream may be gone by then)."""

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show_logs(getattr(args, "verbose", False))
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `entry: mymodels:build` next to you imports, as with python -m
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        return _command(args)
    finally:
        sys.stdout = stdout


def _command(args: argparse.Namespace) -> int:
    try:
        args.artifact_cache = _artifact_cache(args)
        _contain_library_state(args)
        return args.func(args)
    except ParityError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # model code outside an execution (the runner catches it inside one)
        from parity.execute.execution import ends_the_program

        print(f"error: {ends_the_program(exc)} while parity was running it outside a backend's execution; "
              "nothing is judged from this command", file=sys.stderr)
        return EXIT_USER
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            return _internal_error()
        where = f"{exc.filename}: " if exc.filename else ""
        print(clip_problem(f"error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return EXIT_USER
    except Exception:
        return _internal_error()


def _internal_error() -> int:
    traceback.print_exc()
    print("internal error: this is a bug in parity; please report it with the traceback above", file=sys.stderr)
    return EXIT_BUG


VERDICT_FD = "PARITY_VERDICT_FD"  # set by the `parity` command's first process for the one that runs the command


def run_and_exit() -> None:
    """The `parity` command, in two processes. The first starts the second (`python -m parity.cli ARGS`) and
    waits: the second runs main() and, before it exits, writes its exit code to a pipe the first holds. Model
    code that ends the second process at once (os._exit(0) under the local executor: nothing in that process
    can stop it) leaves the pipe empty, and the first process says so and exits 1, never 0 without a verdict.
    The cost is one Python start (docs/benchmarks.md)."""
    if VERDICT_FD in os.environ:

        fd, parent = map(int, os.environ.pop(VERDICT_FD).split(":"))  # not inherited by workers or the model's processes
        die_with_parent(parent)  # killed with the first process (a CI step's time-out kills that one)
        _run_command(fd)
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-m", "parity.cli", *sys.argv[1:]], pass_fds=(write,),
                             env={**os.environ, VERDICT_FD: f"{write}:{os.getpid()}"})
    os.close(write)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the command's process too: it says "interrupted"
    for forwarded in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(forwarded, lambda signum, frame: child.send_signal(signum))
    returncode = child.wait()
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().strip()
    if said:
        os._exit(int(said))
    if returncode == 0:
        print("error: the command's process ended with exit 0 before parity gave its verdict: model code ended it "
              "(os._exit?); no verdict is given (exit 1). --executor process runs model code in a worker process, "
              "which cannot end the run", file=sys.stderr)
        os._exit(EXIT_FAILED)
    os._exit(returncode if returncode > 0 else 128 - returncode)  # killed by a signal: as a shell says it


def _run_command(verdict_fd: int) -> None:
    """main(), its exit code said on `verdict_fd`, then exit without tearing the interpreter down. Every file
    parity writes is closed by then; tearing down torch's and torchvision's modules would add over a second
    and, for that moment, about 100 MB to the peak memory of every command (measured on this project's
    machine: `import torch, torchvision` then a normal exit peaks at 816 MB, against 688 MB)."""
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, --version (0), a command line it refuses (2)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_FAILED
    with contextlib.suppress(OSError):
        os.write(verdict_fd, f"{code}\n".encode())
    try:
        atexit._run_exitfuncs()  # what libraries registered at exit (logging's flush, worker pools) still runs
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, or None (`>&-`)
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    run_and_exit()
