"""Show how jobs are doing now: one batched scheduler query for all of them, every change
recorded in the history."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import UsageError
from jobctl.jobs.commands import status_rows

HELP = "show jobs with fresh states from the scheduler (one query for all)"
EPILOG = """examples:
  jobctl status                 # active jobs, and the 20 most recent ones
  jobctl status 12 '#13' slurm:4242
  jobctl status --json | jq '.[] | select(.state == "RUNNING") | .id'

JOB is a jobctl id (12, #12, jobctl:12) or a scheduler id (4242, 4242_3, slurm:4242).
Slurm is asked once, with sacct, bounded by the earliest submit time (Slurm reuses job ids);
jobs that already ended keep their recorded state (`jobctl history` asks nothing).
exit codes: 0 ok, 2 unknown job, 5 sacct failed or cannot be reached."""

DEFAULT_RECENT = 20


def add_arguments(p) -> None:
    p.add_argument("jobs", nargs="*", metavar="JOB", help="jobs to show (default: active and recent ones)")
    p.add_argument("--limit", "-n", type=int, default=DEFAULT_RECENT, metavar="N",
                   help=f"without JOB: also show the N most recent jobs (default {DEFAULT_RECENT})")
    p.add_argument("--wide", action="store_true", help="every column in full (node lists, dates with the year)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the rows as JSON on stdout")


def run(args) -> int:
    if args.limit < 0:
        raise UsageError(f"--limit {args.limit}: expected 0 or a positive number")
    with ui.progress("asking the schedulers"):
        rows = status_rows(args.jobs, args.limit)
    if args.as_json:
        ui.print_json(rows)
        return 0
    if not rows:
        ui.info("no jobs in the history yet (submit one: jobctl submit RECIPE --cluster CLUSTER)")
        return 0
    ui.render_jobs(rows, title=None if args.jobs else "Active and recent jobs, newest first", wide=args.wide)
    return 0
