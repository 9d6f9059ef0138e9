"""AOTInductor: the exported program compiled ahead of time into a package
(`torch._inductor.aoti_compile_and_package`) and run through its loader (`aoti_load_package`), as a server
that deploys compiled models runs it. The package is kept in the artifact cache.

A compiled package does not check its inputs' shapes unless `AOTI_RUNTIME_CHECK_INPUTS` is set when it first
runs: an input of another shape would then be read as if it had the example's, and its outputs compared as
if they were right. The variable is set before any package is loaded, so that such an input raises (and its
check is `shape_specialized`).
"""

from __future__ import annotations

import logging
import os

import torch

from parity.backends.eager import EagerBackend, call_lines, placement_lines
from parity.backends.export import ExportOptions, export_lines, export_program
from parity.inputs import Inputs

# Inductor imports torch.utils.cpp_extension, which warns "No CUDA runtime is found" on every CPU-only
# machine: noise in a report, not a finding (as compile.py).
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

CHECK_INPUTS = "AOTI_RUNTIME_CHECK_INPUTS"


class AotInductorBackend(EagerBackend):
    name = "aotinductor"
    dtypes = ("float32",)
    specializes_on_example = True  # compiled for the example's shapes, unless dynamic
    preparation_cost = 3  # a compilation
    runs_module_hooks = False  # compiled code: the modules' Python forward never runs
    legacy_devices = ()  # not eager's: an experiment in the published format names no AOTInductor
    # Not eager's (main's Backend.model_kinds, #15 model files): torch.export refuses a ScriptModule, and an
    # ONNX file's model has no Python forward to export.
    model_kinds = ("module", "exported")
    Options = ExportOptions

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        return "\n".join([
            "import os",
            "import torch._inductor",
            f'os.environ["{CHECK_INPUTS}"] = "1"  # the package checks its inputs\' shapes',
            *placement_lines(cls, spec),
            *export_lines(),
            'package = torch._inductor.aoti_compile_and_package(exported, package_path=str(HERE / "module.pt2"))',
            "compiled = torch._inductor.aoti_load_package(package)",
            *call_lines("compiled"),
        ])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        import torch._inductor

        model = model.to(self.device, self.dtype)
        example = self.convert(example)
        folder = self.artifact("aotinductor", model, example, lambda folder: torch._inductor.aoti_compile_and_package(
            export_program(model, example, self.options), package_path=str(folder / "model.pt2")))
        os.environ[CHECK_INPUTS] = "1"
        index = self.device.index if self.device.index is not None else -1  # -1: the current CUDA device
        self.model = torch._inductor.aoti_load_package(str(folder / "model.pt2"), device_index=index)
