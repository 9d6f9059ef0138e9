"""Selective fallback: run a few modules outside the target's fast path to restore agreement.

- `compile` targets: the modules run eager (wrapped in a `torch.compiler.disable`d call, their hooks
  included), so inductor neither fuses nor reorders their arithmetic.
- reduced-precision targets (eager, compile or torchscript in bfloat16 or float16): the modules compute
  in float32 (inputs cast up, outputs cast back), the rest stays in the reduced dtype.
- quantized targets (`quantize:`): the modules are left out of quantization and compute in float
  (backends/quantize.py's `keep_float`), the rest in int8.

This module is the model transform only (`apply_fallback`, for a target's `fallback:` and for each trial of
the search); which modules to choose is found by the runner's fallback search (runner/search.py).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from parity.backends import fallback_kind
from parity.backends.quantize import keep_float
from parity.config.schema import BackendSpec
from parity.errors import ParityError, did_you_mean
from parity.outputs import map_tensors


class Float32Island(torch.nn.Module):
    """Runs a module in float32 inside a reduced-precision model. The float32 copy is kept outside the
    module tree, so the backend's `.to(bfloat16)` of the whole model cannot reach it."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "island", copy.deepcopy(module).float())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        first = next((t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
        if first is not None and next(self.island.parameters(), first).device != first.device:
            object.__setattr__(self, "island", self.island.to(first.device))
        up = lambda t: t.float() if t.is_floating_point() else t  # noqa: E731
        out = self.island(*map_tensors(args, up), **map_tensors(kwargs, up))
        return map_tensors(out, lambda t: t.to(dtype) if t.is_floating_point() else t)


class EagerIsland(torch.nn.Module):
    """Runs a module, hooks included, outside torch.compile: dynamo breaks the graph around it."""

    def __init__(self, module: torch.nn.Module):
        global _call_outside_compile
        super().__init__()
        self.inner = module
        if _call_outside_compile is None:  # made here, not on import: torch.compiler.disable imports dynamo (~2 s)
            _call_outside_compile = torch.compiler.disable(_call)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _call_outside_compile(self.inner, *args, **kwargs)


def _call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


_call_outside_compile = None


def fallback_for(spec: BackendSpec, model_name: str) -> list[str]:
    """The modules of `model_name` a target runs outside its fast path: entries `model:module` apply to
    that model only, plain `module` entries to every model the target runs."""
    out = []
    for entry in spec.fallback:
        owner, sep, module = entry.rpartition(":")
        if not sep or owner == model_name:
            out.append(module)
    return out


def apply_fallback(model: torch.nn.Module, names: list[str], spec: BackendSpec) -> torch.nn.Module:
    """A copy of `model` with `names` run outside the target's fast path."""
    kind = fallback_kind(spec)
    model = copy.deepcopy(model)
    known = {n for n, _ in model.named_modules()}
    for name in names:
        if name not in known:
            raise ParityError(f"fallback: the model has no module '{name}'{did_you_mean(name, known)}")
        if kind == "float":  # left out of quantization (backends/quantize.py)
            keep_float(model.get_submodule(name))
            continue
        owner, _, attr = name.rpartition(".")
        parent = model.get_submodule(owner) if owner else model
        island = EagerIsland if kind == "eager" else Float32Island
        setattr(parent, attr, island(getattr(parent, attr)))
    return model
