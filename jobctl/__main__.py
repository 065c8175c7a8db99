"""`python -m jobctl` runs the command line."""

from jobctl.cli import run

run()
