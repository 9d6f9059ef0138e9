"""The fallback search (runner/search.py) and its transform (adapters/fallback.py): the faulty module is found, run outside the fast path, and the check passes."""

from __future__ import annotations

import pytest
import torch
import yaml

from parity.adapters.fallback import apply_fallback
from parity.api import run_experiment
from parity.backends.eager import EagerBackend
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.config.tolerances import Tolerance
from parity.errors import ParityError
from parity.inputs import Inputs
from parity.outputs import map_tensors
from parity.runner.localization import localize
from parity.runner.search import candidates_from, is_whole_model, next_step, search_fallback
from tests.fixtures.faults import inject
from tests.fixtures.tiny import DeepCNN
from tests.support import CHECK, fallback_found, localized, tiny_experiment

EAGER = BackendSpec(backend="eager")
IMAGE = Inputs((torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(0)),))


def at(gate: float, rtol: float = 1e-5) -> Tolerance:
    """A target's tolerance with this gate, as the experiment resolves one."""
    return Tolerance((gate,), rtol, gate)


def faulty(condition: str, magnitude: float):
    torch.manual_seed(0)
    return inject(DeepCNN().eval(), "head", magnitude, condition)


@pytest.mark.parametrize("target, condition, magnitude, gate", [
    (BackendSpec(backend="compile"), "compiling", 1e-2, 1e-4),
    pytest.param(BackendSpec(backend="eager", dtype="bfloat16"), "bfloat16", 0.3, 5e-2, marks=pytest.mark.numerics),
])
def test_the_faulty_module_is_the_minimal_fallback(target, condition, magnitude, gate):
    model = faulty(condition, magnitude)
    loc = localize(EAGER, target, model, IMAGE, 1e-5, 1e-4)
    result = search_fallback(EAGER, target, model, IMAGE, candidates_from(localized(loc)), at(gate), names=CHECK)
    assert result.required_atol_before > gate
    assert result.passed and result.modules == ["head"] and result.required_atol_after <= gate and result.tier1_passed_after
    assert result.latency_before_s > 0 and result.latency_after_s > 0


@pytest.mark.numerics
def test_a_module_the_check_passes_without_is_dropped_from_the_set():
    """The search grows the set in the candidates' order, then shrinks it: an innocent module tried before
    the faulty one is left out of the answer (the ceiling, both at once; two trials to grow, one to shrink)."""
    target = BackendSpec(backend="eager", dtype="bfloat16")
    result = search_fallback(EAGER, target, faulty("bfloat16", 0.3), IMAGE, ["stem", "head"], at(5e-2),
                             latency_runs=1, names=CHECK)
    assert result.passed and result.modules == ["head"] and result.tried == 4  # the ceiling, 2 to grow, 1 to shrink


@pytest.mark.numerics
def test_no_fallback_when_the_drift_has_no_single_source():
    """bfloat16 everywhere: every module in float32 still hands bfloat16 values on, so nothing passes a
    tight gate, and the search says so rather than returning a set."""
    torch.manual_seed(0)
    model = DeepCNN().eval()
    target = BackendSpec(backend="eager", dtype="bfloat16")
    result = search_fallback(EAGER, target, model, IMAGE, ["stem", "block1", "block2", "head"], at(1e-7), names=CHECK)
    assert not result.passed and not result.whole_model
    assert result.tried == 1 and result.ceiling_modules == 4  # the ceiling (all four in float32) failed: no search
    assert result.ceiling_atol > 1e-7 and result.passing_gate >= result.required_atol_before
    widen = next_step(result, "parity fallback exp.yaml", None)
    assert f"the target as it is passes at atol {result.passing_gate:g}" in widen
    assert "next: parity fallback exp.yaml --tier 3" in next_step(result, "parity fallback exp.yaml", "classification")


def test_fallback_applies_only_where_it_means_something():
    with pytest.raises(ParityError, match="fallback applies to compile targets"):
        apply_fallback(DeepCNN(), ["head"], BackendSpec(backend="onnxruntime"))
    with pytest.raises(ParityError, match="did you mean 'head'"):
        apply_fallback(DeepCNN(), ["haed"], BackendSpec(backend="compile"))


@pytest.mark.numerics
def test_a_found_set_is_applied_from_the_experiment_file_and_on_the_command_line(tmp_path, capsys):
    data = tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}], tolerances={"atol": [1e-1], "gate": 1e-1})
    data["models"][0]["entry"] = "tests.fixtures.tiny:tiny_cnn"
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["fallback", str(path)]) == 0
    assert "already passes" in capsys.readouterr().out
    data["tolerances"] = {"atol": [1e-9], "gate": 1e-9}
    data["targets"] = [{"backend": "eager", "dtype": "bfloat16"},
                       {"backend": "eager", "dtype": "bfloat16", "name": "islands", "fallback": ["conv", "tiny:bn", "other:x", "head"]}]
    checks = {r["target"]: r for r in run_experiment(data, out=tmp_path / "run") if r["kind"] == "check"}
    assert checks["islands"]["max_abs"] < checks["eager-cpu-bfloat16"]["max_abs"]


def test_a_check_that_already_passes_is_not_localized():
    """Finding the candidates (tier 2, minutes on a large model) is skipped when no fallback is needed; a failing
    check still gets them."""
    model, asked = faulty("bfloat16", 0.3), []

    def candidates() -> list[str]:
        asked.append(True)
        return ["head"]

    loose = search_fallback(EAGER, BackendSpec(backend="eager", dtype="bfloat16"), model, IMAGE, candidates,
                          at(10.0, rtol=0.0), latency_runs=1, names=CHECK)
    assert loose.passed and loose.modules == [] and asked == []
    tight = search_fallback(EAGER, BackendSpec(backend="eager", dtype="bfloat16"), model, IMAGE, candidates,
                          at(0.0, rtol=0.0), latency_runs=1, names=CHECK)
    assert asked == [True] and tight.tried >= 1


def test_fallback_command_writes_its_record(tmp_path, capsys):
    from parity.records.view import RunView

    data = tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}], tolerances={"atol": [1e-1], "gate": 1e-1})
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["fallback", str(path), "--out", str(tmp_path / "out")]) == 0
    [record] = RunView.read(tmp_path / "out").fallbacks
    assert record.runs_in == "float32" and record.passed and record.modules == []


def test_localize_and_fallback_keep_their_exports_in_the_artifact_cache(tmp_path, capsys):
    """`parity localize` and `parity fallback` run their target through the Runner's artifact cache, under the
    same key as `parity run`: the run after fallback finds the export there."""
    from parity.records import read_records

    data = tiny_experiment([{"backend": "tests.fixtures.tiny:SavingEager", "dtype": "bfloat16", "tolerances": {"gate": 1.0}}])
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["localize", str(path), "--cache-dir", str(tmp_path / "localized")]) == 0
    assert len(list((tmp_path / "localized" / "artifacts").iterdir())) >= 1
    where = ["--cache-dir", str(tmp_path / "cache")]  # passes at once: no search, only what every command runs
    assert main(["fallback", str(path), *where]) == 0
    assert len(list((tmp_path / "cache" / "artifacts").iterdir())) >= 1
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet", "--no-report", *where]) == 0
    [target] = [r for r in read_records(tmp_path / "run") if r["kind"] == "execution" and r["backend"] == "SavingEager-cpu-bfloat16"
                and r["repeat"] == 0]
    assert target["cached"] is True


@pytest.mark.numerics
def test_a_task_level_fallback_restores_the_decision_where_no_set_reaches_a_tight_gate():
    """bfloat16 everywhere plus a fault in `head` that flips decisions: no set of float32 modules brings
    every output within 1e-7 (bfloat16 values still flow between them), but `head` alone in float32
    restores every top-1 decision, which is what the tier-3 aim asks for."""
    from parity.config.schema import tasks_spec

    images = Inputs((torch.randn(16, 3, 10, 10, generator=torch.Generator().manual_seed(1)),))
    model = faulty("bfloat16", 30.0)
    target = BackendSpec(backend="eager", dtype="bfloat16")
    candidates = ["block2", "head", "block1", "stem"]
    strict = search_fallback(EAGER, target, model, images, candidates, at(1e-7), names=CHECK)
    assert not strict.passed
    aimed = search_fallback(EAGER, target, model, images, candidates, at(1e-7), task=("classification", tasks_spec()), names=CHECK)
    assert aimed.aim == "tier 3" and aimed.task_before["top1_agreement"] < 0.99
    assert aimed.passed and aimed.modules == ["head"] and aimed.task_after["top1_agreement"] == 1.0
    assert aimed.required_atol_after > 1e-7 and aimed.tier1_passed_after is False  # only the decisions were the aim


class NaNEager(EagerBackend):
    """A target whose outputs are NaN wherever the reference's are negative: what no tier-3 agreement excuses."""

    def run(self, inputs):
        return map_tensors(lambda t: t.masked_fill(t < 0, float("nan")), super().run(inputs))


def test_a_task_level_fallback_never_passes_a_trial_that_tier_1_finds_nan_in(monkeypatch):
    """The fallback search judges a trial as the run's `gate: tier3` does: tier 3 decides numeric drift only, so
    a target with NaN in its outputs finds no fallback, whatever the task's evaluator says of its decisions."""
    import parity.runner.search as search
    from parity.config.schema import tasks_spec
    from parity.verify.tasks import TaskResult

    monkeypatch.setattr(search, "evaluate", lambda *args: TaskResult(args[0], passed=True, same_set=None))
    target = BackendSpec(backend="tests.runner.test_search:NaNEager", dtype="bfloat16")
    result = search_fallback(EAGER, target, faulty("bfloat16", 0.0), IMAGE, ["head"], at(1e-4),
                             task=("classification", tasks_spec()), names=CHECK)
    assert not result.passed and result.required_atol_before == float("inf")


def test_localize_and_fallback_never_write_over_a_runs_records(tmp_path, capsys):
    """Their --out holds a records file of their own; pointed at a run's folder they refuse at once."""
    data = tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}], tolerances={"atol": [1e-1], "gate": 1e-1})
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    run_experiment(data, out=run_dir)
    before = (run_dir / "records.jsonl").read_bytes()
    for verb in ("localize", "fallback"):
        assert main([verb, str(path), "--out", str(run_dir)]) == 2
        assert "already holds records.jsonl" in capsys.readouterr().err
    assert (run_dir / "records.jsonl").read_bytes() == before


def test_a_set_that_is_the_whole_model_is_no_partial_fallback(tmp_path, capsys):
    """A fault in each of TinyCNN's three layers, on bfloat16 only: the one set that passes is every
    top-level module in float32, which the command says is the whole model, with a next step, exit 1."""
    from parity.records.view import RunView

    data = tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}], tolerances={"atol": [1e-2], "gate": 1e-2})
    data["models"][0]["entry"] = "tests.fixtures.whole_graph:faulty_everywhere"
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["fallback", str(path), "--out", str(tmp_path / "out")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "no partial fallback exists; this is the whole model at the reference's precision (float32)" in out
    assert "apply it" not in out
    [record] = RunView.read(tmp_path / "out").fallbacks
    assert record.passed and record.whole_model and sorted(record.modules) == ["bn", "conv", "head"]
    assert "widen the gate" in record.next_step
    assert all(" ".join(line.split()) in out for line in record.next_step.splitlines())


def test_what_counts_as_the_whole_model():
    model = DeepCNN()
    assert is_whole_model(model, ["stem", "block1", "block2", "head"])  # every top-level module
    assert is_whole_model(model, ["stem", "block1.0", "block1.1", "block2", "head"])  # every parameter
    assert not is_whole_model(model, ["stem", "block1", "block2"]) and not is_whole_model(model, [])
    only_weights = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert is_whole_model(only_weights, ["0"])  # a parameter-free ReLU left out changes nothing


def test_next_steps_for_each_aim():
    partial = fallback_found(modules=["head"], passed=True)
    assert next_step(partial, "parity fallback f.yaml", "classification") is None
    whole = fallback_found(modules=["a", "b"], passed=True, whole_model=True, required_atol_before=0.5)
    assert "\nnext: parity fallback f.yaml --tier 3\n" in next_step(whole, "parity fallback f.yaml", "detection") + "\n"
    whole = whole.model_copy(update={"passing_gate": 0.5})
    assert "    tolerances: {gate: 0.5}" in next_step(whole, "parity fallback f.yaml", None, BackendSpec(backend="eager"))
    nonfinite = fallback_found(required_atol_before=float("inf"))
    assert "no atol passes" in next_step(nonfinite, "parity fallback f.yaml", None)
    task_aim = fallback_found(runs_in="float32", aim="tier 3")
    assert "lower the thresholds in tiers.tasks" in next_step(task_aim, "parity fallback f.yaml", "classification")


def test_a_whole_graph_localization_leads_the_candidates_with_its_first_divergent_layer():
    """No suspects (no own error above the threshold): the layer its propagated error names comes first."""
    from parity.records.models import Layers

    layers = [{"name": n, "local": {"name": n, "rel_rmse": e, "error": None}} for n, e in (("a", 0.0), ("b", 0.0), ("c", 1e-9))]
    record = Layers.model_validate({"kind": "layers", "model": "m", "inputs": "x", "target": "t", "verdict": "whole graph",
                                    "mode": "own", "threshold": 1e-3, "suspects": [], "first_divergent": "b",
                                    "levels": [{"parent": None, "layers": layers}]})
    assert candidates_from(record) == ["b", "c", "a"]


def test_a_fallback_past_its_ceiling_says_so_and_prints_the_target_entry_that_passes(tmp_path, capsys):
    """bfloat16 at a gate of 1e-7: with every candidate module in float32 the input is still rounded to bfloat16,
    so no fallback can pass. The command measures that ceiling first, says so in one line with its number, and
    prints the target's own entry with the gate at which the target as it is passes; that entry, put in the file
    as printed, makes `parity run` pass (the gate was verified by judging the run again)."""
    from parity.config.tolerances import rounded_up
    from parity.records.view import RunView

    target = {"backend": "eager", "dtype": "bfloat16", "tolerances": {"gate": 1e-7, "rtol": 0.0}}
    data = tiny_experiment([target])
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["fallback", str(path), "--out", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    [record] = RunView.read(tmp_path / "out").fallbacks
    said = " ".join(out.split())
    assert (f"no fallback can pass: with all {record.ceiling_modules} candidate module(s) in float32 at once, the "
            f"check still needs atol {rounded_up(record.ceiling_atol):.3g} > gate 1e-07") in said
    assert record.tried == 1 and not record.passed and record.passing_gate > 1e-7
    lines = out.splitlines()
    start = lines.index("  targets:")
    snippet = "\n".join(line[2:] for line in lines[start:] if line.startswith("  "))
    [entry] = yaml.safe_load(snippet)["targets"]
    assert entry == {**target, "tolerances": {"gate": record.passing_gate, "rtol": 0.0}}
    path.write_text(yaml.safe_dump({**data, "targets": [entry]}))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet", "--no-report"]) == 0
