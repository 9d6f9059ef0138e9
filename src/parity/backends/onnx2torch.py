"""onnx2torch: an ONNX graph file (`source: onnx`) converted to a torch module (`onnx2torch.convert`) and run
in eager PyTorch: whether PyTorch's kernels agree with the runtime the file was made for. Needs
`pip install 'parity[onnx2torch]'`; it takes ONNX files only (a torch model has its own eager backend).
"""

from __future__ import annotations

import torch

from parity.backends.base import Backend, ThreadsOptions, not_installed, num_threads, onnx_file, to_cpu
from parity.inputs import Inputs


class Onnx2TorchBackend(Backend):
    name = "onnx2torch"
    preparation_cost = 1  # a conversion, about as long as a trace
    libraries = ("torch", "onnx", "onnx2torch")
    model_kinds = ("onnx",)
    Options = ThreadsOptions

    @classmethod
    def available(cls, spec) -> str | None:
        return not_installed("onnx2torch", "'parity[onnx2torch]'")

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import onnx2torch

        path = onnx_file(model)
        if path is None:
            raise RuntimeError("onnx2torch runs ONNX graph files only (source: onnx)")
        self.graph = model  # the OnnxFileModel: input order and output names
        self.model = onnx2torch.convert(str(path)).eval()

    def run(self, inputs: Inputs):
        tensors = self.graph.ordered(inputs.args, inputs.kwargs)
        with torch.inference_mode(), num_threads(self.options.threads):
            out = self.model(*tensors)
        return to_cpu(self.graph.outputs_from(list(out) if isinstance(out, tuple | list) else [out]))
