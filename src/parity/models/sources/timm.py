"""`source: timm`: a timm architecture by name (`timm.list_models()`), built with `pretrained=False`: the
weights are a seeded init or a local file (`weights:`), never a download. Needs `pip install 'parity[timm]'`."""

from __future__ import annotations

from functools import cache
from typing import Literal

from parity.config.schema import ModelSpecBase
from parity.errors import ParityError, did_you_mean
from parity.models.sources import Source, call_factory


class TimmSpec(ModelSpecBase):
    source: Literal["timm"]
    architecture: str  # a name timm.list_models() gives, e.g. resnet50, vit_small_patch16_224, efficientnet_b0


def _timm():
    try:
        import timm
    except ImportError as exc:
        raise ParityError("source 'timm' needs the timm package: pip install 'parity[timm]'") from exc
    return timm


@cache
def timm_architectures() -> frozenset[str]:
    return frozenset(_timm().list_models())


def architecture_problem(name: str) -> str | None:
    """Why timm cannot build `name` here (timm missing, or a name it does not know), or None."""
    known = timm_architectures()
    if name in known:
        return None
    base = name.partition(".")[0]  # timm also takes `arch.pretrained_tag`; the tag names weights parity never fetches
    if base in known:
        return f"'{name}' names pretrained weights ('.{name.partition('.')[2]}'); give the architecture '{base}' and weights: a local file"
    return f"unknown timm architecture '{name}'{did_you_mean(name, sorted(known))}"


class TimmSource(Source):
    name = "timm"
    names_code = False
    Spec = TimmSpec
    libraries = ("timm",)

    def build(self, spec, experiment):
        problem = architecture_problem(spec.architecture)
        if problem:
            raise ParityError(problem)
        timm = _timm()
        return call_factory(lambda **params: timm.create_model(spec.architecture, pretrained=False, **params),
                            spec.params, f"timm architecture '{spec.architecture}'")

    def problems(self, spec, experiment):
        try:
            problem = architecture_problem(spec.architecture)
        except ParityError as exc:
            problem = exc.problems[0]
        return [(("architecture",), problem)] if problem else []


SOURCE = TimmSource()
