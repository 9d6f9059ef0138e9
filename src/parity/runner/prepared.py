"""The model as every command runs it: built (a builder that raises or exits is the user's error),
adapters applied, fallbacks checked against its modules; what identifies it in the artifact cache;
each backend's own copy (`ModelCopies`, with its fallback modules); and what `parity validate --deep` finds on the
built models."""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from parity.adapters import apply_adapters
from parity.adapters.fallback import apply_fallback, fallback_for
from parity.config.schema import BackendSpec
from parity.errors import NotRebuilt, ParityError, did_you_mean
from parity.execute import calibration
from parity.execute.cache import model_digest, weights_digest
from parity.execute.execution import ends_the_program
from parity.inputs import build_inputs
from parity.models import build_model, source_fingerprint
from parity.verify.tasks import follow_up_of, instrument


def configured_model(model: torch.nn.Module, spec: BackendSpec, model_name: str) -> torch.nn.Module:
    """The model as the target `spec` runs it: with its fallback modules, when it has some."""
    names = fallback_for(spec, model_name)
    return apply_fallback(model, names, spec) if names else model


class ModelCopies:
    """The one home of a model's copies (principle 2: every backend runs its own, and nothing it does reaches
    another). A model its spec can build again (`rebuild`) is not kept: its first build is handed to the first copy
    asked for, and every later copy is built again and must have the first build's weights (its parameters' and
    buffers' names and bytes: a module's printed form may hold an address), so that nothing holds the model beside a
    backend's copy; a model that cannot be built again (a
    worker's cached build) is kept, and each copy deep-copied from it."""

    def __init__(self, model: torch.nn.Module, name: str, rebuild: Callable[[], torch.nn.Module] | None = None,
                 weights: str | None = None):
        """`model`: the model as built for the experiment (adapters applied); `name`: its spec's, for its targets'
        fallback entries; `weights`: its weights_digest when the caller has it (only a model built again needs it)."""
        self.name, self._rebuild, self._held = name, rebuild, model
        self.bytes = model_bytes(model)
        self.weights = weights if weights is not None or rebuild is None else weights_digest(model)

    @functools.cached_property
    def digest(self) -> str:
        """The model's model_digest, which a worker's build must match (the process and ray executors ask for it
        before any copy is taken here; asked later, it is a copy built again)."""
        return model_digest(self._held if self._held is not None else self.model())

    @classmethod
    def built(cls, spec, exp, model: torch.nn.Module, weights: str | None = None) -> ModelCopies:
        """The copies of model `spec`, whose first build (prepared_model's) is `model` (its weights_digest `weights`,
        None: measured here): each later one built again."""
        return cls(model, spec.name, lambda: prepared_model(spec, exp)[0], weights)

    def own(self, spec: BackendSpec) -> torch.nn.Module:
        """The target `spec`'s own copy of the model, as it runs it (with its fallback modules, when it has some)."""
        return configured_model(self.model(), spec, self.name)

    def keep(self) -> None:
        """From now on, keep the model and deep-copy each copy from it (as a model that cannot be built again): for
        backends prepared together, whose copies are all alive at once anyway, a deep copy costs less than a build."""
        if self._rebuild is not None:
            self._held = self._held if self._held is not None else self.model()
            self._rebuild = None

    def model(self) -> torch.nn.Module:
        """A copy of the model as built, the caller's own (the copy `own` gives a target its fallback modules in)."""
        if self._rebuild is None:
            return copy.deepcopy(self._held)
        if self._held is not None:
            model, self._held = self._held, None  # the first build is the first copy: not held beside it
            return model
        try:
            model = self._rebuild()
        except ParityError as exc:
            raise NotRebuilt(*exc.problems) from exc
        if weights_digest(model) != self.weights:
            raise NotRebuilt(f"model '{self.name}': building it again for a backend's copy gave other weights than its "
                             "first build (its builder is not deterministic for a seed): each backend's copy is built "
                             "from the model's spec")
        return model


def model_bytes(model: torch.nn.Module) -> int:
    """What one copy of the model's parameters and buffers takes (a tensor shared by two modules counts once)."""
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


def prepared_model(spec, exp) -> tuple:
    """The model as every command runs it: built, adapters applied, and each target's fallback checked
    against its modules before anything executes. Returns (model, what the adapters changed)."""
    model = build_model_or_explain(spec, exp)
    notes = apply_adapters(model, exp.adapters_for(spec), exp)
    if exp.tiers.evaluate_tasks:  # what tier 3 explains a failure with; the outputs are unchanged
        instrument(model, spec.task, exp.tiers.tasks)
    problems = fallback_problems(model, spec, exp)
    if problems:
        raise ParityError(problems[0])
    return model, notes


def fallback_problems(model, spec, exp) -> list[str]:
    """Every target's fallback module that the built `model` does not have, one line each (did-you-mean)."""
    known = {n for n, _ in model.named_modules()}
    return [f"target {target.id}: fallback names '{name}', which model '{spec.name}' does not have"
            f"{did_you_mean(name, sorted(known))}" for target in exp.targets for name in fallback_for(target, spec.name)
            if name not in known]


def model_identity(spec, exp) -> tuple[Any, ...]:
    """What identifies this model's exports in the artifact cache (`ArtifactCache.for_model(*parts)`): what
    the experiment says it is, and what its source reads it from (None when the source cannot say)."""
    return (spec.model_dump(mode="json"), [a.model_dump(mode="json") for a in exp.adapters_for(spec)],
            source_fingerprint(spec, exp))


@contextlib.contextmanager
def model_scope(cache, spec, exp) -> Iterator[None]:
    """Every execution of model `spec` inside this block: its exports kept in `cache` (an ArtifactCache) under
    the model's identity, and a quantized target's calibration input set built (once) from the experiment."""
    built: dict[str, list] = {}

    def calibration_set(name: str) -> list:
        if name not in built:
            built[name] = [build_inputs(next(s for s in exp.inputs if s.name == name), exp, spec.batch_mode)]
        return built[name]

    with cache.for_model(*model_identity(spec, exp)), calibration.providing(calibration_set):
        yield


def task_follow_up(spec, exp):
    """What the task of model `spec` asks of each backend of a run after its timed runs (execute/follow_up.py:
    text-generation's greedy continuations), or None. A run's executions only: tier 2 and a fallback search's
    trials are judged on their outputs."""
    return follow_up_of(spec.task, exp.tiers.tasks) if exp.tiers.evaluate_tasks else None


def build_model_or_explain(spec, exp):
    """The model, or a ParityError naming it: whatever its builder raised, including a SystemExit (a
    command-line parser in the builder, `exit()`), which would otherwise end parity without a verdict."""
    try:
        return build_model(spec, exp)
    except ParityError:
        raise
    except Exception as exc:  # the user's model code raised while being built
        raise ParityError(f"model '{spec.name}': building it failed: {type(exc).__name__}: {exc}") from exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise ParityError(f"model '{spec.name}': building it failed: {ends_the_program(exc)} in its builder; "
                          "parity needs a builder that returns the model") from exc


def checked_on_built_models(exp) -> bool:
    """Whether the experiment names something only a built model can check: fallback modules, adapters."""
    return any(t.fallback for t in exp.targets) or any(exp.adapters_for(m) for m in exp.models)


def built_model_problems(spec, exp) -> list[str]:
    """What `parity run` would refuse once it has built the model (`prepared_model`, taken step by step so
    that every problem is said, not the first): a builder that raises, an adapter that raises or changes
    nothing, a fallback that names a module the model does not have. Nothing runs."""
    try:
        model = build_model_or_explain(spec, exp)
    except ParityError as exc:
        return exc.problems
    out = []
    for adapter in exp.adapters_for(spec):
        before = _structure(model)
        try:
            apply_adapters(model, [adapter], exp)
        except ParityError as exc:
            out += exc.problems
        except Exception as exc:  # the adapter plugin's own code
            out.append(f"adapter {adapter.name} on model '{spec.name}' failed: {type(exc).__name__}: {exc}")
        else:
            if _structure(model) == before:
                out.append(f"adapter {adapter.name} changed nothing on model '{spec.name}' (it found nothing to replace)")
    return out + fallback_problems(model, spec, exp)


def _structure(model) -> list:
    """What an adapter can change on a model, by identity: each module, its attributes (a replaced forward,
    submodule, parameter, hook) and its class's (a patched method). Values are not compared."""
    def ids(mapping) -> tuple:
        return tuple((k, id(v), ids(v) if isinstance(v, dict) else ()) for k, v in mapping.items())

    return [(name, id(m), type(m), ids(vars(m)), ids(vars(type(m)))) for name, m in model.named_modules()]
