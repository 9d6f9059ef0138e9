from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The artifact cache is off in tests (a test that needs it names its own --cache-dir): a stale export from
# another test would hide what the test means to exercise, and tests write nothing to the home folder.
os.environ["PARITY_CACHE_DIR"] = "off"
if str(ROOT) not in sys.path:  # makes `tests.fixtures.tiny` importable as a model entry and backend plugin
    sys.path.insert(0, str(ROOT))


# One target for each way a check can end: identical, drifting (bfloat16, a perturbed weight), a backend
# that raises, and one that cannot run here. Reports and the study's tables are tested on runs with these.
# A bfloat16 target judged at float32's tolerance (its own default, rtol 1.6e-2, would pass a tiny CNN):
# a drift every CPU shows.
BF16_AT_FLOAT32 = {"backend": "eager", "dtype": "bfloat16", "tolerances": {"rtol": 1e-5, "gate": 1e-4}}
EVERY_OUTCOME = [
    {"backend": "eager", "name": "same"},
    BF16_AT_FLOAT32,
    {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "perturbed"},
    {"backend": "tests.fixtures.tiny:FailingEager", "name": "failing"},
    {"backend": "tests.fixtures.tiny:NeverAvailable", "name": "never"},
]


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


def tiny_experiment(targets: list[dict], **overrides) -> dict:
    """A small experiment: the tiny CNN on one synthetic batch."""
    exp = {
        "name": "tiny",
        "seed": 0,
        "models": [{"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}],
        "inputs": [{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}],
        "targets": targets,
    }
    exp.update(overrides)
    return exp


@pytest.fixture
def write_yaml(tmp_path):
    def write(data: dict | str, name: str = "exp.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write
