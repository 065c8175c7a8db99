"""Submit a job again as a new attempt, with its parent recorded: the same plan, or with
--smaller the OOM ladder's next plan (the global batch kept), as the job itself would after
a CUDA out-of-memory. Everything comes from the job's folder; the failure figures too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jobctl.errors import EXIT_OK, UsageError

HELP = "submit a job again as a new attempt: the same plan, or --smaller (the OOM ladder's next)"
EPILOG = """examples:
  jobctl requeue 12 --smaller                 # one rung down the OOM ladder, parent #12 recorded
  jobctl requeue slurm:4242 --smaller --tried-to-allocate 3.91 --wait
  jobctl requeue '#12'                        # the same plan again (attempt + 1)
  jobctl requeue 12 --smaller --json | jq .rung

The recipe, inventory and plan are those in the job's folder (recipe.json, inventory.json,
plan.json), not the files as they are now. With --smaller the ladder learns from the job's
outcome records when they are there (the OOM message's figures, the measured peak); the
job's own attempt limit (--max-attempts) does not apply to requeueing by hand.
exit codes: 0 submitted (with --wait: completed), 1 with --wait: the job failed, 2 unknown
job or bad option, 3 nothing smaller fits, 4 the scheduler refused or cannot be reached."""


def add_arguments(p) -> None:
    p.add_argument("job", metavar="JOB", help="the job: a jobctl id (12, #12) or a scheduler id (4242, slurm:4242)")
    p.add_argument("--smaller", action="store_true",
                   help="the OOM ladder's next plan (smaller micro-batch, recompute, sharding, ...) instead of the same")
    p.add_argument("--tried-to-allocate", metavar="GIB", type=float,
                   help="with --smaller: the failed allocation from PyTorch's message (GiB); "
                        "overrides the figure in the job's outcome records")
    p.add_argument("--wait", action="store_true", help="wait for the new job to end (following OOM retries)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the new job as JSON on stdout")


def run(args) -> int:
    from jobctl import ui
    from jobctl.remote import client as remote_jobs
    from jobctl.cli.history import resolve
    from jobctl.store.history import History

    if args.tried_to_allocate is not None:
        if not args.smaller:
            raise UsageError("--tried-to-allocate goes with --smaller", hint="jobctl requeue JOB --smaller "
                             "--tried-to-allocate GIB")
        if not 0 < args.tried_to_allocate < 1 << 20:
            raise UsageError(f"--tried-to-allocate: expected a positive size in GiB, got {args.tried_to_allocate}")
    with History.open() as history:
        (record,) = resolve(history, [args.job])
        tried = None if args.tried_to_allocate is None else int(args.tried_to_allocate * (1 << 30))
        say = (lambda text: None) if args.as_json else ui.info
        if remote_jobs.cluster_of(record):
            out, res = remote_jobs.requeue(history, record, smaller=args.smaller, tried_to_allocate_bytes=tried)
        else:
            out, res = requeue_record(history, record, smaller=args.smaller, tried_to_allocate_bytes=tried, say=say)
        if not args.as_json:
            ui.info(f"#{out['jobctl_id']}: attempt {out['attempt']}, parent #{record.id}"
                    + (f"; {out['rung']}: {out['reason']}" if out["rung"] else "; the same plan"))
        code = EXIT_OK
        if args.wait:
            from jobctl.jobs.watch import wait_for

            code = wait_for([res], history, quiet=args.as_json)
    if args.as_json:
        ui.print_json(out)
    elif not args.wait:
        sys.stdout.write(f"#{out['jobctl_id']}\t{out['scheduler_job_id']}\t{out['job_folder']}\n")
    return code


def requeue_record(history, record, *, smaller: bool, tried_to_allocate_bytes: int | None = None,
                   say=lambda text: None) -> tuple[dict, dict]:
    """Submit `record` again (the same plan, or the ladder's next with `smaller`), its parent
    recorded; (summary, submit_all result). Also what a login node runs for a remote requeue."""
    from jobctl.jobs.recovery import failure_figures, next_submission, read_outcomes
    from jobctl.jobs.submission import submit_all

    record = _ended(history, record)
    folder = _folder(record)
    # The history is the source of truth for the lineage: its id and attempt, not the file's.
    job = json.loads((folder / "job.json").read_text()) | {"jobctl_id": record.id, "attempt": record.attempt}
    info = {}
    if smaller:
        info = failure_figures(job, read_outcomes(folder))
        if tried_to_allocate_bytes is not None:
            info["tried_to_allocate_bytes"] = tried_to_allocate_bytes
    step = next_submission(folder, job, info, smaller=smaller)
    _note_earlier(history, record, say)
    (res,) = submit_all([step.submission], history, progress=say)
    return step.summary(res), res


def _ended(history, record):
    """The record with a fresh state; a job still queued or running is refused (two copies
    would run). Ended jobs keep their recorded state, as `jobctl status` does."""
    if record.terminal or not record.scheduler_job_id:
        return record
    from jobctl.cli.status import refresh_live

    refresh_live(history, [record])
    record = history.get(record.id)
    if not record.terminal:
        raise UsageError(f"job #{record.id} is {record.state.value}: requeueing it would run it twice",
                         hint=f"cancel it first (jobctl cancel {record.id}), or wait for it to end")
    return record


def _folder(record) -> Path:
    if not record.job_folder:
        raise UsageError(f"job #{record.id} has no job folder ({record.state.value}: it was never submitted)",
                         hint="submit the recipe again: jobctl submit RECIPE --cluster CLUSTER")
    folder = Path(record.job_folder)
    missing = [n for n in ("job.json", "recipe.json", "inventory.json", "plan.json") if not (folder / n).is_file()]
    if missing:
        raise UsageError(f"job #{record.id}: its folder {folder} lacks {', '.join(missing)}",
                         hint="the folder must be readable from here (a shared file system) and not cleaned up")
    return folder


def _note_earlier(history, record, say) -> None:
    """Say so when the job was already continued (by its own OOM recovery or an earlier requeue)."""
    children = [r.id for r in history.chain(record.id) if r.parent_id == record.id]
    if children:
        say(f"note: #{record.id} was already continued as " + ", ".join(f"#{i}" for i in children)
                + "; this makes another attempt beside it")
