"""The history's rows as values (JobRecord, Transition) and its errors; where the file lives."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from jobctl.errors import EXIT_STATE, JobctlError, UsageError
from jobctl.model import TERMINAL_STATES, FailureKind, JobState
from jobctl.store.paths import history_path


class HistoryError(JobctlError):
    """The history database cannot be used as asked (newer schema, a conflicting update)."""


class HistoryDamaged(HistoryError):
    """The history file itself is unusable: damaged, read-only, or its disk is full."""

    exit_code = EXIT_STATE


class UnknownJobError(UsageError, LookupError):
    """No job in the history matches a reference."""


class AmbiguousJobError(UsageError):
    """A scheduler id matches several jobs (several clusters, or a rebuilt cluster)."""


def default_path(env: Mapping[str, str] | None = None) -> Path:
    """The history file: $JOBCTL_HOME, else $XDG_STATE_HOME/jobctl, else ~/.local/state/jobctl."""

    return history_path(env)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(dt: datetime) -> str:
    if dt.tzinfo is None:
        raise ValueError(f"timestamps must be timezone-aware, got naive {dt!r}")
    # One fixed format so that text order is time order in SQL.
    return dt.astimezone(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class JobRecord:
    """One row of ``jobs``, as stored (timestamps are UTC ISO strings)."""

    id: int
    created_at: str
    recipe_path: str | None
    recipe_name: str
    recipe_text: str
    recipe_hash: str
    plan_json: str
    cluster: str
    partition: str | None
    scheduler: str
    scheduler_job_id: str | None
    job_folder: str | None
    state: JobState
    failure_kind: FailureKind | None  # why it failed, as classified (jobctl.model); None if unknown
    exit_code: str | None  # the scheduler's "code:signal" for a job that did not complete
    detail: str | None  # free text: the scheduler's refusal, the failure's summary
    parent_id: int | None
    attempt: int
    token: str
    submitted_at: str | None
    started_at: str | None
    ended_at: str | None
    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    sweep_id: str | None
    extra_json: str
    # where it runs, for a job submitted through a cluster's login node (None: here)
    remote_cluster: str | None = None
    remote_id: int | None = None  # its id in the login node's history
    remote_folder: str | None = None  # its job folder there

    @property
    def plan(self) -> dict:
        return json.loads(self.plan_json)

    @property
    def extra(self) -> dict:
        return json.loads(self.extra_json)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def ending(self) -> str | None:
        """Why an ended job ended, for people: the failure kind, else the exit code, else the detail."""
        if self.failure_kind is not None:
            return self.failure_kind.value
        if self.exit_code:
            return f"exit {self.exit_code}"
        return self.detail

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["state"] = self.state.value
        d["failure_kind"] = None if self.failure_kind is None else self.failure_kind.value
        return d

    @classmethod
    def _from_row(cls, row: sqlite3.Row) -> "JobRecord":
        d = dict(row)
        d["state"] = JobState(d["state"])
        d["failure_kind"] = FailureKind(d["failure_kind"]) if d["failure_kind"] else None
        return cls(**d)


@dataclass(frozen=True)
class Transition:
    job_id: int
    at: str
    state: JobState
    detail: str | None


