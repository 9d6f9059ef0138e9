#!/bin/sh
# Reproducibility of the float32 detector decisions (issue #27): study/detectors_float32.yaml run twice on
# this commit, with one torch thread and with two, each with a cold cache, then compared check by check.
# Prepared; docs/study.md says it has not run. About 25 min on 2 cores (the detectors' compile dominates).
set -eu
for threads in 1 2; do
    rm -rf "parity-out/repro-t$threads" "parity-out/cache-repro-t$threads"
    OMP_NUM_THREADS=$threads nice -n 15 parity run study/detectors_float32.yaml \
        --out "parity-out/repro-t$threads" --cache-dir "parity-out/cache-repro-t$threads" || true  # failures are data
done
python study/compare_runs.py parity-out/repro-t1 parity-out/repro-t2
