"""Where models come from: torchvision builders, someone's repository folder, an importable callable.

Nothing here downloads: `weights: DEFAULT` is honoured only when torchvision's file is already in the
local torch hub cache, and torchvision builders get `weights_backbone=None` unless the user set it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from functools import cache
from pathlib import Path

import torch

from parity.errors import ParityError, did_you_mean
from parity.registry import import_object

# The distributions each source builds its models with: their versions are part of the key of every
# artifact exported from such a model (execute/cache.py). The code of a repo's or a python entry's model is
# fingerprinted itself (fingerprint.py), with the libraries it reaches.
LIBRARIES: dict[str, tuple[str, ...]] = {"torchvision": ("torchvision",), "repo": (), "python": ()}


@cache
def torchvision_builders() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models())


def _default_weights(builder: str):
    import torchvision

    return torchvision.models.get_model_weights(builder).DEFAULT


def _cached_file(weights) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def default_weights_cached(builder: str) -> bool:
    try:
        return _cached_file(_default_weights(builder)).is_file()
    except (ValueError, AttributeError, KeyError):
        return False


def build_torchvision(builder: str, params: dict, pretrained: bool) -> torch.nn.Module:
    import torchvision

    if builder not in torchvision_builders():
        raise ParityError(f"unknown torchvision builder '{builder}'{did_you_mean(builder, torchvision_builders())}")
    fn = torchvision.models.get_model_builder(builder)
    kwargs = dict(params)
    if "weights_backbone" in inspect.signature(fn).parameters:
        kwargs.setdefault("weights_backbone", None)
    if pretrained:
        try:
            weights = _default_weights(builder)
        except (ValueError, AttributeError, KeyError) as exc:
            raise ParityError(f"torchvision has no DEFAULT weights for '{builder}'") from exc
        if not _cached_file(weights).is_file():
            raise ParityError(
                f"DEFAULT weights for '{builder}' are not in the local torch hub cache ({_cached_file(weights)}) "
                "and parity does not download; pass a local file instead: weights: path/to/weights.safetensors"
            )
        kwargs["weights"] = weights
    else:
        kwargs["weights"] = None
    return fn(**kwargs)


@contextlib.contextmanager
def isolated_import_path(folder: Path):
    """Import from `folder`, then leave sys.path and sys.modules as they were: the next model may have
    a module of the same name (`model.py`, `utils`) that must not resolve to this one."""
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            del sys.modules[name]
        importlib.invalidate_caches()


def _call(factory, params: dict, what: str) -> torch.nn.Module:
    try:
        model = factory(**params)
    except TypeError as exc:
        raise ParityError(f"{what} does not accept params {sorted(params)}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise ParityError(f"{what} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_repo(folder: Path, entry: str | None, hubconf: str | None, params: dict) -> torch.nn.Module:
    if not folder.is_dir():
        raise ParityError(f"repository folder not found: {folder}")
    with isolated_import_path(folder):
        if hubconf is not None:
            module = importlib.import_module("hubconf")
            entries = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            if hubconf not in entries:
                raise ParityError(f"{folder}/hubconf.py has no entry '{hubconf}'{did_you_mean(hubconf, entries)}")
            factory = getattr(module, hubconf)
            what = f"hubconf entry '{hubconf}'"
        else:
            factory = import_object(entry, "model entry")
            what = f"'{entry}'"
        return _call(factory, params, what)


def build_python(entry: str, params: dict) -> torch.nn.Module:
    return _call(import_object(entry, "model entry"), params, f"'{entry}'")
