"""The executor's contract: where executions run (runner/executors.py makes one from the experiment's
`executor:` settings). The Runner asks it for one execution at a time and judges it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from parity.config.schema import BackendSpec, Experiment
from parity.execute.cache import ArtifactCache
from parity.execute.execution import Execution
from parity.inputs import Inputs
from parity.runner.plan import Job

OnRun = Callable[[Execution, int], None] | None


class Executor(ABC):
    """Runs executions for the runner. `start` is called once before the first execution with every job
    the run may ask for (an executor that runs ahead may start them all; anything never asked for is
    dropped at `close`); `execute` returns one finished execution, calling `on_run(execution, repeat)`
    after each repeat so that records are written as results come."""

    # Told what the executor is doing while the runner waits on it (the runner's progress bar), if set.
    on_status: Callable[[str], None] | None = None

    def start(self, exp: Experiment, jobs: list[Job], cache: ArtifactCache | None = None) -> None:
        """`cache`: where executions keep their artifacts (None: nowhere). The Runner says whose model runs
        (`cache.for_model`) around the executions of this process; executors that run elsewhere hand the
        cache's folder to their workers, which do the same."""
        self.exp = exp
        self.cache = cache if cache is not None else ArtifactCache(None)

    @abstractmethod
    def execute(self, job: Job, spec: BackendSpec, copies: Any, inputs: Inputs,
                on_run: OnRun = None, example: Inputs | None = None) -> Execution:
        """`spec` on its own copy of the model (`copies`: the model's runner.prepared.ModelCopies, which makes a
        target's copy with its fallback modules) and `inputs`, `job.repeats` times, prepared from `example` (the
        inputs of `job.prepared_from`; None: from `inputs`). Executors that run elsewhere use `copies.digest`
        only, to check that their worker built the same model."""

    def execute_together(self, job: Job, specs: list[BackendSpec], copies: Any, inputs: Inputs,
                         on_run: OnRun = None, example: Inputs | None = None, on_step=None,
                         on_done=None) -> list[Execution]:
        """`execute` for each of `specs` (the first is what the others are judged against: when it fails, the
        others are not run). Here one after the other, each timed alone; an executor that runs them in this
        process interleaves their timed repeats instead (LocalExecutor). `on_step(text)` hears which backend runs;
        `on_done(index, execution)` each execution as it ends (execute.execution.execute_together)."""
        done: list[Execution] = []
        for spec in specs:
            if on_step is not None:
                on_step(spec.id)
            done.append(self.execute(job, spec, copies, inputs, on_run, example))
            if on_done is not None:
                on_done(len(done) - 1, done[-1])
            if not done[0].ok:
                break
        return done

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
