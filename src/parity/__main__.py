"""`python -m parity`: the `parity` command, for environments where its script is not on PATH."""

from parity.cli import run_and_exit

if __name__ == "__main__":
    run_and_exit()
