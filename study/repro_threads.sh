#!/bin/sh
# Reproducibility of the float32 detector decisions (issue #27): study/detectors_float32.yaml run twice on
# this commit, with one torch thread and with two, each with a cold cache, then compared check by check.
# Arguments go to `parity run` (`--model NAME --target NAME` runs a part of it: say which in the study).
# All of it: about 25 min on 2 idle cores (the detectors' compile dominates).
set -eu
for threads in 1 2; do
    rm -rf "parity-out/repro-t$threads" "parity-out/cache-repro-t$threads"
    mkdir -p "parity-out/repro-t$threads"
    OMP_NUM_THREADS=$threads nice -n 15 /usr/bin/time -v -o "parity-out/repro-t$threads/time.txt" \
        .venv/bin/parity run study/detectors_float32.yaml --out "parity-out/repro-t$threads" \
        --cache-dir "parity-out/cache-repro-t$threads" "$@" || true  # failures are data
done
.venv/bin/python study/compare_runs.py parity-out/repro-t1 parity-out/repro-t2
