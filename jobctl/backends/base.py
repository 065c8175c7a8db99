"""The JobBackend protocol: what the job services ask of a scheduler, whichever it is.

`jobs/` never asks "local or Slurm?": it gets a backend from `jobs/placement.py` (`backend`,
`by_backend`) and calls these methods. Slurm (backends/slurm.py) and submitit's local executor
(backends/local.py) implement them; a cluster behind a login node is served by
`RemoteBackend` (remote/client.py), which answers refresh and cancel (and submits and requeues,
with arguments of its own) by asking the jobctl on the login node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jobctl.errors import SchedulerError, SubmissionUncertain  # noqa: F401  (re-exported)
from jobctl.model import JobStatus, Scheduler
from jobctl.store.folder import JobFolder


@dataclass(frozen=True)
class SubmitRequest:
    """One job for a scheduler: the callable each node runs (picklable), its folder, and the
    scheduler's parameters (submitit's names: nodes, gpus_per_node, time, partition, ...)."""

    runner: Callable[[], Any]
    folder: JobFolder
    parameters: dict
    name: str


@dataclass(frozen=True)
class Submitted:
    """What the scheduler answered: its id for the job, and where submitit keeps its files
    (the job folder, or the folder a job array shares)."""

    job_id: str
    submitit_folder: Path
    meta: dict = field(default_factory=dict)  # what the backend needs later (a controller's start time)


class JobRef(Protocol):
    """What a backend needs to know of a recorded job (store.history.JobRecord has it)."""

    scheduler_job_id: str | None
    created_at: str
    job_folder: str | None


class JobBackend(Protocol):
    """A scheduler. Every call that talks to it is here; nothing else runs its commands."""

    scheduler: Scheduler

    def check(self) -> None:
        """Refuse early (BackendError), before anything is recorded, when it cannot be reached."""

    def submit(self, requests: Sequence[SubmitRequest], cwd: str | None = None) -> list[Submitted]:
        """Submit jobs: one scheduler call for all (a job array) when there are several.
        The jobs run in `cwd` (default: here). BackendError when the scheduler refuses."""

    def refresh(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]:
        """What the scheduler says now about many jobs, in one query; keyed by scheduler id.
        A job it does not know (yet) is left out."""

    def cancel(self, jobs: Sequence[JobRef]) -> None:
        """Stop jobs that may still run (one call for all)."""

    def render(self, requests: Sequence[SubmitRequest], cwd: str | None = None) -> str | None:
        """The script the scheduler would be given for `requests` (one submit call: one job, or
        an array); None when there is none."""

    def test_only(self, script: str) -> tuple[bool, str]:
        """Whether the scheduler would accept `script` now, and what it said (no job created)."""

    def keep_off(self, job_id: str, nodes: Sequence[str]) -> bool:
        """Keep a waiting (requeued) job off `nodes`; False when the scheduler cannot or refused."""

    def output_files(self, submitit_folder: Path, job_id: str, node: int) -> tuple[Path, Path]:
        """Where the scheduler's own stdout and stderr of one node of a job are."""
