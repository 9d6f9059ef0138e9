"""`source: torchvision`: a torchvision builder by name. `weights: DEFAULT` is honoured only when
torchvision's file is already in the local torch hub cache, and builders get `weights_backbone=None` unless
the user set it."""

from __future__ import annotations

import inspect
from functools import cache
from pathlib import Path
from typing import Literal

from parity.config.schema import ModelSpecBase
from parity.errors import ParityError, did_you_mean
from parity.models.sources import Source


class TorchvisionSpec(ModelSpecBase):
    source: Literal["torchvision"] = "torchvision"
    builder: str


@cache
def torchvision_builders() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models())


def _default_weights(builder: str):
    import torchvision

    return torchvision.models.get_model_weights(builder).DEFAULT


def _cached_file(weights) -> Path:
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def default_weights_cached(builder: str) -> bool:
    try:
        return _cached_file(_default_weights(builder)).is_file()
    except (ValueError, AttributeError, KeyError):
        return False


def build_torchvision(builder: str, params: dict, pretrained: bool):
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


class TorchvisionSource(Source):
    name = "torchvision"
    names_code = False
    Spec = TorchvisionSpec
    libraries = ("torchvision",)
    default_weights = True

    def build(self, spec, experiment):
        return build_torchvision(spec.builder, spec.params, pretrained=spec.weights == "DEFAULT")

    def problems(self, spec, experiment):
        builders = torchvision_builders()
        if spec.builder not in builders:
            return [(("builder",), f"unknown torchvision builder '{spec.builder}'{did_you_mean(spec.builder, builders)}")]
        return []


SOURCE = TorchvisionSource()
