"""Report how a job used GPU memory against its plan's prediction, per GPU and per rank, and
what each attempt of its chain ran and why it ended; optionally plot memory over time."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import EXIT_OK, UsageError
from jobctl.jobs.commands import job_report
from jobctl.jobs.memory import memory_series

HELP = "predicted vs measured GPU memory of a job, and its attempt chain (--plot PNG)"
EPILOG = """examples:
  jobctl report 12                      # per-GPU peaks vs the plan, the attempts and their failures
  jobctl report 12 --plot mem-12.png    # memory over time, one line per node/GPU (needs jobctl[plot])
  jobctl report 12 --json | jq '.gpus[] | .error_pct'

Measured: the GPU sampler's CSVs (gpu/node-<R>.csv: memory used as the driver reports it) and,
when the training script runs jobctl.hooks, memory/rank-<N>.jsonl (the allocator's
max_memory_reserved, compared with the prediction less its CUDA context term).
error % = (predicted - measured) / measured: positive means the plan over-predicted.
The largest measured peak of each attempt is recorded in the history (measured_peak_bytes).
exit codes: 0 ok (also when nothing was measured), 2 unknown job, or --plot without matplotlib."""


def add_arguments(p) -> None:
    p.add_argument("job", metavar="JOB", help="the job (12, #12, slurm:4242)")
    p.add_argument("--plot", metavar="OUT.png", help="draw GPU memory over time into this image file")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the report as JSON on stdout")


def run(args) -> int:
    from pathlib import Path

    from jobctl.ui.plot import import_pyplot, plot_memory

    if args.plot:
        import_pyplot()  # fail before any work when the optional extra is missing
        if not Path(args.plot).expanduser().resolve().parent.is_dir():
            raise UsageError(f"--plot {args.plot}: the folder {Path(args.plot).parent} does not exist")
    rep, samples = job_report(args.job)
    if args.plot:
        series = memory_series(samples)
        if series:
            plot_memory(series, rep["predicted_peak_bytes"], rep["gpu_usable_bytes"], Path(args.plot).expanduser(),
                        f"#{rep['id']} {rep['recipe']} ({rep['state']}): GPU memory vs the plan")
            rep["plot"] = str(args.plot)
    if args.as_json:
        ui.print_json(rep)
    else:
        ui.render_report(rep)
    if args.plot:
        ui.info(f"plot written to {args.plot}" if rep["plot"] else
                f"no plot written to {args.plot}: {rep['no_samples'] or 'no GPU samples'}")
    return EXIT_OK
