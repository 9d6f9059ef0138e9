"""The `parity` command's parser: every verb, its options and its help, and `parity completion`, which prints
a shell script generated from it. It imports nothing heavy, so that --help is quick."""

from __future__ import annotations

import argparse

from parity.cli.machine import cmd_backends, cmd_cache
from parity.cli.one_check import cmd_fallback, cmd_localize
from parity.cli.run import cmd_check, cmd_run, cmd_validate
from parity.cli.run_dir import cmd_reduce, cmd_report
from parity.cli.terminal import EXIT_OK
from parity.dtypes import DTYPES, QUANTIZE_SCHEMES


def cmd_completion(args: argparse.Namespace) -> int:
    from parity.completion import SCRIPTS

    print(SCRIPTS[args.shell](build_parser()), end="")
    return EXIT_OK


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
