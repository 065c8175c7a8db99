"""What a login node answers for a jobctl on a laptop (`jobctl remote agent ACTION`): the job
services behind the JSON wire of remote/protocol.py. Short-lived: one request on stdin, one
answer on stdout; every other output (submitit's sbatch included) goes to stderr.

The login node keeps its own history (the jobs' in-job recovery writes there, next to the job
folders); the laptop's history mirrors it by submission token (remote.client). Every answer
describes jobs the same way (`describe`): the history row, the token of its parent, and the
files of its folder so that the laptop can fetch what changed over SFTP. A submission holds a
lock on its token for its whole run, and a retried submission with the same token returns the
job the first one created (submission.submit_all), so a dropped connection can be retried
without creating a second job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from jobctl import __version__
from jobctl.config import loader as config
from jobctl.errors import EXIT_INTERNAL, JobctlError, UsageError
from jobctl.jobs.cancel import cancel_records
from jobctl.jobs.requeue import requeue_record
from jobctl.jobs.status import refresh
from jobctl.jobs.submission import dry_run, prepare, submit_all
from jobctl.model import RetryPolicy
from jobctl.remote.protocol import (
    ACTIONS,
    MAX_FILE_BYTES,
    SKIP_SUFFIXES,
    error_payload,
    source_digest,
)
from jobctl.store.folder import JobFolder
from jobctl.store.history import History, UnknownJobError


def serve(action: str) -> int:
    """Read one request on stdin, answer on stdout; only the answer goes to stdout."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a dropped connection must not stop a submission halfway
    sys.stdout.flush()
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    code = 0
    try:
        try:
            request = json.loads(sys.stdin.read() or "{}")
        except ValueError as e:
            raise UsageError(f"the agent's request is not JSON: {e}") from None
        answer = handle(action, request)
    except JobctlError as e:
        answer, code = error_payload(e), e.exit_code
    except Exception as e:  # noqa: BLE001 - a bug: keep the traceback on stderr, answer in the usual shape
        traceback.print_exc()
        answer = {"error": {"type": "JobctlError", "exit_code": EXIT_INTERNAL,
                            "message": f"internal error on the login node: {type(e).__name__}: {e}", "hint": None}}
        code = EXIT_INTERNAL
    sys.stdout.flush()
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer, default=str) + "\n")
    return code


def handle(action: str, request: dict) -> dict:
    handlers = {"version": version, "submit": submit, "status": status, "cancel": cancel, "requeue": requeue}
    assert set(handlers) == set(ACTIONS)
    if action not in handlers:
        raise UsageError(f"unknown agent action {action!r}; expected one of {', '.join(ACTIONS)}")
    if not isinstance(request, dict):
        raise UsageError("the agent's request must be a JSON object")
    return handlers[action](request)


def version(request: dict) -> dict:
    return {"version": __version__, "source": source_digest()}


# --- describing jobs -------------------------------------------------------------------------

def describe(history, record) -> dict:
    """A job as the laptop mirrors it: the row, its parent's token and its folder's files."""
    d = record.to_dict()
    d["parent_token"] = history.get(record.parent_id).token if record.parent_id else None
    d["files"] = folder_files(record)
    return d


def folder_files(record) -> list[dict]:
    """Files of a job folder (and its submitit output when that lives elsewhere, as for job
    arrays): [{name (relative, in the copy), path (here), size, mtime}]."""
    if not record.job_folder:
        return []
    folder = JobFolder(record.job_folder)
    out = [{"name": f.name, "path": str(f.path), "size": f.size, "mtime": f.mtime}
           for f in folder.files(SKIP_SUFFIXES, MAX_FILE_BYTES)]
    meta = folder.scheduler_meta()
    sub = Path(meta.get("submitit_folder") or folder.path)
    if sub != folder.path and sub.is_dir() and meta.get("job_id"):
        for path in sorted(sub.glob(f"{meta['job_id']}_*_log.*")):
            st = path.stat()
            out.append({"name": path.name, "path": str(path), "size": st.st_size, "mtime": st.st_mtime})
    return out


def _records(history, records) -> dict:
    return {"records": [describe(history, r) for r in records]}


def _by_tokens(history, tokens) -> list:
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise UsageError("`tokens` must be a list of strings")
    out = []
    for t in tokens:
        rec = history.find_by_token(t)
        if rec is None:
            raise UnknownJobError(f"no job with submission token {t!r} in the login node's history "
                                  f"({history.path})", hint="was it submitted with another JOBCTL_HOME there?")
        out.append(rec)
    return out


def _with_descendants(history, records) -> list:
    """The records and every attempt that continues them (in-job OOM recovery, requeues)."""
    seen, out = set(), []
    for rec in records:
        below = {rec.id}
        for r in history.chain(rec.id):  # root first, ordered by attempt: parents before children
            if r.id == rec.id or r.parent_id in below:
                below.add(r.id)
                if r.id not in seen:
                    seen.add(r.id)
                    out.append(r)
    return out


# --- actions ---------------------------------------------------------------------------------

def status(request: dict) -> dict:
    """Refresh the named jobs and their descendants from Slurm (one sacct), then describe them."""
    with History.open() as history:
        records = _with_descendants(history, _by_tokens(history, request.get("tokens")))
        live = [r for r in records if r.scheduler_job_id and not r.terminal]
        if live:
            refresh(history, live)
        return _records(history, [history.get(r.id) for r in records])


def cancel(request: dict) -> dict:
    with History.open() as history:
        records = _by_tokens(history, request.get("tokens"))
        cancel_records(history, records)
        return _records(history, [history.get(r.id) for r in records])


def requeue(request: dict) -> dict:
    tried = request.get("tried_to_allocate_bytes")
    with History.open() as history:
        (record,) = _by_tokens(history, [request.get("token")])
        out, res = requeue_record(history, record, smaller=bool(request.get("smaller")),
                                  tried_to_allocate_bytes=int(tried) if tried is not None else None)
        new = history.get(res["id"])
        return {"job": out, "records": [describe(history, history.get(record.id)), describe(history, new)]}


def _read_json(path) -> object:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"cannot read the uploaded file {path}: {e}") from None


def submit(request: dict) -> dict:
    """Prepare each job from the uploaded recipe, plan and inventory (no re-planning: the plan
    is the laptop's), then submit them all, idempotently by token."""
    token = request.get("token")
    if not isinstance(token, str) or not token:
        raise UsageError("a submission needs a token")
    jobs = request.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise UsageError("`jobs` must be a non-empty list")
    inv_path = request.get("inventory")
    inv = config.from_data(_read_json(inv_path), "Inventory", str(inv_path))
    subs = []
    for job in jobs:
        rec = config.from_data(_read_json(job["recipe"]), "Recipe", job.get("recipe_path") or job["recipe"])
        sub = prepare(rec, inv, _read_json(job["plan"]), list(job.get("overrides") or []))
        sub.sweep_id = request.get("sweep_id")
        sub.token = job["token"]
        # the laptop's policy; hooks are the recipe's word (launch.hooks)
        sub.policy = replace(RetryPolicy.from_dict(job.get("policy")), hooks=sub.policy.hooks)
        sub.cwd = request.get("chdir")  # the synced working tree: the job runs there
        subs.append(sub)
    if request.get("dry_run"):
        return {"dry_run": dry_run(subs, check=bool(request.get("check")))}
    with History.open() as history:
        results = submit_all(subs, history)  # one submission per token at a time (a lock per token)
        answer = _records(history, [history.get(r["id"]) for r in results])
        answer["existing"] = [history.get(r["id"]).token for r in results if r.get("existing")]
        return answer
