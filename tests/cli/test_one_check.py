"""cli/one_check.py: `parity localize` and `parity fallback`'s own options."""

from __future__ import annotations

from parity.cli import main
from tests.support import tiny_experiment


def test_a_granularity_the_schema_refuses_is_one_line_naming_the_options(write_yaml, capsys):
    """--granularity is checked as the experiment's tiers.activations is: exit 2, the schema's own sentence."""
    file = write_yaml(tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}]))
    assert main(["localize", str(file), "--granularity", "depth:x"]) == 2
    assert ("--granularity/--mode: expected blocks, leaf, depth:N or a list of module names"
            in capsys.readouterr().err)
