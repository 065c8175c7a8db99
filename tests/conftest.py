"""Shared fixtures: the real dev Slurm cluster (started once per run), tests/ on sys.path."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from slurm_fixture import slurm_cluster  # noqa: E402,F401
