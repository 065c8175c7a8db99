"""How one node's run ended, as a record in the job folder (outcome-node<R>.json), and the job's
failure read from all of them. Written by the runner on every node; read by the first node's
recovery, by `watch`, `report` and the local backend."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from jobctl.model import Failure, FailureKind, Outcome
from jobctl.runtime.classify import classify
from jobctl.store.folder import JobFolder

OUTCOME_WAIT_S = 120.0  # how long the first node waits for the other nodes' outcome records
LOG_TAIL_BYTES = 4 << 20  # the classifier reads the end of each node's log
# When several nodes failed, the job's failure is the first kind here that any node saw: an
# OOM anywhere is the cause (the other ranks then fail in NCCL or are killed).
PRECEDENCE = (FailureKind.CUDA_OOM, FailureKind.HOST_OOM, FailureKind.HARDWARE, FailureKind.NCCL, FailureKind.NODE_FAIL,
              FailureKind.TIMEOUT, FailureKind.PREEMPTED)


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_outcomes(folder: JobFolder) -> list[Outcome]:
    """The nodes' outcome records in `folder`, by node; unreadable or damaged ones are left out
    (as a node that wrote none)."""
    return Outcome.all_valid(folder.outcomes(), str(folder.path))


def write_outcome(folder: JobFolder, rank: int, exit_code: int | None, signal: int | None, duration_s: float,
                  argv: list[str], job_id: str, failure: Failure | None = None, **more) -> Outcome:
    """The node's outcome record: exit, signal, duration, peak GPU memory per GPU (from its
    sampler's CSV), and the failure classification of its log -- or `failure`, a verdict the
    runner made itself (a hang it stopped); `more`: the node's name and progress (Outcome's
    host, last_step, checkpoint_step)."""
    peaks: dict = {}
    csv = folder.sampler_csv(rank)
    if csv.exists():
        try:
            from jobctl.runtime.sampler import peak_memory_by_gpu

            peaks = {str(k): int(v) for k, v in peak_memory_by_gpu(csv).items()}
        except Exception:  # a torn last line must not cost the outcome record
            peaks = {}
    if failure is None:
        failure = classify(exit_code, signal=signal, log_text=read_tail(folder.log(rank)))
    record = Outcome(rank, exit_code, signal, round(duration_s, 3), job_id, tuple(argv), peaks, failure, **more)
    save_outcome(folder, record)
    return record


def save_outcome(folder: JobFolder, record: Outcome) -> None:
    folder.write_json(folder.outcome_path(record.node_rank).name, record.to_dict())


def wait_for_outcomes(folder: JobFolder, nodes: int, timeout_s: float = OUTCOME_WAIT_S) -> list[Outcome]:
    """The outcome records of all nodes (those that arrive within the timeout)."""
    deadline = time.monotonic() + timeout_s
    while folder.outcome_count() < nodes and time.monotonic() <= deadline:
        time.sleep(1.0)
    return read_outcomes(folder)


def job_failure(outcomes: list[Outcome]) -> Failure | None:
    """The job's failure (with the node that had it), or None when every node completed. A
    CUDA OOM on any node wins (PRECEDENCE)."""
    failed = [o for o in outcomes if o.failure is not None and o.failure.kind is not FailureKind.COMPLETED]
    if not failed:
        return None
    for kind in PRECEDENCE:
        for o in failed:
            if o.failure.kind is kind:
                return replace(o.failure, node_rank=o.node_rank)
    return replace(failed[0].failure, node_rank=failed[0].node_rank)


def measured_peaks(outcomes: list[Outcome]) -> list[int]:
    """Every GPU's peak memory the samplers saw, on every node."""
    return [v for o in outcomes for v in o.peak_memory_bytes_by_gpu.values()]
