"""List past jobs from the history database alone (no scheduler call)."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import UsageError
from jobctl.jobs.commands import history_rows
from jobctl.model import parse_state

HELP = "list past jobs from the history (no scheduler call), newest first"
EPILOG = """examples:
  jobctl history                              # the 20 newest jobs
  jobctl history --state failed,timeout       # only those (repeatable, comma-separated)
  jobctl history --recipe tiny --cluster dev --limit 0    # all of them
  jobctl history --json | jq '.[].id'
  jobctl history --forget-learned 6           # plans stop applying what job #6's OOM taught

States are the recorded ones: run `jobctl status` to ask the scheduler for fresh ones.
exit codes: 0 ok, 2 bad option (an unknown state, a negative limit)."""

DEFAULT_LIMIT = 20


def add_arguments(p) -> None:
    p.add_argument("--recipe", "-r", help="only jobs of this recipe (name, or the path it was submitted from)")
    p.add_argument("--state", "-s", action="append", default=[], metavar="STATE[,STATE]",
                   help="only jobs in these states, e.g. RUNNING or failed,timeout (repeatable)")
    p.add_argument("--cluster", "-c", help="only jobs on this cluster (inventory name)")
    p.add_argument("--limit", "-n", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"show the N newest matching jobs (default {DEFAULT_LIMIT}; 0: all)")
    p.add_argument("--wide", action="store_true", help="every column in full (node lists, dates with the year)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the rows as JSON on stdout")
    p.add_argument("--forget-learned", metavar="JOB",
                   help="drop the memory calibration JOB's CUDA OOM recorded (`plan` applies it to later plans "
                        "of that recipe; `plan --no-learn` ignores all of them for one plan)")


def run(args) -> int:
    if args.forget_learned:
        from jobctl.jobs.commands import forget_learned

        job_id, dropped = forget_learned(args.forget_learned)
        if args.as_json:
            ui.print_json({"id": job_id, "forgotten": dropped})
        elif dropped is None:
            ui.info(f"job #{job_id} has no calibration to forget")
        else:
            ui.info(f"job #{job_id}'s calibration is forgotten: plans no longer apply it")
        return 0
    if args.limit < 0:
        raise UsageError(f"--limit {args.limit}: expected 0 (all) or a positive number")
    states = [parse_state(s) for item in args.state for s in item.split(",") if s.strip()] or None
    limit = None if args.limit == 0 else args.limit
    rows, more = history_rows(args.recipe, states, args.cluster, limit)
    if args.as_json:
        ui.print_json(rows)
        return 0
    if not rows:
        ui.info("no jobs match" if (args.recipe or states or args.cluster) else
                "no jobs in the history yet (submit one: jobctl submit RECIPE --cluster CLUSTER)")
        return 0
    ui.render_jobs(rows, title="Job history (recorded states), newest first", wide=args.wide)
    if more:
        ui.info(f"showing the {limit} newest; --limit N for more, --limit 0 for all")
    return 0
