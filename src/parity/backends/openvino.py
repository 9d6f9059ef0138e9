"""OpenVINO on the CPU (when the `openvino` package is installed).

OpenVINO's CPU plugin may run float32 models in bfloat16 on processors that support it; parity pins the
inference precision to the backend's dtype (float32 unless asked otherwise) so that a drift is never
an unannounced precision change. An ONNX graph file (`source: onnx`) is read as it is (`read_model`), not
converted from a module.

A keyword input the converted model has no port for is not fed: a transformers model whose forward takes
`**kwargs` (LLaMA, DistilBERT) runs in eager with a tokenizer's `token_type_ids` and ignores them, so the trace
never reads them and OpenVINO's model has no such input. The log says so once, when the model is prepared.
"""

from __future__ import annotations

import logging
import warnings

import torch

from parity.backends.base import (
    Backend,
    OutputSpec,
    ThreadsOptions,
    not_installed,
    onnx_file,
    runtime_threads,
)
from parity.inputs import Inputs

log = logging.getLogger(__name__)
PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


class OpenVinoBackend(Backend):
    name = "openvino"
    legacy_devices = ("cpu",)
    preparation_cost = 2  # an export
    libraries = ("torch", "openvino", "numpy")
    dtypes = ("float32", "bfloat16", "float16")
    Options = ThreadsOptions
    model_kinds = ("module", "exported", "torchscript", "onnx")  # convert_model takes a ScriptModule too

    @classmethod
    def available(cls, spec) -> str | None:
        return not_installed("openvino", "'parity[openvino]'")

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        """Converted and compiled as parity does: the inference precision pinned to the target's dtype."""
        threads = cls.options_of(spec).threads
        return "\n".join([
            "import openvino as ov",
            "feed = kwargs or [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]",
            "with torch.no_grad():",
            "    converted = ov.convert_model(module, example_input=feed)",
            f'compiled = ov.Core().compile_model(converted, "CPU", {{"INFERENCE_PRECISION_HINT": "{PRECISION[spec.dtype]}", '
            f'"INFERENCE_NUM_THREADS": {threads or "torch.get_num_threads()"}}})',
            "result = compiled({k: v.numpy() for k, v in feed.items()} if kwargs else [t.numpy() for t in feed])",
            "out = [torch.from_numpy(result[o].copy()) for o in compiled.outputs]",
        ])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import openvino as ov

        self.graph = model if onnx_file(model) is not None else None
        if self.graph is not None:  # an ONNX file: read as it is; inputs and outputs by the graph's names
            ov_model = ov.Core().read_model(str(onnx_file(model)))
        else:
            self.outputs = OutputSpec(model, example)
            self.keywords = list(example.kwargs)
            # save_model would store the weights in float16 unless told not to: a precision change of its own.
            folder = self.artifact("openvino", model, example, lambda folder: ov.save_model(
                self._convert(model, example), str(folder / "model.xml"), compress_to_fp16=False))
            ov_model = ov.Core().read_model(str(folder / "model.xml"))
        config = {"INFERENCE_PRECISION_HINT": PRECISION[self.spec.dtype]}
        config["INFERENCE_NUM_THREADS"] = runtime_threads(self.options.threads)
        self.compiled = ov.Core().compile_model(ov_model, "CPU", config)
        if self.graph is None and self.keywords:
            ports = {name for port in self.compiled.inputs for name in port.get_names()}
            unread = [k for k in self.keywords if k not in ports]
            if unread:
                log.warning("%s: the model never reads %s (its forward takes and ignores it): not fed to OpenVINO",
                            self.spec.id, ", ".join(unread))
            self.keywords = [k for k in self.keywords if k in ports]

    @staticmethod
    def _convert(model: torch.nn.Module, example: Inputs):
        import openvino as ov

        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convert_model traces with torch.jit, which warns of its deprecation
            # and what the trace says of this model is kept with the execution (execute/notes.py), as torchscript's
            warnings.simplefilter("always", torch.jit.TracerWarning)
            return ov.convert_model(model, example_input=example.kwargs or example.tensors())

    def run(self, inputs: Inputs):
        if self.graph is not None:
            result = self.compiled(self.graph.feed(inputs.args, inputs.kwargs))
            return self.graph.outputs_from([result[self.compiled.output(name)].copy() for name in self.graph.output_names])
        if self.keywords:  # keyword inputs go by name: their order in the file need not be the signature's
            feed = {name: inputs.kwargs[name].numpy() for name in self.keywords}
        else:
            feed = [t.numpy() for t in inputs.tensors()]
        result = self.compiled(feed)
        return self.outputs.rebuild([torch.from_numpy(result[out].copy()) for out in self.compiled.outputs], "OpenVINO")

    def close(self) -> None:
        self.compiled = None
        super().close()
