"""`parity localize` and `parity fallback`: one check of an experiment, chosen by --model, --target and
--inputs, looked into by the Runner; each writes a records file of its own."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from parity.cli.logs import LOG_FILE, library_logs
from parity.cli.terminal import EXIT_FAILED, EXIT_OK, make_console
from parity.errors import ParityError, field_errors
from parity.files import user_path
from parity.outdir import prepare


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
        activations = Activations.model_validate(settings)
    except ValidationError as exc:
        raise ParityError(f"--granularity/--mode: {field_errors(exc)[0].message}") from exc
    tiers = exp.tiers.model_copy(update={"activations": activations})
    return exp.model_copy(update={"tiers": tiers}), model_spec, target, input_spec


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
    from parity.report.console import escape, render_layers
    from parity.report.next_steps import reduce_step, single_culprit

    exp, model_spec, target, input_spec = _one_check(args)
    with library_logs(_log_file(args), getattr(args, "verbose", False)):
        record = _runner(args, exp).localize(model_spec, target, input_spec, progress=sys.stderr.isatty())
    console = make_console()
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
        result = _runner(args, exp).find_fallback(model_spec, target, input_spec, args.tier, command)
    tol = exp.tolerance_for(target)
    render_fallback(fallback_lines(result, tol.gate, tol.by_task, model_spec.name, model_spec.task), make_console())
    _said_records(args)
    return EXIT_OK if result.passed and not result.whole_model else EXIT_FAILED
