"""parity: does your model give the same answers on every backend you deploy to?

The Python API loads on first use (PEP 562): `import parity.errors`, `parity --help` and the pytest plugin,
which pytest loads in every run once parity is installed, do not import torch (seconds, hundreds of MB).
"""

from parity.offline import _AT_IMPORT, contain

_AT_IMPORT.append(contain())  # before any backend can load: no telemetry, nothing sent (parity/offline.py); no torch

from parity.errors import ParityError  # noqa: E402

__version__ = "0.1.0"
__all__ = ["ParityError", "assert_backends_agree", "fallback", "localize", "record_candidates", "run_experiment",
           "__version__"]
# What each lazily loaded name is, by module: the API, and what a detector's own code calls (flip attribution).
_LAZY = {"assert_backends_agree": "parity.api", "fallback": "parity.api", "localize": "parity.api",
         "run_experiment": "parity.api", "record_candidates": "parity.verify.tasks.detection_capture"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'parity' has no attribute {name!r}")
