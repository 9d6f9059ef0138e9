"""A run's records: their models (models.py, the schema and its reference; a record's identity in a run is its
model's `record_key`), how verdicts and checks are keyed (keys.py), written and read (io.py), the environment
they record (environment.py), the one reader every report, the summary and resume use (view.py: RunView), and
the summary computed from them (summary.py)."""

from parity.records.environment import cpu_info, environment
from parity.records.io import (
    NOT_DIGESTED,
    NewerRecords,
    RecordWriter,
    experiment_digest,
    read_records,
    read_run,
    record_problem,
)
from parity.records.keys import check_key, gate_atol, tolerance_key
from parity.records.models import SCHEMA_VERSION
from parity.records.view import RunView

__all__ = ["NOT_DIGESTED", "SCHEMA_VERSION", "NewerRecords", "RecordWriter", "RunView", "check_key", "cpu_info",
           "environment", "experiment_digest", "gate_atol", "read_records", "read_run",
           "record_problem", "tolerance_key"]
