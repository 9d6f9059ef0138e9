"""TorchScript by tracing (`torch.jit.trace`), optionally frozen."""

from __future__ import annotations

import warnings

import torch
from pydantic import BaseModel, ConfigDict

from parity.backends.base import OutputSpec
from parity.backends.eager import EagerBackend, placement_lines
from parity.inputs import Inputs


class TorchScriptOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    freeze: bool = False


class TorchScriptBackend(EagerBackend):
    name = "torchscript"
    specializes_on_example = True  # a graph made for the example's shapes
    preparation_cost = 1  # a trace
    Options = TorchScriptOptions
    runs_module_hooks = False  # a traced graph no longer calls the modules' Python hooks
    legacy_devices = ("cpu",)
    model_kinds = ("module", "exported", "torchscript")  # a ScriptModule is traced as it runs
    decode = None  # not CachedDecoding: the graph is traced without the KV cache (eager's decode runs the module)

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        """Traced as `prepare` traces: keyword inputs beside positional ones are bound as constants."""
        freeze = cls.options_of(spec).freeze
        return "\n".join([
            *placement_lines(cls, spec),
            "class Bound(torch.nn.Module):  # trace takes positional or keyword inputs: the keywords are fixed",
            "    def __init__(self, module, kwargs):",
            "        super().__init__()",
            "        self.module, self.kwargs = module, kwargs",
            "    def forward(self, *args):",
            "        return self.module(*args, **self.kwargs)",
            "if args and kwargs:",
            "    module, kwargs = Bound(module, kwargs), {}",
            "with torch.no_grad():",
            "    traced = torch.jit.trace(module, tuple(args), strict=False, check_trace=False) if args else "
            "torch.jit.trace(module, example_kwarg_inputs=kwargs, strict=False, check_trace=False)",
            *(["traced = torch.jit.freeze(traced.eval())"] if freeze else []),
            "with torch.inference_mode():",
            "    out = traced(*args, **kwargs)",
        ])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        model = model.to(self.device, self.dtype)
        example = original = self.convert(example)
        if example.kwargs and example.args:  # trace takes one or the other: bind the keywords
            model = _KeywordsBound(model, example.kwargs)
            example = Inputs(example.args, {})
        folder = self.artifact("torchscript", model, original,
                               lambda folder: torch.jit.save(self._trace(model, example), str(folder / "model.pt")))
        traced = torch.jit.load(str(folder / "model.pt"), map_location=self.device)
        self.model = traced
        self.outputs = OutputSpec(model, example)

    def _trace(self, model: torch.nn.Module, example: Inputs) -> torch.jit.ScriptModule:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the API's deprecation notices; not what the trace says of this model
            warnings.simplefilter("always", torch.jit.TracerWarning)  # kept with the execution (execute/notes.py)
            if example.kwargs:
                traced = torch.jit.trace(model, example_kwarg_inputs=example.kwargs, strict=False, check_trace=False)
            else:
                traced = torch.jit.trace(model, example.args, strict=False, check_trace=False)
            return torch.jit.freeze(traced.eval()) if self.options.freeze else traced

    def run(self, inputs: Inputs):
        """Tracing turns namedtuples into tuples; the eager structure is rebuilt around the tensors."""
        from torch.utils._pytree import tree_leaves

        if inputs.args and inputs.kwargs:  # the keywords were bound at trace time (tensors as constants)
            inputs = Inputs(inputs.args, {})
        out = self.call(self.model, inputs)
        return self.outputs.rebuild([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], "the traced module")


class _KeywordsBound(torch.nn.Module):
    """`model(*args, **kwargs)` with the keyword arguments fixed, for a tracer that takes positional
    arguments only (MultiheadAttention called with need_weights=False, say). Keyword tensors become
    constants of the trace."""

    def __init__(self, model: torch.nn.Module, kwargs: dict):
        super().__init__()
        self.model = model
        self.kwargs = kwargs

    def forward(self, *args):
        return self.model(*args, **self.kwargs)
