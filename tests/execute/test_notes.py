"""execute/notes.py: what a backend warned of, deduplicated."""

from __future__ import annotations

from parity.execute.notes import Collector


def test_a_graph_break_seen_in_several_steps_is_one_note_with_their_counts_added_in_its_key_order():
    """The same break (kind, where, message) in two steps is one note whose count is the sum, its keys in the order
    the records write them (count before where); another break stays its own note, and a told note has no count."""
    notes = Collector()
    notes.breaks = [{"kind": "graph_break", "message": "a break", "count": 2, "where": "File m.py, line 3"},
                    {"kind": "graph_break", "message": "a break", "count": 3, "where": "File m.py, line 3"},
                    {"kind": "graph_break", "message": "another", "count": 1}]
    notes.add([{"kind": "exporter", "message": "fell back"}])
    assert notes.notes() == [{"kind": "exporter", "message": "fell back"},
                             {"kind": "graph_break", "message": "a break", "count": 5, "where": "File m.py, line 3"},
                             {"kind": "graph_break", "message": "another", "count": 1}]
    assert [list(n) for n in notes.notes()][1] == ["kind", "message", "count", "where"]
