"""How jobs are doing: one query per backend for many jobs (local, Slurm and remote alike),
every change recorded in the history; job references and the rows `status`, `history`,
`watch` and `--json` show."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from jobctl.backends.local import start_time
from jobctl.errors import SchedulerError, UsageError
from jobctl.jobs import mirror, placement
from jobctl.model import NODE_NAME, FailureKind, JobState, JobStatus, Scheduler
from jobctl.store import folder as layout
from jobctl.store.folder import JobFolder
from jobctl.store.history import UnknownJobError


def refresh(history, records) -> dict[int, JobStatus]:
    """Ask each backend once about `records` and record what changed; {jobctl id: JobStatus}."""
    current: dict[int, JobStatus] = {}
    for backend, group in placement.by_backend([r for r in records if r.scheduler_job_id]):
        if placement.is_remote(group[0]):  # the login node's word, its new attempts too: recorded there
            current.update(mirror.refresh(history, backend, group))
            continue
        answers = backend.refresh(group)
        for r in group:
            st = answers.get(r.scheduler_job_id)
            if st is None:
                continue
            current[r.id] = st
            if _record_earlier_runs(history, r, st):
                r = history.get(r.id)
            _keep_off_failed_nodes(history, r, st, backend)
            if st.state != r.state:
                # expect: only from the state this decision saw (the job may have recorded its own
                # verdict since `records` were read, and sacct can lag it)
                failed = st.state.terminal and st.state is not JobState.COMPLETED
                # when it happened, as the scheduler says (not when we looked): a job first seen
                # RUNNING 6 s after it started and cancelled then showed 0.4 s elapsed
                at = _aware(st.start) if st.state is JobState.RUNNING else _aware(st.end) if st.state.terminal else None
                history.transition(r.id, st.state, st.reason, at=at, exit_code=st.exit_code if failed else None,
                                   failure_kind=st.failure_kind if failed else None,
                                   detail=st.detail if failed else None, expect=r.state)
    return current


RECONCILE_AFTER_S = 20.0  # a younger PREPARED row may be a submission still talking to sbatch
GIVE_UP_AFTER_S = 600.0  # an older one that Slurm does not know was never made


def reconcile(history, records, now: datetime | None = None) -> list[int]:
    """Jobs left PREPARED because the scheduler's answer was lost (sbatch timed out, or jobctl
    was killed while it submitted): found where they run (Slurm: by the comment each submission
    carries; this machine: by the job folder its controller was given) and recorded as
    submitted; or, once old enough and still not found, recorded as never made. Returns the ids
    whose row changed. Never submits anything."""
    now = now or datetime.now(timezone.utc)

    def age(r) -> float:
        return (now - datetime.fromisoformat(r.created_at)).total_seconds()

    after = float(os.environ.get("JOBCTL_RECONCILE_AFTER_S", RECONCILE_AFTER_S))
    lost = [r for r in records if r.state is JobState.PREPARED and not r.scheduler_job_id
            and not placement.is_remote(r) and age(r) > after]
    changed = []
    for scheduler in (Scheduler.SLURM, Scheduler.LOCAL):
        calls: dict[tuple, list] = {}
        for r in lost:
            extra = json.loads(r.extra_json or "{}")
            if r.scheduler == scheduler.value and extra.get("sbatch_call"):
                calls.setdefault(tuple(extra["sbatch_call"]), []).append((r, int(extra.get("sbatch_index") or 0)))
        if calls:
            changed += _reconcile_calls(history, scheduler, calls, age)
    return changed


def _reconcile_calls(history, scheduler: Scheduler, calls: dict, age) -> list[int]:
    found = placement.backend(scheduler).find(list(calls))
    changed = []
    for call, members in calls.items():
        ids = found.get(call) or []
        for r, index in members:
            if ids and index < len(ids):
                history.mark_submitted(r.id, ids[index], call[index])  # found where it runs: SUBMITTED
                if scheduler is Scheduler.LOCAL:
                    _record_local_controller(call[index], ids[index])
                changed.append(r.id)
            elif not ids and age(r) > GIVE_UP_AFTER_S:
                history.mark_submit_failed(r.id, "the scheduler's answer was lost and no job of this submission "
                                                 f"was found ({'by its comment at Slurm' if scheduler is Scheduler.SLURM else 'by its folder on this machine'}): it was never made")
                changed.append(r.id)
    return changed


def _record_local_controller(folder: str, job_id: str) -> None:
    """What a local submission writes once the controller runs (submitit.json), for a job
    found after the fact: cancel and status name the process by pid and start time."""
    f = JobFolder(folder)
    if not f.scheduler_meta():
        f.write_json(layout.SCHEDULER, {"job_id": job_id, "submitit_folder": folder,
                                        "controller_start": start_time(int(job_id))})


def _record_earlier_runs(history, record, st: JobStatus) -> bool:
    """A run the scheduler ended and requeued between two looks (NODE_FAIL, PREEMPTED): recorded
    at its end time, once, so that the history says a node failed although the job is now
    PENDING again."""
    if not st.earlier:
        return False
    recorded = False
    seen = {(t.state, (t.at or "")[:19]) for t in history.transitions(record.id)}
    for run in st.earlier:
        if not run.state.terminal or run.state is JobState.COMPLETED:
            continue
        end = _aware(run.end)
        at_text = _iso(end)
        if (run.state, (at_text or "")[:19]) in seen:
            continue
        recorded |= history.transition(record.id, run.state,
                                       f"on {run.nodes or 'its nodes'}; the scheduler requeued the job", at=end)
    return recorded


def _keep_off_failed_nodes(history, record, st: JobStatus, backend) -> None:
    """A run that ended NODE_FAIL on one node (a job's runs on several do not say which failed):
    the node becomes a suspect of the cluster, once per job, and the requeued job, while it
    waits, is told to keep off it (scontrol update ExcNodeList): a node that comes back at once
    (ReturnToService=2) would otherwise get the job again."""
    runs = [*st.earlier, st]
    failed = sorted({r.nodes for r in runs if r.state is JobState.NODE_FAIL and r.nodes and NODE_NAME.fullmatch(r.nodes)})
    if not failed:
        return
    extra = record.extra
    suspected, kept = list(extra.get("suspected_nodes") or []), list(extra.get("kept_off") or [])
    for node in failed:
        if node not in suspected:
            history.add_suspect_node(record.cluster, node, FailureKind.NODE_FAIL,
                                     f"NODE_FAIL under job #{record.id}", record.id)
            suspected.append(node)
    if st.state is JobState.PENDING and set(failed) - set(kept):
        if backend.keep_off(record.scheduler_job_id, sorted(set(kept) | set(failed))):
            kept = sorted(set(kept) | set(failed))
    if (suspected, kept) != (extra.get("suspected_nodes") or [], extra.get("kept_off") or []):
        history.set_extra(record.id, {**extra, "suspected_nodes": suspected, "kept_off": kept})


def refresh_live(history, records) -> dict[int, JobStatus]:
    """Ask the backends (once each) about the jobs not yet ended and record what changed.

    Ended jobs are not asked about: their recorded state is final (a local job's folder
    cannot tell CANCELLED from FAILED, and sacct may have forgotten old jobs)."""
    try:
        if reconcile(history, records):
            records = [history.get(r.id) for r in records]
        live = [r for r in records if r.scheduler_job_id and not r.terminal]
        return refresh(history, live) if live else {}
    except SchedulerError as e:
        raise SchedulerError(e.message, hint=e.hint or "`jobctl history` shows the recorded states "
                             "without asking the scheduler") from None


def sync_copies(history, records) -> None:
    """Bring the local copies of remote jobs' folders up to date (nothing for jobs run from here)."""
    for backend, group in placement.by_backend([r for r in records if r.scheduler_job_id]):
        if placement.is_remote(group[0]):
            mirror.ask(history, backend, group, "status")


# --- references and rows ------------------------------------------------------------------------

def resolve(history, refs: list[str]) -> list:
    """The history records the references name (12, #12, slurm:4242, ...), each once, in order.

    An unknown reference is a usage error naming the newest jobs the history does know."""
    out, seen = [], set()
    for ref in refs:
        try:
            rec = history.get(ref)
        except UnknownJobError as e:
            newest = history.list(limit=5)
            known = ", ".join(f"#{r.id}" + (f" ({r.scheduler} {r.scheduler_job_id})" if r.scheduler_job_id else "")
                              for r in newest)
            hint = (f"the newest jobs are {known}; run `jobctl history` to see them all" if newest else
                    "the history is empty: submit a job first (jobctl submit RECIPE --cluster CLUSTER)")
            raise UsageError(e.message, hint=hint) from None
        if rec.id not in seen:
            seen.add(rec.id)
            out.append(rec)
    return out


def select(history, refs: list[str], recent: int) -> list:
    """The named jobs; without names, every active job plus the `recent` newest, newest first."""
    if refs:
        return resolve(history, refs)
    by_id = {r.id: r for r in history.active()}
    if recent:
        by_id.update((r.id, r) for r in history.list(limit=recent))
    return [by_id[i] for i in sorted(by_id, reverse=True)]


def _aware(text: str | None) -> datetime | None:
    """A timezone-aware datetime from the history's UTC ISO text or sacct's naive local time."""
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt.astimezone() if dt.tzinfo is None else dt  # naive (sacct) means local time


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.astimezone(timezone.utc).isoformat(timespec="seconds")


def job_row(history, record, state: JobStatus | None = None, now: datetime | None = None) -> dict:
    """One job as the tables and --json show it: the history record, and, when given, what the
    scheduler said just now for its start, end, node list and reason."""
    now = now or datetime.now(timezone.utc)
    plan = record.plan
    if record.scheduler == "local":
        start = _aware(record.submitted_at)  # the local executor starts the job at once
    else:
        start = _aware(state.start if state else None) or _aware(record.started_at)
    end = _aware(state.end if state else None) or _aware(record.ended_at)
    if not record.terminal:
        end = None
    elapsed_s = None
    if start is not None:
        elapsed_s = max(0.0, ((end or now) - start).total_seconds())
    chain = history.chain(record.id)
    node_list = state.nodes if state and state.nodes and state.nodes != "None assigned" else None
    reason = state.reason if state and not record.terminal else None
    return {
        "id": record.id,
        "scheduler": record.scheduler,
        "scheduler_job_id": record.scheduler_job_id,
        "recipe": record.recipe_name,
        "cluster": record.cluster,
        "partition": record.partition,
        "state": record.state.value,
        "nodes": plan.get("nodes"),
        "node_list": node_list,
        "submitted_at": record.submitted_at or record.created_at,
        "started_at": _iso(start),
        "ended_at": _iso(end),
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 1),
        "failure_kind": record.failure_kind.value if record.failure_kind else None,
        "exit_code": record.exit_code,
        "detail": record.detail,
        "reason": reason,
        "attempt": record.attempt,
        "parent_id": record.parent_id,
        "chain": [r.id for r in chain] if len(chain) > 1 else [],
        "sweep_id": record.sweep_id,
        "job_folder": record.job_folder,
    }
