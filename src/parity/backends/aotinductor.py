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

from parity.backends.eager import call_lines, placement_lines
from parity.backends.export import ExportBackend, export_lines, export_program
from parity.inputs import Inputs

# Inductor imports torch.utils.cpp_extension, which warns "No CUDA runtime is found" on every CPU-only
# machine: noise in a report, not a finding (as compile.py).
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

CHECK_INPUTS = "AOTI_RUNTIME_CHECK_INPUTS"


class AotInductorBackend(ExportBackend):
    """The export backend's program (its options, the kinds of model it takes), compiled."""

    name = "aotinductor"
    dtypes = ("float32",)
    preparation_cost = 3  # a compilation

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
