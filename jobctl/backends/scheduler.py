"""Ask the scheduler how jobs are doing: one batched sacct query for many Slurm jobs, the job
folder for local ones. Returns states in the history's vocabulary."""

from __future__ import annotations

import os
import pickle
import subprocess
from dataclasses import dataclass
from pathlib import Path

from jobctl.errors import SchedulerError


@dataclass(frozen=True)
class JobState:
    state: str
    exit_code: str | None = None
    reason: str | None = None
    start: str | None = None
    end: str | None = None
    nodes: str | None = None


def sacct_states(job_ids: list[str], since: str | None) -> dict[str, JobState]:
    """States of many Slurm jobs with ONE sacct call, bounded by the earliest submit time
    (Slurm reuses job ids, so an unbounded query can return an older job's row)."""
    if not job_ids:
        return {}
    argv = ["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,Start,End,NodeList,Reason",
            "-j", ",".join(sorted(set(job_ids)))]
    if since:
        argv += ["-S", sacct_time(since)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SchedulerError("sacct is not installed here: cannot ask Slurm about jobs") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError("sacct did not answer within 60 s") from None
    if p.returncode != 0:
        raise SchedulerError(f"sacct failed: {(p.stderr or p.stdout).strip()}")
    out: dict[str, JobState] = {}
    for line in p.stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 7:
            continue
        jid, state, code, start, end, nodes, reason = parts[:7]
        state = state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 0"
        out[jid] = JobState(state, code, reason if reason not in ("", "None") else None,
                            start if start not in ("", "Unknown", "None") else None,
                            end if end not in ("", "Unknown", "None") else None, nodes or None)
    return out


def sacct_time(iso: str, slack_s: float = 60.0) -> str:
    """A history timestamp (UTC ISO) as sacct's -S reads it: naive local wall-clock time.
    The slack covers clock skew between this machine and slurmctld."""
    from datetime import datetime, timedelta

    dt = datetime.fromisoformat(iso)
    if dt.tzinfo is not None:
        dt = dt.astimezone().replace(tzinfo=None)
    return (dt - timedelta(seconds=slack_s)).strftime("%Y-%m-%dT%H:%M:%S")


def local_state(job_folder: str, submitit_folder: str | None, job_id: str) -> JobState:
    """A local (submitit LocalExecutor) job: its result pickle, else whether its controller lives."""
    folder = Path(submitit_folder or job_folder)
    result = folder / f"{job_id}_0_result.pkl"
    if result.exists():
        try:
            with open(result, "rb") as f:
                status, _ = pickle.load(f)
        except Exception:  # a partial write: still finishing
            return JobState("RUNNING")
        return JobState("COMPLETED" if status == "success" else "FAILED", "0:0" if status == "success" else "1:0")
    try:
        os.kill(int(job_id), 0)
    except (ProcessLookupError, ValueError):
        return JobState("FAILED", reason="the local job's process is gone and left no result")
    except PermissionError:
        pass
    return JobState("RUNNING")


def states(records) -> dict[int, JobState]:
    """States of history records (store.JobRecord), one sacct call for all Slurm ones."""
    import json

    slurm = [r for r in records if r.scheduler == "slurm" and r.scheduler_job_id]
    # created_at is written before sbatch is called: never after the job's own submit time
    since = min((r.created_at for r in slurm), default=None)
    by_id = sacct_states([r.scheduler_job_id for r in slurm], since) if slurm else {}
    out: dict[int, JobState] = {}
    for r in records:
        if not r.scheduler_job_id:
            continue
        if r.scheduler == "slurm":
            st = by_id.get(r.scheduler_job_id)
            out[r.id] = st if st is not None else JobState("PENDING", reason="not yet in accounting")
        else:
            meta = Path(r.job_folder or "") / "submitit.json"
            sub_folder = json.loads(meta.read_text()).get("submitit_folder") if meta.exists() else None
            out[r.id] = local_state(r.job_folder or "", sub_folder, r.scheduler_job_id)
    return out
