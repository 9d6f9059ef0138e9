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
import io
import os
import re
import warnings
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
    runtime_threads,
)
from parity.backends.shapes import DynamicShapeOptions
from parity.inputs import Inputs

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
        torch.onnx.export(model, example.args, str(path), kwargs=example.kwargs or None, dynamo=True,
                          opset_version=opset, external_data=external_data, verbose=None, optimize=optimize,
                          dynamic_shapes=dynamic_shapes)
        fallback = capture_fallback(progress.getvalue())
        if fallback is None:
            return None
        failed, used = fallback
        why = _capture_error(model, example, dynamic_shapes, failed)
    return (f"the ONNX exporter fell back: {failed} failed ({why}); the graph comes from {used}, not from "
            "the exporter's default capture")


# The exporter's progress line for each way it tries to capture the model (torch/onnx/_internal/exporter/
# _capture_strategies.py): "[torch.onnx] Obtain model graph for `Net()` with `torch.export.export(...,
# strict=False)`... ❌", then the next one it tries, until one is ✅.
_ATTEMPT = re.compile(r"^\[torch\.onnx\] Obtain model graph for `.*` with `(?P<how>.+)`\.\.\. (?P<mark>✅|❌)\s*$",
                      re.MULTILINE)


def capture_fallback(progress: str) -> tuple[str, str] | None:
    """(the capture the exporter tried first, the one its graph comes from) when the first failed and a later
    one succeeded, from its progress lines (it tries the next only when one fails, and stops at the first that
    succeeds); None when the first succeeded, or none did."""
    attempts = [(m["how"], m["mark"] == "✅") for m in _ATTEMPT.finditer(progress)]
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
    captures_layers = True
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
            fallback = export_onnx(model, example, folder / "model.onnx", self.options.opset,
                                   dynamic_shapes=self.options.shapes_for(model, example), exporter=self.options.exporter)
            if fallback is not None:  # kept with the artifact: a cached one says it too (Backend.artifact)
                self.note("exporter", fallback)

        folder = self.artifact("onnx", model, example, export)
        self._open_session(folder / "model.onnx")

    def _open_session(self, path: Path) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self.options.graph_optimization_level])
        opts.intra_op_num_threads = runtime_threads(self.options.threads)
        providers = self.providers(self.spec, self.options)
        self.session = ort.InferenceSession(str(path), opts, providers=providers)
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
        added as graph outputs and read in one run. This graph is exported without the exporter's own
        optimizer, whose rewrites (folding a convolution into the batch norm after it, cancelling
        transposes across a module's edge) would move or remove module boundaries; ONNX Runtime still
        optimizes the session and keeps every requested output. A module with no value of its own
        (an Identity, a Dropout in eval mode) is reported, not guessed. `model` is not changed: with the
        export in the artifact cache, no copy of it is made at all."""
        import hashlib

        import onnx

        if self.options.exporter == "torchscript":
            why = "the TorchScript exporter keeps no module scopes in the graph (exporter: dynamo does)"
            return dict.fromkeys(names, why)
        example = example.to("cpu", self.dtype)
        inputs = example if inputs is None else inputs.to("cpu", self.dtype)

        def export(folder: Path) -> None:  # a copy is cast and exported: `model` is the caller's
            # Weights go to a side file and stay there: the graph is edited (and shape-inferred) without them.
            cast = copy.deepcopy(model).to(self.dtype)
            export_onnx(cast, example, folder / "model.onnx", self.options.opset, optimize=False, external_data=True,
                        dynamic_shapes=self.options.shapes_for(cast, example))

        folder = self.artifact("onnx-layers", model, example, export)
        graph_model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        boundary = module_boundaries(graph_model.graph, names)
        wanted = sorted({v for values in boundary.values() if isinstance(values, list) for v in values})
        add_outputs(graph_model, wanted)
        # Beside the weights file it refers to; named by its outputs, written whole or not at all.
        path = folder / f"observed-{hashlib.sha256(' '.join(wanted).encode()).hexdigest()[:16]}.onnx"
        if not path.exists():
            partial = path.with_suffix(f".{os.getpid()}.partial")
            onnx.save(graph_model, str(partial))
            os.replace(partial, path)
        del graph_model
        self._open_session(path)
        values = dict(zip(wanted, _run_without_copies(self.session, wanted, self._feed(inputs)), strict=True)) if wanted else {}
        return {name: ([values[v] for v in found] if isinstance(found, list) else found) for name, found in boundary.items()}

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


def _scopes(node) -> list[str]:
    import ast

    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return list(ast.literal_eval(prop.value))
    return []


def module_boundaries(graph, names: list[str]) -> dict[str, list[str] | str]:
    """For each module path, the ONNX values at its output boundary, in graph order (one per call of a
    single-output module), or the reason there are none."""
    scopes = [set(_scopes(node)[:-1]) for node in graph.node]  # the last entry is the node's own name
    graph_outputs = {o.name for o in graph.output}
    out: dict[str, list[str] | str] = {}
    for name in names:
        inside = [i for i, s in enumerate(scopes) if name in s]
        if not inside:
            out[name] = "not in the exported graph (no computation of its own, or folded away)"
            continue
        inside_set = set(inside)
        consumed_outside = {v for i, node in enumerate(graph.node) if i not in inside_set for v in node.input}
        values = [v for i in inside for v in graph.node[i].output if v and (v in consumed_outside or v in graph_outputs)]
        out[name] = values
    return out


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
