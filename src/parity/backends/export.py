"""torch.export, then the exported program's module run eagerly (`ExportedProgram.module()`).

The graph that torch.export captures is what AOTInductor compiles and ExecuTorch lowers; running it as it is,
with eager kernels, separates what the export changes (a branch taken for the example, a constant baked in,
a decomposition) from what a compiler or a runtime changes after it. The exported program is kept in the
artifact cache (`torch.export.save`).
"""

from __future__ import annotations

import torch

from parity.backends.base import MODULE_KINDS
from parity.backends.eager import EagerBackend, call_lines, placement_lines
from parity.backends.shapes import DynamicShapeOptions
from parity.inputs import Inputs
from parity.models.sources.saved import load_exported


class ExportOptions(DynamicShapeOptions):
    """Dynamic dims, as onnxruntime takes them: without either option the program keeps the example's shapes."""


def export_program(model: torch.nn.Module, example: Inputs, options: ExportOptions) -> torch.export.ExportedProgram:
    """`model` exported for inputs like `example`, with the dynamic dims `options` ask for."""
    return torch.export.export(model, tuple(example.args), example.kwargs or None,
                               dynamic_shapes=options.shapes_for(model, example))


def export_lines() -> list[str]:
    """Repro lines that export `module` for the captured inputs' shapes. A reduced module is a submodule of the
    model, whose inputs the model's `dynamic_shapes` do not name: its numbers are those of a static export."""
    return ["exported = torch.export.export(module, tuple(args), kwargs or None)"]


class ExportBackend(EagerBackend):
    name = "export"
    specializes_on_example = True  # a program made for the example's shapes, unless dynamic
    preparation_cost = 2  # an export
    runs_module_hooks = False  # the program's graph no longer calls the modules' Python forward or hooks
    legacy_devices = ()  # not eager's: an experiment in the published format names no export
    model_kinds = MODULE_KINDS  # not eager's: torch.export refuses a ScriptModule; an ONNX file has no Python forward
    Options = ExportOptions
    decode = None  # not CachedDecoding: the program is captured without the KV cache (eager's decode runs the module)

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        return "\n".join([*placement_lines(cls, spec), *export_lines(), *call_lines("exported.module()")])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        model = model.to(self.device, self.dtype)
        example = self.convert(example)
        folder = self.artifact("export", model, example, lambda folder: torch.export.save(
            export_program(model, example, self.options), str(folder / "model.pt2")))
        self.model = load_exported(folder / "model.pt2").module()  # from the cache too: data, never code
