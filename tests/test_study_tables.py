"""benchmarks/study_tables.py, the script that writes docs/study.md's tables from a run's records: its
arithmetic (totals are the sums of the per-model rows, each tolerance's count matches the summary,
every failed check has one class) and its Wilson intervals, on a tiny run made with the fixtures."""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
import math

import pytest
import yaml

from parity.cli import main
from parity.records import read_records
from tests.conftest import EVERY_OUTCOME as TARGETS
from tests.conftest import ROOT, tiny_experiment

GNU_TIME = """\tCommand being timed: "parity run examples/study.yaml"
\tUser time (seconds): 1500.25
\tSystem time (seconds): 30.50
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.50
\tMaximum resident set size (kbytes): 4194304
"""


def _load_script():
    spec = importlib.util.spec_from_file_location("study_tables", ROOT / "benchmarks" / "study_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


st = _load_script()


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("study")
    data = tiny_experiment(TARGETS, repeats=2, tiers={"tasks": True})
    data["models"][0].update(task="classification", inputs=["noise"])
    data["models"].append({"name": "det", "source": "python", "entry": "tests.fixtures.tiny:tiny_detector",
                           "task": "detection", "inputs": ["photos"]})
    data["inputs"].append({"name": "photos", "images": ["sample:chelsea"], "preprocess": {"resize": 40}})
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["run", str(path), "--out", str(folder / "out"), "--quiet", "--no-report"]) == 1
    return read_records(folder / "out")


def rows_of(markdown: str) -> list[list[str]]:
    """The body rows of the first Markdown table in `markdown`, as cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def test_wilson_interval_of_none_all_and_some_passing():
    low, high = st.wilson(0, 20)
    assert low == 0.0 and 0.0 < high < 0.2
    low, high = st.wilson(20, 20)
    assert high == 1.0 and 0.8 < low < 1.0
    assert st.wilson(0, 0) == (0.0, 1.0)
    low, high = st.wilson(5, 10)  # the textbook value: 0.2366 to 0.7634
    assert math.isclose(low, 0.2366, abs_tol=1e-4) and math.isclose(high, 0.7634, abs_tol=1e-4)
    for k in range(11):
        low, high = st.wilson(k, 10)
        assert low <= k / 10 <= high


def test_per_model_rows_add_up_to_the_totals(records):
    study = st.Study(records)
    rows = st.model_rows(study)
    totals = study.summary["totals"]
    assert {(r["model"], r["inputs"]) for r in rows} == {("tiny", "noise"), ("det", "photos")}
    assert sum(len(r["cells"]) for r in rows) == totals["checks"] == 2 * len(TARGETS)
    assert sum(r["passed"] for r in rows) == totals["passed"]
    assert sum(r["judged"] for r in rows) == totals["passed"] + totals["failed"]
    assert totals["passed"] and totals["failed"] and totals["skipped"]  # the run has all three kinds

    table = rows_of(st.block_per_model(study).split("\n\n", 1)[1])
    *models, last = table
    assert [r[0] for r in models] == ["tiny", "det"]
    assert last[-1] == f"**{totals['passed']}/{totals['passed'] + totals['failed']}**"
    for row in models:
        passed, judged = map(int, row[-1].split("/"))
        assert passed == sum(cell.startswith("pass") for cell in row[4:-1])
        assert judged == sum(cell != "not run here" for cell in row[4:-1])


def test_each_tolerance_counts_every_judged_check_once(records):
    study = st.Study(records)
    summary = study.summary
    table = rows_of(st.block_tolerance(study))
    assert len(table) == len(study.keys) == 4
    judged = summary["totals"]["passed"] + summary["totals"]["failed"]
    for row, key in zip(table, study.keys, strict=True):
        passed, failed, checks = int(row[1]), int(row[2]), int(row[3])
        assert passed == summary["per_tolerance"][key]["passed"] and passed + failed == checks == judged
        low, high = st.wilson(passed, checks)
        assert row[5] == f"{100 * low:.1f}% to {100 * high:.1f}%"
    assert table[study.keys.index(study.gate_key)][0].endswith("(gate)")
    pooled_passed, pooled_total = study.pooled()
    assert pooled_total == judged * len(study.keys)
    assert pooled_passed == sum(summary["per_tolerance"][k]["passed"] for k in study.keys)


def test_per_task_and_per_target_rows_partition_the_checks(records):
    study = st.Study(records)
    by_task = rows_of(st.block_per_task(study))
    assert sum(int(r[2]) for r in by_task) == len(study.ran)
    by_target = rows_of(st.block_per_target(study))
    assert [r[0] for r in by_target] == [t["name"] if "name" in t else "eager-cpu-bfloat16" for t in TARGETS]
    assert sum(int(r[1]) for r in by_target) == len(study.ran)
    never = next(r for r in by_target if r[0] == "never")
    assert never[1] == "0"  # could not run here: not judged, not a failure


def test_taxonomy_gives_every_failed_check_one_class(records):
    study = st.Study(records)
    table = rows_of(st.block_taxonomy(study))
    *classes, total = table
    failed = [c for c in study.ran if not c["passed"]]
    assert int(total[2]) == len(failed) == sum(int(r[2]) for r in classes)
    per_target = [sum(int(r[3 + i]) for r in classes) for i in range(len(study.targets))]
    assert per_target == [int(x) for x in total[3:-1]]
    assert "`backend_error`" in [r[0] for r in classes]  # the failing fixture backend raised


def test_the_document_is_rewritten_between_its_markers_only(records, tmp_path):
    study = st.Study(records, st.wall_time(GNU_TIME))
    doc = "# study\n\nprose stays\n\n" + "\n\n".join(f"<!-- study:{name} -->\nold\n<!-- /study:{name} -->" for name in st.BLOCKS)
    rendered = st.render(doc, study)
    assert rendered.startswith("# study\n\nprose stays\n") and "\nold\n" not in rendered
    assert st.render(rendered, study) == rendered  # idempotent: a second pass rewrites the same tables
    assert "62 min 04 s" in rendered  # GNU time's 1:02:03.50
    with pytest.raises(SystemExit, match="missing"):
        st.render(doc.replace("<!-- study:latency -->", "<!-- study:latencies -->"), study)


def test_gnu_time_is_read_for_wall_clock_cpu_and_memory():
    timing = st.wall_time(GNU_TIME)
    assert timing == {"wall_s": 3723.5, "peak_mib": 4096.0, "user_s": 1500.25, "system_s": 30.5}
    assert st.wall_time("\tElapsed (wall clock) time (h:mm:ss or m:ss): 12:34.5\n")["wall_s"] == 754.5
    assert st.wall_time("nothing timed") is None


def test_the_archive_keeps_every_record_but_the_pictures(records, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "time.txt").write_text(GNU_TIME)
    st.archive(run, tmp_path / "records.jsonl.gz", tmp_path / "time.txt")
    with gzip.open(tmp_path / "records.jsonl.gz", "rt") as f:
        archived = [json.loads(line) for line in f]
    assert len(archived) == len(records) and not any("pictures" in r for r in archived)
    assert any("pictures" in r for r in records)  # the detector's tier-3 checks had some to drop
    assert st.load_records(tmp_path / "records.jsonl.gz") == archived
    assert (tmp_path / "time.txt").read_text() == GNU_TIME


def with_adapter_twin(records: list[dict]) -> list[dict]:
    """The run's records with the detector listed a second time, as `det+nms` with the adapter (its records
    copied): how the study lists each detector."""
    twin = []
    for r in records:
        if r["kind"] == "run":
            r = copy.deepcopy(r)
            det = next(m for m in r["config"]["models"] if m["name"] == "det")
            r["config"]["models"].append({**det, "name": "det+nms", "adapters": [{"name": "deterministic_nms"}]})
        twin.append(r)
        if r.get("model") == "det":
            twin.append({**r, "model": "det+nms"})
    return twin


def test_detectors_listed_with_and_without_an_adapter_are_paired(records):
    """The adapter table pairs entries of one model that differ only in their adapters."""
    study = st.Study(with_adapter_twin(records))
    table = rows_of(st.block_adapter(study))
    assert [r[1] for r in table] == study.targets
    assert all(r[0] == "tests.fixtures.tiny:tiny_detector" for r in table)
    assert rows_of(st.block_adapter(st.Study(records))) == []


def test_the_cuda_study_runs_the_same_models_on_the_same_inputs():
    def load(name: str) -> dict:
        return yaml.safe_load((ROOT / "examples" / name).read_text())

    cpu, cuda = load("study.yaml"), load("study_cuda.yaml")
    for key in ("seed", "repeats", "models", "inputs", "reference", "tolerances", "tiers"):
        assert cpu[key] == cuda[key], key
    assert all(t["device"] == "cuda" for t in cuda["targets"])
    assert len({m["builder"] for m in cpu["models"]}) >= 19  # the issue asks for at least 19 models


def test_the_cluster_bootstrap_keeps_a_model_s_checks_together():
    """Two clusters, one all passing and one all failing: every draw is one of 0, 1/2 or 1 of the checks,
    so the interval is wider than Wilson's over the same 20 'independent' checks; one cluster cannot vary."""
    both = {"a": [True] * 10, "b": [False] * 10}
    low, high = st.cluster_bootstrap(both, resamples=2000)
    w_low, w_high = st.wilson(10, 20)
    assert low == 0.0 and high == 1.0 and w_low > 0.0 and w_high < 1.0
    assert st.cluster_bootstrap({"a": [True, False]}, resamples=100) == (0.5, 0.5)
    assert st.cluster_bootstrap({}) == (0.0, 1.0)
    assert st.cluster_bootstrap(both, resamples=500) == st.cluster_bootstrap(both, resamples=500)  # seeded


def test_like_for_like_drops_reduced_precision_targets_and_adapter_entries(records):
    """The restricted rows count exactly the float32 targets' checks of entries without adapters."""
    study = st.Study(with_adapter_twin(records))
    every, float32, once, published = rows_of(st.block_like_for_like(study))
    assert every[1] == "{}/{}".format(*study.rate(study.ran, study.gate_key))
    reduced = {t for t in study.targets if t.endswith(("bfloat16", "float16", "float64"))}
    assert reduced  # the fixture has a bfloat16 target to drop
    kept = [c for c in study.ran if c["target"] not in reduced]
    assert float32[1] == "{}/{}".format(*study.rate(kept, study.gate_key))
    once_checks = [c for c in kept if c["model"] != "det+nms"]
    assert once[1] == "{}/{}".format(*study.rate(once_checks, study.gate_key))
    assert len(once_checks) < len(kept) < len(study.ran)
    assert published[4] == "672" and published[5] == "72.0%"
    intervals = rows_of(st.block_intervals(study).split("\n\n", 1)[1])
    assert intervals[0][5] == "2"  # tiny and det (det+nms is det's architecture)


def test_scale_free_difference_is_the_worst_leaf_over_its_reference_rms():
    check = {"leaves": [{"max_abs": 2e-6, "reference_rms": 0.5}, {"max_abs": 1e-4, "reference_rms": 100.0},
                        {"max_abs": 1.0, "reference_rms": None}, {"max_abs": None, "reference_rms": 1.0}]}
    assert st.scale_free(check) == pytest.approx(4e-6)  # not the leaf of the largest max_abs (1e-6 of its scale)
    assert st.scale_free({"leaves": []}) is None and st.scale_free({}) is None


def test_trained_blocks_render_from_their_own_run_and_are_required_only_with_it(records):
    study = st.Study(records)
    doc = "\n\n".join(f"<!-- study:{name} -->\nold\n<!-- /study:{name} -->" for name in [*st.BLOCKS, *st.TRAINED_BLOCKS])
    rendered = st.render(doc, study, trained=study)
    assert "\nold\n" not in rendered and "of RMS)" in rendered  # the fixture's checks record reference_rms
    with pytest.raises(SystemExit, match="unknown"):
        st.render(doc, study)  # trained blocks without a trained run would go stale
    table = rows_of(st.block_trained(study).split("\n\n", 2)[2])
    assert sum(int(r[-1].split("/")[0]) for r in table) == study.rate(study.ran, study.gate_key)[0]


def test_docs_study_md_is_what_its_archived_records_render():
    """Every generated block of docs/study.md, the trained models' included, is what the archives give: a
    table edited by hand, or records archived without re-rendering, fails here."""
    study = st.Study(st.load_records(st.ARCHIVE), st.wall_time(st.TIME_ARCHIVE.read_text()))
    trained = st.Study(st.load_records(st.TRAINED_ARCHIVE), st.wall_time(st.TRAINED_TIME_ARCHIVE.read_text()))
    doc = st.DOC.read_text(encoding="utf-8")
    assert st.render(doc, study, trained) == doc
