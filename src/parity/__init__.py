"""parity: does your model give the same answers on every backend you deploy to?"""

from parity.offline import contain

contain()  # before any backend can load: no telemetry, nothing sent (parity/offline.py)

from parity.api import assert_backends_agree, run_experiment  # noqa: E402
from parity.errors import ParityError  # noqa: E402

__version__ = "0.1.0"
__all__ = ["ParityError", "assert_backends_agree", "run_experiment", "__version__"]
