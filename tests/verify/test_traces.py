"""What a backend warns of is kept with its execution and shown beside its check, and warm-up runs are
not timed."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET

import torch

from parity.cli import main
from parity.records import read_records
from parity.records.summary import Summary
from parity.report.markdown import render_markdown
from tests.fixtures import traces
from tests.support import tiny_experiment

FIX = "tests.fixtures.traces"


def test_a_trace_with_a_data_dependent_branch_is_flagged_even_when_its_check_passes(write_yaml, tmp_path, capsys):
    """The input's mean is positive, so the trace takes the branch the reference takes and the check
    passes; the tracer's warning names the `if` and its line, in the execution record, the check, the
    console, report.md and junit.xml."""
    exp = tiny_experiment([{"backend": "torchscript"}],
                          models=[{"name": "branchy", "source": "python", "entry": f"{FIX}:data_dependent"}],
                          inputs=[{"name": "pos", "synthetic": {"shape": [2, 8], "distribution": "ones"}}])
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet"]) == 0
    records = read_records(out)
    [check] = [r for r in records if r["kind"] == "check"]
    assert check["passed"] is True
    [note] = [n for n in check["warnings"] if n["kind"] == "trace_specialized"]
    assert note["code"] == "if x.mean() > 0:" and note["where"].endswith("fixtures/traces.py:19")
    [execution] = [r for r in records if r["kind"] == "execution" and r["backend"] == "torchscript-cpu"]
    assert execution["warnings"] == check["warnings"]
    line = f'trace_specialized: "if x.mean() > 0:" at {note["where"]}'
    assert line in capsys.readouterr().out
    assert line.replace(">", "\\>") in (out / "report.md").read_text()  # report.md escapes what a name could make live
    [case] = ET.parse(out / "junit.xml").getroot().iter("testcase")
    assert case.find("failure") is None and line in case.find("system-out").text
    assert "⚠ 1 warning(s)" in (out / "report.html").read_text()


def test_eager_targets_have_nothing_to_warn_of(write_yaml, tmp_path):
    exp = tiny_experiment([{"backend": "eager", "name": "same"}],
                          models=[{"name": "branchy", "source": "python", "entry": f"{FIX}:data_dependent"}])
    out = tmp_path / "out"
    main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"])
    assert all(not r.get("warnings") for r in read_records(out) if r["kind"] in ("check", "execution"))


def test_a_compile_graph_break_is_recorded(write_yaml, tmp_path):
    exp = tiny_experiment([{"backend": "compile"}], models=[{"name": "p", "source": "python", "entry": f"{FIX}:graph_break"}],
                          inputs=[{"name": "x", "synthetic": {"shape": [4]}}])
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"]) == 0
    [check] = [r for r in read_records(out) if r["kind"] == "check"]
    assert any(n["kind"] == "graph_break" and "graph_break()" in n["message"] for n in check["warnings"]), check["warnings"]


def test_warm_up_runs_come_before_the_timed_repeats_and_are_not_recorded(write_yaml, tmp_path):
    traces.RUNS.clear()
    exp = tiny_experiment([{"backend": f"{FIX}:CountingEager", "name": "counted"}], repeats=3, warmup=2)
    out = tmp_path / "out"
    main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"])
    assert traces.RUNS.count("counted") == 5  # 2 warm-up runs, then 3 timed repeats
    runs = [r for r in read_records(out) if r["kind"] == "execution" and r["backend"] == "counted"]
    assert [r["repeat"] for r in runs] == [0, 1, 2] and runs[0]["warmup"] == 2
    assert all(r["run_s"] > 0 for r in runs)


def test_graph_breaks_counted_before_a_dynamo_reset_are_not_lost():
    """The compile backend resets dynamo, which clears its counters: a break seen before the block must
    not hide the same break inside it."""
    from parity.execute import notes

    before = {("graph_break", "Failed to trace builtin operator\nExplanation: print"): 3,
              ("graph_break", "other"): 1}
    after = {("graph_break", "Failed to trace builtin operator\nExplanation: print"): 1}
    [note] = notes._graph_breaks(before, after)
    assert note["count"] == 1 and note["message"] == "Failed to trace builtin operator: print"
    assert notes._graph_breaks(after, {**after}) == []  # nothing new, no reset


# What torch 2.14.1's ONNX exporter prints (verbose=None) for ThroughNumpy, as export_onnx captures it.
FELL_BACK = """[torch.onnx] Obtain model graph for `ThroughNumpy()` with `torch.export.export(..., strict=False)`...
[torch.onnx] Obtain model graph for `ThroughNumpy()` with `torch.export.export(..., strict=False)`... ❌
[torch.onnx] Obtain model graph for `ThroughNumpy()` with `torch.export.export(..., strict=True)`...
[torch.onnx] Obtain model graph for `ThroughNumpy()` with `torch.export.export(..., strict=True)`... ✅
[torch.onnx] Run decompositions...
[torch.onnx] Run decompositions... ✅
[torch.onnx] Translate the graph into ONNX...
[torch.onnx] Translate the graph into ONNX... ✅
"""


def test_the_exporters_progress_lines_say_when_it_fell_back_to_another_capture():
    from parity.backends.onnxruntime import capture_fallback

    assert capture_fallback(FELL_BACK) == ("torch.export.export(..., strict=False)", "torch.export.export(..., strict=True)")
    first_worked = "\n".join(line for line in FELL_BACK.splitlines() if "strict=True" not in line).replace("❌", "✅")
    assert capture_fallback(first_worked) is None
    assert capture_fallback(FELL_BACK.replace("✅", "❌")) is None  # every capture failed: the export raised
    assert capture_fallback("") is None


def test_an_onnx_export_that_fell_back_to_the_strict_capture_is_noted(write_yaml, tmp_path, capsys):
    """The check passes (dynamo traces numpy's sin into torch's), and the execution record, the check and the
    console say that the graph came from the strict capture, and why the default one failed; a second run that
    takes the export from the cache says it too."""
    exp = tiny_experiment([{"backend": "onnxruntime"}],
                          models=[{"name": "np", "source": "python", "entry": f"{FIX}:through_numpy"}],
                          inputs=[{"name": "x", "synthetic": {"shape": [2, 3]}}])
    path, cache = write_yaml(exp), ["--cache-dir", str(tmp_path / "cache")]
    for run in ("cold", "warm"):
        out = tmp_path / run
        assert main(["run", str(path), "--out", str(out), "--no-report", *cache]) == 0
        [check] = [r for r in read_records(out) if r["kind"] == "check"]
        [note] = [n for n in check["warnings"] if n["kind"] == "exporter" and "fell back" in n["message"]]
        assert note["message"] == ("the ONNX exporter fell back: torch.export.export(..., strict=False) failed "
                                   "(RuntimeError: .numpy() is not supported for tensor subclasses.); the graph comes "
                                   "from torch.export.export(..., strict=True), not from the exporter's default capture")
        assert "exporter: the ONNX exporter fell back" in " ".join(capsys.readouterr().out.split())
    assert [r["cached"] for r in read_records(out) if r["kind"] == "execution" and r["backend"] == "onnxruntime-cpu"][0]


def test_openvinos_trace_of_a_data_dependent_branch_is_flagged(write_yaml, tmp_path):
    """convert_model traces the module with torch.jit.trace: the branch it saw is kept, and the tracer says so."""
    exp = tiny_experiment([{"backend": "openvino"}],
                          models=[{"name": "branchy", "source": "python", "entry": f"{FIX}:data_dependent"}],
                          inputs=[{"name": "pos", "synthetic": {"shape": [2, 8], "distribution": "ones"}}])
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"]) == 0
    [check] = [r for r in read_records(out) if r["kind"] == "check"]
    assert any(n["kind"] == "trace_specialized" and n["code"] == "if x.mean() > 0:" for n in check["warnings"]), check["warnings"]


def test_the_timed_repeats_of_a_job_take_turns_across_the_reference_and_the_targets(write_yaml, tmp_path):
    """Prepared together, warmed up each (untimed), then timed round robin: ref, c1, c2, ref, c1, c2, ...; every
    repeat's outputs still recorded and judged, and each execution says its latency was interleaved."""
    traces.RUNS.clear()
    exp = tiny_experiment([{"backend": f"{FIX}:CountingEager", "name": n} for n in ("c1", "c2")], repeats=3, warmup=1,
                          reference={"backend": f"{FIX}:CountingEager", "name": "ref"})
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(exp)), "--out", str(out), "--quiet", "--no-report"]) == 0
    report = render_markdown(read_records(out), Summary.model_validate_json((out / "summary.json").read_text()), out)
    assert "The backends of each model and input set took turns (interleaved)." in report
    assert traces.RUNS == ["ref", "c1", "c2"] * 4  # the warm-up turn, then three timed turns
    runs = [r for r in read_records(out) if r["kind"] == "execution"]
    assert sorted((r["backend"], r["repeat"]) for r in runs) == [(b, i) for b in ("c1", "c2", "ref") for i in range(3)]
    assert all(r["latency_interleaved"] is True for r in runs)
    assert [c["passed"] for c in read_records(out) if c["kind"] == "check"] == [True, True]


def _together(*names: str, repeats: int = 2):
    from parity.config.schema import BackendSpec
    from parity.execute.execution import execute_together
    from parity.inputs import Inputs

    classes = {"ref": "CountingEager", "c": "CountingEager", "r1": "ResettingEager", "r2": "ResettingEager",
               "bad": "FailingCounter"}
    traces.RUNS.clear()
    model = traces.dense()
    specs = [(BackendSpec(backend=f"{FIX}:{classes[n]}", name=n), lambda: copy.deepcopy(model)) for n in names]
    return execute_together(specs, Inputs((torch.ones(2, 8),), {}), repeats, warmup=1)


def test_backends_that_reset_the_same_process_state_are_never_prepared_together():
    """r2 would reset r1's state (compile resets dynamo's caches): it waits, and is timed alone after the others,
    which still take turns with the reference."""
    done = _together("ref", "r1", "r2", "c")
    assert traces.RUNS == ["ref", "r1", "c"] * 3 + ["r2"] * 3
    assert [ex.interleaved for ex in done] == [True, True, False, True]
    assert all(ex.ok and len(ex.outputs) == 2 and len(ex.warmup_outputs) == 1 for ex in done)


def test_a_target_that_fails_in_its_turn_leaves_the_others_running_and_a_failed_reference_stops_them():
    done = _together("ref", "bad", "c", repeats=3)
    assert traces.RUNS == ["ref", "bad", "c", "ref", "bad", "c", "ref", "bad", "c", "ref", "c"]
    assert [ex.status for ex in done] == ["ok", "error", "ok"] and done[1].error == "RuntimeError: fails at repeat 1"
    done = _together("bad", "c", repeats=3)
    assert traces.RUNS == ["bad", "c", "bad", "c", "bad", "c"]  # the first failed at repeat 1: no more turns
    assert done[0].status == "error" and len(done[1].outputs) == 2


def test_a_trace_from_the_artifact_cache_is_flagged_as_the_fresh_trace_was(write_yaml, tmp_path):
    """The second run traces nothing (its trace comes from the cache), and still says what the tracer said."""
    exp = tiny_experiment([{"backend": "torchscript"}],
                          models=[{"name": "branchy", "source": "python", "entry": f"{FIX}:data_dependent"}],
                          inputs=[{"name": "pos", "synthetic": {"shape": [2, 8], "distribution": "ones"}}])
    path = str(write_yaml(exp))
    for run in ("cold", "warm"):
        main(["run", path, "--out", str(tmp_path / run), "--quiet", "--no-report", "--cache-dir", str(tmp_path / "c")])
    [cold], [warm] = ([r for r in read_records(tmp_path / run) if r["kind"] == "execution" and r["backend"] == "torchscript-cpu"]
                      for run in ("cold", "warm"))
    assert (cold["cached"], warm["cached"]) == (False, True)
    assert [n["kind"] for n in warm["warnings"]] == ["trace_specialized"] and warm["warnings"] == cold["warnings"]


def test_the_specialised_line_is_the_first_trace_note_that_names_one():
    """A trace_specialized note without a line (a warning whose location was lost) is passed over for the next one
    that has it; a line in no module's class names no module; no such note: nothing."""
    from parity.verify.localize import specialized_at

    notes = [{"kind": "graph_break", "message": "a break", "where": "x.py:1", "count": 2},
             {"kind": "trace_specialized", "message": "lost its place"},
             {"kind": "trace_specialized", "message": "fixed a branch", "where": "nowhere.py:3", "code": "if x:"}]
    found = specialized_at(torch.nn.Linear(2, 2), notes)
    assert found.model_dump(exclude_unset=True) == {"where": "nowhere.py:3", "code": "if x:"}
    assert specialized_at(torch.nn.Linear(2, 2), notes[:2]) is None
