"""PyTorch eager mode: the reference, the float64 oracle, and eager variants (dtype, layout, threads)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import (
    MAX_THREADS,
    Backend,
    Decoded,
    num_threads,
    onnx_file,
    synchronize,
    tf32,
    to_cpu,
)
from parity.backends.quantize import quantize, scheme_problem
from parity.dtypes import DTYPES, QUANTIZE_SCHEMES, REDUCED
from parity.inputs import Inputs


class EagerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channels_last: bool = False
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    autocast: bool = Field(default=False, description="keep float32 weights and run under torch.autocast(dtype)")
    tf32: bool | None = Field(default=None, description="CUDA: TensorFloat-32 in float32 convolutions and matmuls "
                                                        "(None: PyTorch's settings, which allow it in convolutions)")


class EagerBackend(Backend):
    name = "eager"
    devices = ("cpu", "cuda")
    legacy_devices = ("cuda",)  # on the CPU it is the reference
    dtypes = DTYPES
    Options = EagerOptions
    runs_module_hooks = True
    specializes_on_example = False  # the model's own forward, whatever the inputs' shapes
    # Whatever the model's forward is: an ONNX file's runs ONNX Runtime CPU float32 (models/onnx_graph.py).
    model_kinds = ("module", "exported", "torchscript", "onnx")
    quantize_schemes = tuple(name for name, s in QUANTIZE_SCHEMES.items() if s.in_torch)

    @classmethod
    def model_problem(cls, spec, kind: str) -> str | None:
        """An ONNX file's forward is ONNX Runtime on the CPU in float32: nothing else is eager about it, so
        another device, dtype or option would claim what does not happen (the float64 oracle included)."""
        problem = super().model_problem(spec, kind)  # compile and torchscript take fewer kinds
        if problem is None and kind == "onnx" and (spec.device != "cpu" or spec.dtype != "float32" or spec.options):
            return (f"backend '{cls.name}' runs an ONNX graph file as ONNX Runtime CPU float32, without options; "
                    f"not {spec.device} {spec.dtype}{' with options' if spec.options else ''} (for other "
                    "settings use the onnxruntime or openvino backend)")
        if problem is None and spec.quantize is not None and kind not in ("module", "exported"):
            return (f"backend '{cls.name}' quantizes a model through torch.export: an int8 target cannot take a "
                    f"{kind} file model")
        return problem

    @classmethod
    def available(cls, spec) -> str | None:
        return super().available(spec) or (scheme_problem(spec.quantize.scheme) if spec.quantize else None)

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        if spec.options.get("autocast") and spec.dtype not in REDUCED:
            return "option autocast needs dtype bfloat16 or float16"
        if spec.options.get("tf32") is not None and not spec.device.startswith("cuda"):
            return "option tf32 applies to CUDA devices only"
        if spec.quantize and (spec.dtype != "float32" or spec.device != "cpu"):
            return "quantize: an int8 target starts from the float32 model on the CPU (dtype float32, device cpu)"
        return None

    @classmethod
    def repro_snippet(cls, spec) -> str | None:
        autocast = cls.options_of(spec).autocast
        context = f'torch.autocast("{torch.device(spec.device).type}", dtype=torch.{spec.dtype})' if autocast else None
        return "\n".join([*placement_lines(cls, spec), *call_lines("module", context)])

    def _option(self, name: str, default=None):
        """Eager-only options; subclasses (compile) that lack them get the plain behaviour."""
        return getattr(self.options, name, default)

    # Whether inputs keep their dtypes: an ONNX file's graph declares its own, as every backend that reads the
    # file feeds them (a float64 input cast to float32 here would be another input than the targets get).
    _graph_dtypes = False

    def quantized(self, model: torch.nn.Module, example: Inputs) -> torch.nn.Module:
        """`model` quantized as the target's `quantize:` says (on the CPU, in float32), else as it is."""
        if self.spec.quantize is None:
            return model
        calibration = [self.convert(c) for c in self.calibration or []]
        with torch.no_grad():
            return quantize(model.eval(), self.spec.quantize.scheme, self.convert(example), calibration,
                            note=lambda message: self.note("quantize", message))

    # Whether float32 casts inside the model's forward run as float64 (the float64 oracle: Float64Casts).
    _float64_casts = False

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        self._graph_dtypes = onnx_file(model) is not None
        self._float64_casts = self.dtype == torch.float64 and not self.options.autocast and not self._graph_dtypes
        model = self.quantized(model, example)
        model = model.to(self.device)
        if not self.options.autocast:
            model = model.to(self.dtype)
        if self.options.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model

    def convert(self, inputs: Inputs) -> Inputs:
        """Inputs on this backend's device, in its dtype (unless autocast does the casting, or an ONNX graph
        declares its inputs' dtypes)."""
        keep = self._option("autocast", False) or self._graph_dtypes
        inputs = inputs.to(self.device, None if keep else self.dtype)
        if self._option("channels_last", False):
            inputs = inputs.map(lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
        return inputs

    def context(self):
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(num_threads(self._option("threads")))
        stack.enter_context(tf32(self._option("tf32")))
        if self._option("autocast", False):
            stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        if self._float64_casts:
            stack.enter_context(float64_default())
            stack.enter_context(Float64Casts())
        return stack

    def call(self, fn, inputs: Inputs) -> Any:
        inputs = self.convert(inputs)
        with self.context():
            out = fn(*inputs.args, **inputs.kwargs)
            synchronize(self.device)
        return to_cpu(out)

    def run(self, inputs: Inputs) -> Any:
        return self.call(self.model, inputs)

    def decoding_module(self) -> torch.nn.Module:
        """What `decode` calls: the module `run` calls (compile: its compiled module)."""
        return self.model

    def decode(self, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None) -> Decoded:
        """CachedDecoding: the Hugging Face decoder's own forward, a prefill and then one token at a time through its
        KV cache, in this target's dtype, device and options (as generate() runs it when deployed)."""
        with self.context():
            decoded = cached_decoding(self.model, prompt.to(self.device), steps,
                                      None if forced is None else forced.to(self.device), self.decoding_module())
            synchronize(self.device)
        cache = tuple((keys.float(), values.float()) for keys, values in decoded.cache or ())
        return Decoded(decoded.tokens, decoded.logits.float(), cache or None)  # outside the float64 oracle's casts


class NoCache(NotImplementedError):
    """The model has no KV cache to decode through (its forward takes no cache): the target cannot run the cache,
    which is `unsupported_op` (taxonomy.py: a NotImplementedError), as every way of failing to is."""


# What a Hugging Face decoder's forward calls its cache: `cache` from transformers 5.x, `past_key_values` before
# (still taken, deprecated, until 5.40).
CACHE_KEYWORDS = ("cache", "past_key_values")


def cached_decoding(model: torch.nn.Module, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None,
                    call: torch.nn.Module | None = None) -> Decoded:
    """`steps` next-token logits of a Hugging Face decoder `model` with its cache, as `CachedDecoding.decode` defines
    them, computed by `call` (default: `model`; compile: its compiled module, whose forward takes *args): the prefill
    over `prompt` with an empty DynamicCache (what generate() makes by default), then each token fed alone with the
    same cache, its position read by the model from the cache's length. Logits, and the cache's keys and values at the
    end (the prompt and every fed token but the last), as the model returns them, on the CPU."""
    import inspect

    parameters = inspect.signature(getattr(model, "forward", model)).parameters
    keyword = next((k for k in CACHE_KEYWORDS if k in parameters), None)
    if keyword is None:
        raise NoCache(f"the model's forward takes no KV cache ({type(model).__name__} has no "
                      f"{' or '.join(CACHE_KEYWORDS)} argument)")
    from transformers import DynamicCache

    call = model if call is None else call
    cache = DynamicCache(config=getattr(model, "config", None))
    logits = [call(input_ids=prompt, use_cache=True, **{keyword: cache}).logits[:, -1].detach().cpu()]
    tokens = []
    for step in range(steps):
        token = logits[-1].argmax(-1).to(prompt.device) if forced is None else forced[:, step]
        tokens.append(token.cpu())
        if step + 1 < steps:
            logits.append(call(input_ids=token[:, None], use_cache=True, **{keyword: cache}).logits[:, -1].detach().cpu())
    kept = tuple((layer.keys.detach().cpu(), layer.values.detach().cpu()) for layer in cache.layers)
    return Decoded(torch.stack(tokens, 1).long(), torch.stack(logits, 1), kept or None)


@contextlib.contextmanager
def float64_default():
    """Tensors the forward creates without a dtype (`torch.zeros(n)`) in float64, as its weights are."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


_WIDER = {torch.float32: torch.float64, torch.FloatTensor: torch.DoubleTensor,
          "torch.FloatTensor": "torch.DoubleTensor", "torch.float32": "torch.float64"}


def _wider(value: Any) -> Any:
    try:
        return _WIDER.get(value, value)
    except TypeError:  # unhashable (a list, a dict): no dtype
        return value


class Float64Casts(torch.overrides.TorchFunctionMode):
    """A float64 model whose forward casts to float32 (`x.float()`, `.to(torch.float32)`, `.type(torch.FloatTensor)`,
    `dtype=torch.float32`) would fail on float32 activations against float64 weights, leaving no float64
    answer: each such cast is made to float64 instead. Casts to other dtypes (float16, integers) are kept."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(_wider(a) for a in args)
        kwargs = {k: _wider(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def placement_lines(cls, spec) -> list[str]:
    """Repro lines that put `module`, `args` and `kwargs` where the backend `spec` runs them, with the
    eager options the backend has (autocast keeps float32 weights; channels_last; threads; tf32)."""
    options = cls.options_of(spec)
    option = lambda name: getattr(options, name, None)  # noqa: E731 - compile and torchscript lack some
    dtype = "None" if option("autocast") else f"torch.{spec.dtype}"
    lines = [f'module = module.to("{spec.device}"{"" if option("autocast") else f", {dtype}"})',
             f'args, kwargs = cast(args, "{spec.device}", {dtype}), cast(kwargs, "{spec.device}", {dtype})']
    if option("channels_last"):
        lines += ["module = module.to(memory_format=torch.channels_last)",
                  "args = [a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) "
                  "and a.dim() == 4 else a for a in args]"]
    if option("threads"):
        lines.append(f"torch.set_num_threads({option('threads')})")
    if option("tf32") is not None:
        lines.append(f"torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = {option('tf32')}")
    return lines


def call_lines(fn: str, context: str | None = None) -> list[str]:
    """Repro lines that call `fn` as the eager backends do: under inference mode (and `context`)."""
    return [f"with torch.inference_mode(){f', {context}' if context else ''}:", f"    out = {fn}(*args, **kwargs)"]
