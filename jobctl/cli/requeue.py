"""Submit a job again as a new attempt, with its parent recorded: the same plan, or with
--smaller the OOM ladder's next plan (the global batch kept), as the job itself would after
a CUDA out-of-memory. Everything comes from the job's folder; the failure figures too."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import UsageError
from jobctl.jobs.commands import requeue_job

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
exit codes: 0 submitted (with --wait: completed), 2 unknown job or bad option, 3 nothing smaller
fits, 4 with --wait: the job failed, 5 the scheduler refused or cannot be reached."""


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
    if args.tried_to_allocate is not None:
        if not args.smaller:
            raise UsageError("--tried-to-allocate goes with --smaller", hint="jobctl requeue JOB --smaller "
                             "--tried-to-allocate GIB")
        if not 0 < args.tried_to_allocate < 1 << 20:
            raise UsageError(f"--tried-to-allocate: expected a positive size in GiB, got {args.tried_to_allocate}")
    tried = None if args.tried_to_allocate is None else int(args.tried_to_allocate * (1 << 30))
    out, code = requeue_job(args.job, smaller=args.smaller, tried_to_allocate_bytes=tried, wait=args.wait,
                            say=None if args.as_json else ui.info)
    if args.as_json:
        ui.print_json(out)
    elif not args.wait:
        ui.line(f"#{out['jobctl_id']}\t{out['scheduler_job_id']}\t{out['job_folder']}")
    return code
