"""`parity run --model/--target/--inputs`: one experiment shared out over CI jobs, each shard judging its
checks as the whole run does; `parity report` prints the table again."""

from __future__ import annotations

import json

from parity.cli import main
from tests.support import tiny_experiment

TWO_SETS = [{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}},
            {"name": "small", "synthetic": {"shape": [1, 3, 8, 8], "seed": 3}}]


def _checks(out) -> set[tuple[str, str, str]]:
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return {(r["model"], r["inputs"], r["target"]) for r in records if r["kind"] == "check"}


def test_filters_run_only_the_chosen_checks_and_a_filter_that_matches_nothing_is_exit_2(write_yaml, tmp_path, capsys):
    path = write_yaml(tiny_experiment([{"backend": "eager", "name": "same"}, {"backend": "torchscript"}],
                                      inputs=TWO_SETS))
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--quiet", "--no-report",
                 "--target", "torchscript-cpu", "--inputs", "small"]) == 0
    assert _checks(tmp_path / "a") == {("tiny", "small", "torchscript-cpu")}
    assert main(["run", str(path), "--out", str(tmp_path / "b"), "--quiet", "--no-report", "--target", "same",
                 "--target", "torchscript-cpu", "--model", "tiny"]) == 0
    assert _checks(tmp_path / "b") == {("tiny", s, t) for s in ("noise", "small") for t in ("same", "torchscript-cpu")}
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "c"), "--quiet", "--no-report", "--target", "torchscript",
                 "--inputs", "small"]) == 0  # one target grammar: the id `parity check` takes finds the same target
    assert _checks(tmp_path / "c") == {("tiny", "small", "torchscript-cpu")}
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "d"), "--quiet", "--target", "openvino"]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: --target openvino:" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_report_prints_the_table_again(write_yaml, tmp_path, capsys):
    path = write_yaml(tiny_experiment([{"backend": "eager", "name": "same"}]))
    main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-report"])
    table = capsys.readouterr().out.split("records:")[0]
    assert main(["report", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(table) and "report:  " + str(tmp_path / "out" / "report.html") in printed


def test_the_filters_narrow_a_copy_and_never_the_experiment_given():
    """A command makes the experiment it runs from the one it was given; the given one (a caller's, the next
    command's in the same process) keeps every model, input set and target."""
    from argparse import Namespace

    from parity.cli.run import narrowed
    from parity.experiment import experiment_from_dict

    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "name": "same"}, {"backend": "torchscript"}],
                                               inputs=TWO_SETS))
    before = exp.model_dump()
    shard = narrowed(exp, Namespace(model_filter=None, target_filter=["torchscript-cpu"], inputs_filter=["small"]))
    assert [t.id for t in shard.targets] == ["torchscript-cpu"] and [m.inputs for m in shard.models] == [["small"]]
    assert exp.model_dump() == before
