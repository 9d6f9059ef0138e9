"""A quantized target's calibration inputs, found by every execution inside a block: a run's, tier 2's on a
layer alone, a fallback search's trials. Whoever runs a model's executions (the Runner, a worker) says where
input sets come from (`providing`); `execution.py` hands the backend its target's before `prepare`.

A context, as the artifact cache is (execute/cache.py), so that no layer between the Runner and `execute` passes
input sets on; tier 2 provides a layer's own inputs in the model's calibration runs while it runs that layer.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

from parity.config.schema import BackendSpec
from parity.inputs import Inputs

CalibrationSource = Callable[[str], list[Inputs]]  # an input set's name -> the calls it makes
_active: contextvars.ContextVar[CalibrationSource | None] = contextvars.ContextVar("parity_calibration", default=None)


@contextlib.contextmanager
def providing(source: CalibrationSource) -> Iterator[None]:
    """Executions inside this block calibrate on `source(name)` for a target calibrated on the input set `name`."""
    token = _active.set(source)
    try:
        yield
    finally:
        _active.reset(token)


def for_spec(spec: BackendSpec) -> list[Inputs] | None:
    """The calibration inputs of the target `spec` (None: it observes no data)."""
    if spec.quantize is None or spec.quantize.calibration is None:
        return None
    source = _active.get()
    if source is None:
        raise RuntimeError(f"target {spec.id} calibrates on input set '{spec.quantize.calibration}', and this "
                           "execution was given no input sets (run it through parity's Runner)")
    return source(spec.quantize.calibration)
