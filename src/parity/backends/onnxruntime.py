"""ONNX Runtime on a model exported with torch.onnx (the dynamo exporter, or the TorchScript exporter when
`exporter: torchscript`), or on an ONNX graph file itself (`source: onnx`: no export; the session is made from
the file with this target's providers and options).

The exported graph takes the flattened input tensors and returns the flattened output tensors; the
model's output structure (tuples, dicts, lists of dicts, from one eager run of this backend's own copy)
is rebuilt around them, so that ONNX outputs are compared leaf by leaf with the same names as every
other backend's. Non-tensor outputs (None) are not in the graph and come from that run.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import io
import json
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

from parity.backends.base import (
    MAX_THREADS,
    Backend,
    OutputSpec,
    cuda_reason,
    not_installed,
    onnx_file,
    release_memory,
    runtime_threads,
)
from parity.backends.shapes import DynamicShapeOptions
from parity.inputs import Inputs
from parity.outputs import flatten

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OnnxRuntimeOptions(DynamicShapeOptions):
    # ONNX Runtime's GraphOptimizationLevel of the session (ORT_DISABLE_ALL ... ORT_ENABLE_ALL).
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    # torch.onnx.export(dynamo=True), or the TorchScript exporter (dynamo=False): the older one exports
    # ScriptModules (source: torchscript) and models torch.export cannot trace.
    exporter: Literal["dynamo", "torchscript"] = "dynamo"
    opset: int | None = Field(default=None, ge=7)
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    tf32: bool | None = Field(default=None, description="CUDA: the CUDA execution provider's use_tf32 (None: ONNX "
                                                        "Runtime's default, which allows TensorFloat-32)")

    @model_validator(mode="after")
    def _exporter_shapes(self) -> OnnxRuntimeOptions:
        if self.exporter == "torchscript" and (self.dynamic or self.dynamic_shapes is not None):
            raise ValueError("'dynamic' and 'dynamic_shapes' are the dynamo exporter's; the TorchScript exporter "
                             "exports the example's shapes")
        return self

    @field_validator("opset")
    @classmethod
    def _known_opset(cls, opset: int | None) -> int | None:
        """An opset newer than the installed onnx package knows fails only when the target exports: said when
        the experiment is checked. Without onnx installed, the target is unavailable and says so itself."""
        try:
            from onnx.defs import onnx_opset_version
        except ImportError:
            return opset
        if opset is not None and opset > onnx_opset_version():
            raise ValueError(f"opset {opset} is newer than the installed onnx package knows (at most {onnx_opset_version()})")
        return opset


def export_onnx(model: torch.nn.Module, example: Inputs, path: Path, opset: int | None, optimize: bool = True,
                external_data: bool = False, dynamic_shapes: Any = None, exporter: str = "dynamo") -> str | None:
    """Export with the dynamo exporter (or the TorchScript one). Its progress messages, and the whole traced
    graph that torch.export prints when it gives up on a model (thousands of lines for a detector), are kept
    off the console: the exception says why, and the check records it. Returns what the progress messages
    tell of the graph's capture (`capture_fallback`): None unless the exporter fell back to another."""
    progress = io.StringIO()
    with contextlib.redirect_stdout(progress), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        if exporter == "torchscript":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its deprecation notice, not something about this model
                torch.onnx.export(model, example.args, str(path), kwargs=example.kwargs or None, dynamo=False,
                                  opset_version=opset, verbose=False)
            return None
        # verbose=None (the exporter's default) prints one line per capture it tries, into `progress`
        build_torchlib_registry_once()
        try:
            torch.onnx.export(model, example.args, str(path), kwargs=example.kwargs or None, dynamo=True,
                              opset_version=opset, external_data=external_data, verbose=None, optimize=optimize,
                              dynamic_shapes=dynamic_shapes)
        finally:
            forget_last_match()
            gc.collect()  # the exporter's graphs are cycles (a node and its graph)
            release_memory()  # before a session is opened beside them
        fallback = capture_fallback(progress.getvalue())
        if fallback is None:
            return None
        failed, used = fallback
        why = _capture_error(model, example, dynamic_shapes, failed)
    return (f"the ONNX exporter fell back: {failed} failed ({why}); the graph comes from {used}, not from "
            "the exporter's default capture")


def build_torchlib_registry_once() -> None:
    """The dynamo exporter builds its table of ATen-to-ONNX functions afresh for every export, and onnxscript reads
    each function's domain by parsing its Python source (thousands of functions: most of a small model's export
    time, docs/benchmarks.md). Built once per process and handed out as a copy (its own dict and lists, so an
    export's custom translations never reach the next); built again when torchlib's own table grows. A version of
    torch without this classmethod is left as it is."""
    from torch.onnx._internal.exporter import _registration

    registry = _registration.ONNXRegistry
    build = registry.__dict__.get("from_torchlib")
    if not isinstance(build, classmethod) or getattr(build.__func__, "parity_built_once", False):
        return
    built: dict[tuple, Any] = {}

    def from_torchlib(cls, *args, **kwargs):
        from onnxscript.function_libs.torch_lib import registration

        key = (cls, args, tuple(sorted(kwargs.items())), sum(1 for _ in registration.default_registry.items()))
        if key not in built:
            built[key] = build.__func__(cls, *args, **kwargs)
        copy = cls()
        copy._opset_version = built[key]._opset_version
        copy.functions = {op: list(metas) for op, metas in built[key].functions.items()}
        return copy

    from_torchlib.parity_built_once = True
    registry.from_torchlib = classmethod(from_torchlib)


def forget_last_match() -> None:
    """onnxscript's optimizer rules are module-level objects whose matchers keep the last node and graph they
    matched: the whole exported graph, and through it the weights of the model it was exported from (a backend's
    copy), stay alive until the next export (86 MB for ResNet-18, measured: docs/benchmarks.md, issue 29). Each
    matcher is reset as it resets itself before a match. A version of onnxscript without these attributes keeps
    what it keeps."""
    matcher = sys.modules.get("onnxscript.rewriter._matcher")
    if matcher is None:
        return
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("onnxscript."):
            continue
        for value in list(vars(module).values()):
            rules = getattr(value, "rules", None)  # a RewriteRuleSet, else perhaps a rule
            for rule in rules if isinstance(rules, list) else [value]:
                found = getattr(rule, "_matcher", None)
                if isinstance(found, matcher.SimplePatternMatcher):
                    with contextlib.suppress(AttributeError, TypeError):
                        found._init_match(0)
                        found._graph = None


# The exporter's progress line for each way it tries to capture the model (torch/onnx/_internal/exporter/
# _capture_strategies.py): "[torch.onnx] Obtain model graph for `Net()` with `torch.export.export(...,
# strict=False)`... ❌", then the next one it tries, until one is ✅.
_ATTEMPT = re.compile(r"^\[torch\.onnx\] Obtain model graph for `.*` with `(.+)`\.\.\. (✅|❌)\s*$",
                      re.MULTILINE)


def capture_fallback(progress: str) -> tuple[str, str] | None:
    """(the capture the exporter tried first, the one its graph comes from) when the first failed and a later
    one succeeded, from its progress lines (it tries the next only when one fails, and stops at the first that
    succeeds); None when the first succeeded, or none did."""
    attempts = [(how, mark == "✅") for how, mark in (m.groups() for m in _ATTEMPT.finditer(progress))]
    if len(attempts) < 2 or not attempts[-1][1]:
        return None
    return attempts[0][0], attempts[-1][0]


def _capture_error(model: torch.nn.Module, example: Inputs, dynamic_shapes: Any, how: str) -> str:
    """Why the exporter's first capture failed, on one line: the exporter keeps only the error of a capture
    that nothing replaced, so torch.export is asked again, as that capture asked it (strict or not)."""
    strict = {"torch.export.export(..., strict=False)": False, "torch.export.export(..., strict=True)": True}.get(how)
    if strict is None:
        return "the exporter does not say why"
    with contextlib.suppress(ImportError):  # names in dynamic_shapes ("batch") become Dims, as the exporter makes them
        from torch.onnx._internal.exporter._dynamic_shapes import convert_str_to_export_dim

        dynamic_shapes = convert_str_to_export_dim(dynamic_shapes)[0]
    try:
        torch.export.export(model, example.args, kwargs=example.kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as exc:  # the failure is the answer
        text = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {text[:200] + '...' if len(text) > 200 else text}"
    return "it succeeds when asked again alone"


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    preparation_cost = 2  # an export
    libraries = ("torch", "onnx", "onnxscript", "onnx-ir", "onnxruntime", "numpy")  # the dynamo exporter's
    devices = ("cpu", "cuda")
    legacy_devices = ("cpu", "cuda")
    dtypes = ("float32", "float16")
    Options = OnnxRuntimeOptions
    model_kinds = ("module", "exported", "torchscript", "onnx")
    session_options = ("graph_optimization_level", "threads", "tf32")  # the session's, not the exported graph's
    # What exporting means, which an ONNX file (run as it is) does not need.
    EXPORT_OPTIONS = ("exporter", "opset", "dynamic", "dynamic_shapes")

    @classmethod
    def model_problem(cls, spec, kind: str) -> str | None:
        problem = super().model_problem(spec, kind)
        if problem or kind not in ("torchscript", "onnx"):
            return problem
        if kind == "torchscript" and spec.options.get("exporter", "dynamo") != "torchscript":
            return ("a TorchScript module exports to ONNX with the TorchScript exporter only (torch.export cannot "
                    "trace it): set options.exporter: torchscript")
        export_options = sorted(set(spec.options) & set(cls.EXPORT_OPTIONS))
        if kind == "onnx" and (spec.dtype != "float32" or export_options):
            return (f"backend '{cls.name}' runs an ONNX graph file as it is, in its own float32: "
                    + (f"options {', '.join(export_options)} do not apply" if export_options else f"not {spec.dtype}"))
        return None

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        if spec.options.get("tf32") is not None and not spec.device.startswith("cuda"):
            return "option tf32 applies to CUDA devices only"
        return None

    @classmethod
    def providers(cls, spec, options: OnnxRuntimeOptions) -> list:
        """The session's execution providers, first the one this target is named for."""
        device = torch.device(spec.device)
        if device.type != "cuda":
            return ["CPUExecutionProvider"]
        cuda = {"device_id": device.index or 0}
        if options.tf32 is not None:
            cuda["use_tf32"] = "1" if options.tf32 else "0"
        return [("CUDAExecutionProvider", cuda)]

    @classmethod
    def available(cls, spec) -> str | None:
        missing = not_installed("onnxruntime", "onnxruntime")
        if missing:
            return missing
        if spec.device.startswith("cuda"):
            import onnxruntime as ort

            provider = _provider_name(cls.providers(spec, cls.Options())[0])
            if provider not in ort.get_available_providers():
                return f"onnxruntime has no {provider} here (pip install onnxruntime-gpu)"
            return cuda_reason(spec.device)
        return None

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        """Exported as parity exports it (the exporter, the opset, the dynamic dims), to module.onnx beside the
        script (the graph an ONNX Runtime report needs), and run in a session with the target's options."""
        o = cls.options_of(spec)
        dynamic = o.dynamic or o.dynamic_shapes is not None
        return "\n".join([
            "import contextlib, io",
            "import onnxruntime as ort",
            f'module, args, kwargs = module.to(torch.{spec.dtype}), cast(args, "cpu", torch.{spec.dtype}), '
            f'cast(kwargs, "cpu", torch.{spec.dtype})',
            *(_dynamic_lines(o.dynamic_shapes) if dynamic else []),
            "with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():  # the exporter's progress lines",
            '    torch.onnx.export(module, tuple(args), str(HERE / "module.onnx"), kwargs=kwargs or None, '
            f"dynamo={o.exporter == 'dynamo'}, opset_version={o.opset}, verbose=False"
            + (", dynamic_shapes=dynamic_shapes)" if dynamic else ")"),
            "options = ort.SessionOptions()",
            f"options.graph_optimization_level = ort.GraphOptimizationLevel.{LEVELS[o.graph_optimization_level]}",
            f"options.intra_op_num_threads = {o.threads or 'torch.get_num_threads()'}",
            f'session = ort.InferenceSession(str(HERE / "module.onnx"), options, providers={cls.providers(spec, o)!r})',
            "feed = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]",
            "out = [torch.from_numpy(a) for a in session.run(None, {i.name: t.contiguous().numpy() "
            "for i, t in zip(session.get_inputs(), feed)})]",
        ])

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        self.graph = model if onnx_file(model) is not None else None
        if self.graph is not None:  # an ONNX file: run as it is, inputs and outputs by the graph's names
            self._open_session(onnx_file(model))
            return
        model, example = model.to(self.dtype), example.to("cpu", self.dtype)
        self.outputs = OutputSpec(model, example)

        def export(folder: Path) -> None:
            # The weights in a side file (model.onnx.data): the exporter writes them one by one instead of building the
            # whole graph in memory twice (a proto, then its bytes), and the session reads them without a proto's copy
            # (ResNet-18: the export's peak 150 MB lower, the session's 60 MB; the same outputs to the bit).
            fallback = export_onnx(model, example, folder / "model.onnx", self.options.opset, external_data=True,
                                   dynamic_shapes=self.options.shapes_for(model, example), exporter=self.options.exporter)
            if fallback is not None:  # kept with the artifact: a cached one says it too (Backend.artifact)
                self.note("exporter", fallback)

        folder = self.artifact("onnx", model, example, export)
        model = export = None  # this backend's copy of the model is not run again: freed before the session holds the graph
        release_memory()  # the copy's freed heap handed back before the session's weights are read beside it
        self._open_session(folder / "model.onnx")

    def _open_session(self, graph: Path | bytes, weights: Path | None = None) -> None:
        """A session with this target's options of the graph file, or of a graph in memory whose weights are in a
        side file in the folder `weights` (tier 2's edited graphs: the artifact's folder is never written to)."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self.options.graph_optimization_level])
        opts.intra_op_num_threads = runtime_threads(self.options.threads)
        if weights is not None:
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(weights))
            opts.log_severity_level = 3  # errors only: what it warns of concerns the edited graph, not the user's model
            # Run once: no arena kept for a next run, nor a plan of one block for every value (with every layer's
            # output a graph output, most values outlive the run anyway). Allocation only: the kernels are the same.
            opts.enable_cpu_mem_arena = False
            opts.enable_mem_pattern = False
        providers = self.providers(self.spec, self.options)
        self.session = ort.InferenceSession(graph if isinstance(graph, bytes) else str(graph), opts, providers=providers)
        wanted, used = _provider_name(providers[0]), self.session.get_providers()
        if not used or used[0] != wanted:
            # ONNX Runtime's Python API retries on other providers when one fails to start (a CUDA or TensorRT
            # library missing): outputs computed there would be judged under this target's name.
            raise RuntimeError(f"ONNX Runtime could not start {wanted} (the session runs on {', '.join(used)} instead)")
        self.input_names = [i.name for i in self.session.get_inputs()]

    def _feed(self, inputs: Inputs) -> dict:
        """The session's inputs: the flattened input tensors, by the graph's input names."""
        tensors = inputs.to("cpu", self.dtype).tensors()
        if len(tensors) != len(self.input_names):
            raise RuntimeError(f"the ONNX graph takes {len(self.input_names)} inputs, got {len(tensors)} tensors")
        return {name: t.contiguous().numpy() for name, t in zip(self.input_names, tensors, strict=True)}

    def run(self, inputs: Inputs):
        if self.graph is not None:
            return self.graph.outputs_from(self.session.run(None, self.graph.feed(inputs.args, inputs.kwargs)))
        outputs = self.session.run(None, self._feed(inputs))
        return self.outputs.rebuild([torch.from_numpy(a) for a in outputs], "the ONNX graph")

    def capture_layers(self, model: torch.nn.Module, example: Inputs, names: list[str],
                       inputs: Inputs | None = None) -> dict[str, list | str]:
        """Each named module's output inside one run of the exported graph on `inputs` (None: `example`), or
        why it cannot be seen. The graph is exported from `example` with the target's dynamic dims, as
        `prepare` exports it: the layers seen are those of the artifact that ran `inputs`.

        The dynamo exporter tags every ONNX node with the module scopes it came from. A module's outputs
        are the values its nodes produce and nodes outside it (or the graph's outputs) consume; they are
        added as graph outputs and read in one run. The graph is `_layers_graph`'s, without the exporter's own
        optimizer; ONNX Runtime still optimizes the session and keeps every requested output. A module with no
        value of its own (an Identity, a Dropout in eval mode) is reported, not guessed. The edited graph (without
        its weights, which it reads from the layers graph's side file) and the boundaries are an artifact of their
        own, one per set of names: from the cache, a run neither parses nor edits a graph."""
        if self.options.exporter == "torchscript":
            return dict.fromkeys(names, NO_SCOPES)
        example = example.to("cpu", self.dtype)
        inputs = example if inputs is None else inputs.to("cpu", self.dtype)
        folder = self._layers_graph(model, example)
        observed = self._observed_graph(model, example, folder, names)
        boundary = json.loads((observed / OBSERVED_BOUNDARIES).read_text())
        wanted = _boundary_values(boundary)
        self._open_session((observed / "model.onnx").read_bytes(), folder)
        values = dict(zip(wanted, _run_without_copies(self.session, wanted, self._feed(inputs)), strict=True)) if wanted else {}
        self.session = None
        return {name: ([values[v] for v in found] if isinstance(found, list) else found) for name, found in boundary.items()}

    def _observed_graph(self, model: torch.nn.Module, example: Inputs, layers: Path, names: list[str]) -> Path:
        """The folder of the layers graph with the named modules' boundary values made graph outputs (`model.onnx`,
        no weights) and those values per module (OBSERVED_BOUNDARIES)."""
        import hashlib

        def observe(folder: Path) -> None:
            import onnx

            graph_model = onnx.load(str(layers / "model.onnx"), load_external_data=False)
            boundary = module_boundaries(graph_model.graph, names)
            add_outputs(graph_model, _boundary_values(boundary))
            (folder / "model.onnx").write_bytes(graph_model.SerializeToString())
            (folder / OBSERVED_BOUNDARIES).write_text(json.dumps(boundary))

        kind = "onnx-observed-" + hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
        return self._artifact_once(kind, model, example, observe)

    def slice_layers(self, model: torch.nn.Module, example: Inputs,
                     layers: dict[str, list[tuple[Inputs, Any]]]) -> dict[str, list[Any] | str]:
        """Each named module cut out of the whole model's exported graph (the one `capture_layers` reads, exported
        once from `example` and kept in the artifact cache): the nodes the exporter tagged with the module's scope,
        with the weights and constants they read, fed each call's recorded inputs. What the slice cannot say for
        sure is refused and said, so that the layer is exported alone instead: a module holding control flow, inputs
        or outputs that do not pair one to one with the recorded call's tensors by dtype and shape (a tensor passed
        through untouched, an unused input, two inputs of one shape), a module called several times (its calls'
        nodes share one scope) unless each call takes and gives one tensor (`_recorded`)."""
        import onnx

        if self.options.exporter == "torchscript":
            return dict.fromkeys(layers, NO_SCOPES)
        folder = self._layers_graph(model, example.to("cpu", self.dtype))
        whole = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        types = _ValueTypes(whole)
        out: dict[str, list[Any] | str] = {}
        for name, calls in layers.items():
            piece = module_slice(whole.graph, name)
            edges = piece if isinstance(piece, str) else self._recorded(piece, calls, types)
            if isinstance(edges, str):
                out[name] = edges
                continue
            known, leaves = edges
            self._open_session(piece.model(whole, types, name).SerializeToString(), folder)
            try:
                got = dict(zip(piece.outputs, self.session.run(piece.outputs, {
                    v: self._cast(known[v]).contiguous().numpy() for v in piece.inputs}), strict=True))
            finally:
                self.session = None
            out[name] = [as_structure(reference, [torch.from_numpy(got[v]) for v in values])
                         for (_, reference), values in zip(calls, leaves, strict=True)]
        return out

    def slice_own_code(self, model: torch.nn.Module, example: Inputs, parent: str, call: tuple[Inputs, Any],
                       members: dict[str, list[tuple[Inputs, Any]]]) -> dict[str, list[tuple[Any, Any]]] | str:
        """The parent's own code (its nodes outside every member's scope) cut out of the whole model's graph
        (`slice_layers`'), fed the parent's recorded inputs and each member's recorded outputs: (reference, target)
        pairs of the values it computes that the parent returns (under `parent`) and that it hands each member (under
        the member's name); or why it cannot be cut out (the caller then exports the parent with replays)."""
        import onnx

        if self.options.exporter == "torchscript":
            return NO_SCOPES
        folder = self._layers_graph(model, example.to("cpu", self.dtype))
        whole = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        graph, types = whole.graph, _ValueTypes(whole)
        edges = {parent: module_slice(graph, parent), **{m: module_slice(graph, m) for m in members}}
        # A member with no node of its own (an Identity, a Dropout in eval mode) has no edge: its output is its input.
        edges = {name: piece for name, piece in edges.items() if name == parent or piece != NOT_IN_GRAPH}
        members = {m: calls for m, calls in members.items() if m in edges}
        reference: dict[str, Any] = {}  # the reference's value of each graph value at these modules' edges
        for name, piece in edges.items():
            known = piece if isinstance(piece, str) else self._recorded(piece, [call] if name == parent else members[name], types)
            if isinstance(known, str):
                return f"{name}: {known}"
            reference.update(known[0])
        scoped = set(members)
        own = [i for i in _inside(graph, parent) if not scoped & set(_scopes(graph.node[i])[:-1])]
        made = {v for i in own for v in graph.node[i].output}
        handed = {name: [v for v in edges[name].inputs if v in made] for name in [parent, *members]}
        handed[parent] = [v for v in edges[parent].outputs if v in made]  # what the parent returns, from its own code
        wanted = list(dict.fromkeys(v for values in handed.values() for v in values))
        if not wanted:  # its own code computes nothing that leaves it: nothing of its own to differ
            return {}
        piece = _cut(graph, own, wanted)
        if isinstance(piece, str):
            return piece
        unknown = [v for v in piece.inputs if v not in reference]
        if unknown:
            return f"its own code reads '{unknown[0]}', neither the parent's input nor a member's output"
        self._open_session(piece.model(whole, types, f"{parent or 'the model'}'s own code").SerializeToString(), folder)
        try:
            got = dict(zip(wanted, self.session.run(wanted, {v: self._cast(reference[v]).contiguous().numpy()
                                                               for v in piece.inputs}), strict=True))
        finally:
            self.session = None
        return {name: [(reference[v], torch.from_numpy(got[v])) for v in values] for name, values in handed.items() if values}

    def _recorded(self, piece: Slice, calls: list[tuple[Inputs, Any]],
                  types: _ValueTypes) -> tuple[dict[str, Any], list[list[str]]] | str:
        """The recorded tensor at each edge value of a module's slice (its inputs and outputs), and for each call the
        value of each tensor leaf of its output; or why they do not pair. A module called once: paired by dtype and
        shape, one to one. One called several times: one input and one output tensor a call, paired call by call in
        graph order (the exporter writes the calls' nodes in the order they ran)."""
        known: dict[str, Any] = {}
        leaves: list[list[str]] = []
        for what, values, recorded in (("inputs", piece.inputs, [c[0].tensors() for c in calls]),
                                       ("outputs", piece.outputs, [flatten_values(c[1]) for c in calls])):
            infos = types.of(values)
            if len(calls) == 1:
                order = pair([[j for j, t in enumerate(recorded[0]) if fits(info, self._cast(t))] for info in infos],
                             len(recorded[0]))
                if isinstance(order, str):
                    return f"its slice's {what} {order}"
                known.update({v: recorded[0][j] for v, j in zip(values, order, strict=True)})
                by_leaf = [[values[order.index(j)] for j in range(len(recorded[0]))]]
            else:
                if any(len(r) != 1 for r in recorded) or len(values) != len(calls):
                    return (f"called {len(calls)} times in one forward, its slice's {what} are {len(values)} value(s) "
                            f"of the graph for {sum(map(len, recorded))} recorded tensor(s): not one a call")
                if not all(fits(info, self._cast(r[0])) for info, r in zip(infos, recorded, strict=True)):
                    return f"called {len(calls)} times in one forward, its slice's {what} differ call by call in dtype or shape"
                known.update({v: r[0] for v, r in zip(values, recorded, strict=True)})
                by_leaf = [[v] for v in values]
            if what == "outputs":
                leaves = by_leaf
        return known, leaves

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        """A recorded tensor as the graph takes it: floating ones in the target's dtype."""
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor

    def _layers_graph(self, model: torch.nn.Module, example: Inputs) -> Path:
        """The folder of the graph tier 2 looks inside (`model.onnx`, its weights in a side file): the whole model
        exported from `example` (already cast) with the target's dynamic dims, without the exporter's own optimizer,
        whose rewrites (folding a convolution into the batch norm after it, cancelling transposes across a module's
        edge) would move or remove module boundaries. `model` is not changed: a copy is cast and exported, and with
        the export in the artifact cache no copy is made at all."""

        def export(folder: Path) -> None:
            cast = copy.deepcopy(model).to(self.dtype)
            export_onnx(cast, example, folder / "model.onnx", self.options.opset, optimize=False, external_data=True,
                        dynamic_shapes=self.options.shapes_for(cast, example))
            cast = None
            release_memory()  # the copy's weights: the layers' sessions are opened next

        return self._artifact_once("onnx-layers", model, example, export)

    def _artifact_once(self, kind: str, model: torch.nn.Module, example: Inputs, build) -> Path:
        """`artifact`, looked up once per model and kind by this backend: one backend looks inside one model for a
        whole localization (runner/layer_runs.py's `looking_inside`), and without a cache a scratch folder is made
        once per kind."""
        made = self.__dict__.setdefault("_artifacts_made", {})
        if (id(model), kind) not in made:
            made[id(model), kind] = self.artifact(kind, model, example, build)
        return made[id(model), kind]

    def close(self) -> None:
        self.session = None
        super().close()


def _provider_name(provider: str | tuple[str, dict]) -> str:
    return provider if isinstance(provider, str) else provider[0]


class OnnxRuntimeTensorRTOptions(OnnxRuntimeOptions):
    fp16: bool = Field(default=False, description="the TensorRT provider's trt_fp16_enable: float16 kernels allowed "
                                                  "while the graph stays float32")


class OnnxRuntimeTensorRTBackend(OnnxRuntimeBackend):
    """ONNX Runtime with its TensorRT execution provider first (the CUDA provider runs what TensorRT does not
    take). A backend of its own rather than an option of `onnxruntime`: a target's id is backend-device-dtype,
    so two CUDA targets that differ only in their provider would share one id. Engines are not cached
    (`trt_engine_cache_enable` stays off): nothing is written outside the output folder and parity's cache."""

    name = "onnxruntime-tensorrt"
    devices = ("cuda",)
    legacy_devices = ()
    Options = OnnxRuntimeTensorRTOptions
    session_options = (*OnnxRuntimeBackend.session_options, "fp16")

    @classmethod
    def providers(cls, spec, options: OnnxRuntimeTensorRTOptions) -> list:
        tensorrt = {"device_id": torch.device(spec.device).index or 0, "trt_fp16_enable": "1" if options.fp16 else "0"}
        return [("TensorrtExecutionProvider", tensorrt), *super().providers(spec, options)]


def _dynamic_lines(given: dict | list | None) -> list[str]:
    """Script lines that set `dynamic_shapes` as the target exported with them: `dynamic: true`'s dims (batch and
    spatial dims of every tensor input, backends/shapes.py's dynamic_dims) of the module's own inputs; or the
    target's `dynamic_shapes` as given, when they name this module's inputs (the target's name the whole
    model's: a culprit inside it takes other inputs, and gets `dynamic: true`'s dims, which the script says)."""
    lines = [
        "import inspect",
        "from torch.export import Dim",
        "from torch.utils._pytree import tree_map",
        "def dims(value):  # dynamic: true: the batch dim (0) and the spatial dims (2+) of every tensor input",
        "    return ({d: Dim.AUTO for d in range(value.dim()) if d == 0 or d >= 2} or None) "
        "if isinstance(value, torch.Tensor) else None",
        "bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments",
        "dynamic_shapes = {name: tree_map(dims, value) for name, value in bound.items()}",
    ]
    if given is None:
        return lines
    return lines + [
        f"given = {given!r}  # the target's dynamic_shapes",
        "if (set(given) <= set(bound)) if isinstance(given, dict) else len(given) == len(bound):",
        "    dynamic_shapes = given",
        "else:",
        '    print(f"the target\'s dynamic_shapes do not name this module\'s inputs ({\', \'.join(bound)}): its batch '
        'and spatial dims are exported dynamic instead", file=sys.stderr)',
    ]


def _run_without_copies(session, names: list[str], feed: dict) -> list[torch.Tensor]:
    """The outputs as tensors over ONNX Runtime's own buffers (DLPack), not numpy copies of them: every
    layer of a model is an output here, and a second copy of them all would double the peak memory."""
    import onnxruntime as ort

    values = session.run_with_ort_values(names, {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feed.items()})
    try:
        return [torch.from_dlpack(v) for v in values]
    except (AttributeError, TypeError, RuntimeError):  # an onnxruntime build without DLPack
        return [torch.from_numpy(v.numpy()) for v in values]


NO_SCOPES = "the TorchScript exporter keeps no module scopes in the graph (exporter: dynamo does)"
NOT_IN_GRAPH = "not in the exported graph (no computation of its own, or folded away)"
OBSERVED_BOUNDARIES = "boundaries.json"  # an observed graph's values per module (`capture_layers`)


def _scopes(node) -> list[str]:
    import ast

    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return list(ast.literal_eval(prop.value))
    return []


def module_boundaries(graph, names: list[str]) -> dict[str, list[str] | str]:
    """For each module path, the ONNX values at its output boundary, in graph order (one per call of a
    single-output module), or the reason there are none. A constant made inside the module and read outside it
    too (the exporter makes a scalar once and reuses it) is not an output."""
    scopes = [set(_scopes(node)[:-1]) for node in graph.node]  # the last entry is the node's own name
    graph_outputs = {o.name for o in graph.output}
    constant = _constant_nodes(graph)
    out: dict[str, list[str] | str] = {}
    for name in names:
        inside = [i for i, s in enumerate(scopes) if name in s]
        if not inside:
            out[name] = NOT_IN_GRAPH
            continue
        inside_set = set(inside)
        consumed_outside = {v for i, node in enumerate(graph.node) if i not in inside_set for v in node.input}
        out[name] = [v for i in inside if i not in constant for v in graph.node[i].output
                     if v and (v in consumed_outside or v in graph_outputs)]
    return out


def _boundary_values(boundary: dict[str, list[str] | str]) -> list[str]:
    """Every value `module_boundaries` found, once each, sorted: the outputs the observed graph adds."""
    return sorted({v for values in boundary.values() if isinstance(values, list) for v in values})


def _constant_nodes(graph) -> set[int]:
    """The nodes that read only weights and constants (a Constant, a reshape of a weight): in graph order, a node's
    producers come before it."""
    weights = {w.name for w in graph.initializer}
    constant_values: set[str] = set()
    found = set()
    for i, node in enumerate(graph.node):
        if all(not v or v in weights or v in constant_values for v in node.input):
            found.add(i)
            constant_values.update(node.output)
    return found


def add_outputs(model, names: list[str]) -> None:
    """Make intermediate values graph outputs (with their types, which ONNX Runtime needs)."""
    import onnx

    existing = {o.name for o in model.graph.output}
    known = {v.name: v for v in model.graph.value_info}
    missing = [n for n in names if n not in known and n not in existing]
    if missing:
        inferred = onnx.shape_inference.infer_shapes(model)
        known.update({v.name: v for v in inferred.graph.value_info})
    for name in names:
        if name in existing:
            continue
        if name not in known:
            raise RuntimeError(f"the ONNX value '{name}' has no type information")
        model.graph.output.append(known[name])


class _ValueTypes:
    """The type (ValueInfoProto) of every value of a graph: its inputs', outputs' and those the exporter wrote, the
    rest inferred once when first asked for."""

    def __init__(self, model):
        graph = model.graph
        self.model, self.known = model, {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
        self.inferred = False

    def of(self, names: list[str]) -> list:
        import onnx

        if not self.inferred and any(n not in self.known for n in names):
            inferred = onnx.shape_inference.infer_shapes(self.model).graph.value_info
            self.known.update({v.name: v for v in inferred if v.name not in self.known})
            self.inferred = True
        missing = [n for n in names if n not in self.known]
        if missing:
            raise RuntimeError(f"the ONNX value '{missing[0]}' has no type information")
        return [self.known[n] for n in names]


@dataclass
class Slice:
    """Nodes of a graph (in graph order) that compute `outputs` from `inputs` and the graph's weights."""

    nodes: list
    inputs: list[str]
    outputs: list[str]

    def model(self, whole, types: _ValueTypes, name: str):
        """The slice as a model of its own: the whole graph's opsets, functions and the weights its nodes read (their
        side-file references kept, so that nothing is copied)."""
        import onnx

        read = {v for node in self.nodes for v in node.input}
        graph = onnx.helper.make_graph(self.nodes, f"slice of {name}", types.of(self.inputs), types.of(self.outputs),
                                       initializer=[w for w in whole.graph.initializer if w.name in read])
        return onnx.helper.make_model(graph, opset_imports=whole.opset_import, ir_version=whole.ir_version,
                                      functions=whole.functions)


def _inside(graph, name: str) -> list[int]:
    """The nodes the exporter tagged with the module scope `name` (every node for the model itself, "")."""
    return [i for i, node in enumerate(graph.node) if name in _scopes(node)[:-1]]


def module_slice(graph, name: str) -> Slice | str:
    """The nodes of the module `name` giving the values at its output boundary (`module_boundaries`), or why the
    module cannot be cut out that way (`_cut`)."""
    inside = _inside(graph, name)
    return _cut(graph, inside, module_boundaries(graph, [name])[name]) if inside else NOT_IN_GRAPH


def _cut(graph, indices: list[int], outputs: list[str]) -> Slice | str:
    """The nodes `indices`, with the outside nodes that compute constants they read (a Constant, a reshape of a
    weight), fed the values that flow in from the rest of the graph; or why they cannot be cut out."""
    import onnx

    producer = {v: i for i, node in enumerate(graph.node) for v in node.output if v}
    weights = {w.name for w in graph.initializer}
    constant = _constant_nodes(graph)
    chosen, stack = set(indices), list(indices)
    while stack:  # pull in the constants the nodes read, and theirs
        for v in graph.node[stack.pop()].input:
            j = producer.get(v)
            if j is not None and j not in chosen and j in constant:
                chosen.add(j)
                stack.append(j)
    nodes = [graph.node[i] for i in sorted(chosen)]
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for node in nodes for a in node.attribute):
        return "it holds control flow (If, Loop, Scan), whose bodies a slice does not cut"
    made = {v for node in nodes for v in node.output}
    inputs = list(dict.fromkeys(v for node in nodes for v in node.input if v and v not in made and v not in weights))
    return Slice(nodes, inputs, outputs)


def _dims(info) -> tuple[int | None, ...] | None:
    """A value's dims (None: a dim of any size), None when its rank is unknown."""
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)


def fits(info, tensor: torch.Tensor) -> bool:
    """Whether `tensor` can be fed as the graph value `info`: its element type, and its shape within the dims."""
    import onnx

    dims = _dims(info)
    if dims is not None and (len(dims) != tensor.dim() or any(d not in (None, s) for d, s in zip(dims, tensor.shape, strict=True))):
        return False
    try:
        element = onnx.helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=tensor.dtype).numpy().dtype)
    except (TypeError, KeyError):  # a dtype numpy has no name for
        return False
    return info.type.tensor_type.elem_type == element


def pair(fits: list[list[int]], count: int) -> list[int] | str:
    """For each graph value, the one recorded tensor it is (`fits[i]`: the indices of the `count` tensors whose dtype
    and shape fit value i), every tensor used once; or why they do not pair one to one."""
    if len(fits) != count:
        return f"are {len(fits)} value(s) of the graph, the recorded call has {count} tensor(s)"
    order = [f[0] for f in fits if len(f) == 1]
    if len(order) == count and len(set(order)) == count:
        return order
    if any(not f for f in fits):
        return "differ in dtype or shape from the recorded call's tensors"
    return "cannot be told apart from each other by dtype and shape"


def flatten_values(output: Any) -> list[torch.Tensor]:
    """The tensor leaves of a recorded output, in flatten order."""
    return [leaf for leaf in flatten(output).values() if isinstance(leaf, torch.Tensor)]


def as_structure(reference: Any, tensors: list[torch.Tensor]) -> Any:
    """The slice's output tensors (in the flatten order of the reference's tensor leaves) in the structure of the
    reference's recorded output, its non-tensor leaves kept (as an exported graph's are): a tensor, or its leaves."""
    if isinstance(reference, torch.Tensor):
        return tensors[0]
    given = iter(tensors)
    return [next(given) if isinstance(leaf, torch.Tensor) else leaf for leaf in flatten(reference).values()]
