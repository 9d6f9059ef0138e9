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


def _problems(data: dict) -> list[tuple[tuple, str]]:
    out: list[tuple[tuple, str]] = []
    for key in data:
        if key not in LEGACY_KEYS:
            out.append(((key,), f"unknown key in a legacy (from: ...) file{did_you_mean(key, LEGACY_KEYS)}"))
    source = data.get("from")
    if source not in ("library", "repo"):
        out.append((("from",), f"expected 'library' or 'repo', got {source!r}"))
    if source == "library" and not (isinstance(data.get("model"), str) and _is_name(data["model"])):
        out.append((("model",), f"expected a torchvision builder name, got {data.get('model')!r}"))
    if source == "repo":
        repo = data.get("repo")
        if not isinstance(repo, dict) or not isinstance(repo.get("path"), str) or not isinstance(repo.get("class"), str):
            out.append((("repo",), "expected {path: DIR, class: module.Class}"))
        elif not repo["class"].rpartition(".")[0] or not _is_name(repo["class"].rpartition(".")[2]):
            out.append((("repo", "class"), f"expected module.Class, got {repo['class']!r}"))
    for key in ("params", "options", "verification"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            out.append(((key,), f"expected a mapping, got {type(data[key]).__name__}"))
    tol = (data.get("verification") or {}).get("tol") if isinstance(data.get("verification"), dict) else None
    if tol is not None and not isinstance(tol, dict):
        out.append((("verification", "tol"), "expected {atol: NUMBER, rtol: NUMBER}"))
    elif tol:
        for key in ("atol", "rtol"):
            value = tol.get(key)
            if key in tol and (isinstance(value, bool) or not isinstance(value, int | float)
                               or not math.isfinite(value) or value < 0):
                out.append((("verification", "tol", key), f"expected a finite number >= 0, got {value!r}"))
    for key in ("means", "stds"):
        value = data.get(key)
        if value is not None and (not isinstance(value, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
            out.append(((key,), "expected a list of finite numbers"))
    multiple = (data.get("options") or {}).get("resize_multiple") if isinstance(data.get("options"), dict) else None
    if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple <= 0):
        out.append((("options", "resize_multiple"), f"expected a positive integer, got {multiple!r}"))
    images = data.get("inputs")
    if not isinstance(images, list) or not images or not all(isinstance(p, str) for p in images):
        out.append((("inputs",), "expected a non-empty list of image paths"))
    return out


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
    problems = _problems(data)
    if problems:
        return None, problems, []
    warnings: list[str] = []
    if data["from"] == "library":
        builder = data["model"]
        model: dict[str, Any] = {"name": builder, "source": "torchvision", "builder": builder}
        if default_weights_cached(builder):
            model["weights"] = "DEFAULT"
        else:
            warnings.append(
                f"{path}: the published tool loaded {builder}'s pretrained DEFAULT weights; they are not in "
                "the local torch hub cache, so parity uses a seeded random init instead (offline by design)"
            )
    else:
        module, _, cls = data["repo"]["class"].rpartition(".")
        model = {"name": cls, "source": "repo", "path": data["repo"]["path"], "entry": f"{module}:{cls}"}
    model["params"] = data.get("params") or {}

    preprocess: dict[str, Any] = {}
    resize_multiple = (data.get("options") or {}).get("resize_multiple")
    if resize_multiple:
        preprocess["resize_multiple"] = resize_multiple
    if data.get("means") is not None or data.get("stds") is not None:
        preprocess["mean"], preprocess["std"] = data.get("means"), data.get("stds")
    stems = [plain_name(Path(p).stem, "image") for p in data["inputs"]]
    unique = len(set(stems)) == len(stems)
    inputs = [
        {"name": stem if unique else f"image{i}-{stem}", "images": [p], "preprocess": preprocess}
        for i, (p, stem) in enumerate(zip(data["inputs"], stems, strict=True))
    ]

    tol = (data.get("verification") or {}).get("tol") or {}
    atol = float(tol.get("atol", 1e-5))
    experiment = {
        "name": path.stem,
        "models": [model],
        "inputs": inputs,
        "reference": {"backend": "eager", "device": "cpu", "dtype": "float32"},
        "targets": _available_targets(),
        "tolerances": {"atol": [1e-6, 1e-5, 1e-4, 1e-3], "rtol": float(tol.get("rtol", 1e-5)), "gate": atol},
    }
    return experiment, [], warnings
