"""Records edited by hand or by another tool, anywhere in the file: `parity report` and a run that would
continue them refuse every line that is not a record parity can read, naming the file and the line
(exit 2); a duplicated record is counted once when identical and refused when not; only a torn LAST
line (no newline: a run killed mid-write) is passed over. Never a verdict from garbage."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from parity.records import read_run
from parity.records.summary import summarize
from tests.support.hostile import assert_user_error, experiment, run_parity, write_experiment

TARGETS = [{"backend": "eager", "name": "same"}, {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"}]
DATA = experiment(TARGETS, inputs=[{"name": "a", "synthetic": {"shape": [2, 8]}},
                                   {"name": "b", "synthetic": {"shape": [3, 8]}}])


class Lines(list):
    """The lines of a run's records, and the experiment file they are a run of (`parity run` continues
    records only of the same experiment, from the same folder)."""

    experiment: Path


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Lines:
    """The lines of a finished run: 2 input sets x 2 targets = 4 checks, one of them failing (the
    perturbed target on input set b)."""
    root = tmp_path_factory.mktemp("records")
    path = write_experiment(root, DATA)
    result = run_parity(["run", str(path), "--out", str(root / "out"), "--quiet", "--no-report"], root, root, ["out"])
    assert result.code == 1, result.err
    lines = Lines((root / "out" / "records.jsonl").read_text().splitlines())
    lines.experiment = path
    return lines


def first(lines: list[str], kind: str, **where) -> int:
    return next(i for i, line in enumerate(lines) if (r := json.loads(line))["kind"] == kind
                and all(r.get(k) == v for k, v in where.items()))


def edited(lines: list[str], index: int, change) -> list[str]:
    record = json.loads(lines[index])
    changed = change(copy.deepcopy(record))
    return [*lines[:index], changed if isinstance(changed, str) else json.dumps(changed), *lines[index + 1:]]


def drop(*path):
    def change(record):
        inner = record
        for key in path[:-1]:
            inner = inner[key]
        del inner[path[-1]]
        return record
    return change


def put(value, *path):
    def change(record):
        inner = record
        for key in path[:-1]:
            inner = inner[key]
        inner[path[-1]] = value
        return record
    return change


# (kind of line, which field) -> the field dropped; each must be refused naming the line
DROPPED = [("run", p) for p in [("experiment",), ("base_dir",), ("environment",), ("config",), ("config", "tolerances"),
                                 ("config", "tolerances", "atol"), ("config", "tolerances", "rtol"), ("kind",),
                                 ("config", "models"), ("config", "inputs"), ("config", "targets")]] + \
          [("model", ("model",))] + \
          [("execution", (k,)) for k in ("model", "inputs", "backend", "device", "dtype", "repeat", "status",
                                        "prepare_s", "run_s")] + \
          [("check", (k,)) for k in ("model", "inputs", "target", "tier", "status", "passed", "failure_class",
                                    "detail", "verdicts", "leaves", "gate", "rtol", "required_atol")]

WRONG = [
    ("run", ("experiment",), ["a", "list"]), ("run", ("config",), "a string"), ("run", ("config",), None),
    ("run", ("config", "tolerances"), [1e-5]), ("run", ("config", "tolerances", "atol"), "1e-5"),
    ("run", ("config", "tolerances", "atol"), [None]), ("run", ("config", "tolerances", "rtol"), "0"),
    ("run", ("environment",), []), ("run", ("base_dir",), 7), ("run", ("digest",), 1),
    ("run", ("config", "models"), [{"inputs": ["a"]}]), ("run", ("config", "models"), [{"name": "m", "inputs": "a"}]),
    ("run", ("config", "targets"), None),
    ("model", ("model",), {"name": "m"}),
    ("execution", ("repeat",), "0"), ("execution", ("repeat",), True), ("execution", ("repeat",), 0.5),
    ("execution", ("run_s",), "fast"), ("execution", ("status",), None), ("execution", ("backend",), ["eager"]),
    ("execution", ("prepare_s",), [0.1]), ("execution", ("error",), {"x": 1}),
    ("check", ("model",), ["plain"]), ("check", ("target",), {"a": 1}), ("check", ("tier",), "1"),
    ("check", ("tier",), 2), ("check", ("tier",), True), ("check", ("passed",), "yes"), ("check", ("passed",), 1),
    ("check", ("verdicts",), []), ("check", ("leaves",), {}), ("check", ("leaves",), [1]),
    ("check", ("leaves",), [{"name": 5}]), ("check", ("leaves",), [{"failure_class": None}]), ("check", ("gate",), "1e-5"),
    ("check", ("detail",), 7), ("check", ("failure_class",), []), ("check", ("required_atol",), "big"),
    ("check", ("oracle",), "yes"), ("check", ("kind",), "verdict"), ("check", ("kind",), None),
]

LINES = {"a list": "[1, 2]", "a number": "7", "a string": '"check"', "null": "null", "not JSON": "{nope",
         "a bare check": '{"kind":"check"}', "an empty object": "{}", "deep nesting": "[" * 100_000 + "]" * 100_000,
         "a bare run": '{"kind": "run"}', "an unknown kind": '{"kind": "verdict", "passed": true}'}

WHERE = {"first": lambda lines: 0, "middle": lambda lines: len(lines) // 2, "second to last": lambda lines: len(lines) - 2}


def command(verb: str, tmp_path: Path, lines: list[str], experiment: Path) -> tuple:
    """`parity report OUT` or `parity run EXPERIMENT --out OUT` (which would continue the records) on `lines`."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text("\n".join(lines) + "\n")
    if verb == "report":
        return run_parity(["report", str(out)], tmp_path, tmp_path, []), out
    argv = ["run", str(experiment), "--out", str(out), "--quiet", "--no-report"]
    return run_parity(argv, tmp_path, tmp_path, []), out


VERBS = ["report", "run"]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(("kind", "path"), DROPPED, ids=[f"{k}-{'.'.join(p)}" for k, p in DROPPED])
def test_a_record_without_a_field_it_needs_is_refused(tmp_path, records, verb, kind, path):
    index = first(records, kind, **({"tier": 1} if kind == "check" else {}))
    result, out = command(verb, tmp_path, edited(records, index, drop(*path)), records.experiment)
    assert_user_error(result, f"{out / 'records.jsonl'}:{index + 1}: ")


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(("kind", "path", "value"), WRONG, ids=[f"{k}-{'.'.join(p)}={v!r}" for k, p, v in WRONG])
def test_a_field_of_the_wrong_type_is_refused(tmp_path, records, verb, kind, path, value):
    index = first(records, kind, **({"tier": 1} if kind == "check" else {}))
    result, out = command(verb, tmp_path, edited(records, index, put(value, *path)), records.experiment)
    assert_user_error(result, f"{out / 'records.jsonl'}:{index + 1}: ")


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("line", list(LINES))
def test_a_line_that_is_not_a_record_is_refused_anywhere(tmp_path, records, verb, where, line):
    index = WHERE[where](records)
    result, out = command(verb, tmp_path, [*records[:index], LINES[line], *records[index:]], records.experiment)
    assert_user_error(result, f"{out / 'records.jsonl'}:{index + 1}: ")


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", ["check", "execution", "model", "run"])
def test_a_record_that_differs_from_an_earlier_one_with_its_key_is_refused(tmp_path, records, verb, kind):
    index = first(records, kind)
    twin = edited(records, index, put("changed by hand", "detail" if kind == "check" else "note"))[index]
    lines = [*records, twin]
    result, out = command(verb, tmp_path, lines, records.experiment)
    assert_user_error(result, f"records.jsonl:{len(lines)}: ", f"line {index + 1}")


@pytest.mark.parametrize("kind", ["check", "execution", "model", "run"])
def test_an_identical_duplicate_is_counted_once(tmp_path, records, kind):
    """'2 pairs x 2 targets = 5 checks' never: the copy is said and left out, and the verdicts are those
    of the run (one target failed: exit 1)."""
    index = first(records, kind)
    lines = [*records[:index + 1], records[index], *records[index + 1:]]
    result, out = command("run", tmp_path, lines, records.experiment)
    assert result.code == 1, result.err
    assert "repeat a record of an earlier line exactly" in result.err and "Traceback" not in result.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arithmetic"]["formula"].startswith("2 (model, input set) pairs x 2 targets = 4 checks")
    assert summary["totals"] == {"checks": 4, "passed": 3, "failed": 1, "skipped": 0, "errors": 0}


def test_what_reports_are_rendered_from_counts_a_duplicate_once(tmp_path, records, capsys):
    """`parity report` reads records as `parity run` does (read_run): the same de-duplication, said."""
    index = first(records, "check", tier=1)
    (tmp_path / "records.jsonl").write_text("\n".join([*records, records[index]]) + "\n")
    summary = summarize(read_run(tmp_path))
    assert summary.totals.checks == 4 and "counted once" in capsys.readouterr().err


def test_only_a_torn_last_line_is_passed_over(tmp_path, records):
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text("\n".join(records) + "\n" + records[-1][: len(records[-1]) // 2])
    result = run_parity(["run", str(records.experiment), "--out", str(out), "--quiet", "--no-report"], tmp_path,
                        tmp_path, ["out"])
    assert result.code == 1 and "dropped a torn last line" in result.err, result.err
    assert json.loads((out / "summary.json").read_text())["totals"]["checks"] == 4


def test_the_untouched_records_continue(tmp_path, records):
    """The control case: every refusal above comes from the edit, not from the records."""
    result, out = command("run", tmp_path, list(records), records.experiment)
    assert result.code == 1 and not result.errors and "Traceback" not in result.err, result.err
    assert json.loads((out / "summary.json").read_text())["totals"]["checks"] == 4


# -- an unfinished run: `parity report` never greens it ---------------------------------------------------

def test_report_of_an_unfinished_run_refuses_and_writes_nothing_that_passes(tmp_path, records):
    """A run killed before its last check (its records end early, without summary.json): before, `parity
    report` exited 0 with a summary.json and a junit.xml of the checks it had (tests=3, failures=0 when the
    failing one was not reached) and, the summary being the mark of a finished run, erased the warning the
    next run gives. Now: exit 2 naming how many checks have a verdict, and no summary or junit at all."""
    last = max(i for i, line in enumerate(records) if json.loads(line)["kind"] == "check")
    result, out = command("report", tmp_path, records[:last], records.experiment)
    assert_user_error(result, str(out), "the run ended early", "3 of its 4 planned checks")
    assert sorted(p.name for p in out.iterdir()) == ["records.jsonl"]
    again = run_parity(["run", str(records.experiment), "--out", str(out), "--quiet", "--no-report"], tmp_path, tmp_path,
                       ["out"])
    assert "the previous run ended without a summary" in again.err and again.code == 1, again.err


def test_report_of_records_with_no_check_at_all_refuses(tmp_path, records):
    """Only the `run` record (a run killed while building its first model): 0 checks is no pass."""
    result, out = command("report", tmp_path, records[:1], records.experiment)
    assert_user_error(result, "0 of its 4 planned checks")
    assert not (out / "junit.xml").exists() and not (out / "summary.json").exists()


def test_report_of_a_whole_run_copied_elsewhere_still_renders(tmp_path, records):
    """The control case: every check there, no summary.json beside them (records copied alone)."""
    result, out = command("report", tmp_path, list(records), records.experiment)
    assert result.code == 0 and not result.errors, result.err
    assert json.loads((out / "summary.json").read_text())["totals"]["checks"] == 4


# -- pictures a record names: `parity report` draws them, never hangs or dies on them -----------------------

def _view(path, size=None, preprocess=None, boxes=None):
    from parity.records.models import PictureGeometry, PictureImage
    from parity.report.pictures import model_view

    image = PictureImage(source="a record", path=str(path) if path else None, size=size)
    return model_view(image, PictureGeometry(**preprocess or {}), boxes or [[0, 0, 10, 10]])


def test_a_picture_path_that_is_a_fifo_is_not_opened(tmp_path):
    """Before, the report blocked forever on open(); a FIFO nobody writes to is never opened now."""
    import os
    import threading

    fifo = tmp_path / "picture.png"
    os.mkfifo(fifo)
    found = {}
    worker = threading.Thread(target=lambda: found.update(view=_view(fifo, [16, 16])), daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "model_view blocked on a FIFO"
    picture, note = found["view"]
    assert picture.shape == (16, 16, 3) and "FIFO" in note


def test_a_decompression_bomb_picture_is_not_decoded(tmp_path):
    """A PNG whose header says 100000 x 100000 pixels (a few hundred bytes on disk): Pillow's
    DecompressionBombError was a traceback, exit 3."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    picture, note = _view(bomb, [16, 16])
    assert picture.shape == (16, 16, 3) and "DecompressionBombError" in note


@pytest.mark.parametrize("size, boxes, preprocess", [
    ([10**9, 10**9], None, None),
    (None, [[0, 0, 1e12, 1e12]], None),
    (None, [[0, 0, float("inf"), 5]], None),
    ([16, 16], None, {"resize": [10**9]}),
], ids=["size", "boxes", "infinite box", "preprocess"])
def test_huge_sizes_in_a_record_make_no_huge_canvas(tmp_path, size, boxes, preprocess):
    from PIL import Image

    from parity.report.pictures import MAX_SIDE

    real = tmp_path / "real.png"
    Image.new("RGB", (20, 10)).save(real)
    for path in (None, real):
        picture, _ = _view(path, size, preprocess, boxes)
        assert max(picture.shape[:2]) <= MAX_SIDE, picture.shape


@pytest.mark.parametrize("pictures", [
    {"images": [{"source": "synthetic", "path": None, "size": [8, 8]}], "target": []},
    {"images": [{"source": "synthetic", "path": None, "size": [8, 8]}], "reference": [], "target": []},
    {"images": [{"source": "synthetic"}], "reference": [{"boxes": "x"}], "target": [{"boxes": []}]},
], ids=["no reference", "fewer boxes than images", "boxes of another type"])
def test_pictures_a_record_holds_that_cannot_be_drawn_are_said_not_raised(pictures):
    """A tier-3 record's `pictures` edited by hand (a key missing, lists of other lengths or types): the report
    says the check's pictures cannot be drawn, and renders the rest; before, a KeyError was exit 3."""
    from parity.records.models import Tier3Check
    from parity.report.html import _detections

    [entry] = _detections([Tier3Check.model_validate({
        "kind": "check", "tier": 3, "model": "m", "inputs": "i", "target": "t", "task": "detection", "status": "ok",
        "passed": True, "failure_class": None, "detail": None, "metrics": {"f1": 1.0}, "pictures": pictures})])
    [image] = entry["images"]
    assert image["uri"] is None and image["note"].startswith("this check's pictures cannot be drawn")
