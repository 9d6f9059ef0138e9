"""`source: onnx`: an `.onnx` file as the model. The model is the ONNX graph, not a torch module: parity
wraps it in an `OnnxFileModel` whose forward runs the graph in ONNX Runtime on the CPU, in float32, at ONNX
Runtime's default optimization level. So the default reference (`eager`) of an experiment on an ONNX file
*is* ONNX Runtime CPU float32; the backends that read ONNX graphs (onnxruntime with its own providers and
options, openvino, onnx2torch) take the file itself (`backends.base.onnx_file`), and the others are refused
when the experiment is checked.

Inputs go to the graph by its input names: a named synthetic input set (`synthetic: {x: ...}`) names them,
positional tensors fill them in the graph's order. Outputs come back as a dict by the graph's output names,
from every backend alike, so leaves are named `out['logits']`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from parity.errors import ParityError
from parity.files import file_problem
from parity.inputs.tensors import TensorFileError, describe
from parity.models.onnx_graph import OnnxFileModel, read_graph
from parity.models.sources import Source, file_digest, model_file_problem
from parity.models.sources.saved import FileSpecBase

if TYPE_CHECKING:
    from parity.models.onnx_graph import GraphValue


class OnnxSpec(FileSpecBase):
    source: Literal["onnx"]


def _tensors(synthetic) -> list[tuple[str | None, Any]]:
    """(name or None, Synthetic) for each tensor of an input set's synthetic spec."""
    if isinstance(synthetic, dict):
        return list(synthetic.items())
    return [(None, s) for s in (synthetic if isinstance(synthetic, list) else [synthetic])]


def fit_problem(inputs: list[GraphValue], input_set, experiment) -> str | None:
    """Why the tensors of `input_set` do not fit the graph's inputs (names, count, rank, sizes, dtype)."""
    graph = f"the ONNX graph's inputs are {'; '.join(map(str, inputs)) or 'none'}"
    if input_set.tensors is not None:  # saved tensors: their names, dtypes and shapes as the file holds them
        from types import SimpleNamespace

        try:
            given = [(name, SimpleNamespace(dtype=dtype, shape=shape))
                     for name, dtype, shape in describe(experiment.resolve(input_set.tensors))]
        except TensorFileError:
            return None  # the file itself is refused by experiment/validate.py
    elif input_set.synthetic is None:  # images: one float32 batch (or list)
        return None if len(inputs) == 1 else f"input set '{input_set.name}' gives one image batch; {graph}"
    else:
        given = _tensors(input_set.synthetic)
    names = [n for n, _ in given]
    if names[0] is not None and sorted(names) != sorted(i.name for i in inputs):
        return f"input set '{input_set.name}' names {', '.join(names)}; {graph}"
    if len(given) != len(inputs):
        return f"input set '{input_set.name}' gives {len(given)} tensor(s); {graph}"
    by_name = {i.name: i for i in inputs}
    for i, (name, spec) in enumerate(given):
        value = by_name[name] if name is not None else inputs[i]
        dims = value.dims
        wrong_dims = dims is not None and (len(dims) != len(spec.shape) or any(
            d is not None and d != s for d, s in zip(dims, spec.shape, strict=True)))
        if wrong_dims or spec.dtype != value.dtype:
            return (f"input set '{input_set.name}': {value.name} is {spec.dtype}{list(spec.shape)}; {graph}")
    return None


def external_data_problem(path: Path, location: str) -> str | None:
    """Why the external data file `location` that the graph `path` names may not be read, or None: it must lie
    in the graph's own folder (below it), and be a regular file (a FIFO would block every loader)."""
    folder = path.parent.resolve()
    target = (folder / location).resolve()
    if not target.is_relative_to(folder):
        return (f"{path} names external data {location!r}, which lies outside the model's folder {folder}; "
                "parity reads a graph's weights from its own folder only")
    return file_problem(target, f"{path}: its external data file")


class OnnxSource(Source):
    name = "onnx"
    names_code = False
    Spec = OnnxSpec
    kind = "onnx"
    libraries = ("onnx", "onnxruntime")

    def build(self, spec, experiment):
        path = experiment.resolve(spec.path)
        inputs, outputs, _ = self._graph(spec, path)
        return OnnxFileModel(path, inputs, outputs)

    def _graph(self, spec, path: Path) -> tuple[list[GraphValue], list[str], bool]:
        problem = model_file_problem(path, (".onnx",), "ONNX")
        if problem:
            raise ParityError(f"model '{spec.name}': {problem}")
        try:
            graph = read_graph(path)
        except Exception as exc:  # not a protobuf, or not an ONNX model
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ParityError(f"model '{spec.name}': {path} is not an ONNX model the onnx package can read "
                              f"({type(exc).__name__}: {first})") from exc
        problem = next(filter(None, (external_data_problem(path, location) for location in graph[2])), None)
        if problem:  # every backend's to refuse alike (ONNX Runtime's and OpenVINO's loaders differ): here, first
            raise ParityError(f"model '{spec.name}': {problem}")
        return graph

    def files_digest(self, spec, experiment):
        """The .onnx file's bytes; None (never cached) when its weights are in external data files."""
        path = experiment.resolve(spec.path)
        return None if read_graph(path)[2] else file_digest(path)

    def problems(self, spec, experiment):
        try:
            inputs, _, _ = self._graph(spec, experiment.resolve(spec.path))
        except ParityError as exc:
            return [(("path",), exc.problems[0].removeprefix(f"model '{spec.name}': "))]
        own = [s for s in experiment.inputs if spec.inputs is None or s.name in spec.inputs]  # unknown names: checks.py
        fits = [fit_problem(inputs, s, experiment) for s in own]
        return [(("inputs",), p) for p in fits if p]


SOURCE = OnnxSource()
