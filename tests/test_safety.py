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
from tests.conftest import ROOT, tiny_experiment


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
