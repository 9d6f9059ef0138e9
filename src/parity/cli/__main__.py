"""`python -m parity.cli ARGS`: the command's second process, which the first (`process.run_and_exit`) starts."""

from parity.cli.process import run_and_exit

if __name__ == "__main__":
    run_and_exit()
