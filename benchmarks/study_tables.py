"""docs/study.md's tables, computed from a study run's records alone (nothing is typed in by hand).

The study document is prose with generated blocks between markers, `<!-- study:NAME -->` and
`<!-- /study:NAME -->`; this script rewrites every block from the records and refuses a document whose
blocks and this script's tables differ. The unit of every pass rate is the tier-1 check, one
(model, input set, target) at one atol; the 95% confidence intervals are Wilson score intervals over
those checks, treating each as an independent trial.

    .venv/bin/python benchmarks/study_tables.py                      # from docs/study-records.jsonl.gz
    .venv/bin/python benchmarks/study_tables.py parity-out/study --archive   # a new run: archive it, then render

`--archive` copies the run's records into docs/study-records.jsonl.gz (compressed, the detection
pictures' box lists dropped: the tables do not use them) and its `time.txt` (GNU time's report of the
run, when present) into docs/study-time.txt, so the document can be regenerated from the repository.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from parity.records import tolerance_key
from parity.records.summary import judged, latency_rows, summarize
from parity.taxonomy import MEANINGS, SEVERITY

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "study.md"
ARCHIVE = ROOT / "docs" / "study-records.jsonl.gz"
TIME_ARCHIVE = ROOT / "docs" / "study-time.txt"
# The trained models' run (study/trained.yaml): its own records and time, its own blocks (`trained-*`).
TRAINED_ARCHIVE = ROOT / "docs" / "study-trained-records.jsonl.gz"
TRAINED_TIME_ARCHIVE = ROOT / "docs" / "study-trained-time.txt"

# The published study's figures, as issue #6 quotes them: 672 checks pooled over its tolerance sweep,
# 72.0% passing, each tolerance between 71.4% and 73.8%. They are the comparison, not a result of ours.
PUBLISHED = {"checks": 672, "pass_rate": 0.720, "per_tolerance_low": 0.714, "per_tolerance_high": 0.738}
Z95 = 1.959963984540054  # the standard normal quantile of a two-sided 95% interval
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


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


def cluster_bootstrap(outcomes: dict[str, list[bool]], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """A 95% percentile interval of the pass rate when whole clusters (one model's checks, which share its
    architecture) are the independent units: clusters are drawn with replacement, each draw's rate is its
    passes over its checks. Seeded, so the document regenerates byte for byte. (0, 1) with no checks."""
    clusters = [(sum(v), len(v)) for v in outcomes.values() if v]
    if not clusters:
        return 0.0, 1.0
    rng = random.Random(seed)
    rates = []
    for _ in range(resamples):
        draw = [clusters[rng.randrange(len(clusters))] for _ in clusters]
        rates.append(sum(p for p, _ in draw) / sum(n for _, n in draw))
    rates.sort()
    return rates[int(0.025 * resamples)], rates[min(resamples - 1, int(0.975 * resamples))]


class Study:
    """The facts the tables are made of, from the records of one run."""

    def __init__(self, records: list[dict[str, Any]], timing: dict[str, float] | None = None):
        self.records = records
        self.run = next(r for r in records if r["kind"] == "run")
        self.config = self.run["config"]
        self.summary = summarize(records)
        self.timing = timing
        self.keys = [tolerance_key(a) for a in self.config["tolerances"]["atol"]]
        self.gate_key = tolerance_key(self.summary["gate"])
        checks = [r for r in records if r["kind"] == "check"]
        self.tier1 = [c for c in checks if c["tier"] == 1]
        self.ran = [c for c in self.tier1 if judged(c)]
        self.tier3 = {(c["model"], c["inputs"], c["target"]): c for c in checks if c["tier"] == 3}
        self.models = {m["name"]: m for m in self.config["models"]}
        self.targets = list(dict.fromkeys(c["target"] for c in self.tier1))
        self.reference = self.tier1[0]["reference"] if self.tier1 else None

    def task(self, model: str) -> str:
        return self.models[model]["task"]

    def architecture(self, model: str) -> str:
        """What a model entry is built from: entries of one architecture (a detector with and without an
        adapter) are one cluster of correlated checks."""
        spec = self.models[model]
        return spec.get("builder") or spec.get("architecture") or spec.get("entry") or model

    def float32_targets(self) -> set[str]:
        ids = {}
        for t in self.config["targets"]:
            backend = t["backend"].rpartition(":")[2]
            ids[t.get("name") or f"{backend}-{t['device'].replace(':', '')}" + ("" if t["dtype"] == "float32"
                                                                                 else f"-{t['dtype']}")] = t["dtype"]
        return {target for target, dtype in ids.items() if dtype == "float32"}

    def by_architecture(self, checks: list[dict], key: str) -> dict[str, list[bool]]:
        """Each architecture's judged checks' verdicts at atol `key`: the clusters of the bootstrap."""
        out: dict[str, list[bool]] = defaultdict(list)
        for c in checks:
            if judged(c):
                out[self.architecture(c["model"])].append(bool(c["verdicts"].get(key)))
        return out

    def rate(self, checks: list[dict], key: str) -> tuple[int, int]:
        """(checks passing at atol `key`, checks judged) among `checks`; a check that could not run here
        (skipped), or whose reference failed, is not judged."""
        done = [c for c in checks if judged(c)]
        return sum(bool(c["verdicts"].get(key)) for c in done), len(done)

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


def block_design(s: Study) -> str:
    """What was run, from the run record's resolved experiment."""
    cfg = s.config
    tasks: dict[str, list[dict]] = defaultdict(list)
    for spec in cfg["models"]:
        tasks[spec["task"]].append(spec)
    builders = {spec.get("builder") or spec.get("entry") for spec in cfg["models"]}
    lines = [f"- **Models**: {len(builders)} distinct models in {len(cfg['models'])} entries."]
    for task, specs in sorted(tasks.items()):
        names = ", ".join(dict.fromkeys(spec.get("builder") or spec.get("entry") for spec in specs))
        lines.append(f"  - {task} ({len(specs)} {'entry' if len(specs) == 1 else 'entries'}): {names}")
    for spec in cfg["inputs"]:
        users = [m["name"] for m in cfg["models"] if m.get("inputs") is None or spec["name"] in m["inputs"]]
        pre = {k: v for k, v in (spec.get("preprocess") or {}).items() if v is not None and k in ("resize", "center_crop", "resize_multiple")}
        geometry = ", ".join(f"{k} {v[0] if isinstance(v, list) and len(v) == 1 else v}" for k, v in pre.items()) or "at their own size"
        lines.append(f"- **Input set `{spec['name']}`**: {', '.join(spec.get('images') or ['synthetic'])} ({geometry}); "
                     f"used by {len(users)} {'entry' if len(users) == 1 else 'entries'}.")

    def backend(b: dict) -> str:
        return f"{b['backend']} {b['device']} {b['dtype']}" + (f" {b['options']}" if b.get("options") else "")

    tol = cfg["tolerances"]
    tasks_cfg = cfg["tiers"].get("tasks") or {}
    # each task's own thresholds (`tiers.tasks.<task>`), or the flat ones of records written before tasks were plugins
    flat = {k: v for k, v in tasks_cfg.items() if not isinstance(v, dict)}
    flat.update({f"{task} {k}": v for task, own in tasks_cfg.items() if isinstance(own, dict) for k, v in own.items()})
    thresholds = ", ".join(f"{k} {v:g}" for k, v in flat.items() if k not in ("enabled", "output") and v is not None)
    lines += [
        f"- **Reference**: {backend(cfg['reference'])}. **Targets**: " + "; ".join(backend(t) for t in cfg["targets"]) + ".",
        f"- **Tolerances**: atol {', '.join(f'{a:g}' for a in tol['atol'])} at rtol {tol['rtol']:g}; gate {s.summary['gate']:g}. "
        f"**Repeats**: {cfg['repeats']}. **Tier 3**: " + (f"on ({thresholds})" if tasks_cfg.get("enabled") else "off")
        + f"; **tier 2**: {'on' if (cfg['tiers'].get('activations') or {}).get('enabled') else 'off'}.",
    ]
    return "\n".join(lines)


def block_headline(s: Study) -> str:
    a, t = s.summary["arithmetic"], s.summary["totals"]
    passed, total = s.rate(s.ran, s.gate_key)
    pooled_passed, pooled_total = s.pooled()
    tasks = Counter(s.task(m) for m in s.models)
    t3 = s.summary["tier3"]
    parts = ", ".join(f"{n} {task}" for task, n in sorted(tasks.items()))
    adapted = sum(1 for m in s.models.values() if m["task"] == "detection" and m.get("adapters"))
    return "\n".join([
        f"- **Checks counted:** {a['formula']}. Model entries: {len(s.models)} ({parts}; {adapted} of the "
        f"detection entries run with an adapter).",
        f"- **At the gate** (atol {s.summary['gate']:g}, rtol {s.summary['rtol']:g}): **{t['passed']} of {total} checks "
        f"pass ({pct(passed, total)}, 95% CI {ci(passed, total)})**, {t['failed']} fail, {t['skipped']} could not run here.",
        f"- **Pooled over the {len(s.keys)} tolerances** (the published study's unit): {pooled_passed} of "
        f"{pooled_total} verdicts pass ({pct(pooled_passed, pooled_total)}).",
        f"- **Tier 3** (does the target decide the same?): {t3['passed']} of {t3['checks']} task checks agree; "
        f"a tier-3 check exists only where both sides produced outputs.",
    ])


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
        gate_passed, gate_total = s.rate(mine, s.gate_key)
        rows.append([task, entries, len(mine), *cells, ci(gate_passed, gate_total),
                     f"{sum(bool(c['passed']) for c in t3)}/{len(t3)}"])
    return table(header, rows)


def block_per_target(s: Study) -> str:
    header = ["target", "checks"] + [f"pass at {k}" for k in s.keys] + ["95% CI at the gate", "largest max abs"]
    rows = []
    for target in s.targets:
        mine = [c for c in s.ran if c["target"] == target]
        cells = []
        for k in s.keys:
            passed, total = s.rate(mine, k)
            cells.append(f"{passed}/{total} ({pct(passed, total)})")
        gate_passed, gate_total = s.rate(mine, s.gate_key)
        largest = max((c["max_abs"] for c in mine if c.get("max_abs") is not None), default=None)
        rows.append([target, len(mine), *cells, ci(gate_passed, gate_total), sci(largest)])
    return table(header, rows)


def model_rows(s: Study) -> list[dict[str, Any]]:
    """Per model entry (and input set): each target's check at the gate, and how many passed."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in s.tier1:
        row = rows.setdefault((c["model"], c["inputs"]), {"model": c["model"], "inputs": c["inputs"], "cells": {},
                                                           "passed": 0, "judged": 0})
        row["cells"][c["target"]] = c
        if judged(c):
            row["judged"] += 1
            row["passed"] += bool(c["verdicts"].get(s.gate_key))
    return list(rows.values())


def _cell(s: Study, c: dict | None) -> str:
    if c is None:
        return "-"
    if c["status"] == "skipped":
        return "not run here"
    if c["status"] == "error":
        return "reference failed"
    if c["verdicts"].get(s.gate_key):
        return f"pass {sci(c['max_abs'])}"
    if c.get("max_abs") is None or not c.get("leaves"):
        return f"FAIL {c['failure_class']}"
    return f"FAIL {sci(c['max_abs'])} {c['failure_class']}"


def block_per_model(s: Study) -> str:
    header = ["model", "task", "init", "adapters"] + s.targets + ["passed at the gate"]
    rows = []
    for row in model_rows(s):
        spec = s.models[row["model"]]
        adapters = ", ".join(a["name"] if isinstance(a, dict) else str(a) for a in spec.get("adapters") or []) or "-"
        rows.append([row["model"], spec["task"], spec.get("init", "default"), adapters,
                     *(_cell(s, row["cells"].get(t)) for t in s.targets), f"{row['passed']}/{row['judged']}"])
    passed = sum(r["passed"] for r in model_rows(s))
    judged = sum(r["judged"] for r in model_rows(s))
    per_target = []
    for t in s.targets:
        p, n = s.rate([c for c in s.ran if c["target"] == t], s.gate_key)
        per_target.append(f"{p}/{n} pass")
    rows.append(["**all**", "", "", "", *per_target, f"**{passed}/{judged}**"])
    note = (f"Each cell: the verdict at the gate (atol {s.summary['gate']:g}), the largest absolute difference "
            "over every output, and the failure class of a failed check (a check whose target did not run has "
            "no difference to show).")
    return note + "\n\n" + table(header, rows)


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
    rows = latency_rows(s.records)
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


def _interval_row(s: Study, label: str, checks: list[dict]) -> list[Any]:
    passed, total = s.rate(checks, s.gate_key)
    clusters = s.by_architecture(checks, s.gate_key)
    low, high = cluster_bootstrap(clusters)
    return [label, f"{passed}/{total}", pct(passed, total), ci(passed, total),
            f"{100 * low:.1f}% to {100 * high:.1f}%", len(clusters)]


def block_intervals(s: Study) -> str:
    """Wilson's interval treats every check as independent; one model's checks are not (they share its
    architecture, and a detector's entries with and without the adapter share its weights)."""
    rows = [_interval_row(s, "all targets", s.ran)]
    rows += [_interval_row(s, t, [c for c in s.ran if c["target"] == t]) for t in s.targets]
    note = (f"At the gate (atol {s.summary['gate']:g}). Wilson: checks as independent trials. Clustered: a "
            f"percentile bootstrap that draws whole architectures with replacement ({BOOTSTRAP_RESAMPLES} draws, "
            f"seed {BOOTSTRAP_SEED}), so a model's checks stay together.")
    return note + "\n\n" + table(["checks", "passed", "rate", "Wilson 95%", "clustered 95%", "architectures"], rows)


def block_like_for_like(s: Study) -> str:
    """The pass rate restricted to what the published design judged: float32 targets, each model once."""
    float32 = s.float32_targets()
    unadapted = [c for c in s.ran if not s.models[c["model"]].get("adapters")]
    subsets = [("every check", s.ran),
               ("float32 targets", [c for c in s.ran if c["target"] in float32]),
               ("float32 targets, each model once (no adapter entries)", [c for c in unadapted if c["target"] in float32])]
    rows = []
    for label, checks in subsets:
        passed, total = s.rate(checks, s.gate_key)
        pooled = sum(s.rate(checks, k)[0] for k in s.keys)
        low, high = cluster_bootstrap(s.by_architecture(checks, s.gate_key))
        rows.append([label, f"{passed}/{total}", pct(passed, total), f"{100 * low:.1f}% to {100 * high:.1f}%",
                     f"{pooled}/{total * len(s.keys)}", pct(pooled, total * len(s.keys))])
    rows.append(["published study (pooled over its sweep)", "", "", "", str(PUBLISHED["checks"]),
                 f"{100 * PUBLISHED['pass_rate']:.1f}%"])
    return table(["checks", "at the gate", "rate", "clustered 95%", "pooled over the sweep", "pooled rate"], rows)


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
        f"parity at commit {(env.get('git_commit') or 'unknown')[:10]}.",
        f"- {s.config['repeats']} repeats per backend; {len(executions)} execution records; building models, "
        f"preparing backends and running them took {duration(spent)} of the run (the records' own times).",
    ]
    if s.timing:
        extra = f", peak resident memory {s.timing['peak_mib'] / 1024:.1f} GiB" if "peak_mib" in s.timing else ""
        cpu_s = s.timing.get("user_s", 0.0) + s.timing.get("system_s", 0.0)
        lines.append(f"- The whole `parity run`, start to exit: **{duration(s.timing['wall_s'])}** wall clock, "
                     f"{duration(cpu_s)} of CPU time{extra} (GNU time).")
    else:
        lines.append("- No wall-clock measurement came with these records (run it under `/usr/bin/time -v`, see above).")
    return "\n".join(lines)


def scale_free(check: dict) -> float | None:
    """The check's largest difference relative to its output's scale: max over the leaves of max_abs divided
    by the reference leaf's root mean square. None when no leaf records both (records written before
    `reference_rms` existed, or a check without a comparison)."""
    ratios = [leaf["max_abs"] / leaf["reference_rms"] for leaf in check.get("leaves") or []
              if leaf.get("max_abs") is not None and leaf.get("reference_rms")]
    return max(ratios) if ratios else None


def _scaled_cell(s: Study, c: dict | None) -> str:
    text = _cell(s, c)
    ratio = scale_free(c) if c is not None else None
    return text if ratio is None else f"{text} ({sci(ratio)} of RMS)"


def block_trained(s: Study) -> str:
    """Per trained model: each target's verdict at the gate, its largest absolute difference and that
    difference over the reference output's RMS (scale-free: comparable across models)."""
    rows = [[row["model"], row["inputs"], *(_scaled_cell(s, row["cells"].get(t)) for t in s.targets),
             f"{row['passed']}/{row['judged']}"] for row in model_rows(s)]
    passing = [(ratio, c) for c in s.ran if c["verdicts"].get(s.gate_key) and (ratio := scale_free(c)) is not None]
    passed, judged_n = s.rate(s.ran, s.gate_key)
    lines = [f"- **At the gate** (atol {s.summary['gate']:g}, rtol {s.config['tolerances']['rtol']:g}): "
             f"{passed} of {judged_n} checks pass ({pct(passed, judged_n)}, 95% CI {ci(passed, judged_n)})."]
    if passing:
        worst, c = max(passing, key=lambda pair: pair[0])
        lines.append(f"- The largest difference of a passing check, over its output's RMS: {sci(worst)} "
                     f"({c['model']} on {c['target']}).")
    note = ("Each cell: the verdict at the gate, the largest absolute difference over every output, the failure "
            "class of a failed check, and in brackets that difference over the reference output's RMS.")
    return "\n".join(lines) + "\n\n" + note + "\n\n" + table(["model", "inputs", *s.targets, "passed"], rows)


BLOCKS = {
    "design": block_design,
    "headline": block_headline,
    "findings": block_findings,
    "tolerance": block_tolerance,
    "per-task": block_per_task,
    "per-target": block_per_target,
    "per-model": block_per_model,
    "tier3": block_tier3,
    "adapter": block_adapter,
    "taxonomy": block_taxonomy,
    "latency": block_latency,
    "comparison": block_comparison,
    "like-for-like": block_like_for_like,
    "intervals": block_intervals,
    "run": block_run,
}
# Blocks rendered from the trained models' run.
TRAINED_BLOCKS = {
    "trained-design": block_design,
    "trained-results": block_trained,
    "trained-run": block_run,
}
MARKER = re.compile(r"<!-- study:([\w-]+) -->\n.*?<!-- /study:\1 -->", re.S)


def render(doc: str, study: Study, trained: Study | None = None) -> str:
    """`doc` with every generated block rewritten (the `trained-*` blocks from `trained`, when given); a
    block the document lacks, or one this script does not know, is an error (a table would go stale or
    missing without anyone noticing)."""
    blocks = {name: (fn, study) for name, fn in BLOCKS.items()}
    if trained is not None:
        blocks.update({name: (fn, trained) for name, fn in TRAINED_BLOCKS.items()})
    found = MARKER.findall(doc)
    missing, unknown = sorted(set(blocks) - set(found)), sorted(set(found) - set(blocks))
    if missing or unknown:
        raise SystemExit(f"study document blocks out of step: missing {missing}, unknown {unknown}")

    def rewrite(m: re.Match) -> str:
        fn, source = blocks[m.group(1)]
        return f"<!-- study:{m.group(1)} -->\n{fn(source)}\n<!-- /study:{m.group(1)} -->"

    return MARKER.sub(rewrite, doc)


def archive(run_dir: Path, records_out: Path = ARCHIVE, time_out: Path = TIME_ARCHIVE) -> None:
    """A compact copy of a run's records (detection pictures' box lists dropped) and its time report."""
    records_out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(records_out, "wt", encoding="utf-8", compresslevel=9) as f:
        for record in load_records(run_dir):
            record.pop("pictures", None)
            f.write(json.dumps(record) + "\n")
    timing = run_dir / "time.txt"
    if timing.is_file():
        time_out.write_text(timing.read_text(encoding="utf-8"), encoding="utf-8")


def _timing(source: Path, archived: Path, archived_time: Path, told: str | None = None) -> dict[str, float] | None:
    """GNU time's figures for a run: the file told, the archived one with the archive, else time.txt beside it."""
    if told:
        time_file = Path(told)
    elif source == archived:
        time_file = archived_time
    else:
        time_file = (source if source.is_dir() else source.parent) / "time.txt"
    return wall_time(time_file.read_text(encoding="utf-8")) if time_file.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="?", default=str(ARCHIVE),
                        help="a run folder, records.jsonl or records.jsonl.gz (default: the archived study)")
    parser.add_argument("--time", help="GNU time -v output of the run (default: time.txt next to the records, "
                                       "or docs/study-time.txt with the archive)")
    parser.add_argument("--trained", help="the trained models' run (study/trained.yaml): a folder or records "
                                          "(default: docs/study-trained-records.jsonl.gz)")
    parser.add_argument("--doc", default=str(DOC), help="the document to rewrite (default: docs/study.md; "
                                                        "-: print the tables instead)")
    parser.add_argument("--archive", action="store_true",
                        help="first copy the runs given as folders into docs/ (see above)")
    args = parser.parse_args(argv)
    source = Path(args.records)
    trained_source = Path(args.trained) if args.trained else TRAINED_ARCHIVE
    if args.archive:
        if not (source.is_dir() or trained_source.is_dir()):
            parser.error("--archive takes a run folder (the study's, --trained's or both)")
        if source.is_dir():
            archive(source)
            source = ARCHIVE
        if trained_source.is_dir():
            archive(trained_source, TRAINED_ARCHIVE, TRAINED_TIME_ARCHIVE)
            trained_source = TRAINED_ARCHIVE
    study = Study(load_records(source), _timing(source, ARCHIVE, TIME_ARCHIVE, args.time))
    trained = (Study(load_records(trained_source), _timing(trained_source, TRAINED_ARCHIVE, TRAINED_TIME_ARCHIVE))
               if trained_source.exists() else None)
    if args.doc == "-":
        blocks = [(name, block, study) for name, block in BLOCKS.items()]
        blocks += [(name, block, trained) for name, block in TRAINED_BLOCKS.items()] if trained else []
        for name, block, source_study in blocks:
            print(f"## {name}\n\n{block(source_study)}\n")
        return 0
    doc = Path(args.doc)
    doc.write_text(render(doc.read_text(encoding="utf-8"), study, trained), encoding="utf-8")
    print(f"{doc}: blocks from {source}" + (f" and {trained_source}" if trained else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
