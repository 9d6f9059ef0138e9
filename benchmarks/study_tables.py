"""docs/study.md's tables, computed from a study run's records alone (nothing is typed in by hand).

The study document is prose with generated blocks between markers, `<!-- study:NAME -->` and
`<!-- /study:NAME -->`; this script rewrites every block from the records and refuses a document whose
blocks and this script's tables differ. The unit of every pass rate is the tier-1 check, one
(model, input set, target) at one gate: the primary verdicts are scale-free (float32: the largest difference
over the reference output's RMS; reduced precision: relative RMSE and tier 3), the absolute gates' the
secondary ones. Intervals: Wilson's (checks as independent trials) beside a BCa bootstrap over clusters of
checks (backbone families, or a family on one target), numpy-seeded. A target that is another target's
execution judged at another gate (bfloat16 at two gates) is counted once where the tables say so.

    .venv/bin/python benchmarks/study_tables.py                      # from the archives in docs/
    .venv/bin/python benchmarks/study_tables.py parity-out/study --archive   # a new run: archive it, then render

Four sources, each with its own blocks: the study's run (examples/study.yaml, the v2 design of issue #17;
blocks without a prefix), its per-layer survey (benchmarks/study_localize.py) and the adapter's fidelity
rows (benchmarks/adapter_fidelity.py --json), the trained models' run (study/trained.yaml; `trained-*`) and
the first run of the four-target design (`first-*`, archived, for comparison); beside them the study/
experiments of issue #27 (Experiments: the trained detector at scale, the SE control and some of its rows
measured again, one run at 1 and one at 2 threads). Every BCa interval is printed with its seed and written to
docs/study-intervals.jsonl with the clusters and draws it came from; `--recompute` draws each again.
`--archive` copies a run
folder's records into docs/ (compressed, the detection pictures' box lists dropped: the tables do not use
them) with its `time.txt` (GNU time's report of the run) and its survey, so the document can be regenerated
from the repository.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from parity.records import tolerance_key
from parity.records.summary import judged, latency_rows, summarize
from parity.taxonomy import MEANINGS, SEVERITY

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "study.md"
# The study's run (examples/study.yaml): its records, time and per-layer survey (benchmarks/study_localize.py:
# one line per float32 failure, its layers record's verdict).
ARCHIVE = ROOT / "docs" / "study-records.jsonl.gz"
TIME_ARCHIVE = ROOT / "docs" / "study-time.txt"
SURVEY_ARCHIVE = ROOT / "docs" / "study-localize.jsonl.gz"
# Some of the survey's checks localized again in v4, each layers record whole (its per-level tables included), with
# the commit and CPU its run recorded: the per-layer tables the survey's archive lacks.
RERUN_ARCHIVE = ROOT / "docs" / "study-localize-rerun.jsonl.gz"
# The deterministic NMS adapter's fidelity (benchmarks/adapter_fidelity.py --json), on the study's detectors
# and the trained one.
FIDELITY_ARCHIVE = ROOT / "docs" / "study-adapter-fidelity.jsonl"
# The first run (the four-target design, before issue #17), its own blocks (`first-*`).
FIRST_ARCHIVE = ROOT / "docs" / "study-v1-records.jsonl.gz"
FIRST_TIME_ARCHIVE = ROOT / "docs" / "study-v1-time.txt"
# What the survey's tables read of a layers record; its per-layer tables (levels, suspects) stay in the run folder.
SURVEY_FIELDS = ("model", "inputs", "target", "error", "threshold", "verdict", "culprit", "culprit_code", "whole_graph",
                 "as_a_whole", "evenly_spread", "first_divergent", "first_divergent_by", "elapsed_s", "tier1",
                 "wall_s", "module_types")
# The trained models' run (study/trained.yaml): its own records and time, its own blocks (`trained-*`).
TRAINED_ARCHIVE = ROOT / "docs" / "study-trained-records.jsonl.gz"
TRAINED_TIME_ARCHIVE = ROOT / "docs" / "study-trained-time.txt"
# The study/ experiments of issue #27 (Experiments): the trained detector at scale (study/detector_at_scale.py's rows
# at one and two threads), the SE control's per-block rows (study/se_control.py) and the records of
# study/repro_threads.sh's two runs (one thread, two threads).
DETECTOR_ARCHIVE = ROOT / "docs" / "study-detector-scale.jsonl.gz"
SE_ARCHIVE = ROOT / "docs" / "study-se-control.jsonl.gz"
SE_REPLICA_ARCHIVE = ROOT / "docs" / "study-se-replica.jsonl.gz"  # some of SE_ARCHIVE's rows measured again (v4)
REPRO_ARCHIVES = (ROOT / "docs" / "study-repro-t1-records.jsonl.gz", ROOT / "docs" / "study-repro-t2-records.jsonl.gz")
# The trained small language model's run (examples/llm.yaml, `make tiny-llm-demo`): tier 1 and text generation's tier 3.
LLM_ARCHIVE = ROOT / "docs" / "study-llm-records.jsonl.gz"
# SmolLM2-135M-Instruct on 1,020 positions of bundled prose (study/smollm2.yaml, v4): tier 1 and tier 3's statistics.
SMOLLM2_ARCHIVE = ROOT / "docs" / "study-smollm2-records.jsonl.gz"
SMOLLM2_TIME_ARCHIVE = ROOT / "docs" / "study-smollm2-time.txt"
# Every BCa interval docs/study.md prints, with the clusters, draws and seed it was drawn from (render() writes it
# beside the document; `--recompute` draws each again and compares the bits).
INTERVALS_ARCHIVE = ROOT / "docs" / "study-intervals.jsonl"

# The published study's figures, as issue #6 quotes them: 672 checks pooled over its tolerance sweep,
# 72.0% passing, each tolerance between 71.4% and 73.8%. They are the comparison, not a result of ours.
PUBLISHED = {"checks": 672, "pass_rate": 0.720, "per_tolerance_low": 0.714, "per_tolerance_high": 0.738}
# The first run's float32 targets: the like-for-like table restricts a run with more targets to them too.
FIRST_DESIGN_TARGETS = ("compile-cpu", "onnxruntime-cpu", "torchscript-cpu")
Z95 = 1.959963984540054  # the standard normal quantile of a two-sided 95% interval
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
# Builders that share a backbone: their checks share its layers, so one backbone family is one cluster of the
# intervals (a builder not listed is a family of its own). The detectors and segmentation models are named after
# the classifier whose trunk they build on (torchvision's own builders).
FAMILIES = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": "mobilenet_v3_large",
    "fasterrcnn_mobilenet_v3_large_fpn": "mobilenet_v3_large",
    "ssdlite320_mobilenet_v3_large": "mobilenet_v3_large",
    "lraspp_mobilenet_v3_large": "mobilenet_v3_large",
    "deeplabv3_mobilenet_v3_large": "mobilenet_v3_large",
    "retinanet_resnet50_fpn": "resnet50",
    "fcn_resnet50": "resnet50",
}
# The scale-free verdict: a float32 check passes when its largest difference is at most this fraction of its
# reference output's RMS (the worst leaf). The primary gate is the experiment's absolute gate read as a fraction
# of an output of unit scale, fixed by that number and not fitted to these results; the sweep shows the others.
SCALE_FREE_SWEEP = (1e-6, 1e-5, 1e-4, 1e-3)
SCALE_FREE_GATE = 1e-4


# ---------------------------------------------------------------------------------------------------
# reading


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run folder, a records.jsonl or a gzipped copy of one."""
    path = Path(path)
    if path.is_dir():
        path = path / "records.jsonl"
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def wall_time(text: str) -> dict[str, float] | None:
    """Wall-clock seconds and peak resident memory (MiB) from GNU time's `-v` report, or None."""
    elapsed = re.search(r"Elapsed \(wall clock\) time .*?: (?:(\d+):)?(\d+):([\d.]+)", text)
    if not elapsed:
        return None
    hours, minutes, seconds = elapsed.groups()
    result = {"wall_s": int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)}
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if peak:
        result["peak_mib"] = int(peak.group(1)) / 1024
    signal = re.search(r"Command terminated by signal (\d+)", text)
    if signal:
        result["signal"] = int(signal.group(1))
    for key, pattern in (("user_s", r"User time \(seconds\): ([\d.]+)"), ("system_s", r"System time \(seconds\): ([\d.]+)")):
        found = re.search(pattern, text)
        if found:
            result[key] = float(found.group(1))
    return result


# ---------------------------------------------------------------------------------------------------
# arithmetic


def wilson(passed: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion passed/total; (0, 1) when there is nothing to count."""
    if total == 0:
        return 0.0, 1.0
    p = passed / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    # At 0/n and n/n one bound is exactly 0 or 1; floating point would leave it a rounding error away.
    low = 0.0 if passed == 0 else max(0.0, centre - half)
    high = 1.0 if passed == total else min(1.0, centre + half)
    return low, high


def bca_bootstrap(clusters: list[tuple[int, int]], resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float]:
    """bca_interval's bounds; while render() runs, each interval is also logged with its clusters, draws and seed
    (the intervals archive), so that every bound the document prints re-computes bit for bit from those alone."""
    low, high = bca_interval(clusters, resamples, seed, level)
    if _drawn is not None:
        _drawn.append({"clusters": [[int(p), int(n)] for p, n in clusters], "resamples": resamples, "seed": seed,
                       "level": level, "low": low, "high": high})
    return low, high


def bca_cell(clusters: list[tuple[int, int]], count: bool = True) -> str:
    """A BCa interval as the tables print it, its seed beside it (and the number of clusters, with `count`)."""
    return _bca_text(*bca_bootstrap(clusters), len(clusters) if count else None)


def _bca_text(low: float, high: float, clusters: int | None) -> str:
    return f"{100 * low:.1f}% to {100 * high:.1f}% ({'' if clusters is None else f'{clusters}; '}seed {BOOTSTRAP_SEED})"


# Every BCa interval drawn while render() runs (None otherwise): INTERVALS_ARCHIVE's lines.
_drawn: list[dict[str, Any]] | None = None


def bca_interval(clusters: list[tuple[int, int]], resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float]:
    """A bias-corrected and accelerated (BCa) 95% interval of a pass rate whose independent units are clusters,
    each (passes, checks): whole clusters are drawn with replacement, each draw's rate is its passes over its
    checks; the bias correction comes from the draws, the acceleration from the jackknife over clusters (Efron
    1987), which is what keeps the interval honest with the 14 to 21 clusters a study has, where a percentile
    interval under-covers. Seeded (numpy), so the document regenerates byte for byte. A single cluster, or
    every cluster at one rate, has nothing to vary: the interval is the point. (0, 1) with no checks. The draws are
    numpy's default generator (PCG64) seeded with `seed`, one `integers` call of shape (resamples, clusters), and
    the bounds are `np.quantile`'s default (linear) at BCa's adjusted levels: with the same clusters, draws and seed,
    any machine gets the same bits. The bounds move with the seed where the draws' rates are few (14 clusters), so
    a bound is quoted with its seed."""
    passes = np.array([p for p, n in clusters if n], dtype=float)
    counts = np.array([n for _p, n in clusters if n], dtype=float)
    if not counts.size:
        return 0.0, 1.0
    theta = passes.sum() / counts.sum()
    draws = np.random.default_rng(seed).integers(0, counts.size, size=(resamples, counts.size))
    rates = passes[draws].sum(axis=1) / counts[draws].sum(axis=1)
    if np.all(rates == rates[0]):
        return float(theta), float(theta)
    z0, accel = bca_parameters(passes, counts, rates)
    normal = NormalDist()
    bounds = []
    for tail in ((1 - level) / 2, (1 + level) / 2):
        z = z0 + normal.inv_cdf(tail)
        bounds.append(float(np.quantile(rates, normal.cdf(z0 + z / (1 - accel * z)))))
    return bounds[0], bounds[1]


def bca_parameters(passes: np.ndarray, counts: np.ndarray, rates: np.ndarray) -> tuple[float, float]:
    """BCa's bias correction z0 (the normal quantile of the share of draws below the estimate, ties counted half)
    and acceleration a (the skewness of the leave-one-cluster-out jackknife rates)."""
    theta = passes.sum() / counts.sum()
    below = (np.sum(rates < theta) + 0.5 * np.sum(rates == theta)) / rates.size
    z0 = NormalDist().inv_cdf(min(max(below, 1 / rates.size), 1 - 1 / rates.size))
    rest = counts.sum() - counts
    jack = (passes.sum() - passes)[rest > 0] / rest[rest > 0]
    spread = jack.mean() - jack
    denominator = 6 * np.sum(spread ** 2) ** 1.5
    accel = float(np.sum(spread ** 3) / denominator) if denominator > 0 else 0.0
    return float(z0), accel


def at_gate(check: dict) -> bool:
    """The check's verdict at its own gate: the experiment's, its target's own (`tolerances:`) or its dtype's
    default (a bfloat16 target's 1e-5 at rtol 1.6e-2), as the check records it."""
    return bool(check["verdicts"].get(tolerance_key(check["gate"])))


class Study:
    """The facts the tables are made of, from the records of one run.

    Entries drawn with another seed than the experiment's (`models[i].seed`, the seed-variance replicas) are
    kept apart: every table but the seed table is over the design's own entries, each model once, so that
    the models that were given extra seeds do not weigh more in the rates than the others."""

    def __init__(self, records: list[dict[str, Any]], timing: dict[str, float] | None = None,
                 survey: list[dict[str, Any]] | None = None, fidelity: list[dict[str, Any]] | None = None,
                 rerun: list[dict[str, Any]] | None = None):
        self.all_records = records
        self.rerun = rerun
        self.fidelity = fidelity
        self.run = next(r for r in records if r["kind"] == "run")
        self.config = self.run["config"]
        self.replicas = {m["name"] for m in self.config["models"] if m.get("seed") not in (None, self.config["seed"])}
        self.records = records = [r for r in records if r.get("model") not in self.replicas]
        self.survey = survey
        self.summary = summarize(records)
        self.timing = timing
        self.keys = [tolerance_key(a) for a in self.config["tolerances"]["atol"]]
        self.gate_key = tolerance_key(self.summary.gate)
        checks = [r for r in records if r["kind"] == "check"]
        self.tier1 = [c for c in checks if c["tier"] == 1]
        self.ran = [c for c in self.tier1 if judged(c)]
        self.tier3 = {(c["model"], c["inputs"], c["target"]): c for c in checks if c["tier"] == 3}
        # Entries the run reached (a run stopped at its time limit leaves the rest unrun, and says so).
        reached = {c["model"] for c in self.all_records if c["kind"] == "check"}
        self.unrun = [m["name"] for m in self.config["models"] if m["name"] not in reached]
        self.models = {m["name"]: m for m in self.config["models"] if m["name"] not in self.replicas | set(self.unrun)}
        self.every_model = {m["name"]: m for m in self.config["models"]}
        self.targets = list(dict.fromkeys(c["target"] for c in self.tier1))
        self.reference = self.tier1[0]["reference"] if self.tier1 else None

    def task(self, model: str) -> str:
        return self.every_model[model]["task"]

    def seed(self, model: str) -> int:
        """The seed a model entry's weights were drawn with."""
        own = self.every_model[model].get("seed")
        return self.config["seed"] if own is None else own

    def architecture(self, model: str) -> str:
        """What a model entry is built from: entries of one architecture (a detector with and without an
        adapter) are one cluster of correlated checks."""
        spec = self.every_model[model]
        return spec.get("builder") or spec.get("architecture") or spec.get("entry") or model

    def float32_targets(self) -> set[str]:
        return {target for target, spec in self.target_specs().items() if spec["dtype"] == "float32"}

    def family(self, model: str) -> str:
        """The backbone family a model entry is built on (FAMILIES): the intervals' cluster."""
        return FAMILIES.get(self.architecture(model), self.architecture(model))

    def clusters(self, checks: list[dict], by: str = "family", verdict=None) -> list[tuple[int, int]]:
        """(passes, checks) per cluster among the judged `checks`: `family` (a backbone's checks on every target
        together) or `family-target` (one backbone on one target). `verdict` decides a check (default: at its
        own gate)."""
        verdict = verdict or at_gate
        out: dict[tuple, list[bool]] = defaultdict(list)
        for c in checks:
            if judged(c):
                key = (self.family(c["model"]),) + ((c["target"],) if by == "family-target" else ())
                out[key].append(bool(verdict(c)))
        return [(sum(v), len(v)) for v in out.values()]

    def target_specs(self) -> dict[str, dict]:
        """Each target's id (as its checks name it) and its spec."""
        ids = {}
        for t in self.config["targets"]:
            backend = t["backend"].rpartition(":")[2]
            ids[t.get("name") or f"{backend}-{t['device'].replace(':', '')}" + ("" if t["dtype"] == "float32"
                                                                                 else f"-{t['dtype']}")] = t
        return ids

    def execution_of(self) -> dict[str, str]:
        """Each target's id mapped to the first target that runs the same execution: targets that differ only in
        their name and tolerances (bfloat16 judged at two gates) are one execution, to count once."""
        seen: dict[str, str] = {}
        out = {}
        for target, spec in self.target_specs().items():
            key = json.dumps({k: v for k, v in spec.items() if k not in ("name", "tolerances")}, sort_keys=True)
            out[target] = seen.setdefault(key, target)
        return out

    def distinct_targets(self) -> list[str]:
        """The run's targets, each execution once (in the run's order)."""
        executions = self.execution_of()
        return [t for t in self.targets if executions.get(t, t) == t]

    def rate(self, checks: list[dict], key: str | None = None) -> tuple[int, int]:
        """(checks passing at atol `key`, checks judged) among `checks`; key None: each check at its own gate.
        A check that could not run here (skipped), or whose reference failed, is not judged."""
        done = [c for c in checks if judged(c)]
        return sum(at_gate(c) if key is None else bool(c["verdicts"].get(key)) for c in done), len(done)

    def pooled(self) -> tuple[int, int]:
        """Passing verdicts over every tolerance of the sweep: the published study's unit."""
        passed = sum(self.rate(self.ran, k)[0] for k in self.keys)
        return passed, len(self.ran) * len(self.keys)


def pct(passed: int, total: int) -> str:
    return f"{100 * passed / total:.1f}%" if total else "n/a"


def ci(passed: int, total: int) -> str:
    low, high = wilson(passed, total)
    return f"{100 * low:.1f}% to {100 * high:.1f}%"


def sci(x: float | None) -> str:
    return "inf" if x is None else f"{x:.1e}"


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def duration(s: float) -> str:
    minutes, rest = divmod(round(s), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# the blocks


def _input_set(spec: dict, pre: dict) -> str:
    """What an input set holds, in words: its images and their geometry, its audio files, or its tensors."""
    if spec.get("audio"):
        length = f", {spec['samples']} samples" if spec.get("samples") else ""
        return f"{', '.join(spec['audio'])} ({spec['sample_rate']} Hz{length})"
    if spec.get("images"):
        geometry = ", ".join(f"{k} {v[0] if isinstance(v, list) and len(v) == 1 else v}" for k, v in pre.items())
        return f"{', '.join(spec['images'])} ({geometry or 'at their own size'})"
    synthetic = spec.get("synthetic")
    if isinstance(synthetic, dict) and "shape" in synthetic:
        return f"synthetic {synthetic.get('distribution', 'normal')} {synthetic['shape']}"
    return "synthetic tensors" if synthetic else "text"


def block_design(s: Study) -> str:
    """What was run, from the run record's resolved experiment."""
    cfg = s.config
    tasks: dict[str, list[dict]] = defaultdict(list)
    for spec in s.models.values():
        tasks[spec["task"]].append(spec)
    builders = {spec.get("builder") or spec.get("entry") for spec in s.models.values()}
    lines = [f"- **Models**: {len(builders)} distinct models in {len(s.models)} entries."]
    for task, specs in sorted(tasks.items()):
        names = ", ".join(dict.fromkeys(spec.get("builder") or spec.get("entry") for spec in specs))
        lines.append(f"  - {task} ({len(specs)} {'entry' if len(specs) == 1 else 'entries'}): {names}")
    families = defaultdict(set)
    for name in s.models:
        families[s.family(name)].add(s.architecture(name))
    shared = [f"{family}: {', '.join(sorted(builders))}" for family, builders in sorted(families.items()) if len(builders) > 1]
    lines.append(f"- **Backbone families** (the intervals' clusters): {len(families)}"
                 + (f"; builders sharing a backbone: {'; '.join(shared)}." if shared else ", one per builder."))
    for spec in cfg["inputs"]:
        users = [m["name"] for m in s.models.values() if m.get("inputs") is None or spec["name"] in m["inputs"]]
        pre = {k: v for k, v in (spec.get("preprocess") or {}).items() if v is not None and k in ("resize", "center_crop", "resize_multiple")}
        lines.append(f"- **Input set `{spec['name']}`**: {_input_set(spec, pre)}; "
                     f"used by {len(users)} {'entry' if len(users) == 1 else 'entries'}.")

    def backend(b: dict) -> str:
        own = {k: v for k, v in (b.get("tolerances") or {}).items() if v not in (None, {})}
        return ((f"{b['name']}: " if b.get("name") else "") + f"{b['backend']} {b['device']} {b['dtype']}"
                + (f" {b['options']}" if b.get("options") else "") + (f" tolerances {own}" if own else ""))

    replicas = defaultdict(list)
    for name in sorted(s.replicas - set(s.unrun)):
        replicas[s.architecture(name)].append(s.seed(name))
    if s.unrun:
        lines.append(f"- **Not run**: {len(s.unrun)} {'entry' if len(s.unrun) == 1 else 'entries'} of the experiment that the run did not reach before it "
                     f"was stopped: {', '.join(s.unrun)}. Every table here is over the entries above.")
    if replicas:
        lines.append("- **Seed replicas** (the seed table only): " + "; ".join(
            f"{arch} seeds {', '.join(str(x) for x in sorted(seeds))}" for arch, seeds in sorted(replicas.items()))
            + f" (every other entry: the experiment's seed {cfg['seed']}).")
    tol = cfg["tolerances"]
    tasks_cfg = cfg["tiers"].get("tasks") or {}
    # each task's own thresholds (`tiers.tasks.<task>`), or the flat ones of records written before tasks were plugins
    flat = {k: v for k, v in tasks_cfg.items() if not isinstance(v, dict)}
    flat.update({f"{task} {k}": v for task, own in tasks_cfg.items() if isinstance(own, dict) for k, v in own.items()})
    thresholds = ", ".join(f"{k} {v:g}" for k, v in flat.items() if k not in ("enabled", "output") and v is not None)
    lines += [
        f"- **Reference**: {backend(cfg['reference'])}. **Targets**: " + "; ".join(backend(t) for t in cfg["targets"]) + ".",
        f"- **Tolerances**: atol {', '.join(f'{a:g}' for a in tol['atol'])} at rtol {tol['rtol']:g}; gate {s.summary.gate:g}. "
        f"**Repeats**: {cfg['repeats']}. **Tier 3**: " + (f"on ({thresholds})" if tasks_cfg.get("enabled") else "off")
        + f"; **tier 2**: {'on' if (cfg['tiers'].get('activations') or {}).get('enabled') else 'off'}.",
    ]
    return "\n".join(lines)


def judged_at(checks: list[dict]) -> str:
    """The tolerances a target's checks were judged at, and where they came from (the records say it)."""
    seen = dict.fromkeys((c["rtol"], c["gate"], c.get("tolerance_source") or "experiment") for c in checks)
    return "; ".join(f"rtol {rtol:g}, gate {gate:g} ({source})" for rtol, gate, source in seen)


def gates_note(s: Study, targets: list[str] | None = None) -> str:
    """The targets (default: the run's) judged at other tolerances than the experiment's, for the sentences that
    say 'the gate'."""
    other = [t for t in targets or s.targets if any((c.get("tolerance_source") or "experiment") != "experiment"
                                         for c in s.ran if c["target"] == t)]
    return "".join(f"; {t} at {judged_at([c for c in s.ran if c['target'] == t])}" for t in other)


def rate_with_intervals(p: int, n: int, clusters: list[tuple[int, int]]) -> str:
    """A rate as the headlines quote it: the family-clustered BCa interval first (the honest width), Wilson's after
    it (checks as independent trials: a lower bound on that width); where the bootstrap collapses to a point,
    Wilson's is the one to read."""
    low, high = bca_bootstrap(clusters)
    bca = _bca_text(low, high, len(clusters))
    if low == high:  # every family at one rate: the bootstrap has nothing to vary
        return (f"{pct(p, n)}; 95% BCa by backbone family {bca}, a point: every family at one rate, so Wilson's "
                f"{ci(p, n)} is the interval to read")
    return (f"{pct(p, n)}; 95% BCa by backbone family {bca}, the width to read; Wilson {ci(p, n)}, checks as "
            f"independent trials, a lower bound on that width")


def block_headline(s: Study) -> str:
    """The run's rates, each execution counted once (a target that is another's execution judged at another gate,
    bfloat16 at two gates, is named and left out), each with the family-clustered BCa interval beside Wilson's:
    the checks of one backbone are not independent trials, so Wilson's width is a lower bound on the honest one."""
    a = s.summary.arithmetic
    distinct = set(s.distinct_targets())
    twins = [t for t in s.targets if t not in distinct]
    once = [c for c in s.tier1 if c["target"] in distinct]
    judged_once = [c for c in once if judged(c)]
    passed, total = s.rate(judged_once)
    pooled = sum(s.rate(judged_once, k)[0] for k in s.keys)
    tasks = Counter(s.task(m) for m in s.models)
    parts = ", ".join(f"{n} {task}" for task, n in sorted(tasks.items()))
    adapted = sum(1 for m in s.models.values() if m["task"] == "detection" and m.get("adapters"))
    t3_once = [c for c in s.tier3.values() if c["target"] in distinct]
    counted = (f"; {len(once)} distinct executions, counted once below ({', '.join(twins)}: another target's "
               f"execution judged at another gate, left out)" if twins else "")

    rate = rate_with_intervals
    lines = [
        f"- **Checks counted:** {a.formula}{counted}. Model entries: {len(s.models)} ({parts}; {adapted} of the "
        f"detection entries run with an adapter).",
        f"- **At the gate** (atol {s.summary.gate:g}, rtol {s.summary.rtol:g}{gates_note(s, s.distinct_targets())}): "
        f"**{passed} of "
        f"{total} checks pass ({rate(passed, total, s.clusters(judged_once))})**, {total - passed} fail, "
        f"{len(once) - total} could not run here.",
    ]
    float32 = [c for c in judged_once if c["target"] in s.float32_targets()]
    if any(scale_free(c) is not None for c in float32):
        p32 = sum(scale_free_verdict(c) for c in float32)
        lines.append(f"- **Scale-free, the primary verdict** (float32 targets, max abs at most {SCALE_FREE_GATE:g} of "
                     f"the reference output's RMS): **{p32} of {len(float32)} checks pass "
                     f"({rate(p32, len(float32), s.clusters(float32, verdict=scale_free_verdict))})**.")
    lines += [
        f"- **Pooled over the {len(s.keys)} tolerances** (the published study's unit): {pooled} of "
        f"{total * len(s.keys)} verdicts pass ({pct(pooled, total * len(s.keys))})"
        + (f"; {s.pooled()[0]} of {s.pooled()[1]} with {', '.join(twins)}'s copies (the comparison's count)"
           if twins else "") + ".",
        f"- **Tier 3** (does the target decide the same?): {sum(bool(c['passed']) for c in t3_once)} of {len(t3_once)} "
        f"task checks agree; a tier-3 check exists only where both sides produced outputs.",
    ]
    return "\n".join(lines)


def block_findings(s: Study) -> str:
    """Counts that the prose would otherwise state by hand: where checks fail, and how."""
    lines = []
    first, last = s.keys[0], s.keys[-1]
    for target in s.targets:
        mine = [c for c in s.ran if c["target"] == target]
        if not mine:
            continue
        exact = sum(1 for c in mine if c.get("max_abs") == 0.0 and c.get("leaves"))
        cannot = Counter(s.task(c["model"]) for c in mine if c["failure_class"] in ("unsupported_op", "backend_error"))
        never = sum(1 for c in mine if not c["verdicts"].get(last))
        parts = [f"bit-identical outputs in {exact} of {len(mine)} checks"]
        if cannot:
            parts.append("could not run " + ", ".join(
                f"{n} of {sum(1 for c in mine if s.task(c['model']) == task)} {task} entries" for task, n in sorted(cannot.items())))
        parts.append(f"{never} checks fail even at atol {float(last):g}, those it could not run included")
        lines.append(f"- **{target}**: " + "; ".join(parts) + ".")
    moved = [c for c in s.ran if c["verdicts"].get(last) and not c["verdicts"].get(first)]
    lines.append(f"- The sweep decides {len(moved)} of {len(s.ran)} checks (they fail at atol {float(first):g} and pass "
                 f"at {float(last):g}); the others have the same verdict at every tolerance.")
    failed = [c for c in s.ran if not c["passed"]]
    same = [c for c in failed if (t3 := s.tier3.get((c["model"], c["inputs"], c["target"]))) is not None and t3["passed"]]
    flips = [c for c in s.tier3.values() if not c["passed"]]
    lines.append(f"- Of the {len(failed)} failed checks, {len(same)} still decide the same at tier 3 (the drift does "
                 f"not change the answer); {len(flips)} tier-3 checks find a changed decision.")
    return "\n".join(lines)


def block_tolerance(s: Study) -> str:
    rows = []
    for atol, key in zip(s.config["tolerances"]["atol"], s.keys, strict=True):
        passed, total = s.rate(s.ran, key)
        gate = " (gate)" if key == s.gate_key else ""
        rows.append([f"{atol:g}{gate}", passed, total - passed, total, pct(passed, total), ci(passed, total)])
    return table(["atol", "passed", "failed", "checks", "pass rate", "95% CI (Wilson)"], rows)


def block_per_task(s: Study) -> str:
    header = ["task", "model entries", "checks"] + [f"pass at {k}" for k in s.keys] + ["95% CI at the gate", "tier 3 agree"]
    rows = []
    for task in sorted({s.task(m) for m in s.models}):
        mine = [c for c in s.ran if s.task(c["model"]) == task]
        entries = sum(1 for m in s.models if s.task(m) == task)
        cells = []
        for k in s.keys:
            passed, total = s.rate(mine, k)
            cells.append(f"{passed}/{total} ({pct(passed, total)})")
        t3 = [c for key, c in s.tier3.items() if s.task(key[0]) == task]
        gate_passed, gate_total = s.rate(mine)
        rows.append([task, entries, len(mine), *cells, ci(gate_passed, gate_total),
                     f"{sum(bool(c['passed']) for c in t3)}/{len(t3)}"])
    return table(header, rows)


def block_per_target(s: Study) -> str:
    header = (["target", "judged at", "checks"] + [f"pass at {k}" for k in s.keys]
              + ["pass at its gate", "95% CI at its gate", "largest max abs", "median max abs / RMS"])
    rows = []
    for target in s.targets:
        mine = [c for c in s.ran if c["target"] == target]
        cells = []
        for k in s.keys:
            passed, total = s.rate(mine, k)
            cells.append(f"{passed}/{total} ({pct(passed, total)})")
        gate_passed, gate_total = s.rate(mine)
        largest = max((c["max_abs"] for c in mine if c.get("max_abs") is not None), default=None)
        scaled = [x for c in mine if (x := scale_free(c)) is not None]
        rows.append([target, judged_at(mine), len(mine), *cells, f"{gate_passed}/{gate_total} ({pct(gate_passed, gate_total)})",
                     ci(gate_passed, gate_total), sci(largest), sci(statistics.median(scaled)) if scaled else "-"])
    note = ("The sweep's columns judge each target at its own rtol; `pass at its gate` is the verdict at the gate "
            "it was judged at. Max abs / RMS: each check's largest absolute difference over its reference output's "
            "root mean square (the worst leaf), the median over the checks that have one: a scale-free size of the drift.")
    return note + "\n\n" + table(header, rows)


def model_rows(s: Study) -> list[dict[str, Any]]:
    """Per model entry (and input set): each target's check at the gate, and how many passed."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in s.tier1:
        row = rows.setdefault((c["model"], c["inputs"]), {"model": c["model"], "inputs": c["inputs"], "cells": {},
                                                           "passed": 0, "judged": 0})
        row["cells"][c["target"]] = c
        if judged(c):
            row["judged"] += 1
            row["passed"] += at_gate(c)
    return list(rows.values())


def _cell(s: Study, c: dict | None) -> str:
    if c is None:
        return "-"
    if c["status"] == "skipped":
        return "not run here"
    if c["status"] == "error":
        return "reference failed"
    if at_gate(c):
        return f"pass {sci(c['max_abs'])}"
    if not _numeric(c):
        return f"FAIL {c['failure_class']}"
    return f"FAIL {sci(c['max_abs'])} {c['failure_class']}"


def _numeric(c: dict) -> bool:
    """Whether the check's largest difference describes it: a pass, or a failure by the values (not one where
    the outputs' shapes or structure differ, whose compared leaves' difference says nothing)."""
    return (c.get("max_abs") is not None and bool(c.get("leaves"))
            and (at_gate(c) or c["failure_class"] in ("numeric_drift", "nonfinite", "nondeterministic")))


def block_per_model(s: Study) -> str:
    header = ["model", "task", "init", "adapters"] + s.targets + ["passed at the gate"]
    rows = []
    for row in model_rows(s):
        spec = s.models[row["model"]]
        adapters = ", ".join(a["name"] if isinstance(a, dict) else str(a) for a in spec.get("adapters") or []) or "-"
        rows.append([row["model"], spec["task"], spec.get("init", "default"), adapters,
                     *(_scaled_cell(s, row["cells"].get(t)) for t in s.targets),
                     f"{row['passed']}/{row['judged']}"])
    passed = sum(r["passed"] for r in model_rows(s))
    judged = sum(r["judged"] for r in model_rows(s))
    per_target = []
    for t in s.targets:
        p, n = s.rate([c for c in s.ran if c["target"] == t])
        per_target.append(f"{p}/{n} pass")
    rows.append(["**all**", "", "", "", *per_target, f"**{passed}/{judged}**"])
    note = (f"Each cell: the verdict at the target's gate (atol {s.summary.gate:g}{gates_note(s)}), the largest "
            "absolute difference over every output, the failure class of a failed check (a check whose target did "
            "not run has no difference to show), and in brackets that difference over the reference output's "
            "RMS (scale-free; the worst leaf), the measure of the scale-free table.")
    return note + "\n\n" + table(header, rows)


TASK_METRICS = ("classification", "detection", "segmentation")  # the tasks _metric can show


def _metric(c: dict) -> str:
    m = c.get("metrics") or {}
    if c["task"] == "classification":
        text = f"top-1 {m.get('top1_agreement', float('nan')):.2f}"
    elif c["task"] == "detection":
        text = f"F1 {m.get('f1', float('nan')):.3f}"
    else:
        text = f"pixels {m.get('pixel_agreement', float('nan')):.4f}"
    return ("agree " if c["passed"] else f"{c['failure_class']} ") + text


def block_tier3(s: Study) -> str:
    header = ["model", "task"] + s.targets
    rows = []
    for row in model_rows(s):
        if s.task(row["model"]) not in TASK_METRICS:
            continue  # `task: other`: no decision to compare, tier 1 decides
        cells = []
        for t in s.targets:
            c = s.tier3.get((row["model"], row["inputs"], t))
            if c is not None:
                cells.append(_metric(c))
            else:
                check = row["cells"].get(t)
                cells.append("no outputs" if check is not None and check["status"] != "skipped" else "-")
        rows.append([row["model"], s.task(row["model"]), *cells])
    note = ("Tier 3 per model and target: classification, top-1 agreement; detection, F1 of boxes matched "
            "by label at IoU 0.5; segmentation, pixel agreement of the argmax masks. `no outputs`: a side failed, "
            "so there is nothing to decide on (its tier-1 check says why).")
    return note + "\n\n" + table(header, rows)


def block_adapter(s: Study) -> str:
    """Detectors with and without an adapter: entries of one builder, params, init and inputs."""
    groups: dict[str, dict[str, str]] = defaultdict(dict)
    for name, spec in s.models.items():
        if spec["task"] != "detection":
            continue
        key = json.dumps([spec.get(k) for k in ("source", "builder", "entry", "path", "params", "init", "inputs")], sort_keys=True)
        groups[key]["with" if spec.get("adapters") else "without"] = name
    rows = []
    for pair in groups.values():
        if set(pair) != {"with", "without"}:
            continue
        for target in s.targets:
            cells = []
            for side in ("without", "with"):
                c = next((c for c in s.tier1 if c["model"] == pair[side] and c["target"] == target), None)
                t3 = s.tier3.get((pair[side], c["inputs"], target)) if c else None
                cells += [_cell(s, c), _metric(t3) if t3 else "no outputs"]
            spec = s.models[pair["without"]]
            rows.append([spec.get("builder") or spec.get("entry"), target, *cells])
    if not rows:
        return "No detector is listed both without and with an adapter."
    return table(["detector", "target", "tier 1 without", "tier 3 without", "tier 1 with adapter", "tier 3 with adapter"], rows)


def block_adapter_fidelity(s: Study) -> str:
    """The adapter's fidelity (benchmarks/adapter_fidelity.py's rows): the adapted model against the same model
    unadapted, both eager float32, and their interleaved latency."""
    if not s.fidelity:
        return "No fidelity rows came with these records (benchmarks/adapter_fidelity.py --json writes them)."
    rows = [[r["experiment"], r["model"], r["inputs"], r["boxes_before"], r["boxes_after"],
             f"{r['kept']}/{r['boxes_before']}", f"{r['f1']:.3f}", f"{r['map']:.3f}",
             f"{r['latency_unadapted_s'] * 1e3:.1f} / {r['latency_adapted_s'] * 1e3:.1f}",
             f"{r['latency_adapted_s'] / r['latency_unadapted_s']:.2f}"] for r in s.fidelity]
    commits = sorted({(r.get("commit") or "unknown")[:10] for r in s.fidelity})
    repeats = sorted({r["repeats"] for r in s.fidelity})
    note = (f"Each adapted entry against the same entry without the adapter, both eager float32 on its own inputs: "
            f"boxes on each side, the unadapted boxes the adapted run keeps (matched one to one within a label at "
            f"IoU 0.5), F1 of that matching and mAP@0.5 with the unadapted boxes as ground truth; latency: median "
            f"ms of {', '.join(str(r) for r in repeats)} forwards each, timed interleaved. "
            f"benchmarks/adapter_fidelity.py at commit {', '.join(commits)}.")
    return note + "\n\n" + table(["experiment", "entry", "inputs", "boxes unadapted", "boxes adapted", "kept", "F1",
                                  "mAP@0.5", "latency ms unadapted / adapted", "ratio"], rows)


def block_taxonomy(s: Study) -> str:
    failed1 = [c for c in s.ran if not c["passed"]]
    failed3 = [c for c in s.tier3.values() if not c["passed"]]
    classes = sorted({c["failure_class"] for c in failed1 + failed3}, key=lambda k: SEVERITY.index(k) if k in SEVERITY else 99)
    header = ["failure class", "meaning", "tier-1 checks", *s.targets, "tier-3 checks"]
    rows = []
    for k in classes:
        mine = [c for c in failed1 if c["failure_class"] == k]
        by_target = Counter(c["target"] for c in mine)
        rows.append([f"`{k}`", MEANINGS.get(k, ""), len(mine), *(by_target.get(t, 0) for t in s.targets),
                     sum(c["failure_class"] == k for c in failed3)])
    rows.append(["**all**", "", len(failed1), *(sum(c["target"] == t for c in failed1) for t in s.targets), len(failed3)])
    lines = [table(header, rows), "", "What the backends said, one line per distinct reason (the first check that gave it):", ""]
    seen: dict[str, list[str]] = {}
    for c in failed1:
        if c["failure_class"] not in ("unsupported_op", "backend_error", "structure_mismatch", "nonfinite", "nondeterministic"):
            continue
        reason = _reason(c["detail"] or "")
        seen.setdefault(f"{c['target']}: {reason}", []).append(c["model"])
    for reason, models in seen.items():
        shown = ", ".join(models[:4]) + (f" and {len(models) - 4} more" if len(models) > 4 else "")
        lines.append(f"- {reason} ({len(models)}: {shown})")
    if not seen:
        lines.append("- none: every failure is a numeric one")
    return "\n".join(lines)


def _reason(detail: str) -> str:
    """A failure's detail shortened to its first line, without the backend's id (the table says it) and
    without memory addresses, so that equal reasons read equal."""
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    first = re.sub(r"^(target|reference) \S+ failed: ", "", first)
    first = re.sub(r"0x[0-9a-f]+", "0x..", first)
    return first[:220] + ("..." if len(first) > 220 else "")


def block_latency(s: Study) -> str:
    rows = [r.model_dump() for r in latency_rows(s.records)]  # this module reads records as dicts
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    per_backend = []
    reference = {(r["model"], r["inputs"]): r for r in rows if r["backend"] == s.reference}
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend]
        ok = [r for r in mine if r["median_s"] is not None]
        ratios = [r["median_s"] / reference[(r["model"], r["inputs"])]["median_s"] for r in ok
                  if reference.get((r["model"], r["inputs"])) and reference[(r["model"], r["inputs"])]["median_s"]]
        prepares = [r["prepare_s"] for r in mine if r["prepare_s"] is not None]
        per_backend.append([backend, f"{len(ok)}/{len(mine)}", sum(len(r["run_s"]) for r in ok),
                            f"{statistics.median(ratios):.2f}" if ratios else "-",
                            f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "-",
                            seconds(statistics.median(prepares)) if prepares else "-", seconds(sum(prepares))])
    summary = table(["backend", "models it ran", "executions", "median run time / reference's", "range of that ratio",
                     "median prepare s", "total prepare s"], per_backend)
    detail_rows = []
    by_pair: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_pair[(r["model"], r["inputs"])][r["backend"]] = r
    for (model, _inputs), cells in by_pair.items():
        out = [model]
        for backend in backends:
            r = cells.get(backend)
            if r is None:
                out.append("-")
            elif r["median_s"] is None:
                out.append(f"{r['status']} after {seconds(r['prepare_s'])} s" if r["prepare_s"] is not None else r["status"])
            else:
                out.append(f"{seconds(r['median_s'])} ({seconds(r['min_s'])} to {seconds(r['max_s'])}); prep {seconds(r['prepare_s'])}")
        detail_rows.append(out)
    note = ("Per model and backend: the median run time in seconds over the repeats (min to max), then the "
            "one-time preparation (export, compile, trace, cast) apart. A backend that failed shows how long "
            "it tried.")
    return summary + "\n\n" + note + "\n\n" + table(["model", *backends], detail_rows)


def block_comparison(s: Study) -> str:
    pooled_passed, pooled_total = s.pooled()
    rates = [s.rate(s.ran, k) for k in s.keys]
    low = min(p / n for p, n in rates) if rates else float("nan")
    high = max(p / n for p, n in rates) if rates else float("nan")
    p = PUBLISHED
    return table(["", "published study", "this study"], [
        ["verdicts pooled over the sweep", p["checks"], pooled_total],
        ["passing", f"{100 * p['pass_rate']:.1f}%", pct(pooled_passed, pooled_total)],
        ["per tolerance", f"{100 * p['per_tolerance_low']:.1f}% to {100 * p['per_tolerance_high']:.1f}%",
         f"{100 * low:.1f}% to {100 * high:.1f}%"],
        ["spread across the sweep (points)", f"{100 * (p['per_tolerance_high'] - p['per_tolerance_low']):.1f}",
         f"{100 * (high - low):.1f}"],
        ["reference and target", "one module moved in place", "an own copy per backend"],
        ["non-tensor outputs", "counted as passes", "compared exactly; an uncomparable one fails"],
        ["weights", "pretrained", "seeded random init"],
    ])


def block_intervals(s: Study) -> str:
    """The absolute gates' intervals (the secondary verdicts). Wilson's interval treats every check as
    independent; one model's checks are not (they share its backbone, and a detector's entries with and without
    the adapter share its weights), hence the clustered ones. A target that is another target's execution judged
    at another gate is left out of `all targets`, which counts each execution once."""
    distinct = set(s.distinct_targets())
    rows = [["all targets, each execution once", *_interval_cells(s, [c for c in s.ran if c["target"] in distinct])]]
    rows += [[t, *_interval_cells(s, [c for c in s.ran if c["target"] == t])] for t in s.targets]
    note = f"At each target's gate (atol {s.summary.gate:g}{gates_note(s)}). {_intervals_note()}"
    return note + "\n\n" + table(INTERVAL_HEADER, rows)


def block_like_for_like(s: Study) -> str:
    """The pass rate restricted to what the published design judged: float32 targets, each model once."""
    float32 = s.float32_targets()
    unadapted = [c for c in s.ran if not s.models[c["model"]].get("adapters")]
    subsets = [("every check", s.ran),
               ("float32 targets", [c for c in s.ran if c["target"] in float32]),
               ("float32 targets, each model once (no adapter entries)", [c for c in unadapted if c["target"] in float32])]
    if float32 != set(FIRST_DESIGN_TARGETS) and float32 >= set(FIRST_DESIGN_TARGETS):
        first = [c for c in unadapted if c["target"] in FIRST_DESIGN_TARGETS]
        subsets.append((f"the first run's float32 targets ({', '.join(FIRST_DESIGN_TARGETS)}), each model once", first))
        subsets.append(("the same, detectors left out", [c for c in first if s.task(c["model"]) != "detection"]))
    rows = []
    for label, checks in subsets:
        passed, total = s.rate(checks)
        pooled = sum(s.rate(checks, k)[0] for k in s.keys)
        rows.append([label, f"{passed}/{total}", pct(passed, total), bca_cell(s.clusters(checks), count=False),
                     f"{pooled}/{total * len(s.keys)}", pct(pooled, total * len(s.keys))])
    rows.append(["published study (pooled over its sweep)", "", "", "", str(PUBLISHED["checks"]),
                 f"{100 * PUBLISHED['pass_rate']:.1f}%"])
    return table(["checks", "at the gate", "rate", "BCa 95% by family (seed)", "pooled over the sweep", "pooled rate"],
                 rows)


def block_run(s: Study) -> str:
    env = s.run["environment"]
    cpu = env.get("cpu") or {}
    executions = [r for r in s.records if r["kind"] == "execution"]
    builds = sum(r.get("build_s") or 0.0 for r in s.records if r["kind"] == "model")
    spent = builds + sum((r.get("prepare_s") or 0.0) + (r.get("run_s") or 0.0) for r in executions)
    lines = [
        f"- torch {env['torch']}, torchvision {env.get('torchvision')}, onnx {env.get('onnx')}, onnxruntime {env.get('onnxruntime')}, "
        f"python {env['python']}; {cpu.get('model', cpu.get('machine'))}, {cpu.get('count')} cores, "
        f"{env['threads']} torch threads; CUDA: {', '.join(env['cuda']['devices']) if env.get('cuda') else 'none'}; "
        f"parity at commit {(env.get('git_commit') or 'unknown')[:10]}"
        + (f" (`git checkout {env['git_commit']}` runs this code again)." if env.get("git_commit") else "."),
        f"- {s.config['repeats']} repeats per backend; {len(executions)} execution records; building models, "
        f"preparing backends and running them took {duration(spent)} of the run (the records' own times).",
    ]
    if s.timing:
        extra = f", peak resident memory {s.timing['peak_mib'] / 1024:.1f} GiB" if "peak_mib" in s.timing else ""
        cpu_s = s.timing.get("user_s", 0.0) + s.timing.get("system_s", 0.0)
        ended = (f"; it was stopped (signal {s.timing['signal']}) before it finished" if "signal" in s.timing else "")
        lines.append(f"- The whole `parity run`, start to exit: **{duration(s.timing['wall_s'])}** wall clock, "
                     f"{duration(cpu_s)} of CPU time{extra} (GNU time){ended}.")
    else:
        lines.append("- No wall-clock measurement came with these records (run it under `/usr/bin/time -v`, see above).")
    return "\n".join(lines)


def scale_free(check: dict, measure: str = "max_abs") -> float | None:
    """The check's largest difference relative to its output's scale: max over the leaves of `measure`
    (max_abs, or required_atol: the smallest atol that passes) divided by the reference leaf's root mean
    square. None when no leaf records both (records written before `reference_rms` existed, or a check
    without a comparison)."""
    ratios = [leaf[measure] / leaf["reference_rms"] for leaf in check.get("leaves") or []
              if leaf.get(measure) is not None and leaf.get("reference_rms")]
    return max(ratios) if ratios else None


def relative_rmse(check: dict) -> float | None:
    """The check's root-mean-square difference over its reference output's RMS, the worst leaf: the scale-free
    measure of a reduced-precision target, whose largest difference is one element's rounding. None without both."""
    ratios = [leaf["rmse"] / leaf["reference_rms"] for leaf in check.get("leaves") or []
              if leaf.get("rmse") is not None and leaf.get("reference_rms")]
    return max(ratios) if ratios else None


def scale_free_verdict(check: dict, threshold: float = SCALE_FREE_GATE) -> bool:
    """The check judged against its output's scale: its outputs compared by value (a check that did not run, or
    whose structure differs, fails as it does at tier 1) and its largest difference at most `threshold` of the
    reference output's RMS (the worst leaf; identical outputs pass whatever their scale)."""
    if check["status"] != "ok" or not _numeric(check):
        return False
    if check.get("max_abs") == 0.0:
        return True
    ratio = scale_free(check)
    return ratio is not None and ratio <= threshold


def _interval_cells(s: Study, checks: list[dict], verdict=None) -> list[Any]:
    """passed/judged, the rate, Wilson's interval and the BCa intervals clustered by backbone family and by
    (family, target), each with its cluster count."""
    verdict = verdict or at_gate
    done = [c for c in checks if judged(c)]
    passed = sum(bool(verdict(c)) for c in done)
    cells = [f"{passed}/{len(done)}", pct(passed, len(done)), ci(passed, len(done))]
    for by in ("family", "family-target"):
        cells.append(bca_cell(s.clusters(done, by, verdict)))
    return cells


INTERVAL_HEADER = ["checks", "passed", "rate", "Wilson 95%", "BCa by family (clusters; seed)",
                   "BCa by family and target (clusters; seed)"]


def _intervals_note() -> str:
    return (f"Wilson: checks as independent trials. BCa: a bias-corrected and accelerated bootstrap that draws whole "
            f"clusters with replacement ({BOOTSTRAP_RESAMPLES} draws, seed {BOOTSTRAP_SEED}): a backbone family's "
            f"checks on every target (the family column), or one family's checks on one target (the family-and-"
            f"target column); the number of clusters in brackets. Where every cluster has one rate (all pass or "
            f"all fail) the bootstrap has nothing to vary and gives the point: read Wilson's interval there.")


def block_scale_free(s: Study) -> str:
    """The primary verdicts: each float32 check's largest difference over its reference output's RMS, swept over
    relative gates; reduced precision by its relative RMSE and tier 3; every execution counted once."""
    float32, executions, specs = s.float32_targets(), s.execution_of(), s.target_specs()
    rows = []
    for target in s.distinct_targets():
        mine = [c for c in s.ran if c["target"] == target]
        twins = [t for t in s.targets if executions.get(t) == target and t != target]
        rel = [x for c in mine if _numeric(c) and (x := relative_rmse(c)) is not None]
        t3 = [s.tier3[k] for c in mine if (k := (c["model"], c["inputs"], target)) in s.tier3]
        p, n = s.rate(mine)
        rows.append([target + (f" (also judged as {', '.join(twins)}: not counted again)" if twins else ""),
                     specs[target]["dtype"] if target in specs else "-",
                     *(f"{sum(scale_free_verdict(c, x) for c in mine)}/{len(mine)}" for x in SCALE_FREE_SWEEP),
                     f"{p}/{n}", f"{sci(statistics.median(rel))} ({sci(min(rel))} to {sci(max(rel))})" if rel else "-",
                     f"{sum(bool(c['passed']) for c in t3)}/{len(t3)}" if t3 else "-"])
    sweep_header = [f"max abs / RMS <= {x:g}" + (" (primary)" if x == SCALE_FREE_GATE else "") for x in SCALE_FREE_SWEEP]
    f32 = [c for c in s.ran if c["target"] in float32]
    reduced = [c for c in s.ran if c["target"] in set(s.distinct_targets()) - float32]
    interval_rows = [["float32 targets, scale-free (primary)", *_interval_cells(s, f32, scale_free_verdict)]]
    interval_rows += [[f"{t}, scale-free", *_interval_cells(s, [c for c in f32 if c["target"] == t], scale_free_verdict)]
                      for t in s.targets if t in float32]
    t3_reduced = [s.tier3[k] for c in reduced if (k := (c["model"], c["inputs"], c["target"])) in s.tier3]
    if t3_reduced:
        interval_rows.append(["reduced precision, tier 3 agrees (each execution once)",
                              *_interval_cells(s, t3_reduced, lambda c: c["passed"])])
    moved_up = [c for c in f32 if scale_free_verdict(c) and not at_gate(c)]
    moved_down = [c for c in f32 if at_gate(c) and not scale_free_verdict(c)]

    def named(checks: list[dict]) -> str:
        return ", ".join(f"{c['model']} on {c['target']} ({sci(scale_free(c))})" for c in checks) or "none"

    lines = [
        "Each check judged against its reference output's scale: its largest absolute difference over the reference "
        "output's root mean square (the worst leaf), at the relative gates of the sweep; a check that did not run, "
        "or whose outputs differ in structure, fails as at tier 1. Relative RMSE: the RMS difference over the "
        "reference's RMS (median and range over the checks compared by value), the measure for reduced precision, "
        "with tier 3. `at its absolute gate`: the secondary verdict of the tables below. Each execution once.",
        "",
        table(["target", "dtype", *sweep_header, "at its absolute gate", "relative RMSE", "tier 3 agree"], rows),
        "",
        f"- Fail at the absolute gate, pass at {SCALE_FREE_GATE:g} of RMS ({len(moved_up)}): {named(moved_up)}.",
        f"- Pass at the absolute gate, fail at {SCALE_FREE_GATE:g} of RMS ({len(moved_down)}): {named(moved_down)}.",
        "",
        f"Intervals at the primary verdicts (float32: max abs <= {SCALE_FREE_GATE:g} of RMS; reduced precision: "
        f"tier 3). {_intervals_note()}",
        "",
        table(INTERVAL_HEADER, interval_rows),
    ]
    return "\n".join(lines)


def _scaled_cell(s: Study, c: dict | None) -> str:
    text = _cell(s, c)
    ratio = scale_free(c) if c is not None and c["status"] == "ok" and _numeric(c) else None
    return text if ratio is None else f"{text} ({sci(ratio)} of RMS)"


def block_trained(s: Study) -> str:
    """Per trained model: each target's verdict at the gate, its largest absolute difference and that
    difference over the reference output's RMS (scale-free: comparable across models)."""
    rows = [[row["model"], row["inputs"], *(_scaled_cell(s, row["cells"].get(t)) for t in s.targets),
             f"{row['passed']}/{row['judged']}"] for row in model_rows(s)]
    float32 = s.float32_targets()
    passing = [(ratio, c) for c in s.ran if at_gate(c) and c["target"] in float32 and (ratio := scale_free(c)) is not None]
    distinct = s.distinct_targets()
    once = [c for c in s.ran if c["target"] in distinct]
    passed, judged_n = s.rate(once)
    twins = [t for t in s.targets if t not in distinct]
    lines = [f"- **At the gate** (atol {s.summary.gate:g}, rtol {s.config['tolerances']['rtol']:g}"
             f"{gates_note(s, distinct)}), each execution once"
             + (f" ({', '.join(twins)} left out: another target's execution judged at another gate)" if twins else "")
             + f": {passed} of {judged_n} checks pass ({rate_with_intervals(passed, judged_n, s.clusters(once))})."]
    for label, targets in (("float32 targets", float32), ("reduced-precision targets", set(distinct) - float32)):
        mine = [c for c in once if c["target"] in targets]
        p, n = s.rate(mine)
        if n and targets != set(distinct):
            lines.append(f"  - {label}: {p} of {n} ({rate_with_intervals(p, n, s.clusters(mine))}).")
    if passing:
        worst, c = max(passing, key=lambda pair: pair[0])
        lines.append(f"- The largest difference of a passing float32 check, over its output's RMS: {sci(worst)} "
                     f"({c['model']} on {c['target']}).")
    note = ("Each cell: the verdict at the gate, the largest absolute difference over every output, the failure "
            "class of a failed check, and in brackets that difference over the reference output's RMS.")
    return "\n".join(lines) + "\n\n" + note + "\n\n" + table(["model", "inputs", *s.targets, "passed"], rows)


def seed_groups(s: Study) -> dict[str, list[str]]:
    """Entries that differ only in their seed (name and seed apart, the same spec), in seed order: the seed
    table's models, named by their first entry. Only groups with more than one seed."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name, spec in s.every_model.items():
        key = json.dumps({k: v for k, v in spec.items() if k not in ("name", "seed")}, sort_keys=True)
        groups[key].append(name)
    return {names[0]: sorted(names, key=s.seed) for names in groups.values() if len(names) > 1}


def block_seeds(s: Study) -> str:
    """Per model drawn with several seeds and per target: the verdicts at the gate over the seeds, and how far
    the required atol (absolute and over the output's RMS) moves between draws."""
    checks = [c for c in s.all_records if c["kind"] == "check" and c["tier"] == 1]
    tier3 = {(c["model"], c["target"]): c for c in s.all_records if c["kind"] == "check" and c["tier"] == 3}
    groups = seed_groups(s)
    if not groups:
        return "No model is listed with more than one seed."
    rows = []
    for first, names in groups.items():
        for target in s.targets:
            mine = [c for name in names for c in checks if c["model"] == name and c["target"] == target and judged(c)]
            if not mine:
                continue
            required = [c["required_atol"] for c in mine if c.get("required_atol") is not None]
            scaled = [x for c in mine if (x := scale_free(c, "required_atol")) is not None]
            positive = [x for x in required if x > 0]
            spread = f"{max(positive) / min(positive):.1f}x" if positive and len(positive) == len(mine) else "-"
            agree = [tier3[(c["model"], target)] for c in mine if (c["model"], target) in tier3]
            float32 = target in s.float32_targets()
            drift = " ".join(sci(scale_free(c)) for c in mine) if float32 else "-"
            rows.append([first, target, ", ".join(str(s.seed(c["model"])) for c in mine),
                         f"{sum(at_gate(c) for c in mine)}/{len(mine)}", " ".join("pass" if at_gate(c) else "FAIL" for c in mine),
                         f"{sci(min(required))} to {sci(max(required))}" if required else "-", spread,
                         f"{sci(min(scaled))} to {sci(max(scaled))}" if scaled else "-",
                         " ".join("pass" if scale_free_verdict(c) else "FAIL" for c in mine) if float32 else "-", drift,
                         f"{sum(bool(c['passed']) for c in agree)}/{len(agree)}" if agree else "-"])
    note = ("Per model drawn with several seeds (the same entry, its weights drawn again) and per target: the "
            "verdict at the target's gate for each seed in seed order, the required atol's range over the seeds "
            "and its spread (largest over smallest; `-` where one is 0 or missing), the same over the reference "
            f"output's RMS, the scale-free verdict (float32: max abs at most {SCALE_FREE_GATE:g} of the reference "
            "output's RMS, the primary axis) and that max abs / RMS for each seed in seed order, and the tier-3 "
            "checks that agree.")
    return note + "\n\n" + table(["model", "target", "seeds", "pass at the gate", "per seed", "required atol",
                                  "spread", "required atol / RMS", f"per seed at {SCALE_FREE_GATE:g} of RMS",
                                  "max abs / RMS per seed", "tier 3 agree"], rows)


FLIP_CLASSES = ("tie_order", "score_threshold", "nms_iou", "top_k", "score_order", "label_change", "geometry",
                "unattributed")
# The study's names for parity's flip classes where the class's own name says more than the records show:
# `geometry` from the outputs alone is a same-label box that is each side's best overlap below the match IoU,
# which a box that moved and another (tied) candidate kept in its place both make.
FLIP_NAMES = {"geometry": "moved or replaced"}


def flip_name(mechanism: str) -> str:
    return FLIP_NAMES.get(mechanism, mechanism)


def _flip_cell(c: dict | None, check: dict | None) -> str:
    if c is None:
        return "no outputs" if check is not None and check["status"] != "skipped" else "-"
    f1 = f"F1 {(c.get('metrics') or {}).get('f1', float('nan')):.3f}"
    flips = c.get("flips")
    if c["passed"] and not flips:
        return f"agree ({f1})"
    if not flips:
        return f"{c['failure_class']} ({f1}); not attributed"
    counts = ", ".join(f"{flip_name(k)} {n}" for k, n in flips["counts"].items() if n)
    return (f"{'agree, ' if c['passed'] else ''}{f1}: {counts}"
            + ("" if flips.get("candidates") == "both" else " (outputs only)"))


def block_flips(s: Study) -> str:
    """Decision-flip attribution (Tier3Check.flips) per detector entry and target: each failing detection
    check's unmatched boxes by mechanism, and the totals per mechanism and target."""
    detectors = [m for m in s.models if s.task(m) == "detection"]
    if not detectors:
        return "No detection entry in this run."
    rows, totals = [], {t: Counter() for t in s.targets}
    for model in detectors:
        cells = []
        for t in s.targets:
            check = next((c for c in s.tier1 if c["model"] == model and c["target"] == t), None)
            c = s.tier3.get((model, check["inputs"], t)) if check else None
            cells.append(_flip_cell(c, check))
            if c is not None and c.get("flips"):
                totals[t].update(c["flips"]["counts"])
        rows.append([model, *cells])
    used = [k for k in FLIP_CLASSES if any(totals[t][k] for t in s.targets)]
    used += sorted({k for t in s.targets for k in totals[t]} - set(FLIP_CLASSES))
    total_rows = [[flip_name(k), *(totals[t][k] for t in s.targets), sum(totals[t][k] for t in s.targets)]
                  for k in used]
    total_rows.append(["**all**", *(sum(totals[t].values()) for t in s.targets),
                       sum(sum(x.values()) for x in totals.values())])
    distinct = s.distinct_targets()
    if len(distinct) != len(s.targets):
        total_rows.append(["**all, each execution once**", *(sum(totals[t].values()) if t in distinct else "-"
                                                             for t in s.targets),
                           sum(sum(totals[t].values()) for t in distinct)])
    note = ("Each cell: F1 and the unmatched boxes of both sides by mechanism, `agree` first where tier 3 passes "
            "(a passing check's unmatched boxes are attributed in records from commit 2ea5107 on; before, `agree` "
            "alone); `(outputs only)` where a side had no captured post-processing inputs; `no outputs` where a "
            "side failed. `moved or replaced`: parity's class `geometry` (a same-label box that is each side's best "
            "overlap, below the match IoU), which a box that moved and another candidate kept in its place both make.")
    return (note + "\n\n" + table(["detector entry", *s.targets], rows)
            + "\n\nUnmatched boxes per mechanism, summed over the detection checks that attribute theirs:\n\n"
            + table(["mechanism", *s.targets, "all"], total_rows))


def _survey_type(r: dict, name: str | None) -> str:
    return (r.get("module_types") or {}).get(name, "?") if name else "-"


def block_localize(s: Study) -> str:
    """The RQ3 survey: where the float32 failures start (benchmarks/study_localize.py's lines)."""
    if not s.survey:
        return "No per-layer survey came with these records (benchmarks/study_localize.py writes it)."
    unreached = [r for r in s.survey if (r.get("error") or "").startswith("not reached")]
    failed = [r for r in s.survey if r.get("error") and r not in unreached]
    done = [r for r in s.survey if not r.get("error")]
    by_type = []
    first_types = Counter(_survey_type(r, r.get("first_divergent")) if r.get("first_divergent") else None for r in done)
    for kind, n in first_types.most_common():
        mine = [r for r in done if (_survey_type(r, r.get("first_divergent")) if r.get("first_divergent") else None) == kind]
        per_target = ", ".join(f"{t} {k}" for t, k in Counter(r["target"] for r in mine).items())
        by_type.append([f"`{kind}`" if kind else "(no layer over the threshold)", n, per_target,
                        ", ".join(dict.fromkeys(r["model"] for r in mine))])
    per_check = []
    for r in s.survey:
        if r.get("error"):
            per_check.append([r["model"], r["target"], "-", "-", "-", seconds(r.get("wall_s")), r["error"][:120]])
            continue
        first, culprit, tier1 = r.get("first_divergent"), r.get("culprit"), r.get("tier1") or {}
        shape = ("whole graph" if r.get("whole_graph") else "only as a whole" if r.get("as_a_whole")
                 else "evenly spread" if r.get("evenly_spread") else "" if first else (r.get("verdict") or "")[:160])
        per_check.append([r["model"], r["target"],
                          f"{first} (`{_survey_type(r, first)}`, {r.get('first_divergent_by')})" if first else "none",
                          f"{culprit} (`{_survey_type(r, culprit)}`{', own code' if _blames_own_code(r) else ''})"
                          if culprit else "none",
                          sci(tier1["required_atol"]) if tier1.get("required_atol") is not None else "-",
                          seconds(r.get("wall_s")), shape])
    head = (f"{len(s.survey)} float32 tier-1 failures (numeric_drift or nonfinite) to localize: {len(done)} localized, "
            f"{len(failed)} where localize gave no layers, {len(unreached)} not reached in the survey's time.")
    return (head + "\n\nThe first divergent module, by its type:\n\n"
            + table(["module type", "checks", "per target", "models"], by_type)
            + "\n\nPer check: the first layer over the threshold (its type; by its own or its propagated error), the "
              "culprit localize names, the check's required atol when localize ran it again, and the seconds "
              "localize took.\n\n"
            + table(["model", "target", "first divergent", "culprit", "required atol", "seconds", "note"], per_check))


def _blames_own_code(r: dict) -> bool:
    """Whether a survey line's verdict blamed its culprit's own code (the survey's lines keep the verdict's words, not
    the layers record's `in_own_code`): every such line predates 45a3f53, whose replays were rewritten by a parent that
    adds into a submodule's output in place (v4 correction 14)."""
    return "(in its own code" in (r.get("verdict") or "")


def _shape(r: dict) -> str:
    """How a layers record places the drift: in the whole graph, in one module only as a whole, evenly spread."""
    return ("whole graph" if r.get("whole_graph") else "only as a whole" if r.get("as_a_whole")
            else "evenly spread" if r.get("evenly_spread") else "")


def rerun_type(r: dict, name: str | None, survey: list[dict]) -> str:
    """The class of a rerun's named module: the survey's (module_types, by name: the seed replicas and the
    segmenters' backbones share their names' classes), else the class localize gave for its culprit, else '?'."""
    if not name:
        return "-"
    for line in survey:
        if name in (line.get("module_types") or {}) and line["model"].split("-s")[0] == r["model"].split("-s")[0]:
            return line["module_types"][name]
    return (r.get("culprit_code") or "?").split(" ")[0] if name == r.get("culprit") else "?"


def block_localize_rerun(s: Study) -> str:
    """The survey's checks localized again (v4), beside the survey's own first divergent module: whether the
    location holds on another commit, and the per-layer tables the survey's archive did not keep; then the
    counts the text reads from them (the first divergent module's class, the drift's shape)."""
    if not s.rerun:
        return "No check of the survey was localized again."
    surveyed = {(r["model"], r["inputs"], r["target"]): r for r in s.survey or []}
    rows, same, own_before, own_now = [], 0, 0, 0
    for r in s.rerun:
        line = surveyed.get((r["model"], r["inputs"], r["target"])) or {}
        before, first = line.get("first_divergent"), r.get("first_divergent")
        same += before == first
        own_before += _blames_own_code(line)
        own_now += bool(r.get("in_own_code"))
        survey_culprit = (line.get("culprit") or "none") + (" (own code)" if _blames_own_code(line) else "")
        rows.append([r["model"], r["target"], before or "-",
                     f"{first} (`{rerun_type(r, first, s.survey or [])}`)" if first else "none",
                     "same" if before == first else "**differs**", survey_culprit,
                     (r.get("culprit") or "none") + (" (own code)" if r.get("in_own_code") else ""), _shape(r),
                     sum(len(level.get("layers") or []) for level in r.get("levels") or []), seconds(r.get("wall_s"))])
    runs = dict.fromkeys((r.get("git_commit") or "unknown")[:10] + " on " + (r.get("cpu") or {}).get("model", "?")
                         + f" ({', '.join((r.get('cpu') or {}).get('flags') or [])})" for r in s.rerun)
    head = (f"{len(s.rerun)} of the survey's checks localized again in v4 (`parity localize`, one check per process, one "
            f"torch thread; parity at {'; '.join(runs)}): {same} name the same first divergent module as the survey. "
            f"Their layers records are archived whole ({RERUN_ARCHIVE.name}): each level's rows, a layer's own and "
            f"propagated errors, which the survey's archive did not keep. A culprit in its parent's own code: {own_before} "
            f"of the survey's lines for these checks, {own_now} of the reruns.")
    backbone = [r for r in s.rerun if s.family(r["model"]) == "mobilenet_v3_large" and s.task(r["model"]) != "detection"]
    types = Counter(rerun_type(r, r.get("first_divergent"), s.survey or []) for r in backbone)
    culprits = Counter(rerun_type(r, r.get("culprit"), s.survey or []) if r.get("culprit") else "none" for r in backbone)
    shapes = Counter(_shape(r) or "none of these" for r in backbone)
    counts = (f"\n\nOn MobileNetV3-large's backbone (the classifier and its seeds, LR-ASPP, DeepLabV3): {len(backbone)} "
              f"of these checks; their first divergent module's class: "
              + ", ".join(f"`{k}` {n}" for k, n in types.most_common()) + "; their culprit's class: "
              + ", ".join(f"`{k}` {n}" if k != "none" else f"none {n}" for k, n in culprits.most_common())
              + "; the drift's shape: "
              + ", ".join(f"{k} {n}" for k, n in shapes.most_common()) + ".") if backbone else ""
    return head + counts + "\n\n" + table(["model", "target", "survey's first divergent", "rerun's first divergent", "",
                                            "survey's culprit", "rerun's culprit", "shape", "layer rows archived",
                                            "localize's own seconds"], rows)


def merge_reruns(archived: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The archived reruns with `new` added: a check localized again replaces its archived line in place, so a
    later session's reruns extend the archive instead of dropping what an earlier one measured."""
    def key(r: dict) -> tuple:
        return r["model"], r["inputs"], r["target"]

    fresh = {key(r): r for r in new}
    kept = [fresh.pop(key(r), r) for r in archived]
    return kept + [r for r in new if key(r) in fresh]


def rerun_lines(folder: Path) -> list[dict[str, Any]]:
    """The layers record of each `parity localize` output folder under `folder` (sorted by name), with localize's
    own time (`wall_s`, as the survey's lines have it) and the commit and CPU its run recorded: RERUN_ARCHIVE's
    lines."""
    out = []
    for records in sorted(folder.glob("*/records.jsonl")):
        lines = load_records(records)
        env = next((r for r in lines if r["kind"] == "run"), {}).get("environment") or {}
        layers = [r for r in lines if r["kind"] == "layers"]
        if layers:
            out.append({**layers[-1], "wall_s": layers[-1].get("elapsed_s"), "git_commit": env.get("git_commit"),
                        "cpu": env.get("cpu")})
    return out


# ---------------------------------------------------------------------------------------------------
# the experiments of issue #27 (study/): the trained detector at scale, the SE control, decisions at 1 and 2 threads


class Experiments:
    """The rows of the study/ experiments, each archived beside the study: `detector` (study/detector_at_scale.py
    --json: one line per target and image, at `--threads` 1 and 2), `se` (study/se_control.py --json: one line
    per model, variant, target and block), `repro` (the records of study/repro_threads.sh's two runs, one
    thread then two), `llm` (the records of examples/llm.yaml's run), `se_replica` (study/se_control.py's rows
    measured again in a later session, for rows `se` already holds: how far its numbers move between runs) and
    `smollm2` (the records of study/smollm2.yaml's run, with GNU time's figures as `smollm2_time`)."""

    def __init__(self, detector: list[dict] | None = None, se: list[dict] | None = None,
                 repro: tuple[list[dict], list[dict]] | None = None, llm: list[dict] | None = None,
                 se_replica: list[dict] | None = None, smollm2: list[dict] | None = None,
                 smollm2_time: dict[str, float] | None = None):
        self.detector, self.se, self.repro, self.llm = detector or [], se or [], repro, llm or []
        self.se_replica, self.smollm2, self.smollm2_time = se_replica or [], smollm2 or [], smollm2_time


def decision_changed(row: dict) -> bool:
    """An image whose detections differ from the reference's (F1 below 1, boxes matched within a label at IoU 0.5)."""
    return "error" not in row and row["f1"] < 1.0


def _proportion(rows: list[dict], flag) -> list[str]:
    """How many rows `flag` holds for, Wilson's interval, and the BCa interval over source photos (images made
    from one photo are not independent), with the number of photos."""
    per_photo: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        per_photo[r["photo"]].append(bool(flag(r)))
    k = sum(sum(v) for v in per_photo.values())
    return [f"{k}/{len(rows)}", ci(k, len(rows)), bca_cell([(sum(v), len(v)) for v in per_photo.values()])]


def _spread(values: list[float]) -> str:
    return f"{sci(statistics.median(values))} ({sci(min(values))} to {sci(max(values))})" if values else "-"


def detector_scale_table(rows: list[dict]) -> str:
    """Per thread count and target: the images whose decision changed with their intervals, the unmatched boxes
    by mechanism, and the raw head's drift over its RMS (median and range)."""
    out = []
    for threads in sorted({r["threads"] for r in rows}):
        for target in dict.fromkeys(r["target"] for r in rows if r["threads"] == threads):
            mine = [r for r in rows if r["threads"] == threads and r["target"] == target]
            ran = [r for r in mine if "error" not in r]
            if not ran:
                out.append([threads, target, len(mine), f"could not run: {mine[0]['error']}", "", "", "", "", "", ""])
                continue
            mechanisms = sum((Counter(r["flips"]) for r in ran), Counter())
            boxes = sum(r["boxes_reference"] for r in ran)
            out.append([threads, target, f"{len(ran)}" + (f" ({len(mine) - len(ran)} failed)" if len(ran) < len(mine) else ""),
                        *_proportion(ran, decision_changed), boxes,
                        ", ".join(f"{k} {n}" for k, n in mechanisms.items() if n) or "none",
                        _spread([r["max_abs_over_rms"] for r in ran]), _spread([r["relative_rmse"] for r in ran])])
    return table(["threads", "target", "images", "decision changed", "Wilson 95%", "BCa by photo (photos; seed)",
                  "reference boxes", "unmatched boxes by mechanism", "max abs / RMS of the raw head",
                  "relative RMSE of the raw head"], out)


def block_detector_scale(x: Experiments) -> str:
    if not x.detector:
        return "No rows of study/detector_at_scale.py came with the study."
    images = len({r["image"] for r in x.detector})
    photos = len({r["photo"] for r in x.detector})
    note = (f"nudenet's YOLOv8n on {images} images made from {photos} bundled photos (study/make_detector_inputs.py): "
            "each target's raw head against onnx2torch's PyTorch graph in eager float32, both behind the same eager "
            "torch post-processing (score threshold, class-agnostic NMS at IoU 0.45, at most 100 boxes). Decision "
            "changed: the image's boxes differ (F1 below 1, matched within a label at IoU 0.5). Mechanisms: every "
            "unmatched box of both sides, attributed with both sides' candidates (docs/tiers.md). The raw head's "
            "drift: its largest absolute difference and its RMS difference over the reference head's RMS, median "
            "(min to max) over the images.")
    return note + "\n\n" + detector_scale_table(x.detector)


def block_detector_mechanisms(x: Experiments) -> str:
    """Per mechanism and target (one thread): the images with at least one unmatched box of that mechanism."""
    rows = [r for r in x.detector if r["threads"] == min(r["threads"] for r in x.detector) and "error" not in r]
    targets = list(dict.fromkeys(r["target"] for r in rows))
    used = [k for k in FLIP_CLASSES if any(r["flips"].get(k) for r in rows)]
    if not used:
        return "No unmatched box on any target: no mechanism to count."
    out = []
    for k in used:
        for t in targets:
            mine = [r for r in rows if r["target"] == t]
            out.append([k, t, sum(r["flips"].get(k, 0) for r in mine), *_proportion(mine, lambda r, k=k: r["flips"].get(k))])
    return ("Images with at least one unmatched box of each mechanism (one thread), with Wilson's interval and "
            "the BCa interval over source photos:\n\n"
            + table(["mechanism", "target", "boxes", "images", "Wilson 95%", "BCa by photo (photos)"], out))


def se_steps(rows: list[dict]) -> dict[bool, list[float]]:
    """A profile's steps (a block's relative RMSE over the previous block's: how much the block multiplies the
    relative error it is given), split by whether the block holds an SE block in the model as built; the first
    block, the whole model's row and a step from an exact previous block (relative RMSE 0) have none."""
    blocks = [r for r in rows if r["block"].startswith("features.")]
    blocks.sort(key=lambda r: int(r["block"].split(".")[1]))
    steps: dict[bool, list[float]] = {True: [], False: []}
    for before, after in zip(blocks[:-1], blocks[1:], strict=True):
        if before["relative_rmse"] > 0:
            steps[bool(after["se"])].append(after["relative_rmse"] / before["relative_rmse"])
    return steps


def _median_of(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({len(values)})" if values else "-"


def block_se_control(x: Experiments) -> str:
    if not x.se:
        return "No rows of study/se_control.py came with the study."
    out = []
    groups = dict.fromkeys((r["model"], r["variant"], r["target"]) for r in x.se)
    for model, variant, target in groups:
        mine = [r for r in x.se if (r["model"], r["variant"], r["target"]) == (model, variant, target)]
        steps = se_steps(mine)
        whole = next(r for r in mine if r["block"] == "whole model")
        worst = max((r for r in mine if r["block"] != "whole model"), key=lambda r: r["relative_rmse"])
        out.append([model, variant, target, _median_of(steps[True]), _median_of(steps[False]),
                    f"{worst['block']} {sci(worst['relative_rmse'])}", sci(whole["relative_rmse"]),
                    sci(whole["max_abs_over_rms"])])
    note = ("Per model, variant and target: the median step (a block's relative RMSE over the previous block's) "
            "at the blocks that hold an SE block in the model as built and at the other blocks (how many steps in "
            "brackets; in `no-se` the same blocks, their SE removed), the block with the largest relative RMSE, and "
            "the whole model's relative RMSE and largest difference over its output's RMS.")
    return note + "\n\n" + table(["model", "variant", "target", "median step, SE blocks", "median step, other blocks",
                                  "largest block relative RMSE", "whole model relative RMSE",
                                  "whole model max abs / RMS"], out)


def block_se_blocks(x: Experiments) -> str:
    """The per-block table (the per-layer profile the v2 survey did not archive): relative RMSE per variant."""
    if not x.se:
        return "No rows of study/se_control.py came with the study."
    columns = list(dict.fromkeys((r["variant"], r["target"]) for r in x.se))
    cells = {(r["model"], r["block"], r["variant"], r["target"]): r for r in x.se}
    out = []
    for model, block, se in dict.fromkeys((r["model"], r["block"], r["se"]) for r in x.se):
        out.append([model, block, "SE" if se else "", *(sci(cells[(model, block, *c)]["relative_rmse"])
                                                       if (model, block, *c) in cells else "-" for c in columns)])
    return ("Relative RMSE at each block's output, per variant and target (`SE`: the block holds an SE block as "
            "built):\n\n" + table(["model", "block", "SE", *(f"{v} {t}" for v, t in columns)], out))


def block_se_replica(x: Experiments) -> str:
    """The SE control's rows measured again against the archived ones (same script, seed and images, another
    session): how much of a row is the run's own, which a comparison between rows must exceed."""
    if not x.se_replica:
        return "No second measurement of the SE control's rows came with the study."
    archived = {(r["model"], r["variant"], r["target"], r["block"]): r for r in x.se}
    pairs = [(archived[key], r) for r in x.se_replica if (key := (r["model"], r["variant"], r["target"], r["block"])) in archived]
    rows = [[a["model"], a["variant"], a["target"], f"{sci(a['relative_rmse'])} / {sci(b['relative_rmse'])}",
             f"{sci(a['max_abs_over_rms'])} / {sci(b['max_abs_over_rms'])}"] for a, b in pairs if a["block"] == "whole model"]
    moved = {k: [abs(b[k] / a[k] - 1) for a, b in pairs if a[k]] for k in ("relative_rmse", "max_abs_over_rms")}
    said = "; ".join(f"{name} by at most {100 * max(v):.1f}% (median {100 * statistics.median(v):.1f}%)"
                     for name, v in (("relative RMSE", moved["relative_rmse"]), ("max abs / RMS", moved["max_abs_over_rms"])) if v)
    return (f"The SE control's rows measured again (the same script, seed and images, another session), {len(pairs)} "
            f"block rows matched to the archived ones: {said}. The whole model, archived / again:\n\n"
            + table(["model", "variant", "target", "relative RMSE", "max abs / RMS"], rows))


def check_decisions(records: list[dict]) -> dict[tuple, tuple]:
    """Each check's (passed, failure class), by (tier, model, input set, target)."""
    return {(c["tier"], c["model"], c["inputs"], c["target"]): (bool(c["passed"]), c.get("failure_class"))
            for c in records if c["kind"] == "check"}


def image_decisions(rows: list[dict], threads: int) -> dict[tuple, tuple]:
    """Each image's (decision changed, error) by (target, image), among detector_at_scale.py's rows at `threads`."""
    return {(r["target"], r["image"]): (decision_changed(r), r.get("error")) for r in rows if r["threads"] == threads}


def unstable(first: dict[tuple, tuple], second: dict[tuple, tuple]) -> list[tuple]:
    """The keys both runs decided whose decisions differ, in the first run's order."""
    return [key for key, decided in first.items() if key in second and second[key] != decided]


def block_llm(x: Experiments) -> str:
    """The trained language model on every target: tier 1's verdict and required atol beside text generation's
    tier 3 (teacher-forced next-token statistics, then each side's own greedy continuations)."""
    checks = [r for r in x.llm if r.get("kind") == "check"]
    if not checks:
        return "examples/llm.yaml's run did not come with the study."
    tier1 = {c["target"]: c for c in checks if c["tier"] == 1}
    rows = []
    for c in (c for c in checks if c["tier"] == 3):
        m, gen, one = c["metrics"], c.get("generation") or {}, tier1.get(c["target"], {})
        diverged = [p["first_divergence"] for p in gen.get("prompts") or [] if p["first_divergence"] is not None]
        rows.append([c["target"], ("pass" if one.get("passed") else "FAIL") + f" {one.get('required_atol') or 0:.1e}",
                     "agrees" if c["passed"] else c["failure_class"], f"{m['top1_agreement']:.4f}",
                     f"{m['kl_mean']:.1e}", f"{m['kl_p99']:.1e}", f"{m['delta_p_rms']:.1e}", f"{m['perplexity_ratio']:.4f}",
                     f"{m['real_flips']} / {m['near_tie_flips']}",
                     f"{len(gen.get('prompts') or []) - len(diverged)}/{len(gen.get('prompts') or [])}",
                     min(diverged) if diverged else "-"])
    positions = next((c["metrics"].get("positions") for c in checks if c["tier"] == 3), None)
    return (f"examples/llm.yaml: tier 1 (verdict and required atol at the gate) and text generation's tier 3 on "
            f"{positions} next-token decisions (teacher-forced) and each side's greedy continuations "
            f"(free-running: prompts whose continuation matches the reference's exactly; the earliest new token at "
            f"which one differs).\n\n"
            + table(["target", "tier 1", "tier 3", "top-1 agreement", "mean KL", "p99 KL", "delta p RMS",
                     "perplexity ratio", "real / near-tie flips", "continuations equal", "first divergence"], rows))


def _pm(m: dict, key: str, scale: float = 1.0, fmt: str = ".4g") -> str:
    """`value ± SE` of a text-generation statistic (its standard error under `key_se`), scaled (100: percent)."""
    value, se = m.get(key), m.get(f"{key}_se")
    if value is None:
        return "nan"
    return f"{value * scale:{fmt}} ± {se * scale:.2g}" if se is not None else f"{value * scale:{fmt}}"


def _smollm2_checks(x: Experiments) -> tuple[dict, list[dict]]:
    """study/smollm2.yaml's tier-1 checks by target and its tier-3 checks in the run's order."""
    checks = [r for r in x.smollm2 if r.get("kind") == "check"]
    return {c["target"]: c for c in checks if c["tier"] == 1}, [c for c in checks if c["tier"] == 3]


def block_smollm2(x: Experiments) -> str:
    """SmolLM2-135M-Instruct on every target: tier 1 beside text generation's statistics as llama-perplexity's
    `--kl-divergence` prints them (each with its standard error), read from the archived records."""
    tier1, tier3 = _smollm2_checks(x)
    if not tier3:
        return "study/smollm2.yaml's run did not come with the study."
    env = next((r for r in x.smollm2 if r.get("kind") == "run"), {}).get("environment") or {}
    m0 = tier3[0]["metrics"]
    margin = (tier3[0].get("thresholds") or {}).get("near_tie_margin")
    rows = []
    for c in tier3:
        m, one = c["metrics"], tier1.get(c["target"], {})
        rows.append([c["target"], ("pass" if one.get("passed") else "FAIL") + f" {one.get('required_atol') or 0:.1e}",
                     "agrees" if c["passed"] else c["failure_class"], _pm(m, "ppl_target"),
                     _pm(m, "perplexity_ratio", fmt=".4f"), _pm(m, "kl_mean", fmt=".2e"),
                     _pm(m, "same_top1", 100, ".2f"), f"{m['real_flips']} / {m['near_tie_flips']}",
                     _pm(m, "delta_p_rms", 100, ".3g")])
    took = x.smollm2_time
    return (f"study/smollm2.yaml (parity at {(env.get('git_commit') or 'unknown')[:10]}, "
            f"{env.get('threads')} torch threads, {(env.get('cpu') or {}).get('model')}"
            + (f"; {duration(took['wall_s'])} wall, {took.get('peak_mib', 0) / 1024:.1f} GiB peak resident (GNU time)" if took else "")
            + f"): {m0['positions']} scored next-token positions, reference (eager float32) perplexity "
            f"{_pm(m0, 'ppl_reference')}. Every ± is one standard error as llama-perplexity computes it, over the "
            f"positions taken as independent (consecutive positions of a window are not). Same top-1 counts every "
            f"position whose most likely token is the same; a flip is a near tie when the reference's top two "
            f"are within {margin} in probability. Tier 1: the verdict at the gate and the required atol.\n\n"
            + table(["target", "tier 1", "tier 3", "PPL(target)", "PPL(target)/PPL(reference)", "mean KLD",
                     "same top-1 (%)", "real / near-tie flips", "RMS Δp (%)"], rows))


def block_smollm2_spread(x: Experiments) -> str:
    """The same checks' KL and Δp distributions over the positions (llama-perplexity's percentiles)."""
    _, tier3 = _smollm2_checks(x)
    if not tier3:
        return "study/smollm2.yaml's run did not come with the study."
    rows = [[c["target"], *(f"{c['metrics'][k]:.2e}" for k in ("kl_median", "kl_p90", "kl_p99", "kl_p999", "kl_max")),
             _pm(c["metrics"], "delta_p_mean", 100, ".3f"),
             *(f"{100 * c['metrics'][k]:.2f}" for k in ("delta_p_min", "delta_p_p01", "delta_p_p99", "delta_p_max"))]
            for c in tier3]
    return ("KL divergence per position (reference ‖ target) and Δp (the target's probability of the text's next token "
            "less the reference's, in percent) over the same positions: percentiles as llama-perplexity takes them.\n\n"
            + table(["target", "KLD median", "KLD 90%", "KLD 99%", "KLD 99.9%", "KLD max", "mean Δp (%)",
                     "Δp min", "Δp 1%", "Δp 99%", "Δp max"], rows))


def block_repro(x: Experiments) -> str:
    lines = []
    if x.repro:
        first, second = (check_decisions(r) for r in x.repro)
        f1 = [{(c["model"], c["inputs"], c["target"]): (c.get("metrics") or {}).get("f1") for c in r
               if c["kind"] == "check" and c["tier"] == 3} for r in x.repro]
        keys = unstable(first, second)
        rows = []
        for key in dict.fromkeys(k[1:] for k in first):
            for tier in (1, 3):
                k = (tier, *key)
                if k in first and k in second:
                    word = {True: "pass", False: "FAIL"}
                    cells = [f"{word[run[k][0]]} {run[k][1] or ''}".strip()
                             + (f" (F1 {f[key]:.3f})" if tier == 3 and f.get(key) is not None else "")
                             for run, f in ((first, f1[0]), (second, f1[1]))]
                    rows.append([key[0], key[2], tier, *cells, "**differs**" if k in keys else "same"])
        runs = [next((r for r in records if r["kind"] == "run"), {}).get("environment") or {} for records in x.repro]
        said = [f"{e.get('threads')} thread{'' if e.get('threads') == 1 else 's'} at parity {(e.get('git_commit') or 'unknown')[:10]}"
                f" on {(e.get('cpu') or {}).get('model')} ({', '.join((e.get('cpu') or {}).get('flags') or [])})"
                for e in runs]
        lines += [f"study/detectors_float32.yaml, one run each: {said[0]}; {said[1]}. {len(keys)} of "
                  f"{len(first.keys() & second.keys())} decisions differ between the two runs"
                  + ("" if runs[0].get("git_commit") == runs[1].get("git_commit") else
                     ", which differ in commit as well as in threads") + ".", "",
                  table(["model", "target", "tier", "one thread", "two threads", ""], rows)]
    else:
        lines.append("study/repro_threads.sh's two runs did not come with the study.")
    threads = sorted({r["threads"] for r in x.detector})
    if len(threads) == 2:
        first, second = (image_decisions(x.detector, t) for t in threads)
        rows = []
        for target in dict.fromkeys(k[0] for k in first):
            both = [k for k in first if k[0] == target and k in second]
            keys = [k for k in unstable(first, second) if k[0] == target]
            rows.append([target, len(both), sum(first[k][0] for k in both), sum(second[k][0] for k in both), len(keys),
                         ", ".join(k[1] for k in keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")])
        lines += ["", f"The trained detector at scale (study/detector_at_scale.py) at {threads[0]} and {threads[1]} threads: "
                      "an image whose decision changed in one run and not in the other differs (one run each).", "",
                  table(["target", "images in both runs", f"changed at {threads[0]}", f"changed at {threads[1]}",
                         "differs", "which"], rows)]
    return "\n".join(lines)


BLOCKS = {
    "design": block_design,
    "headline": block_headline,
    "findings": block_findings,
    "tolerance": block_tolerance,
    "per-task": block_per_task,
    "per-target": block_per_target,
    "per-model": block_per_model,
    "scale-free": block_scale_free,
    "intervals": block_intervals,
    "seeds": block_seeds,
    "tier3": block_tier3,
    "flips": block_flips,
    "adapter": block_adapter,
    "adapter-fidelity": block_adapter_fidelity,
    "taxonomy": block_taxonomy,
    "localize": block_localize,
    "localize-rerun": block_localize_rerun,
    "latency": block_latency,
    "comparison": block_comparison,
    "like-for-like": block_like_for_like,
    "run": block_run,
}
# Blocks rendered from the first run (the four-target design), kept for comparison.
FIRST_BLOCKS = {
    "first-design": block_design,
    "first-headline": block_headline,
    "first-intervals": block_intervals,
    "first-per-model": block_per_model,
    "first-tier3": block_tier3,
    "first-adapter": block_adapter,
    "first-like-for-like": block_like_for_like,
    "first-run": block_run,
}
# Blocks rendered from the trained models' run.
TRAINED_BLOCKS = {
    "trained-design": block_design,
    "trained-results": block_trained,
    "trained-scale-free": block_scale_free,
    "trained-tier3": block_tier3,
    "trained-flips": block_flips,
    "trained-adapter": block_adapter,
    "trained-run": block_run,
}
# Blocks rendered from the study/ experiments' rows (Experiments).
EXPERIMENT_BLOCKS = {
    "detector-scale": block_detector_scale,
    "detector-mechanisms": block_detector_mechanisms,
    "se-control": block_se_control,
    "se-blocks": block_se_blocks,
    "se-replica": block_se_replica,
    "repro": block_repro,
    "llm": block_llm,
    "smollm2": block_smollm2,
    "smollm2-spread": block_smollm2_spread,
}
MARKER = re.compile(r"<!-- study:([\w-]+) -->\n.*?<!-- /study:\1 -->", re.S)


def render(doc: str, study: Study, trained: Study | None = None, first: Study | None = None,
           experiments: Experiments | None = None, intervals: list[dict[str, Any]] | None = None) -> str:
    """`doc` with every generated block rewritten (the `trained-*` blocks from `trained`, the `first-*` ones from
    `first`, the study/ experiments' from `experiments`, when given); a block the document lacks, or one this
    script does not know, is an error (a table would go stale or missing without anyone noticing). `intervals`,
    when given, receives every BCa interval the blocks drew, in the document's order, each with its block, clusters,
    draws, seed and exact bounds (INTERVALS_ARCHIVE's lines)."""
    blocks = {name: (fn, study) for name, fn in BLOCKS.items()}
    if experiments is not None:
        blocks.update({name: (fn, experiments) for name, fn in EXPERIMENT_BLOCKS.items()})
    if trained is not None:
        blocks.update({name: (fn, trained) for name, fn in TRAINED_BLOCKS.items()})
    if first is not None:
        blocks.update({name: (fn, first) for name, fn in FIRST_BLOCKS.items()})
    found = MARKER.findall(doc)
    missing, unknown = sorted(set(blocks) - set(found)), sorted(set(found) - set(blocks))
    if missing or unknown:
        raise SystemExit(f"study document blocks out of step: missing {missing}, unknown {unknown}")

    global _drawn
    drawn: list[dict[str, Any]] = []

    def rewrite(m: re.Match) -> str:
        fn, source = blocks[m.group(1)]
        start = len(drawn)
        text = fn(source)
        drawn[start:] = [{"block": m.group(1), **line} for line in drawn[start:]]
        return f"<!-- study:{m.group(1)} -->\n{text}\n<!-- /study:{m.group(1)} -->"

    _drawn = drawn
    try:
        out = MARKER.sub(rewrite, doc)
    finally:
        _drawn = None
    if intervals is not None:
        intervals.extend(drawn)
    return out


def interval_lines(intervals: list[dict[str, Any]]) -> str:
    """INTERVALS_ARCHIVE's text: one JSON line per interval (floats as Python writes them: exact)."""
    return "".join(json.dumps(line) + "\n" for line in intervals)


def recompute_intervals(path: Path = None) -> list[str]:
    """Each archived interval drawn again from its own clusters, draws and seed: the lines whose bounds differ in
    any bit (none, when the document's intervals are reproducible)."""
    path = path or INTERVALS_ARCHIVE
    wrong = []
    for i, line in enumerate(load_records(path)):
        bounds = bca_interval([tuple(c) for c in line["clusters"]], line["resamples"], line["seed"], line["level"])
        if bounds != (line["low"], line["high"]):
            wrong.append(f"{path.name}:{i + 1} ({line['block']}): archived {line['low']!r} to {line['high']!r}, "
                         f"drawn again {bounds[0]!r} to {bounds[1]!r}")
    return wrong


def archive(run_dir: Path, records_out: Path = ARCHIVE, time_out: Path = TIME_ARCHIVE,
            survey_out: Path | None = None) -> None:
    """A compact copy of a run's records (detection pictures' box lists dropped), its time report and, when
    the run folder has one, its per-layer survey (each line cut to SURVEY_FIELDS)."""
    records_out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(records_out, "wt", encoding="utf-8", compresslevel=9) as f:
        for record in load_records(run_dir):
            record.pop("pictures", None)
            f.write(json.dumps(record) + "\n")
    timing = run_dir / "time.txt"
    if timing.is_file():
        time_out.write_text(timing.read_text(encoding="utf-8"), encoding="utf-8")
    survey = run_dir / "localize" / "survey.jsonl"
    if survey_out is not None and not survey.is_file():
        survey_out.unlink(missing_ok=True)  # an older run's survey would describe other records
    elif survey_out is not None:
        with gzip.open(survey_out, "wt", encoding="utf-8", compresslevel=9) as f:
            for line in load_records(survey):
                f.write(json.dumps({k: line[k] for k in SURVEY_FIELDS if k in line}) + "\n")


def _survey(source: Path) -> list[dict[str, Any]] | None:
    """The per-layer survey of the study's run: the archived one with the archive, else the run folder's own."""
    path = SURVEY_ARCHIVE if source == ARCHIVE else (source if source.is_dir() else source.parent) / "localize" / "survey.jsonl"
    return load_records(path) if path.is_file() else None


def _timing(source: Path, archived: Path, archived_time: Path, told: str | None = None) -> dict[str, float] | None:
    """GNU time's figures for a run: the file told, the archived one with the archive, else time.txt beside it."""
    if told:
        time_file = Path(told)
    elif source == archived:
        time_file = archived_time
    else:
        time_file = (source if source.is_dir() else source.parent) / "time.txt"
    return wall_time(time_file.read_text(encoding="utf-8")) if time_file.is_file() else None


def load_experiments(detector: str | None = None, se: str | None = None,
                     repro: list[str] | None = None, llm: str | None = None, se_replica: str | None = None,
                     smollm2: str | None = None) -> Experiments:
    """The study/ experiments' rows: the files given, else the archived ones (an experiment with neither is empty).
    A run given as a folder (llm, smollm2) is read as records."""
    def rows(given: str | None, archived: Path) -> list[dict] | None:
        path = Path(given) if given else archived
        return load_records(path) if path.exists() else None

    runs = [Path(r) for r in repro] if repro else list(REPRO_ARCHIVES)
    smollm2_source = Path(smollm2) if smollm2 else SMOLLM2_ARCHIVE
    return Experiments(rows(detector, DETECTOR_ARCHIVE), rows(se, SE_ARCHIVE),
                       tuple(load_records(r) for r in runs) if all(r.exists() for r in runs) else None,
                       rows(llm, LLM_ARCHIVE), rows(se_replica, SE_REPLICA_ARCHIVE), rows(smollm2, SMOLLM2_ARCHIVE),
                       _timing(smollm2_source, SMOLLM2_ARCHIVE, SMOLLM2_TIME_ARCHIVE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="?", default=str(ARCHIVE),
                        help="the study's run (examples/study.yaml): a run folder, records.jsonl or records.jsonl.gz "
                             "(default: the archived one)")
    parser.add_argument("--time", help="GNU time -v output of the run (default: time.txt next to the records, "
                                       "or docs/study-time.txt with the archive)")
    parser.add_argument("--fidelity", default=str(FIDELITY_ARCHIVE),
                        help="benchmarks/adapter_fidelity.py --json's rows (default: the archived ones)")
    parser.add_argument("--trained", help="the trained models' run (study/trained.yaml): a folder or records "
                                          "(default: docs/study-trained-records.jsonl.gz)")
    parser.add_argument("--first", help="the first run, the four-target design: a folder or records "
                                        "(default: docs/study-v1-records.jsonl.gz)")
    parser.add_argument("--detector", help="study/detector_at_scale.py --json's rows, both thread counts in one file "
                                           f"(default: {DETECTOR_ARCHIVE.relative_to(ROOT)})")
    parser.add_argument("--se", help=f"study/se_control.py --json's rows (default: {SE_ARCHIVE.relative_to(ROOT)})")
    parser.add_argument("--se-replica", help="study/se_control.py --json's rows for rows --se has, measured again "
                                             f"(default: {SE_REPLICA_ARCHIVE.relative_to(ROOT)})")
    parser.add_argument("--repro", nargs=2, metavar=("ONE_THREAD", "TWO_THREADS"),
                        help="study/repro_threads.sh's two run folders (default: the archived records)")
    parser.add_argument("--llm", help="examples/llm.yaml's run: a folder or records (default: the archived records)")
    parser.add_argument("--smollm2", help="study/smollm2.yaml's run: a folder or records (default: "
                                           f"{SMOLLM2_ARCHIVE.relative_to(ROOT)})")
    parser.add_argument("--doc", default=str(DOC), help="the document to rewrite (default: docs/study.md; "
                                                        "-: print the tables instead)")
    parser.add_argument("--recompute", action="store_true",
                        help=f"draw every interval of {INTERVALS_ARCHIVE.relative_to(ROOT)} again from its clusters, "
                             "draws and seed, and say which bounds differ (exit 1 if any)")
    parser.add_argument("--localize-rerun", type=Path, metavar="FOLDER",
                        help="parity localize output folders (one per check) of survey checks localized again: with "
                             f"--archive, their layers records are added to {RERUN_ARCHIVE.relative_to(ROOT)} (a "
                             "check already there is replaced)")
    parser.add_argument("--archive", action="store_true",
                        help="first copy the runs given as folders (and the fidelity rows) into docs/ (see above)")
    args = parser.parse_args(argv)
    if args.recompute:
        wrong = recompute_intervals()
        print("\n".join(wrong) or f"{INTERVALS_ARCHIVE.relative_to(ROOT)}: every interval drawn again, bit for bit")
        return 1 if wrong else 0
    source = Path(args.records)
    fidelity_source = Path(args.fidelity)
    trained_source = Path(args.trained) if args.trained else TRAINED_ARCHIVE
    first_source = Path(args.first) if args.first else FIRST_ARCHIVE
    if args.archive:
        if not (source.is_dir() or trained_source.is_dir() or first_source.is_dir() or fidelity_source != FIDELITY_ARCHIVE
                or args.detector or args.se or args.se_replica or args.repro or args.llm or args.smollm2
                or args.localize_rerun):
            parser.error("--archive takes a run folder (the study's, --trained's, --first's, --repro's), --fidelity, "
                         "--detector or --se rows")
        if source.is_dir():
            archive(source, ARCHIVE, TIME_ARCHIVE, SURVEY_ARCHIVE)
            source = ARCHIVE
        if trained_source.is_dir():
            archive(trained_source, TRAINED_ARCHIVE, TRAINED_TIME_ARCHIVE)
            trained_source = TRAINED_ARCHIVE
        if first_source.is_dir():
            archive(first_source, FIRST_ARCHIVE, FIRST_TIME_ARCHIVE)
            first_source = FIRST_ARCHIVE
        for given, archived in ((args.detector, DETECTOR_ARCHIVE), (args.se, SE_ARCHIVE),
                                (args.se_replica, SE_REPLICA_ARCHIVE)):
            if given:
                with gzip.open(archived, "wt", encoding="utf-8", compresslevel=9) as f:
                    f.writelines(json.dumps(r) + "\n" for r in load_records(given))
        for run_dir, archived in zip(args.repro, REPRO_ARCHIVES, strict=True) if args.repro else ():
            archive(Path(run_dir), archived, archived.with_name(archived.name.replace("-records.jsonl.gz", "-time.txt")))
        if args.llm:
            archive(Path(args.llm), LLM_ARCHIVE, LLM_ARCHIVE.with_name("study-llm-time.txt"))
        if args.smollm2:
            archive(Path(args.smollm2), SMOLLM2_ARCHIVE, SMOLLM2_TIME_ARCHIVE)
        if args.localize_rerun:
            merged = merge_reruns(load_records(RERUN_ARCHIVE) if RERUN_ARCHIVE.is_file() else [],
                                  rerun_lines(args.localize_rerun))
            with gzip.open(RERUN_ARCHIVE, "wt", encoding="utf-8", compresslevel=9) as f:
                f.writelines(json.dumps(r) + "\n" for r in merged)
        args.detector = args.se = args.se_replica = args.repro = args.llm = args.smollm2 = None
        if fidelity_source != FIDELITY_ARCHIVE:
            FIDELITY_ARCHIVE.write_text(fidelity_source.read_text(encoding="utf-8"), encoding="utf-8")
            fidelity_source = FIDELITY_ARCHIVE
    fidelity = load_records(fidelity_source) if fidelity_source.is_file() else None
    rerun = load_records(RERUN_ARCHIVE) if source == ARCHIVE and RERUN_ARCHIVE.is_file() else None
    study = Study(load_records(source), _timing(source, ARCHIVE, TIME_ARCHIVE, args.time), _survey(source), fidelity,
                  rerun)
    trained = (Study(load_records(trained_source), _timing(trained_source, TRAINED_ARCHIVE, TRAINED_TIME_ARCHIVE))
               if trained_source.exists() else None)
    first = (Study(load_records(first_source), _timing(first_source, FIRST_ARCHIVE, FIRST_TIME_ARCHIVE))
             if first_source.exists() else None)
    experiments = load_experiments(args.detector, args.se, args.repro, args.llm, args.se_replica, args.smollm2)
    if args.doc == "-":
        blocks = [(name, block, study) for name, block in BLOCKS.items()]
        blocks += [(name, block, trained) for name, block in TRAINED_BLOCKS.items()] if trained else []
        blocks += [(name, block, first) for name, block in FIRST_BLOCKS.items()] if first else []
        blocks += [(name, block, experiments) for name, block in EXPERIMENT_BLOCKS.items()]
        for name, block, source_study in blocks:
            print(f"## {name}\n\n{block(source_study)}\n")
        return 0
    doc = Path(args.doc)
    intervals: list[dict[str, Any]] = []
    doc.write_text(render(doc.read_text(encoding="utf-8"), study, trained, first, experiments, intervals),
                   encoding="utf-8")
    if doc.resolve() == DOC:
        INTERVALS_ARCHIVE.write_text(interval_lines(intervals), encoding="utf-8")
    print(f"{doc}: blocks from {source}" + (f", {trained_source}" if trained else "") + (f", {first_source}" if first else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
