"""Names and texts in reports that come from files: a dict output's keys (an .onnx output name), a runtime's error
quoting the graph, and names in a records.jsonl anyone could write. report.md is pasted into pull requests and
issue trackers: rendered as CommonMark (markdown-it-py, installed with rich) it must hold no element parity did not
write (no raw HTML, no link, no image, no extra table cell); the console and report.html must carry no raw
control character (NUL, SOH, BS, ESC); and `parity report` refuses names no experiment file could hold.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from parity.errors import visible
from parity.report.markdown import md, md_code
from tests.fixtures.hostile_names import HOSTILE_ERROR
from tests.support.hostile import assert_user_error, run_parity

CONTROL = ["\x00", "\x01", "\x08", "\x1b", "\x7f"]
KEYS = {
    "script": "<script>alert(1)</script>",
    "img": "<img src=x onerror=alert(1)>",
    "pipe": "a|b|c",
    "newline and pipe": "a\n| x | y |",
    "control": "x\x00\x01\x08\x1by",
    "backticks": "``a` ``",
    "emphasis": "*em* _u_ **b**",
    "link": "[click](javascript:alert(1))",
    "image": "![i](http://example.com/i.png)",
    "entity": "&lt;script&gt;",
    "autolink": "<http://example.com>",
    "heading": "# h",
}


def _tokens(text: str) -> list:
    found = []
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        found += [token, *(token.children or [])]
    return found


def assert_inert(markdown: str) -> None:
    """No raw HTML, link or image token in the render, no raw control character, and every table row with the
    cells of its header."""
    tokens = _tokens(markdown)
    kinds = {t.type for t in tokens}
    assert not kinds & {"html_inline", "html_block", "link_open", "image"}, kinds
    assert not any(c in markdown for c in CONTROL), [c for c in CONTROL if c in markdown]
    header = cells = 0
    for t in tokens:
        if t.type == "thead_open":
            header = 0
        elif t.type == "th_open":
            header += 1
        elif t.type == "tr_open":
            cells = 0
        elif t.type == "td_open":
            cells += 1
        elif t.type == "tr_close" and cells:
            assert cells == header, f"a row of {cells} cells under {header} columns"


def _run(work: Path, models: list[dict], target: dict | None = None):
    work.mkdir(parents=True)
    data = {"name": "names", "models": models, "inputs": [{"name": "noise", "synthetic": {"shape": [2, 8]}}],
            "targets": [target or {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}]}
    path = work / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_parity(["run", str(path), "--out", str(work / "out")], work.parent, work, [f"{work.name}/out"])
    return result, work / "out"


PLAIN = {"name": "m", "source": "python", "entry": "tests.fixtures.exiting:plain"}
GROUPS = 3  # models of a few keys each: the failures section lists each check's five worst leaves


@pytest.fixture(scope="module")
def keyed_run(tmp_path_factory):
    """One run of models whose dict outputs are keyed by KEYS, a few per model, against a perturbed target."""
    names = list(KEYS)
    models = [{"name": f"m{g}", "source": "python", "entry": "tests.fixtures.hostile_names:keyed",
               "params": {"keys": [KEYS[n] for n in names[g::GROUPS]]}} for g in range(GROUPS)]
    return _run(tmp_path_factory.mktemp("keys") / "work", models)


@pytest.mark.parametrize("key", list(KEYS))
def test_an_output_key_is_inert_in_every_report(keyed_run, key):
    result, out = keyed_run
    assert result.code == 1 and result.outside == [], result.err
    markdown = (out / "report.md").read_text()
    leaf = visible(repr(KEYS[key]))  # the leaf out['...'] quotes the key as Python does
    assert any(leaf in line for line in markdown.splitlines() if line.startswith("  - `")), leaf
    assert_inert(markdown)
    assert not any(c in result.out + result.err for c in CONTROL)
    assert not any(c in (out / "report.html").read_text() for c in CONTROL)


def test_a_runtimes_error_text_is_inert_in_every_report(tmp_path):
    result, out = _run(tmp_path / "work", [PLAIN], {"backend": "tests.fixtures.hostile_names:HostileError", "name": "t"})
    assert result.code == 1 and result.outside == [], result.err
    markdown = (out / "report.md").read_text()
    assert "alert(1)" in markdown  # the text is there, shown, not live
    assert_inert(markdown)
    html = (out / "report.html").read_text()
    assert "<script>alert" not in html and not any(c in html for c in CONTROL)
    assert not any(c in result.out + result.err for c in CONTROL)
    assert visible(HOSTILE_ERROR).split("\\n")[0][:20] in result.out + markdown


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory) -> Path:
    result, out = _run(tmp_path_factory.mktemp("names") / "work", [PLAIN], {"backend": "eager", "name": "same"})
    assert result.code == 0, result.err
    return out


NAMES = {"script": "<script>x</script>", "pipe": "a|b", "newline": "a\nb", "NUL": "a\x00b", "backspace": "ab\x08",
         "space": "a b", "slash": "a/b", "dot-dot": ".."}


@pytest.mark.parametrize("field", ["model", "inputs", "target"])
@pytest.mark.parametrize("name", list(NAMES))
def test_report_refuses_records_with_names_no_experiment_could_hold(passing_run, tmp_path, field, name):
    out = tmp_path / "out"
    shutil.copytree(passing_run, out)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    old = {"model": "m", "inputs": "noise", "target": "same"}[field]
    for r in records:
        if r.get(field) == old:
            r[field] = NAMES[name]
        if r.get("backend") == old and field == "target":
            r["backend"] = NAMES[name]
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = run_parity(["report", str(out)], tmp_path, tmp_path, [])
    assert_user_error(result, "records.jsonl", "no experiment file can name")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no report rewritten from them


def _inline(markdown: str, opening: str) -> list:
    """The inline children of the first block that opens with `opening` (td_open, paragraph_open)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    first = next(i for i, t in enumerate(tokens) if t.type == opening)
    return tokens[first + 1].children


@pytest.mark.parametrize("text", [*KEYS.values(), HOSTILE_ERROR, "\\", "a\\|b", "$x$", "~~s~~", " `a` ", "x_y_z"])
def test_md_and_md_code_render_as_the_text_itself(text):
    """In a table cell and in a list item, the rendered text is `text` with its control characters shown."""
    cell = f"| a | b |\n|---|---|\n| {md(text)} | z |\n"
    assert_inert(cell)
    shown = "".join(t.content for t in _inline(cell, "td_open") if t.type in ("text", "text_special"))
    assert shown == visible(text).strip()
    item = f"- {md_code(text)}\n"
    assert_inert(item)
    assert [(t.type, t.content) for t in _inline(item, "paragraph_open")] == [("code_inline", visible(text))]


def test_report_on_a_run_in_progress_says_so(passing_run, tmp_path):
    """A run holds its records.jsonl's lock while it writes: `parity report` on it says the run is in progress
    (it once said "the run ended early")."""
    import fcntl
    import os

    out = tmp_path / "out"
    shutil.copytree(passing_run, out)
    (out / "summary.json").unlink()
    fd = os.open(out / "records.jsonl", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as RecordWriter holds it
    try:
        result = run_parity(["report", str(out)], tmp_path, tmp_path, [])
    finally:
        os.close(fd)
    assert_user_error(result, str(out), "still in progress")
    result = run_parity(["report", str(out)], tmp_path, tmp_path, [])  # once it has ended: what it lacks
    assert result.code == 0 and "still in progress" not in result.err, result.err
