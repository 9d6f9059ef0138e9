"""A third-party parity plugin package: one model source, one task, one backend (registered in
../parity_demo-0.1.0.dist-info/entry_points.txt, as pip would from the package's pyproject.toml)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.eager import EagerBackend, EagerOptions
from parity.config.schema import ModelSpecBase, Strict
from parity.models.sources import Source
from parity.outputs import flatten
from parity.verify.tasks import Headline, OutputsNotUnderstood, Task, TaskResult, verdict


class DemoSpec(ModelSpecBase):
    source: Literal["demo"]
    width: int = Field(default=4, ge=1, le=64)  # the hidden layer


class DemoSource(Source):
    """A two-layer MLP on 4 features, drawn from the experiment's seed (build_model seeds it)."""

    name = "demo"
    Spec = DemoSpec

    def build(self, spec, experiment):
        return torch.nn.Sequential(torch.nn.Linear(4, spec.width), torch.nn.ReLU(), torch.nn.Linear(spec.width, 3))


class AgreementThresholds(Strict):
    max_change: float = Field(default=0.01, ge=0)  # the largest |target - reference| of any output value


class Agreement(Task):
    """Agrees when no output value moved more than `max_change`."""

    name = "agreement"
    Thresholds = AgreementThresholds
    headline = (Headline("max_change", higher_is_better=False, threshold="max_change"),)

    def evaluate(self, reference, target, thresholds, gate, output):
        ref = [v for v in flatten(reference).values() if isinstance(v, torch.Tensor)]
        tgt = [v for v in flatten(target).values() if isinstance(v, torch.Tensor)]
        if len(ref) != len(tgt) or any(r.shape != t.shape for r, t in zip(ref, tgt, strict=True)):
            raise OutputsNotUnderstood("the target's outputs are not shaped as the reference's")
        change = max(float((t.double() - r.double()).abs().max()) for r, t in zip(ref, tgt, strict=True))
        result = TaskResult(self.name, {"max_change": change, "outputs": len(ref)})
        failures = [f"max change {change:.3g} > {thresholds.max_change}"] if change > thresholds.max_change else []
        return verdict(result, failures)


class NudgedOptions(EagerOptions):
    model_config = ConfigDict(extra="forbid")
    nudge: float = 1e-3  # added to every floating output value


class NudgedEager(EagerBackend):
    """Eager, with every floating output moved by exactly `options.nudge`: a known difference to catch."""

    name = "nudged"
    Options: type[BaseModel] = NudgedOptions

    def run(self, inputs):
        out = super().run(inputs)
        return out + self.options.nudge if isinstance(out, torch.Tensor) else out


SOURCE = DemoSource()
TASK = Agreement()
