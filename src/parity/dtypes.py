"""The number formats a target runs in, one table each: the float dtypes and the quantize schemes.

The schema (which names a file may give), the tolerance policy (which side of a pair is less precise, and
what a reduced dtype is judged at), the target grammar (`eager-cpu-bfloat16`, `-int8-pt2e-x86`), the fallback
(float32 islands in a reduced model) and the backends all read these facts here. It sits in the core so that
the schema, below the backends, can read it too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    precision: int  # ranks the dtypes: a pair is judged at the default of its less precise side
    # torch.testing.assert_close's (rtol, atol) for a reduced-precision dtype; None: float32 and float64, judged
    # at the experiment's tolerances
    default_tolerance: tuple[float, float] | None = None

    @property
    def reduced(self) -> bool:
        """Below float32: judged at torch.testing's default for it; `parity fallback` runs modules in float32."""
        return self.default_tolerance is not None


# In the order messages list them.
FLOATS = {d.name: d for d in (DType("float32", 2), DType("float64", 3), DType("bfloat16", 1, (1.6e-2, 1e-5)),
                              DType("float16", 1, (1e-3, 1e-5)))}
DTYPES = tuple(FLOATS)
REDUCED = tuple(name for name, d in FLOATS.items() if d.reduced)


@dataclass(frozen=True)
class QuantizeScheme:
    """A `quantize:` scheme of a target (backends/quantize.py runs them)."""

    name: str
    word: str  # what it adds to a target's id (`compile-cpu-int8-pt2e-x86`), as `parity check --target` takes it
    # The PT2E flow: exported, activations quantized with ranges observed on an input set (`calibration:`);
    # False: torchao's quantize_ on the module tree, nothing observed.
    calibrated: bool
    libraries: tuple[str, ...]  # the distributions it needs (found without importing them)
    # Its default gate, scale-aware: this fraction of the reference output's RMS (each check's own), since an atol
    # meant for float32 rounding (1e-4) fails every quantized model whatever its quality; the sweep keeps
    # float32's atols, so the verdict at 1e-4 is still reported. A target's own gate wins.
    relative_gate: float = 0.05
    # True: backends/quantize.py quantizes the torch module; False: the target's runtime quantizes its own file
    # (llama.cpp's quantizer), and only that backend runs it
    in_torch: bool = True


# Set from one measurement (a seeded CNN with attention, 2x3x16x16, torchao weight-only): the largest error was 0.8% of
# the output's rms in int8 and 11% in int4, so these pass that model with room, and fail a layer gone wrong.
INT8_GATE, INT4_GATE = 0.05, 0.2
LLAMACPP_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0", "IQ4_NL",
                  "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
QUANTIZE_SCHEMES = {s.name: s for s in (
    QuantizeScheme("pt2e-x86", "int8-pt2e-x86", True, ("torchao",), INT8_GATE),
    QuantizeScheme("pt2e-xnnpack", "int8-pt2e-xnnpack", True, ("torchao", "executorch"), INT8_GATE),
    QuantizeScheme("torchao-int8-dynamic", "int8-dynamic", False, ("torchao",), INT8_GATE),
    QuantizeScheme("torchao-int8-weight", "int8-weight", False, ("torchao",), INT8_GATE),
    QuantizeScheme("torchao-int4-weight", "int4-weight", False, ("torchao",), INT4_GATE),
    # llama.cpp's quantizer's file types (backends/llamacpp.py): the types it makes without an importance matrix;
    # 8 and 6 bits at int8's gate, fewer at int4's
    *(QuantizeScheme(f"llamacpp-{t}", t.lower(), False, ("llama_cpp", "gguf"),
                     INT8_GATE if t[:2] in ("Q8", "Q6") else INT4_GATE, in_torch=False) for t in LLAMACPP_TYPES),
    # ONNX Runtime GenAI's model builder's weight-only blockwise quantization (MatMulNBits: backends/ortgenai.py)
    QuantizeScheme("ortgenai-int8", "int8-block", False, ("onnxruntime_genai",), INT8_GATE, in_torch=False),
    QuantizeScheme("ortgenai-int4", "int4-block", False, ("onnxruntime_genai",), INT4_GATE, in_torch=False),
    # NNCF's weight compression of optimum-intel's OpenVINO export (backends/openvino_llm.py)
    QuantizeScheme("nncf-int8", "int8-nncf", False, ("optimum", "nncf", "openvino"), INT8_GATE, in_torch=False),
    QuantizeScheme("nncf-int4", "int4-nncf", False, ("optimum", "nncf", "openvino"), INT4_GATE, in_torch=False),
)}
