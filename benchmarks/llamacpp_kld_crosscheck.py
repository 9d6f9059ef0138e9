"""parity's text-generation statistics against llama.cpp's own `llama-perplexity --kl-divergence`, on the same
two GGUF models and the same tokens: they must agree to 3 significant digits.

llama-perplexity is run twice: with `--kl-divergence-base` on the base model (it tokenizes the text, cuts it into
`--chunks` windows of `-c` tokens and stores the base's log probabilities of every scored position, with the
tokens, in one file), then with `--kl-divergence` on the quantized model (Q), which prints the table. parity's
numbers come from the same two GGUF files run through llama-cpp-python (`Llama(logits_all=True)`) on the tokens
read back from that file (each window's first token made the BOS when the vocabulary adds one, as perplexity.cpp
does), judged by `parity.verify.tasks.text_generation.evaluate`, the function tier 3 runs, with the base as the
reference and Q as the target. Only the second half of each window is kept on the parity side (it scores no
other position: perplexity.cpp's `first = n_ctx/2`), which halves the memory.

What differs by design: llama.cpp stores the base's log probabilities in 16 bits (within 16 nats of the largest)
and sums in float32 per position; parity computes in float64. Those roundings are far below 3 significant digits
of a mean over a thousand positions.

    .venv/bin/python benchmarks/llamacpp_kld_crosscheck.py --tools /tmp/llama-tools/bin \\
        --base /tmp/smollm2-F16.gguf --quantized /tmp/smollm2-Q4_K_M.gguf [--ctx 512 --chunks 8] [--json OUT]

The text: the standard library's pydoc_data/topics.py (Python's documentation, English prose, read as parity's
`text_file: {package: pydoc_data, path: topics.py}` reads it), written to a file for llama-perplexity.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from parity.config.schema import PackageFile
from parity.inputs import Inputs
from parity.inputs.text import read_text
from parity.verify.tasks.text_generation import TextGenerationThresholds, evaluate

# llama-perplexity's summary lines -> parity's metric, and the scale parity's value is printed at (percent: 100).
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


def llama_perplexity(tools: Path, args: list[str]) -> str:
    """Run llama-perplexity; its log (the table is on stderr and stdout together)."""
    done = subprocess.run([str(tools / "llama-perplexity"), *args], capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"llama-perplexity {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def parse_table(log: str) -> dict[str, tuple[str, str | None]]:
    """llama-perplexity's final statistics: metric -> (its value, its ± if printed), as printed."""
    found = {}
    for line in log.splitlines():
        for label, (key, _) in LINES.items():
            if line.startswith(label) and ":" in line:
                numbers = re.findall(NUMBER, line.split(":", 1)[1])
                if numbers:
                    found[key] = (numbers[0], numbers[1] if len(numbers) > 1 else None)
    return found


def agree(printed: str, ours: float | None, scale: float) -> bool:
    """Whether parity's value (scaled as llama-perplexity prints it) agrees with the printed one to 3 significant
    digits (within half a unit of the third), or to every digit printed where llama-perplexity prints fewer."""
    if ours is None:
        return False
    theirs, ours = float(printed), ours * scale
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    if abs(theirs - ours) <= 0.5 * 10 ** -decimals:  # every digit it prints
        return True
    if theirs == 0:
        return False
    return abs(theirs - ours) <= 0.5 * 10 ** (math.floor(math.log10(abs(theirs))) - 2)


def read_base_file(path: Path) -> tuple[int, int, int, np.ndarray]:
    """The header of a `--kl-divergence-base` file: n_ctx, n_vocab, n_chunk and the tokens [n_chunk * n_ctx]."""
    with path.open("rb") as f:
        if f.read(8) != b"_logits_":
            sys.exit(f"{path}: not a llama-perplexity logits file")
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype=np.int32)
    return n_ctx, n_vocab, n_chunk, tokens


def second_halves(model: Path, windows: np.ndarray, threads: int) -> torch.Tensor:
    """llama-cpp-python's logits of every window [windows, n_ctx - n_ctx/2, vocabulary], positions n_ctx/2 on."""
    from llama_cpp import Llama

    n_ctx = windows.shape[1]
    llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=threads,
                verbose=False)
    out = []
    for window in windows:
        llm.reset()
        llm.eval(window.tolist())
        out.append(torch.from_numpy(np.array(llm.scores[n_ctx // 2:n_ctx], dtype=np.float32)))
    del llm
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=Path, required=True, help="the folder of llama-perplexity")
    parser.add_argument("--base", type=Path, required=True, help="the base GGUF (the reference)")
    parser.add_argument("--quantized", type=Path, required=True, help="the quantized GGUF (the target)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="append the rows here as one JSON line")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "topics.txt"
        text.write_text(read_text(PackageFile(package="pydoc_data", path="topics.py"), None), encoding="utf-8")
        base_file = Path(tmp) / "base.kld"
        common = ["-f", str(text), "-c", str(args.ctx), "-b", str(args.ctx), "--chunks", str(args.chunks),
                  "-t", str(args.threads)]
        started = time.perf_counter()
        llama_perplexity(args.tools, ["-m", str(args.base), *common, "--kl-divergence-base", str(base_file)])
        log = llama_perplexity(args.tools, ["-m", str(args.quantized), *common, "--kl-divergence-base",
                                            str(base_file), "--kl-divergence"])
        llama_s = time.perf_counter() - started
        n_ctx, _, n_chunk, tokens = read_base_file(base_file)
    theirs = parse_table(log)
    windows = tokens.reshape(n_chunk, n_ctx).copy()
    from llama_cpp import Llama

    bos = Llama(model_path=str(args.base), vocab_only=True, verbose=False).token_bos()
    if bos >= 0 and windows[0, 0] == bos:  # the vocabulary adds a BOS: every window starts with it (perplexity.cpp)
        windows[:, 0] = bos
    started = time.perf_counter()
    reference = second_halves(args.base, windows, args.threads)
    target = second_halves(args.quantized, windows, args.threads)
    ids = torch.from_numpy(windows[:, n_ctx // 2:].astype(np.int64))
    inputs = Inputs((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    mine = evaluate({"logits": reference}, {"logits": target}, TextGenerationThresholds(), 0.0, inputs=inputs).metrics
    parity_s = time.perf_counter() - started

    rows = []
    print(f"{n_chunk} windows of {n_ctx} tokens, {mine['positions']} scored positions "
          f"(llama-perplexity {llama_s:.0f} s, parity via llama-cpp-python {parity_s:.0f} s)")
    print("| statistic | llama-perplexity | parity | agree |\n|---|---|---|---|")
    for key, (value, pm) in theirs.items():
        scale = next(s for k, s in LINES.values() if k == key)
        pairs = [(key, value)] + ([(f"{key}_se", pm)] if pm is not None else [])
        for name, printed in pairs:
            ours = mine.get(name)
            ok = agree(printed, ours, scale)
            rows.append({"statistic": name, "llama": printed, "parity": ours, "agree": ok})
            shown = "nan" if ours is None else f"{ours * scale:.6g}"
            print(f"| {name} | {printed} | {shown} | {'yes' if ok else 'NO'} |")
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"base": args.base.name, "quantized": args.quantized.name, "ctx": n_ctx,
                                "chunks": n_chunk, "positions": mine["positions"], "rows": rows}) + "\n")
    sys.exit(0 if all(r["agree"] for r in rows) else 1)


if __name__ == "__main__":
    main()
