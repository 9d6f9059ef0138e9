"""The plan: which executions an experiment makes. Pure; nothing is built or run here."""

from __future__ import annotations

from dataclasses import dataclass

from parity.config.schema import ORACLE, BackendSpec, Experiment, InputSetSpec, ModelSpec


@dataclass(frozen=True)
class Job:
    """One model on one input set: the reference, the oracle when asked, then every target, each
    executed `repeats` times and judged against the reference. Every backend is prepared (exported,
    traced, compiled) from `example`, the model's one example input set, as a deployment exports once and
    serves other inputs; None: from `inputs` themselves."""

    model: ModelSpec
    inputs: InputSetSpec
    reference: BackendSpec
    oracle: BackendSpec | None
    targets: tuple[BackendSpec, ...]
    repeats: int
    example: InputSetSpec | None = None

    @property
    def prepared_from(self) -> InputSetSpec:
        """The input set every backend of this job is prepared from."""
        return self.example or self.inputs

    @property
    def baselines(self) -> list[BackendSpec]:
        """What every target is judged against: the reference, and the oracle when asked."""
        return [self.reference, *([self.oracle] if self.oracle else [])]

    @property
    def backends(self) -> list[BackendSpec]:
        return [*self.baselines, *self.targets]

    @property
    def executions(self) -> int:
        return len(self.backends) * self.repeats


def example_for(exp: Experiment, model: ModelSpec) -> InputSetSpec:
    """The input set `model` is prepared from: the one its `export_inputs` names (among all the experiment's:
    `parity run --inputs` keeps a shard's example the whole run's), else its first."""
    return next((s for s in exp.inputs if s.name == model.export_inputs), exp.inputs_for(model)[0])


def plan(exp: Experiment) -> list[Job]:
    oracle = ORACLE if exp.oracle.enabled else None
    return [
        Job(model, inputs, exp.reference, oracle, tuple(exp.targets), exp.repeats, example_for(exp, model))
        for model in exp.models
        for inputs in exp.inputs_for(model)
    ]
