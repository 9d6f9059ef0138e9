"""torch.compile (inductor by default). Compilation happens in `prepare`, so run times are steady state.

`close` resets dynamo: compiled frames are keyed on code objects, and without a reset the next model of
the same class would count against dynamo's recompile limit and might silently fall back to eager.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from parity.backends.eager import EagerBackend, call_lines, placement_lines
from parity.inputs import Inputs

# Inductor imports torch.utils.cpp_extension, which warns "No CUDA runtime is found" on every CPU-only
# machine: noise in a report, not a finding.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


class CompileOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    backend: str = "inductor"
    fullgraph: bool = False
    dynamic: bool | None = False
    tf32: bool | None = None  # as eager's: CUDA TensorFloat-32 (None: PyTorch's settings)


class CompileBackend(EagerBackend):
    name = "compile"
    specializes_on_example = True  # a graph made for the example's shapes
    preparation_cost = 3  # a compilation
    fallback_kind = "eager"  # modules taken out of the compiled graph run eagerly
    legacy_devices = ("cpu", "cuda")
    Options = CompileOptions

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        o = cls.Options.model_validate(spec.options)
        compiled = (f"compiled = torch.compile(module, mode={o.mode!r}, backend={o.backend!r}, fullgraph={o.fullgraph}, "
                    f"dynamic={o.dynamic})")
        return "\n".join([*placement_lines(cls, spec), compiled, *call_lines("compiled")])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import torch._dynamo

        torch._dynamo.reset()
        self.model = model.to(self.device, self.dtype)
        o = self.options
        self.compiled = torch.compile(self.model, mode=o.mode, backend=o.backend, fullgraph=o.fullgraph, dynamic=o.dynamic)
        self.call(self.compiled, example)  # compile now, not in the first timed run

    def run(self, inputs: Inputs):
        return self.call(self.compiled, inputs)

    def close(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()
