from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# The artifact cache is off in tests (a test that needs it names its own --cache-dir): a stale export from
# another test would hide what the test means to exercise, and tests write nothing to the home folder.
os.environ["PARITY_CACHE_DIR"] = "off"
if str(ROOT) not in sys.path:  # makes `tests.fixtures.tiny` importable as a model entry and backend plugin
    sys.path.insert(0, str(ROOT))


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # parity's own tests run parity (in this process) as its commands do: contained, as `import parity` leaves a
    # process; after the pytest plugin (installed with parity, so loaded here too) gave the session back its own.
    from parity.offline import contain

    contain()
    config.addinivalue_line("markers", "numerics: its outcome rests on floating-point results of real kernels (ATen, "
                                       "oneDNN, inductor, ONNX Runtime, OpenVINO); `make test-portable` runs these again "
                                       "on other CPU code paths")


def pytest_report_header(config) -> str:
    """The CPU code paths this run takes: what `make test-portable` changes."""
    import torch

    return (f"torch {torch.__version__}: ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} thread(s); ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}")


@pytest.fixture
def write_yaml(tmp_path):
    def write(data: dict | str, name: str = "exp.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture(autouse=True)
def _folder_left_as_found():
    """A test that leaves the process in a folder that is gone (a temporary folder removed while the process
    was in it) breaks every later test that asks for the working directory: it fails itself instead, and the
    process goes back to the folder it started in."""
    start = os.getcwd()
    yield
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(start)
        pytest.fail("the test left the process in a folder that was removed")


def pytest_collection_finish(session):
    """Every module the tests import is loaded now and lives as long as the session: gc.freeze() takes their
    objects out of the cycle collector's walks. parity collects after each export (backends/onnxruntime.py) and
    each walk would otherwise traverse every torch, transformers and onnxscript object of the session; what a test
    makes afterwards is collected as before."""
    gc.collect()
    gc.freeze()
