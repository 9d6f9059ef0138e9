"""TensorRT through Torch-TensorRT: the model exported with torch.export, then compiled by
`torch_tensorrt.dynamo.compile` into TensorRT engines (with the parts TensorRT cannot take left to PyTorch,
unless `require_full_compilation`), run on the GPU. CUDA only.

`precision: fp16` lets TensorRT pick float16 kernels while the model and its inputs stay float32 (the
deployment setting "fp16 engines"); `dtype: float16` casts the model and inputs themselves. `tf32: false`
forbids TensorFloat-32 in the engines (torch-tensorrt allows it by default) and in what PyTorch runs.

Engines are built in `prepare`, every time: they are not kept in the artifact cache, because an engine is
tied to the GPU and TensorRT version that built it, which the cache does not key on.
"""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import OutputSpec, cuda_reason, not_installed, synchronize, to_cpu
from parity.backends.eager import EagerBackend, call_lines, placement_lines
from parity.backends.export import export_lines
from parity.inputs import Inputs


class TensorRTOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    precision: Literal["fp32", "fp16"] = Field(
        default="fp32", description="fp16: TensorRT may use float16 kernels while model and inputs stay in the dtype")
    tf32: bool | None = Field(default=None, description="TensorFloat-32 in the engines and in what PyTorch runs "
                                                        "(None: torch-tensorrt's default, which allows it)")
    workspace_size: int = Field(default=0, ge=0, description="bytes TensorRT may use while building (0: its default)")
    require_full_compilation: bool = Field(
        default=False, description="fail rather than leave operators TensorRT cannot take to PyTorch")


def enabled_precisions(dtype: torch.dtype, precision: str) -> set[torch.dtype]:
    """The kernel precisions TensorRT may choose from: the target's dtype, and float16 with `precision: fp16`."""
    return {dtype, torch.float16} if precision == "fp16" else {dtype}


def compile_settings(options: TensorRTOptions, dtype: torch.dtype) -> dict:
    """The keyword arguments of torch_tensorrt.dynamo.compile that the options set."""
    return {"enabled_precisions": enabled_precisions(dtype, options.precision),
            "disable_tf32": options.tf32 is False, "workspace_size": options.workspace_size,
            "require_full_compilation": options.require_full_compilation}


class TensorRTBackend(EagerBackend):
    name = "tensorrt"
    devices = ("cuda",)
    dtypes = ("float32", "float16")
    specializes_on_example = True  # engines built for the example's shapes
    preparation_cost = 3  # an engine build
    runs_module_hooks = False
    legacy_devices = ()
    libraries = ("torch", "torch-tensorrt", "tensorrt")
    model_kinds = ("module", "exported")  # torch.export refuses a ScriptModule; an ONNX file has no forward
    quantize_schemes = ()
    decode = None  # not CachedDecoding: the engine is built without the KV cache (eager's decode runs the module)
    Options = TensorRTOptions

    @classmethod
    def available(cls, spec) -> str | None:
        missing = [not_installed("torch_tensorrt", "torch-tensorrt", "torch-tensorrt"), cuda_reason(spec.device)]
        return "; ".join(m for m in missing if m) or None

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        if spec.dtype == "float16" and spec.options.get("precision") == "fp16":
            return "option precision: fp16 is for float32 targets (dtype float16 already runs float16)"
        return None

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        o = cls.options_of(spec)
        settings = compile_settings(o, getattr(torch, spec.dtype))
        settings["enabled_precisions"] = "{" + ", ".join(f"torch.{str(d).split('.')[-1]}"
                                                        for d in sorted(settings["enabled_precisions"], key=str)) + "}"
        arguments = ", ".join(f"{k}={v}" for k, v in settings.items())
        return "\n".join([
            "import torch_tensorrt",
            *placement_lines(cls, spec),
            *export_lines(),
            f'compiled = torch_tensorrt.dynamo.compile(exported, arg_inputs=list(args), kwarg_inputs=kwargs or None, '
            f'device="{spec.device}", {arguments})',
            *call_lines("compiled"),
        ])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import torch_tensorrt

        model = model.to(self.device, self.dtype)
        example = self.convert(example)
        self.outputs = OutputSpec(model, example)
        exported = torch.export.export(model, tuple(example.args), example.kwargs or None)
        settings = compile_settings(self.options, self.dtype)
        if "use_explicit_typing" in inspect.signature(torch_tensorrt.dynamo.compile).parameters:
            # Releases where explicit typing is the default ignore enabled_precisions under it: without this,
            # `precision: fp16` would be a float32 engine under an fp16 name.
            settings["use_explicit_typing"] = False
        with torch.no_grad():
            self.model = torch_tensorrt.dynamo.compile(exported, arg_inputs=list(example.args),
                                                       kwarg_inputs=example.kwargs or None, device=self.device, **settings)

    def call(self, fn, inputs: Inputs):
        """As eager's, with the outputs rebuilt into the model's structure from the tensors the compiled
        module returns (flat or not), so that every leaf is named as the reference's."""
        from torch.utils._pytree import tree_leaves

        inputs = self.convert(inputs)
        with self.context():
            out = fn(*inputs.args, **inputs.kwargs)
            synchronize(self.device)
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return to_cpu(self.outputs.rebuild(tensors, "the TensorRT module"))
