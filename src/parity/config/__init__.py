"""The experiment file: schema, loading (YAML and the published tool's format), checks."""

from parity.config.loading import experiment_from_dict, load_experiment
from parity.config.schema import BackendSpec, Experiment, InputSetSpec, ModelSpec, Tolerances

__all__ = ["BackendSpec", "Experiment", "InputSetSpec", "ModelSpec", "Tolerances", "experiment_from_dict", "load_experiment"]
