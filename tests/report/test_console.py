"""The console's lines read the record parts by attribute (records/models.py): a localization on a decode step, a
compiler pass with its switch, a fallback's latency and a tensor-group fallback's cost, each said from its fields."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from parity.records.models import CompilerPass, DecodeCached, DecodeStepCompared, KeptGroups
from parity.records.summary import summarize
from parity.records.view import RunView
from parity.report.console import decode_line, fallback_lines, render
from parity.report.next_steps import next_steps
from parity.verify.localize import pass_path
from tests.support import fallback_found

SWITCHED = {"found": True, "steps": 9, "elapsed_s": 4.2, "backend": "inductor", "subsystem": "emulate_precision_casts",
            "application": 1, "debug_info": None, "switch": {"emulate_precision_casts": True}}


def _run_with_a_compiler_pass(found: dict) -> RunView:
    """A run's records with one failing compile check whose localization names `found`."""
    return RunView.of(_records(found))


def _records(found: dict) -> list[dict]:
    target = "compile-cpu"
    return [
        {"kind": "run", "schema_version": 1, "experiment": "e", "base_dir": ".", "file": "e.yaml", "environment": {},
         "config": {"tolerances": {"atol": [1e-4], "rtol": 1e-5}, "models": [{"name": "m"}], "inputs": [],
                    "targets": [{"backend": "compile"}]}},
        {"kind": "check", "schema_version": 1, "tier": 1, "model": "m", "inputs": "x", "target": target,
         "status": "ok", "passed": False, "failure_class": "numeric_drift", "detail": "drift", "rtol": 1e-5,
         "gate": 1e-4, "required_atol": 1e-3, "verdicts": {}, "leaves": []},
        {"kind": "layers", "schema_version": 1, "model": "m", "inputs": "x", "target": target, "verdict": "no layer",
         "mode": "own", "threshold": 1e-3, "suspects": [], "levels": [], "culprit": None, "compiler_pass": found}]


def test_a_compiler_pass_and_its_switch_are_said_from_the_record():
    view = _run_with_a_compiler_pass(SWITCHED)
    [check] = view.checks(1)
    steps = next_steps(check, view, "out")
    assert ("try the target with options: {inductor_config: {emulate_precision_casts: true}} (torch's compiler "
            "bisector: with it, inductor / emulate_precision_casts no longer makes the drift)") in steps
    printed = io.StringIO()
    render(view, summarize(view), Path("out"), Console(file=printed, width=400))
    assert "diverges at m / x / compile-cpu: no single layer (see the tier-2 verdict in report.md); compiler pass: " \
           "inductor / emulate_precision_casts" in printed.getvalue()
    unnamed = _run_with_a_compiler_pass({"found": False, "steps": 3, "elapsed_s": 1.0, "why": "stopped"})
    assert not any("inductor_config" in line for line in next_steps(unnamed.checks(1)[0], unnamed, "out"))


def test_a_pass_without_a_switch_names_its_application():
    found = CompilerPass(found=True, backend="inductor", subsystem="lowerings", application=3, debug_info="aten.add")
    assert pass_path(found) == "inductor / lowerings / application 3 (aten.add)"
    assert pass_path(CompilerPass.model_validate(SWITCHED)) == "inductor / emulate_precision_casts"
    assert pass_path(CompilerPass(found=True, backend="aot_eager")) == "aot_eager"


def test_a_decode_step_line_says_the_cached_failure_it_explains():
    step = DecodeStepCompared(prompt_tokens=7, step=1, cached=DecodeCached(passed=False, steps=4, detail="2 real flips"))
    line = decode_line(step)
    assert line.startswith("its cached decoding fails (2 real flips)") and "same 7-token prompt" in line
    assert decode_line(DecodeStepCompared(prompt_tokens=7)).startswith("its cached decoding fails (None)")


def test_a_fallbacks_latency_ratio_is_after_over_before():
    found = fallback_found(runs_in="float32", modules=["head"], passed=True, required_atol_before=1e-2,
                           required_atol_after=1e-5, tier1_passed_after=True, latency_before_s=0.004,
                           latency_after_s=0.002)
    assert found.latency_ratio == 0.5
    lines = [text for _, text in fallback_lines(found, 1e-4, False, "m", None)]
    assert "fallback: [head]; median latency 4.00 ms -> 2.00 ms (0.50x)" in lines


def test_a_tensor_group_fallback_says_its_cost_and_its_snippet():
    kept = KeptGroups(keep_type="Q8_0", groups=5, bytes_before=2 ** 20, bytes_after=3 * 2 ** 19, tokens=64,
                      tokens_per_s_before=200.0, tokens_per_s_after=150.0, snippet="  - name: kept")
    metrics = {"kl_mean": 0.25, "top1_agreement": 0.5}
    found = fallback_found(runs_in="Q8_0", aim="tier 3", modules=["blk.1"], passed=True, tensor_types=kept,
                           task_before=metrics, task_after={"kl_mean": 0.01, "top1_agreement": 0.75})
    lines = [text for _, text in fallback_lines(found, 1e-4, False, "lm", "text-generation")]
    assert lines[0] == "t: 1 of 5 tensor group(s) at Q8_0 (blk.1), 0 trial run(s)"
    assert lines[1] == "tier 3 (text-generation): mean KLD 0.25, top-1 0.5000 -> mean KLD 0.01, top-1 0.7500"
    assert "cost: 1.0 MiB -> 1.5 MiB (1.50x), 200 -> 150 tokens/s over 64 tokens" in lines
    assert lines[-1] == "  - name: kept"


def test_the_diverges_at_line_says_when_the_localization_is_a_decode_step_s():
    """A check localized on a decode step (its layers record has `decode_step`): the console's line says so, as the
    next steps do; a localization on the forward does not."""
    def printed(decode_step: dict | None) -> str:
        records = _records({"found": False, "steps": 1, "elapsed_s": 1.0, "why": "no"})
        layers = {**records[-1], "culprit": "model.rotary_emb", "compiler_pass": None,
                  **({"decode_step": decode_step} if decode_step else {})}
        out = io.StringIO()
        view = RunView.of([*records[:-1], layers])
        render(view, summarize(view), Path("out"), Console(file=out, width=400))
        return out.getvalue()

    stepped = printed({"prompt_tokens": 6, "step": 1, "sequences": 2})
    assert "diverges at m / x / compile-cpu: model.rotary_emb on the decode step (its cached decoding fails, its " \
           "forward agrees)" in stepped
    assert "diverges at m / x / compile-cpu: model.rotary_emb\n" in printed(None)
