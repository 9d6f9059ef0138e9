"""PyTorch eager mode: the reference, the float64 oracle, and eager variants (dtype, layout, threads)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import MAX_THREADS, Backend, num_threads, synchronize, tf32, to_cpu
from parity.config.schema import DTYPES
from parity.inputs import Inputs


class EagerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channels_last: bool = False
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    autocast: bool = Field(default=False, description="keep float32 weights and run under torch.autocast(dtype)")
    tf32: bool | None = Field(default=None, description="CUDA: TensorFloat-32 in float32 convolutions and matmuls "
                                                        "(None: PyTorch's settings, which allow it in convolutions)")


class EagerBackend(Backend):
    name = "eager"
    devices = ("cpu", "cuda")
    legacy_devices = ("cuda",)  # on the CPU it is the reference
    dtypes = DTYPES
    Options = EagerOptions
    runs_module_hooks = True

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        if spec.options.get("autocast") and spec.dtype not in ("bfloat16", "float16"):
            return "option autocast needs dtype bfloat16 or float16"
        if spec.options.get("tf32") is not None and not spec.device.startswith("cuda"):
            return "option tf32 applies to CUDA devices only"
        return None

    def _option(self, name: str, default=None):
        """Eager-only options; subclasses (compile) that lack them get the plain behaviour."""
        return getattr(self.options, name, default)

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        model = model.to(self.device)
        if not self.options.autocast:
            model = model.to(self.dtype)
        if self.options.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model

    def convert(self, inputs: Inputs) -> Inputs:
        """Inputs on this backend's device, in its dtype (unless autocast does the casting)."""
        inputs = inputs.to(self.device, None if self._option("autocast", False) else self.dtype)
        if self._option("channels_last", False):
            inputs = inputs.map(lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
        return inputs

    def context(self):
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(num_threads(self._option("threads")))
        stack.enter_context(tf32(self._option("tf32")))
        if self._option("autocast", False):
            stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        return stack

    def call(self, fn, inputs: Inputs) -> Any:
        inputs = self.convert(inputs)
        with self.context():
            out = fn(*inputs.args, **inputs.kwargs)
            synchronize(self.device)
        return to_cpu(out)

    def run(self, inputs: Inputs) -> Any:
        return self.call(self.model, inputs)
