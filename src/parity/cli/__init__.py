"""The command line: `parity run`, `parity check`, `parity report`, `parity validate`, `parity localize`,
`parity fallback`, `parity reduce`, `parity backends`, `parity cache info|clear`, `parity completion
bash|zsh`. One function per verb, in a module per group of verbs (`run`, `one_check`, `run_dir`, `machine`);
`parser` builds the parser, `main` runs one command, `process` is the `parity` command's two processes, `logs`
and `terminal` what a command writes to.

Exit codes: 0 every check passed at the gate; 1 some check failed or has no verdict (a target could not
run here, the reference crashed); 2 user error (bad file, unknown name, missing file, a model that raises on
its inputs in the eager reference); 3 internal error (a bug in parity: please report).
"""

from parity.cli.logs import LOG_FILE, library_logs, show_logs
from parity.cli.main import main
from parity.cli.parser import PREPROCESS_CHOICES, build_parser
from parity.cli.process import run_and_exit
from parity.cli.terminal import EXIT_BUG, EXIT_FAILED, EXIT_OK, EXIT_USER

__all__ = ["EXIT_BUG", "EXIT_FAILED", "EXIT_OK", "EXIT_USER", "LOG_FILE", "PREPROCESS_CHOICES", "build_parser",
           "library_logs", "main", "run_and_exit", "show_logs"]
