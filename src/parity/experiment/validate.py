"""What the schema cannot check: names against the backends, model sources and input readers installed
here, files on disk, cross-references.

Each problem is (key path, message); `loading` adds the file name and line.
"""

from __future__ import annotations

import os

from pydantic import ValidationError

from parity.backends import backend_class, fallback_kind
from parity.config.schema import ORACLE, BackendSpec, Experiment
from parity.errors import ParityError, did_you_mean, field_errors
from parity.inputs.audio import audio_problem
from parity.inputs.images import image_problem
from parity.inputs.tensors import tensors_problem
from parity.inputs.text import text_file_problem, tokenizer_problem
from parity.models.sources import MODEL_KINDS, Problem
from parity.models.weights import weights_problem
from parity.plugins import BACKENDS, SOURCES


def _unique(names: list[str], key: str, what: str) -> list[Problem]:
    seen: set[str] = set()
    out = []
    for i, name in enumerate(names):
        if name in seen:
            out.append(((key, i), f"{what} '{name}' appears twice; {what}s must be unique (set 'name:' to tell them apart)"))
        seen.add(name)
    return out


def backend_problems(spec: BackendSpec, path: tuple) -> list[Problem]:
    """Unknown backend, unsupported device or dtype, unknown or bad options."""
    try:
        cls = backend_class(spec.backend)
    except ParityError as exc:
        return [(path + ("backend",), exc.problems[0])]
    out = []
    device_kind = spec.device.split(":")[0]
    if device_kind not in cls.devices:
        out.append((path + ("device",), f"backend '{spec.backend}' runs on {', '.join(cls.devices)}, not '{spec.device}'"))
    if spec.dtype not in cls.dtypes:
        out.append((path + ("dtype",), f"backend '{spec.backend}' supports dtypes {', '.join(cls.dtypes)}, not '{spec.dtype}'"))
    problem = cls.spec_problem(spec)
    if problem:
        out.append((path, problem))
    if spec.quantize and spec.quantize.scheme not in cls.schemes_run():
        able = f"it runs {', '.join(cls.schemes_run())}" if cls.schemes_run() else "it quantizes nothing"
        out.append((path + ("quantize", "scheme"), f"backend '{spec.backend}' cannot run quantize scheme "
                    f"{spec.quantize.scheme} ({able})"))
    if spec.fallback:
        try:
            fallback_kind(spec)
        except ParityError as exc:
            out.append((path + ("fallback",), exc.problems[0]))
    try:
        cls.Options.model_validate(spec.options)
    except ValidationError as exc:
        for err in field_errors(exc):
            msg = err.msg
            if err.kind == "extra_forbidden":
                fields = list(cls.Options.model_fields)
                msg = f"unknown option for backend '{spec.backend}'{did_you_mean(str(err.loc[-1]), fields)} (known: {', '.join(fields) or 'none'})"
            elif err.kind == "value_error":  # an Options validator's own sentence, without pydantic's prefix
                msg = str(err.error)
            out.append((path + ("options",) + err.loc, msg))
    return out


def _kind_problems(exp: Experiment, kind: str, model: str) -> list[Problem]:
    """The reference, oracle and targets that cannot run a model of `kind` (a file that is not a Python
    module: models.sources.MODEL_KINDS), each with the backends that can; and tier 2, which hooks modules."""
    if kind == "module":
        return []
    runners = [(("reference",), exp.reference), *([(("oracle",), ORACLE)] if exp.oracle.enabled else []),
               *((("targets", i), t) for i, t in enumerate(exp.targets))]
    out = []
    for where, spec in runners:
        try:
            problem = backend_class(spec.backend).model_problem(spec, kind)
        except ParityError:  # an unknown backend: said by backend_problems
            continue
        if problem:
            out.append((where, f"{problem} (model '{model}'; backends that run {MODEL_KINDS[kind]}: "
                               f"{', '.join(_backends_for(kind, BACKENDS.names()))})"))
    if exp.tiers.localize:
        out.append((("tiers", "activations"), f"tier 2 reads layers through module hooks, and model '{model}' is "
                    f"{MODEL_KINDS[kind]}, whose layers run none: set tiers.activations: false"))
    return out


def _backends_for(kind: str, names: list[str]) -> list[str]:
    out = []
    for name in names:
        try:
            if kind in backend_class(name).model_kinds:
                out.append(name)
        except ParityError:  # a registered backend that cannot be loaded here
            continue
    return out


def _path_problem(exp: Experiment, value: str, what: str, check) -> str | None:
    """`check`'s problem with the file `value` names, or why `value` names no file (files.user_path)."""
    try:
        path = exp.resolve(value, what)
    except ParityError as exc:
        return exc.problems[0]
    return check(path)


def _model(exp: Experiment, i: int) -> list[Problem]:
    model = exp.models[i]
    path = ("models", i)
    source = SOURCES.get(model.source)
    out: list[Problem] = [(path + key, msg) for key, msg in source.problems(model, exp)]
    out += _kind_problems(exp, source.kind, model.name)
    if model.weights not in (None, "DEFAULT"):
        problem = _path_problem(exp, model.weights, "weights", _weights_problem)
        if problem:
            out.append((path + ("weights",), problem))
    if model.weights == "DEFAULT" and not source.default_weights:
        out.append((path + ("weights",), f"source '{model.source}' has no DEFAULT weights; give a local file"))
    known = [s.name for s in exp.inputs]
    for j, name in enumerate(model.inputs or []):
        if name not in known:
            out.append((path + ("inputs", j), f"no input set named '{name}'{did_you_mean(name, known)} (defined: {', '.join(known)})"))
    own = model.inputs or known
    if model.export_inputs is not None and model.export_inputs not in own:
        out.append((path + ("export_inputs",), f"no input set named '{model.export_inputs}' among this model's "
                    f"input sets{did_you_mean(model.export_inputs, own)} ({', '.join(own)}); every backend is "
                    "prepared from the one it names"))
    return out


def _calibration(exp: Experiment, spec: BackendSpec, path: tuple) -> list[Problem]:
    """A quantized target's calibration names an input set of the experiment."""
    name = spec.quantize.calibration if spec.quantize else None
    known = [s.name for s in exp.inputs]
    if name is None or name in known:
        return []
    return [(path + ("quantize", "calibration"), f"no input set named '{name}'{did_you_mean(name, known)} "
             f"(defined: {', '.join(known)})")]


def _weights_problem(file) -> str | None:
    """A weights file is opened as `parity run` opens it (without building the model): a missing path, a
    folder, a FIFO, a device, an empty file, a zip bomb, a pickle that would run code are refused here."""
    expected = "expected null, DEFAULT or a local .safetensors / torch file"
    if file.is_dir() or not os.path.lexists(file):  # a dangling link is named as one, by weights_problem
        what = "a folder" if file.is_dir() else "nothing there"
        return f"weights file not found: {file} ({what}; {expected})"
    return weights_problem(file)


def _images(exp: Experiment) -> list[Problem]:
    out = []
    for i, spec in enumerate(exp.inputs):
        for j, ref in enumerate(spec.images or []):
            problem = image_problem(ref, exp.base_dir, spec.preprocess)
            if problem:
                out.append((("inputs", i, "images", j), problem))
    return out


def _audio(exp: Experiment) -> list[Problem]:
    out = []
    for i, spec in enumerate(exp.inputs):
        for j, file in enumerate(spec.audio or []):
            problem = _path_problem(exp, file, "audio file", lambda p, rate=spec.sample_rate: audio_problem(p, rate))
            if problem:
                out.append((("inputs", i, "audio", j), problem))
    return out


def _tensor_files(exp: Experiment) -> list[Problem]:
    problems = [(i, tensors_problem(exp.resolve(spec.tensors))) for i, spec in enumerate(exp.inputs) if spec.tensors]
    return [(("inputs", i, "tensors"), problem) for i, problem in problems if problem]


def _tokenizers(exp: Experiment) -> list[Problem]:
    out = []
    for i, spec in enumerate(exp.inputs):
        count = len(spec.text or ())
        problem = (_path_problem(exp, spec.tokenizer, "tokenizer", lambda path, n=count: tokenizer_problem(path, n))
                   if spec.tokenizer is not None else None)
        if problem:
            out.append((("inputs", i, "tokenizer"), problem))
        problem = text_file_problem(spec.text_file, exp) if spec.text_file is not None else None
        if problem:
            out.append((("inputs", i, "text_file"), problem))
    return out


def experiment_problems(exp: Experiment) -> list[Problem]:
    """Every problem of `exp` that needs a registry or the disk."""
    problems = _unique([m.name for m in exp.models], "models", "model name")
    problems += _unique([s.name for s in exp.inputs], "inputs", "input set name")
    ids = [exp.reference.id] + [t.id for t in exp.targets]
    problems += [(("targets", i - 1), msg) for (_, i), msg in _unique(ids, "targets", "backend id")]
    if exp.oracle.enabled:
        problems += [(("targets", i), "'oracle' is the id of the float64 oracle (oracle: true); name this target otherwise")
                     for i, t in enumerate(exp.targets) if t.id == "oracle"]
    problems += backend_problems(exp.reference, ("reference",))
    if exp.reference.quantize:
        problems.append((("reference", "quantize"), "the reference is the float model: quantize a target instead"))
    for i, target in enumerate(exp.targets):
        problems += backend_problems(target, ("targets", i))
        problems += _calibration(exp, target, ("targets", i))
    for i in range(len(exp.models)):
        problems += _model(exp, i)
    if exp.tiers.localize and not problems and not backend_class(exp.reference.backend).runs_module_hooks:
        problems.append((("tiers", "activations"), f"tier 2 reads layers through module hooks; the reference "
                         f"backend '{exp.reference.backend}' does not run them (use eager)"))
    problems += _images(exp)
    problems += _audio(exp)
    problems += _tensor_files(exp)
    problems += _tokenizers(exp)
    return problems
