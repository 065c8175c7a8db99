"""Following jobs until they end: `wait_for` (submit --wait), the attempt that continued a
failed one (`successor`), and `Watcher`, the live view of one job's chain (`jobctl watch`).
Lines for people go to the `say` callable the command gives; nothing here prints."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime, timezone

from jobctl.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED, EXIT_OK, SchedulerError
from jobctl.jobs import placement
from jobctl.jobs.attempts import attempts, chain_text, folder_of, lineage
from jobctl.jobs.memory import SamplerTail, plan_memory, sampler_notes
from jobctl.jobs.status import job_row, refresh, refresh_live, resolve, sync_copies
from jobctl.model import JobState, JobStatus, RetryAction, RetryPolicy
from jobctl.runtime.outcome import job_failure, read_outcomes
from jobctl.store import folder as layout
from jobctl.store.history import UnknownJobError

# After an attempt fails, its first node waits for the other nodes' outcome records
# (runtime/outcome.OUTCOME_WAIT_S), plans the next attempt and submits it: wait that long, and a minute more.
RECOVERY_WAIT_S = 180.0


def successor(history, record, grace_s: float = 5.0) -> int | None:
    """The job that continued `record` after a failure (the OOM ladder), if any: from
    successor.json in its folder (the folder is the source of truth; the first node writes it
    after submitting), else from the history. Waits briefly for the file right after the end;
    the folder of a remote job is a copy, brought up to date while waiting."""
    folder = folder_of(record)
    remote = placement.is_remote(record)
    deadline = time.monotonic() + grace_s
    asked = False
    while folder is not None:
        nxt = folder.successor()
        if nxt is not None and isinstance(nxt.get("jobctl_id"), int):
            return nxt["jobctl_id"]
        if folder.exists(layout.FINAL) or not folder.exists(layout.JOB):
            break
        if remote and (not asked or time.monotonic() <= deadline):
            # the folder is a copy: the first node may have written its verdict since it was made
            sync_copies(history, [record])
            asked = True
            if folder.exists(layout.SUCCESSOR) or folder.exists(layout.FINAL):
                continue
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    children = [r for r in history.chain(record.id) if r.parent_id == record.id]
    return children[-1].id if children else None


def wait_for(results, history, say: Callable[[str], None] | None = None, poll_s: float = 1.0,
             max_poll_s: float = 10.0) -> int:
    """Poll until every job ends, following each OOM chain to its last attempt; `say` gets the
    first node's log as it grows and how each job ended. EXIT_OK if all completed, else
    EXIT_JOB_FAILED."""
    ids = [r["id"] for r in results]
    offsets: dict[int, int] = {}
    requeue_seen: dict[int, float] = {}
    delay = poll_s
    while True:
        records = [history.get(i) for i in ids]
        # a run Slurm ended NODE_FAIL/PREEMPTED is asked about again: its job may be requeued
        live = [r for r in records if not r.terminal or _requeue_pending(r.id, r, requeue_seen)]
        current = refresh(history, live) if live else {}
        for i in [i for i in requeue_seen if i in current]:
            _requeue_pending(i, current[i], requeue_seen)  # back in the queue: no longer looked for
        for r in records:  # ended in the history (the job's first node records FAILED itself)
            if r.terminal:
                current.setdefault(r.id, JobStatus(r.state, r.exit_code, r.ending))
        if say is not None:
            for r in records:
                _pump_log(r, offsets, say, prefix=f"#{r.id} | " if len(ids) > 1 else "")
        done = [i for i in ids if current.get(i) and current[i].state.terminal
                and not _requeue_pending(i, current[i], requeue_seen)]
        # follow attempt chains: a failed job whose first node submitted a successor
        moved = False
        for i in done:
            if current[i].state is not JobState.COMPLETED:
                nxt = successor(history, history.get(i))
                if nxt is not None:
                    if say:
                        say(f"#{i}: {current[i].state}, continued as #{nxt}")
                    ids[ids.index(i)] = nxt
                    moved = True
        if moved:
            continue
        if len(done) == len(ids):
            if say:
                for i in ids:
                    say(f"#{i}: {current[i].state}" + (f" ({current[i].reason})" if current[i].reason else ""))
            return EXIT_OK if all(current[i].state is JobState.COMPLETED for i in ids) else EXIT_JOB_FAILED
        time.sleep(delay)
        # a requeue being looked for: look often (the requeued job waits only a few seconds)
        delay = poll_s if requeue_seen else min(max_poll_s, delay * 1.5)


# A run that Slurm ended NODE_FAIL or PREEMPTED comes back as the same job (requeued): its next
# run shows in accounting a moment later. This long, a job in such a state is followed on.
REQUEUE_GRACE_S = float(os.environ.get("JOBCTL_REQUEUE_GRACE_S", "60"))


def _requeue_pending(job_id: int, status: JobStatus, seen: dict[int, float]) -> bool:
    """Whether a job just ended by the scheduler may still come back requeued (keep watching)."""
    if status.state not in (JobState.NODE_FAIL, JobState.PREEMPTED):
        seen.pop(job_id, None)
        return False
    first = seen.setdefault(job_id, time.monotonic())
    return time.monotonic() - first < REQUEUE_GRACE_S


def _pump_log(record, offsets: dict, say, prefix: str) -> None:
    folder = folder_of(record)
    log = folder.log(0) if folder else None
    if log is None or not log.exists():
        return
    with open(log, "rb") as f:
        f.seek(offsets.get(record.id, 0))
        chunk = f.read()
        offsets[record.id] = f.tell()
    for line in chunk.decode("utf-8", "replace").splitlines():
        say(prefix + line)


# --- the live view ------------------------------------------------------------------------------

def pick(history, ref: str | None):
    """The named job; without a name the newest job still active after asking the scheduler."""
    if ref is not None:
        return resolve(history, [ref])[0]
    active = history.active()
    refresh_live(history, active)
    still = [r for r in (history.get(r.id) for r in active) if not r.terminal]
    return max(still, key=lambda r: r.id) if still else None


def follow(history, record, interval_s: float, show, sleep=time.sleep, clock=time.monotonic) -> int:
    """Show a snapshot every `interval_s` until the chain ends: EXIT_OK if it ended COMPLETED,
    else EXIT_JOB_FAILED; EXIT_INTERRUPTED on Ctrl-C (quietly: the last view stays)."""
    watcher = Watcher(history, record, clock=clock, tolerate_scheduler_errors=True)
    try:
        while True:
            snap = watcher.poll()
            show(snap)
            if snap["ended"]:
                return EXIT_OK if snap["completed"] else EXIT_JOB_FAILED
            sleep(interval_s)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


class Watcher:
    """One job's view, refreshed by `poll`: follows the chain to its newest attempt and keeps
    the sampler CSVs' read offsets of the attempt it shows."""

    def __init__(self, history, record, clock=time.monotonic, tolerate_scheduler_errors: bool = False):
        self.history = history
        self.tolerate = tolerate_scheduler_errors  # live: a slow sacct must not end the view
        self.start_id = record.id
        self.tip = record
        self._clock = clock
        self._tail = None
        self._failed_at: float | None = None  # when the tip was first seen failed with no successor

    def poll(self) -> dict:
        """Ask the scheduler about the chain's unfinished attempts (one query), move to the
        newest attempt, and return the snapshot (the object `--json` prints)."""
        tip = self._newest(self.history.get(self.tip.id))
        scheduler_error = None
        try:
            current = refresh_live(self.history, lineage(self.history, tip))
        except SchedulerError as e:
            if not self.tolerate:
                raise
            current, scheduler_error = {}, f"{e.message}; showing the recorded states, asking again"
        # A failure seen just now may already have a successor: show it at once (the
        # scheduler is asked about it on the next poll; until then its recorded state).
        tip = self._newest(self.history.get(tip.id))
        if tip.id != self.tip.id:
            self._tail, self._failed_at = None, None
        self.tip = tip
        chain = attempts(lineage(self.history, tip))
        recovering = self._recovering(tip)
        ended = (tip.terminal and not recovering) or (tip.state is JobState.PREPARED and not tip.scheduler_job_id)
        return {
            "watching": self.start_id,
            "job": job_row(self.history, tip, current.get(tip.id)),
            "chain": chain,
            "chain_text": chain_text(chain),
            "memory": self._memory(tip),
            "recovering": recovering,
            "ended": ended,
            "completed": tip.state is JobState.COMPLETED,
            "scheduler_error": scheduler_error,
        }

    def _newest(self, record):
        """Follow failed attempts to the attempt their first node submitted (successor)."""
        seen = {record.id}
        while record.terminal and record.state is not JobState.COMPLETED:
            nxt = successor(self.history, record, grace_s=0)
            if nxt is None or nxt in seen:
                break
            try:
                record = self.history.get(nxt)
            except UnknownJobError:  # submitted into another history (JOBCTL_HOME differs)
                break
            seen.add(record.id)
        return record

    def _recovering(self, tip) -> bool:
        """Whether a failed attempt's first node may still submit the next one: its outcome
        says the ladder applies and neither successor.json nor final.json exists yet (bounded
        by RECOVERY_WAIT_S from when the failure was first seen)."""
        if not tip.terminal or tip.state in (JobState.COMPLETED, JobState.CANCELLED) or not pending_recovery(tip):
            return False
        now = self._clock()
        if self._failed_at is None:
            # Counted from the recorded end when there is one: an attempt that failed long
            # ago and left neither file never will.
            ended = _age_s(tip.ended_at)
            self._failed_at = now - (ended or 0.0)
        return now - self._failed_at < RECOVERY_WAIT_S

    def _memory(self, tip) -> dict:
        folder = folder_of(tip)
        if self._tail is None:
            self._tail = SamplerTail(folder)
        gpus = self._tail.update()
        mem = plan_memory(folder)
        predicted = tip.predicted_peak_bytes or mem.get("predicted_peak_bytes")
        nodes = []
        for node in sorted({g["node"] for g in gpus}):
            mine = [g for g in gpus if g["node"] == node]
            latest = [g["latest_bytes"] for g in mine if g["latest_bytes"] is not None]
            peak = max((g for g in mine if g["peak_bytes"] is not None), key=lambda g: g["peak_bytes"], default=None)
            nodes.append({"node": node, "gpus": mine, "gpu_count": len(mine),
                          "latest_max_bytes": max(latest) if latest else None,
                          "latest_at": max((g["latest_at"] for g in mine if g["latest_at"]), default=None),
                          "peak_bytes": peak["peak_bytes"] if peak else None,
                          "peak_gpu": peak["gpu"] if peak else None})
        why = None
        if not gpus:
            notes = sampler_notes(folder)
            why = "no GPU samples" + (f" ({'; '.join(notes)})" if notes else
                                      " yet" if not tip.terminal else "")
        return {"predicted_peak_bytes": predicted, "gpu_usable_bytes": mem.get("gpu_usable_bytes"),
                "nodes": nodes, "no_samples": why}


def pending_recovery(record) -> bool:
    """Whether the first node of a failed job is, by its folder, about to submit a successor."""
    folder = folder_of(record)
    if folder is None or not folder.exists(layout.JOB) or folder.recovery_decided():
        return False
    records = [o for o in read_outcomes(folder) if o.failure is not None]
    if not any(o.node_rank == 0 for o in records):  # the first node recovers, after its record
        return False
    failure = job_failure(records)
    if failure is None:
        return False
    policy = RetryPolicy.from_dict((folder.read_json(layout.JOB) or {}).get("policy"))
    return policy.action(failure.kind) is RetryAction.LADDER


def _age_s(iso: str | None) -> float | None:
    """Seconds since a history timestamp (UTC ISO); None when there is none."""
    if not iso:
        return None
    try:
        return max(0.0, (datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds())
    except ValueError:
        return None
