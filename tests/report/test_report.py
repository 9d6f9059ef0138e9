"""Reports rendered from the records alone: report.html (self-contained, every section, loads cleanly in a
browser), junit.xml (one testcase per check), report.md; `parity report DIR` and `parity run --no-report`.

One tiny run serves most tests: a classifier and a detector against a target that agrees, two that drift
(bfloat16, a perturbed weight), one that raises and one that cannot run here, with tiers 2 and 3 on.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from html import unescape
from pathlib import Path

import pytest
import yaml

from parity.cli import main
from parity.records import read_records
from parity.records.summary import summarize
from parity.report.html import SECTIONS, render_html
from parity.report.markdown import render_markdown
from tests.support import EVERY_OUTCOME as TARGETS
from tests.support import browser, tiny_experiment


def experiment() -> dict:
    data = tiny_experiment(TARGETS, repeats=2, tiers={"activations": True, "tasks": True})
    data["models"][0].update(task="classification", inputs=["noise"])
    data["models"].append({"name": "det", "source": "python", "entry": "tests.fixtures.tiny:tiny_detector",
                           "task": "detection", "inputs": ["photos"]})
    data["inputs"].append({"name": "photos", "images": ["sample:chelsea", "sample:coffee"], "preprocess": {"resize": 40}})
    return data


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment(), sort_keys=False))
    assert main(["run", str(path), "--out", str(folder / "out"), "--quiet"]) == 1
    return folder / "out"


def checks_of(records: list[dict]) -> list[dict]:
    return [r for r in records if r["kind"] == "check"]


def test_run_writes_html_markdown_and_junit_next_to_the_records(run_dir):
    for name in ("records.jsonl", "summary.json", "report.md", "report.html", "junit.xml"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "report.md").read_text().startswith("# parity report: tiny")


def test_junit_has_one_testcase_per_check_and_a_failure_per_failed_check(run_dir):
    records = read_records(run_dir)
    checks = checks_of(records)
    root = ET.parse(run_dir / "junit.xml").getroot()
    assert root.tag == "testsuites"
    [suite] = root.findall("testsuite")
    cases = suite.findall("testcase")
    failed = [c for c in checks if c["status"] != "skipped" and not c["passed"]]
    skipped = [c for c in checks if c["status"] == "skipped"]
    assert failed and skipped and len(failed) + len(skipped) < len(checks)  # the run has all three kinds
    for element in (root, suite):
        assert element.get("tests") == str(len(checks)) and element.get("failures") == str(len(failed))
        assert element.get("skipped") == str(len(skipped)) and element.get("errors") == "0"
    by_name = {(case.get("classname"), case.get("name")): case for case in cases}
    assert len(by_name) == len(cases) == len(checks)
    for check in checks:
        case = by_name[(f"{check['model']}/{check['inputs']}", f"{check['target']} tier {check['tier']}")]
        failure = case.find("failure")
        if check in failed:
            assert failure is not None and failure.get("type") == check["failure_class"]
            assert check["detail"] in failure.get("message") and check["failure_class"] in failure.text
        else:
            assert failure is None
        assert (case.find("skipped") is not None) == (check in skipped)
    failing = by_name[("tiny/noise", "failing tier 1")].find("failure")
    assert failing.get("type") == "backend_error" and "boom" in failing.get("message")


def _external_references(html: str) -> list[str]:
    """Every URL the page would fetch: src/href/srcset attributes, CSS url() and @import; data: URIs and
    in-page anchors fetch nothing."""
    found = re.findall(r"""\b(?:src|href|srcset|poster|data)\s*=\s*["']?([^"'\s>]+)""", html, re.IGNORECASE)
    found += re.findall(r"""url\(\s*["']?([^"')]+)""", html, re.IGNORECASE)
    found += re.findall(r"""@import\s+["']?([^"';\s]+)""", html, re.IGNORECASE)
    return [url for url in found if not url.startswith(("data:", "#"))]


def test_html_is_self_contained(run_dir):
    html = (run_dir / "report.html").read_text()
    assert _external_references(html) == []
    assert "<script" not in html and "<link" not in html  # styles are inline, and there is nothing to run
    images = re.findall(r"<img [^>]*src=\"([^\"]+)\"", html)
    assert images and all(src.startswith(("data:image/svg+xml;base64,", "data:image/png;base64,")) for src in images)
    # the scan itself finds what it is for
    assert _external_references('<img src="https://cdn.example/x.png"><link href="style.css">'
                                 '<style>@import "http://f/a.css"; b{background:url(x.png)}</style>') == [
        "https://cdn.example/x.png", "style.css", "x.png", "http://f/a.css"]


def test_html_holds_every_section_with_what_the_records_say(run_dir):
    records = read_records(run_dir)
    html = (run_dir / "report.html").read_text()
    summary = summarize(records)
    for section, _ in SECTIONS:
        assert f'<section id="{section}">' in html, section
    assert summary.arithmetic.formula in html
    assert "2 (model, input set) pairs x 5 targets = 10 checks; x 4 tolerances = 40 verdicts" in html
    env = records[0]["environment"]
    assert env["torch"] in html and env["cpu"]["model" if "model" in env["cpu"] else "machine"] in html
    for cls in ("numeric_drift", "backend_error"):
        assert f'<td class="cls">{cls}</td>' in html  # a row of the taxonomy table
    assert "this test backend never runs anywhere" in html  # why a target did not run
    layers = [r for r in records if r["kind"] == "layers"]
    assert layers and html.count('alt="relative error against depth') == len(layers)
    tier3 = [c for c in checks_of(records) if c["tier"] == 3]
    assert {c["task"] for c in tier3} == {"classification", "detection"}
    assert "top1_agreement" in html and "map" in html
    detection = [c for c in tier3 if c["task"] == "detection"]
    assert html.count('alt="reference and det / photos /') == 2 * len(detection)  # two images per check
    assert "sample:chelsea (chelsea.png)" in html
    latency = html.split('<section id="latency">')[1].split("</section>")[0]
    assert "prepare (once)" in latency and latency.count("<tr>") > len(TARGETS)


def test_html_lists_every_failed_check_with_its_class_and_detail(run_dir):
    """Under the taxonomy, one entry per failed check, and no other: its key, tier, class and detail, and
    the worst of its failing outputs."""
    records = read_records(run_dir)
    failed = [c for c in checks_of(records) if c["status"] != "skipped" and not c["passed"]]
    assert len(failed) >= 3
    listed = (run_dir / "report.html").read_text().split('<section id="taxonomy">')[1].split("</section>")[0]
    entries = re.findall(r'<details(?: open)?>\s*<summary><b>(.*?)</b> \(tier (\d)\): <span class="cls">(.*?)</span>'
                         r"</summary>\s*<p>(.*?)</p>(.*?)</details>", listed.split("<h3>Failed checks</h3>")[1], re.S)
    got = sorted((unescape(key), int(tier), cls, unescape(detail)) for key, tier, cls, detail, _ in entries)
    assert got == sorted((f"{c['model']} / {c['inputs']} / {c['target']}", c["tier"], c["failure_class"], c["detail"])
                         for c in failed)
    tables = {(unescape(key), int(tier)): table for key, tier, _, _, table in entries}
    assert "<code>out</code>" in tables[("tiny / noise / perturbed", 1)]  # the output that drifted


def test_sections_without_data_say_so(tmp_path):
    records = [json.loads(line) for line in _tiny_run(tmp_path, [{"backend": "eager", "name": "same"}]).splitlines()]
    html = render_html(records, summarize(records), "run")
    for line in ("No tier-2 records in this run", "No tier-3 records in this run",
                 "No detection checks (tier 3 of a detection model) in this run", "No check failed"):
        assert line in html
    for section, _ in SECTIONS:
        assert f'<section id="{section}">' in html
    only_run = [records[0]]  # a run that stopped before anything executed
    html = render_html(only_run, summarize(only_run), "run")
    assert "No tier-1 checks in these records" in html and "No execution records in this run" in html
    markdown = render_markdown(only_run, summarize(only_run), "run")
    assert "| model |" not in markdown and "| target |" not in markdown and "|---|" not in markdown
    for line in ("No tier-1 checks in these records.", "No tier-1 check ran, so there is no sweep.",
                 "No execution records in this run."):
        assert line in markdown


def _tiny_run(tmp_path: Path, targets: list[dict], **overrides) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment(targets, **overrides)))
    main(["run", str(path), "--out", str(tmp_path / "tiny"), "--quiet", "--no-report"])
    return (tmp_path / "tiny" / "records.jsonl").read_text()


def test_reports_are_regenerated_from_the_records_alone(run_dir, tmp_path, monkeypatch, capsys):
    """Only records.jsonl is copied; nothing can run a model; the files come out the same (but for the folder
    the commands they print name: the one the reports are in)."""
    import parity.execute.execution

    def no_execution(*args, **kwargs):
        raise AssertionError("a report must not run anything")

    monkeypatch.setattr(parity.execute.execution, "execute", no_execution)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(run_dir / "records.jsonl", copy / "records.jsonl")
    assert main(["report", str(copy)]) == 0
    printed = capsys.readouterr().out
    for name in ("summary.json", "report.md", "report.html", "junit.xml"):
        assert str(copy / name) in printed
        assert (copy / name).read_text() == (run_dir / name).read_text().replace(str(run_dir), str(copy)), name


def test_no_report_writes_only_records_and_summary(tmp_path, capsys):
    _tiny_run(tmp_path, [{"backend": "eager", "name": "same"}])
    out = tmp_path / "tiny"
    assert sorted(p.name for p in out.iterdir()) == ["records.jsonl", "summary.json"]
    assert "parity report" in capsys.readouterr().out  # says how to get them
    assert main(["report", str(out)]) == 0
    assert {"report.md", "report.html", "junit.xml"} <= {p.name for p in out.iterdir()}


def test_the_api_writes_the_reports_it_is_asked_for(tmp_path):
    from parity.api import run_experiment
    from parity.report import report_writers

    files = tuple(w.filename for w in report_writers())
    assert {"report.md", "report.html", "junit.xml"} <= set(files)
    data = tiny_experiment([{"backend": "eager", "name": "same"}])
    run_experiment(data, out=tmp_path / "default")
    assert sorted(p.name for p in (tmp_path / "default").iterdir()) == ["records.jsonl", "report.md", "summary.json"]
    run_experiment(data, out=tmp_path / "all", reports=files)
    assert set(files) <= {p.name for p in (tmp_path / "all").iterdir()}


def test_a_folder_without_records_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}: has no records.jsonl") and "Traceback" not in err
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "records.jsonl").write_text('{"kind": "resume", "schema_version": 1}\nnot json\n')
    assert main(["report", str(tmp_path)]) == 2
    assert "records.jsonl:2: not a JSON record" in capsys.readouterr().err
    (tmp_path / "records.jsonl").write_text('{"kind": "resume"}\n')
    assert main(["report", str(tmp_path)]) == 2
    assert "no 'run' record" in capsys.readouterr().err


def test_detection_checks_record_the_boxes_and_images_the_report_draws(run_dir):
    from PIL import Image

    [check] = [c for c in checks_of(read_records(run_dir)) if c["tier"] == 3 and c["target"] == "perturbed"
               and c["task"] == "detection"]
    pictures = check["pictures"]
    assert [image["source"] for image in pictures["images"]] == ["sample:chelsea", "sample:coffee"]
    for image in pictures["images"]:
        with Image.open(image["path"]) as im:  # a real file; the model saw its shorter side at 40 px
            width, height = im.size
        assert min(image["size"]) == 40 and image["size"][0] / image["size"][1] == pytest.approx(height / width, abs=0.03)
    assert pictures["preprocess"] == {"resize": [40], "center_crop": None, "resize_multiple": None}
    for side in ("reference", "target"):
        for detections in pictures[side]:
            assert detections["total"] == len(detections["boxes"]) == 5
            assert detections["scores"] == sorted(detections["scores"], reverse=True)
    assert pictures["reference"][0]["boxes"] != pictures["target"][0]["boxes"]  # the perturbed weight moved them


def test_a_missing_image_leaves_a_blank_canvas_and_says_so(run_dir):
    records = read_records(run_dir)
    for check in checks_of(records):
        for image in (check.get("pictures") or {}).get("images", []):
            image["path"] = "/nonexistent/chelsea.png"
    html = render_html(records, summarize(records), "run")
    assert "cannot read /nonexistent/chelsea.png" in html and "blank canvas" in html


@pytest.mark.skipif(browser.chromium() is None,
                    reason="chromium is not installed (apt-get install chromium; .ci/run tries to), so the "
                           "report cannot be opened in a browser here")
def test_the_report_loads_in_chromium_without_errors_and_shows_every_section(run_dir):
    page = run_dir / "report.html"
    sections = [section for section, _ in SECTIONS]
    shown = (f"{json.dumps(sections)}.filter(id => {{ const s = document.getElementById(id);"
             " return s && s.querySelector('h2') && s.getBoundingClientRect().height > 0; })")
    images = "[...document.images].map(i => i.complete && i.naturalWidth > 0)"
    loaded = browser.load(page, [shown, images, "document.title"])
    assert loaded.console_errors == []
    assert loaded.failed_loads == []
    assert [url for url in loaded.requests if not url.startswith("data:")] == [page.resolve().as_uri()]
    assert loaded.values[shown] == sections
    assert loaded.values[images] and all(loaded.values[images])  # every chart and picture decodes
    assert loaded.values["document.title"] == "parity report: tiny"


@pytest.mark.skipif(browser.chromium() is None, reason="chromium is not installed")
def test_the_browser_check_sees_errors_and_fetches(tmp_path):
    """The check above can fail: a page with a script error and an external image is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="missing.png"><script>console.error("broken"); nope();</script></body></html>')
    loaded = browser.load(bad, [])
    assert any("broken" in e for e in loaded.console_errors) and any("nope" in e for e in loaded.console_errors)
    assert any(url.endswith("missing.png") for url in loaded.requests) and loaded.failed_loads


def quickstart_records(models=("resnet18", "mobilenet_v3_small")) -> list[dict]:
    """Records shaped as examples/quickstart.yaml's: two models, four targets, the bfloat16 one at its own
    tolerance (so the title is the longest the table prints)."""
    env = {"python": "3.12", "cpu": {"machine": "x86_64"}, "threads": 2, "cuda": None, "libraries": ["torch"], "torch": "2"}
    run = {"kind": "run", "experiment": "quickstart", "digest": "d", "base_dir": ".", "environment": env,
           "config": {"tolerances": {"atol": [1e-6, 1e-5, 1e-4, 1e-3], "rtol": 1e-5}, "models": [], "inputs": [], "targets": []}}
    targets = {"compile-cpu": (1e-4, 1e-5, "experiment"), "onnxruntime-cpu": (1e-4, 1e-5, "experiment"),
               "torchscript-cpu": (1e-4, 1e-5, "experiment"),
               "eager-cpu-bfloat16": (1e-5, 1.6e-2, "default-for-bfloat16")}
    return [run] + [{"kind": "check", "model": m, "inputs": "photos", "target": t, "tier": 1, "status": "ok",
                     "passed": True, "failure_class": None, "detail": None, "gate": gate, "rtol": rtol,
                     "tolerance_source": source, "required_atol": 1e-6, "max_abs": 1e-6, "leaves": [],
                     "verdicts": {"1e-06": True}}
                    for m in models for t, (gate, rtol, source) in targets.items()]


def _console_text(records: list[dict], width: int) -> str:
    import io
    from pathlib import Path

    from rich.console import Console

    from parity.report.console import render

    console = Console(file=io.StringIO(), width=width, highlight=False, color_system=None)
    render(records, summarize(records), Path("out"), console)
    return console.file.getvalue()


def test_the_table_title_fits_one_line_of_an_80_column_terminal():
    lines = _console_text(quickstart_records(), 80).splitlines()
    [title] = [i for i, line in enumerate(lines) if "quickstart: tier 1" in line]
    assert lines[title + 1].lstrip().startswith("┏")  # the table starts on the next line: the title did not wrap
    assert any("cells: verdict, max abs difference" in line for line in lines)
    one_target = [r for r in quickstart_records(models=("resnet18",)) if r.get("target") in (None, "compile-cpu")]
    lines = _console_text(one_target, 80).splitlines()  # a table narrower than its title
    [title] = [i for i, line in enumerate(lines) if "quickstart: tier 1 at atol=0.0001, rtol=1e-05" in line]
    assert lines[title + 1].lstrip().startswith("┏")


def test_a_run_without_checks_prints_no_empty_table():
    text = _console_text(quickstart_records(models=()), 80)
    assert "no checks: no (model, input set) was judged" in text and "┏" not in text


def _drifting(max_abs: float, cosine: float, mismatch_fraction: float) -> list[dict]:
    """The quickstart's resnet18 records, its last check failing with numeric drift on one leaf, `out`."""
    records = quickstart_records(models=("resnet18",))
    leaf = {"name": "out", "failure_class": "numeric_drift", "max_abs": max_abs, "max_rel": 0.5, "cosine": cosine,
            "mismatch_fraction": mismatch_fraction}
    records[-1].update(passed=False, failure_class="numeric_drift", detail="drift", max_abs=max_abs, leaves=[leaf])
    return records


def test_a_share_of_mismatched_elements_reads_as_a_percentage_and_stays_a_fraction_in_the_records():
    records = _drifting(max_abs=0.02, cosine=0.99, mismatch_fraction=0.138)
    assert "mismatched 13.8%" in render_markdown(records, summarize(records), "run")
    assert '<td class="num">13.8%</td>' in render_html(records, summarize(records), "run")
    assert records[-1]["leaves"][0]["mismatch_fraction"] == 0.138


def test_the_navigation_bar_leads_only_to_sections_the_run_has():
    records = quickstart_records(models=("resnet18",))
    nav = re.search(r"<nav>(.*?)</nav>", render_html(records, summarize(records), "run")).group(1)
    assert 'href="#gate"' in nav and "#tier2" not in nav and "#tier3" not in nav and "#detections" not in nav


def test_a_cosine_near_1_reads_as_its_distance_from_1_in_both_reports():
    records = _drifting(max_abs=1.7, cosine=0.999971, mismatch_fraction=0.598)
    assert "cosine 1 − 2.9e-05, mismatched 59.8%" in render_markdown(records, summarize(records), "run")
    assert "1 − 2.9e-05" in render_html(records, summarize(records), "run")


def test_matplotlib_warnings_stay_off_the_console_and_verbose_shows_them(caplog):
    """A glyph missing from matplotlib's font (a model named in Chinese) warns while the chart is drawn:
    that is about the report's drawing, not the model, so it is a DEBUG message, not a console warning."""
    import logging
    import warnings

    from parity.report import plots

    name = "model \u4e2d"
    with warnings.catch_warnings(record=True) as escaped, caplog.at_level(logging.DEBUG, logger="parity"):
        warnings.simplefilter("always")
        plots.pass_rate_heatmap([name], ["t"], {(name, "t"): 1.0})
    assert escaped == []
    assert any("Glyph" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)
    assert logging.getLogger("matplotlib.font_manager").getEffectiveLevel() == logging.ERROR


def test_every_view_states_each_targets_own_tolerance_where_it_is_judged(tmp_path, capsys):
    """A bfloat16 target at its dtype's default (atol 1e-5, rtol 0.016) and a float32 one at the experiment's
    gate (1e-4, 1e-5), in one run: the console, report.md, report.html and junit.xml say the same of each."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment([{"backend": "eager", "name": "same"},
                                                    {"backend": "eager", "dtype": "bfloat16"}])))
    main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    console = capsys.readouterr().out
    bf16, fp32 = "atol 1e-05, rtol 0.016", "atol 0.0001, rtol 1e-05"
    for line in (f"tolerance same: {fp32} (experiment)", f"tolerance eager-cpu-bfloat16: {bf16} (default-for-bfloat16)"):
        assert line in console and f"- {line}" in (tmp_path / "out" / "report.md").read_text()
    assert "tiny: tier 1, each target at its own tolerance" in console
    html = unescape((tmp_path / "out" / "report.html").read_text())
    heading = re.search(r"<h2>Checks at the gate(.*?)</h2>", html).group(1)
    assert "each target at its own tolerance" in heading and "0.0001" not in heading
    header = re.search(r"<tr><th>model / inputs</th>(.*?)</tr>", html, re.S).group(1)
    assert re.search(rf"same<br><span[^>]*>{fp32}</span>", header)
    assert re.search(rf"eager-cpu-bfloat16<br><span[^>]*>{bf16}</span>", header)
    root = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    judged = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
              for case in root.iter("testcase")}
    assert judged == {"same tier 1": {"gate_atol": "0.0001", "rtol": "1e-05"},
                      "eager-cpu-bfloat16 tier 1": {"gate_atol": "1e-05", "rtol": "0.016"}}
    assert root.find("testsuite/properties/property[@name='gate_atol']") is None  # no one gate for the whole suite


def test_a_target_not_run_here_has_one_name_and_the_summary_says_why_the_exit_code_is_1(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment([{"backend": "eager", "name": "same"},
                                                    {"backend": "tests.fixtures.tiny:NeverAvailable", "name": "never"}])))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    console = capsys.readouterr().out
    assert "1 passed, 0 failed, 1 not run here (" in console and "not run here never: " in console
    assert ("exit 1: 1 check(s) not run here, so not verified (--allow-unavailable exits 0 when every check that ran "
            "passed)") in console
    assert "n/a" not in console and "skipped" not in console and "unavailable never" not in console
    assert "**1 passed, 0 failed, 1 not run here**" in (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    assert '<span class="state">not run here</span>' in html and "n/a" not in html
    assert main(["run", str(path), "--out", str(tmp_path / "again"), "--quiet", "--no-report", "--allow-unavailable"]) == 0
    assert "exit 1" not in capsys.readouterr().out
