"""Shared fixtures: the real dev Slurm cluster (started once per run) and the CLI run from this checkout.

tests/ and the repository root are on sys.path through pyproject.toml's `pythonpath`."""

from pathlib import Path

import pytest
from slurm_fixture import slurm_cluster  # noqa: F401  (pytest fixture)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def repo_cli(monkeypatch) -> Path:
    """The CLI as run from the repository root, with only its clusters/ (no JOBCTL_CLUSTERS) and a
    wide terminal, so that rich does not wrap long lines (the wrapping itself is pinned in
    test_cli.py). Returns the repository root."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("JOBCTL_CLUSTERS", raising=False)
    monkeypatch.setenv("COLUMNS", "4000")
    return REPO


@pytest.fixture()
def repo_cli_home(repo_cli, monkeypatch, tmp_path) -> Path:
    """repo_cli with a fresh history: JOBCTL_HOME is tmp_path / "home". Returns that home."""
    home = tmp_path / "home"
    monkeypatch.setenv("JOBCTL_HOME", str(home))
    return home
