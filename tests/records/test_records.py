"""The records' schema (records/models.py): what the writer refuses to write, what the reader refuses to
read, a newer schema refused as such, the archived study records valid, docs/records.md generated from
the models; RunView, the one reader; and the environment naming the libraries its caller passes."""

from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.records import SCHEMA_VERSION, RecordWriter, environment, read_records, read_run, record_problem
from parity.records.schema_doc import COMMAND, schema_doc
from parity.records.summary import exit_code, summarize, write_summary
from parity.records.view import RunView
from parity.runner.runner import libraries
from tests.support import ROOT, tiny_experiment

RUN = {"experiment": "x", "digest": "d", "base_dir": ".", "environment": {},
       "config": {"tolerances": {"atol": [1e-5], "rtol": 0.0}, "models": [], "inputs": [], "targets": []}}


def check(target="t", tier=1, model="m", inputs="i", **fields) -> dict:
    """A tier-1 (or tier-3) check record with every field it needs."""
    common = {"kind": "check", "model": model, "inputs": inputs, "target": target, "tier": tier, "status": "ok",
              "passed": True, "failure_class": None, "detail": None}
    if tier == 3:
        return {**common, "task": "classification", "metrics": {}, **fields}
    return {**common, "rtol": 0.0, "gate": 1e-4, "required_atol": 0.0, "verdicts": {"1e-04": True}, "leaves": [],
            **fields}


def test_docs_records_md_is_generated_from_the_models():
    assert (ROOT / "docs" / "records.md").read_text() == schema_doc(), (
        f"docs/records.md is stale: regenerate it with `{COMMAND}`")


def test_the_archived_study_records_are_valid_records(tmp_path):
    (tmp_path / "records.jsonl").write_bytes(gzip.decompress((ROOT / "docs" / "study-v1-records.jsonl.gz").read_bytes()))
    view = RunView.read(tmp_path)
    assert len(view) == 432 and view.run.experiment and view.checks(1) and view.checks(3)
    (tmp_path / "records.jsonl").write_bytes(
        gzip.decompress((ROOT / "docs" / "study-trained-records.jsonl.gz").read_bytes()))
    trained = RunView.read(tmp_path)
    assert len(trained.checks(1)) == 66 and all("reference_rms" in leaf.model_fields_set for c in trained.checks(1)
                                                  for leaf in c.leaves if leaf.max_abs is not None)
    (tmp_path / "records.jsonl").write_bytes(gzip.decompress((ROOT / "docs" / "study-records.jsonl.gz").read_bytes()))
    study = RunView.read(tmp_path)  # the v2 run: 32 entries reached x 7 targets
    assert len(study) == 927 and len(study.checks(1)) == 224 and study.checks(3)


@pytest.mark.parametrize("archive", ["study-v1-records", "study-trained-records", "study-records"])
def test_an_archived_check_read_as_its_model_dumps_to_the_same_json(archive):
    """The judge's verdict is the check record's model, which the Runner writes as it is: a check dumps the fields
    it was given in the order it was given them, its parts' too, so what is written from the model is the record
    as parity has always written it, byte for byte."""
    from parity.records.io import typed

    lines = gzip.decompress((ROOT / "docs" / f"{archive}.jsonl.gz").read_bytes()).decode().splitlines()
    checks = [line for line in lines if json.loads(line)["kind"] == "check"]
    assert checks
    for line in checks:
        assert json.dumps(typed(json.loads(line)).model_dump(exclude_unset=True)) == line


@pytest.mark.parametrize(("fields", "problem"), [
    ({"repeat": "0"}, "repeat: expected an integer, got a string"),
    ({"repeat": True}, "repeat: expected an integer, got true or false"),
    ({"run_s": "fast"}, "run_s: expected a number or null, got a string"),
    ({"status": None}, "status: expected a string, got null"),
])
def test_the_writer_refuses_a_field_of_the_wrong_type(tmp_path, fields, problem):
    execution = {"model": "m", "inputs": "i", "backend": "b", "device": "cpu", "dtype": "float32", "repeat": 0,
                 "status": "ok", "prepare_s": 0.1, "run_s": 0.2}
    with RecordWriter(tmp_path / "records.jsonl") as writer:
        writer.write("execution", **execution)  # the control: valid
        with pytest.raises(RuntimeError, match=f"invalid record: a 'execution' record: {problem}"):
            writer.write("execution", **{**execution, "repeat": 1, **fields})
    assert len(read_records(tmp_path)) == 1  # nothing of the invalid one written


@pytest.mark.parametrize(("record", "field"), [
    (check(bogus=1), "bogus"),
    (check(leaves=[{"name": "out", "failure_class": None, "max_abss": 0.1}]), "leaves[0].max_abss"),
    (check(oracle={"multiplier": 1.0, "floor": 0.0, "target_rmse": 0.0, "reference_rmse": 0.0, "target_worse": False,
                   "leaves_target_worse": [], "extra": 1}), "oracle.extra"),
])
def test_the_writer_refuses_a_field_the_models_do_not_declare(tmp_path, record, field):
    fields = {k: v for k, v in record.items() if k != "kind"}
    with RecordWriter(tmp_path / "records.jsonl") as writer, \
            pytest.raises(RuntimeError, match=rf"a 'check' record: undeclared field\(s\) {field.replace('[', '.').replace(']', '.')}"):
        writer.write("check", **fields)


def test_the_experiment_dump_in_a_run_record_is_not_the_records_schema(tmp_path):
    """`config` is the experiment's (config/schema.py): its own fields are not undeclared record fields."""
    with RecordWriter(tmp_path / "records.jsonl") as writer:
        assert writer.write("run", **{**RUN, "config": {"tolerances": {"atol": [1e-5], "rtol": 0.0, "gate": "auto"}, "models": [], "inputs": [], "targets": [],
                                                        "repeats": 3}})


@pytest.mark.parametrize(("record", "problem"), [
    (check(tier=2), "a 'check' record: tier: expected 1 or 3, got 2"),
    (check(tier=True), "a 'check' record: tier: expected 1 or 3, got True"),
    (check(passed=1), "a 'check' record: passed: expected true, false or null, got an integer"),
    (check(leaves=[{"name": 5}]), "a 'check' record: leaves[0].name: expected a string, got an integer"),
    (check(gate="1e-5"), "a 'check' record: gate: expected a number, got a string"),
    (check(leaves=[{"name": "out", "max_abs": "big"}]), "a 'check' record: leaves[0].max_abs: expected a number or null, "
                                                        "got a string"),
    (check(tier=3, metrics=[]), "a 'check' record: metrics: expected a mapping, got a list"),
    ({k: v for k, v in check().items() if k != "verdicts"}, "a 'check' record: verdicts: missing"),
    ({"kind": "run", **RUN, "config": {"tolerances": {"atol": [None], "rtol": 0.0}, "models": [], "inputs": [], "targets": []}},
     "a 'run' record: config.tolerances.atol[0]: expected a number, got null"),
    ({"kind": "layers", "model": "m", "inputs": "i", "target": "t", "error": None}, "a 'layers' record: verdict: missing"),
    ({"kind": "verdict"}, "unknown kind of record 'verdict' (parity writes run, resume, model, execution, check, "
                          "layers, fallback, warning)"),
    ([1], "not a parity record (no 'kind')"),
])
def test_the_reader_says_what_is_wrong_with_a_record(record, problem):
    assert record_problem(record) == problem


def test_a_failed_localization_needs_no_finding():
    assert record_problem({"kind": "layers", "model": "m", "inputs": "i", "target": "t", "error": "it raised"}) is None


def test_a_run_holds_one_record_of_each_identity_and_resume_and_fallback_records_may_repeat(tmp_path):
    """Each kind's identity (its model's `record_key`) is every field that makes it one of a kind: a record that
    differs in one of them is another record, one that differs in none is not written again, before or after
    the run is resumed."""
    def execution(repeat):
        return {"model": "m", "inputs": "i", "backend": "b", "device": "cpu", "dtype": "float32", "repeat": repeat,
                "status": "ok", "prepare_s": 0.0, "run_s": 0.0}
    writes = [("run", RUN), ("model", {"model": "m"}), ("model", {"model": "n"}),
              ("execution", execution(0)), ("execution", execution(1)),
              *[("check", {k: v for k, v in check(target, tier).items() if k != "kind"})
                for target in ("t", "u") for tier in (1, 3)],
              *[("layers", {"model": "m", "inputs": "i", "target": target, "error": "it raised"}) for target in "tu"],
              *[("warning", {"model": "m", "inputs": "i", "message": message}) for message in ("constant", "nan")],
              ("resume", {})]
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        assert all(writer.write(kind, **fields) is not None for kind, fields in writes)
        assert [writer.write(kind, **fields) for kind, fields in writes] == [None] * (len(writes) - 1) + [
            {"kind": "resume", "schema_version": SCHEMA_VERSION}]
    with RecordWriter(path, resume=True) as writer:
        assert [writer.write(kind, **fields) for kind, fields in writes][:-1] == [None] * (len(writes) - 1)
        assert writer.has("check", "m", "i", "u", 3) and writer.has("layers", "m", "i", "u")
        writer.keep_only(writer.records[:3])
        assert writer.write("model", model="n") is None and writer.write("execution", **execution(0)) is not None


@pytest.mark.parametrize("resume", [False, True])
def test_records_of_a_newer_schema_are_refused_as_such(tmp_path, resume):
    lines = [{"kind": "run", **RUN, "schema_version": SCHEMA_VERSION},
             {"kind": "model", "model": "m", "schema_version": SCHEMA_VERSION + 1, "size": "a field of the future"}]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ParityError, match=r"records.jsonl:2: .*written by a newer parity") as caught:
        RecordWriter(path, resume=True) if resume else read_run(tmp_path)
    assert "something other than parity" not in str(caught.value)  # a newer parity, not garbage


def records_of_a_run() -> list[dict]:
    """Two input sets x two targets; b's check on `x` failed with three leaves, and was localized."""
    leaves = [{"name": "small", "failure_class": "numeric_drift", "max_abs": 0.1},
              {"name": "passes", "failure_class": None, "max_abs": 9.0},
              {"name": "unknown", "failure_class": "nonfinite", "max_abs": None},
              {"name": "large", "failure_class": "numeric_drift", "max_abs": 2.0}]
    return [{"kind": "run", **RUN},
            check("a", inputs="x"), check("b", inputs="x", passed=False, failure_class="numeric_drift", leaves=leaves),
            check("b", inputs="x", tier=3), {"kind": "layers", "model": "m", "inputs": "x", "target": "b", "error": "e"},
            check("a", inputs="y"), check("b", inputs="y", status="skipped", passed=None),
            {"kind": "warning", "model": "m", "inputs": "y", "message": "constant"}]


def test_the_arithmetic_says_one_pair_and_one_target_in_the_singular():
    one = [r for r in records_of_a_run() if r.get("inputs") != "y" and r.get("target") != "b"]
    assert summarize(one).arithmetic.formula == "1 (model, input set) pair x 1 target = 1 check; x 1 tolerance = 1 verdict"


def test_the_view_selects_names_and_orders_once():
    view = RunView(records_of_a_run())
    assert [(c.target, c.inputs) for c in view.checks(1)] == [("a", "x"), ("b", "x"), ("a", "y"), ("b", "y")]
    assert [c.tier for c in view.checks(target="b", inputs="x")] == [1, 3]
    assert view.targets() == ["a", "b"] and view.pairs() == [("m", "x"), ("m", "y")]
    [failed] = view.failed(1)
    assert view.key(failed) == "m / x / b" and view.key(view.warnings[0]) == "m / y"
    assert [leaf.name for leaf in view.worst_leaves(failed, 5)] == ["large", "small", "unknown"]
    assert [leaf.name for leaf in view.worst_leaves(failed, 1)] == ["large"]
    assert view.layers_for(failed).error == "e" and view.layers_for(view.checks(1)[0]) is None
    assert view.run.experiment == "x" and RunView.of(view) is view


def test_a_record_as_read_is_frozen_one_value_for_every_reader():
    """Every report reads the same models from one view: none can change a verdict or a leaf for the next."""
    view = RunView(records_of_a_run())
    [failed] = view.failed(1)
    for record, field, value in ((failed, "passed", True), (failed.leaves[0], "max_abs", 0.0),
                                 (view.run, "experiment", "y"), (view.layers_for(failed), "error", None)):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(record, field, value)
    assert not view.failed(1)[0].passed and view.layers_for(failed).error == "e"


def test_the_summary_counts_the_tier_1_checks_and_names_each_by_its_key():
    summary = summarize(records_of_a_run())
    assert summary.totals.model_dump() == {"checks": 4, "passed": 2, "failed": 1, "skipped": 1, "errors": 0}
    assert summary.arithmetic.formula.startswith("2 (model, input set) pairs x 2 targets = 4 checks")
    assert summary.tier3.checks == 1 and list(summary.tier3.metrics) == ["m / x / b"]
    assert list(summary.localized) == ["m / x / b"] and summary.warnings == ["m / y: constant"]
    assert exit_code(summary) == 1 and exit_code(summary, allow_unavailable=True) == 1


def test_summary_json_keeps_its_keys_and_their_order_and_the_summary_is_frozen(tmp_path):
    """summary.json is the Summary's dump: the keys every reader of the file has had, in their order (a field
    renamed or moved in the model would change the file)."""
    summary = summarize(records_of_a_run())
    write_summary(summary, tmp_path / "summary.json")
    dumped = json.loads((tmp_path / "summary.json").read_text())
    assert list(dumped) == ["experiment", "rtol", "gate", "uniform_tolerance", "tolerances", "arithmetic", "totals",
                            "reference_errors", "per_target", "per_tolerance", "failure_classes", "tier3", "localized",
                            "latency", "warnings"]
    assert list(dumped["per_target"]["a"]) == ["checks", "passed", "failed", "skipped", "errors", "max_abs",
                                               "per_tolerance", "reason", "gate", "rtol", "tolerance_source",
                                               "gated_by", "noise_floor", "output_rules"]
    assert list(dumped["localized"]["m / x / b"]) == ["culprit", "evenly_spread", "error", "whole_graph", "as_a_whole",
                                                      "first_divergent", "specialized", "compiler_pass"]
    with pytest.raises(ValidationError, match="frozen"):
        summary.totals.failed = 0


def test_a_record_without_the_fields_later_versions_added_reads_as_their_defaults():
    """Records written before tolerance_source, gated_by, max_abs, a note's count or a setting the schema leaves
    open: the view's models read them as their defaults, and the summary and the reports say what those mean
    (the experiment's tolerances, gated by tier 1), never a string key's KeyError."""
    from parity.report.wording import describe_note

    config = {**RUN["config"], "seed": 0, "tiers": {"tasks": {"enabled": True}}}
    view = RunView([{"kind": "run", **RUN, "config": config}, check("a", warnings=[{"kind": "graph_break", "message": "m"}])])
    [c] = view.checks(1)
    assert (c.max_abs, c.tolerance_source, c.gated_by, c.oracle, c.fingerprints) == (None,) * 5
    info = summarize(view).per_target["a"]
    assert (info.tolerance_source, info.gated_by, info.noise_floor) == ("experiment", "tier1", None)
    setting = view.run.config.setting
    assert setting("seed", default="?") == 0 and setting("tiers", "tasks", "enabled") is True
    assert setting("tiers", "activations", "enabled") is None and setting("repeats", default="?") == "?"
    assert describe_note(c.warnings[0]) == "graph_break: m"


def test_the_environment_records_the_libraries_it_is_given(tmp_path):
    env = environment(tmp_path, 2, ["torch", "numpy", "no-such-library-here"])
    assert env["libraries"] == ["torch", "numpy", "no-such-library-here"] and env["threads"] == 2
    assert env["torch"] and env["numpy"] and env["no-such-library-here"] is None and "onnxruntime" not in env


def test_the_runner_records_the_libraries_of_the_experiments_backends():
    from parity.backends.onnxruntime import OnnxRuntimeBackend

    exp = experiment_from_dict(tiny_experiment([{"backend": "onnxruntime"}]), "t", ROOT)
    found = libraries(exp)
    assert found[:3] == ["torch", "torchvision", "numpy"] and set(OnnxRuntimeBackend.libraries) <= set(found)
    assert "openvino" not in found
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"][0] = {"name": "bert", "source": "transformers", "config": {"model_type": "bert", "vocab_size": 30,
                         "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8}}
    assert "transformers" in libraries(experiment_from_dict(data, "t", ROOT))  # the model's source's library


def test_the_records_package_and_the_runner_import_no_report():
    """Reports render; the summary, the reader and the runner are below them."""
    for path in [*(ROOT / "src" / "parity" / "records").glob("*.py"), ROOT / "src" / "parity" / "runner" / "runner.py"]:
        tree = ast.parse(Path(path).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + \
                   [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("parity.report")], path
