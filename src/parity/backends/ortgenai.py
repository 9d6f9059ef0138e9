"""ONNX Runtime GenAI on the CPU (`pip install 'parity[onnxruntime-genai]'`): the reference exported by its model
builder (the ONNX decoder with its KV cache, GroupQueryAttention and, quantized, MatMulNBits weights that
ONNX Runtime GenAI deploys), run through its generator.

The artifact (cached like every export, `Backend.artifact`): the reference written as a Hugging Face folder
(backends/llm.py) and handed to `onnxruntime_genai.models.builder.create_model` for the CPU, at the target's
precision: `dtype: float32` (fp32), or `quantize: {scheme: ortgenai-int4}` / `ortgenai-int8`, the builder's
weight-only blockwise quantization (MatMulNBits; `options: {block_size: 32, symmetric: true, accuracy_level: N}` are
its `block_size`, `is_symmetric` and `accuracy_level`: on the CPU its default 4 computes with int8 activations). A
model whose architecture the builder has no exporter for (GPT-2) is refused in one line with the builder's reason.

How it runs, in a worker process of its own by default (backends/ortgenai_worker.py; `in_process: true` runs it
here): `run` feeds each sequence to a fresh generator as one prompt and returns every position's logits as `{"logits":
float32 [B, T, vocab]}` like the transformers model's (tier 1, tier 3's teacher-forced statistics); `decode`
(`CachedDecoding`) is the generator's own loop, a prefill then one token at a time through its KV cache. An abort in
C++ ends the worker only: the execution is a `crash` (taxonomy.WorkerDied).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import Backend, Decoded, not_installed, runtime_threads
from parity.backends.llm import decoder_problem, hf_folder, token_ids
from parity.backends.worker import LogitsReply, R, Reply, WorkerProcess, script_in_process
from parity.config.schema import MAX_THREADS
from parity.dtypes import QUANTIZE_SCHEMES
from parity.errors import ParityError, first_line
from parity.inputs import Inputs

WORKER = Path(__file__).with_name("ortgenai_worker.py")
RUNTIME = "ONNX Runtime GenAI"
SCHEME_PREFIX = "ortgenai-"
PRECISIONS = {"float32": "fp32"}  # the builder's precisions this backend runs on the CPU, by dtype


QUANTIZATION_OPTIONS = ("block_size", "symmetric", "accuracy_level")


class DecodeReply(LogitsReply):
    """The reply to `decode`: each sequence's chosen tokens, besides its logits' shape."""
    tokens: list[list[int]]


class OrtGenAIOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_size: Literal[16, 32, 64, 128, 256] = 32  # a quantized target's block (group) of weights sharing a scale
    symmetric: bool = True  # int4/int8 (True) or uint4/uint8 with a zero point (False)
    accuracy_level: Literal[1, 2, 3, 4] | None = None  # MatMulNBits' compute type (None: the builder's, 4 on the CPU)
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    in_process: bool = False  # True: the runtime in parity's own process (an abort in C++ then ends the run)


def precision(spec) -> str:
    """The model builder's `precision` for a target."""
    if spec.quantize is not None:
        return spec.quantize.scheme.removeprefix(SCHEME_PREFIX)
    return PRECISIONS[spec.dtype]


class OrtGenAIBackend(Backend):
    name = "onnxruntime-genai"
    dtypes = tuple(PRECISIONS)
    Options = OrtGenAIOptions
    preparation_cost = 2  # an export
    specializes_on_example = False  # the generator runs any length
    libraries = ("torch", "transformers", "onnxruntime_genai", "onnxruntime", "onnx_ir", "numpy")
    quantize_schemes = tuple(s for s in QUANTIZE_SCHEMES if s.startswith(SCHEME_PREFIX))
    session_options = ("threads", "in_process")
    localizes = False  # it runs the builder's own graph: no module of it to look inside
    model_kinds = ("module",)

    @classmethod
    def available(cls, spec) -> str | None:
        return not_installed("onnxruntime_genai", "'parity[onnxruntime-genai]'", "onnxruntime-genai") or \
            not_installed("transformers", "'parity[onnxruntime-genai]'")

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        given = [k for k in QUANTIZATION_OPTIONS if k in spec.options]
        if given and spec.quantize is None:
            return (f"target {spec.id}: {', '.join(given)} set the model builder's weight quantization: give "
                    "quantize: {scheme: ortgenai-int4} (or ortgenai-int8) with them")
        return None

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        problem = decoder_problem(model, RUNTIME)
        if problem is not None:
            raise ParityError(f"target {self.spec.id}: {problem}")
        token_ids(example, RUNTIME)
        folder = self.artifact(f"ortgenai-{precision(self.spec)}", model, example, lambda out: self._build(model, out))
        self.runtime = _GenAIRuntime(self.options.in_process)
        self.runtime.request({"op": "load", "folder": str(folder), "threads": runtime_threads(self.options.threads)})

    def _build(self, model: torch.nn.Module, folder: Path) -> None:
        """The model builder's export of `model` into `folder` (its model.onnx, weights and genai_config.json)."""
        options = self.options
        extra: dict[str, Any] = {"hf_token": "false", "hf_remote": "false"}
        if self.spec.quantize is not None:
            extra.update(block_size=str(options.block_size), is_symmetric=str(options.symmetric).lower())
            if options.accuracy_level is not None:
                extra["accuracy_level"] = str(options.accuracy_level)
        with hf_folder(model) as hf:
            try:
                build_model(hf, folder, precision(self.spec), extra, hf.parent / "cache")
            except NotImplementedError as exc:  # the builder's own word for an architecture it has no exporter for
                reason = first_line(exc).replace(str(hf), type(model).__name__)
                raise ParityError(f"target {self.spec.id}: ONNX Runtime GenAI's model builder cannot export "
                                  f"{type(model).__name__}: {reason}") from exc

    def run(self, inputs: Inputs) -> Any:
        tokens = token_ids(inputs, RUNTIME)
        header, payload = self.runtime.request({"op": "logits", "tokens": tokens.tolist()}, LogitsReply)
        return {"logits": _floats(payload, header.shape)}

    def decode(self, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None) -> Decoded:
        header, payload = self.runtime.request({"op": "decode", "prompt": prompt.tolist(), "steps": steps,
                                                "forced": None if forced is None else forced.tolist()},
                                               DecodeReply)
        return Decoded(torch.tensor(header.tokens, dtype=torch.int64).reshape(prompt.shape[0], steps),
                       _floats(payload, header.shape))

    def close(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()
            self.runtime = None
        super().close()


def build_model(hf: Path, out: Path, precision: str, extra: dict[str, str], cache: Path) -> None:
    """onnxruntime_genai's model builder on the folder `hf`, for the CPU, its console output (prints, progress bars)
    kept quiet."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from onnxruntime_genai.models import builder

        options = builder.parse_extra_options(None, str(hf), str(out), precision, "cpu", str(cache),
                                              [f"{k}={v}" for k, v in extra.items()])
        options["hf_details"] = builder.get_hf_details(None, str(hf), str(cache), options)
        builder.create_model(None, str(hf), str(out), precision, "cpu", str(cache), **options)


def _floats(payload: bytes, shape: tuple[int, ...]) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.frombuffer(payload, dtype=np.float32).reshape(shape).copy())


class _GenAIRuntime:
    """ONNX Runtime GenAI behind one request/reply interface: in a worker process (default), or in this process."""

    def __init__(self, in_process: bool):
        self.process = None
        self.local = None
        if in_process:
            self.local = script_in_process(WORKER, "parity_ortgenai_worker").GenAIWorker(None)
        else:
            self.process = WorkerProcess(WORKER, RUNTIME)

    def request(self, message: dict, reply: type[R] = Reply) -> tuple[R, bytes]:
        """The reply to `message`, as `reply`, and its raw payload; in this process the worker script's own handling."""
        if self.local is None:
            return self.process.request(message, reply)
        try:
            header, payload = self.local.handle(message)
        except Exception as exc:  # as the worker process says it
            raise RuntimeError(f"{RUNTIME}: {type(exc).__name__}: {exc}") from exc
        return reply.model_validate(header), payload

    def close(self) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            process.close()
        self.local = None
