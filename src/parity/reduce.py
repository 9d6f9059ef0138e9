"""`parity reduce`: a failing check cut down to its culprit module, as a folder a user can attach to an
upstream bug report (the equivalent of Polygraphy's `debug reduce` and torch's minifier).

From a run's records: the check (it must have failed), its `layers` record (tier 2 named the culprit) and
the run record (the resolved experiment). The model is rebuilt as the run built it (`prepared_model`,
`build_inputs`, the target's fallback), the culprit's input is captured on the reference with a forward
hook (`runner.layer_runs.capture`), and the folder gets:

- `inputs.safetensors` (the captured tensors; numbers and other plain values are written in the script),
  `weights.safetensors` (the module's state_dict, which the script loads),
- `module.pt`: the module object pickled with torch.save. A module's constructor arguments are not known,
  so it cannot be rebuilt from code alone; loading it needs its class importable, from the folder the
  script puts first on sys.path, and `weights_only=False` (a pickle runs code: load only your own),
- `module.txt`: the module's class, its source file:line and its name in the model,
- `repro.py`: torch, safetensors and the target's library only. It runs the module on the reference and
  the way the target runs it (each backend's `repro_snippet`), prints the max abs difference of every
  output and exits 1 when one exceeds the check's gate at its rtol, 0 when they agree. A backend without
  a snippet gets no script at all: never one that silently compares eager with eager,
- `README.txt`: the check, the numbers the run recorded, how to run the script.

Rebuilding the model runs the code its records name (a `python` entry, a `repo` folder, a backend
`module:Class`), and a RUN_DIR may come from someone else (a CI artifact, "here is my failing run"): its
records.jsonl could name `os:system`. So reduce imports nothing a records file names: records that name code
(`records_code`) are refused in one line before any import, unless the user passes the experiment file that
holds the same model, input set, reference and target (`--experiment FILE`: the model is then rebuilt from
that file, its folder and its code, never from the records'), or says `--trust-records`, a flag no printed
`next:` line holds.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import torch

from parity.errors import ParityError, clip
from parity.records.models import Run, Tier1Check
from parity.report.next_steps import single_culprit
from parity.repro import Found, Snippets, repro_files, snippet_of

FILES = ("inputs.safetensors", "weights.safetensors", "module.pt", "module.txt", "repro.py", "README.txt")


def parse_check(text: str) -> tuple[str, str, str]:
    """MODEL/INPUTS/TARGET as the tables name them (names cannot hold a slash)."""
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise ParityError(f"--check {text}: expected MODEL/INPUTS/TARGET, e.g. tiny/noise/compile-cpu")
    return parts[0], parts[1], parts[2]


def find_check(records, run_dir: Path, which: str) -> Found:
    """The failing, localized check `which` of the run in `run_dir`; a ParityError saying what is missing
    (and, for a check that was never localized, the command that localizes it)."""
    from parity.records.view import RunView

    model, inputs, target = parse_check(which)
    view = RunView.of(records)
    run = view.run
    found = view.layers_for((model, inputs, target))
    check = next(iter(view.checks(1, model=model, inputs=inputs, target=target)), None) or (
        found.tier1 if found else None)  # localize --out
    if check is None:
        known = sorted({"/".join(view.identity(r)) for r in [*view.checks(1), *view.layers]})
        raise ParityError(f"{run_dir}: no check {which} in its records (it has: {', '.join(known) or 'none'})")
    if found is not None and found.decode_step:  # the forward agrees: a module cut out of it agrees too
        raise ParityError(f"{run_dir}: the localization of {which} compared a decode step through each side's KV cache; "
                          "reduce cuts a module out of the forward, where the target agrees with the reference, so it "
                          f"writes no repro of it; the verdict is the report: {found.verdict}")
    if check.passed:
        raise ParityError(f"{run_dir}: check {which} passed (required atol {check.required_atol}, gate "
                          f"{check.gate}); there is no divergence to reduce")
    if isinstance(check, Tier1Check) and not view.judged(check):
        raise ParityError(f"{run_dir}: check {which} has no verdict ({check.status}: "
                          f"{check.detail}); there is no divergence to reduce")
    if found is None:
        file = shlex.quote(run.file) if run.file else "EXPERIMENT.yaml"
        raise ParityError(f"{run_dir}: check {which} was not localized (no layers record): run `parity localize "
                          f"{file} --model {model} --target {target} --inputs {inputs} --out DIR` first, then "
                          f"`parity reduce DIR --check {which}`")
    if found.error or not found.culprit:
        why = found.error or found.verdict or "no culprit"
        raise ParityError(f"{run_dir}: the localization of {which} names no culprit module to reduce to: {why}")
    if found.specialized:  # the module re-traced alone on the captured inputs takes their branch: it agrees
        raise ParityError(f"{run_dir}: {which} diverges because the target's trace is specialised at "
                          f"{found.specialized.where}: {found.culprit} alone, traced on its captured inputs, "
                          "takes their branch and agrees, so reduce writes no repro of it; the warned line is the report")
    if not single_culprit(found):  # every layer drifts alike: one module alone shows only its share
        raise ParityError(f"{run_dir}: the localization of {which} found no single culprit, so reduce writes no repro of "
                          f"one module: {found.verdict}")
    return Found(run, check, found, model, inputs, target)


def experiment_of(run: Run, run_dir: Path):
    """The experiment as the run resolved it, its relative paths against the run's base folder."""
    from parity.experiment import experiment_from_dict

    exp = experiment_from_dict(run.config.model_dump(exclude_unset=True), run_dir / "records.jsonl", Path(run.base_dir))
    exp._file = run.file
    return exp


def records_code(run: Run) -> list[str]:
    """What rebuilding the records' experiment would import or run, in words: every model whose source names
    code (`Source.names_code`: a `python` entry, a `repo` folder; an unknown source too) and every backend
    named `module:Class`. Read from the record alone: looking a source up imports only installed plugins."""
    from parity.plugins import SOURCES

    named = []
    for model in run.config.models:
        spec = model.model_dump(exclude_unset=True)
        source = spec.get("source")
        known = isinstance(source, str) and ":" not in source and source in SOURCES.names()
        if not known or SOURCES.get(source).names_code:
            what = spec.get("entry") or spec.get("path") or spec.get("hubconf") or spec.get("file")
            named.append(f"{source} model '{model.name}'" + (f" ({what})" if isinstance(what, str) else ""))
    runs = [run.config.setting("reference", default={}), run.config.setting("oracle", default={}), *run.config.targets]
    for spec in runs:
        backend = spec.get("backend") if isinstance(spec, dict) else None
        if isinstance(backend, str) and ":" in backend:  # not a registered name: a module to import
            named.append(f"backend {backend!r}")
    return named


def vouched_experiment(path: Path, run: Run, found: Found):
    """The experiment file the user passed, when it holds the model, input set, reference and target the
    records ran exactly as they ran them (the rest may differ: localize records its own tiers); its code is
    the user's. A ParityError names the first that differs."""
    from parity.experiment import load_experiment
    from parity.files import file_problem

    problem = file_problem(path, "--experiment")
    if problem:
        raise ParityError(problem)
    exp = load_experiment(path)
    target_class = type(exp.reference)

    def target_id(spec: dict) -> str | None:  # as the schema names a target (the record keeps no id)
        try:
            return target_class.model_validate(spec).id
        except ValueError:
            return None

    # each side as it would be recorded: the file's entry dumped as the run dumps its experiment, the record's as
    # it was written (an input set and a target are open mappings in the record: the schema is config/schema.py's)
    config = run.config
    pairs = [("model", found.model, [(m.name, m.model_dump(mode="json")) for m in exp.models],
              [(m.name, m.model_dump(exclude_unset=True)) for m in config.models]),
             ("input set", found.inputs, [(s.name, s.model_dump(mode="json")) for s in exp.inputs],
              [(s.get("name"), s) for s in config.inputs]),
             ("target", found.target, [(t.id, t.model_dump(mode="json")) for t in exp.targets],
              [(target_id(t), t) for t in config.targets])]
    for what, name, mine, theirs in pairs:
        ours = next((dump for key, dump in mine if key == name), None)
        recorded = next((dump for key, dump in theirs if key == name), None)
        if ours is None or ours != recorded:
            how = "does not have" if ours is None else "differs from the records' in"
            raise ParityError(f"--experiment {path}: {how} the {what} '{name}' the records ran; reduce rebuilds "
                              "only what the file you pass holds exactly as it ran")
    if exp.reference.model_dump(mode="json") != config.setting("reference"):
        raise ParityError(f"--experiment {path}: its reference differs from the records'; reduce rebuilds only what "
                          "the file you pass holds exactly as it ran")
    return exp


def _named(items, name_of, name: str, what: str, run_dir: Path):
    """The item of the run record's experiment that a check names; records edited by hand may name one it lacks."""
    found = next((item for item in items if name_of(item) == name), None)
    if found is None:
        raise ParityError(f"{run_dir / 'records.jsonl'}: the check names {what} '{name}', which the run record's "
                          f"experiment does not have (records edited by hand?)")
    return found


def reduce_check(run_dir: Path, which: str, out: Path | None, experiment: Path | None = None,
                 trust_records: bool = False) -> Path:
    """Write the repro folder of check `which` (MODEL/INPUTS/TARGET) of the run in `run_dir`; return it. Code
    is imported only from `experiment` (the user's file) or, with `trust_records`, from what the records name."""
    from parity.inputs import build_inputs
    from parity.outdir import prepare
    from parity.records import read_run
    from parity.runner.layer_runs import capture
    from parity.runner.prepared import configured_model, prepared_model
    from parity.verify.localize import MODEL

    found = find_check(read_run(run_dir), run_dir, which)
    if out is None:  # inside RUN_DIR, which someone else may have made: a link planted there is not followed
        out = run_dir / f"reduce-{found.model}-{found.inputs}-{found.target}"
        if out.is_symlink():
            raise ParityError(f"{out}: is a symbolic link; parity writes the repro into a folder of RUN_DIR, never "
                              "through a link to elsewhere: remove it, or give --out")
    _refuse_nonempty(out)
    if experiment is not None:
        exp = vouched_experiment(experiment, found.run, found)
    else:
        named = [] if trust_records else records_code(found.run)
        if named:
            more = f" and {len(named) - 1} more" if len(named) > 1 else ""
            raise ParityError(f"{run_dir / 'records.jsonl'}: names code that rebuilding its model would import "
                              f"({clip(named[0], 120)}{more}); reduce imports nothing a records file names: pass the "
                              "experiment file the run ran (--experiment FILE), or --trust-records if you wrote these records")
        exp = experiment_of(found.run, run_dir)
    model_spec = _named(exp.models, lambda m: m.name, found.model, "model", run_dir)
    input_spec = _named(exp.inputs_for(model_spec), lambda s: s.name, found.inputs, "input set", run_dir)
    target = _named(exp.targets, lambda t: t.id, found.target, "target", run_dir)
    if target.quantize is not None:
        raise ParityError(f"the target {target.id} is int8 (quantize: {target.quantize.scheme}): its culprit module "
                          "alone would be quantized with another calibration than the whole model's, so a script "
                          "could not reproduce the run; reduce cuts float targets down (parity fallback finds the "
                          "layers to keep in float)")
    snippets = Snippets(snippet_of("reference", exp.reference), snippet_of("target", target))
    prepare(out, "--out", files=FILES)  # as every --out: made, writable, no link where a file goes; before the work
    model, _ = prepared_model(model_spec, exp)
    inputs = build_inputs(input_spec, exp, model_spec.batch_mode)
    configured = configured_model(model, target, model_spec.name)  # the model localize ran on the target
    name = "" if found.layers.culprit == MODEL else found.layers.culprit
    calls = capture(exp.reference, configured, inputs, [name]).get(name)
    if not calls:
        raise ParityError(f"the culprit {found.layers.culprit} was not called when the reference ran the rebuilt "
                          "model: the model or its inputs differ from the run's")
    call = calls[_worst_call(target, configured.get_submodule(name), calls, found.check.rtol) if len(calls) > 1 else 0]
    module = configured.get_submodule(name)
    payload = repro_files(module, call.inputs, found, exp, target, snippets, len(calls), call.index)
    _write(out, payload)
    return out


def _refuse_nonempty(out: Path) -> None:
    try:
        if out.exists() and not out.is_dir():
            raise ParityError(f"--out {out}: it is a file, not a folder")
        if out.is_dir() and any(out.iterdir()):
            raise ParityError(f"--out {out}: the folder exists and is not empty; give a new or empty folder")
    except OSError as exc:
        raise ParityError(f"--out {out}: cannot read it: {exc.strerror or exc}") from exc


def _worst_call(target, module: torch.nn.Module, calls: list, rtol: float) -> int:
    """A module called several times in one forward: the call whose output differs most on the target."""
    from parity.execute.execution import execute
    from parity.verify.activations import layer_error

    def error(call) -> float:
        result = execute(target, module, call.inputs, 1)
        if not result.ok:
            return math.inf
        needed = layer_error(call.name, call.output, result.outputs[0], rtol).required_atol
        return math.inf if needed is None else needed

    return max(range(len(calls)), key=lambda i: error(calls[i]))


def _write(out: Path, payload: dict[str, bytes]) -> None:
    """Each file whole or not at all, into the folder checked before the work (still empty: nothing else
    writes a repro there in between)."""
    from parity.outdir import write_bytes

    _refuse_nonempty(out)
    for name, data in payload.items():
        write_bytes(out / name, data)
