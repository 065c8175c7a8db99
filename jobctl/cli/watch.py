"""Watch a job and its attempt chain live: state, nodes, elapsed time and GPU memory against
the plan, following OOM retries to the end of the chain."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import EXIT_JOB_FAILED, EXIT_OK, UsageError
from jobctl.jobs.commands import watch_live, watch_snapshot

HELP = "watch a job live: state, GPU memory vs the plan, its OOM retries"
EPILOG = """examples:
  jobctl watch                  # the most recent active job
  jobctl watch 12               # job #12, then the attempts that continue it
  jobctl watch 12 --once        # one snapshot, no live view (also when stdout is not a terminal)
  jobctl watch 12 --json | jq .chain_text

The live view asks the scheduler once every --interval-s seconds (one batched query) and reads
the GPU sampler's CSVs in the job folder (gpu/node-<R>.csv). When a job fails and its first
node submits a smaller plan (the OOM ladder), the view moves on to that attempt.
exit codes: 0 the chain ended COMPLETED (--once: it has not ended in a failure), 2 unknown job,
4 it ended otherwise, 5 the scheduler cannot be reached, 130 Ctrl-C."""

DEFAULT_INTERVAL_S = 2.0


def add_arguments(p) -> None:
    p.add_argument("job", nargs="?", metavar="JOB", help="the job (default: the most recent active one)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit (no live view)")
    p.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                   help=f"seconds between refreshes of the live view (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--json", action="store_true", dest="as_json", help="print one snapshot as JSON on stdout")


def run(args) -> int:
    import sys

    if not args.interval_s > 0:
        raise UsageError(f"--interval-s {args.interval_s}: expected a positive number of seconds")
    once = args.as_json or args.once or not sys.stdout.isatty()
    snap = watch_snapshot(args.job) if once else None
    code = None if once else watch_live(args.job, args.interval_s, ui.live_watch)
    if snap is None and code is None:
        if args.as_json:
            ui.print_json(None)
        ui.info("no active job to watch (name one: jobctl watch JOB; `jobctl history` lists them)")
        return EXIT_OK
    if not once:
        return code
    if args.as_json:
        ui.print_json(snap)
    else:
        ui.render_watch(snap)
    return EXIT_JOB_FAILED if snap["ended"] and not snap["completed"] else EXIT_OK
