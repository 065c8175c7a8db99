"""Recovery without anyone watching: after a run ends, each node writes an outcome record;
after a CUDA out-of-memory failure the first node asks the OOM ladder for the next plan and
submits it as a new job, with the same global batch and the parent recorded, up to the
attempt limit. The job folder keeps the lineage (successor.json) for the history to sync.
`next_submission` builds that next attempt from the job folder; `jobctl requeue` uses it too."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from jobctl.errors import InfeasibleError

OUTCOME_WAIT_S = 120.0  # how long the first node waits for the other nodes' outcome records
LOG_TAIL_BYTES = 4 << 20  # the classifier reads the end of each node's log


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def write_outcome(folder: Path, rank: int, exit_code: int | None, signal: int | None, duration_s: float,
                  argv: list[str], job_id: str, sampler_csv: Path | None) -> dict:
    """The node's outcome record: exit, signal, duration, peak GPU memory per GPU, and the
    failure classification of its log."""
    from jobctl.runtime.classify import classify

    peaks: dict = {}
    if sampler_csv is not None and sampler_csv.exists():
        try:
            from jobctl.runtime.sampler import peak_memory_by_gpu

            peaks = {str(k): int(v) for k, v in peak_memory_by_gpu(sampler_csv).items()}
        except Exception:  # a torn last line must not cost the outcome record
            peaks = {}
    failure = classify(exit_code, signal=signal, log_text=read_tail(folder / "logs" / f"node-{rank}.log"))
    oom = getattr(failure, "oom", None)
    record = {
        "node_rank": rank, "exit_code": exit_code, "signal": signal, "duration_s": round(duration_s, 3),
        "job_id": job_id, "argv": argv, "peak_memory_bytes_by_gpu": peaks,
        "failure": {"kind": str(failure.kind.value if hasattr(failure.kind, "value") else failure.kind),
                    "summary": failure.summary, "evidence": failure.evidence, "retry": failure.retry,
                    "oom": _oom_dict(oom)},
    }
    tmp = folder / f".outcome-node{rank}.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(folder / f"outcome-node{rank}.json")
    return record


def _oom_dict(oom) -> dict | None:
    if oom is None:
        return None
    keys = ("tried_to_allocate_bytes", "total_capacity_bytes", "free_bytes", "allocated_by_pytorch_bytes",
            "reserved_unallocated_bytes", "gpu_index")
    return {k: getattr(oom, k, None) for k in keys}


def wait_for_outcomes(folder: Path, nodes: int, timeout_s: float = OUTCOME_WAIT_S) -> list[dict]:
    """The outcome records of all nodes (those that arrive within the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = sorted(folder.glob("outcome-node*.json"))
        if len(found) >= nodes or time.monotonic() > deadline:
            return read_outcomes(folder)
        time.sleep(1.0)


def read_outcomes(folder: Path) -> list[dict]:
    """The outcome records in a job folder now (unreadable ones skipped)."""
    out = []
    for p in sorted(folder.glob("outcome-node*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            pass
    return out


def job_failure(outcomes: list[dict]) -> dict | None:
    """The job's failure: a CUDA OOM on any node wins (the other ranks then fail in NCCL)."""
    failed = [o for o in outcomes if o["failure"]["kind"] != "COMPLETED"]
    if not failed:
        return None
    for kind in ("CUDA_OOM", "HOST_OOM", "NCCL", "NODE_FAIL", "TIMEOUT", "PREEMPTED"):
        for o in failed:
            if o["failure"]["kind"] == kind:
                return o["failure"] | {"node_rank": o["node_rank"]}
    return failed[0]["failure"] | {"node_rank": failed[0]["node_rank"]}


def recover(folder: Path, outcomes: list[dict]) -> dict | None:
    """After a failure classified for the ladder, submit the next plan as a new job.
    Returns what was done (also written to successor.json or final.json)."""
    job = json.loads((folder / "job.json").read_text())
    failure = job_failure(outcomes)
    _record(job, failure, outcomes)
    if failure is None:
        return None
    policy = job.get("policy") or {}
    action = (policy.get("retry") or {}).get(failure["kind"], failure.get("retry", "none"))
    if action != "ladder":
        return _final(folder, f"{failure['kind']}: not retried ({failure['summary']})", failure)
    attempt, max_attempts = int(job.get("attempt", 1)), int(policy.get("max_attempts", 3))
    if attempt >= max_attempts:
        return _final(folder, f"CUDA out of memory on attempt {attempt} of {max_attempts}: giving up "
                              f"(raise --max-attempts to allow more)", failure)
    try:
        step = next_submission(folder, job, failure_figures(job, outcomes), smaller=True)
    except InfeasibleError:
        return _final(folder, "CUDA out of memory and nothing smaller fits on this partition "
                              "(the ladder ended)", failure)
    from jobctl.store.history import History
    from jobctl.jobs.submission import submit_all

    with History.open(job.get("history_path")) as history:
        (res,) = submit_all([step.submission], history)
    out = step.summary(res) | {"failure": failure}
    (folder / "successor.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def _record(job: dict, failure: dict | None, outcomes: list[dict]) -> None:
    """Tell the history what the job folder knows: the measured peak, and the failure's kind
    as the exit reason (so `jobctl plan` can warn about layouts that ran out of memory).
    Best effort: the folder stays the source of truth when the history is out of reach."""
    peaks = [v for o in outcomes for v in (o.get("peak_memory_bytes_by_gpu") or {}).values()]
    path = job.get("history_path")
    if not path or not Path(path).exists():
        return
    try:
        from jobctl.store.history import History

        with History.open(path) as history:
            if peaks:
                history.set_measured_peak(int(job["jobctl_id"]), int(max(peaks)))
            if failure is not None and failure["kind"] == "CUDA_OOM":
                # Other endings (a cancel kills the command too) are left to the scheduler's word.
                history.transition(int(job["jobctl_id"]), "FAILED", detail=failure.get("summary"),
                                   exit_reason=failure["kind"])
    except Exception:  # the history is a mirror: never let it cost the recovery
        pass


def failure_figures(job: dict, outcomes: list[dict]) -> dict:
    """What the ladder learns from a run's outcome records: the OOM message's figures (when
    the failure was a CUDA OOM), the highest GPU memory peak measured on any node, and the
    partition. Unknown figures are left out."""
    failure = job_failure(outcomes) or {}
    peaks = [v for o in outcomes for v in (o.get("peak_memory_bytes_by_gpu") or {}).values()]
    oom = failure.get("oom") or {}
    info = {"tried_to_allocate_bytes": oom.get("tried_to_allocate_bytes"),
            "total_capacity_bytes": oom.get("total_capacity_bytes"), "free_bytes": oom.get("free_bytes"),
            "measured_peak_bytes": max(peaks) if peaks else None, "partition": job.get("partition")}
    return {k: v for k, v in info.items() if v is not None}


def _final(folder: Path, reason: str, failure: dict) -> dict:
    out = {"stopped": reason, "failure": failure}
    (folder / "final.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


@dataclass
class NextAttempt:
    """The job that continues a finished or failed one: its submission and, when it stepped
    down the OOM ladder, which rung and why."""

    submission: object  # submit.Submission, parent and attempt set
    rung: str | None = None
    reason: str | None = None

    def summary(self, res: dict) -> dict:
        """What was submitted (a submit_all result), as successor.json and `requeue --json` show it."""
        sub = self.submission
        return {"jobctl_id": res["id"], "scheduler_job_id": res["scheduler_job_id"], "job_folder": res["job_folder"],
                "parent_id": sub.parent_id, "attempt": sub.attempt, "rung": self.rung, "reason": self.reason,
                "plan": sub.plan.to_dict()}


def next_submission(folder: Path, job: dict, info: dict | None = None, *, smaller: bool = True) -> NextAttempt:
    """The next attempt of the job in `folder` (job.json read into `job`), not yet submitted:
    its recipe, inventory and plan come from the folder; with `smaller`, the plan is the OOM
    ladder's next one (global batch kept) given the failure figures `info`, else the same plan.
    The parent and attempt + 1 are set. InfeasibleError when nothing smaller fits.

    Shared by the in-job recovery (`recover`) and `jobctl requeue`."""
    from jobctl.config import loader as config
    from jobctl.config import schema
    from jobctl.planning import after_oom
    from jobctl.jobs.submission import prepare

    recipe_data = json.loads((folder / "recipe.json").read_text())
    inv_data = json.loads((folder / "inventory.json").read_text())
    rec = config.Loaded(job.get("recipe_path") or str(folder / "recipe.yaml"),
                        schema.Recipe.model_validate(recipe_data), recipe_data, None, {})
    inv = config.Loaded(str(folder / "inventory.yaml"), schema.Inventory.model_validate(inv_data), inv_data, None, {})
    report = json.loads((folder / "plan.json").read_text())
    rung = reason = None
    if smaller:
        figures = {"partition": job.get("partition"), **(info or {})}
        result = after_oom(rec, inv, report["plan"], {k: v for k, v in figures.items() if v is not None})
        if not result.feasible:
            raise InfeasibleError(result.data["reasons"][0],
                                  hint="give the job more GPUs (resources.max_nodes, a larger partition) "
                                       "or a shorter sequence, then submit it again")
        report = result.data
        lad = report.get("ladder") or {}
        rung, reason = lad.get("rung"), lad.get("reason")
    sub = prepare(rec, inv, report, job.get("overrides") or [])
    sub.parent_id = int(job["jobctl_id"])
    sub.policy = dict(job.get("policy") or sub.policy)
    sub.attempt = int(job.get("attempt", 1)) + 1
    sub.cwd = job.get("cwd")  # the same directory as the first attempt (a synced working tree)
    return NextAttempt(sub, rung, reason)
