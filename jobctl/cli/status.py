"""Show how jobs are doing now: one batched scheduler query for all of them, every change
recorded in the history."""

from __future__ import annotations

from jobctl.errors import UsageError

HELP = "show jobs with fresh states from the scheduler (one query for all)"
EPILOG = """examples:
  jobctl status                 # active jobs, and the 20 most recent ones
  jobctl status 12 '#13' slurm:4242
  jobctl status --json | jq '.[] | select(.state == "RUNNING") | .id'

JOB is a jobctl id (12, #12, jobctl:12) or a scheduler id (4242, 4242_3, slurm:4242).
Slurm is asked once, with sacct, bounded by the earliest submit time (Slurm reuses job ids);
jobs that already ended keep their recorded state (`jobctl history` asks nothing).
exit codes: 0 ok, 2 unknown job, 4 sacct failed or cannot be reached."""

DEFAULT_RECENT = 20


def add_arguments(p) -> None:
    p.add_argument("jobs", nargs="*", metavar="JOB", help="jobs to show (default: active and recent ones)")
    p.add_argument("--limit", "-n", type=int, default=DEFAULT_RECENT, metavar="N",
                   help=f"without JOB: also show the N most recent jobs (default {DEFAULT_RECENT})")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the rows as JSON on stdout")


def run(args) -> int:
    from jobctl import ui
    from jobctl.cli.history import job_row
    from jobctl.store.history import History

    if args.limit < 0:
        raise UsageError(f"--limit {args.limit}: expected 0 or a positive number")
    with History.open() as history:
        records = select(history, args.jobs, args.limit)
        current = refresh_live(history, records)
        records = [history.get(r.id) for r in records]  # the states just recorded
        rows = [job_row(history, r, current.get(r.id)) for r in records]
    if args.as_json:
        ui.print_json(rows)
        return 0
    if not rows:
        ui.info("no jobs in the history yet (submit one: jobctl submit RECIPE --cluster CLUSTER)")
        return 0
    ui.render_jobs(rows, title=None if args.jobs else "Active and recent jobs, newest first")
    return 0


def select(history, refs: list[str], recent: int) -> list:
    """The named jobs; without names, every active job plus the `recent` newest, newest first."""
    from jobctl.cli.history import resolve

    if refs:
        return resolve(history, refs)
    by_id = {r.id: r for r in history.active()}
    if recent:
        by_id.update((r.id, r) for r in history.list(limit=recent))
    return [by_id[i] for i in sorted(by_id, reverse=True)]


def refresh_live(history, records) -> dict:
    """Ask the scheduler (once) about the jobs not yet ended and record what changed.

    Ended jobs are not asked about: their recorded state is final (a local job's folder
    cannot tell CANCELLED from FAILED, and sacct may have forgotten old jobs)."""
    from jobctl.errors import SchedulerError
    from jobctl.jobs.watch import refresh

    live = [r for r in records if r.scheduler_job_id and not r.terminal]
    try:
        return refresh(history, live) if live else {}
    except SchedulerError as e:
        raise SchedulerError(e.message, hint=e.hint or "`jobctl history` shows the recorded states "
                             "without asking the scheduler") from None
