"""Offline and contained by construction: no telemetry, no DNS, nothing in the home folder.

The whole-run cases start a real process, because what they guard happens in native code at import
(ONNX Runtime writes a device id when it loads) and in threads a library starts: a run with ONNX Runtime
and OpenVINO targets, and `parity backends`, under a home folder that is read-only (a read-only bind
mount in a mount namespace, where the test runs as root; else a fresh folder checked to stay empty), in
a network namespace with no network (`unshare -n`, where available), traced with strace for any
non-local socket. Before parity's switches this run wrote ~/.cache/Microsoft/DeveloperTools/.onnxruntime,
~/intel/openvino_ga_cid and ~/.cache/matplotlib, and looked up www.google-analytics.com.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

import parity.offline as offline
from tests.support import ROOT
from tests.support.hostile import assert_user_error, run_parity
from tests.support.hostile_kit import experiment, run

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
UNSHARE = shutil.which("unshare") if ROOT_USER else None
STRACE = shutil.which("strace")


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _command(args: list[str], home: Path, trace: Path) -> list[str]:
    """`python -m parity.cli ARGS`, traced, in a namespace with no network but its own loopback (Ray's
    processes talk over it) and a read-only home."""
    python = [sys.executable, "-m", "parity.cli", *args]
    if STRACE:
        python = [STRACE, "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", str(trace), *python]
    if not UNSHARE:
        return python
    loopback = "ip link set lo up && " if shutil.which("ip") else ""
    script = f'{loopback}mount --bind "{home}" "{home}" && mount -o remount,ro,bind "{home}" && exec "$@"'
    return [UNSHARE, "-n", "-m", "sh", "-c", script, "sh", *python]


LOOPBACK = re.compile(r'inet_addr\("127\.|inet_pton\(AF_INET6, "(::1|::ffff:127\.)')


def _network_calls(trace: Path) -> list[str]:
    """Socket calls that could leave the machine: an internet socket to anything but the loopback address, and
    any DNS lookup (port 53, even to a local resolver)."""
    if not trace.exists():
        return []
    lines = trace.read_text().splitlines()
    return [line for line in lines
            if re.search(r"AF_INET6?|sin_port", line) and not LOOPBACK.search(line) or "htons(53)" in line]


@pytest.fixture
def sandbox(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "PARITY_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                        offline.STATE_ENV)
           and not k.startswith(("ORT_", "OPENVINO"))}
    temp = Path(tempfile.mkdtemp(prefix="p-"))  # a short TMPDIR: Ray's socket paths lie under it
    env.update(HOME=str(home), TMPDIR=str(temp), PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    yield tmp_path, home, work, env, temp
    shutil.rmtree(temp, ignore_errors=True)


# Each: (id, argv after `parity`), run in `work` beside exp.yaml
WHOLE = [
    ("run-onnxruntime-openvino", ["run", "exp.yaml", "--out", "out", "--cache-dir", "cache", "--quiet"]),
    ("backends", ["backends"]),
]


@pytest.mark.parametrize("args", [w[1] for w in WHOLE], ids=[w[0] for w in WHOLE])
def test_no_telemetry_no_network_nothing_in_home(args, sandbox):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    tmp_path, home, work, env, temp = sandbox
    data = experiment(targets=[{"backend": "onnxruntime"}, {"backend": "openvino"}])
    (work / "exp.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    before = _tree(tmp_path)
    trace = tmp_path / "trace.txt"
    result = subprocess.run(_command(args, home, trace), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert _network_calls(trace) == [], _network_calls(trace)[:5]
    assert _tree(home) == set(), sorted(_tree(home))  # read-only where possible; empty in any case
    assert _tree(temp) == set(), sorted(_tree(temp))
    made = {p for p in _tree(tmp_path) - before if p != "trace.txt"}
    allowed = ("work/out", "work/cache")
    assert all(p.startswith(allowed) for p in made), sorted(p for p in made if not p.startswith(allowed))
    if args[0] == "run":
        assert (work / "cache" / "matplotlib").is_dir()  # matplotlib's state went to the cache
        assert "2 passed" in result.stdout, result.stdout[-2000:]


@pytest.mark.skipif(not STRACE or not UNSHARE, reason="needs strace, and unshare as root, to see every socket call "
                                                       "Ray's processes make (apt-get install strace)")
def test_a_ray_run_stays_on_the_loopback_and_out_of_home_and_tmpdir(sandbox):
    """A local Ray (about 30 s to start and stop): before, its processes looked 8.8.8.8 up for the machine's
    address and listened there, asked the cloud metadata address (169.254.169.254) over HTTP, wrote
    ~/.ray/auth_token and left TMPDIR/ray behind. Traced and without a network, it must do none of that."""
    pytest.importorskip("ray")
    tmp_path, home, work, env, temp = sandbox
    data = experiment(targets=[{"backend": "eager", "name": "same"}], executor={"kind": "ray", "workers": 1})
    (work / "exp.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    trace = tmp_path / "trace.txt"
    args = ["run", "exp.yaml", "--out", "out", "--no-cache", "--quiet"]
    result = subprocess.run(_command(args, home, trace), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 passed" in result.stdout, result.stdout[-2000:]
    assert _network_calls(trace) == [], _network_calls(trace)[:5]
    assert "AF_INET" in trace.read_text()  # the trace saw Ray's own (loopback) sockets: it was looking
    assert _tree(home) == set(), sorted(_tree(home))
    assert _tree(temp) == set(), sorted(_tree(temp))


def test_telemetry_is_off_once_parity_is_imported():
    """The switches are in place before any backend can load (parity/__init__ runs contain())."""
    import parity  # noqa: F401

    for name, value in offline.TELEMETRY_OFF.items():
        assert os.environ[name] == value
    with pytest.raises(ImportError):
        importlib.import_module("openvino_telemetry")


def test_contain_overrides_a_setting_that_would_turn_telemetry_on(monkeypatch):
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    offline.contain()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "1"


def test_openvino_converts_with_its_own_stub_when_telemetry_is_blocked():
    ovc = pytest.importorskip("openvino.tools.ovc.convert_impl")
    assert ovc.tm.__name__ == "openvino.tools.ovc.telemetry_stub"


def test_library_state_goes_to_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # set here too: restored after
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    offline.keep_state_in(tmp_path / "cache")
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "cache" / "matplotlib")


def test_library_state_without_a_cache_goes_to_the_state_folder(monkeypatch, tmp_path):
    """matplotlib's, and torch.compile's (which left `torchinductor_USER` in TMPDIR), in the one folder the
    process removes at its end."""
    for name in ("MPLCONFIGDIR", "TORCHINDUCTOR_CACHE_DIR", offline.STATE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    offline.keep_state_in(None)
    state = offline.state_folder()
    assert state.is_dir() and tmp_path not in state.parents and state.name.startswith("parity-")
    assert Path(os.environ["MPLCONFIGDIR"]) == state / "matplotlib"
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == state / "inductor"


def test_a_state_folder_is_shared_with_the_processes_parity_starts(monkeypatch):
    monkeypatch.delenv(offline.STATE_ENV, raising=False)
    state = offline.state_folder()
    assert os.environ[offline.STATE_ENV] == str(state) and offline.state_folder() == state


def test_no_writable_temporary_folder_is_one_line(monkeypatch, tmp_path):
    """`--out /` on a read-only root with the cache off: mkdtemp's error was a traceback (exit 3)."""
    monkeypatch.delenv(offline.STATE_ENV, raising=False)
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment(targets=[{"backend": "eager", "name": "same"}])))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    result = run_parity(["run", str(path), "--out", str(tmp_path / "out"), "--no-cache", "--quiet"], tmp_path, tmp_path,
                        ["out"])
    assert_user_error(result, "no temporary folder parity can write", "TMPDIR")


def test_a_folder_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # set here too: restored after
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mine"))
    offline.keep_state_in(tmp_path / "cache")
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "mine")


@pytest.mark.parametrize("verb", ["run", "validate"])
@pytest.mark.parametrize("targets", [[{"backend": "eager", "name": "same"}], [{"backend": "torchscript"}]],
                         ids=["eager", "torchscript"])
def test_in_process_commands_leave_the_home_folder_alone(verb, targets, monkeypatch, tmp_path):
    """Cheaper cases, in this process: HOME at an empty folder stays empty (the cache is off)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    outcome = run(experiment(targets=targets), verb=verb)
    assert outcome.code == 0, outcome.err
    assert outcome.written_outside == []
    assert _tree(tmp_path) == set(), sorted(_tree(tmp_path))


@pytest.mark.parametrize("cache", ["--no-cache", "--cache-dir"])
def test_an_unusable_inductor_cache_folder_is_the_users_to_fix(monkeypatch, tmp_path, cache):
    """TORCHINDUCTOR_CACHE_DIR naming a file: before, every compile target failed as its own backend_error."""
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a-file"))
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment(targets=[{"backend": "compile", "options": {"backend": "eager"}}])))
    argv = ["run", str(path), "--out", str(tmp_path / "out"), "--quiet", cache, *([str(tmp_path / "cache")] if cache == "--cache-dir" else [])]
    result = run_parity(argv, tmp_path, tmp_path, [])
    assert_user_error(result, "$TORCHINDUCTOR_CACHE_DIR", "a-file", "not a folder")


@pytest.mark.parametrize("targets, code", [([{"backend": "eager", "name": "same"}], 0),
                                           ([{"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"}], 1)],
                         ids=["passing", "failing"])
@pytest.mark.parametrize("stdout", ["a pipe whose reader ended", "closed"])
def test_a_lost_stdout_keeps_the_verdicts_exit_code(tmp_path, targets, code, stdout):
    """Before: rich turned the broken pipe into SystemExit(1), said as 'the model called sys.exit(1)' (exit 2)
    after a passing run; a closed stdout (`>&-`) was a traceback."""
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment(targets=targets)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    argv = [sys.executable, "-m", "parity.cli", "run", "exp.yaml", "--out", "out", "--no-cache", "--quiet"]
    if stdout == "closed":
        result = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                                text=True, timeout=300)
        returncode, err = result.returncode, result.stderr
    else:
        process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        process.stdout.close()  # the reader is gone before parity prints a line
        err = process.stderr.read()
        returncode = process.wait(timeout=300)
    assert returncode == code, err[-3000:]
    assert "Traceback" not in err and "sys.exit" not in err, err[-3000:]
    assert "warning: stdout is closed" in err, err[-3000:]
    assert (tmp_path / "out" / "summary.json").is_file()
