"""What an experiment cannot make parity do: run code hidden in a weights file, download, use the network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml

from parity.api import run_experiment
from parity.errors import ParityError
from parity.models.weights import load_state_dict
from tests.support import ROOT, tiny_experiment
from tests.support.cli import parity_process


class _Payload:
    """Unpickling this calls `open(marker, 'w')`: a stand-in for any command a hostile file could run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def hostile_weights(tmp_path):
    """A torch file with real weights for the tiny CNN, plus an object whose unpickling writes a marker."""
    from tests.fixtures.tiny import tiny_cnn

    marker = tmp_path / "marker"
    path = tmp_path / "weights.pt"
    torch.save({**tiny_cnn().state_dict(), "payload": _Payload(str(marker))}, path)
    torch.load(path, weights_only=False)  # proves the payload works: this load runs it
    assert marker.exists()
    marker.unlink()
    return path, marker


def test_a_weights_file_that_would_run_code_is_refused(hostile_weights):
    path, marker = hostile_weights
    with pytest.raises(ParityError) as info:
        load_state_dict(path)
    [message] = info.value.problems
    assert f"refusing weights file {path}" in message and "weights_only=True" in message
    assert "unpickling it would call" in message and "\n" not in message
    assert not marker.exists()


def test_parity_run_with_hostile_weights_exits_2_and_runs_nothing(hostile_weights, tmp_path):
    """Through the command line, in its own process: exit 2, one line, no traceback, no marker."""
    path, marker = hostile_weights
    data = tiny_experiment([{"backend": "eager", "name": "same"}])
    data["models"][0]["weights"] = str(path)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    result = subprocess.run([sys.executable, "-m", "parity.cli", "run", str(exp), "--out", str(tmp_path / "out"),
                             "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    # refused while the file is validated, before any model is built: at its key, with the reason
    assert line.startswith(f"error: {exp}:") and f"models[0].weights: refusing weights file {path}" in line
    assert not marker.exists()


# -- a torch.export archive (.pt2) is data -------------------------------------------------------------

def _pt2_with(tmp_path, name: str, replace: dict[str, bytes], add: dict[str, bytes] | None = None):
    """The examples' tiny_cnn.pt2 rewritten: entries ending in a key of `replace` get its bytes, `add`'s are added."""
    import zipfile

    source = ROOT / "examples" / "models" / "tiny_cnn.pt2"
    path = tmp_path / name
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        root = original.namelist()[0].split("/")[0]
        for info in original.infolist():
            data = next((v for k, v in replace.items() if info.filename.endswith(k)), None)
            out.writestr(info.filename, original.read(info.filename) if data is None else data)
        for tail, data in (add or {}).items():
            out.writestr(f"{root}/{tail}", data)
    return path


@pytest.fixture
def hostile_pt2(tmp_path):
    """tiny_cnn.pt2 whose sample inputs are a pickle that writes a marker when unpickled: torch.export.load
    falls back to weights_only=False for them (proved below), so loading it runs the payload."""
    import io

    marker = tmp_path / "marker"
    payload = io.BytesIO()
    torch.save(((_Payload(str(marker)),), {}), payload)
    path = _pt2_with(tmp_path, "hostile.pt2", {"sample_inputs/model.pt": payload.getvalue()})
    import logging

    logging.getLogger("torch._export").setLevel(logging.CRITICAL)  # its fallback's warning has a broken format
    try:
        torch.export.load(str(path))  # proves the payload works: torch's own load runs it
    finally:
        logging.getLogger("torch._export").setLevel(logging.NOTSET)
    assert marker.exists()
    marker.unlink()
    return path, marker


def _parity(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return parity_process(*argv, cwd=tmp_path)


def _exported(tmp_path, path) -> str:
    data = {"name": "pt2", "models": [{"name": "m", "source": "exported", "path": str(path)}],
            "inputs": [{"name": "noise", "synthetic": {"x": {"shape": [2, 3, 16, 16]}}}], "targets": [{"backend": "eager", "name": "same"}]}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    return str(tmp_path / "exp.yaml")


@pytest.mark.parametrize("verb", ["run", "validate --deep"])
def test_a_pt2_that_would_run_code_is_refused_and_runs_nothing(hostile_pt2, tmp_path, verb):
    """Issue 30: `parity run` and `validate --deep` ran the payload and passed with exit 0."""
    path, marker = hostile_pt2
    exp = _exported(tmp_path, path)
    result = _parity(tmp_path, *verb.split(), exp, *(["--out", str(tmp_path / "out"), "--quiet"] if verb == "run" else []))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert f"{path}: holds a pickle that is not only tensors and plain values, refused unloaded" in line, line
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["data/aotinductor/model/model.so", "data/constants/opaque_obj_0"])
def test_a_pt2_holding_native_code_or_a_plain_pickle_is_refused_unopened(tmp_path, entry):
    from parity.models.sources.saved import load_exported

    path = _pt2_with(tmp_path, "code.pt2", {}, {entry: b"\x7fELF or a pickle"})
    with pytest.raises(ParityError, match=f"holds [^ ]*/{entry}, which loading would run as code"):
        load_exported(path)
    assert load_exported(ROOT / "examples" / "models" / "tiny_cnn.pt2").module() is not None  # a plain one loads


def test_a_damaged_safetensors_file_is_a_user_error(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ParityError, match="not a valid .safetensors file"):
        load_state_dict(path)


def test_a_whole_run_needs_no_network(tmp_path, monkeypatch):
    """Every way to reach the network raises inside this test; a run with eager, TorchScript and ONNX Runtime
    targets (export included) passes anyway, and nothing even tried."""
    attempts: list[str] = []

    def refuse(what):
        def blocked(*args, **kwargs):
            attempts.append(f"{what}{args[1:2] if what.startswith('socket.') else args[:1]}")
            raise OSError(f"network disabled in this test ({what})")

        return blocked

    for name in ("connect", "connect_ex", "sendto", "bind"):
        monkeypatch.setattr(socket.socket, name, refuse(f"socket.{name}"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "gethostbyname", refuse("gethostbyname"))

    with pytest.raises(OSError):  # the guard is in place
        socket.create_connection(("example.com", 80))
    attempts.clear()
    data = tiny_experiment([{"backend": "torchscript"}, {"backend": "onnxruntime"}, {"backend": "eager", "name": "same"}])
    records = run_experiment(data, out=tmp_path / "out")
    checks = [r for r in records if r["kind"] == "check"]
    assert len(checks) == 3 and all(c["passed"] for c in checks), [c["detail"] for c in checks]
    assert attempts == []
