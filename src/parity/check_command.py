"""`parity check`: one command line made into an experiment, so that checking a model needs no YAML.

The experiment is an ordinary one (a dict in the file's shape), run by the same code as `parity run`;
`--save-experiment` writes it as the file that `parity run` runs the same checks from.

    MODEL  torchvision:NAME          a torchvision builder (seeded init, or --weights)
           module:callable           an importable function or class (source python)
           FOLDER --entry m:f        someone's repository folder (source repo), or --hubconf NAME
           FILE.onnx|.pt2|.ts|.pt    a model file: ONNX, torch.export, TorchScript (sources onnx, exported,
                                     torchscript), run as the experiment file's `path:` runs it
           hf:FOLDER                 a transformers save_pretrained folder (source transformers), on token ids
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from parity.config.schema import BackendSpec, Experiment, plain_name
from parity.dtypes import QUANTIZE_SCHEMES
from parity.errors import ParityError, did_you_mean
from parity.files import file_problem, user_path

IMAGENET = {"resize": [256], "center_crop": [224], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
PREPROCESS = {"imagenet": IMAGENET, "none": {}}
DEFAULT_PHOTO = "sample:chelsea"
# the default inputs of a torchvision model by task: a bundled photo, preprocessed as its weights expect
DEFAULT_PREPROCESS = {"classification": "imagenet", "segmentation": "imagenet", "detection": "none"}
# a model file by its suffix: the source that reads it (as `source:` and `path:` in an experiment file)
MODEL_FILES = {".onnx": "onnx", ".pt2": "exported", ".ts": "torchscript", ".pt": "torchscript", ".pth": "torchscript"}
HF = re.compile(r"^(hf|huggingface|transformers):", re.IGNORECASE)
TOKENS = 16  # the length of the token ids an hf: model is checked on
MAX_DIGITS = 18  # of a dimension or any integer of an experiment: beyond any size a tensor can have
_SHAPE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)*$")


def _torchvision_task(builder: str) -> str:
    import torchvision.models as tvm
    from torchvision.models import list_models

    for task, modules in {"classification": (tvm, tvm.quantization), "detection": (tvm.detection,),
                          "segmentation": (tvm.segmentation,)}.items():
        if any(builder in list_models(module=m) for m in modules):
            return task
    return "other"


@dataclass(frozen=True)
class ModelEntry:
    """The model MODEL names: what choosing its default inputs reads (name, source, path, task) and the keys of
    its source's own (`builder`, `entry`, ...), as the `models:` entry `entry()` writes."""

    name: str
    source: str
    path: str | None = None  # absolute: a model file, a repository or a save_pretrained folder
    keys: dict[str, str] = field(default_factory=dict)  # the source's own keys, in the order the entry writes them
    task: str | None = None  # None: the entry says none (the schema's `other`)
    weights: str | None = None  # "DEFAULT" or an absolute path; None: a seeded init

    def entry(self) -> dict[str, Any]:
        """The `models:` entry, in the order an experiment file writes it."""
        return {"name": self.name, "source": self.source, **({"path": self.path} if self.path is not None else {}),
                **self.keys, **({"task": self.task} if self.task is not None else {}),
                **({"weights": self.weights} if self.weights is not None else {})}


def model_entry(ref: str, entry: str | None = None, hubconf: str | None = None,
                weights: str | None = None) -> ModelEntry:
    """The model that MODEL (and --entry, --hubconf, --weights) name."""
    from parity.models.sources.torchvision import torchvision_builders

    folder = user_path(ref, "MODEL")
    if (entry or hubconf) and not folder.is_dir():
        raise ParityError(f"--entry/--hubconf go with a repository folder as MODEL; '{ref}' is no folder here")
    spec: ModelEntry
    suffix = Path(ref).suffix.lower()
    if HF.match(ref):
        spec = hf_entry(ref)
    elif suffix in MODEL_FILES:
        if not os.path.lexists(folder):
            raise ParityError(f"MODEL '{ref}': no such file here")
        problem = file_problem(folder, "MODEL")  # a FIFO is said to be one, never "no such file"
        if problem:
            raise ParityError(problem)
        if weights is not None:
            raise ParityError(f"--weights: the model file '{ref}' holds its own weights")
        return ModelEntry(plain_name(folder.stem, "model"), MODEL_FILES[suffix], str(folder.absolute()))
    elif folder.is_dir():
        if (entry is None) == (hubconf is None):
            raise ParityError(f"MODEL '{ref}' is a folder: say what builds the model in it with --entry "
                              "module:callable or --hubconf NAME (one of them)")
        spec = ModelEntry(plain_name(folder.absolute().name, "model"), "repo", str(folder.absolute()),
                          {"entry": entry} if entry else {"hubconf": hubconf})
    elif ref.startswith("torchvision:"):
        builder = ref.removeprefix("torchvision:")
        if builder not in torchvision_builders():
            raise ParityError(f"MODEL '{ref}': unknown torchvision builder '{builder}'"
                              f"{did_you_mean(builder, torchvision_builders())}")
        spec = ModelEntry(plain_name(builder, "model"), "torchvision", keys={"builder": builder},
                          task=_torchvision_task(builder))
    elif ref.startswith("timm:"):
        from parity.models.sources.timm import architecture_problem

        architecture = ref.removeprefix("timm:")
        problem = architecture_problem(architecture)
        if problem:
            raise ParityError(f"MODEL '{ref}': {problem}")
        spec = ModelEntry(plain_name(architecture, "model"), "timm", keys={"architecture": architecture},
                          task="classification")  # timm's models are image classifiers (their heads can be removed)
    elif ":" in ref:
        from parity.registry import import_object

        import_object(ref, "MODEL")  # a typo is one message now, not a failed run later
        spec = ModelEntry(plain_name(ref.rpartition(":")[2], "model"), "python", keys={"entry": ref})
    else:
        hint = f"; did you mean 'torchvision:{ref}'?" if ref in torchvision_builders() else ""
        raise ParityError(f"MODEL '{ref}' is not torchvision:NAME, module:callable nor a folder here{hint}")
    if weights is not None:
        spec = replace(spec, weights=weights if weights == "DEFAULT" else str(user_path(weights, "--weights").absolute()))
    return spec


def _tensor(text: str) -> dict[str, Any]:
    """SHAPE[:DTYPE[:HIGH]]: a seeded random tensor; normal for a floating dtype, integers in [0, HIGH) else."""
    shape, _, rest = text.partition(":")
    dtype, _, high = rest.partition(":")
    if not _SHAPE.match(shape):
        raise ParityError(f"--input '{text}': expected a shape like 1x3x224x224, SHAPE:DTYPE (1x128:int64:30522 for "
                          "integers in [0, 30522)), NAME=SHAPE for a keyword input, or a saved tensors FILE")
    dims = shape.split("x")
    longest = max(len(d) for d in dims)
    if longest > MAX_DIGITS:  # Python refuses to read an integer of over 4300 digits; no size has 19
        raise ParityError(f"--input '{text}': a dimension of {longest} digits; no tensor is that large")
    spec: dict[str, Any] = {"shape": [int(d) for d in dims]}
    if dtype:
        spec["dtype"] = dtype
    if dtype in ("int64", "int32"):
        if not (high.isascii() and high.isdigit()) or len(high) > MAX_DIGITS or int(high) < 1:
            raise ParityError(f"--input '{text}': an {dtype} input needs its bound, {shape}:{dtype}:HIGH (integers "
                              "in [0, HIGH), e.g. the vocabulary size)")
        spec.update(distribution="randint", high=float(high))
    elif high:
        raise ParityError(f"--input '{text}': only an integer dtype (int64, int32) takes a bound")
    return spec


def _hf_config(folder: Path) -> dict[str, Any]:
    import json

    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ParityError(f"{path}: not a readable JSON file: {type(exc).__name__}: {exc}"[:300]) from exc
    if not isinstance(config, dict):
        raise ParityError(f"{path}: not a JSON object (a transformers config is one)")
    return config


def hf_entry(ref: str) -> ModelEntry:
    """`hf:FOLDER`: a save_pretrained folder on this machine (never a hub name: nothing is downloaded), built as
    the class its config.json names (`architectures`), as `source: transformers` with `path:` builds it."""
    from parity.models.sources.transformers import folder_problem

    folder = Path(ref.partition(":")[2]).expanduser().absolute()
    problem = folder_problem(folder)
    if problem:
        raise ParityError(f"MODEL '{ref}': {problem}")
    architectures = _hf_config(folder).get("architectures") or ["AutoModel"]
    return ModelEntry(plain_name(folder.name, "model"), "transformers", str(folder), {"architecture": architectures[0]})


def token_input(model: ModelEntry) -> dict[str, Any]:
    """An hf: model's default input: seeded token ids below its vocabulary (decoder ids too for an
    encoder-decoder), with an attention mask of ones."""
    config = _hf_config(Path(model.path))
    ids = {"shape": [1, TOKENS], "dtype": "int64", "distribution": "randint", "high": int(config.get("vocab_size") or 100)}
    tokens = {"input_ids": ids, "attention_mask": {"shape": [1, TOKENS], "dtype": "int64", "distribution": "ones"}}
    if config.get("is_encoder_decoder"):
        tokens["decoder_input_ids"] = ids
    return {"name": "tokens", "synthetic": tokens}


def input_entry(model: ModelEntry, shapes: list[str], images: list[str], preprocess: str | None,
                resize: int | None, crop: int | None) -> dict[str, Any]:
    """The `inputs:` entry: random tensors (--input), images (--images) or the model's default photo."""
    if shapes and images:
        raise ParityError("--input and --images: give one kind of input (random tensors or images)")
    if shapes:
        if preprocess or resize or crop:
            raise ParityError("--preprocess, --resize and --crop apply to images, not to --input tensors")
        from parity.inputs.tensors import SUFFIXES

        files = [s for s in shapes if Path(s).suffix.lower() in SUFFIXES]
        if files:
            if len(shapes) > 1:
                raise ParityError(f"--input {files[0]}: a saved tensors file is the whole input set; give it alone")
            path = Path(files[0]).expanduser()
            problem = file_problem(path, "--input")
            if problem:
                raise ParityError(problem)
            return {"name": plain_name(path.stem, "tensors"), "tensors": str(path.absolute())}
        named = [s.partition("=") for s in shapes]
        if len({bool(sep) for _, sep, _ in named}) > 1:
            raise ParityError("--input: give every input as SHAPE (positional) or every one as NAME=SHAPE (keyword)")
        if named[0][1]:
            return {"name": "random", "synthetic": {name: _tensor(shape) for name, _, shape in named}}
        specs = [_tensor(s) for s in shapes]
        return {"name": plain_name(shapes[0], "random") if len(shapes) == 1 else "random", "synthetic": specs[0] if len(specs) == 1 else specs}
    task = model.task or "other"
    if not images and model.source == "transformers":
        return token_input(model)
    if not images and model.source == "onnx":
        return graph_input(model)
    if not images:
        if task not in DEFAULT_PREPROCESS:
            raise ParityError(f"model '{model.name}' has no default input: give --input SHAPE (a seeded random "
                              "tensor, e.g. 1x3x224x224) or --images FILE|GLOB|sample:NAME")
        images = [DEFAULT_PHOTO]
    settings = dict(PREPROCESS[preprocess or DEFAULT_PREPROCESS.get(task, "none")])
    if resize is not None:
        settings["resize"] = [resize]
    if crop is not None:
        settings["center_crop"] = [crop]
    refs = [ref if ref.startswith("sample:") else str(user_path(ref, "--images").absolute()) for ref in images]
    return {"name": "images", "images": refs, "preprocess": settings}


def graph_input(model: ModelEntry) -> dict[str, Any]:
    """An ONNX file's default input: seeded random tensors of the shapes its graph declares (a dimension it
    leaves open, such as the batch, is 1); integer inputs need their bound, which no graph declares."""
    from parity.models.onnx_graph import read_graph

    inputs, _, _ = read_graph(Path(model.path))
    declared = "; ".join(map(str, inputs)) or "none"
    floats = ("float32", "float16", "float64", "bfloat16")
    if not inputs or any(i.dims is None or i.dtype not in floats for i in inputs):
        raise ParityError(f"model '{model.name}': the ONNX graph's inputs are {declared}; give --input for each "
                          "(SHAPE, or SHAPE:int64:HIGH for integers in [0, HIGH); NAME=SHAPE by name)")
    tensors = {i.name: {"shape": [d or 1 for d in i.dims], "dtype": i.dtype} for i in inputs}
    return {"name": "graph_shapes", "synthetic": tensors}


def check_notes(exp: Experiment) -> list[str]:
    """What `parity check` says before it runs about the experiment it chose for the user (validated): an ONNX
    file's reference and the input shapes it read from the graph."""
    model, inputs = exp.models[0], exp.inputs[0]
    if model.source != "onnx":
        return []
    notes = ["reference: ONNX Runtime (CPU, float32): an .onnx model is run by ONNX Runtime, so eager (the "
             "reference's backend) runs the graph there"]
    if inputs.name == "graph_shapes":
        shapes = ", ".join(f"{name} {t.dtype}[{'x'.join(map(str, t.shape))}]" for name, t in inputs.synthetic.items())
        notes.append(f"inputs: seeded random tensors of the graph's declared shapes ({shapes}; an open dimension is 1); "
                     "--input sets others")
    return notes


def target_entries(targets: list[str], reference: str | None,
                   calibration: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The reference's and the targets' entries; each --target that cannot be one is refused by name. An int8
    target of a static scheme (`compile-cpu-int8-pt2e-x86`) is calibrated on `calibration`, the checked inputs."""
    from parity.experiment.targets import parse_target
    from parity.experiment.validate import backend_problems

    entries, problems, seen = [], [], {}
    for flag, text in [("--reference", reference or "eager"), *(("--target", t) for t in targets)]:
        try:
            words = parse_target(text)
        except ParityError as exc:
            problems.append(f"{flag} {text}: {exc.problems[0]}")
            continue
        entry = words.entry(calibration if words.scheme and QUANTIZE_SCHEMES[words.scheme].calibrated else None)
        spec = BackendSpec.model_validate(entry)
        problems += [f"{flag} {text}: {msg}" for _, msg in backend_problems(spec, ())]
        if spec.id in seen:
            what = "the reference" if seen[spec.id] == "--reference" else f"given twice ({seen[spec.id]} and {text})"
            problems.append(f"{flag} {text}: its id {spec.id} is {what}; every target needs its own id")
        seen.setdefault(spec.id, flag if flag == "--reference" else text)
        entries.append(entry)
    if problems:
        raise ParityError(*problems)
    return entries[0], entries[1:]


def check_experiment(model: str, targets: list[str], *, reference: str | None = None, entry: str | None = None,
                     hubconf: str | None = None, weights: str | None = None, shapes: list[str] = (),
                     images: list[str] = (), preprocess: str | None = None, resize: int | None = None,
                     crop: int | None = None, gate: float | None = None, rtol: float | None = None,
                     seed: int = 0, name: str | None = None) -> dict[str, Any]:
    """The experiment (a dict in the file's shape) that a `parity check` command line describes. Paths
    are absolute, so that the experiment means the same wherever it is run or saved from."""
    spec = model_entry(model, entry, hubconf, weights)
    if name is not None:
        if plain_name(name, "") != name:
            raise ParityError(f"--name '{name}': a name is letters, digits, _ . + - (starting with a letter, digit "
                              f"or _), e.g. '{plain_name(name, 'model')}'")
        spec = replace(spec, name=name)
    inputs = input_entry(spec, list(shapes), list(images), preprocess, resize, crop)
    ref, target_list = target_entries(list(targets), reference, inputs["name"])
    data: dict[str, Any] = {"name": spec.name, "seed": seed, "models": [spec.entry()], "inputs": [inputs]}
    if reference is not None:
        data["reference"] = ref
    data["targets"] = target_list
    tolerances = {k: v for k, v in (("rtol", rtol), ("gate", gate)) if v is not None}
    for target in target_list:  # said on the command line, so meant for every target, whatever its dtype
        if tolerances:
            target["tolerances"] = dict(tolerances)
    return data


RAN = "experiment.yaml"  # the experiment a check ran, in its output folder: what its next: lines start from


def save_ran(data: dict[str, Any], out_dir: Path) -> Path:
    """Write the experiment a check ran into its output folder (`RAN`), replacing the one an earlier check in that
    folder wrote, so that every `next:` line the check prints runs as printed."""
    path = out_dir / RAN
    if path.is_file() and not path.is_symlink():
        path.unlink()
    save_experiment(data, path, "the output folder's " + RAN)
    return path


def save_experiment(data: dict[str, Any], path: Path, what: str | None = None) -> None:
    """Write `data` as an experiment file at `path`, its paths relative to the file's folder (so that the
    folder can move with the file); never over an existing file (it may be one the user grew)."""
    import yaml

    what = what or f"--save-experiment {path}"
    if path.is_symlink():  # a dangling one too: writing would create its target, wherever it points
        raise ParityError(f"{what}: is a symbolic link; parity writes a new file, never through "
                          "a link: name another file")
    if path.exists():
        raise ParityError(f"{what}: the file exists; remove it or name another (it is never "
                          "overwritten: it may be an experiment you grew)")
    folder = path.expanduser().absolute().parent
    if not folder.is_dir():
        raise ParityError(f"{what}: no folder {folder}")

    def relative(p: str) -> str:
        return p if p.startswith("sample:") or p == "DEFAULT" else os.path.relpath(p, folder)

    saved = {**data, "models": [dict(m) for m in data["models"]], "inputs": [dict(s) for s in data["inputs"]]}
    for m in saved["models"]:
        for key in ("path", "weights"):
            if key in m:
                m[key] = relative(m[key])
    for s in saved["inputs"]:
        if "images" in s:
            s["images"] = [relative(ref) for ref in s["images"]]
        if "tensors" in s:
            s["tensors"] = relative(s["tensors"])
    header = (f"# Written by parity check. `parity run {path.name}` runs the same checks; every key is in the\n"
              "# parity docs, docs/experiment-file.md (more targets, an oracle, tiers 2 and 3, repeats...).\n")
    text = header + yaml.safe_dump(saved, sort_keys=False, default_flow_style=None)
    try:  # O_EXCL: a file or link that appeared since is not written through; O_NOFOLLOW says so
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as exc:
        raise ParityError(f"{what}: cannot create it: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
