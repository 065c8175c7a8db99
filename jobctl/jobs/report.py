"""A job's report: predicted vs measured GPU memory per GPU and per rank, and what each
attempt of its chain ran and why it ended (the object `jobctl report --json` prints)."""

from __future__ import annotations

from jobctl.errors import SchedulerError
from jobctl.jobs.attempts import attempts, chain_text, folder_of, lineage
from jobctl.jobs.memory import (
    error_pct,
    gpu_usage,
    hook_peaks,
    plan_memory,
    read_gpu_samples,
    sampler_notes,
)
from jobctl.jobs.status import refresh_live, sync_copies
from jobctl.store.history import sync_measured_peak


def build(history, record) -> tuple[dict, list]:
    """The report of one job and its GPU samples (for the plot). The local copies of a remote
    chain's folders are brought up to date first; each attempt's measured peak is recorded in
    the history on the way."""
    sync_copies(history, [r for r in history.chain(record.id) if r.scheduler_job_id])
    record = history.get(record.id)
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
    try:
        refresh_live(history, records)
    except SchedulerError as e:
        return f"states as recorded: the scheduler could not be asked ({e.message})"
    return None
