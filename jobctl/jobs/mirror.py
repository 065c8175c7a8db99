"""What a cluster's login node says of its jobs, recorded in this history: the one place a
remote job's rows are written here (remote.client.RemoteBackend only asks, and copies files).

The login node's history is the source of truth for its jobs (their in-job OOM recovery
writes there). This history mirrors it: each remote job has a row here with the same
submission token (so mirroring is idempotent), `remote_cluster`, `remote_id` and
`remote_folder` saying where it runs, its parent mapped to the local id, and a local copy of
its job folder (remote.client.mirror_folder) brought up to date each time the job is looked at.
So `logs`, `watch`, `report` and `history` read local files and rows, as for local jobs."""

from __future__ import annotations

from datetime import datetime

from jobctl.errors import JobctlError, SubmissionUncertain
from jobctl.model import TERMINAL_STATES, JobState, JobStatus
from jobctl.remote.client import RemoteBackend, mirror_folder

_TERMINAL = {s.value for s in TERMINAL_STATES}


def record(history, cluster: str, described: list[dict]) -> dict[int, int]:
    """Record the login node's jobs (agent.describe) in this history; {remote id: local id}."""
    id_map: dict[int, int] = {}
    for d in sorted(described, key=lambda d: d["id"]):  # parents before children
        rec = history.find_by_token(d["token"])
        if rec is None:
            parent = history.find_by_token(d["parent_token"]) if d.get("parent_token") else None
            jid = history.prepare(
                recipe_name=d["recipe_name"], recipe_text=d["recipe_text"], plan=d["plan_json"], cluster=d["cluster"],
                scheduler=d["scheduler"], partition=d.get("partition"), recipe_path=d.get("recipe_path"),
                parent_id=parent.id if parent else None, attempt=d["attempt"], token=d["token"],
                predicted_peak_bytes=d.get("predicted_peak_bytes"), sweep_id=d.get("sweep_id"),
                extra=_extra(d), remote_cluster=cluster)
            rec = history.get(jid)
        id_map[d["id"]] = rec.id
        if (rec.remote_cluster, rec.remote_id, rec.remote_folder) != (cluster, d["id"], d.get("job_folder")):
            history.set_remote(rec.id, cluster, d["id"], d.get("job_folder"))
        if d.get("scheduler_job_id") and not rec.scheduler_job_id:
            history.mark_submitted(rec.id, d["scheduler_job_id"], mirror_folder(cluster, rec.id, rec.recipe_name))
        _record_state(history, rec, d, cluster)
    return id_map


def _extra(d: dict) -> dict:
    import json

    try:
        extra = json.loads(d.get("extra_json") or "{}")
    except ValueError:
        return {}
    return extra if isinstance(extra, dict) else {}


def _record_state(history, rec, d: dict, cluster: str) -> None:
    state = d["state"]
    if state == "SUBMIT_FAILED" and rec.state.value == "PREPARED":
        history.mark_submit_failed(rec.id, d.get("detail") or f"refused on {cluster}")
    elif state not in ("PREPARED", "SUBMIT_FAILED") and state != history.get(rec.id).state.value:
        if d.get("started_at") and not history.get(rec.id).started_at and state != "RUNNING":
            # it ran between two looks: record when it started, as the login node did
            history.transition(rec.id, "RUNNING", f"on {cluster}", at=datetime.fromisoformat(d["started_at"]))
        at = d.get("ended_at") if state in _TERMINAL else d.get("started_at") if state == "RUNNING" else None
        history.transition(rec.id, state, f"on {cluster}", failure_kind=d.get("failure_kind"),
                           exit_code=d.get("exit_code"), detail=d.get("detail"),
                           at=datetime.fromisoformat(at) if at else None)
    now = history.get(rec.id)
    if now.state.value == state and d.get("failure_kind") and d["failure_kind"] != now.failure_kind:
        history.set_failure(rec.id, d["failure_kind"], d.get("detail"))  # the first node's verdict came after sacct's
    if d.get("measured_peak_bytes") and d["measured_peak_bytes"] != rec.measured_peak_bytes:
        history.set_measured_peak(rec.id, int(d["measured_peak_bytes"]))


def mirror(history, backend: RemoteBackend, described: list[dict]) -> dict[int, int]:
    """Record what the login node said and copy what changed in the jobs' folders."""
    id_map = record(history, backend.cluster, described)
    backend.copy_files(described, id_map)
    return id_map


def ask(history, backend: RemoteBackend, records, action: str) -> dict[int, dict]:
    """Ask the login node once about `records` ("status", "cancel"), mirror its answer;
    {local id: described job}."""
    described = backend.ask(records, action)
    ids = mirror(history, backend, described)
    return {ids[d["id"]]: d for d in described}


def refresh(history, backend: RemoteBackend, records) -> dict[int, JobStatus]:
    """The login node's word on `records`, recorded (with the attempts continuing them);
    {jobctl id: JobStatus} for the records asked about."""
    described = ask(history, backend, records, "status")
    return {r.id: JobStatus(d["state"], d.get("exit_code"), None, d.get("started_at"), d.get("ended_at"),
                            failure_kind=d.get("failure_kind"), detail=d.get("detail"))
            for r in records if (d := described.get(r.id)) is not None}


def requeue(history, backend: RemoteBackend, record, *, smaller: bool,
            tried_to_allocate_bytes: int | None) -> tuple[dict, dict]:
    """`jobctl requeue` of a remote job, done on its login node and recorded here; (summary,
    result) in local ids."""
    answer = backend.requeue(record, smaller=smaller, tried_to_allocate_bytes=tried_to_allocate_bytes)
    id_map = mirror(history, backend, answer["records"])
    out = dict(answer["job"])
    out["remote_job_folder"] = out.get("job_folder")
    out["jobctl_id"] = id_map[out["jobctl_id"]]
    out["parent_id"] = id_map.get(out.get("parent_id"), record.id)
    new = history.get(out["jobctl_id"])
    out["job_folder"] = new.job_folder
    return out, result(new)


def submit(history, backend: RemoteBackend, subs: list, *, token: str, sync_dir: str | None = None,
           progress=None) -> list[dict]:
    """Submit prepared Submissions on a remote cluster; results like submission.submit_all's.
    A local PREPARED row is recorded (with the token) before the login node is asked; when it
    answers that it did not submit, the rows say so (SUBMIT_FAILED)."""
    say = progress or (lambda text: None)
    request = backend.stage(subs, token=token, sync_dir=sync_dir, progress=progress)
    ids = []
    for sub in subs:
        known = history.find_by_token(sub.token)
        ids.append(known.id if known else history.prepare(
            recipe_name=sub.recipe_name, recipe_text=sub.recipe_text, plan=sub.plan, cluster=sub.cluster,
            scheduler=sub.scheduler, partition=sub.partition, recipe_path=sub.recipe_path, sweep_id=sub.sweep_id,
            token=sub.token, predicted_peak_bytes=sub.plan_report["memory"]["total_bytes"],
            extra={"overrides": sub.overrides}, remote_cluster=backend.cluster))
    try:
        answer = backend.submit(request)
    except SubmissionUncertain:  # the rows stay PREPARED: whether it was submitted is not known here
        raise
    except JobctlError as e:  # the login node answered: it did not submit
        for jid in ids:
            if history.get(jid).state is JobState.PREPARED:
                history.mark_submit_failed(jid, e.message)
        raise
    mirror(history, backend, answer["records"])
    results = []
    for jid in ids:
        rec = history.get(jid)
        again = rec.token in answer.get("existing", [])
        results.append({**result(rec), "existing": again})
        say(f"#{rec.id} was already submitted with token {rec.token} as slurm job {rec.scheduler_job_id} on "
            f"{backend.cluster}: not submitted again" if again else
            f"submitted #{rec.id} as slurm job {rec.scheduler_job_id} on {backend.cluster} ({rec.remote_folder})")
    return results


def result(rec) -> dict:
    """A mirrored job as submission.submit_all describes what it submitted."""
    return {"id": rec.id, "scheduler_job_id": rec.scheduler_job_id, "job_folder": rec.job_folder,
            "recipe": rec.recipe_name, "remote_folder": rec.remote_folder, "token": rec.token}
