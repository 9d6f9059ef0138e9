"""Resume that cannot be stale: a run into a folder that holds records re-runs every judgement whose model
code, weights, input files, parity source or library versions changed since it was recorded (each tier-1
check records its `fingerprints`), says which and why, and serves nothing stale."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from parity.api import run_experiment
from parity.fingerprint import version
from parity.records import read_records
from tests.support.cli import parity_process

NET = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return {activation}(self.scale * x)


def build():
    return Net()
"""
# torch.sign is exact in bfloat16 (the check passes at float32's gate); torch.tanh is not (it fails).
EXACT, DRIFTS = "torch.sign", "torch.tanh"


def experiment(module: str, inputs: dict | None = None, **model: object) -> dict:
    """One model (`module`.py's Net) on one input set, judged on an eager bfloat16 target at float32's gate."""
    return {"name": "edits", "seed": 0,
            "models": [{"name": "net", "source": "python", "entry": f"{module}:build", **model}],
            "inputs": [inputs or {"name": "noise", "synthetic": {"shape": [4, 16]}}],
            "targets": [{"backend": "eager", "dtype": "bfloat16", "name": "bf16",
                         "tolerances": {"rtol": 0.0, "gate": 1e-4}}]}


def tier1(out: Path) -> list[dict]:
    return [r for r in read_records(out) if r["kind"] == "check" and r["tier"] == 1]


def first_run(folder: Path, monkeypatch, module: str) -> tuple[dict, Path]:
    """`module`.py in `folder` holding Net with a drifting activation, importable here, and its experiment run once
    into folder/out: the experiment and that folder."""
    monkeypatch.syspath_prepend(str(folder))
    (folder / f"{module}.py").write_text(NET.format(activation=DRIFTS))
    data, out = experiment(module), folder / "out"
    run_experiment(data, out=out, reports=())
    return data, out


def rewrite_records(out: Path, edit: Callable[[dict], dict]) -> list[dict]:
    """`out`'s records.jsonl written again with `edit` applied to each record (as an older or another parity wrote
    them); the records written."""
    records = [edit(r) for r in read_records(out)]
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("parity")]


def _parity_run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`parity run` in its own process, as a user runs it: model code edited between two runs is imported
    afresh."""
    return parity_process("run", *args, cwd=folder)


def test_a_rerun_after_a_model_code_edit_re_runs_its_checks_and_gives_the_new_verdict(tmp_path):
    (tmp_path / "net_code.py").write_text(NET.format(activation=EXACT))
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment("net_code")))
    first = _parity_run(tmp_path, "exp.yaml", "--out", "out", "--no-report")
    assert first.returncode == 0, first.stderr
    [before] = tier1(tmp_path / "out")
    assert before["passed"] is True and before["fingerprints"]["model_code"]

    (tmp_path / "net_code.py").write_text(NET.format(activation=DRIFTS))  # the model's code changes, nothing else
    second = _parity_run(tmp_path, "exp.yaml", "--out", "out", "--no-report")
    assert second.returncode == 1, second.stderr  # the new code's verdict, not the recorded one
    assert "resuming out: all 1 check recorded\n" in second.stderr
    assert (f"re-running 1 check of 1: model code of net changed since {before['fingerprints']['recorded_at']}"
            in second.stderr), second.stderr
    assert "weights" not in second.stderr  # the code changed, not a parameter
    [after] = tier1(tmp_path / "out")  # the stale check is gone from the records, not kept beside the new one
    assert after["passed"] is False and after["fingerprints"]["model_code"] != before["fingerprints"]["model_code"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["totals"]["failed"] == 1


BACKEND = """from parity.backends.eager import EagerBackend


class Shifted(EagerBackend):
    def prepare(self, model, example):
        super().prepare(model, example)
        with __import__("torch").no_grad():
            next(self.model.parameters()).view(-1)[0] += {shift}
"""


def test_a_rerun_after_a_backend_plugins_code_edit_re_runs_its_checks(tmp_path):
    """A target of the user's own (`module:Class`) is user code as much as the model: its edit re-runs the check."""
    (tmp_path / "net_code.py").write_text(NET.format(activation=EXACT))
    (tmp_path / "my_backend.py").write_text(BACKEND.format(shift="0.0"))
    data = experiment("net_code")
    data["targets"] = [{"backend": "my_backend:Shifted", "name": "shifted", "tolerances": {"rtol": 0.0, "gate": 1e-4}}]
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    first = _parity_run(tmp_path, "exp.yaml", "--out", "out", "--no-report")
    assert first.returncode == 0, first.stderr
    (tmp_path / "my_backend.py").write_text(BACKEND.format(shift="-2.0"))  # sign(-x): the backend code changes only
    second = _parity_run(tmp_path, "exp.yaml", "--out", "out", "--no-report")
    assert second.returncode == 1, second.stderr
    assert "code of the reference's or shifted's backend changed" in second.stderr, second.stderr


def test_a_rerun_after_a_weights_edit_re_runs_that_models_checks_only(tmp_path, monkeypatch, caplog):
    """Two models; one's weights file is rewritten: its check runs again (its old records removed, not kept
    beside the new ones), the other's is kept as it was."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "net_weights.py").write_text(NET.format(activation=DRIFTS))
    weights = tmp_path / "net.pt"
    torch.save({"scale": torch.tensor(0.0)}, weights)  # tanh(0) is exact: it passes
    data = experiment("net_weights", weights=str(weights))
    data["models"].append({"name": "other", "source": "python", "entry": "net_weights:build"})
    out = tmp_path / "out"
    run_experiment(data, out=out, reports=())
    before = {c["model"]: c for c in tier1(out)}
    assert before["net"]["passed"] is True and before["other"]["passed"] is False

    torch.save({"scale": torch.tensor(1.0)}, weights)
    with caplog.at_level(logging.INFO, logger="parity"):
        result = run_experiment(data, out=out, reports=())
    assert said(caplog)[:2] == [f"resuming {out}: all 2 checks recorded",
                                f"re-running 1 check of 2: weights of net changed since "
                                f"{before['net']['fingerprints']['recorded_at']}"]
    after = {c["model"]: c for c in tier1(out)}
    assert after["net"]["passed"] is False and after["other"] == before["other"]
    kinds = [(r["kind"], r.get("model")) for r in read_records(out)]
    assert kinds.count(("check", "net")) == 1 and kinds.count(("model", "net")) == 1
    assert kinds.count(("execution", "net")) == kinds.count(("execution", "other")) == 2
    assert result.exit_code == 1 and result.summary.totals.failed == 2


def test_a_rerun_after_an_input_file_edit_re_runs_its_checks(tmp_path, monkeypatch, caplog):
    from PIL import Image

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "net_inputs.py").write_text(NET.format(activation=EXACT))
    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8), (10, 20, 30)).save(image)
    data = experiment("net_inputs", inputs={"name": "pictures", "images": [str(image)]})
    out = tmp_path / "out"
    run_experiment(data, out=out, reports=())
    [before] = tier1(out)

    Image.new("RGB", (8, 8), (200, 100, 0)).save(image)  # the same path and settings, other pixels
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert any(m.startswith("re-running 1 check of 1: input set pictures of net changed since") for m in said(caplog))
    [after] = tier1(out)
    assert after["fingerprints"]["inputs"] != before["fingerprints"]["inputs"]
    executions = [r for r in read_records(out) if r["kind"] == "execution"]
    assert len(executions) == 2  # the reference's and the target's, made again: the old ones are gone


def test_a_rerun_after_an_onnx_file_edit_re_runs_its_checks(tmp_path, caplog):
    """A model file holds no parameters parity can see: its bytes are part of the model's code fingerprint."""
    import onnx
    from onnx import TensorProto, helper

    path = tmp_path / "graph.onnx"

    def save(op: str) -> None:
        value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, 16])  # noqa: E731
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [value("x")], [value("y")])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    save("Identity")
    data = {**experiment("unused"), "models": [{"name": "graph", "source": "onnx", "path": str(path)}],
            "targets": [{"backend": "onnxruntime"}]}
    out = tmp_path / "out"
    run_experiment(data, out=out, reports=())
    [before] = tier1(out)
    save("Neg")  # the same file, another graph
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert any(m.startswith("re-running 1 check of 1: model code of graph changed since") for m in said(caplog))
    [after] = tier1(out)
    assert after["fingerprints"]["model_code"] != before["fingerprints"]["model_code"]


def test_model_code_that_cannot_be_fingerprinted_is_re_run_every_time(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr("parity.fingerprint.MAX_OBJECTS", 0)  # as if past the walk's bounds
    data, out = first_run(tmp_path, monkeypatch, "net_large")
    assert tier1(out)[0]["fingerprints"]["model_code"] is None
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert any(m.startswith("re-running 1 check of 1: model code of net cannot be fingerprinted") for m in said(caplog))


def test_an_unchanged_rerun_re_runs_nothing_and_says_so(tmp_path, monkeypatch, caplog):
    data, out = first_run(tmp_path, monkeypatch, "net_same")
    before = (out / "records.jsonl").read_bytes()
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert said(caplog) == [f"resuming {out}: all 1 check recorded, unchanged"]
    assert (out / "records.jsonl").read_bytes() == before  # nothing executed, nothing written


def test_records_without_fingerprints_are_re_run(tmp_path, monkeypatch, caplog):
    """Checks an older parity recorded carry no fingerprints: nothing says they still hold, so they run again."""
    data, out = first_run(tmp_path, monkeypatch, "net_old")
    rewrite_records(out, lambda r: {k: v for k, v in r.items() if k != "fingerprints"})
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert "re-running 1 check of 1: recorded by a parity that did not fingerprint its checks" in said(caplog)
    [check] = tier1(out)
    assert check["fingerprints"]


def test_a_target_settings_change_re_runs_that_targets_checks_only(tmp_path, monkeypatch, caplog):
    """A target's options change: its checks run again, the other target's are kept, and the run record holds
    the experiment as it is now; a target taken out of the experiment has its records removed."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "net_option.py").write_text(NET.format(activation=DRIFTS))
    data = experiment("net_option")
    data["targets"].append({"backend": "eager", "name": "same"})
    out = tmp_path / "out"
    run_experiment(data, out=out, reports=())
    before = {c["target"]: c for c in tier1(out)}

    data["targets"][0]["options"] = {"threads": 1}
    with caplog.at_level(logging.INFO, logger="parity"):
        result = run_experiment(data, out=out, reports=())
    assert said(caplog)[1] == (f"re-running 1 check of 2: settings of target bf16 changed since "
                               f"{before['bf16']['fingerprints']['recorded_at']}"), said(caplog)
    after = {c["target"]: c for c in tier1(out)}
    assert after["same"] == before["same"] and after["bf16"] != before["bf16"]
    assert result.complete and read_records(out)[0]["config"]["targets"][0]["options"] == {"threads": 1}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())  # the run record was updated: the same experiment, unchanged
    assert said(caplog) == [f"resuming {out}: all 2 checks recorded, unchanged"]

    del data["targets"][1]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert "removing the records of 1 check(s) of target(s) no longer in the experiment: same" in said(caplog)
    assert [r for r in read_records(out) if r.get("target", r.get("backend")) == "same"] == []
    assert list(tier1(out)) == [after["bf16"]]


@pytest.mark.parametrize(("part", "value", "reason"), [
    ("parity", "0" * 64, "parity's source changed"),
    ("libraries", {"torch": "1.0.0 (0000)"}, f"library versions changed (torch 1.0.0 -> {version('torch')})"),
])
def test_a_rerun_after_parity_or_a_library_changed_starts_over(tmp_path, monkeypatch, caplog, part, value, reason):
    """What another parity or torch recorded (edited into the records here) holds for none of the checks: every
    one is re-run, and the run starts over with this process's `run` record."""
    data, out = first_run(tmp_path, monkeypatch, "net_libs")

    def recorded_by_another(r: dict) -> dict:
        if r["kind"] == "check":
            r["fingerprints"][part] = {**r["fingerprints"][part], **value} if isinstance(value, dict) else value
        return r

    records = rewrite_records(out, recorded_by_another)
    with caplog.at_level(logging.INFO, logger="parity"):
        run_experiment(data, out=out, reports=())
    assert any(m.startswith(f"re-running 1 check of 1: {reason} since ") for m in said(caplog)), said(caplog)
    again = read_records(out)
    assert [r["kind"] for r in again] == [r["kind"] for r in records]  # one run record, nothing kept twice
    [check] = [r for r in again if r["kind"] == "check"]
    assert check["fingerprints"][part] != records[-1]["fingerprints"][part]
