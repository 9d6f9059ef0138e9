"""benchmarks/study_tables.py, the script that writes docs/study.md's tables from a run's records: its
arithmetic (totals are the sums of the per-model rows, each tolerance's count matches the summary,
every failed check has one class) and its Wilson intervals, on a tiny run made with the fixtures."""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
import math
import re
import subprocess
import sys
import threading
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from parity.cli import main
from parity.records import read_records
from tests.support import EVERY_OUTCOME as TARGETS
from tests.support import ROOT, tiny_experiment

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
    totals = study.summary.totals
    assert {(r["model"], r["inputs"]) for r in rows} == {("tiny", "noise"), ("det", "photos")}
    assert sum(len(r["cells"]) for r in rows) == totals.checks == 2 * len(TARGETS)
    assert sum(r["passed"] for r in rows) == totals.passed
    assert sum(r["judged"] for r in rows) == totals.passed + totals.failed
    assert totals.passed and totals.failed and totals.skipped  # the run has all three kinds

    table = rows_of(st.block_per_model(study).split("\n\n", 1)[1])
    *models, last = table
    assert [r[0] for r in models] == ["tiny", "det"]
    assert last[-1] == f"**{totals.passed}/{totals.passed + totals.failed}**"
    for row in models:
        passed, judged = map(int, row[-1].split("/"))
        assert passed == sum(cell.startswith("pass") for cell in row[4:-1])
        assert judged == sum(cell != "not run here" for cell in row[4:-1])


def test_each_tolerance_counts_every_judged_check_once(records):
    study = st.Study(records)
    summary = study.summary
    table = rows_of(st.block_tolerance(study))
    assert len(table) == len(study.keys) == 4
    judged = summary.totals.passed + summary.totals.failed
    for row, key in zip(table, study.keys, strict=True):
        passed, failed, checks = int(row[1]), int(row[2]), int(row[3])
        assert passed == summary.per_tolerance[key].passed and passed + failed == checks == judged
        low, high = st.wilson(passed, checks)
        assert row[5] == f"{100 * low:.1f}% to {100 * high:.1f}%"
    assert table[study.keys.index(study.gate_key)][0].endswith("(gate)")
    pooled_passed, pooled_total = study.pooled()
    assert pooled_total == judged * len(study.keys)
    assert pooled_passed == sum(summary.per_tolerance[k].passed for k in study.keys)


def test_per_task_and_per_target_rows_partition_the_checks(records):
    study = st.Study(records)
    by_task = rows_of(st.block_per_task(study))
    assert sum(int(r[2]) for r in by_task) == len(study.ran)
    by_target = rows_of(st.block_per_target(study))
    assert [r[0] for r in by_target] == [t["name"] if "name" in t else "eager-cpu-bfloat16" for t in TARGETS]
    assert sum(int(r[2]) for r in by_target) == len(study.ran)
    never = next(r for r in by_target if r[0] == "never")
    assert never[2] == "0"  # could not run here: not judged, not a failure
    for row, target in zip(by_target, study.targets, strict=True):  # each target's verdicts at its own gate
        mine = [c for c in study.ran if c["target"] == target]
        assert row[-4].startswith("{}/{} ".format(*study.rate(mine))) and row[1] == st.judged_at(mine)


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


def test_the_bca_bootstrap_draws_whole_clusters():
    """Six clusters all passing and six all failing, ten checks each: a draw is a number of whole clusters, so
    the rate moves by tenths of the clusters' count (about 0.2 to 0.8), where drawing the 120 checks one by one
    would move it by a few points (Wilson's interval). Nothing to vary: the point."""
    clusters = [(10, 10)] * 6 + [(0, 10)] * 6
    low, high = st.bca_bootstrap(clusters, resamples=4000)
    w_low, w_high = st.wilson(60, 120)
    assert low < 0.3 and high > 0.7 and w_low > 0.4 and w_high < 0.6
    assert st.bca_bootstrap(clusters, resamples=500) == st.bca_bootstrap(clusters, resamples=500)  # seeded
    assert st.bca_bootstrap([(10, 10), (5, 5)], resamples=100) == (1.0, 1.0)
    assert st.bca_bootstrap([(1, 2)], resamples=100) == (0.5, 0.5)
    assert st.bca_bootstrap([]) == (0.0, 1.0)


def test_the_bca_parameters_follow_their_definitions():
    """z0: the normal quantile of the draws below the estimate (ties counted half); a: the jackknife's skewness
    over clusters, here by hand: leaving out each of (1/2, 2/2, 0/3) gives 2/5, 1/5, 3/4."""
    passes, counts = np.array([1.0, 2.0, 0.0]), np.array([2.0, 2.0, 3.0])
    jack = np.array([0.4, 0.2, 0.75])
    spread = jack.mean() - jack
    z0, accel = st.bca_parameters(passes, counts, np.array([0.1, 0.2, 3 / 7, 0.5]))
    assert z0 == pytest.approx(NormalDist().inv_cdf(2.5 / 4))
    assert accel == pytest.approx(np.sum(spread ** 3) / (6 * np.sum(spread ** 2) ** 1.5)) and accel == pytest.approx(-0.030726, abs=1e-6)
    skewed = [(1, 1)] * 12 + [(0, 1)] * 2 + [(3, 20)]  # unequal clusters: the correction moves the bounds
    assert st.bca_bootstrap(skewed, resamples=4000) != _percentile(skewed, resamples=4000)


def _percentile(clusters: list[tuple[int, int]], resamples: int) -> tuple[float, float]:
    """The plain percentile interval from the same draws, for comparison."""
    passes, counts = np.array([p for p, _ in clusters], float), np.array([n for _, n in clusters], float)
    draws = np.random.default_rng(st.BOOTSTRAP_SEED).integers(0, len(clusters), size=(resamples, len(clusters)))
    rates = passes[draws].sum(axis=1) / counts[draws].sum(axis=1)
    return float(np.quantile(rates, 0.025)), float(np.quantile(rates, 0.975))


def _leaf_check(max_abs: float, rms: float, rmse: float, passed: bool, failure_class: str | None = None) -> dict:
    return {"status": "ok", "passed": passed, "failure_class": failure_class, "max_abs": max_abs, "gate": 1e-4,
            "verdicts": {"1e-04": passed}, "leaves": [{"max_abs": max_abs, "rmse": rmse, "reference_rms": rms}]}


def test_the_scale_free_verdict_divides_by_the_reference_output_s_rms():
    """A large output that fails the absolute gate passes at 1e-4 of its RMS, a small one that passes it fails;
    a check that did not compare by value fails, identical outputs pass; relative RMSE is RMSE over the RMS."""
    large = _leaf_check(1e-3, rms=100.0, rmse=1e-4, passed=False, failure_class="numeric_drift")
    small = _leaf_check(5e-5, rms=0.01, rmse=1e-5, passed=True)
    assert st.scale_free_verdict(large) and not st.scale_free_verdict(large, 1e-6)
    assert not st.scale_free_verdict(small) and st.scale_free_verdict(small, 1e-2)
    assert st.relative_rmse(large) == pytest.approx(1e-6) and st.relative_rmse(small) == pytest.approx(1e-3)
    assert not st.scale_free_verdict({**large, "failure_class": "shape_mismatch"})
    assert not st.scale_free_verdict({**large, "status": "skipped"})
    assert st.scale_free_verdict(_leaf_check(0.0, rms=0.0, rmse=0.0, passed=True))


def test_clusters_are_backbone_families_and_one_execution_counts_once():
    """The archived study: 21 builders in 14 backbone families (the detectors and segmentation models on
    MobileNetV3-large's and ResNet-50's trunks join them); bfloat16 judged at two gates is one execution, so the
    counts that took it twice (168 checks, the flip total 1064) count it once (144, 880 boxes)."""
    study = st.Study(st.load_records(st.ARCHIVE))
    assert study.family("fcn_r50") == "resnet50" and study.family("ssdlite320+nms") == "mobilenet_v3_large"
    assert len(study.clusters(study.ran)) == 14 and len({study.architecture(m) for m in study.models}) == 21
    assert study.execution_of()["eager-cpu-bfloat16-f32gate"] == "eager-cpu-bfloat16"
    assert "eager-cpu-bfloat16-f32gate" not in study.distinct_targets() and len(study.distinct_targets()) == 6
    once = [c for c in study.ran if c["target"] in study.distinct_targets()]
    assert study.rate(once) == (70, 144)
    assert len(study.clusters(once, "family-target")) == 14 * 6
    totals = {r[0]: r[-1] for r in rows_of(st.block_flips(study).split("\n\n")[3])}
    assert totals["**all**"] == "1064" and totals["**all, each execution once**"] == "880"
    assert totals["moved or replaced"] == "242" and "geometry" not in totals  # parity's `geometry`, named as read
    headline = st.block_headline(study)
    assert "144 distinct executions, counted once below (eager-cpu-bfloat16-f32gate:" in headline
    assert ("**70 of 144 checks pass (48.6%; 95% BCa by backbone family 21.9% to 76.0% (14; seed 0), the width to "
            "read; Wilson 40.6% to 56.7%") in headline
    assert "**88 of 120 checks pass (73.3%; 95% BCa by backbone family 51.4% to" in headline
    assert "70 of 168" not in headline and "105 of 113 task checks agree" in headline


def test_the_seed_table_gives_each_seed_s_scale_free_verdict_beside_the_absolute_one():
    """The archived seed replicas: MobileNetV3-large fails the absolute gate on compile with every seed, and the
    scale-free gate (1e-4 of RMS) with seed 2 only; a reduced-precision target has no scale-free verdict."""
    rows = {(r[0], r[1]): r for r in rows_of(st.block_seeds(st.Study(st.load_records(st.ARCHIVE))).split("\n\n")[1])}
    compile_ = rows[("mobilenet_v3_large", "compile-cpu")]
    assert compile_[4] == "FAIL FAIL FAIL FAIL FAIL" and compile_[8] == "pass pass FAIL pass pass"
    assert compile_[9] == "5.0e-05 4.1e-05 1.7e-04 3.4e-05 5.5e-06"
    assert rows[("resnet50", "eager-cpu-bfloat16")][8:10] == ["-", "-"]


def test_a_headline_rate_leads_with_the_clustered_interval_and_reads_wilson_where_it_collapses():
    varied = st.rate_with_intervals(3, 6, [(3, 3), (0, 3)])
    assert varied.startswith("50.0%; 95% BCa by backbone family ") and varied.endswith(
        f"(2; seed 0), the width to read; Wilson {st.ci(3, 6)}, checks as independent trials, a lower bound on that width")
    assert st.rate_with_intervals(0, 6, [(0, 3), (0, 3)]) == (
        f"0.0%; 95% BCa by backbone family 0.0% to 0.0% (2; seed 0), a point: every family at one rate, so "
        f"Wilson's {st.ci(0, 6)} is the interval to read")


def test_the_trained_models_rates_count_bfloat16_s_one_execution_once():
    text = st.block_trained(st.Study(st.load_records(st.TRAINED_ARCHIVE)))
    assert "each execution once (eager-cpu-bfloat16-f32gate left out" in text and ": 34 of 55 checks pass (61.8%;" in text
    assert "  - float32 targets: 34 of 44 (77.3%;" in text and "  - reduced-precision targets: 0 of 11 (0.0%;" in text


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
    assert intervals[0][4].endswith(" (2; seed 0)")  # tiny and det (det+nms is det's architecture, its own family)
    ran_on = {c["target"] for c in study.ran if st.judged(c)}  # the targets that ran here (`never` cannot)
    assert intervals[0][5].endswith(f" ({2 * len(ran_on)}; seed 0)")  # each family on each of them


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
    """Every generated block of docs/study.md, the trained models', the first run's and the study/ experiments'
    included, is what the archives give: a table edited by hand, or records archived without re-rendering, fails here.
    So is docs/study-intervals.jsonl: every BCa interval the document prints, with what it was drawn from, in the
    document's order, each printed with its seed."""
    study = st.Study(st.load_records(st.ARCHIVE), st.wall_time(st.TIME_ARCHIVE.read_text()),
                     st.load_records(st.SURVEY_ARCHIVE), st.load_records(st.FIDELITY_ARCHIVE),
                     st.load_records(st.RERUN_ARCHIVE))
    trained = st.Study(st.load_records(st.TRAINED_ARCHIVE), st.wall_time(st.TRAINED_TIME_ARCHIVE.read_text()))
    first = st.Study(st.load_records(st.FIRST_ARCHIVE), st.wall_time(st.FIRST_TIME_ARCHIVE.read_text()))
    doc = st.DOC.read_text(encoding="utf-8")
    intervals: list[dict] = []
    assert st.render(doc, study, trained, first, st.load_experiments(), intervals) == doc
    assert st.interval_lines(intervals) == st.INTERVALS_ARCHIVE.read_text(encoding="utf-8")
    printed = re.findall(r"\d+\.\d% to \d+\.\d% \((?:\d+; )?seed (\d+)\)", doc)
    assert len(printed) == len(intervals) > 60 and {int(x) for x in printed} == {line["seed"] for line in intervals}


def test_every_archived_interval_is_drawn_again_bit_for_bit_from_its_seed(tmp_path):
    """docs/study-intervals.jsonl re-computes from its own clusters, draws and seed with no bit changed (the
    published family bounds were not reproducible in an independent recomputation); a bound changed in its last
    bit is named."""
    assert st.recompute_intervals() == []
    lines = st.load_records(st.INTERVALS_ARCHIVE)
    lines[3]["high"] = math.nextafter(lines[3]["high"], 2.0)
    (tmp_path / "intervals.jsonl").write_text(st.interval_lines(lines))
    wrong = st.recompute_intervals(tmp_path / "intervals.jsonl")
    assert len(wrong) == 1 and wrong[0].startswith("intervals.jsonl:4 (")


def test_two_runs_draw_identical_bounds():
    """The same clusters in two fresh processes give the same bounds to the last bit: the seed fixes the draws."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('st', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(repr(m.bca_bootstrap([(4, 5), (10, 15), (19, 45)] + [(5, 5)] * 11, resamples=2000)))")
    runs = [subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks" / "study_tables.py")],
                           capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].startswith("(0.")


def test_first_run_blocks_render_from_their_own_run_and_are_required_only_with_it(records):
    study = st.Study(records, survey=SURVEY)
    names = [*st.BLOCKS, *st.TRAINED_BLOCKS, *st.FIRST_BLOCKS]
    doc = "\n\n".join(f"<!-- study:{name} -->\nold\n<!-- /study:{name} -->" for name in names)
    rendered = st.render(doc, study, trained=study, first=study)
    assert "\nold\n" not in rendered and "Conv2d" in rendered  # the survey's table is the study's block
    with pytest.raises(SystemExit, match="unknown"):
        st.render(doc, study, trained=study)  # first-run blocks without the first run would go stale


FIDELITY = [{"experiment": "study", "model": "det+nms", "inputs": "photos", "boxes_before": 10, "boxes_after": 9,
             "kept": 8, "f1": 16 / 19, "map": 0.75, "latency_unadapted_s": 0.2, "latency_adapted_s": 0.25,
             "repeats": 7, "commit": "0123456789abcdef"}]


def test_the_fidelity_table_is_the_benchmark_s_rows():
    """Each row: boxes on both sides, kept over the unadapted boxes, F1 and mAP, latency in ms and the
    adapted-over-unadapted ratio; the note names the commit and the repeats."""
    study = st.Study(st.load_records(st.FIRST_ARCHIVE), fidelity=FIDELITY)
    note, body = st.block_adapter_fidelity(study).split("\n\n", 1)
    assert rows_of(body) == [["study", "det+nms", "photos", "10", "9", "8/10", "0.842", "0.750", "200.0 / 250.0", "1.25"]]
    assert "0123456789" in note and "median ms of 7 forwards" in note
    assert "No fidelity rows" in st.block_adapter_fidelity(st.Study(st.load_records(st.FIRST_ARCHIVE)))


def test_like_for_like_adds_the_first_runs_targets_when_a_run_has_more(records):
    """A run with float32 targets beyond the first run's gets a row over the first run's three alone."""
    first = st.Study(st.load_records(st.FIRST_ARCHIVE))
    assert len(rows_of(st.block_like_for_like(first))) == 4  # its float32 targets are the first run's
    extra = copy.deepcopy(first.all_records)
    run = next(r for r in extra if r["kind"] == "run")
    run["config"]["targets"].append({"backend": "openvino", "device": "cpu", "dtype": "float32", "name": None})
    for c in [c for c in extra if c["kind"] == "check" and c["target"] == "compile-cpu"]:
        extra.append({**c, "target": "openvino-cpu"})
    more = st.Study(extra)
    rows = rows_of(st.block_like_for_like(more))
    assert rows[3][0].startswith("the first run's float32 targets (compile-cpu, onnxruntime-cpu, torchscript-cpu)")
    assert rows[3][1] == rows_of(st.block_like_for_like(first))[2][1]  # the same checks as the first run's row


def test_tier_3_leaves_out_entries_whose_task_has_no_decision(records):
    """A `task: other` entry has no tier-3 check by design: it is not shown as `no outputs`."""
    other = copy.deepcopy(records)
    run = next(r for r in other if r["kind"] == "run")
    for m in run["config"]["models"]:
        if m["task"] == "classification":
            m["task"] = "other"
    other = [r for r in other if not (r["kind"] == "check" and r["tier"] == 3 and r["task"] == "classification")]
    models = [r[0] for r in rows_of(st.block_tier3(st.Study(other)).split("\n\n", 1)[1])]
    assert models == ["det"]


def test_each_check_is_counted_at_its_own_gate(records):
    """A target judged at its dtype's default gate (bfloat16: atol 1e-5 at rtol 1.6e-2) passes or fails there,
    not at the experiment's gate: the tables count the verdict the check itself records."""
    study = st.Study(records)
    check = copy.deepcopy(next(c for c in study.ran if c["target"] == "same"))
    key_own, key_experiment = st.tolerance_key(1e-5), study.gate_key
    check.update(gate=1e-5, rtol=1.6e-2, tolerance_source="default-for-bfloat16",
                 verdicts={**check["verdicts"], key_own: False, key_experiment: True})
    assert st.at_gate(check) is False
    assert study.rate([check]) == (0, 1) and study.rate([check], key_experiment) == (1, 1)
    assert st.judged_at([check]) == "rtol 0.016, gate 1e-05 (default-for-bfloat16)"


def with_seed_replicas(records: list[dict], required: list[float]) -> list[dict]:
    """The run's records with the tiny model listed again under seeds 1, 2, ... (`tiny-s1`, ...), each
    replica's checks copied from tiny's with the given required atol (and verdicts to match)."""
    out = []
    for r in records:
        if r["kind"] == "run":
            r = copy.deepcopy(r)
            tiny = next(m for m in r["config"]["models"] if m["name"] == "tiny")
            r["config"]["models"] += [{**tiny, "name": f"tiny-s{i}", "seed": i} for i in range(1, len(required))]
        out.append(r)
    for i, atol in enumerate(required[1:], start=1):
        for r in records:
            if r.get("model") == "tiny" and r["kind"] == "check" and r["tier"] == 1 and r["status"] == "ok":
                replica = copy.deepcopy({**r, "model": f"tiny-s{i}", "required_atol": atol})
                replica["verdicts"] = {k: atol <= float(k) for k in replica["verdicts"]}
                replica["passed"] = atol <= replica["gate"]
                for leaf in replica["leaves"]:
                    leaf["required_atol"] = atol
                out.append(replica)
    return out


def test_seed_replicas_are_kept_out_of_the_design_tables_and_spread_in_their_own(records):
    study = st.Study(records)
    tiny = next(c for c in study.ran if c["model"] == "tiny" and c["target"] == "perturbed")
    seeded = st.Study(with_seed_replicas(records, [tiny["required_atol"], 1e-7, 1e-3]))
    assert seeded.replicas == {"tiny-s1", "tiny-s2"}
    assert len(seeded.ran) == len(study.ran) and seeded.summary.totals == study.summary.totals
    assert st.seed_groups(seeded) == {"tiny": ["tiny", "tiny-s1", "tiny-s2"]}
    row = next(r for r in rows_of(st.block_seeds(seeded).split("\n\n", 1)[1]) if r[1] == "perturbed")
    assert row[2] == "0, 1, 2"
    verdicts = [st.at_gate(tiny), True, False]  # 1e-7 passes the gate, 1e-3 does not
    assert row[3] == f"{sum(verdicts)}/3" and row[4] == " ".join("pass" if v else "FAIL" for v in verdicts)
    low, high = min(tiny["required_atol"], 1e-7), max(tiny["required_atol"], 1e-3)
    assert row[5] == f"{st.sci(low)} to {st.sci(high)}" and row[6] == f"{high / low:.1f}x"
    assert st.block_seeds(study) == "No model is listed with more than one seed."


def test_flip_counts_are_tabled_per_detector_and_target_and_summed_per_mechanism(records):
    """Two detector entries failing on one target: the matrix shows each entry's own counts, the totals add
    both entries' boxes per mechanism, in the classes' own order."""
    study = st.Study(with_adapter_twin(records))
    target = next(k[2] for k in study.tier3 if k[0] == "det")
    counts = {"det": {"tie_order": 3, "nms_iou": 1}, "det+nms": {"tie_order": 2, "score_threshold": 4}}
    for key, c in study.tier3.items():
        if key[2] == target and key[0] in counts:
            study.tier3[key] = {**c, "passed": False, "failure_class": "decision_flip",
                                "flips": {"counts": counts[key[0]], "candidates": "both", "examples": []}}
    matrix, totals = [rows_of(part) for part in st.block_flips(study).split("\n\n")[1::2]]
    column = 1 + study.targets.index(target)
    assert [r[0] for r in matrix] == ["det", "det+nms"]
    assert matrix[0][column].endswith(": tie_order 3, nms_iou 1")
    assert matrix[1][column].endswith(": tie_order 2, score_threshold 4")
    by_mechanism = {r[0]: r[1:] for r in totals}
    assert list(by_mechanism) == ["tie_order", "score_threshold", "nms_iou", "**all**"]  # the classes' own order
    assert by_mechanism["tie_order"][column - 1] == "5" and by_mechanism["tie_order"][-1] == "5"
    assert by_mechanism["**all**"][-1] == "10"


def test_a_passing_check_with_attributed_boxes_shows_agree_and_counts_them(records):
    """A pass short of every box (records from 2ea5107 on attribute its boxes): `agree`, F1 and its counts in
    the cell, its boxes in the totals; a pass without flips is `agree` alone."""
    study = st.Study(records)
    key = next(k for k in study.tier3 if k[0] == "det")
    study.tier3[key] = {**study.tier3[key], "passed": True, "failure_class": None, "metrics": {"f1": 0.96},
                        "flips": {"counts": {"score_threshold": 2}, "candidates": "both", "examples": []}}
    matrix, totals = [rows_of(part) for part in st.block_flips(study).split("\n\n")[1::2]]
    column = 1 + study.targets.index(key[2])
    assert matrix[0][column] == "agree, F1 0.960: score_threshold 2"
    assert {r[0]: r[-1] for r in totals}["score_threshold"] == "2"
    del study.tier3[key]["flips"]
    assert rows_of(st.block_flips(study).split("\n\n")[1])[0][column] == "agree (F1 0.960)"


SURVEY = [
    {"model": "a", "inputs": "x", "target": "compile-cpu", "first_divergent": "layer1.conv", "first_divergent_by": "own",
     "culprit": "layer1.conv", "module_types": {"layer1.conv": "Conv2d"}, "tier1": {"required_atol": 2e-4}, "wall_s": 12.0},
    {"model": "b", "inputs": "x", "target": "onnxruntime-cpu", "first_divergent": "features.3", "first_divergent_by": "propagated",
     "culprit": None, "module_types": {"features.3": "Conv2d"}, "wall_s": 30.0},
    {"model": "b", "inputs": "x", "target": "compile-cpu", "first_divergent": "head.se", "first_divergent_by": "own",
     "culprit": "head.se", "module_types": {"head.se": "SqueezeExcitation"}, "wall_s": 8.0},
    {"model": "c", "inputs": "x", "target": "compile-cpu", "error": "localize wrote no layers record: boom", "wall_s": 3.0},
    {"model": "e", "inputs": "x", "target": "onnxruntime-ts-cpu", "first_divergent": None, "culprit": None,
     "verdict": "inconclusive: the target could not run them alone", "wall_s": 60.0},
    {"model": "d", "inputs": "x", "target": "compile-cpu", "kind": "layers",
     "error": "not reached: the survey's time budget was spent"},
]


def test_the_localize_survey_counts_first_divergent_module_types(records):
    study = st.Study(records, survey=SURVEY)
    text = st.block_localize(study)
    assert text.startswith("6 float32 tier-1 failures (numeric_drift or nonfinite) to localize: 4 localized, "
                           "1 where localize gave no layers, 1 not reached")
    by_type, per_check = [rows_of(part) for part in text.split("\n\n")[2::2]]
    assert by_type[0][:3] == ["`Conv2d`", "2", "compile-cpu 1, onnxruntime-cpu 1"]
    assert by_type[1][:2] == ["`SqueezeExcitation`", "1"]
    assert by_type[2][:3] == ["(no layer over the threshold)", "1", "onnxruntime-ts-cpu 1"]
    assert [r[0] for r in per_check] == ["a", "b", "b", "c", "e", "d"] and per_check[0][4] == "2.0e-04"
    assert per_check[4][2] == "none" and per_check[4][6] == "inconclusive: the target could not run them alone"
    assert st.block_localize(st.Study(records)).startswith("No per-layer survey")


def test_a_check_localized_again_is_set_beside_the_survey_s_first_divergent_module(tmp_path):
    """The v4 rerun: each layers record whole (its levels kept), compared with the survey's line of the same check."""
    def layers(model, first, levels=2):
        return {"kind": "layers", "model": model, "inputs": "photos", "target": "ort", "first_divergent": first,
                "culprit": first, "elapsed_s": 12.5, "levels": [{"layers": [{"name": "a"}, {"name": "b"}]}] * levels}

    for i, (model, first) in enumerate((("m1", "features.11"), ("m2", "features.13"))):
        (tmp_path / f"{i}").mkdir()
        lines = [{"kind": "run", "environment": {"git_commit": "8434d745deab", "cpu": {"model": "EPYC", "flags": ["avx2"]}}},
                 layers(model, first)]
        (tmp_path / f"{i}" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rerun = st.rerun_lines(tmp_path)
    assert [r["levels"] for r in rerun] == [layers("m", None)["levels"]] * 2 and rerun[0]["git_commit"] == "8434d745deab"
    survey = [{"model": m, "inputs": "photos", "target": "ort", "first_divergent": f}
              for m, f in (("m1", "features.11"), ("m2", "features.12"))]
    survey[0]["module_types"] = {"features.11": "InvertedResidual"}
    survey[1].update(culprit="features.12", verdict="features.12 (in its own code, between its submodules) introduces ...")
    rerun[1].update(as_a_whole=True, culprit_code="SqueezeExcitation (misc.py:225)")
    rerun[0]["in_own_code"] = False
    study = SimpleNamespace(rerun=rerun, survey=survey, family=lambda m: "mobilenet_v3_large", task=lambda m: "x")
    text = st.block_localize_rerun(study)  # the fields the block reads
    assert text.startswith("2 of the survey's checks localized again in v4 (`parity localize`, one check per process, "
                           "one torch thread; parity at 8434d745de on EPYC (avx2)): 1 name the same first divergent")
    assert "A culprit in its parent's own code: 1 of the survey's lines for these checks, 0 of the reruns." in text
    assert ("2 of these checks; their first divergent module's class: `InvertedResidual` 1, `SqueezeExcitation` 1; "
            "their culprit's class: `InvertedResidual` 1, `SqueezeExcitation` 1; "
            "the drift's shape: none of these 1, only as a whole 1.") in text
    assert rows_of(text.split("\n\n", 2)[2]) == [
        ["m1", "ort", "features.11", "features.11 (`InvertedResidual`)", "same", "none", "features.11", "", "4", "12.5"],
        ["m2", "ort", "features.12", "features.13 (`SqueezeExcitation`)", "**differs**", "features.12 (own code)",
         "features.13", "only as a whole", "4", "12.5"]]
    rerun[1]["in_own_code"] = True
    again = st.block_localize_rerun(study)
    assert "1 of the survey's lines for these checks, 1 of the reruns." in again and "features.13 (own code)" in again
    study.task = lambda m: "detection"  # a detector on the backbone is not counted among the backbone's checks
    assert "these checks;" not in st.block_localize_rerun(study)


def test_a_later_rerun_replaces_its_check_in_the_archive_and_adds_the_others():
    def line(model, first):
        return {"model": model, "inputs": "photos", "target": "ort", "first_divergent": first}

    merged = st.merge_reruns([line("a", "x"), line("b", "y")], [line("c", "z"), line("a", "w")])
    assert [(r["model"], r["first_divergent"]) for r in merged] == [("a", "w"), ("b", "y"), ("c", "z")]


def test_the_archive_keeps_the_survey_s_fields_and_drops_a_stale_one(records, tmp_path):
    run = tmp_path / "run"
    (run / "localize").mkdir(parents=True)
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "localize" / "survey.jsonl").write_text(json.dumps({**SURVEY[0], "levels": [{"parent": None}]}) + "\n")
    survey_out = tmp_path / "survey.jsonl.gz"
    st.archive(run, tmp_path / "records.jsonl.gz", tmp_path / "time.txt", survey_out)
    assert st.load_records(survey_out) == [SURVEY[0]]  # the per-layer tables (levels) left in the run folder
    (run / "localize" / "survey.jsonl").unlink()
    st.archive(run, tmp_path / "records.jsonl.gz", tmp_path / "time.txt", survey_out)
    assert not survey_out.exists()


def test_scale_free_of_the_required_atol():
    check = {"leaves": [{"max_abs": 2e-3, "required_atol": 1e-3, "reference_rms": 10.0},
                        {"max_abs": 2e-5, "required_atol": 1e-5, "reference_rms": 1e-3}]}
    assert st.scale_free(check, "required_atol") == pytest.approx(1e-2)  # the second leaf's, of the smaller atol
    assert st.scale_free(check) == pytest.approx(2e-2)
    assert st.scale_free({"leaves": [{"max_abs": 1.0, "required_atol": None, "reference_rms": 1.0}]}, "required_atol") is None


def test_the_survey_localizes_float32_numeric_failures_in_the_run_s_order(tmp_path):
    """benchmarks/study_localize.py picks the float32 targets' failed tier-1 checks that both sides produced
    outputs for (numeric_drift, nonfinite), in the order the run recorded them; and reads a records file that
    is still being written up to its last complete line."""
    spec = importlib.util.spec_from_file_location("study_localize", ROOT / "benchmarks" / "study_localize.py")
    survey = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(survey)
    run = {"kind": "run", "config": {"targets": [{"backend": "compile"}, {"backend": "eager", "dtype": "bfloat16"},
                                                 {"backend": "onnxruntime", "name": "ort-ts", "options": {"exporter": "torchscript"}}]}}

    def check(model, target, passed=False, failure_class="numeric_drift", status="ok", tier=1):
        return {"kind": "check", "tier": tier, "model": model, "target": target, "inputs": "x", "status": status,
                "passed": passed, "failure_class": failure_class}

    records = [run, check("m2", "compile-cpu"), check("m1", "eager-cpu-bfloat16"), check("m1", "compile-cpu", passed=True),
               check("m1", "ort-ts", failure_class="unsupported_op"), check("m1", "ort-ts", failure_class="nonfinite"),
               check("m1", "compile-cpu", tier=3, failure_class="decision_flip"), check("m3", "compile-cpu", status="skipped")]
    picked = survey.survey_checks(records)
    assert [(c["model"], c["target"], c["failure_class"]) for c in picked] == [
        ("m2", "compile-cpu", "numeric_drift"), ("m1", "ort-ts", "nonfinite")]
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(run) + "\n" + json.dumps(records[1]) + "\n" + '{"kind": "che')
    assert survey.read_jsonl(path) == [run, records[1]]
    assert survey.survey_checks([]) == []


def test_a_run_stopped_before_the_end_says_which_entries_it_did_not_reach(records):
    """A run stopped at its time limit: the entries without a check are named as not run and left out of every
    table, and GNU time's report of the signal shows in the run block."""
    stopped = copy.deepcopy(records)
    run = next(r for r in stopped if r["kind"] == "run")
    run["config"]["models"].append({**run["config"]["models"][0], "name": "later"})
    study = st.Study(stopped, st.wall_time("\tCommand terminated by signal 15\n" + GNU_TIME))
    assert study.unrun == ["later"] and "later" not in study.models
    assert "- **Not run**: 1 entry of the experiment that the run did not reach before it was stopped: later." \
        in st.block_design(study)
    assert "it was stopped (signal 15) before it finished" in st.block_run(study)
    assert "stopped" not in st.block_run(st.Study(records, st.wall_time(GNU_TIME)))


def test_a_structural_failure_shows_no_difference():
    """A check whose outputs differ in shape compares no values that describe it: its cell gives the class,
    not the compared leaves' difference (0.0 would read as 'identical'), and no scale-free ratio."""
    check = {"status": "ok", "passed": False, "failure_class": "shape_mismatch", "max_abs": 0.0, "gate": 1e-4,
             "verdicts": {"0.0001": False}, "leaves": [{"max_abs": 0.0, "reference_rms": 2.0}]}
    study = st.Study(st.load_records(st.FIRST_ARCHIVE))
    assert st._scaled_cell(study, check) == "FAIL shape_mismatch"
    drift = {**check, "failure_class": "numeric_drift", "max_abs": 0.5, "leaves": [{"max_abs": 0.5, "reference_rms": 2.0}]}
    assert st._scaled_cell(study, drift) == "FAIL 5.0e-01 numeric_drift (2.5e-01 of RMS)"


def test_a_survey_started_again_keeps_its_lines_and_localizes_the_rest_in_order(tmp_path, monkeypatch):
    """Lines an earlier survey wrote are kept; checks it did not reach (its budget spent) and those it never saw
    are localized, two at a time, and written in the run's order whichever finishes first."""
    spec = importlib.util.spec_from_file_location("study_localize", ROOT / "benchmarks" / "study_localize.py")
    survey = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(survey)
    run = {"kind": "run", "config": {"targets": [{"backend": "compile"}]}}
    checks = [{"kind": "check", "tier": 1, "model": m, "target": "compile-cpu", "inputs": "x", "status": "ok",
               "passed": False, "failure_class": "numeric_drift"} for m in ("m1", "m2", "m3")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [run, *checks]))
    (tmp_path / "localize").mkdir()
    earlier = [{"model": "m1", "inputs": "x", "target": "compile-cpu", "verdict": "from before"},
               {"model": "m2", "inputs": "x", "target": "compile-cpu", "error": "not reached: the survey's time budget was spent"}]
    (tmp_path / "localize" / "survey.jsonl").write_text("".join(json.dumps(line) + "\n" for line in earlier))
    localized, m3_started = [], threading.Event()

    def localize_one(experiment, check, out, cache_dir, timeout):
        localized.append(check["model"])
        if check["model"] == "m3":
            m3_started.set()
            return {"kind": "layers", "verdict": "localized m3", "wall_s": 0.0}
        together = m3_started.wait(10)  # m2 finishes after m3 started beside it: only two workers can do that
        return {"kind": "layers", "verdict": f"localized m2{'' if together else ' alone'}", "wall_s": 0.0}

    monkeypatch.setattr(survey, "localize_one", localize_one)
    assert survey.main([str(tmp_path), "--cache-dir", str(tmp_path / "cache"), "--workers", "2"]) == 0
    lines = survey.read_jsonl(tmp_path / "localize" / "survey.jsonl")
    assert [(line["model"], line["verdict"]) for line in lines] == [
        ("m1", "from before"), ("m2", "localized m2"), ("m3", "localized m3")]
    assert sorted(localized) == ["m2", "m3"]


def test_compare_runs_names_the_decisions_that_differ_between_two_runs(records, tmp_path):
    """study/compare_runs.py: the same run against itself is stable; a check whose verdict flips in the second
    run, and an image of detector_at_scale.py whose decision changed in one run only, are unstable."""
    spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "study" / "compare_runs.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert compare.unstable(compare.decisions(first), compare.decisions(first)) == []
    flipped = copy.deepcopy(records)
    check = next(c for c in flipped if c["kind"] == "check" and c["tier"] == 1 and c["model"] == "tiny")
    check["passed"] = not check["passed"]
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flipped))
    assert compare.unstable(compare.decisions(first), compare.decisions(tmp_path / "second")) == [
        (1, "tiny", check["inputs"], check["target"])]
    rows = [{"target": "onnxruntime", "image": "0000.png", "f1": 1.0, "threads": 1},
            {"target": "onnxruntime", "image": "0001.png", "f1": 0.9, "threads": 1}]
    one, two = tmp_path / "t1.jsonl", tmp_path / "t2.jsonl"
    one.write_text("".join(json.dumps(r) + "\n" for r in rows))
    two.write_text("".join(json.dumps({**r, "f1": 1.0, "threads": 2}) + "\n" for r in rows))
    assert compare.unstable(compare.decisions(one), compare.decisions(two)) == [("onnxruntime", "0001.png")]


def _image(target: str, image: str, photo: str, f1: float, threads: int = 1, **flips) -> dict:
    return {"target": target, "image": image, "photo": photo, "threads": threads, "boxes_reference": 3,
            "boxes_target": 3, "matched": 3 if f1 == 1.0 else 2, "f1": f1, "flips": flips,
            "max_abs_over_rms": 1e-6, "relative_rmse": 1e-7}


def test_detector_scale_counts_changed_images_with_intervals_over_photos():
    rows = [_image("ort", f"a{i}", "a", 0.8 if i < 2 else 1.0, **({"tie_order": 1} if i < 2 else {})) for i in range(4)]
    rows += [_image("ort", f"b{i}", "b", 1.0) for i in range(4)]
    rows.append({"target": "ort", "image": "c0", "photo": "c", "threads": 1, "error": "RuntimeError: no"})
    table = rows_of(st.detector_scale_table(rows))
    assert len(table) == 1
    threads, target, images, changed, wilson, bca, boxes, mechanisms = table[0][:8]
    assert (threads, target, images, changed, boxes, mechanisms) == ("1", "ort", "8 (1 failed)", "2/8", "24", "tie_order 2")
    assert wilson == st.ci(2, 8)
    low, high = st.bca_bootstrap([(2, 4), (0, 4)])  # two photos, not eight images
    assert bca == f"{100 * low:.1f}% to {100 * high:.1f}% (2; seed 0)"
    assert not st.decision_changed({"f1": 1.0}) and st.decision_changed({"f1": 0.99})
    assert not st.decision_changed({"error": "x", "f1": 0.0})  # a head that failed has no decision


def test_detector_mechanisms_count_images_not_boxes():
    rows = [_image("ort", "a0", "a", 0.5, nms_iou=3), _image("ort", "a1", "a", 1.0), _image("ort", "b0", "b", 0.9, nms_iou=1),
            _image("ort", "b1", "b", 0.5, score_threshold=1), _image("ort", "b2", "b", 0.5, nms_iou=2, threads=2)]
    table = rows_of(st.block_detector_mechanisms(st.Experiments(detector=rows)).split("\n\n", 1)[1])
    # one thread only (b2 at two is not counted); an image counts under each mechanism it has a box of
    assert [r[:5] for r in table] == [["score_threshold", "ort", "1", "1/4", st.ci(1, 4)], ["nms_iou", "ort", "4", "2/4", st.ci(2, 4)]]
    assert table[1][5].endswith("(2; seed 0)")


def test_se_steps_are_ratios_of_consecutive_blocks_split_by_the_as_built_flag():
    def row(k, rel, se):
        return {"block": f"features.{k}", "relative_rmse": rel, "se": se}

    rows = [row(0, 0.0, False), row(1, 1e-6, True), row(2, 2e-6, False), row(3, 8e-6, True), row(10, 4e-6, True),
            {"block": "whole model", "relative_rmse": 1.0, "se": False}]
    steps = st.se_steps(list(reversed(rows)))  # sorted by block number, not by name or order given
    assert steps[True] == pytest.approx([4.0, 0.5]) and steps[False] == pytest.approx([2.0])  # features.1 follows an exact block


def test_se_control_table_takes_each_profile_apart():
    def row(variant, k, rel, se):
        return {"model": "m", "variant": variant, "target": "ort", "block": f"features.{k}", "type": "B",
                "se": se, "relative_rmse": rel, "max_abs_over_rms": 10 * rel}

    rows = []
    for variant, factor in (("as-built", 4.0), ("no-se", 1.0)):
        rows += [row(variant, 0, 1e-6, False), row(variant, 1, factor * 1e-6, True), row(variant, 2, factor * 2e-6, False)]
        rows.append({**row(variant, 0, 3e-6, False), "block": "whole model"})
    table = rows_of(st.block_se_control(st.Experiments(se=rows)).split("\n\n", 1)[1])
    assert [r[:5] for r in table] == [["m", "as-built", "ort", "4.00 (1)", "2.00 (1)"],
                                      ["m", "no-se", "ort", "1.00 (1)", "2.00 (1)"]]
    assert table[0][5] == "features.2 8.0e-06" and table[0][6] == "3.0e-06" and table[0][7] == "3.0e-05"
    blocks = rows_of(st.block_se_blocks(st.Experiments(se=rows)).split("\n\n", 1)[1])
    assert blocks[1] == ["m", "features.1", "SE", "4.0e-06", "1.0e-06"]


def test_the_se_replica_says_how_far_each_row_moved_between_two_measurements():
    def row(block, rmse, max_abs, target="ort"):
        return {"model": "m", "variant": "as-built", "target": target, "block": block, "type": "T", "se": False,
                "relative_rmse": rmse, "max_abs_over_rms": max_abs}

    archived = [row("features.0", 1e-6, 1e-5), row("whole model", 2e-6, 2e-5), row("whole model", 1e-6, 1e-5, "ov")]
    again = [row("features.0", 1.1e-6, 1e-5), row("whole model", 2e-6, 3e-5)]
    text = st.block_se_replica(st.Experiments(se=archived, se_replica=again))
    assert text.startswith("The SE control's rows measured again (the same script, seed and images, another session), "
                           "2 block rows matched to the archived ones: relative RMSE by at most 10.0% (median 5.0%); "
                           "max abs / RMS by at most 50.0% (median 25.0%).")
    assert rows_of(text.split("\n\n", 1)[1]) == [["m", "as-built", "ort", "2.0e-06 / 2.0e-06", "2.0e-05 / 3.0e-05"]]
    assert st.block_se_replica(st.Experiments(se=archived)).startswith("No second measurement")


def test_a_decision_that_differs_between_thread_counts_is_unstable():
    def check(tier, model, passed, cls=None):
        return {"kind": "check", "tier": tier, "model": model, "inputs": "x", "target": "compile", "passed": passed,
                "failure_class": cls}

    one = [check(1, "a", False, "numeric_drift"), check(3, "a", True), check(1, "b", False, "numeric_drift"),
           check(3, "b", False, "decision_flip")]
    two = [check(1, "a", False, "numeric_drift"), check(3, "a", False, "decision_flip"),
           check(1, "b", False, "nonfinite"), check(3, "b", False, "decision_flip")]
    assert st.unstable(st.check_decisions(one), st.check_decisions(two)) == [(3, "a", "x", "compile"), (1, "b", "x", "compile")]
    images = [_image("ort", "i0", "p", 1.0), _image("ort", "i1", "p", 0.5), _image("ort", "i2", "p", 0.5),
              _image("ort", "i0", "p", 0.5, threads=2), _image("ort", "i1", "p", 0.5, threads=2),
              _image("ort", "i2", "p", 0.5, threads=2)]
    cpu = {"model": "AMD EPYC", "flags": ["avx2", "avx512f"]}
    one.insert(0, {"kind": "run", "environment": {"threads": 1, "git_commit": "f775e1720f9a", "cpu": cpu}})
    two.insert(0, {"kind": "run", "environment": {"threads": 2, "git_commit": "2cdf1ba4112461", "cpu": cpu}})
    one[2]["metrics"], two[2]["metrics"] = {"f1": 0.99}, {"f1": 0.235}
    text = st.block_repro(st.Experiments(detector=images, repro=(one, two)))
    assert text.startswith("study/detectors_float32.yaml, one run each: 1 thread at parity f775e1720f on AMD EPYC "
                           "(avx2, avx512f); 2 threads at parity 2cdf1ba411 on AMD EPYC (avx2, avx512f). 2 of 4 "
                           "decisions differ between the two runs, which differ in commit as well as in threads.")
    runs, scale = text.split("\n\n")[1], text.split("\n\n")[3]
    assert [r[-1] for r in rows_of(runs)] == ["same", "**differs**", "**differs**", "same"]
    assert rows_of(runs)[1][3:5] == ["pass (F1 0.990)", "FAIL decision_flip (F1 0.235)"]
    two[0]["environment"]["git_commit"] = "f775e1720f9a"
    assert "decisions differ between the two runs." in st.block_repro(st.Experiments(repro=(one, two)))
    assert rows_of(scale) == [["ort", "3", "2", "3", "1", "i0"]]


def test_the_language_model_table_reads_tier_1_beside_tier_3_and_the_earliest_divergence():
    def tier1(target, passed, atol):
        return {"kind": "check", "tier": 1, "target": target, "passed": passed, "required_atol": atol}

    def tier3(target, passed, top1, first):
        prompts = [{"first_divergence": d} for d in first]
        return {"kind": "check", "tier": 3, "target": target, "passed": passed,
                "failure_class": None if passed else "decision_flip", "generation": {"prompts": prompts},
                "metrics": {"positions": 40, "top1_agreement": top1, "kl_mean": 1e-3, "kl_p99": 2e-3,
                            "delta_p_rms": 1e-2, "perplexity_ratio": 1.01, "real_flips": 1, "near_tie_flips": 2}}

    records = [tier1("a", True, 5e-7), tier3("a", True, 1.0, [None, None]),
               tier1("b", False, 0.5), tier3("b", False, 0.95, [None, 5, 2, None])]
    text = st.block_llm(st.Experiments(llm=records))
    assert "on 40 next-token decisions" in text
    rows = rows_of(text.split("\n\n", 1)[1])
    assert rows[0] == ["a", "pass 5.0e-07", "agrees", "1.0000", "1.0e-03", "2.0e-03", "1.0e-02", "1.0100", "1 / 2",
                       "2/2", "-"]
    assert rows[1][:3] == ["b", "FAIL 5.0e-01", "decision_flip"] and rows[1][-2:] == ["2/4", "2"]
    assert st.block_llm(st.Experiments()) == "examples/llm.yaml's run did not come with the study."


def _smollm2_records():
    """A run of two targets as study/smollm2.yaml's records hold it: tier 1 and tier 3 with llama-perplexity's
    statistics."""
    def stats(ppl, kl, same, real, near):
        m = {"positions": 1020, "ppl_reference": 12.974, "ppl_reference_se": 1.1053, "ppl_target": ppl,
             "ppl_target_se": 1.21, "perplexity_ratio": ppl / 12.974, "perplexity_ratio_se": 0.0124, "kl_mean": kl,
             "kl_mean_se": kl / 20, "same_top1": same, "same_top1_se": 0.00964, "real_flips": real,
             "near_tie_flips": near, "delta_p_rms": 0.0649, "delta_p_rms_se": 0.0045, "delta_p_mean": -0.00996,
             "delta_p_mean_se": 0.002}
        m.update({k: kl * f for k, f in (("kl_median", 0.8), ("kl_p90", 2), ("kl_p99", 5), ("kl_p999", 10), ("kl_max", 20))})
        m.update({"delta_p_min": -0.688, "delta_p_p01": -0.212, "delta_p_p99": 0.154, "delta_p_max": 0.232})
        return m

    def check(target, tier, passed, **more):
        return {"kind": "check", "tier": tier, "target": target, "passed": passed,
                "failure_class": None if passed else "decision_flip", **more}

    return [{"kind": "run", "environment": {"git_commit": "0123456789abcdef", "threads": 2, "cpu": {"model": "AMD EPYC"}}},
            check("compile-cpu", 1, True, required_atol=2e-5),
            check("compile-cpu", 3, True, metrics=stats(12.974, 1e-12, 1.0, 0, 0), thresholds={"near_tie_margin": 0.01}),
            check("llamacpp-cpu-q4_k_m", 1, False, required_atol=5.08),
            check("llamacpp-cpu-q4_k_m", 3, False, metrics=stats(13.986, 0.0550158, 0.894118, 100, 8),
                  thresholds={"near_tie_margin": 0.01})]


def test_the_smollm2_tables_read_each_statistic_with_its_standard_error_from_the_records():
    """The language-model section's numbers are its archived records' (render() re-computes the section from
    them): each ± is the record's own `_se`, the flips split real / near tie, the percentiles its own."""
    x = st.Experiments(smollm2=_smollm2_records(), smollm2_time={"wall_s": 754.0, "peak_mib": 3072.0})
    text = st.block_smollm2(x)
    assert text.startswith("study/smollm2.yaml (parity at 0123456789, 2 torch threads, AMD EPYC; 12 min 34 s wall, "
                           "3.0 GiB peak resident (GNU time)): 1020 scored next-token positions, reference (eager "
                           "float32) perplexity 12.97 ± 1.1.")
    assert "within 0.01 in probability" in text
    assert rows_of(text.split("\n\n", 1)[1]) == [
        ["compile-cpu", "pass 2.0e-05", "agrees", "12.97 ± 1.2", "1.0000 ± 0.012", "1.00e-12 ± 5e-14", "100.00 ± 0.96",
         "0 / 0", "6.49 ± 0.45"],
        ["llamacpp-cpu-q4_k_m", "FAIL 5.1e+00", "decision_flip", "13.99 ± 1.2", "1.0780 ± 0.012",
         "5.50e-02 ± 0.0028", "89.41 ± 0.96", "100 / 8", "6.49 ± 0.45"]]
    spread = rows_of(st.block_smollm2_spread(x).split("\n\n", 1)[1])
    assert spread[1] == ["llamacpp-cpu-q4_k_m", "4.40e-02", "1.10e-01", "2.75e-01", "5.50e-01", "1.10e+00",
                         "-0.996 ± 0.2", "-68.80", "-21.20", "15.40", "23.20"]
    assert st.block_smollm2(st.Experiments()) == "study/smollm2.yaml's run did not come with the study."


def test_detector_at_scale_compares_one_image_as_tier_3_reads_its_boxes(monkeypatch):
    """study/detector_at_scale.py's row of one image: the post-processing's boxes read once as tier 3's Detections
    (match and attribute take them since #40), an anchor's class changed on the target: one box of each side
    unmatched, classed as a label change, F1 0."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "study"))  # as the script runs: its folder first on the path
    spec = importlib.util.spec_from_file_location("detector_at_scale", ROOT / "study" / "detector_at_scale.py")
    scale = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "detector_at_scale", scale)
    spec.loader.exec_module(scale)
    post = scale.NudenetDetector(torch.nn.Identity(), score_thresh=0.5).eval()
    raw = torch.zeros(1, 4 + 2, 3)  # one image, two classes, three anchors: centre x, y, width, height, scores
    raw[0, :4, 0] = torch.tensor([10.0, 10.0, 4.0, 4.0])
    raw[0, 4, 0] = 0.9
    changed = raw.clone()
    changed[0, 4:, 0] = torch.tensor([0.1, 0.9])
    with torch.inference_mode():
        ref, ref_candidates = scale.decide(post, raw, (32, 32))
        tgt, tgt_candidates = scale.decide(post, changed, (32, 32))
    row = scale.compared(ref, tgt, ref_candidates, tgt_candidates)
    assert (row["boxes_reference"], row["boxes_target"], row["matched"], row["f1"]) == (1, 1, 0, 0.0)
    assert sum(row["flips"].values()) == 2 and json.loads(json.dumps(row)) == row
