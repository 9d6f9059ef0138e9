"""records.jsonl can be continued: a torn last line is cut off before appending, a line that is not a
record is refused, and one run at a time writes a records file."""

from __future__ import annotations

import json

import pytest

from parity.errors import ParityError
from parity.records import RecordWriter, read_records


def test_a_torn_last_line_is_cut_off_before_appending(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write("run", experiment="x", digest="d")
        writer.write("model", model="m")
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"kind": "execution", "model": "m", "inp')  # what a killed process was writing
    assert [r["kind"] for r in read_records(path)] == ["run", "model"]  # readers skip it
    with RecordWriter(path, resume=True) as writer:
        assert [r["kind"] for r in writer.records] == ["run", "model"] and writer.torn == 40
        with pytest.raises(RuntimeError):
            writer.write("check", model="m", inputs="i", target="t", tier=1)  # never glued onto the torn line
        assert writer.drop_torn_line() == 40
        assert path.read_bytes() == whole
        assert writer.write("model", model="m") is None  # already there: not written again
        writer.write("model", model="n")
    lines = path.read_text().splitlines()
    assert [json.loads(line)["model"] for line in lines[1:]] == ["m", "n"]


def test_a_line_that_is_not_a_record_is_refused(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"kind": "run"}\nnot json\n{"kind": "model", "model": "m"}\n')
    with pytest.raises(ParityError, match=r"records.jsonl:2: not a JSON record .*pass --fresh"):
        RecordWriter(path, resume=True)


def test_two_writers_cannot_share_a_run(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write("run", experiment="x", digest="d")
        with pytest.raises(ParityError, match="another parity process is writing"):
            RecordWriter(path, resume=True)
        with pytest.raises(ParityError, match="another parity process is writing"):
            RecordWriter(path)  # a fresh writer would truncate it: refused before that
    assert len(read_records(path)) == 1
