"""OpenVINO as LLMs are deployed with it (`pip install 'parity[optimum-openvino]'`): optimum-intel's stateful export
of the reference (`OVModelForCausalLM`, `export=True`: the KV cache held inside the compiled model as state), with
NNCF's weight compression for `quantize: {scheme: nncf-int8}` (int8 per channel) or `nncf-int4` (int4 in groups of
`group_size` weights, `ratio` of the layers in int4 and the rest in int8, `symmetric` or with zero points), run
through optimum-intel.

Not the `openvino` backend: that one converts the Python forward of any module (the uncached graph parity's other
exporters see) with OpenVINO's own converter and compiles it; this one runs the artifact a user ships for an LLM,
transformers' model as optimum-intel exports it, its cache and its compressed weights included.

The artifact (cached like every export, `Backend.artifact`): the reference written as a Hugging Face folder
(backends/llm.py), exported and compressed by optimum-intel and saved as its IR. The inference precision is pinned to
the target's dtype, and so is the KV cache's (OpenVINO's CPU plugin otherwise keeps the cache in u8 on its own):
`options: {kv_cache_precision: u8}` checks that compression too. `run` is one call of the stateful model on the
whole sequence from an empty state, every position's logits returned as `{"logits": float32 [B, T, vocab]}` like the
transformers model's; `decode` (`CachedDecoding`) a prefill, then one token at a time through its state.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import Backend, Decoded, not_installed, runtime_threads
from parity.backends.llm import decoder_problem, hf_folder
from parity.config.schema import MAX_THREADS
from parity.dtypes import QUANTIZE_SCHEMES
from parity.errors import ParityError, first_line
from parity.inputs import Inputs

SCHEME_PREFIX = "nncf-"
PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
RUNTIME = "optimum-intel's OpenVINO export"


class OptimumOpenVinoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(default=128, ge=-1)  # nncf-int4: weights sharing one scale (-1: one group per channel)
    ratio: float = Field(default=1.0, gt=0, le=1)  # nncf-int4: the share of layers in int4 (the rest in int8)
    symmetric: bool = False  # nncf-int4/int8: without zero points
    kv_cache_precision: Literal["f32", "bf16", "f16", "u8"] | None = None  # None: the target's dtype
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)


QUANTIZATION_OPTIONS = ("group_size", "ratio", "symmetric")


class OptimumOpenVinoBackend(Backend):
    name = "optimum-openvino"
    dtypes = tuple(PRECISION)
    Options = OptimumOpenVinoOptions
    preparation_cost = 2  # an export
    specializes_on_example = False  # the stateful model runs any length
    libraries = ("torch", "transformers", "optimum_intel", "optimum", "openvino", "nncf", "numpy")
    quantize_schemes = tuple(s for s in QUANTIZE_SCHEMES if s.startswith(SCHEME_PREFIX))
    session_options = ("kv_cache_precision", "threads")
    localizes = False  # it runs optimum-intel's graph: no module of it to look inside
    model_kinds = ("module",)

    @classmethod
    def available(cls, spec) -> str | None:
        return not_installed("optimum.intel", "'parity[optimum-openvino]'", "optimum-intel") or \
            not_installed("openvino", "'parity[optimum-openvino]'") or \
            (not_installed("nncf", "'parity[optimum-openvino]'") if spec.quantize is not None else None) or \
            _unmet("optimum-intel")

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        given = [k for k in QUANTIZATION_OPTIONS if k in spec.options]
        if given and spec.quantize is None:
            return (f"target {spec.id}: {', '.join(given)} set NNCF's weight compression: give quantize: "
                    "{scheme: nncf-int4} (or nncf-int8) with them")
        if given and spec.quantize.scheme == "nncf-int8" and set(given) - {"symmetric"}:
            return f"target {spec.id}: nncf-int8 compresses every layer per channel; group_size and ratio are nncf-int4's"
        return None

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        problem = decoder_problem(model, RUNTIME)
        if problem is not None:
            raise ParityError(f"target {self.spec.id}: {problem}")
        scheme = self.spec.quantize.scheme.removeprefix(SCHEME_PREFIX) if self.spec.quantize else "float"
        folder = self.artifact(f"optimum-openvino-{scheme}", model, example, lambda out: self._build(model, out))
        from optimum.intel import OVModelForCausalLM

        precision = PRECISION[self.spec.dtype]
        config = {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": self.options.kv_cache_precision or precision,
                  "INFERENCE_NUM_THREADS": str(runtime_threads(self.options.threads)), "CACHE_DIR": ""}
        self.model = OVModelForCausalLM.from_pretrained(folder, ov_config=config, device="CPU", compile=True)

    def _build(self, model: torch.nn.Module, folder: Path) -> None:
        """optimum-intel's stateful export of `model`, its weights compressed by NNCF as the target says, in `folder`."""
        from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig

        options, quantize = self.options, self.spec.quantize
        if quantize is None:
            compression = {"load_in_8bit": False}
        elif quantize.scheme == "nncf-int8":
            compression = {"quantization_config": OVWeightQuantizationConfig(bits=8, sym=options.symmetric)}
        else:
            compression = {"quantization_config": OVWeightQuantizationConfig(
                bits=4, sym=options.symmetric, group_size=options.group_size, ratio=options.ratio)}
        with hf_folder(model) as hf:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exported = OVModelForCausalLM.from_pretrained(hf, export=True, stateful=True, compile=False,
                                                                  local_files_only=True, **compression)
                    exported.save_pretrained(folder)
            except (ValueError, KeyError, NotImplementedError) as exc:  # an architecture or a setting it refuses
                raise ParityError(f"target {self.spec.id}: optimum-intel cannot export {type(model).__name__} "
                                  f"as asked: {first_line(exc)}") from exc
            except Exception as exc:
                if type(exc).__name__ != "InvalidGroupSizeError":  # nncf.errors': the group size must divide a width
                    raise
                raise ParityError(f"target {self.spec.id}: {group_size_problem(model, options.group_size)}") from exc

    def run(self, inputs: Inputs) -> Any:
        ids, mask = _ids_and_mask(inputs)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask)  # no past: the state is reset first
        return {"logits": out.logits.to(torch.float32).clone()}

    def decode(self, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None) -> Decoded:
        batch, length = prompt.shape
        tokens, logits = [], []
        with torch.no_grad():
            out = self.model(input_ids=prompt, attention_mask=torch.ones_like(prompt))
            for step in range(steps):
                scores = out.logits[:, -1].to(torch.float32).clone()
                token = forced[:, step] if forced is not None else scores.argmax(-1)
                tokens.append(token)
                logits.append(scores)
                if step + 1 < steps:
                    out = self.model(input_ids=token[:, None], past_key_values=out.past_key_values,
                                     attention_mask=torch.ones(batch, length + step + 1, dtype=torch.int64))
        return Decoded(torch.stack(tokens, 1).to(torch.int64) if tokens else torch.zeros(batch, 0, dtype=torch.int64),
                       torch.stack(logits, 1) if logits else torch.zeros(batch, 0, 0))

    def close(self) -> None:
        self.model = None
        super().close()


def _unmet(distribution: str) -> str | None:
    """An installed library that `distribution` bounds and whose installed version is out of its bounds (optimum-intel
    2.2 takes transformers < 5.6 and fails to import beside a newer one), found from the metadata, without importing."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    for text in requires(distribution) or ():
        requirement = Requirement(text)
        if requirement.marker is not None:  # an extra's, or another platform's
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            return (f"{distribution} needs {requirement.name}{requirement.specifier}, and {requirement.name} {installed} "
                    f"is installed (pip install 'parity[optimum-openvino]' in an environment of its own)")
    return None


def _ids_and_mask(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    kwargs = dict(inputs.kwargs)
    ids = kwargs.pop("input_ids", None)
    if ids is None and len(inputs.args) == 1:
        ids = inputs.args[0]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ValueError(f"{RUNTIME} takes token ids: an `input_ids` tensor [batch, tokens] of integers")
    mask = kwargs.pop("attention_mask", None)
    return ids.to(torch.int64), None if mask is None else mask.to(torch.int64)


def group_size_problem(model: torch.nn.Module, group_size: int) -> str:
    """Why NNCF refuses int4 groups of `group_size` weights on `model`, and the option that works: NNCF groups each
    linear layer's weights along its input width, which the group size must divide (SmolLM2-135M's 576 does not
    divide by the default 128)."""
    widths = sorted(set(_input_widths(model)))
    odd = [w for w in widths if w % group_size]
    said = f"nncf-int4's group_size {group_size} does not divide the input width of each of the model's linear layers"
    if not odd:  # no linear layer parity can read the width of (or NNCF grouped another axis): its words, not a guess
        return said + ": set options: {group_size: -1} (one group per channel) or a group size that divides them"
    common = math.gcd(*widths)
    fits = max(g for g in (2 ** k for k in range(group_size.bit_length())) if common % g == 0)
    return (f"{said} ({', '.join(map(str, odd))} of the widths {', '.join(map(str, widths))}): set options: "
            f"{{group_size: {fits}}} (the largest power of two below {group_size} that divides every width) or "
            "{group_size: -1} (one group per channel)")


def _input_widths(model: torch.nn.Module):
    """Each linear layer's input width: torch's Linear, and transformers' Conv1D (GPT-2's, its weight [in, out])."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            yield module.in_features
        elif type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
            yield module.weight.shape[0]
