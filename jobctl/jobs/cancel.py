"""Cancelling jobs: each backend asked once for all of its jobs, CANCELLED recorded in the history."""

from __future__ import annotations

from jobctl.jobs import mirror, placement
from jobctl.jobs.status import reconcile, refresh
from jobctl.model import JobState


def cancel_records(history, records, say=lambda text: None) -> dict[int, dict]:
    """Cancel the history's `records` that have not ended; {id: result}. Jobs on a remote
    cluster are cancelled there, Slurm ones with one scancel call, local ones by signal."""
    results = {}
    if reconcile(history, [r for r in records if r.state is JobState.PREPARED]):
        records = [history.get(r.id) for r in records]  # a lost submission found: it has an id now
    live = [r for r in records if r.scheduler_job_id and not r.terminal]
    if live:  # a job the history thinks is running may have ended meanwhile
        refresh(history, live)
    todo = []
    for r in records:
        cur = history.get(r.id)
        if cur.terminal:
            results[cur.id] = _result(cur, "already ended")
            say(f"#{cur.id} already ended ({cur.state.value}): nothing to cancel")
        elif not cur.scheduler_job_id:
            results[cur.id] = _result(cur, "never submitted")
            say(f"#{cur.id} was never submitted ({cur.state.value}): nothing to cancel")
        else:
            todo.append(cur)
    asked_slurm = []
    for backend, group in placement.by_backend(todo):
        if placement.is_remote(group[0]):
            mirror.ask(history, backend, group, "cancel")
            continue
        backend.cancel(group)
        if group[0].scheduler == "slurm":
            asked_slurm += group
    if asked_slurm:  # record what Slurm says now; the job may also have ended on its own just before
        refresh(history, asked_slurm)
    for r in todo:
        cur = history.get(r.id)
        if not cur.terminal:
            history.transition(r.id, JobState.CANCELLED, "cancelled with jobctl cancel")
            cur = history.get(r.id)
        results[cur.id] = _result(cur, "cancelled" if cur.state is JobState.CANCELLED else "ended")
        say(f"#{cur.id} ({cur.scheduler} job {cur.scheduler_job_id}): {cur.state.value}")
    return results


def _result(rec, action: str) -> dict:
    return {"id": rec.id, "scheduler": rec.scheduler, "scheduler_job_id": rec.scheduler_job_id,
            "state": rec.state.value, "action": action}
