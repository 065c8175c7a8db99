"""Cancel jobs: one scancel for all the Slurm ones, a signal to the controller of local ones,
and CANCELLED recorded in the history."""

from __future__ import annotations

from jobctl import ui
from jobctl.jobs.commands import cancel_jobs

HELP = "cancel jobs (scancel for Slurm, a signal for local jobs) and record it"
EPILOG = """examples:
  jobctl cancel 12
  jobctl cancel 12 13 slurm:4242          # one scancel call for all the Slurm jobs

JOB is a jobctl id (12, #12) or a scheduler id (4242, slurm:4242). Every JOB is looked up in
the history first (scancel says nothing about ids it does not know); jobs that already ended
are left as they are.
exit codes: 0 cancelled (or already ended), 2 unknown job, 5 scancel failed or cannot be reached."""


def add_arguments(p) -> None:
    p.add_argument("jobs", nargs="+", metavar="JOB", help="jobs to cancel")
    p.add_argument("--json", action="store_true", dest="as_json", help="print what happened to each job as JSON")


def run(args) -> int:
    ordered = cancel_jobs(args.jobs, say=ui.info)  # all known, or nothing is cancelled; in the order asked
    if args.as_json:
        ui.print_json(ordered)
    else:
        for res in ordered:
            ui.line(f"#{res['id']}\t{res['state']}\t{res['action']}")
    return 0
