"""Run one backend on one model and input set, `repeats` times, on its own copy of the model."""

from __future__ import annotations

import contextlib
import copy
import gc
import re
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from parity import taxonomy as tx
from parity.backends import backend_class
from parity.backends.base import OwnTokenizer, release_memory
from parity.config.schema import BackendSpec
from parity.errors import CacheLost, NotRebuilt
from parity.execute import cache, calibration, capture, follow_up, notes
from parity.execute.follow_up import FollowUpRaised
from parity.inputs import Inputs
from parity.taxonomy import classify_exception


@dataclass(frozen=True)
class OwnTokens:
    """The texts of a text input set tokenized by both sides (`own_tokens`), one entry per text in each list: the ids
    the reference's tokenizer gave and the backend's own, the first position where they differ (`at`: None where they
    agree), and each side's text of the token there (None: its ids end first)."""

    texts: list[str]
    reference: list[list[int]]
    target: list[list[int]]
    at: list[int | None]
    reference_piece: list[str | None]
    target_piece: list[str | None]


@dataclass
class Execution:
    """The outputs of every repeat (or why there are none) and the timings."""

    backend: BackendSpec
    status: str  # ok | error | unavailable
    outputs: list[Any] = field(default_factory=list)
    prepare_s: float | None = None
    run_s: list[float] = field(default_factory=list)
    error: str | None = None
    failure_class: str | None = None
    cached: bool | None = None  # prepare found its export in the artifact cache (None: nothing to cache)
    notes: list[dict[str, Any]] = field(default_factory=list)  # what the backend warned of (execute/notes.py)
    traceback: str | None = None  # the whole traceback of a failure (`error` is its first line)
    warmup: int = 0  # untimed runs before the timed repeats
    warmup_outputs: list[Any] = field(default_factory=list)  # judged with the repeats: a first call is a call
    captured: list[Any] = field(default_factory=list)  # what instrumented code recorded in the first repeat (capture.py)
    interleaved: bool = False  # its timed runs took turns with other backends' (execute_together)
    follow_up: Any = None  # what the task asked of the prepared backend afterwards, or FollowUpRaised (follow_up.py)
    # A backend with its own tokenizer (`backends.base.OwnTokenizer`) on a text input set: the texts, each side's ids and
    # token texts (verify/tokenizers.py compares them)
    tokens: OwnTokens | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The start of the message on one line: some messages open with a tensor's repr, not the reason."""
    text = " ".join(_ANSI.sub("", str(exc)).split())
    return f"{type(exc).__name__}: " + (text if len(text) <= limit else text[:limit] + "...")


def describe(exc: BaseException) -> str:
    """The exception's first line, and the root cause's when it was raised from another (exporters wrap)."""
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    text = _first_line(exc)
    if root is not exc:
        text += f" (caused by {_first_line(root)})"
    return text


MAX_TRACEBACK = 20_000  # characters kept: its end, where the error is


def format_traceback(exc: BaseException) -> str:
    """The whole traceback, chained causes included, for the records and `--verbose`."""
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= MAX_TRACEBACK else "...\n" + text[-MAX_TRACEBACK:]


def ends_the_program(exc: BaseException) -> str:
    """What user code did when it raised a BaseException that is not an Exception (sys.exit, exit(), an
    argument parser's error, a class of its own): words for a failure's detail or a user error."""
    if isinstance(exc, SystemExit):
        code = exc.code if exc.code is None or isinstance(exc.code, int) else str(exc.code)[:100]
        return f"the model called sys.exit({code!r})"
    return f"the model raised {_first_line(exc, 200)} (a {type(exc).__name__} is a BaseException, which ends a program)"


def execute(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs, repeats: int, on_run=None,
            warmup: int = 0, example: Inputs | None = None) -> Execution:
    """`model` and `inputs` are never touched: the backend gets a deep copy of the model and its own copy
    of the inputs for every run, so no two backends or repeats share a module or a tensor. The backend is
    prepared (exported, traced, compiled) from `example` (None: from `inputs`), as a deployment exports
    once and then serves other inputs; a backend that then raises on inputs of other shapes than the
    example's fails as `shape_specialized`. `warmup` runs after preparing are not timed (first-call
    costs: allocations, lazy initialization, autotuning). `on_run(execution, repeat)` is called after each
    repeat, so records are written as results come; the backend's warnings (notes.py) are collected from
    the start and are complete when this returns."""
    [result] = execute_together([(spec, lambda: copy.deepcopy(model))], inputs, repeats, on_run, warmup, example)
    return result


def own_tokens(backend, inputs: Inputs) -> OwnTokens:
    """The texts of `inputs` tokenized by `backend`'s own tokenizer beside the ids the reference's tokenizer gave
    (`text_ids`: each text's unpadded ids; a text_file cut into windows: the span its windows take, and the
    backend's ids over that span), with each side's text of the first token where they differ (`at`: None where they
    agree), the only one a mismatch names: a text_file's 100k token texts are not asked of the backend one by one."""
    reference = [list(ids) for ids in inputs.text_ids]
    target = backend.tokenize(list(inputs.texts))
    if inputs.ids_cut:
        target = [ids[:len(r)] for ids, r in zip(target, reference, strict=True)]
    at = [first_difference(r, t) for r, t in zip(reference, target, strict=True)]

    def piece(pieces, j):
        return pieces[j] if j is not None and j < len(pieces) else None

    return OwnTokens(texts=list(inputs.texts), reference=reference, target=target, at=at,
                     reference_piece=[piece(p, j) for p, j in zip(inputs.pieces, at, strict=True)],
                     target_piece=[backend.token_texts([t[j]])[0] if j is not None and j < len(t) else None
                                   for t, j in zip(target, at, strict=True)])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two id lists differ (one ending first: its length), or None when they are equal."""
    if a == b:
        return None
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


OwnCopy = Callable[[], torch.nn.Module]  # makes a backend's own copy of the model, when the backend is prepared


def execute_together(backends: list[tuple[BackendSpec, OwnCopy]], inputs: Inputs, repeats: int, on_run=None,
                     warmup: int = 0, example: Inputs | None = None, on_step=None,
                     interleave: bool = True, on_done=None) -> list[Execution]:
    """`execute` for several backends on one input set, each given the copy of the model its `OwnCopy` makes
    when it is prepared, their timed repeats interleaved: all are prepared, then warmed up, then timed in turns
    (the first, the second, ..., the first again), so that a slow spell of the machine falls on all of them
    alike. The first is what the others are judged against: when it fails, the others are not run further.
    Backends that reset the same process-wide state (`Backend.resets_state`: compile, dynamo's caches) are never
    prepared at once: the second waits for a later group, prepared and timed after the first group is closed.
    `interleave` False: every backend is a group of its own, so only one backend's copy of the model is alive
    at a time (a model whose copies together would not fit in memory: runner/executors.py decides). Each
    execution says whether its timed runs took turns with another's (`interleaved`). `on_step(text)` hears what
    is being done (for a progress line: a compilation can take minutes). `on_done(index, execution)` hears each
    execution once its backend is closed, in order, so that a caller can judge it and let its outputs go before the
    next group runs (a language model's logits are hundreds of MB a target)."""
    say = on_step or (lambda text: None)
    runs = [_Run(spec, own_copy, inputs, example if example is not None else inputs, on_run, warmup)
            for spec, own_copy in backends]
    first = runs[0].result
    for index, group in enumerate(_groups(runs) if interleave else [[run] for run in runs]):
        if not first.ok:  # the reference failed in an earlier group: nothing to judge the rest against
            break
        if index and not interleave:  # the closed backend's copy is freed before the next one is made: a model
            gc.collect()  # with a reference cycle is freed by the cycle collector only (a small model's turns: no need)
            release_memory()  # and what it freed handed back, not kept in the heap under the next one's peak
        try:
            for step, doing in (("prepare", "preparing"), ("warm_up", "warming up")):
                for run in group:
                    say(f"{run.result.backend.id}: {doing}")
                    getattr(run, step)()
                    if not first.ok:
                        return [run.result for run in runs]
            timed = [run for run in group if run.result.ok]
            for run in timed:
                run.result.interleaved = len(timed) > 1
            say(f"timed runs of {', '.join(run.result.backend.id for run in timed)}")
            for repeat in range(repeats):
                for run in timed:
                    run.repeat(repeat, last=repeat == repeats - 1)
                if not first.ok:
                    break
            for run in timed if first.ok and follow_up.active() is not None else ():  # nothing is judged without the first
                say(f"{run.result.backend.id}: the task's follow-up")
                run.follow_up()
        finally:
            for run in group:
                run.close()
        for run in group if on_done is not None else ():
            on_done(runs.index(run), run.result)
    return [run.result for run in runs]


def _groups(runs: list[_Run]) -> list[list[_Run]]:
    """The turns: each run, in order, joins the first group where no other resets the same process-wide state,
    so every backend takes turns with the reference but one that would reset a state another of the first
    group holds (a second compile target), which waits for a later group."""
    groups: list[list[_Run]] = []
    for run in runs:
        state = _resets(run.result.backend)
        free = (g for g in groups if state is None or all(_resets(r.result.backend) != state for r in g))
        group = next(free, None)
        if group is None:
            group = []
            groups.append(group)
        group.append(run)
    return groups


def _resets(spec: BackendSpec) -> str | None:
    try:
        return backend_class(spec.backend).resets_state
    except Exception:  # a backend that cannot even be looked up fails in its own `prepare` step, as before
        return None


def shapes(inputs: Inputs) -> str:
    """The shapes of the input tensors, for a detail: `2x8` or `2x3x32x32, 2x1x32x32`."""
    return ", ".join("x".join(map(str, t.shape)) or "scalar" for t in inputs.tensors())


def new_backend(spec: BackendSpec):
    """The backend `spec` names, handed what it needs before `prepare`: the running model's artifacts
    (ArtifactCache.for_model), if any, and a quantized target's calibration inputs."""
    backend = backend_class(spec.backend)(spec)
    backend.artifacts = cache.active()
    backend.calibration = calibration.for_spec(spec)
    return backend


class _Run:
    """One backend's execution, step by step (prepare, warm up, each timed repeat), so that the timed repeats of
    several backends can take turns. A step after a failure does nothing; each step's warnings are collected."""

    def __init__(self, spec: BackendSpec, own_copy: OwnCopy, inputs: Inputs, example: Inputs, on_run, warmup: int):
        self.result = Execution(spec, "ok", warmup=warmup)
        self.own_copy, self.inputs, self.example, self.on_run = own_copy, inputs, example, on_run
        self.collector = notes.Collector()
        self.backend, self.prepared = None, False

    def prepare(self) -> None:
        spec = self.result.backend
        with self._step(tx.PREPARE):
            reason = backend_class(spec.backend).available(spec)
            if reason:
                self.result.status, self.result.error = "unavailable", reason
                return
            self.backend = new_backend(spec)
            start = time.perf_counter()
            own_copy, self.own_copy = self.own_copy, None  # made now: no backend's copy exists before it is prepared
            self.backend.prepare(own_copy(), self.example.clone())
            self.result.prepare_s = time.perf_counter() - start
            self.result.cached, self.prepared = self.backend.cache_hit, True
            self.collector.add(self.backend.notes)

    def warm_up(self) -> None:
        if not self.result.ok:
            return
        with self._step(tx.RUN):
            for _ in range(self.result.warmup):  # not timed, but judged: what a first call returns is what a user gets
                self.result.warmup_outputs.append(self.backend.run(self.inputs.clone()))

    def repeat(self, repeat: int, last: bool) -> None:
        result = self.result
        if not result.ok:  # it failed in an earlier turn
            return
        with self._step(tx.RUN):
            fresh = self.inputs.clone()  # a model that writes into its input must not change the next run's
            with capture.watching() if repeat == 0 else contextlib.nullcontext(result.captured) as captured:
                start = time.perf_counter()
                result.outputs.append(self.backend.run(fresh))
                result.run_s.append(time.perf_counter() - start)
            result.captured = captured
        if last and result.ok and isinstance(self.backend, OwnTokenizer) and self.inputs.texts:
            with self._step(tx.RUN):
                result.tokens = own_tokens(self.backend, self.inputs)
        if self.on_run and result.ok:
            if last:
                result.notes = self.collector.notes()  # complete for the last repeat's record
            self.on_run(result, repeat)

    def follow_up(self) -> None:
        """What the task asks of the prepared backend after the timed runs (follow_up.py): its failure is the
        follow-up's (kept as its `error`), never the execution's, whose outputs are already judged as they are."""
        ask = follow_up.active()
        if ask is None or not self.result.ok:
            return
        try:
            with self.collector.step():
                self.result.follow_up = ask(self.backend, self.inputs.clone())
        except Exception as exc:
            self.result.follow_up = FollowUpRaised(describe(exc))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # model code that ends the program
            self.result.follow_up = FollowUpRaised(ends_the_program(exc))

    @contextlib.contextmanager
    def _step(self, phase: str) -> Iterator[None]:
        """Runs a step of `phase` (prepare, run): what it raises fails the execution, as a backend that raises fails
        its own checks and the run goes on, classed by the phase and the library that raised; its warnings are
        collected."""
        result = self.result
        try:
            with self.collector.step():
                yield
        except (CacheLost, NotRebuilt):  # the cache failed under the run, or the model's builder: exit 2 naming it
            raise
        except Exception as exc:
            result.status = "error"
            result.error = describe(exc)
            result.failure_class = classify_exception(exc, phase)
            result.traceback = format_traceback(exc)
            if self.prepared and self.backend.specializes_on_example and shapes(self.example) != shapes(self.inputs):
                result.failure_class = tx.SHAPE_SPECIALIZED
                result.error = (f"prepared from inputs of shape {shapes(self.example)}, it cannot run inputs of shape "
                                f"{shapes(self.inputs)}: {result.error}")
        except KeyboardInterrupt:  # the user's Ctrl-C stops the run
            raise
        except BaseException as exc:  # model code that ends the program (sys.exit) ends this execution, as a crash
            result.status = "error"
            result.error = ends_the_program(exc)
            result.failure_class = tx.CRASH
            result.traceback = format_traceback(exc)

    def close(self) -> None:
        """Release the backend (what its close raises must not hide the result); the notes are then complete."""
        backend, self.backend, self.own_copy = self.backend, None, None
        try:
            if backend is not None:
                with self.collector.step():
                    backend.close()
        except Exception:
            pass
        except KeyboardInterrupt:
            raise
        except BaseException:  # nor can model code that ends the program while it is closed
            pass
        self.result.notes = self.collector.notes()
