"""Does hierarchical localization name the right module on transformer stacks (issue 37)? Fourteen constructed cases
with their expected answers: attention, norms, RoPE, masks, quantized causal LMs, float16/bfloat16, ONNX Runtime and
torch.compile.

Each case is a tiny seeded model (tests/fixtures/stacks.py: a decoder of two pre-norm blocks, a LlamaForCausalLM from
a two-layer LlamaConfig, an nn.MultiheadAttention) and a target whose difference is constructed, never a backend's
drift: float16/bfloat16 arithmetic that overflows or loses integers on any CPU, a fault injected on the target only
(tests/fixtures/faults.py: while FaultyEager runs, while torch.compile traces, while torch.export exports for ONNX
Runtime), or every Linear weight quantized int8 per channel (Int8WeightsEager). The expected answer says where the
error is made, known from the construction:
- a module name: the culprit must be that module (own code or not);
- a repeated path (`blocks.*.attn`): the same submodule in every block is at fault, and the localization must say
  the pattern (`repeated`), not one block's instance alone;
- `spread`: the error is made everywhere alike (whole-model quantization); the localization must say it is spread
  (`evenly_spread`), not pin it on one layer.

rtol and threshold are a reduced dtype's defaults (float16 1e-3 / 1e-5, bfloat16 1.6e-2 / 1e-5, torch.testing's),
else 1e-5 / 1e-4, as `parity run` would localize. Granularity "blocks", mode "both".

Run it from the repository root (about a minute, most of it the compile case):

    .venv/bin/python benchmarks/localization_transformers.py [--only NAME]

Against another checkout's parity (main), the fixtures from this one:

    PYTHONPATH=/tmp/tx-main/src .venv/bin/python benchmarks/localization_transformers.py
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # makes `tests.fixtures` importable, as tests/conftest.py does
    sys.path.insert(0, str(ROOT))

from tests.fixtures import stacks  # noqa: E402
from tests.fixtures.faults import inject  # noqa: E402

from parity.config.schema import BackendSpec  # noqa: E402
from parity.inputs import Inputs  # noqa: E402
from parity.runner.localization import localize  # noqa: E402
from parity.verify.localize import Localization  # noqa: E402

EAGER = BackendSpec(backend="eager")
FAULTY = BackendSpec(backend="tests.fixtures.faults:FaultyEager", name="faulty")
INT8 = BackendSpec(backend="tests.fixtures.stacks:Int8WeightsEager", name="int8-weights")
TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5)}  # rtol, threshold; else 1e-5, 1e-4


@dataclass
class Case:
    name: str
    build: Callable[[], tuple[torch.nn.Module, Inputs]]
    target: BackendSpec
    expected: str  # a module, a repeated path with `*`, or `spread`
    what: str


def _ids(n: int = 8, vocab: int = 32) -> Inputs:
    return Inputs((stacks.tokens(n, vocab),))


def _decoder(**kwargs) -> Callable[[], tuple[torch.nn.Module, Inputs]]:
    n = kwargs.pop("n", 8)
    return lambda: (stacks.decoder(seq=n, **kwargs), _ids(n))


def _faulted(build, faults: dict[str, float], condition: str = "flag"):
    def make():
        model, inputs = build()
        for name, magnitude in faults.items():
            inject(model, name, magnitude, condition)
        return model, inputs
    return make


def _overflowing():
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0))
    return stacks.overflowing(), Inputs((x,))


def _norm_overflow():
    """The last block's MLP writes values past 256 into the residual: the final RMSNorm's float16 sum of squares
    overflows (its rsqrt is 0), while every block's own norms see ordinary values."""
    model, inputs = _decoder()()
    with torch.no_grad():
        model.blocks[-1].mlp.down.weight.mul_(3000)
    return model, inputs


def _llama(layers: int = 2):
    return lambda: (stacks.llama(layers=layers), _ids(8, 64))


def _mha():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            h = self.proj(x)
            return self.head(self.attn(h, h, h, need_weights=False)[0])

    torch.manual_seed(0)
    return Net().eval(), Inputs((torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0)),))


CASES = [
    Case("fp16-qk-overflow", _overflowing, BackendSpec(backend="eager", dtype="float16"), "attn",
         "Q·K^T past 65504 in the attention's own code, before the 1/sqrt(d) scale"),
    Case("fp16-masked-row", _decoder(masked_row=3), BackendSpec(backend="eager", dtype="float16"), "blocks.*.attn",
         "float32's min as the additive mask of a whole row: -Inf in float16, softmax of the row NaN, in every block"),
    Case("fp16-rmsnorm-overflow", _norm_overflow, BackendSpec(backend="eager", dtype="float16"), "norm",
         "the final RMSNorm's sum of squares overflows float16"),
    Case("bf16-rope", _decoder(rotary=True, n=320), BackendSpec(backend="eager", dtype="bfloat16"),
         "blocks.*.attn.rotary", "RoPE angles from bfloat16 positions (past 256 not integers), in every block"),
    Case("fault-every-attn", _faulted(_decoder(), {"blocks.0.attn": 0.05, "blocks.1.attn": 0.08, "head": 1e-7}),
         FAULTY, "blocks.*.attn", "both blocks' attention off (5e-2, 8e-2), the head by 1e-7"),
    Case("fault-one-mlp", _faulted(_decoder(), {"blocks.1.mlp.up": 0.03}), FAULTY, "blocks.1.mlp.up",
         "one block's MLP projection off"),
    Case("int8-decoder", _decoder(), INT8, "spread", "every Linear int8 weight-only, per channel"),
    Case("int8-llama", _llama(), INT8, "spread", "a LlamaForCausalLM int8 weight-only, whole"),
    Case("llama-o_proj", _faulted(_llama(), {"lm.model.layers.1.self_attn.o_proj": 0.02}), FAULTY,
         "lm.model.layers.1.self_attn.o_proj", "one o_proj of a LlamaForCausalLM off"),
    Case("llama-every-down_proj", _faulted(_llama(3), {f"lm.model.layers.{i}.mlp.down_proj": 0.5 for i in range(3)}),
         FAULTY, "lm.model.layers.*.mlp.down_proj", "every block's down_proj of a LlamaForCausalLM off"),
    Case("llama-norm", _faulted(_llama(), {"lm.model.norm": 0.05}), FAULTY, "lm.model.norm",
         "the final LlamaRMSNorm off"),
    Case("mha", _faulted(_mha, {"attn": 0.05}), FAULTY, "attn", "an nn.MultiheadAttention off (its out_proj never called)"),
    Case("onnxruntime-mlp", _faulted(_decoder(), {"blocks.1.mlp.down": 0.05}, "exporting"),
         BackendSpec(backend="onnxruntime"), "blocks.1.mlp.down", "the exported graph's MLP projection off"),
    Case("compile-v", _faulted(_decoder(), {"blocks.0.attn.v": 0.05}, "compiling"),
         BackendSpec(backend="compile"), "blocks.0.attn.v", "torch.compile's traced v projection off"),
]


def answer(loc: Localization) -> str:
    """What the localization says, in the terms of the expected answers."""
    if loc.evenly_spread():
        return "spread"
    found = getattr(loc, "repeated", None)  # absent before issue 37
    if found:
        return found["pattern"]
    return str(loc.culprit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run only the case of this name")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.only in (None, c.name)]
    hits, start = 0, time.perf_counter()
    for case in cases:
        model, inputs = case.build()
        rtol, threshold = TOLERANCES.get(case.target.dtype, (1e-5, 1e-4))
        try:
            loc = localize(EAGER, case.target, model, inputs, rtol, threshold)
            said, verdict = answer(loc), loc.verdict()
        except Exception as exc:  # a case the code cannot run counts as a miss, with its reason
            loc, said, verdict = None, "error", f"{type(exc).__name__}: {exc}"[:300]
        hit = said == case.expected
        hits += hit
        elapsed = loc.elapsed_s if loc else 0.0
        print(f"{case.name:22s} expected {case.expected:34s} said {said:34s} {'hit' if hit else 'MISS':4s} {elapsed:5.1f}s",
              flush=True)
        if not hit:
            print(f"    ({case.what}) verdict: {verdict}")
    total = time.perf_counter() - start
    print(f"\n{hits}/{len(cases)} = {hits / max(len(cases), 1):.0%} named right (or said spread); total {total:.1f}s")
    return 0 if hits == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
