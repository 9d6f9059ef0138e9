"""The files of `parity reduce`'s repro folder, made from one localized check (`Found`): the captured inputs, the
culprit module's weights and pickle, `module.txt` (where its code is), `repro.py` (the module on the reference and
the way the target runs it, each backend's `repro_snippet`) and `README.txt`. `reduce.py` finds the check in a run's
records and rebuilds the model; this module only writes what a bug report attaches."""

from __future__ import annotations

import inspect
import io
import math
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from parity.backends import backend_class
from parity.errors import ParityError
from parity.records.models import GateVerdict, Layers, Run, Tier1Check


@dataclass
class Found:
    """What the records say about one check: the run record, the tier-1 verdict and the localization."""

    run: Run
    check: Tier1Check | GateVerdict  # the run's check, or the verdict `parity localize --out` recorded with its layers
    layers: Layers
    model: str
    inputs: str
    target: str


# What a backend overrides to run a model its own way: a subclass that overrides one of these below the
# class whose snippet it inherits (a plugin on top of eager) runs differently from what that snippet says.
RUNS_BY = ("prepare", "run", "call", "convert", "context")


@dataclass(frozen=True)
class Snippets:
    """How each side runs the module in repro.py: the reference's backend's `repro_snippet`, and the target's."""

    reference: str
    target: str


def snippet_of(role: str, spec) -> str:
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


def repro_files(module, inputs, found: Found, exp, target, snippets: Snippets, n_calls: int, index: int) -> dict:
    """Every file of the folder, as bytes: made before anything is written, so that a module that cannot be
    pickled or saved leaves no half-written folder."""
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
