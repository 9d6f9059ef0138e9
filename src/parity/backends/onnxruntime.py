"""ONNX Runtime on a model exported with torch.onnx (the dynamo exporter).

The exported graph takes the flattened input tensors and returns the flattened output tensors; the
model's output structure (tuples, dicts, lists of dicts, from one eager run of this backend's own copy)
is rebuilt around them, so that ONNX outputs are compared leaf by leaf with the same names as every
other backend's. Non-tensor outputs (None) are not in the graph and come from that run.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import Backend, OutputSpec, cuda_reason
from parity.inputs import Inputs

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OnnxRuntimeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    optimization: Literal["disable", "basic", "extended", "all"] = "all"
    opset: int | None = Field(default=None, ge=7)
    threads: int | None = Field(default=None, ge=1)


def export_onnx(model: torch.nn.Module, example: Inputs, path: Path, opset: int | None) -> None:
    """Export with the dynamo exporter (its progress messages are kept off the console)."""
    with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        torch.onnx.export(model, example.args, str(path), kwargs=example.kwargs or None, dynamo=True,
                          opset_version=opset, external_data=False, verbose=False)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    devices = ("cpu", "cuda")
    dtypes = ("float32", "float16")
    Options = OnnxRuntimeOptions

    @classmethod
    def available(cls, spec) -> str | None:
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed (pip install onnxruntime)"
        if spec.device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                return "onnxruntime has no CUDAExecutionProvider here (pip install onnxruntime-gpu)"
            return cuda_reason(spec.device)
        return None

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import onnxruntime as ort

        self._tmp = tempfile.TemporaryDirectory(prefix="parity-onnx-")
        path = Path(self._tmp.name) / "model.onnx"
        model, example = model.to(self.dtype), example.to("cpu", self.dtype)
        self.outputs = OutputSpec(model, example)
        export_onnx(model, example, path, self.options.opset)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self.options.optimization])
        if self.options.threads:
            opts.intra_op_num_threads = self.options.threads
        if self.device.type == "cuda":
            providers = [("CUDAExecutionProvider", {"device_id": self.device.index or 0})]
        else:
            providers = ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(path), opts, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: Inputs):
        tensors = inputs.to("cpu", self.dtype).tensors()
        if len(tensors) != len(self.input_names):
            raise RuntimeError(f"the ONNX graph takes {len(self.input_names)} inputs, got {len(tensors)} tensors")
        feed = {name: t.contiguous().numpy() for name, t in zip(self.input_names, tensors, strict=True)}
        return self.outputs.rebuild([torch.from_numpy(a) for a in self.session.run(None, feed)], "the ONNX graph")

    def close(self) -> None:
        self.session = None
        if getattr(self, "_tmp", None):
            self._tmp.cleanup()
