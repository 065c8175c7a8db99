"""Submitting a job again as a new attempt, its parent recorded: the same plan, or the OOM
ladder's next one (the global batch kept), as the job itself would after a CUDA OOM.
Everything comes from the job's folder, the failure figures too."""

from __future__ import annotations

from dataclasses import replace

from jobctl.errors import UsageError
from jobctl.jobs import mirror, placement
from jobctl.jobs.recovery import failure_figures, next_submission
from jobctl.jobs.status import refresh_live
from jobctl.jobs.submission import submit_all
from jobctl.runtime.outcome import read_outcomes
from jobctl.store import folder as layout
from jobctl.store.folder import JobFolder


def requeue(history, record, *, smaller: bool, tried_to_allocate_bytes: int | None = None,
            say=lambda text: None) -> tuple[dict, dict]:
    """Submit `record` again; (summary, submit result). A remote job is requeued on its login node."""
    if placement.is_remote(record):
        return mirror.requeue(history, placement.remote_for(record.remote_cluster), record, smaller=smaller,
                              tried_to_allocate_bytes=tried_to_allocate_bytes)
    return requeue_record(history, record, smaller=smaller, tried_to_allocate_bytes=tried_to_allocate_bytes, say=say)


def requeue_record(history, record, *, smaller: bool, tried_to_allocate_bytes: int | None = None,
                   say=lambda text: None) -> tuple[dict, dict]:
    """Submit `record` again (the same plan, or the ladder's next with `smaller`) from here, its
    parent recorded; (summary, submit_all result). Also what a login node runs for a remote requeue."""
    record = _ended(history, record)
    folder = _folder(record)
    # The history is the source of truth for the lineage: its id and attempt, not the file's.
    job = folder.job() | {"jobctl_id": record.id, "attempt": record.attempt}
    figures = None
    if smaller:
        figures = failure_figures(read_outcomes(folder))
        if tried_to_allocate_bytes is not None:
            figures = replace(figures, tried_to_allocate_bytes=tried_to_allocate_bytes)
    step = next_submission(folder, job, figures, smaller=smaller)
    _note_earlier(history, record, say)
    (res,) = submit_all([step.submission], history, progress=say)
    return step.summary(res), res


def _ended(history, record):
    """The record with a fresh state; a job still queued or running is refused (two copies
    would run). Ended jobs keep their recorded state, as `jobctl status` does."""
    if record.terminal or not record.scheduler_job_id:
        return record
    refresh_live(history, [record])
    record = history.get(record.id)
    if not record.terminal:
        raise UsageError(f"job #{record.id} is {record.state.value}: requeueing it would run it twice",
                         hint=f"cancel it first (jobctl cancel {record.id}), or wait for it to end")
    return record


def _folder(record) -> JobFolder:
    if not record.job_folder:
        raise UsageError(f"job #{record.id} has no job folder ({record.state.value}: it was never submitted)",
                         hint="submit the recipe again: jobctl submit RECIPE --cluster CLUSTER")
    folder = JobFolder(record.job_folder)
    missing = [n for n in (layout.JOB, layout.RECIPE_JSON, layout.INVENTORY_JSON, layout.PLAN)
               if not folder.file(n).is_file()]
    if missing:
        raise UsageError(f"job #{record.id}: its folder {folder.path} lacks {', '.join(missing)}",
                         hint="the folder must be readable from here (a shared file system) and not cleaned up")
    return folder


def _note_earlier(history, record, say) -> None:
    """Say so when the job was already continued (by its own OOM recovery or an earlier requeue)."""
    children = [r.id for r in history.chain(record.id) if r.parent_id == record.id]
    if children:
        say(f"note: #{record.id} was already continued as " + ", ".join(f"#{i}" for i in children)
                + "; this makes another attempt beside it")
