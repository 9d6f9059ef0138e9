"""An experiment file read into a validated `config.schema.Experiment`: YAML with line numbers (`yaml_io`), the
published tool's format (`legacy`), the schema, then the checks that look names and files up in backends, model
sources and inputs (`validate`); every problem one line naming file, line and key (`loading`). Also the target
grammar of `parity check` (`targets`) and the generated experiment reference (`reference`)."""

from parity.experiment.loading import experiment_from_dict, load_experiment

__all__ = ["experiment_from_dict", "load_experiment"]
