"""The Python API: run an experiment, or assert in your own tests that backends agree."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from parity.config import experiment_from_dict, load_experiment
from parity.config.schema import BackendSpec, Experiment
from parity.inputs import Inputs


def _experiment(source: str | Path | dict | Experiment) -> Experiment:
    if isinstance(source, Experiment):
        return source
    if isinstance(source, dict):
        return experiment_from_dict(source, "<dict>", Path.cwd())
    return load_experiment(source)


def default_out_dir(exp: Experiment) -> Path:
    import time

    return Path("parity-out") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_experiment(source: str | Path | dict | Experiment, out: str | Path | None = None,
                   progress: bool = False, reports: tuple[str, ...] = ("report.md",),
                   fresh: bool = False) -> list[dict[str, Any]]:
    """Run an experiment (a YAML path, a dict in the same shape, or an Experiment); write records.jsonl,
    summary.json and `reports` under `out` (any of report.md, report.html, junit.xml: `parity run` writes
    all three, `parity.report.REPORT_FILES`; the HTML costs about a second of plotting); return the records.
    When `out` already holds records of the same experiment the run continues from them, and the records
    returned are all of them; `fresh` discards them and starts over."""
    from parity.runner.local import run_experiment_to

    exp = _experiment(source)
    out_dir = Path(out) if out is not None else default_out_dir(exp)
    records = run_experiment_to(exp, out_dir, progress=progress, fresh=fresh)
    if reports:
        from parity.report import write_reports

        write_reports(out_dir, records, names=reports)
    return records


def _as_inputs(inputs: Any) -> Inputs:
    if isinstance(inputs, Inputs):
        return inputs
    if isinstance(inputs, dict):
        return Inputs((), dict(inputs))
    if isinstance(inputs, tuple):
        return Inputs(inputs)
    return Inputs((inputs,))


def _spec(target: str | dict | BackendSpec) -> BackendSpec:
    if isinstance(target, BackendSpec):
        return target
    if isinstance(target, str):
        return BackendSpec(backend=target)
    return BackendSpec.model_validate(target)


def assert_backends_agree(model: torch.nn.Module, inputs: Any, targets: list[str | dict | BackendSpec],
                          atol: float = 1e-5, rtol: float = 1.3e-6,
                          reference: str | dict | BackendSpec = "eager") -> None:
    """Raise AssertionError, in the style of torch.testing.assert_close, unless every target's outputs
    match the reference's: |t - r| <= atol + rtol * |r| on every leaf. `inputs` is a tensor, a tuple of
    positional tensors or a dict of keyword tensors. The model itself is never modified; the copies that
    the backends run are put in eval mode (dropout off, batch-norm statistics frozen), as `parity run` does."""
    from parity.config.checks import backend_problems
    from parity.config.yaml_io import format_path
    from parity.errors import ParityError
    from parity.runner.execute import execute
    from parity.verify.tensors import compare, compared_exactly

    inputs = _as_inputs(inputs)
    model = copy.deepcopy(model).eval()
    ref_spec = _spec(reference)
    specs = [_spec(t) for t in targets]
    problems = [f"{format_path(path)}: {msg}" for i, spec in enumerate([ref_spec, *specs])
                for path, msg in backend_problems(spec, ("reference",) if i == 0 else ("targets", i - 1))]
    if problems:  # unknown names and bad options fail loudly, before anything runs
        raise ParityError(*problems)
    ref = execute(ref_spec, model, inputs, 1)
    if not ref.ok:
        raise AssertionError(f"the reference {ref_spec.id} failed: {ref.error or ref.status}")
    problems = []
    for spec in specs:
        got = execute(spec, model, inputs, 1)
        if not got.ok:
            problems.append(f"Target {spec.id} did not run ({got.status}): {got.error}")
            continue
        comparison = compare(ref.outputs[0], got.outputs[0], rtol, atol)
        if comparison.passes(atol):
            continue
        bad = [leaf for leaf in comparison.leaves if leaf["failure_class"]]
        lines = [f"Target {spec.id} does not match reference {ref_spec.id} ({comparison.failure_class}) "
                 f"at atol={atol:g}, rtol={rtol:g}:"]
        for leaf in bad:
            if "max_abs" in leaf and "shape" in leaf:
                n = 1
                for d in leaf["shape"]:
                    n *= d
                exact = compared_exactly(leaf)  # integers and booleans: no tolerance applies
                how = f", {leaf['dtype']} compared exactly (atol and rtol do not apply)" if exact else ""
                lines.append(
                    f"  {leaf['name']}: Mismatched elements: {round(leaf['mismatch_fraction'] * n)} / {n} "
                    f"({leaf['mismatch_fraction']:.1%}){how}\n"
                    f"    Greatest absolute difference: {leaf['max_abs']:.6g} "
                    f"({'none' if exact else f'up to {atol:g}'} allowed)\n"
                    f"    Greatest relative difference: {leaf['max_rel']:.6g} ({'none' if exact else f'up to {rtol:g}'} allowed)"
                )
            else:
                lines.append(f"  {leaf['name']}: {leaf.get('detail', leaf['failure_class'])}")
        problems.append("\n".join(lines))
    if problems:
        raise AssertionError("\n".join(problems))
