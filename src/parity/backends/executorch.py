"""ExecuTorch on the CPU, the runtime of mobile deployments: the exported program lowered to an ExecuTorch
program (`to_edge_transform_and_lower`, with the XNNPACK delegate unless `delegate: none` asks for the portable
kernels only), saved as a `.pte` file in the artifact cache and run through ExecuTorch's Python runtime.

The program takes the flattened input tensors and returns the flattened output tensors; the model's structure
is rebuilt around them (base.OutputSpec). The runtime's C++ logging (cpuinfo's "Failed to open midr file" when
it first loads a method, a shape it refuses) would reach the console: it is caught while the runtime loads and
runs, and the lines of a failed run are added to its error.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from parity.backends.base import Backend, OutputSpec, not_installed
from parity.backends.export import ExportOptions, export_lines, export_program
from parity.backends.quantize import quantize
from parity.inputs import Inputs
from parity.offline import quiet_library_imports

# An ExecuTorch log line: "[method.cpp:1243] Error resizing tensor at input 0".
RUNTIME_LINE = re.compile(r"^\[[\w.]+\.(cpp|h):\d+\] ")


class ExecuTorchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delegate: Literal["xnnpack", "none"] = "xnnpack"  # none: ExecuTorch's portable kernels only


def lower(exported: torch.export.ExportedProgram, delegate: str):
    """An ExecuTorch program (its `.buffer` is the `.pte` file) from an exported program: what a quantized
    program (PT2E, exported after conversion) is lowered with too."""
    with quiet_library_imports():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

    partitioners = [XnnpackPartitioner()] if delegate == "xnnpack" else []
    return to_edge_transform_and_lower(exported, partitioner=partitioners).to_executorch()


class ExecuTorchBackend(Backend):
    name = "executorch"
    devices = ("cpu",)
    dtypes = ("float32",)
    specializes_on_example = True  # a program made (and its memory planned) for the example's shapes
    preparation_cost = 3  # an export and a lowering
    libraries = ("torch", "executorch")
    Options = ExecuTorchOptions
    # int8 as ExecuTorch deploys it: PT2E with the XNNPACK quantizer, the converted graph exported again and
    # lowered to the XNNPACK delegate, which runs the quantized patterns as int8 kernels. Weight-only int8 as a
    # language model is deployed: torchao's linears (their weights dequantized in the graph), exported and lowered
    # with the delegate asked for. Not int4 weight-only: the portable kernels have no torchao::dequantize_affine
    # for its groups (the lowering raises), and XNNPACK's lowering of it computed wrong logits (docs/backends.md).
    quantize_schemes = ("pt2e-xnnpack", "torchao-int8-weight")

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        if (spec.quantize and spec.quantize.scheme == "pt2e-xnnpack"
                and cls.options_of(spec).delegate != "xnnpack"):
            return "quantize pt2e-xnnpack: ExecuTorch runs int8 through its XNNPACK delegate (leave 'delegate' at xnnpack)"
        return None

    @classmethod
    def available(cls, spec) -> str | None:
        return not_installed("executorch", "'parity[executorch]'")

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        """Exported, lowered and run as parity does, with ExecuTorch's Python runtime."""
        delegate = cls.options_of(spec).delegate
        partitioners = "[XnnpackPartitioner()]" if delegate == "xnnpack" else "[]"
        return "\n".join([
            "from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner",
            "from executorch.exir import to_edge_transform_and_lower",
            "from executorch.runtime import Runtime",
            'module, args, kwargs = module.to(torch.float32), cast(args, "cpu", torch.float32), '
            'cast(kwargs, "cpu", torch.float32)',
            *export_lines(),
            f"program = to_edge_transform_and_lower(exported, partitioner={partitioners}).to_executorch()",
            'method = Runtime.get().load_program(program.buffer).load_method("forward")',
            "feed = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]",
            "out = method.execute(feed)",
        ])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        with quiet_library_imports():
            from executorch.runtime import Runtime

        model, example = model.to(self.dtype), example.to("cpu", self.dtype)
        self.outputs = OutputSpec(model, example)
        folder = self.artifact("executorch", model, example, lambda folder: (folder / "model.pte").write_bytes(
            lower(self._program(model, example), self.options.delegate).buffer))
        self._log = tempfile.TemporaryFile()
        with self._runtime_log():
            self.program = Runtime.get().load_program(folder / "model.pte")
            self.method = self.program.load_method("forward")

    def _program(self, model: torch.nn.Module, example: Inputs) -> torch.export.ExportedProgram:
        """The exported program to lower: the model's; for a pt2e-xnnpack target its PT2E-quantized graph exported
        again (what ExecuTorch's XNNPACK flow lowers); for a weight-only target torchao's quantized model."""
        if self.spec.quantize is None:
            return export_program(model, example, ExportOptions())
        with torch.no_grad():
            quantized = quantize(model.eval(), self.spec.quantize.scheme, example, self.calibration or [])
        return torch.export.export(quantized, tuple(example.args), example.kwargs or None)

    def run(self, inputs: Inputs):
        """The runtime's Python bindings return copies of the outputs, not views of the memory it plans for them
        (which the next run writes into): tests/backends/test_reach_backends.py checks that they outlive the next run."""
        with self._runtime_log():
            outputs = self.method.execute(inputs.to("cpu", self.dtype).tensors())
        return self.outputs.rebuild(list(outputs), "the ExecuTorch program")

    @contextlib.contextmanager
    def _runtime_log(self):
        """What the runtime logs while it works, caught: its pybindings write C++ log lines to Python's
        `sys.stderr`, and C++ code may write to the process's file descriptor 2; both are sent to this backend's
        log. The runtime's lines are added to the error when it raises, and otherwise dropped; other lines
        (another thread's) go back to stderr."""
        sys.stderr.flush()
        saved, said = os.dup(2), io.StringIO()
        self._log.seek(0)
        self._log.truncate()
        os.dup2(self._log.fileno(), 2)
        try:
            with contextlib.redirect_stderr(said):
                yield
        except Exception as exc:
            lines = self._logged(said)[0]
            if not lines:
                raise
            raise RuntimeError(f"{'; '.join(lines)} ({exc})") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sys.stderr.write("".join(f"{line}\n" for line in self._logged(said)[1]))

    def _logged(self, said: io.StringIO) -> tuple[list[str], list[str]]:
        """The runtime's lines and the others, from the log file and from what Python's stderr was given."""
        self._log.seek(0)
        text = self._log.read().decode(errors="replace") + said.getvalue()
        lines = [line for line in text.splitlines() if line]
        return [x for x in lines if RUNTIME_LINE.match(x)], [x for x in lines if not RUNTIME_LINE.match(x)]

    def close(self) -> None:
        self.method = self.program = None
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None
        super().close()
