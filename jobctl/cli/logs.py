"""Print a job's log (one node's), or follow it until the job ends."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import EXIT_INTERRUPTED
from jobctl.jobs.commands import show_logs

HELP = "print a job's log (logs/node-N.log in its folder); -f follows it until the job ends"
EPILOG = """examples:
  jobctl logs 12                  # node 0's log
  jobctl logs 12 --node 1         # another node of a multi-node job
  jobctl logs slurm:4242 -f       # follow until the job ends (Ctrl-C stops following)

The log is <job folder>/logs/node-N.log, written by the job; before it exists (or when the job
failed before starting the command) submitit's own stdout/stderr files are shown instead.
exit codes: 0 ok, 2 unknown job, no such node or no log yet, 5 the scheduler cannot be reached,
            130 interrupted (Ctrl-C while following)."""


def add_arguments(p) -> None:
    p.add_argument("job", metavar="JOB", help="jobctl id (12, #12) or scheduler id (slurm:4242)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows, until the job ends")
    p.add_argument("--node", "-N", type=int, default=0, metavar="N", help="which node's log (default 0)")


def run(args) -> int:
    try:
        show_logs(args.job, args.node, args.follow, ui.raw, ui.info)
        return 0
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # Ctrl-C while following: the usual way out, nothing to report
