"""Dynamic dims for the backends that export with torch.export (onnxruntime, export, aotinductor): the two
options that ask for them, and the dims `dynamic: true` means."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, model_validator

from parity.inputs import Inputs


class DynamicShapeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Without either, the export keeps the shapes of the example it is made from.
    dynamic: bool = False  # dynamic batch (dim 0) and spatial dims (2+): one export for every input set
    dynamic_shapes: dict[str, Any] | list[Any] | None = None  # torch.export's, as given: {x: {0: batch}}

    @model_validator(mode="after")
    def _one_way(self) -> DynamicShapeOptions:
        if self.dynamic and self.dynamic_shapes is not None:
            raise ValueError("give 'dynamic: true' or 'dynamic_shapes', not both")
        return self

    def shapes_for(self, model: torch.nn.Module, example: Inputs) -> Any:
        """The `dynamic_shapes` to export `model` with: as given, the dims `dynamic` means, or None (static)."""
        if self.dynamic_shapes is not None:
            return self.dynamic_shapes
        return dynamic_dims(model, example) if self.dynamic else None


def dynamic_dims(model: torch.nn.Module, example: Inputs) -> dict[str, Any]:
    """`dynamic_shapes` for torch.export that make the batch dim (0) and the spatial dims (2 and after, in a
    tensor of rank 3 or more) of every tensor input dynamic, by the forward's parameter names. Dim.AUTO:
    a dim the model itself fixes (`x.view(2, -1)`) stays static rather than failing the export, and a
    run with another size then fails as `shape_specialized`."""
    from torch.export import Dim
    from torch.utils._pytree import tree_map

    def dims(value: Any) -> dict[int, Any] | None:
        if not isinstance(value, torch.Tensor):
            return None
        return {d: Dim.AUTO for d in range(value.dim()) if d == 0 or d >= 2} or None

    bound = inspect.signature(model.forward).bind(*example.args, **example.kwargs)
    return {name: tree_map(dims, value) for name, value in bound.arguments.items()}
