"""What one mixed GGUF file costs a tensor-group search (runner/tensor_types.py): `write_mixed` from two conversions
read afresh for each mix (as the backend did before it kept its readers) against the same mixes from readers parsed
once (`LlamaCppBackend._reader`), with the sha256 of each mix: the same bytes both ways, so no number a search
reports changes. Give the target's conversion and the higher one (e.g. the cached Q4_K_M and F16 `model.gguf` of
SmolLM2 in an artifact cache after `parity localize examples/smollm2.yaml --target llamacpp-cpu-q4_k_m`):

    .venv/bin/python benchmarks/llamacpp_mix_cost.py LOW.gguf HIGH.gguf [--keep blk.29 --keep blk.29,blk.18,token_embd]

It prints the seconds of each step and the load average beside it (the machine is shared: compare the two ways
within one run)."""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    import gguf

    from parity.backends.llamacpp import write_mixed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("low", type=Path)
    parser.add_argument("high", type=Path)
    parser.add_argument("--keep", action="append", help="comma-separated groups kept at the higher type (repeatable)")
    args = parser.parse_args()
    keeps = [k.split(",") for k in (args.keep or ["blk.29", "blk.29,blk.18,token_embd"])]
    print(f"load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "mixed.gguf"
        digests = {}
        for way in ("read afresh", "read once"):
            if way == "read once":
                start = time.perf_counter()
                readers = gguf.GGUFReader(args.low), gguf.GGUFReader(args.high)
                print(f"{way}: parsing both files once: {time.perf_counter() - start:.1f} s")
            for keep in keeps:
                start = time.perf_counter()
                write_mixed(*((args.low, args.high) if way == "read afresh" else readers), keep, out)
                spent = time.perf_counter() - start
                digests.setdefault(tuple(keep), set()).add(hashlib.sha256(out.read_bytes()).hexdigest())
                print(f"{way}: mix keeping {','.join(keep)}: {spent:.1f} s, {out.stat().st_size} bytes")
        same = all(len(d) == 1 for d in digests.values())
        print(f"the same bytes both ways: {same}; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
