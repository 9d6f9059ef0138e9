"""Int8 quantization of a float model, for a target's `quantize:` (config/schema.py `QuantizeSpec`; each scheme's
facts: dtypes.py `QUANTIZE_SCHEMES`).

- `pt2e-x86`, `pt2e-xnnpack`: `torch.export`, then torchao's PT2E flow (`prepare_pt2e`, one run per calibration
  input, `convert_pt2e`) with the X86 Inductor quantizer or ExecuTorch's XNNPACK quantizer: weights and
  activations in int8, activation ranges observed on the calibration inputs. The result is a GraphModule of
  quantize/dequantize and float ops (eager runs it as it is; inductor lowers the patterns to int8 kernels).
  Module names survive only as `nn_module_stack` metadata on the graph's nodes.
- `torchao-int8-dynamic`, `torchao-int8-weight`: torchao's `quantize_` on the module tree, in place (linear
  layers: int8 weights; dynamic: activations too, their scale computed per call). Modules are kept.
- `torchao-int4-weight`: the same with int4 weights in groups of 32 along the input features (torchao's
  `IntxWeightOnlyConfig`, the CPU and ExecuTorch form: its `Int4WeightOnlyConfig` kernels need CUDA or mslk),
  as language models are deployed; activations stay float. A linear layer whose input features are no multiple
  of the group (`Linear(16, ...)`) stays float, and a warning (the execution's note) names it.

A module marked with `keep_float` (what `parity fallback` keeps in float) is left out of quantization: PT2E
annotates none of its ops (X86: `set_module_name_qconfig(name, None)`; XNNPACK, whose `set_module_name` refuses
None: a filter function that declines the module's nodes), `quantize_` skips it. `quantize_pt2e` takes an ExportedProgram or a GraphModule, so a
backend that exports for itself (ExecuTorch) can quantize its own program.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from parity.dtypes import QUANTIZE_SCHEMES
from parity.inputs import Inputs
from parity.offline import quiet_library_imports

KEEP_FLOAT = "_parity_keep_float"
INT4_GROUP = 32  # input features sharing one int4 scale


def keep_float(module: torch.nn.Module) -> None:
    """Mark `module` (and so everything inside it) to stay in float when the model is quantized."""
    object.__setattr__(module, KEEP_FLOAT, True)


def float_modules(model: torch.nn.Module) -> list[str]:
    """The names of the modules of `model` marked `keep_float`."""
    return [name for name, m in model.named_modules() if getattr(m, KEEP_FLOAT, False)]


def scheme_problem(scheme: str) -> str | None:
    """None when the libraries `scheme` needs are installed here, else why it cannot run (found without importing
    them: torchao takes seconds to import)."""
    import importlib.util

    missing = [name for name in QUANTIZE_SCHEMES[scheme].libraries if importlib.util.find_spec(name) is None]
    if missing:
        return f"quantize scheme {scheme} needs {' and '.join(missing)}, which is not installed here"
    return None


def quantize(model: torch.nn.Module, scheme: str, example: Inputs, calibration: list[Inputs] | None,
             note: Callable[[str], None] | None = None) -> torch.nn.Module:
    """`model` (float32, eval mode) quantized by `scheme`; the PT2E schemes export it for inputs like `example`
    and observe `calibration` (each an Inputs the model is called with). `note`: told what stayed float and why
    (the backend keeps it with the execution; without it, a warning)."""
    keep = float_modules(model)
    if QUANTIZE_SCHEMES[scheme].calibrated:  # the PT2E flow
        if not calibration:
            raise ValueError(f"quantize scheme {scheme} needs calibration inputs")
        same = all(_shapes(c) == _shapes(example) for c in calibration)  # a static export is twice as quick
        # strict (dynamo) export: it records which module call each op came from (`source_fn_stack`), which the
        # quantizers group ops by; non-strict export leaves that out, and a module called twice (torchvision's
        # shared ReLU) then makes one partition with two outputs, which the X86 quantizer refuses.
        program = torch.export.export(model, tuple(example.args), dict(example.kwargs),
                                      dynamic_shapes=None if same else _any_shape(model, example), strict=True)
        return quantize_pt2e(program, scheme, calibration, keep)
    with quiet_library_imports():
        from torchao.quantization import (
            Int8DynamicActivationInt8WeightConfig,
            Int8WeightOnlyConfig,
            IntxWeightOnlyConfig,
            quantize_,
        )
        from torchao.quantization.granularity import PerGroup

    config = {"torchao-int8-dynamic": Int8DynamicActivationInt8WeightConfig, "torchao-int8-weight": Int8WeightOnlyConfig,
              "torchao-int4-weight": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(INT4_GROUP)),
              }[scheme]()
    ungrouped = _ungrouped(model, keep) if scheme == "torchao-int4-weight" else []
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not _inside(n, keep)]
    if ungrouped and len(ungrouped) == len(linear):  # an int4 id on a float model would be a false verdict
        raise ValueError(f"int4 weight-only quantizes linear layers in groups of {INT4_GROUP} input features, and none "
                         f"of this model's {len(linear)} has a multiple of {INT4_GROUP}: nothing would be int4")
    if ungrouped:  # torchao would raise an AssertionError on them; they stay float, and the note says so
        said = (f"int4 weight-only: {len(ungrouped)} linear layer(s) kept in float, their input features not a "
                f"multiple of the group size {INT4_GROUP}: {', '.join(ungrouped[:8])}" + (", ..." if len(ungrouped) > 8 else ""))
        if note is not None:
            note(said)
        else:
            warnings.warn(said, UserWarning, stacklevel=2)
    quantize_(model, config, filter_fn=lambda module, fqn: isinstance(module, torch.nn.Linear)
              and not _inside(fqn, keep) and fqn not in ungrouped)
    return model


def _ungrouped(model: torch.nn.Module, keep: list[str]) -> list[str]:
    """The linear layers whose input features do not split into int4 groups (`Linear(16, ...)`): torchao's
    grouping needs a multiple of the group size."""
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not _inside(name, keep)
            and m.in_features % INT4_GROUP]


def quantize_pt2e(program: Any, scheme: str, calibration: list[Inputs], keep: list[str] = ()) -> torch.fx.GraphModule:
    """An ExportedProgram (or the GraphModule of one) quantized by a PT2E `scheme`, its activation ranges observed
    on `calibration`; the modules named in `keep` are not quantized."""
    with quiet_library_imports():
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph = program.module() if isinstance(program, torch.export.ExportedProgram) else program
    quantizer = _quantizer(scheme)
    if scheme == "pt2e-x86":
        for name in keep:
            quantizer.set_module_name_qconfig(name, None)
    elif keep:  # XNNPACKQuantizer.set_module_name refuses None ("not supported yet"): filter the nodes out instead
        from torchao.quantization.pt2e.quantizer import get_module_name_filter

        inside = [get_module_name_filter(name) for name in keep]
        quantizer.set_filter_function(lambda node: not any(f(node) for f in inside))
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs.args, **inputs.kwargs)
    return convert_pt2e(prepared)


def _quantizer(scheme: str):
    if scheme == "pt2e-x86":
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

        return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


def _shapes(inputs: Inputs) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in inputs.tensors()]


def _any_shape(model: torch.nn.Module, example: Inputs) -> dict[str, Any]:
    """Every dimension of every input tensor free to change where the model allows it (export specializes the
    others), for a calibration set of other shapes (another batch size) than the example's."""
    import inspect

    from torch.export import Dim
    from torch.utils._pytree import tree_map

    def dims(value: Any) -> Any:
        return {i: Dim.AUTO for i in range(value.dim())} if isinstance(value, torch.Tensor) else None

    bound = inspect.signature(model.forward).bind(*example.args, **example.kwargs)
    return {name: tree_map(dims, value, is_leaf=lambda v: isinstance(v, torch.Tensor))
            for name, value in bound.arguments.items()}


def _inside(fqn: str, names: list[str]) -> bool:
    return any(fqn == n or fqn.startswith(n + ".") for n in names)
