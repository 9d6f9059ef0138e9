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

import inspect
import io
import math
import shlex
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from parity.backends import backend_class
from parity.errors import ParityError, clip
from parity.records.models import GateVerdict, Layers, Run, Tier1Check
from parity.report.next_steps import single_culprit

FILES = ("inputs.safetensors", "weights.safetensors", "module.pt", "module.txt", "repro.py", "README.txt")


@dataclass
class Found:
    """What the records say about one check: the run record, the tier-1 verdict and the localization."""

    run: Run
    check: Tier1Check | GateVerdict  # the run's check, or the verdict `parity localize --out` recorded with its layers
    layers: Layers
    model: str
    inputs: str
    target: str


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
    snippets = Snippets(_snippet_of("reference", exp.reference), _snippet_of("target", target))
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
    payload = _payload(module, call.inputs, found, exp, target, snippets, len(calls), call.index)
    _write(out, payload)
    return out


# What a backend overrides to run a model its own way: a subclass that overrides one of these below the
# class whose snippet it inherits (a plugin on top of eager) runs differently from what that snippet says.
RUNS_BY = ("prepare", "run", "call", "convert", "context")


@dataclass(frozen=True)
class Snippets:
    """How each side runs the module in repro.py: the reference's backend's `repro_snippet`, and the target's."""

    reference: str
    target: str


def _snippet_of(role: str, spec) -> str:
    """`spec`'s snippet; a backend without one is refused: never a script that would compare eager with eager."""
    found = snippet(backend_class(spec.backend), spec)
    if found is None:
        raise ParityError(f"the {role} {spec.id}: backend '{spec.backend}' does not say how to reproduce its "
                          "runs alone (Backend.repro_snippet); reduce writes no script that would compare eager "
                          "with eager")
    return found


def snippet(cls: type, spec) -> str | None:
    """`cls.repro_snippet(spec)`, or None when a subclass changed how it runs after that snippet was written
    (a test backend that nudges a weight would otherwise be reproduced as plain eager: no divergence)."""
    mro = cls.__mro__
    owner = next((c for c in mro if "repro_snippet" in vars(c)), None)
    if owner is None or any(name in vars(c) for c in mro[:mro.index(owner)] for name in RUNS_BY):
        return None
    return cls.repro_snippet(spec)


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


def _payload(module, inputs, found: Found, exp, target, snippets: Snippets, n_calls: int, index: int) -> dict:
    """Every file of the folder, as bytes: made before anything is written, so that a module that cannot be
    pickled or saved leaves no half-written folder."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    args = [_expression(v, f"args.{i}", tensors) for i, v in enumerate(inputs.args)]
    kwargs = [f"{k!r}: {_expression(v, f'kwargs.{k}', tensors)}" for k, v in inputs.kwargs.items()]
    weights = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}
    pickled = io.BytesIO()
    try:
        torch.save(module, pickled)
    except Exception as exc:  # a lambda or a local class among its attributes
        raise ParityError(f"the culprit {found.layers.culprit} ({type(module).__qualname__}) cannot be pickled "
                          f"with torch.save, so no script can load it: {type(exc).__name__}: {exc}") from exc
    code = code_reference(module, found.layers.culprit)
    call = f"call {index + 1} of {n_calls} in one forward (the one that differs most on the target)" if n_calls > 1 else ""
    script = repro_script(code, found, exp.reference, target, snippets, f"[{', '.join(args)}]",
                          f"{{{', '.join(kwargs)}}}")
    return {
        "inputs.safetensors": save(tensors),
        "weights.safetensors": save(weights),
        "module.pt": pickled.getvalue(),
        "module.txt": f"class: {code.cls}\nsource: {code.source}\nname: {code.name}\n".encode(),
        "repro.py": script.encode(),
        "README.txt": readme(found, exp, target, code, call).encode(),
    }


def _expression(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> str:
    """Python source for one captured argument: a tensor is stored under `key` and read back; containers
    and plain values are written out."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu().contiguous().clone()
        return f"saved[{key!r}]"
    if type(value) in (list, tuple):  # a namedtuple would need its class: refused below
        items = [_expression(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
        return f"[{', '.join(items)}]" if isinstance(value, list) else f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return "{" + ", ".join(f"{k!r}: {_expression(v, f'{key}.{k}', tensors)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    raise ParityError(f"the culprit's input {key} is a {type(value).__name__}, which reduce cannot write down "
                      "(tensors, numbers, strings, None and lists, tuples and dicts of them)")


@dataclass(frozen=True)
class CodeReference:
    """The culprit's code: its class (dotted), where that class is written (file:line), its name in the model, and
    the folder its class imports from (`import_root`); module.txt and the README say the first three."""

    cls: str
    source: str
    name: str
    sys_path: str


def code_reference(module: torch.nn.Module, name: str) -> CodeReference:
    cls = type(module)
    try:
        where = f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):  # a class made at run time
        where = "(no source file)"
    return CodeReference(f"{cls.__module__}.{cls.__qualname__}", where, name, import_root(cls))


def import_root(cls: type) -> str:
    """The folder from which `cls.__module__` imports: its file's folder, up one level per package."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return ""
    path = Path(file).resolve().parent
    for _ in range(cls.__module__.count(".") + (Path(file).name == "__init__.py")):  # a package's own class
        path = path.parent
    return str(path)


SCRIPT = '''"""Reproduces a divergence found by parity (parity reduce): {culprit}, alone, on the reference and on
the target. Exits 1 when an output differs beyond the check's gate, 0 when they agree, 2 when a side
raises (its traceback is printed).

module: {cls} ({source}), {culprit_as} in model '{model}'
check:  {check}: {failure}, required atol {required} (gate {gate:g} at rtol {rtol:g})
reference: {reference}; target: {target}
Run: python repro.py (needs torch, safetensors and the target's library)
"""
import sys
import traceback
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.utils._pytree import tree_leaves

HERE = Path(__file__).resolve().parent
{path_line}
GATE, RTOL = {gate!r}, {rtol!r}  # the check's gate (atol) and rtol


def cast(value, device, dtype):
    """Tensors to `device`, floating ones to `dtype` (None: keep), inside lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        return value.to(device, dtype if dtype is not None and value.is_floating_point() else value.dtype)
    if isinstance(value, list | tuple):
        return type(value)(cast(v, device, dtype) for v in value)
    return {{k: cast(v, device, dtype) for k, v in value.items()}} if isinstance(value, dict) else value


def load():
    """A fresh copy of the module (pickled; weights from weights.safetensors) and of its captured inputs."""
    module = torch.load(HERE / "module.pt", weights_only=False).eval()
    module.load_state_dict(load_file(HERE / "weights.safetensors"))
    saved = load_file(HERE / "inputs.safetensors")
    return module, {args}, {kwargs}


def reference_outputs():  # {reference}
    module, args, kwargs = load()
{reference_snippet}
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def target_outputs():  # {target}
    module, args, kwargs = load()
{target_snippet}
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


try:
    reference, target = reference_outputs(), target_outputs()
except Exception:  # a side that cannot run the module: no verdict (exit 2), never a divergence (exit 1)
    traceback.print_exc()
    sys.exit(2)

diverges = len(target) != len(reference)
print(f"{{len(reference)}} output(s) on the reference, {{len(target)}} on the target")
for i, (r, t) in enumerate(zip(reference, target)):
    r, t = r.detach().cpu().double(), t.detach().cpu().double()
    if r.shape != t.shape:
        print(f"output {{i}}: shape {{tuple(t.shape)}} on the target, {{tuple(r.shape)}} on the reference")
        diverges = True
        continue
    over = not torch.isclose(t, r, rtol=RTOL, atol=GATE, equal_nan=True).all().item()
    worst = (t - r).abs().max().item() if r.numel() else 0.0
    print(f"output {{i}}: shape {{tuple(r.shape)}}, max abs difference {{worst:.3g}}" + (" (beyond the gate)" if over else ""))
    diverges = diverges or over
print(f"{{'DIVERGES' if diverges else 'agrees'}} at the check's gate: atol {{GATE:g}}, rtol {{RTOL:g}}")
sys.exit(1 if diverges else 0)
'''


def _path_root(code: CodeReference) -> str:
    """The folder repro.py puts first on sys.path: the class's import root; none for torch's own classes."""
    return "" if code.cls.startswith("torch.") else code.sys_path


def repro_script(code: CodeReference, found: Found, reference, target, snippets: Snippets, args: str,
                 kwargs: str) -> str:
    root = _path_root(code)
    path_line = (f"sys.path.insert(0, {root!r})  # {code.cls.rpartition('.')[0]} (the module's class) imports from here"
                 if root else "# the module's class is torch's own")
    check = found.check
    required = check.required_atol
    return SCRIPT.format(
        culprit=found.layers.culprit, cls=code.cls, source=code.source, model=found.model,
        culprit_as="the whole model" if code.name == "(model)" else f"'{code.name}'",
        check=f"{found.model}/{found.inputs}/{found.target}", failure=check.failure_class,
        required=f"{required:.3g}" if isinstance(required, float) else required, gate=check.gate, rtol=check.rtol,
        reference=reference.id, target=_described(target), path_line=path_line, args=args, kwargs=kwargs,
        reference_snippet=textwrap.indent(snippets.reference, "    "),
        target_snippet=textwrap.indent(snippets.target, "    "))


def _described(spec) -> str:
    options = ", ".join(f"{k}={v}" for k, v in spec.options.items())
    return f"{spec.id} ({spec.backend} on {spec.device} in {spec.dtype}{f'; {options}' if options else ''})"


def readme(found: Found, exp, target, code: CodeReference, call: str) -> str:
    check, layers = found.check, found.layers
    required = check.required_atol
    lines = [
        f"parity reduce: check {found.model}/{found.inputs}/{found.target} of experiment '{exp.name}'",
        "",
        f"The check: the target {_described(target)} against the reference {exp.reference.id}.",
        f"The run recorded: {check.failure_class}, required atol "
        f"{f'{required:.3g}' if isinstance(required, float) else required} against the gate {check.gate:g} "
        f"at rtol {check.rtol:g}: {check.detail}",
        f"Tier 2 (localization): {layers.verdict}",
        "",
        f"The culprit: {code.cls} ({code.source}), named '{layers.culprit}' in the model"
        + (f"; {call}" if call else "") + ".",
        "",
        "Files:",
        "  repro.py            the standalone script: python repro.py (exit 1: it diverges, 0: it agrees)",
        "  inputs.safetensors  the module's input, captured on the reference with a forward hook",
        "  weights.safetensors the module's state_dict (the script loads it into module.pt)",
        "  module.pt           the module object (torch.save). torch.load(weights_only=False) runs code from this "
        "pickle: load only your own",
        "  module.txt          the module's class, source file:line and name",
        "",
        "The script needs torch, safetensors and the target's library, and the module's class importable: "
        + (f"it puts {_path_root(code)} first on sys.path." if _path_root(code) else "it is torch's own, so the script "
           "changes no sys.path.") + " It prints every output's max abs difference and "
        "whether it exceeds the check's gate.",
    ]
    return "\n".join(lines) + "\n"


def _write(out: Path, payload: dict[str, bytes]) -> None:
    """Each file whole or not at all, into the folder checked before the work (still empty: nothing else
    writes a repro there in between)."""
    from parity.outdir import write_bytes

    _refuse_nonempty(out)
    for name, data in payload.items():
        write_bytes(out / name, data)
