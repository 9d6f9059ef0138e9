"""torch.compile (inductor by default). Compilation happens in `prepare`, so run times are steady state.

`close` resets dynamo: compiled frames are keyed on code objects, and without a reset the next model of
the same class would count against dynamo's recompile limit and might silently fall back to eager.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from parity.backends.base import MODULE_KINDS
from parity.backends.eager import EagerBackend, call_lines, placement_lines
from parity.errors import did_you_mean, exception_words
from parity.inputs import Inputs

# Inductor imports torch.utils.cpp_extension, which warns "No CUDA runtime is found" on every CPU-only
# machine: noise in a report, not a finding.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

# Dynamo backends every torch accepts: checked without importing torch._dynamo (seconds), which the other
# names need. list_backends() leaves some of these out (its default excludes "debug" tags).
BUILTIN_DYNAMO_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")


def dynamo_backend_problem(name: str) -> str | None:
    """None when torch.compile accepts `name` as its backend, else what is wrong: found when the experiment
    is checked, not after the reference has run and the target starts to compile."""
    if name in BUILTIN_DYNAMO_BACKENDS:
        return None
    from torch._dynamo import list_backends

    known = sorted(set(list_backends(exclude_tags=())) | set(BUILTIN_DYNAMO_BACKENDS))
    if name in known:
        return None
    return f"unknown torch.compile backend '{name}'{did_you_mean(name, known)} (see torch._dynamo.list_backends())"



def _headers_beside_the_cache() -> None:
    """torch precompiles C++ headers into TMPDIR/torchinductor_USER/precompiled_headers whatever
    TORCHINDUCTOR_CACHE_DIR says (the folder is fixed when torch._inductor.codecache is imported), and leaves
    them there: beside the rest of inductor's cache instead (the artifact cache's, or parity's state folder)."""
    from torch._inductor import codecache

    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if folder and hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_DIR = os.path.join(folder, "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")

class CompileOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    backend: str = "inductor"
    fullgraph: bool = False
    dynamic: bool | None = False
    tf32: bool | None = None  # as eager's: CUDA TensorFloat-32 (None: PyTorch's settings)
    # torch.compile takes them with mode "default" only
    inductor_config: dict[str, bool | int | float | str] = Field(default_factory=dict)  # torch._inductor.config settings (torch.compile's options), e.g. the switch a compiler-pass bisection names: {emulate_precision_casts: true}

    @field_validator("inductor_config")
    @classmethod
    def _known_settings(cls, settings: dict) -> dict:
        if settings:
            import torch._inductor.config as config

            known = set(config.get_config_copy())
            for name in settings:
                if name not in known:
                    raise ValueError(f"torch._inductor.config has no setting '{name}'{did_you_mean(name, known)}")
        return settings

    @model_validator(mode="after")
    def _options_or_mode(self) -> CompileOptions:
        if self.inductor_config and self.mode != "default":
            raise ValueError(f"inductor_config and mode '{self.mode}' together: torch.compile takes one or the other")
        if self.inductor_config and self.backend != "inductor":
            raise ValueError(f"inductor_config configures inductor; this target's backend is '{self.backend}'")
        return self

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        problem = dynamo_backend_problem(name)
        if problem:
            raise ValueError(problem)
        return name


class CompileBackend(EagerBackend):
    name = "compile"
    specializes_on_example = True  # a graph made for the example's shapes
    preparation_cost = 3  # a compilation
    fallback_kind = "eager"  # modules taken out of the compiled graph run eagerly
    resets_state = "dynamo"  # prepare and close call torch._dynamo.reset(), which drops every compiled graph
    legacy_devices = ("cpu", "cuda")
    Options = CompileOptions
    model_kinds = MODULE_KINDS  # torch.compile refuses a ScriptModule; an ONNX graph has no Python
    quantize_schemes = ("pt2e-x86", "torchao-int8-dynamic", "torchao-int8-weight", "torchao-int4-weight")

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        o = cls.options_of(spec)
        how = f"options={o.inductor_config!r}" if o.inductor_config else f"mode={o.mode!r}"
        compiled = (f"compiled = torch.compile(module, {how}, backend={o.backend!r}, fullgraph={o.fullgraph}, "
                    f"dynamic={o.dynamic})")
        return "\n".join([*placement_lines(cls, spec), compiled, *call_lines("compiled")])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import torch._dynamo

        torch._dynamo.reset()
        self.model = self.quantized(model, example).to(self.device, self.dtype)
        o = self.options
        how = {"options": dict(o.inductor_config)} if o.inductor_config else {"mode": o.mode}
        _headers_beside_the_cache()
        self.compiled = torch.compile(self.model, backend=o.backend, fullgraph=o.fullgraph, dynamic=o.dynamic, **how)
        with self.freezing():
            self.call(self.compiled, example)  # compile now, not in the first timed run

    def freezing(self):
        """Inductor lowers a PT2E int8 graph's quantize/dequantize patterns to int8 kernels when it freezes the
        weights (the x86 int8 deployment path); other targets compile with inductor's settings as they are."""
        import contextlib

        if self.spec.quantize is None or self.spec.quantize.scheme != "pt2e-x86" or self.options.backend != "inductor":
            return contextlib.nullcontext()
        import torch._inductor.config

        return torch._inductor.config.patch(freezing=True)

    def run(self, inputs: Inputs):
        with self.freezing():  # a recompilation for other shapes lowers as the first compilation did
            return self.call(self.compiled, inputs)

    def decoding_module(self) -> torch.nn.Module:
        return self.compiled  # the prefill and each step compiled as deployed (dynamo makes the cache length dynamic)

    def decode(self, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None):
        with self.freezing():
            return super().decode(prompt, steps, forced)

    def close(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()

    def run_layers_together(self, model: torch.nn.Module, layers: dict[str, list[Inputs]]) -> dict[str, list]:
        """The layers side by side in one module (`_Side`), compiled once and run once on every recorded call. Each
        call's inputs are inputs of the graph, as they are of a layer compiled alone, and no value flows between
        layers, so no layer's operations are fused into another's computation: each computes as it would alone (on
        ResNet-18 to the last digit), and dynamo's and inductor's work is done once for the level. A layer called
        twice is one module called twice."""
        import copy

        names = list(layers)
        side = _Side(copy.deepcopy([model.get_submodule(n) for n in names]),  # one copy: tied weights stay tied
                     [i for i, n in enumerate(names) for _ in layers[n]])
        calls = Inputs(tuple((c.args, c.kwargs) for n in names for c in layers[n]))
        try:
            self.prepare(side, calls.clone())
            outputs = iter(self.run(calls.clone()))
        finally:
            self.close()
            self.model = self.compiled = None  # the layers' copy and their graph are not kept for the next level
        return {n: [next(outputs) for _ in layers[n]] for n in names}

    @classmethod
    def compiler_pass(cls, spec, passes: Callable[[], bool], budget_s: float) -> dict[str, Any] | None:
        """The compiler subsystem and pass that makes `passes` (the check passes at the gate) false, found with torch's
        own CompilerBisector: the backends eager, aot_eager, ... inductor in turn, then inside the first that fails
        each subsystem disabled (a ConfigChange: one inductor setting switched) or bisected to the one application of
        a pass or lowering. Stops after `budget_s` seconds (a bisection compiles the model once per step). None for a
        target the bisector does not walk (another dynamo backend, int8)."""
        import contextlib
        import io
        import time

        if cls.options_of(spec).backend != "inductor" or spec.quantize is not None:
            return None
        from torch._inductor import compiler_bisector as bisector

        start, steps = time.perf_counter(), 0

        def step() -> bool:
            nonlocal steps
            if time.perf_counter() - start > budget_s:
                raise _OutOfTime
            steps += 1
            return passes()

        said = io.StringIO()  # the bisector prints each step, and its cleanup when its frame goes: off the console
        with contextlib.redirect_stdout(said):
            try:
                found = bisector.CompilerBisector.do_bisect(step)
            except _OutOfTime:
                stopped = f"stopped after {budget_s:g} s ({steps} compilations) before it named a pass"
            except Exception as exc:  # evidence, not the run
                stopped = f"the bisection failed: {exception_words(exc)}"
            else:
                stopped = None
        if stopped is not None:
            return {"found": False, "steps": steps, "elapsed_s": time.perf_counter() - start, "why": stopped}
        record = {"found": found is not None, "steps": steps, "elapsed_s": time.perf_counter() - start}
        if found is None:
            return {**record, "why": "every backend, inductor included, passes the check when the bisector runs it"}
        record.update(backend=found.backend, subsystem=found.subsystem, application=found.bisect_number,
                      debug_info=(found.debug_info or "")[:300] or None)
        change = next((c for c in bisector.BACKENDS.get(found.backend, [])
                       if isinstance(c, bisector.ConfigChange) and c.name == found.subsystem), None)
        if change is not None and change.config_name == "inductor":  # a switch this target can take as an option
            record["subsystem"] = change.config_field
            record["switch"] = {change.config_field: change.config_value}
        return record


class _Side(torch.nn.Module):
    """Layers side by side: called with each recorded call's (args, kwargs), in order, it returns each call's output
    from the layer `which` names for it."""

    def __init__(self, layers: list[torch.nn.Module], which: list[int]):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.which = which

    def forward(self, *calls):
        return tuple(self.layers[i](*args, **kwargs) for i, (args, kwargs) in zip(self.which, calls, strict=True))


class _OutOfTime(Exception):
    """A compiler-pass bisection past its time budget."""
