"""Report how a job used GPU memory against its plan's prediction, per GPU and per rank, and
what each attempt of its chain ran and why it ended; optionally plot memory over time."""

from __future__ import annotations

from jobctl.errors import EXIT_OK

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

    from jobctl import ui
    from jobctl.cli.history import resolve
    from jobctl.errors import UsageError
    from jobctl.jobs.report import import_pyplot, memory_series, plot_memory
    from jobctl.store.history import History

    if args.plot:
        import_pyplot()  # fail before any work when the optional extra is missing
        if not Path(args.plot).expanduser().resolve().parent.is_dir():
            raise UsageError(f"--plot {args.plot}: the folder {Path(args.plot).parent} does not exist")
    with History.open() as history:
        (record,) = resolve(history, [args.job])
        from jobctl.remote import client as remote_jobs

        if remote_jobs.cluster_of(record):  # bring the local copy of its chain's folders up to date
            remote_jobs.sync(history, [r for r in history.chain(record.id) if r.scheduler_job_id])
            record = history.get(record.id)
        rep, samples = build(history, record)
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


def build(history, record) -> tuple[dict, list]:
    """The report of one job (the object --json prints) and its GPU samples (for the plot).
    Records each attempt's measured peak in the history on the way."""
    from jobctl.jobs.report import (
        attempts,
        chain_text,
        error_pct,
        folder_of,
        gpu_usage,
        hook_peaks,
        lineage,
        plan_memory,
        read_gpu_samples,
        sampler_notes,
    )
    from jobctl.store.history import sync_measured_peak

    records = lineage(history, record)
    states_note = _refresh(history, records)
    records = [history.get(r.id) for r in records]
    record = history.get(record.id)
    chain = attempts(records, measure=True)
    for a, r in zip(chain, records):
        sync_measured_peak(history, r, [a["measured_max_bytes"]])

    folder = folder_of(record)
    mem = plan_memory(folder)
    predicted = record.predicted_peak_bytes or mem.get("predicted_peak_bytes")
    usable = mem.get("gpu_usable_bytes")
    samples = read_gpu_samples(folder)
    gpus = gpu_usage(samples)
    for g in gpus:
        g["error_pct"] = error_pct(predicted, g["peak_bytes"])
        g["usable_pct"] = round(g["peak_bytes"] / usable * 100, 2) if usable and g["peak_bytes"] is not None else None
    ranks, hooks_off = hook_peaks(folder)
    # The allocator's figures leave out the CUDA context, which the prediction includes.
    predicted_alloc = predicted - mem.get("cuda_context_bytes", 0) if predicted else None
    for r in ranks:
        r["error_pct"] = error_pct(predicted_alloc, r["max_memory_reserved_bytes"])
    peaked = [g for g in gpus if g["peak_bytes"] is not None]
    top = max(peaked, key=lambda g: g["peak_bytes"], default=None)
    if top is not None:
        measured = {"bytes": top["peak_bytes"], "source": "sampler", "where": f"node {top['node']} gpu {top['gpu']}",
                    "error_pct": error_pct(predicted, top["peak_bytes"])}
    elif ranks and any(r["max_memory_reserved_bytes"] for r in ranks):
        r = max(ranks, key=lambda r: r["max_memory_reserved_bytes"] or 0)
        measured = {"bytes": r["max_memory_reserved_bytes"], "source": "hooks", "where": f"rank {r['rank']}",
                    "error_pct": r["error_pct"]}
    else:
        measured = None
    no_samples = None
    if not gpus:
        notes = sampler_notes(folder)
        no_samples = ("no GPU samples: " + ("; ".join(notes) if notes else
                      "the job folder has no sampler CSV (gpu/node-<R>.csv)" if folder else "the job has no folder"))
    plan = record.plan
    return {
        "id": record.id, "recipe": record.recipe_name, "cluster": record.cluster, "partition": record.partition,
        "state": record.state.value, "states_note": states_note, "gpu": mem.get("gpu"),
        "layout": chain[[a["id"] for a in chain].index(record.id)]["layout"],
        "nodes": plan.get("nodes"), "gpus_per_node": plan.get("gpus_per_node"),
        "predicted_peak_bytes": predicted, "gpu_usable_bytes": usable,
        "predicted_allocator_bytes": predicted_alloc if ranks else None,
        "measured_peak": measured, "gpus": gpus, "ranks": ranks, "hooks_off": hooks_off,
        "no_samples": no_samples, "chain": chain, "chain_text": chain_text(chain), "plot": None,
        "job_folder": record.job_folder,
    }, samples


def _refresh(history, records) -> str | None:
    """Fresh states for unfinished attempts (one query); a report still works without them."""
    from jobctl.cli.status import refresh_live
    from jobctl.errors import SchedulerError

    try:
        refresh_live(history, records)
    except SchedulerError as e:
        return f"states as recorded: the scheduler could not be asked ({e.message})"
    return None
