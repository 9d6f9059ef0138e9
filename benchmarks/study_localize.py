"""The study's per-layer survey (RQ3): `parity localize` on the float32 tier-1 failures of a study run.

Which module does a float32 backend's drift start in? For every tier-1 check of the run that failed as
`numeric_drift` or `nonfinite` on a float32 target (a check that could not run has no layers to compare;
reduced-precision targets are left out: their drift starts everywhere at once), this runs
`parity localize` in a process of its own (one check's crash or hang cannot end the survey) and keeps its
`layers` record, with the class of the module each record names (`first_divergent`, `culprit`), read off
the built model: the records name modules by their path only.

Order, fixed before any result is seen: the order in which the run recorded the checks (the experiment's
order of models, then of targets). With `--follow PID` (the `parity run` process) the survey starts while the
run is still going and localizes each failure as the run records it, until that process has exited; on a
machine of few cores this lets the survey overlap the run. With `--budget`
(seconds) the survey starts no check once the budget is spent; the checks it did not reach are written as
such, so the tables say what the survey covered. With `--workers N`, N checks are localized at once (each in
its own process) once the followed run has exited; while it runs, one at a time, so the run keeps a core.
A survey started again on the same run folder keeps the lines it finds and localizes only the checks they
lack (those not reached in an earlier survey's budget included).

    .venv/bin/python benchmarks/study_localize.py parity-out/study --cache-dir parity-out/cache-study [--follow PID] [--budget 1800] [--workers 2]

Writes RUN_DIR/localize/survey.jsonl, one line per check: the layers record (or why there is none) and
`module_types`; each check's localize output (records, console) stays in RUN_DIR/localize/<check>/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCALIZED = ("numeric_drift", "nonfinite")  # the failures tier 2 explains: both sides produced outputs
CHECK_TIMEOUT_S = 600  # one check at most; with --budget, no later than the budget's end


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file that may still be written to (a line without its newline is not)."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def float32_targets(config: dict[str, Any]) -> set[str]:
    """The ids of the run's float32 targets, as its checks name them."""
    from parity.config.schema import BackendSpec

    return {BackendSpec(**t).id for t in config["targets"] if t.get("dtype", "float32") == "float32"}


def survey_checks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks to localize, in the order the run recorded them: its float32 targets' tier-1 failures that
    both sides produced outputs for."""
    runs = [r for r in records if r["kind"] == "run"]
    if not runs:
        return []
    float32 = float32_targets(runs[0]["config"])
    return [c for c in records if c["kind"] == "check" and c["tier"] == 1 and c["status"] == "ok"
            and c["passed"] is False and c["failure_class"] in LOCALIZED and c["target"] in float32]


def module_types(experiment_file: Path, model: str, names: list[str]) -> dict[str, str]:
    """The class name of each named module of the built model ('?' for a name it lacks)."""
    from parity.experiment import load_experiment
    from parity.runner.prepared import prepared_model

    exp = load_experiment(experiment_file)
    spec = next(m for m in exp.models if m.name == model)
    built, _ = prepared_model(spec, exp)
    modules = dict(built.named_modules())
    return {name: type(modules[name]).__name__ if name in modules else "?" for name in names}


def localize_one(experiment_file: Path, check: dict[str, Any], out: Path, cache_dir: Path,
                 timeout: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """One `parity localize` in its own process: the layers record it wrote, or why there is none."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "parity.cli", "localize", str(experiment_file), "--model", check["model"],
               "--target", check["target"], "--inputs", check["inputs"], "--out", str(out), "--cache-dir", str(cache_dir)]
    start = time.monotonic()
    with open(out / "console.txt", "w", encoding="utf-8") as console:
        try:
            subprocess.run(command, stdout=console, stderr=subprocess.STDOUT, timeout=timeout, env=os.environ.copy())
        except subprocess.TimeoutExpired:
            return {"error": f"localize did not finish in {timeout:.0f} s", "wall_s": time.monotonic() - start}
    wall = time.monotonic() - start
    written = out / "records.jsonl"
    layers = [r for r in read_jsonl(written) if r["kind"] == "layers"] if written.is_file() else []
    if not layers:
        tail = (out / "console.txt").read_text(encoding="utf-8").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"localize wrote no layers record: {tail[0][:200]}", "wall_s": wall}
    return {**layers[-1], "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the study run's --out folder")
    parser.add_argument("--experiment", type=Path, default=REPO / "examples" / "study.yaml")
    parser.add_argument("--cache-dir", type=Path, required=True, help="the run's artifact cache (its exports are reused)")
    parser.add_argument("--budget", type=float, default=None, help="seconds after which no further check is started")
    parser.add_argument("--follow", type=int, metavar="PID", help="localize failures as the run records them, until "
                                                                   "the process PID (the run) has exited")
    parser.add_argument("--workers", type=int, default=1, help="checks localized at once after the run has exited")
    args = parser.parse_args(argv)
    folder = args.run_dir / "localize"
    folder.mkdir(exist_ok=True)
    path = folder / "survey.jsonl"
    kept = [line for line in read_jsonl(path) if not (line.get("error") or "").startswith(NOT_REACHED)]
    surveyed = {key_of(line) for line in kept}
    start = time.monotonic()
    done = 0
    with open(path, "w", encoding="utf-8") as survey:
        survey.writelines(json.dumps(line) + "\n" for line in kept)
        survey.flush()
        while True:
            finished = args.follow is None or not running(args.follow)
            checks = survey_checks(read_jsonl(args.run_dir / "records.jsonl"))
            todo = [(i, c) for i, c in enumerate(checks[done:], start=done) if key_of(c) not in surveyed]
            with ThreadPoolExecutor(args.workers if finished else 1) as pool:
                for line in pool.map(lambda item: survey_line(args, item[1], item[0], start), todo):
                    survey.write(json.dumps(line) + "\n")  # in the run's order, whichever finished first
                    survey.flush()
            done = len(checks)
            if finished:
                return 0
            time.sleep(30)


NOT_REACHED = "not reached"


def key_of(line: dict[str, Any]) -> tuple[str, str, str]:
    """What names one check in the run and in the survey."""
    return line["model"], line["inputs"], line["target"]


def running(pid: int) -> bool:
    """Whether process `pid` still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def survey_line(args: argparse.Namespace, check: dict[str, Any], i: int, start: float) -> dict[str, Any]:
    """One check's line of the survey: its layers record and module types, or why there is none."""
    key = {k: check[k] for k in ("model", "inputs", "target")}
    left = CHECK_TIMEOUT_S if args.budget is None else args.budget - (time.monotonic() - start)
    if left <= 0:
        line = {**key, "kind": "layers", "error": f"{NOT_REACHED}: the survey's time budget was spent"}
    else:
        line = {**key, **localize_one(args.experiment, check, args.run_dir / "localize" / f"{i:02d}-{check['model']}-{check['target']}",
                                      args.cache_dir, min(CHECK_TIMEOUT_S, max(left, 60.0)))}
        named = [n for n in (line.get("first_divergent"), line.get("culprit")) if n]
        line["module_types"] = module_types(args.experiment, check["model"], named) if named else {}
    print(f"{i + 1} {key['model']} {key['target']}: {line.get('first_divergent') or line.get('error') or line.get('verdict')}",
          flush=True)
    return line


if __name__ == "__main__":
    sys.exit(main())
