"""The same layer-by-layer job done by Polygraphy and by parity, each as a whole process: wall time, peak
memory, and the first divergent layer each names.

The job: torchvision ResNet-18 (weights=None after torch.manual_seed(0), eval) on one seeded input
[1, 3, --size, --size] (parity's synthetic tensor: `torch.randn(..., float64)` from
`Generator().manual_seed(--seed)`, cast to float32); the ONNX Runtime (CPU) run of its dynamo export
is the target. A fault (tests/fixtures/faults.py `inject(model, --fault, --magnitude, "exporting")`: the
layer's output gains magnitude * std(output) times a fixed pattern, only while torch.export traces) puts a
divergence into the exported graph and nowhere else, so eager PyTorch stays clean.

- Polygraphy (PyPI `polygraphy`, used by this benchmark only) gets .onnx files and compares every ONNX
  value (`--onnx-outputs mark all`, elementwise: fails where |diff| > atol and reldiff > rtol) of
  faulty.onnx against a saved run of clean.onnx on the same input (`--load-inputs`): two processes,
  `polygraphy run clean.onnx ... --save-outputs ref.json` and `polygraphy run faulty.onnx ...
  --load-outputs ref.json`. Its wall time is their sum, its peak memory the larger of the two. Its first
  divergent layer is the first failing ONNX value in graph order (shown with the module scope the
  exporter tagged its node with). clean.onnx is the same hooked model with magnitude 0 (the output plus
  exactly 0), not the bare model: the fault's nodes shift the exporter's value names after it (`add_4`
  becomes the fault's addition, the residual addition becomes `add_5`), and Polygraphy matches values by
  name. The export step checks that both graphs name the same values for the same nodes. Its first
  failing value is therefore the fault's own `magnitude * std` product, inside the faulted layer.
- parity (`parity localize`, one process) gets the experiment file and a model builder: it imports torch
  and torchvision, builds the model, runs eager float32 as the reference with module hooks, exports the
  model to ONNX itself (or takes that export from its artifact cache), makes every layer's boundary value
  a graph output, runs ONNX Runtime once and compares layer by layer (`--granularity leaf --mode
  propagated`: the same job). Its numbers include the imports, the model build and the eager reference
  run, which Polygraphy's do not. Polygraphy is handed graphs that were exported before; the measured
  parity rounds likewise find their export in parity's artifact cache (a fresh cache folder, filled by
  one cold run first, which is shown on its own line with its ratios, for information). The export for
  Polygraphy (one process that exports both graphs and saves the input) is shown on its own line and not
  counted. A last parity run, `--granularity blocks --mode both` (the hierarchical default, the mode
  `parity localize` and tier 2 use), starts from an empty cache of its own (its exports included) and is
  compared with Polygraphy's export + save + compare, and its memory with Polygraphy's compare.

Both run in this interpreter's environment, where torch is installed; Polygraphy then imports torch too
(its JSON loader registers torch tensor (de)serializers whenever torch is importable), which is most of its
memory. Tolerances: atol 1e-4, rtol 1e-5 for both. Peak memory is the maximum resident set size of the
process and its children (os.wait4). The two Polygraphy runs and the parity run alternate for --rounds
rounds; each row shows the median wall time and the median peak memory of its rounds.
Goals (issue 29): the warm leaf run's wall time <= 0.6 x Polygraphy's save + compare, its peak memory <= 1.2 x
theirs; the default mode from an empty cache <= Polygraphy's export + save + compare, its peak memory <= 1.2 x
Polygraphy's compare.

Then, unless --no-compile, the same faulted ResNet-18 against a torch.compile target, the fault injected while
compiling (`inject(..., "compiling")`), as a user meets it: `parity run` of the experiment from an empty artifact
cache (tier 1, which fails and prints the `parity localize` command to run next), then that command exactly as
printed (default mode: blocks, both), which finds the run's compiled kernels in the run's cache as any localize
after a run on the same machine does (the run's `--cache-dir` is in the printed command); each a whole process. It
prints localize / run (goal <= 1.2). --compile-only measures this part alone (no Polygraphy needed).

Run it from the repository root (about two minutes on a small machine; needs `pip install polygraphy`):

    .venv/bin/python benchmarks/layerwise_vs_polygraphy.py [--rounds 3] [--size 224] [--fault layer3.0.conv2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ATOL, RTOL = 1e-4, 1e-5
LEAF_WALL_GOAL, DEFAULT_WALL_GOAL, MEMORY_GOAL = 0.6, 1.0, 1.2  # issue 29's
COMPILED_GOAL = 1.2  # parity localize / parity run of the same check on a compile target

BUILDER = '''"""The faulted ResNet-18 for parity (`build`), and the export for Polygraphy (run as a script)."""
import sys

sys.path.insert(0, {repo!r})  # tests.fixtures.faults

import torch
import torchvision

from tests.fixtures.faults import inject


def build(fault: str, magnitude: float, condition: str = "exporting") -> torch.nn.Module:
    torch.manual_seed(0)
    return inject(torchvision.models.resnet18(weights=None).eval(), fault, magnitude, condition)


def values(path):
    """Every value of the graph, in graph order: (name, op type, the module its node belongs to)."""
    import ast

    import onnx

    out = []
    for node in onnx.load(path).graph.node:
        scopes = [ast.literal_eval(p.value) for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
        module = scopes[0][-2] if scopes and len(scopes[0]) > 1 else ""  # the last scope is the node itself
        out += [[v, node.op_type, module] for v in node.output if v]
    return out


if __name__ == "__main__":
    import contextlib
    import io
    import json

    from polygraphy.json import save_json

    from parity.config.schema import Synthetic
    from parity.inputs.synthetic import make_synthetic

    fault, magnitude, size, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    x = make_synthetic(Synthetic(shape=[1, 3, size, size], seed=seed), 0).args[0]  # parity's own input
    for name, mag in (("clean", 0.0), ("faulty", magnitude)):
        with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
            torch.onnx.export(build(fault, mag), (x,), name + ".onnx", dynamo=True, external_data=False)
    clean, faulty = values("clean.onnx"), values("faulty.onnx")
    if clean != faulty:
        sys.exit("clean.onnx and faulty.onnx name their values differently: Polygraphy would compare wrong pairs")
    save_json([{{"x": x.numpy()}}], "inputs.json")
    with open("values.json", "w") as f:
        json.dump(faulty, f)
'''

EXPERIMENT = """name: layerwise
seed: 0
models:
  - {{name: resnet18, source: python, entry: "faulted:build", params: {{fault: {fault}, magnitude: {magnitude}}}}}
inputs:
  - {{name: noise, synthetic: {{shape: [1, 3, {size}, {size}], seed: {seed}}}}}
targets:
  - {{backend: onnxruntime}}
tolerances: {{atol: {atol}, rtol: {rtol}}}
tiers: {{activations: true}}
"""


@dataclass
class Run:
    tool: str
    wall_s: float
    peak_mb: float
    rc: int
    log: str
    names: str = ""


COMPILED = """name: compiled
seed: 0
models:
  - {{name: resnet18, source: python, entry: "faulted:build", params: {{fault: {fault}, magnitude: {magnitude}, condition: compiling}}}}
inputs:
  - {{name: noise, synthetic: {{shape: [1, 3, {size}, {size}], seed: {seed}}}}}
targets:
  - {{backend: compile}}
tolerances: {{atol: {atol}, rtol: {rtol}}}
"""


def measure(tool: str, cmd: list[str], cwd: Path) -> Run:
    """Run `cmd` as its own process: wall time, and the peak RSS of it and its children (os.wait4)."""
    log = cwd / f"{re.sub(r'[^a-z0-9]+', '-', tool.lower()).strip('-')}.log"
    with open(log, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    peak = usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux
    return Run(tool, wall, peak, os.waitstatus_to_exitcode(status), log.read_text())


def median_run(runs: list[Run]) -> Run:
    """The median wall time and the median peak memory of the rounds of one command (its last log)."""
    walls = ", ".join(f"{r.wall_s:.1f}" + (f" (exit {r.rc})" if r.rc != runs[-1].rc else "") for r in runs)
    return Run(runs[0].tool, statistics.median(r.wall_s for r in runs), statistics.median(r.peak_mb for r in runs),
               runs[-1].rc, runs[-1].log, f"[rounds: {walls} s]" if len(runs) > 1 else "")


def polygraphy_first(run: Run, values: list[list[str]]) -> str:
    """The first value (graph order) in Polygraphy's list of mismatched outputs, with its module scope."""
    found = re.search(r"Mismatched outputs: (\[.*?\])", run.log)
    if not found:
        return "none (every value within tolerance)" if run.rc == 0 else f"? (exit {run.rc}; see {run.tool} log)"
    failed = set(json.loads(found.group(1).replace("'", '"')))
    name, _, module = next(v for v in values if v[0] in failed)
    return f"{name} (a node of {module or 'the model'}), {len(failed)} values failed"


def parity_first(run: Run) -> str:
    first = re.search(r"first layer whose (?:own|propagated) error exceeds \S+: (\S+)", run.log)
    culprit = re.search(r"verdict: (\S+)", run.log)
    if run.rc != 0 or not culprit:
        return f"? (exit {run.rc}: {run.log.strip().splitlines()[-1] if run.log.strip() else ''})"
    return f"first {first.group(1) if first else 'none'}, culprit {culprit.group(1)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--fault", default="layer3.0.conv2", help="the layer to perturb on the ONNX side")
    parser.add_argument("--magnitude", type=float, default=1e-3, help="fault size, relative to std(output)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the input")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each measured command; medians (default 3)")
    parser.add_argument("--fail-fast", action="store_true", help="Polygraphy stops comparing at the first failure")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files and logs there")
    parser.add_argument("--no-compile", action="store_true", help="skip localize / run on a compile target")
    parser.add_argument("--compile-only", action="store_true", help="only localize / run on a compile target")
    args = parser.parse_args(argv)
    if args.compile_only:
        return compile_only(args)

    bin_dir = Path(sys.executable).parent
    polygraphy = str(bin_dir / "polygraphy") if (bin_dir / "polygraphy").exists() else shutil.which("polygraphy")
    if not polygraphy:
        print("polygraphy is not installed: pip install polygraphy", file=sys.stderr)
        return 2
    work = Path(args.keep or tempfile.mkdtemp(prefix="parity-vs-polygraphy-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "faulted.py").write_text(BUILDER.format(repo=str(REPO)))
    (work / "experiment.yaml").write_text(EXPERIMENT.format(fault=args.fault, magnitude=args.magnitude, size=args.size,
                                                             seed=args.seed, atol=ATOL, rtol=RTOL))
    tol = ["--atol", str(ATOL), "--rtol", str(RTOL)]
    common = ["--onnxrt", "--onnx-outputs", "mark", "all", "--load-inputs", "inputs.json"]
    localize = [sys.executable, "-m", "parity.cli", "localize", "experiment.yaml", "--cache-dir", "cache"]
    try:
        export = measure("export for Polygraphy", [sys.executable, "faulted.py", args.fault, str(args.magnitude),
                                                    str(args.size), str(args.seed)], work)
        if export.rc != 0:
            print(export.log, file=sys.stderr)
            return 1
        cold = measure("parity leaf, cold cache", [*localize, "--granularity", "leaf", "--mode", "propagated"], work)
        cold.names = parity_first(cold)
        values = json.loads((work / "values.json").read_text())
        rounds: dict[str, list[Run]] = {}
        for _ in range(args.rounds):  # interleaved, so that a slow spell of the machine hits both tools
            for tool, cmd in (
                ("polygraphy: save reference", [polygraphy, "run", "clean.onnx", *common, "--save-outputs", "ref.json"]),
                ("polygraphy: compare", [polygraphy, "run", "faulty.onnx", *common, "--load-outputs", "ref.json", *tol,
                                         *(["--fail-fast"] if args.fail_fast else [])]),
                ("parity leaf, propagated", [*localize, "--granularity", "leaf", "--mode", "propagated"]),
            ):
                rounds.setdefault(tool, []).append(measure(tool, cmd, work))
        ref, cmp, leaf = (median_run(runs) for runs in rounds.values())
        poly = Run("polygraphy (both runs)", ref.wall_s + cmp.wall_s, max(ref.peak_mb, cmp.peak_mb), cmp.rc, cmp.log)
        poly.names = polygraphy_first(cmp, values)
        leaf.names = f"{parity_first(leaf)} {leaf.names}"
        blocks = measure("parity default, cold cache", [*localize[:-1], "blocks-cache", "--granularity", "blocks",
                                                         "--mode", "both"], work)
        blocks.names = parity_first(blocks)
        compiled = None if args.no_compile else compiled_runs(work, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"ResNet-18, input [1, 3, {args.size}, {args.size}] seed {args.seed}, fault {args.fault} x {args.magnitude:g} "
          f"on the ONNX side, atol {ATOL:g}, rtol {RTOL:g}")
    print(f"(medians of {args.rounds} round(s), except the export and the cold runs: one each)")
    print(f"{'':30s} {'wall s':>7s} {'peak MB':>8s}  first divergent layer named")
    for run in (export, ref, cmp, poly, cold, leaf, blocks):
        print(f"{run.tool:30s} {run.wall_s:7.2f} {run.peak_mb:8.0f}  {run.names}")
    for name, value, goal in (("wall", leaf.wall_s / poly.wall_s, LEAF_WALL_GOAL),
                              ("peak memory", leaf.peak_mb / poly.peak_mb, MEMORY_GOAL)):
        print(f"parity / polygraphy {name}: {value:.2f} (goal <= {goal:g}): {'met' if value <= goal else 'NOT met'}")
    print(f"cold parity (its own export included) / polygraphy: wall {cold.wall_s / poly.wall_s:.2f}, "
          f"peak memory {cold.peak_mb / poly.peak_mb:.2f}; with Polygraphy's export counted too: wall "
          f"{cold.wall_s / (poly.wall_s + export.wall_s):.2f}, peak memory "
          f"{cold.peak_mb / max(poly.peak_mb, export.peak_mb):.2f} (information)")
    default_wall, default_memory = blocks.wall_s / (poly.wall_s + export.wall_s), blocks.peak_mb / cmp.peak_mb
    print(f"default parity localize (blocks, both), cold / polygraphy with its export: wall {default_wall:.2f} "
          f"(goal <= {DEFAULT_WALL_GOAL:g}), peak memory {default_memory:.2f} of polygraphy's compare "
          f"(goal <= {MEMORY_GOAL:g}): {'met' if default_wall <= DEFAULT_WALL_GOAL and default_memory <= MEMORY_GOAL else 'NOT met'}")
    met = (leaf.wall_s <= LEAF_WALL_GOAL * poly.wall_s and leaf.peak_mb <= MEMORY_GOAL * poly.peak_mb
           and default_wall <= DEFAULT_WALL_GOAL and default_memory <= MEMORY_GOAL)
    if compiled is not None:
        met = compiled_verdict(*compiled) and met
    return 0 if met else 1


def compile_only(args: argparse.Namespace) -> int:
    """--compile-only: the compile target's run and localize, and their ratio."""
    work = Path(args.keep or tempfile.mkdtemp(prefix="parity-localize-vs-run-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "faulted.py").write_text(BUILDER.format(repo=str(REPO)))
    try:
        compiled = compiled_runs(work, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if compiled_verdict(*compiled) else 1


def compiled_verdict(run: Run, loc: Run) -> bool:
    """Prints the compile target's line; whether localize / run meets its goal (and localize ran to its end)."""
    ratio = loc.wall_s / run.wall_s
    print(f"compile target: parity run {run.wall_s:.2f} s (exit {run.rc}, peak {run.peak_mb:.0f} MB{run.names and ' '}"
          f"{run.names}), parity localize "
          f"{loc.wall_s:.2f} s (peak {loc.peak_mb:.0f} MB; {loc.names}): localize / run {ratio:.2f} "
          f"(goal <= {COMPILED_GOAL:g}): {'met' if ratio <= COMPILED_GOAL else 'NOT met'}")
    return ratio <= COMPILED_GOAL and loc.rc == 0


def compiled_runs(work: Path, args: argparse.Namespace) -> tuple[Run, Run]:
    """`parity run` (tier 1) of the compile target's failing check from an empty cache, then the `parity localize`
    it prints as its next step, run as printed; --rounds times (each from an empty cache), medians."""
    (work / "compiled.yaml").write_text(COMPILED.format(fault=args.fault, magnitude=args.magnitude, size=args.size,
                                                        seed=args.seed, atol=ATOL, rtol=RTOL))
    cli = [sys.executable, "-m", "parity.cli"]
    runs, locs = [], []
    for _ in range(args.rounds):
        for folder in ("compiled-cache", "compiled-run"):
            shutil.rmtree(work / folder, ignore_errors=True)
        run = measure("parity run, compile", [*cli, "run", "compiled.yaml", "--out", "compiled-run", "--quiet",
                                              "--no-report", "--fresh", "--cache-dir", "compiled-cache"], work)
        printed = re.search(r"^\s*next: parity (localize .*)$", run.log, re.MULTILINE)
        if printed is None:
            raise SystemExit(f"parity run printed no localize command (exit {run.rc}):\n{run.log}")
        loc = measure("parity localize, compile", [*cli, *shlex.split(printed.group(1))], work)
        loc.names = parity_first(loc)
        runs.append(run)
        locs.append(loc)
    run, loc = median_run(runs), median_run(locs)
    loc.names = f"{locs[-1].names} {loc.names}".strip()
    return run, loc


if __name__ == "__main__":
    sys.exit(main())
