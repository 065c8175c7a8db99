"""Where jobctl keeps its state: the history file and the job folders (a light module: `plan`
reads it without importing the store)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def history_path(env: Mapping[str, str] | None = None) -> Path:
    """The history file: $JOBCTL_HOME, else $XDG_STATE_HOME/jobctl, else ~/.local/state/jobctl."""
    env = os.environ if env is None else env
    if env.get("JOBCTL_HOME"):
        return Path(env["JOBCTL_HOME"]).expanduser() / "history.sqlite"
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "jobctl" / "history.sqlite"
    return Path.home() / ".local" / "state" / "jobctl" / "history.sqlite"


def jobs_root(workdir: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where job folders are made: the inventory's `workdir` (shared with the nodes), else
    `jobs/` next to the history."""
    if workdir:
        return Path(os.path.expandvars(os.path.expanduser(workdir)))
    return history_path(env).parent / "jobs"
