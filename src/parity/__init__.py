"""parity: does your model give the same answers on every backend you deploy to?"""

from parity.api import assert_backends_agree, run_experiment
from parity.errors import ParityError

__version__ = "0.1.0"
__all__ = ["ParityError", "assert_backends_agree", "run_experiment", "__version__"]
