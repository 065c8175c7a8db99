"""A job's attempts: each one's failure, how it differs from the attempt before, and the
chain in one line ("#12 → #13 (OOM, mbs 4→2) → #14 RUNNING"). Shared by `watch` and `report`."""

from __future__ import annotations

from jobctl.jobs.memory import (
    error_pct,
    gpu_usage,
    hook_peaks,
    plan_memory,
    read_gpu_samples,
)
from jobctl.model import JobState
from jobctl.planner.ladder import Calibration
from jobctl.planner.plan import layout_text
from jobctl.runtime.outcome import job_failure, read_outcomes
from jobctl.store import folder as layout
from jobctl.store.folder import JobFolder

# How the attempt chain names a failure ("#12 → #13 (OOM, mbs 4→2)"): the classifier's
# kinds (runtime/classify.py FailureKind), then scheduler states for jobs without records.
FAILURE_WORDS = {
    "CUDA_OOM": "OOM", "HOST_OOM": "host OOM", "TIMEOUT": "timeout", "PREEMPTED": "preempted",
    "NODE_FAIL": "node failure", "NCCL": "NCCL error", "HARDWARE": "hardware fault", "HANG": "hang", "CANCELLED": "cancelled", "USER_ERROR": "error",
    # Slurm's OUT_OF_MEMORY is the cgroup's oom_kill counter: host memory (classify.py, rule 5)
    "OUT_OF_MEMORY": "host OOM", "FAILED": "failed", "BOOT_FAIL": "boot failure", "DEADLINE": "deadline",
    "SUBMIT_FAILED": "not submitted",
}
# Plan fields that the ladder changes, in the order the chain names them, with short names.
# grad_accum_steps is left out: it follows from micro_batch_size and dp (global batch kept).
PLAN_CHANGES = (("micro_batch_size", "mbs"), ("recompute", "recompute"), ("recompute_layers", "recompute layers"),
                ("offload", "offload"), ("sharding", "sharding"), ("tp", "tp"), ("pp", "pp"),
                ("virtual_stages", "vpp"), ("dp", "dp"), ("cp", "cp"), ("sequence_parallel", "sp"),
                ("nodes", "nodes"))


def folder_of(record) -> JobFolder | None:
    return JobFolder(record.job_folder) if record.job_folder else None


def failure_of(record) -> dict | None:
    """Why an attempt that did not complete ended: {"kind", "summary"}. The first node's
    verdict (successor.json / final.json), else the outcome records (outcome.job_failure),
    else the failure the history recorded, else its state. None for a job not ended, or completed."""
    if not record.terminal or record.state is JobState.COMPLETED:
        return None
    folder = folder_of(record)
    for name in (layout.SUCCESSOR, layout.FINAL):
        data = folder.read_json(name) if folder else None
        if data and isinstance(data.get("failure"), dict) and data["failure"].get("kind"):
            f = data["failure"]
            return {"kind": f["kind"], "summary": f.get("summary") or data.get("stopped")}
    failure = job_failure(read_outcomes(folder)) if folder else None
    if failure:
        return {"kind": failure.kind.value, "summary": failure.summary}
    if record.failure_kind is not None:
        return {"kind": record.failure_kind.value, "summary": record.detail}
    return {"kind": record.state.value, "summary": record.detail or (f"exit {record.exit_code}" if record.exit_code
                                                                      else None)}


def calibration_of(record, folder: JobFolder | None, final: dict | None = None) -> dict | None:
    """What the attempt's CUDA OOM taught the ladder: the history's record of it, else the
    first node's verdict (successor.json / final.json); None without one."""
    cal = record.extra.get("calibration") if hasattr(record, "extra") else None
    if cal:
        return cal
    for data in ((folder.successor() if folder else None), final):
        if isinstance(data, dict) and isinstance(data.get("calibration"), dict):
            return data["calibration"]
    return None


def plan_change(parent_plan: dict, child_plan: dict) -> str:
    """What the ladder changed between two plans, e.g. "mbs 4→2" or "recompute none→full, mbs 2→1"."""
    parts = []
    for key, word in PLAN_CHANGES:
        a, b = parent_plan.get(key), child_plan.get(key)
        if a != b and not (a is None or b is None):
            if isinstance(a, bool):
                a, b = ("on" if a else "off"), ("on" if b else "off")
            parts.append(f"{word} {a}→{b}")
    return ", ".join(parts)


def lineage(history, record) -> list:
    """The attempts that led to `record` and those that continued it (the newest retry of
    each), oldest first. A parent retried twice shows only the later retry."""
    chain = history.chain(record.id)
    by_id = {r.id: r for r in chain}
    path = [by_id.get(record.id, record)]
    while path[0].parent_id is not None and path[0].parent_id in by_id and len(path) <= len(chain):
        path.insert(0, by_id[path[0].parent_id])
    while len(path) <= len(chain):
        children = [r for r in chain if r.parent_id == path[-1].id]
        if not children:
            break
        path.append(max(children, key=lambda r: r.id))
    return path


def attempt(record, parent=None, *, measure: bool = False) -> dict:
    """One attempt as the chain shows it: state, plan summary, prediction, failure, and how it
    differs from the attempt before (`label`, e.g. "OOM, mbs 4→2"). With `measure`, also the
    measured peak: the sampler's largest figure, else the hooks' largest max_memory_reserved
    (whose error is against the prediction less its CUDA context term), and `measured_max_bytes`,
    the largest of all of them (what the history records)."""
    plan = record.plan
    folder = folder_of(record)
    mem = plan_memory(folder)
    predicted = record.predicted_peak_bytes or mem.get("predicted_peak_bytes")
    row = {
        "id": record.id, "attempt": record.attempt, "parent_id": record.parent_id, "state": record.state.value,
        "scheduler": record.scheduler, "scheduler_job_id": record.scheduler_job_id,
        "layout": layout_text(plan) if "tp" in plan and "sharding" in plan else None,
        "nodes": plan.get("nodes"), "gpus_per_node": plan.get("gpus_per_node"),
        "micro_batch_size": plan.get("micro_batch_size"), "predicted_peak_bytes": predicted,
        "gpu_usable_bytes": mem.get("gpu_usable_bytes"), "failure": failure_of(record), "label": None,
        "job_folder": record.job_folder,
    }
    if parent is not None:
        why = failure_of(parent)
        words = [FAILURE_WORDS.get(why["kind"], why["kind"].lower())] if why else []
        change = plan_change(parent.plan, plan)
        row["label"] = ", ".join(words + ([change] if change else [])) or None
    final = folder.read_json(layout.FINAL) if folder else None
    row["stopped"] = (final or {}).get("stopped")
    cal = calibration_of(record, folder, final)
    row["calibration"] = cal
    row["calibration_text"] = Calibration.from_dict(cal).summary() if cal else None
    row["progress"] = progress_text(record.extra.get("progress"))
    if measure:
        sampled = [g["peak_bytes"] for g in gpu_usage(read_gpu_samples(folder)) if g["peak_bytes"] is not None]
        hooked = [r["max_memory_reserved_bytes"] for r in hook_peaks(folder)[0]
                  if r["max_memory_reserved_bytes"] is not None]
        source = "sampler" if sampled else "hooks" if hooked else None
        peak = max(sampled or hooked) if source else None
        against = predicted - mem.get("cuda_context_bytes", 0) if predicted and source == "hooks" else predicted
        row.update(measured_peak_bytes=peak, measured_source=source, error_pct=error_pct(against, peak),
                   measured_max_bytes=max(sampled + hooked) if source else None)
    return row


def progress_text(progress) -> str | None:
    """"step 12, checkpoint of step 10": how far an attempt got (its outcome records, issue 30)."""
    if not isinstance(progress, dict):
        return None
    parts = [f"{what} {progress[key]}" for key, what in (("last_step", "step"), ("checkpoint_step", "checkpoint of step"))
             if isinstance(progress.get(key), int) and not isinstance(progress.get(key), bool)]
    return ", ".join(parts) or None


def chain_text(attempts: list[dict]) -> str:
    """"#12 → #13 (OOM, mbs 4→2) → #14 RUNNING": every attempt, how each differs from the one
    before, and the state of the last."""
    parts = []
    for i, a in enumerate(attempts):
        text = f"#{a['id']}"
        if i and a.get("label"):
            text += f" ({a['label']})"
        if i == len(attempts) - 1:
            text += f" {a['state']}"
        parts.append(text)
    return " → ".join(parts)


def attempts(records: list, *, measure: bool = False) -> list[dict]:
    """`attempt` for each record of a lineage, each against the one before it."""
    return [attempt(r, records[i - 1] if i else None, measure=measure) for i, r in enumerate(records)]
