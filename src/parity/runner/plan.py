"""The plan: which executions an experiment makes. Pure; nothing is built or run here."""

from __future__ import annotations

from dataclasses import dataclass

from parity.config.schema import BackendSpec, Experiment, InputSetSpec, ModelSpec

ORACLE = BackendSpec(backend="eager", device="cpu", dtype="float64", name="oracle")


@dataclass(frozen=True)
class Job:
    """One model on one input set: the reference, the oracle when asked, then every target, each
    executed `repeats` times and judged against the reference."""

    model: ModelSpec
    inputs: InputSetSpec
    reference: BackendSpec
    oracle: BackendSpec | None
    targets: tuple[BackendSpec, ...]
    repeats: int

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


def plan(exp: Experiment) -> list[Job]:
    oracle = ORACLE if exp.oracle.enabled else None
    return [
        Job(model, inputs, exp.reference, oracle, tuple(exp.targets), exp.repeats)
        for model in exp.models
        for inputs in exp.inputs_for(model)
    ]
