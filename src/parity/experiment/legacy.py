"""The published cross-backend-model-checker's YAML format, translated into an experiment.

    from: library | repo          model: resnet50            repo: {path: ./repo, class: pkg.mod.Class}
    params: {...}                 inputs: [a.jpg, ...]       means: [...]   stds: [...]
    options: {resize_multiple: 32}                           verification: {tol: {atol: 1e-5, rtol: 1e-5}}

Each image becomes its own input set (images resized to a multiple need not share a size). The reference
is eager CPU float32; the targets are the backends available here that declare the format's devices (`legacy_devices`);
the atol sweep is 1e-6..1e-3 at the file's rtol, gated at the file's atol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.backends import backend_class
from parity.config.schema import BackendSpec, check_name, plain_name
from parity.errors import did_you_mean
from parity.models.sources.torchvision import default_weights_cached
from parity.plugins import BACKENDS

LEGACY_KEYS = {"from", "model", "repo", "params", "inputs", "means", "stds", "options", "verification"}


def _is_name(text: str) -> bool:
    try:
        check_name(text)
    except ValueError:
        return False
    return True


def is_legacy(data: Any) -> bool:
    return isinstance(data, dict) and "from" in data


@dataclass(frozen=True)
class LegacyFile:
    """A legacy file once `_parse` checked it: what `translate` makes the experiment from."""

    source: str  # library | repo
    model: str | None  # library: the torchvision builder
    repo_path: str | None  # repo: the folder, and the module.Class in it
    repo_class: str | None
    params: dict[str, Any]
    resize_multiple: int | None
    means: list[float] | None
    stds: list[float] | None
    images: list[str]
    atol: float
    rtol: float


def _parse(data: dict) -> tuple[LegacyFile | None, list[tuple[tuple, str]]]:
    """The file as a LegacyFile, or None and its problems (legacy key paths). The mapping is the user's YAML:
    each key is read here once, checked, and handed on typed."""
    out: list[tuple[tuple, str]] = []
    for key in data:
        if key not in LEGACY_KEYS:
            out.append(((key,), f"unknown key in a legacy (from: ...) file{did_you_mean(key, LEGACY_KEYS)}"))
    source = data.get("from")
    if source not in ("library", "repo"):
        out.append((("from",), f"expected 'library' or 'repo', got {source!r}"))
    model = data.get("model")
    if source == "library" and not (isinstance(model, str) and _is_name(model)):
        out.append((("model",), f"expected a torchvision builder name, got {model!r}"))
    repo_path = repo_class = None
    if source == "repo":
        repo = data.get("repo")
        if isinstance(repo, dict):
            repo_path, repo_class = repo.get("path"), repo.get("class")
        if not isinstance(repo_path, str) or not isinstance(repo_class, str):
            out.append((("repo",), "expected {path: DIR, class: module.Class}"))
        elif not repo_class.rpartition(".")[0] or not _is_name(repo_class.rpartition(".")[2]):
            out.append((("repo", "class"), f"expected module.Class, got {repo_class!r}"))
    params, options, verification = (_mapping(data, key, out) for key in ("params", "options", "verification"))
    tol = verification.get("tol")
    if tol is not None and not isinstance(tol, dict):
        out.append((("verification", "tol"), "expected {atol: NUMBER, rtol: NUMBER}"))
        tol = None
    atol, rtol = (_limit(tol or {}, key, out) for key in ("atol", "rtol"))
    means, stds = (_numbers(data, key, out) for key in ("means", "stds"))
    multiple = options.get("resize_multiple")
    if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple <= 0):
        out.append((("options", "resize_multiple"), f"expected a positive integer, got {multiple!r}"))
    images = data.get("inputs")
    if not isinstance(images, list) or not images or not all(isinstance(p, str) for p in images):
        out.append((("inputs",), "expected a non-empty list of image paths"))
    if out:
        return None, out
    return LegacyFile(source, model if source == "library" else None, repo_path, repo_class, params, multiple, means,
                      stds, images, atol, rtol), []


def _mapping(data: dict, key: str, out: list[tuple[tuple, str]]) -> dict:
    """The mapping at `key`: {} when it is absent, or when it is no mapping (a problem)."""
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        out.append(((key,), f"expected a mapping, got {type(value).__name__}"))
    return value if isinstance(value, dict) else {}


def _limit(tol: dict, key: str, out: list[tuple[tuple, str]]) -> float:
    """`verification.tol`'s atol or rtol (the published tool's default 1e-5 when absent, or not a number: a problem)."""
    if key not in tol:
        return 1e-5
    value = tol[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        out.append((("verification", "tol", key), f"expected a finite number >= 0, got {value!r}"))
        return 1e-5
    return float(value)


def _numbers(data: dict, key: str, out: list[tuple[tuple, str]]) -> list[float] | None:
    """The list of finite numbers at `key` (means, stds), None when absent."""
    value = data.get(key)
    if value is not None and (not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        out.append(((key,), "expected a list of finite numbers"))
    return value


def _available_targets() -> list[dict]:
    """Every registered backend on each of its `legacy_devices` where it can run here: CPU ones first."""
    targets = []
    for device in ("cpu", "cuda"):
        for name in BACKENDS.names():
            cls = backend_class(name)
            if device in cls.legacy_devices and cls.available(BackendSpec(backend=name, device=device)) is None:
                targets.append({"backend": name, "device": device})
    return targets


def translate(data: dict, path: Path) -> tuple[dict | None, list[tuple[tuple, str]], list[str]]:
    """(experiment dict, problems, warnings). Problems carry legacy key paths."""
    legacy, problems = _parse(data)
    if legacy is None:
        return None, problems, []
    warnings: list[str] = []
    if legacy.source == "library":
        builder = legacy.model
        model: dict[str, Any] = {"name": builder, "source": "torchvision", "builder": builder}
        if default_weights_cached(builder):
            model["weights"] = "DEFAULT"
        else:
            warnings.append(
                f"{path}: the published tool loaded {builder}'s pretrained DEFAULT weights; they are not in "
                "the local torch hub cache, so parity uses a seeded random init instead (offline by design)"
            )
    else:
        module, _, cls = legacy.repo_class.rpartition(".")
        model = {"name": cls, "source": "repo", "path": legacy.repo_path, "entry": f"{module}:{cls}"}
    model["params"] = legacy.params

    preprocess: dict[str, Any] = {}
    if legacy.resize_multiple:
        preprocess["resize_multiple"] = legacy.resize_multiple
    if legacy.means is not None or legacy.stds is not None:
        preprocess["mean"], preprocess["std"] = legacy.means, legacy.stds
    stems = [plain_name(Path(p).stem, "image") for p in legacy.images]
    unique = len(set(stems)) == len(stems)
    inputs = [
        {"name": stem if unique else f"image{i}-{stem}", "images": [p], "preprocess": preprocess}
        for i, (p, stem) in enumerate(zip(legacy.images, stems, strict=True))
    ]
    experiment = {
        "name": path.stem,
        "models": [model],
        "inputs": inputs,
        "reference": {"backend": "eager", "device": "cpu", "dtype": "float32"},
        "targets": _available_targets(),
        "tolerances": {"atol": [1e-6, 1e-5, 1e-4, 1e-3], "rtol": legacy.rtol, "gate": legacy.atol},
    }
    return experiment, [], warnings
