"""An ONNX graph file as a torch module (`OnnxFileModel`), what `source: onnx` builds; and what the graph
says of its inputs and outputs, read without its weights. Apart from the source's module
(models/sources/onnx_file.py), which declares the spec and checks the file against the input sets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class GraphValue:
    """One input of the graph: its name, element type (a torch dtype name) and dims (None: any size)."""

    name: str
    dtype: str
    dims: tuple[int | None, ...] | None  # None: the graph does not say its rank

    def __str__(self) -> str:
        dims = "?" if self.dims is None else ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name}: {self.dtype}[{dims}]"


# ONNX element types (onnx.TensorProto) by the torch dtype names synthetic inputs use.
_ELEMENT_TYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16", 6: "int32", 7: "int64", 9: "bool"}


def _value(info) -> GraphValue:
    tensor = info.type.tensor_type
    dtype = _ELEMENT_TYPES.get(tensor.elem_type, f"onnx element type {tensor.elem_type}")
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                 for d in tensor.shape.dim) if tensor.HasField("shape") else None
    return GraphValue(info.name, dtype, dims)


def read_graph(path: Path) -> tuple[list[GraphValue], list[str], list[str]]:
    """The graph's inputs (initializers listed as inputs by older exporters left out), its output names, and
    the external data files its tensors name (`location`, relative to the file's folder as written; read
    without loading them; [] when the weights are in the file)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    initialized = {i.name for i in proto.graph.initializer}
    inputs = [_value(i) for i in proto.graph.input if i.name not in initialized]
    external = sorted({entry.value for tensor in _tensors(proto.graph) if tensor.data_location == onnx.TensorProto.EXTERNAL
                       for entry in tensor.external_data if entry.key == "location"})
    return inputs, [o.name for o in proto.graph.output], external


def _tensors(graph) -> list:
    """Every tensor a graph holds: its initializers, and its nodes' tensor attributes and subgraphs' (If, Loop)."""
    found = list(graph.initializer) + [s.values for s in graph.sparse_initializer]
    for node in graph.node:
        for attribute in node.attribute:
            found += [attribute.t, *attribute.tensors] if attribute.HasField("t") else list(attribute.tensors)
            for sub in [*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs]:
                found += _tensors(sub)
    return found


class OnnxFileModel(torch.nn.Module):
    """An ONNX graph file as a module: `forward(*tensors, **named)` runs it in ONNX Runtime's
    CPUExecutionProvider, float32, default optimization level, with as many threads as torch uses, and returns
    {output name: tensor}. It has no parameters: `.to(...)` changes nothing, and the backends that could run it
    otherwise are refused at validation. The session is made on first use and never copied (each backend's
    copy of the model makes its own)."""

    def __init__(self, path: Path, inputs: list[GraphValue], output_names: list[str]):
        super().__init__()
        self.onnx_file = path
        self.graph_inputs = inputs
        self.output_names = output_names
        self._session = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_session": None}

    def extra_repr(self) -> str:
        return f"{self.onnx_file}, inputs=[{', '.join(map(str, self.graph_inputs))}], outputs={self.output_names}"

    def ordered(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        """The tensors in the graph's input order: positional ones first, then the rest by name."""
        names = [i.name for i in self.graph_inputs]
        if len(args) > len(names):
            raise RuntimeError(f"the ONNX graph takes {len(names)} inputs ({', '.join(names)}), got {len(args)} positional")
        given = dict(zip(names, args, strict=False))  # the first len(args) names
        wrong = sorted(n for n in kwargs if n not in names or n in given)  # unknown, or given positionally too
        given.update(kwargs)
        missing = [n for n in names if n not in given]
        if wrong or missing:
            raise RuntimeError(f"the ONNX graph's inputs are {', '.join(names)}; "
                               + (f"unknown or repeated: {', '.join(wrong)}" if wrong else f"missing: {', '.join(missing)}"))
        return [given[n] for n in names]

    def feed(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The inputs as ONNX Runtime and OpenVINO take them: numpy arrays by input name."""
        names = [i.name for i in self.graph_inputs]
        return {n: t.detach().to("cpu").contiguous().numpy() for n, t in zip(names, self.ordered(args, kwargs), strict=True)}

    def outputs_from(self, values: list) -> dict[str, torch.Tensor]:
        """The graph's outputs (arrays or tensors, in its order) by name."""
        if len(values) != len(self.output_names):
            raise RuntimeError(f"the ONNX graph has {len(self.output_names)} outputs, got {len(values)}")
        return {n: v if isinstance(v, torch.Tensor) else torch.from_numpy(v)
                for n, v in zip(self.output_names, values, strict=True)}

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._session is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = torch.get_num_threads()
            self._session = ort.InferenceSession(str(self.onnx_file), options, providers=["CPUExecutionProvider"])
        return self.outputs_from(self._session.run(None, self.feed(args, kwargs)))
