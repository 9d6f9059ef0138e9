"""The experiment's schema (shape and numbers, `schema.py`) and its tolerance policy (`tolerances.py`).
Reading a file into one, and checking it against what is installed here, is `parity.experiment`."""

from parity.config.schema import BackendSpec, Experiment, InputSetSpec, ModelSpec, Tolerances

__all__ = ["BackendSpec", "Experiment", "InputSetSpec", "ModelSpec", "Tolerances"]
