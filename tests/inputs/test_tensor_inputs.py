"""Saved tensors as an input set (`tensors: FILE`, `parity check --input FILE`): .npy, .npz, .safetensors and
.pt files handed to the model as saved, refused in one line at validation when unreadable or when they do
not fit an ONNX graph's declared inputs; `--input SHAPE:int64:HIGH`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from parity.check_command import check_experiment
from parity.cli import main
from parity.inputs.tensors import TensorFileError, read_tensors
from tests.support import ROOT

X = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
ONNX = ROOT / "examples" / "models" / "tiny_cnn.onnx"


@pytest.mark.parametrize("name, save, positional", [
    ("x.npy", lambda p: np.save(p, X.numpy()), True),
    ("x.npz", lambda p: np.savez(p, X.numpy()), True),
    ("named.npz", lambda p: np.savez(p, x=X.numpy()), False),
    ("x.safetensors", lambda p: save_file({"x": X}, str(p)), False),
    ("x.pt", lambda p: torch.save(X, p), True),
    ("tuple.pt", lambda p: torch.save((X,), p), True),
    ("dict.pt", lambda p: torch.save({"x": X}, p), False),
])
def test_each_format_gives_the_tensors_as_saved(tmp_path, name, save, positional):
    save(tmp_path / name)
    args, kwargs = read_tensors(tmp_path / name)
    [got] = args if positional else list(kwargs.values())
    assert torch.equal(got, X) and (positional or list(kwargs) == ["x"])


def test_a_pickle_that_would_run_code_or_a_foreign_dtype_is_refused_never_run(tmp_path, capsys):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    torch.save(Evil(), tmp_path / "evil.pt")
    with pytest.raises(TensorFileError, match="cannot be read as .pt tensors"):
        read_tensors(tmp_path / "evil.pt")
    assert "ran" not in capsys.readouterr().out  # its code did not run
    np.save(tmp_path / "text.npy", np.array(["a"]))
    with pytest.raises(TensorFileError, match="dtype <U1; parity takes numbers and booleans"):
        read_tensors(tmp_path / "text.npy")


def test_check_runs_a_saved_file_as_its_input_set_and_validation_checks_it_against_an_onnx_graph(tmp_path, capsys):
    torch.save(X, tmp_path / "x.pt")
    assert main(["check", "tests.fixtures.tiny:tiny_cnn", "--input", str(tmp_path / "x.pt"), "--target", "torchscript",
                 "--out", str(tmp_path / "o"), "--quiet", "--no-report"]) == 0
    run = json.loads((tmp_path / "o" / "records.jsonl").read_text().splitlines()[0])
    assert run["config"]["inputs"] == [{**run["config"]["inputs"][0], "name": "x", "tensors": str(tmp_path / "x.pt")}]
    torch.save(torch.zeros(1, 8, dtype=torch.int64), tmp_path / "ids.pt")
    capsys.readouterr()
    assert main(["check", str(ONNX), "--input", str(tmp_path / "ids.pt"), "--target", "onnxruntime"]) == 2
    assert ("input set 'ids': x is int64[1, 8]; the ONNX graph's inputs are x: float32[2, 3, 16, 16]"
            in capsys.readouterr().err)


def test_an_integer_input_on_the_command_line_takes_its_bound():
    data = check_experiment("tests.fixtures.tiny:tiny_cnn", ["torchscript"], shapes=["ids=1x8:int64:30522"])
    assert data["inputs"][0]["synthetic"] == {"ids": {"shape": [1, 8], "dtype": "int64", "distribution": "randint",
                                                      "high": 30522.0}}


def test_a_fifo_as_a_tensors_file_is_refused_at_validate_never_opened(tmp_path, capsys):
    """Opening a FIFO nobody writes to blocks: validation once hung on `tensors: a.npy` made a FIFO."""
    import os
    import threading

    os.mkfifo(tmp_path / "a.npy")
    (tmp_path / "exp.yaml").write_text(json.dumps({
        "name": "t", "models": [{"name": "m", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}],
        "inputs": [{"name": "saved", "tensors": "a.npy"}], "targets": [{"backend": "torchscript"}]}))
    done = {}
    worker = threading.Thread(target=lambda: done.update(code=main(["validate", str(tmp_path / "exp.yaml")])), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "validate blocked on a FIFO"
    assert done["code"] == 2 and "is a FIFO (named pipe), not a file" in capsys.readouterr().err


def test_a_tensors_file_larger_than_an_input_set_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from parity.inputs import tensors

    np.save(tmp_path / "a.npy", np.zeros(64, np.float32))
    monkeypatch.setattr(tensors, "MAX_BYTES", 100)
    with pytest.raises(TensorFileError, match="bytes, more than an input set"):
        read_tensors(tmp_path / "a.npy")
