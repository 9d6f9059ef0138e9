"""Tier 2's layer runs: what a backend is made to run so that its layers can be read.

Two ways to look at a layer on the target:
- *local* (teacher forcing): the layer alone, prepared by the target backend (compiled, exported, cast...)
  and fed the reference's own input to that layer, so its error is its own and not carried in;
- *propagated*: the target runs the whole model and the layer's output is read on the way (module
  hooks), so the error includes everything carried in from earlier layers.

Each compares what it read with verify/activations.py's `layer_error`; runner/localization.py decides which layers to
read next.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from parity.backends import backend_class
from parity.backends.base import CachedDecoding, CapturesLayers, RunsLayersTogether, SlicesLayers
from parity.config.schema import BackendSpec
from parity.errors import exception_words
from parity.execute import calibration
from parity.execute.execution import execute, new_backend
from parity.inputs import Inputs
from parity.outputs import flatten, map_tensors
from parity.records.models import LayerError
from parity.verify.activations import (
    Call,
    arguments,
    cloned,
    install_hooks,
    layer_error,
    new_layer_error,
    on_cpu,
    worst,
)


def capture(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs, names: list[str],
            with_inputs: bool = True, example: Inputs | None = None) -> dict[str, list[Call]]:
    """Run `model` (a private copy) end to end on the backend `spec`, prepared from `example` (None: from
    `inputs`), on `inputs`, and record every call of the named modules. The backend must run the module's
    Python forward (eager, compile)."""
    cls = backend_class(spec.backend)
    if not cls.runs_module_hooks:
        raise ValueError(f"backend {spec.id} does not run module hooks")
    hooked = copy.deepcopy(model)
    sink: list = []
    install_hooks(hooked, names, sink, with_inputs)
    backend = cls(spec)
    try:
        backend.prepare(hooked, (example if example is not None else inputs).clone())
        sink.clear()  # preparation may run the model (compile warms up); keep the timed run only
        backend.run(inputs)
    finally:
        backend.close()
    calls: dict[str, list[Call]] = {}  # in the order of first call, modules never called left out
    sink.reverse()
    while sink:  # popped as converted, so the captured values exist once
        name, io, output = sink.pop()
        calls.setdefault(name, [])
        args, kwargs = io if io is not None else ((), {})
        calls[name].append(Call(name, len(calls[name]), Inputs(on_cpu(tuple(args)), on_cpu(dict(kwargs))), on_cpu(output)))
    return calls


@dataclass
class DecodeStep:
    """The calls of the named modules in one decode step of a backend's cached decoding, and the arguments the model
    itself was called with in that step (a dict by name: the decode loop's position ids, its cache)."""

    calls: dict[str, list[Call]]
    model_arguments: dict[str, Any]


def capture_decode_step(spec: BackendSpec, model: torch.nn.Module, prompt: torch.Tensor, token: torch.Tensor,
                        names: list[str], example: Inputs) -> DecodeStep:
    """Prepare the backend `spec` (from `example`) on a hooked private copy of `model`, decode through its own KV cache
    (`CachedDecoding.decode`): a prefill over `prompt` [batch, P], then `token` [batch] fed alone, and keep the named
    modules' calls of that decode step only: the model's own pre-hook counts its calls (one per step), and the
    modules' hooks record during the second alone, so the prefill's activations are never kept. Raises
    NotImplementedError (one line) for a backend that has no cached decoding or runs no module hooks."""
    cls = backend_class(spec.backend)
    if not cls.runs_module_hooks:
        raise NotImplementedError(f"target {spec.id} runs no module hooks: its decode step cannot be looked inside")
    hooked = copy.deepcopy(model)
    sink: list = []
    steps: list = []  # the model's own calls: the arguments of each (only the decode step's are cloned)
    install_hooks(hooked, names, sink, with_inputs=True, when=lambda: len(steps) == 2)
    hooked.register_forward_pre_hook(
        lambda mod, args, kwargs: steps.append(cloned((args, kwargs)) if len(steps) == 1 else None), with_kwargs=True)
    backend = cls(spec)
    try:
        backend.prepare(hooked, example.clone())
        if not isinstance(backend, CachedDecoding):
            raise NotImplementedError(f"target {spec.id} has no cached decoding (backend '{cls.name}' does not "
                                      "implement CachedDecoding): there is no decode step to look inside")
        sink.clear()  # preparation may run the model
        steps.clear()
        backend.decode(prompt.clone(), 2, torch.stack([token, token], 1))  # the prefill, then `token`: one step
    finally:
        backend.close()
    if len(steps) != 2:
        raise ValueError(f"target {spec.id}'s cached decoding called the model {len(steps)} time(s) for a prefill "
                         "and one decode step, not 2")
    calls: dict[str, list[Call]] = {}
    for name, (a, k), output in sink:
        calls.setdefault(name, [])
        calls[name].append(Call(name, len(calls[name]), Inputs(on_cpu(tuple(a)), on_cpu(dict(k))), on_cpu(output)))
    args, kwargs = steps[1]
    return DecodeStep(calls, arguments(hooked, Inputs(on_cpu(tuple(args)), on_cpu(dict(kwargs)))))


def observes_layers(spec: BackendSpec) -> bool:
    """Can the target show layer outputs from inside its own end-to-end run? A quantized target cannot: PT2E
    exports the model into one graph that module hooks do not see, and its layers' own errors are what tier 2
    ranks for it (`calibration_inputs`)."""
    cls = backend_class(spec.backend)
    return (cls.runs_module_hooks or issubclass(cls, CapturesLayers)) and spec.quantize is None


def calibration_inputs(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module,
                       names: list[str]) -> dict[str, list[Inputs]] | None:
    """For a target calibrated on data: each named layer's inputs in the float model's calibration runs, which
    are what the layer's observers see when the whole model is calibrated (observers do not change what flows).
    Quantized alone on these and fed the reference's inputs, a layer shows its own quantization error, as
    torch.ao.ns's shadow loggers measure it. None for a target that observes no data."""
    runs = calibration.for_spec(target)
    if runs is None:
        return None
    seen: dict[str, list[Inputs]] = {name: [] for name in names}
    for run in runs:
        for name, calls in capture(reference, model, run, names).items():
            seen[name] += [c.inputs for c in calls]
    return seen


OBSERVED_AT_ONCE_BYTES = 512 * 2**20  # the most layer outputs one hooked run of the target keeps for every level


@dataclass
class _Inside:
    """What tier 2 holds while it looks inside one target: its backend, and the layer outputs of one end-to-end run
    of it that observed every layer a descent can reach (`observe_at_once`), with the inputs they were read on."""

    backend: Any
    seen: dict[str, list] | None = None
    names: frozenset[str] = frozenset()
    inputs: Inputs | None = None


_INSIDE: ContextVar[_Inside | None] = ContextVar("parity_tier2_target", default=None)


@contextmanager
def looking_inside(spec: BackendSpec) -> Iterator[None]:
    """Within, tier 2 looks inside the target `spec` (reads its layers' outputs, slices its layers) through one
    backend, so that the artifact of the whole model it looks inside (ONNX Runtime's graph) is made once for a whole
    localization, not once per level, even when nothing is cached."""
    inside = _Inside(new_backend(spec))
    token = _INSIDE.set(inside)
    try:
        yield
    finally:
        _INSIDE.reset(token)
        inside.backend.close()


@contextmanager
def _backend_inside(spec: BackendSpec) -> Iterator[Any]:
    """The backend `looking_inside` holds for `spec`, else one of its own, closed afterwards."""
    held = _INSIDE.get()
    if held is not None and held.backend.spec == spec:
        yield held.backend
        return
    backend = new_backend(spec)
    try:
        yield backend
    finally:
        backend.close()


def output_bytes(model: torch.nn.Module, inputs: Inputs, names: list[str]) -> int:
    """How many bytes the named modules' outputs take over one eager forward of `model` on `inputs`."""
    total = 0

    def count(mod, args, output) -> None:
        nonlocal total
        total += sum(v.numel() * v.element_size() for v in flatten(output).values() if isinstance(v, torch.Tensor))

    handles = [model.get_submodule(name).register_forward_hook(count) for name in names]
    try:
        with torch.inference_mode():
            model(*inputs.clone().args, **inputs.clone().kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return total


def observe_at_once(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs, names: list[str],
                    example: Inputs | None) -> bool:
    """Within `looking_inside(spec)`, for a target read through module hooks: one end-to-end run on `inputs` with every
    layer in `names` (all a descent can reach) observed, kept for each level's propagated errors, so that a compile
    target is compiled with hooks once per localization instead of once per level. Not when their outputs would take
    more than OBSERVED_AT_ONCE_BYTES (counted on an eager run), nor when that run fails: each level then observes its
    own layers. A layer observed beside more layers is read where the target materializes more values, as a flat
    leaf-level comparison reads it. Returns whether the outputs are kept."""
    held = _INSIDE.get()
    if (held is None or held.backend.spec != spec or not backend_class(spec.backend).runs_module_hooks
            or not observes_layers(spec) or output_bytes(model, inputs, names) > OBSERVED_AT_ONCE_BYTES):
        return False
    try:
        calls = capture(spec, model, inputs, names, with_inputs=False, example=example)
    except Exception:  # each level runs the target itself, and records why it failed
        return False
    held.seen = {name: [c.output for c in layer] for name, layer in calls.items()}
    held.names, held.inputs = frozenset(names), inputs
    return True


def _observed(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs, names: list[str],
              example: Inputs | None) -> dict[str, list | str]:
    """Outputs per call of each named layer in one target run on `inputs`, prepared from `example` (None:
    `inputs`): through module hooks (read from the run `observe_at_once` kept, when it observed them), or the
    backend's own `capture_layers` (ONNX Runtime: intermediate values made graph outputs). A string says why not."""
    held = _INSIDE.get()
    if held is not None and held.seen is not None and held.backend.spec == spec and held.inputs is inputs \
            and held.names.issuperset(names):
        return {name: held.seen[name] for name in names if name in held.seen}  # a module never called is left out
    if backend_class(spec.backend).runs_module_hooks:
        return {name: [c.output for c in calls]
                for name, calls in capture(spec, model, inputs, names, with_inputs=False, example=example).items()}
    with _backend_inside(spec) as backend:  # it copies what it changes
        return backend.capture_layers(model, (example if example is not None else inputs).clone(), names,
                                      inputs=inputs.clone())


def propagated_errors(spec: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                      reference: dict[str, list[Call]], rtol: float, example: Inputs | None = None) -> dict[str, LayerError]:
    """Each layer's output inside the target's own end-to-end run (prepared from `example`), against the reference's."""
    try:
        target = _observed(spec, model, inputs, list(reference), example)
    except Exception as exc:  # the end-to-end run failed: every layer says so, local results stand
        why = f"the target's end-to-end run failed: {exception_words(exc)}"
        return {name: new_layer_error(name, required_atol=None, error=why) for name in reference}
    out = {}
    for name, ref_calls in reference.items():
        seen = target.get(name, [])
        if isinstance(seen, str):
            out[name] = new_layer_error(name, required_atol=None, error=seen)
            continue
        if len(seen) != len(ref_calls):
            out[name] = new_layer_error(name, required_atol=None,
                                   error=f"{len(seen)} output(s) on the target, {len(ref_calls)} call(s) on the reference")
            continue
        out[name] = worst([layer_error(name, r.output, t, rtol) for r, t in zip(ref_calls, seen, strict=True)])
    return out


def local_error(spec: BackendSpec, module: torch.nn.Module, calls: list[Call], rtol: float) -> LayerError:
    """The layer alone on the target, prepared alone and fed the reference's inputs to it: its own error."""
    errors = []
    for call in calls:
        result = execute(spec, module, call.inputs, 1)
        if not result.ok:
            return new_layer_error(call.name, required_atol=None, error=f"{result.status}: {result.error}")
        errors.append(layer_error(call.name, call.output, result.outputs[0], rtol))
    return worst(errors) if errors else new_layer_error(calls[0].name if calls else "?", error="never called")


def local_errors(spec: BackendSpec, model: torch.nn.Module, calls: dict[str, list[Call]], rtol: float,
                 example: Inputs, own: dict[str, list[Inputs]] | None = None,
                 say: Callable[[str], None] = lambda text: None) -> dict[str, LayerError]:
    """Each layer's own error (`local_error`), in call order. A backend that slices layers (`SlicesLayers`: ONNX
    Runtime) runs them all as slices of one artifact of the whole model, prepared from `example` as the run prepared
    it, so a level costs one export rather than one per layer; a backend that runs layers together
    (`RunsLayersTogether`: compile) prepares them side by side as one artifact, each fed its own recorded inputs,
    so a level costs one compilation. A layer it cannot slice, layers that cannot be prepared together (and every
    layer of a quantized target, calibrated per layer on `own`, its inputs in the calibration runs) are prepared
    alone, and say why.
    `say` hears what is measured next (the slices; each layer prepared alone, k of n), for progress."""
    cls = backend_class(spec.backend)
    sliced: dict[str, list | str] = {}
    how = "slice"
    if issubclass(cls, RunsLayersTogether) and own is None and spec.quantize is None and len(calls) > 1:
        say(f"{len(calls)} layers prepared together")
        how = "together"
        try:
            with _backend_inside(spec) as backend:
                sliced = backend.run_layers_together(model, {name: [c.inputs for c in layer] for name, layer in calls.items()})
        except Exception as exc:  # one layer the backend cannot take: each is prepared alone
            why = f"the layers could not be prepared together: {exception_words(exc)}"
            sliced = dict.fromkeys(calls, why)
    elif issubclass(cls, SlicesLayers) and own is None:
        say(f"{len(calls)} layers as slices of the whole model's artifact")
        try:
            with _backend_inside(spec) as backend:
                sliced = backend.slice_layers(model, example.clone(),
                                              {name: [(c.inputs, c.output) for c in layer] for name, layer in calls.items()})
        except Exception as exc:  # the whole graph could not be exported: every layer is exported alone
            why = f"the whole model's graph could not be sliced: {exception_words(exc)}"
            sliced = dict.fromkeys(calls, why)
    out = {}
    for k, (name, layer) in enumerate(calls.items()):
        got = sliced.get(name)
        if isinstance(got, list):
            out[name] = worst([layer_error(name, c.output, t, rtol) for c, t in zip(layer, got, strict=True)]
                              ).model_copy(update={"measured_by": how})
            continue
        say(f"layer {k + 1} of {len(calls)}, {name}" + (" (not sliced)" if got else ""))
        mine = own[name] if own is not None else None
        with calibration.providing(lambda _set, mine=mine: mine) if mine is not None else nullcontext():
            out[name] = local_error(spec, model.get_submodule(name), layer, rtol).model_copy(
                update={"measured_by": "export" + (f" ({got})" if got else "")})
    return out


class Replay(torch.nn.Module):
    """Stands in for a submodule: returns the reference's recorded outputs call after call, and keeps what
    it is handed (the parent's own code computed that). Deep copies share both lists, so the inputs
    received inside a backend's private copy are seen here."""

    def __init__(self, outputs: list[Any], received: list | None = None):
        super().__init__()
        self.outputs = outputs
        self.received = [] if received is None else received

    def __deepcopy__(self, memo: dict) -> Replay:
        return Replay(self.outputs, self.received)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.outputs[len(self.received) % len(self.outputs)]
        self.received.append(cloned((args, kwargs)))
        return cloned(out)  # a copy: the parent's own code may add into it in place (`out += x`), run after run


def as_the_target_hands_it(spec: BackendSpec) -> Callable[[Any], Any]:
    """The reference's recorded values as the target's own code would receive them from its submodules: in the
    target's dtype and on its device, so that a float16 target's own code (an attention's Q·K^T, a norm's sum of
    squares) runs in float16 and overflows where float32 does not. Under autocast they stay as recorded: autocast
    casts them where the target would."""
    dtype = getattr(torch, spec.dtype, None)
    device = torch.device(spec.device)
    cast = isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype != torch.float32 \
        and not spec.options.get("autocast")

    def convert(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device)
        return t.to(dtype) if cast and t.is_floating_point() else t

    return lambda obj: map_tensors(obj, convert)


def own_code_error(reference: BackendSpec, target: BackendSpec, model: torch.nn.Module, inputs: Inputs,
                   parent: str, members: list[str], rtol: float, example: Inputs | None = None) -> LayerError | None:
    """The error of `parent`'s own code (the operations between its submodules): the parent runs on the
    target with every submodule replaced by a replay of the reference's outputs, fed the reference's
    input. A backend that slices layers runs the parent's own code as a slice of the whole model's artifact
    (prepared from `example`, None: `inputs`) instead, fed the same, and exports the parent with replays only
    when it cannot. None when the parent is called more than once (replays would not line up), and for a
    quantized target."""
    if target.quantize is not None:  # a parent of replays would be quantized without its layers' ranges
        return None
    calls = capture(reference, model, inputs, [parent, *members])
    if len(calls.get(parent, [])) != 1:
        return None
    name = f"{parent or 'the model'} (own code)"
    why = None
    if issubclass(backend_class(target.backend), SlicesLayers):
        try:
            with _backend_inside(target) as backend:
                got = backend.slice_own_code(model, (example if example is not None else inputs).clone(), parent,
                                             (calls[parent][0].inputs, calls[parent][0].output),
                                             {m: [(c.inputs, c.output) for c in calls[m]] for m in members if m in calls})
        except Exception as exc:
            got = exception_words(exc)
        if not isinstance(got, str):
            errors = [layer_error(n, ref, tgt, rtol) for n, pairs in got.items() for ref, tgt in pairs]
            error = worst(errors) if errors else new_layer_error(name)  # nothing computed of its own: nothing differs
            return error.model_copy(update={"name": name, "measured_by": "slice"})
        why = got
    block = copy.deepcopy(model.get_submodule(parent))
    prefix = f"{parent}." if parent else ""
    handed = as_the_target_hands_it(target)
    replays: dict[str, Replay] = {}
    for member in members:
        if member in calls:
            relative = member[len(prefix):]
            owner, _, attr = relative.rpartition(".")
            replays[member] = Replay([handed(c.output) for c in calls[member]])
            setattr(block.get_submodule(owner) if owner else block, attr, replays[member])
    errors = [local_error(target, block, calls[parent], rtol)]  # what the parent returns...
    for member, replay in replays.items():  # ...and what its own code hands each submodule
        got = [received for received in replay.received if _all_real(received)]
        if len(got) == len(calls[member]):
            errors += [layer_error(member, (c.inputs.args, c.inputs.kwargs), r, rtol)
                       for c, r in zip(calls[member], got, strict=True)]
    return worst(errors).model_copy(update={"name": name, "measured_by": "export" + (f" ({why})" if why else "")})


def _all_real(obj: Any) -> bool:
    """False for values recorded while a backend traced the code (fake or symbolic tensors)."""
    tensors = [v for v in flatten(obj).values() if isinstance(v, torch.Tensor)]
    return all(type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in tensors)
