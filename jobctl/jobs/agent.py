"""What a login node runs for a jobctl on a laptop: `jobctl remote agent ACTION`, a short-lived
command that reads one JSON request on stdin and answers one JSON object on stdout.

The login node keeps its own history (the jobs' in-job recovery writes there, next to the job
folders); the laptop's history mirrors it by submission token (jobctl.remote.client). Every
answer describes jobs the same way (`describe`): the history row, the token of its parent, and
the files of its folder so that the laptop can fetch what changed over SFTP.

Actions (request -> answer):
  version  {}                                         -> {version, source} (source: source_digest())
  submit   {token, inventory, jobs: [{recipe, plan, overrides, recipe_path, policy, token}],
            sweep_id, chdir, dry_run, check}          -> {records} or {dry_run: [...]}
  status   {tokens}                                   -> {records} (each token's job and its descendants)
  cancel   {tokens}                                   -> {records}
  requeue  {token, smaller, tried_to_allocate_bytes}  -> {job, records}

Errors are answered as {"error": {...}} with the error's exit code (cli.remote).
A submission holds a lock on its token for its whole run, and a retried submission with the
same token returns the job the first one created (submit.submit_all), so a dropped
connection can be retried without creating a second job.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from jobctl.errors import UsageError

# Files not worth copying to the laptop: submitit's pickles (the callable, its result).
SKIP_SUFFIXES = (".pkl",)
MAX_FILE_BYTES = 256 << 20
APPENDED = (".log", ".out", ".err", ".csv")  # files that only grow: fetched from where the copy ends


def handle(action: str, request: dict) -> dict:
    handlers = {"version": version, "submit": submit, "status": status, "cancel": cancel, "requeue": requeue}
    if action not in handlers:
        raise UsageError(f"unknown agent action {action!r}; expected one of {', '.join(handlers)}")
    if not isinstance(request, dict):
        raise UsageError("the agent's request must be a JSON object")
    return handlers[action](request)


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 over this jobctl's Python files (path and content): two installs of the same
    version number built from different sources differ here."""
    import hashlib

    root = Path(__file__).resolve().parents[1]  # the jobctl package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def version(request: dict) -> dict:
    from jobctl import __version__

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
    folder = Path(record.job_folder)
    out = []
    if folder.is_dir():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if name.endswith(SKIP_SUFFIXES) or name.startswith("."):
                    continue
                try:
                    st = path.stat()
                except OSError:
                    continue
                if st.st_size <= MAX_FILE_BYTES:
                    out.append({"name": path.relative_to(folder).as_posix(), "path": str(path),
                                "size": st.st_size, "mtime": st.st_mtime})
    try:
        meta = json.loads((folder / "submitit.json").read_text())
    except (OSError, ValueError):
        meta = {}
    sub = Path(meta.get("submitit_folder") or folder)
    if sub != folder and sub.is_dir() and meta.get("job_id"):
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
            from jobctl.store.history import UnknownJobError

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
    from jobctl.store.history import History
    from jobctl.jobs.watch import refresh

    with History.open() as history:
        records = _with_descendants(history, _by_tokens(history, request.get("tokens")))
        live = [r for r in records if r.scheduler_job_id and not r.terminal]
        if live:
            refresh(history, live)
        return _records(history, [history.get(r.id) for r in records])


def cancel(request: dict) -> dict:
    from jobctl.cli.cancel import cancel_records
    from jobctl.store.history import History

    with History.open() as history:
        records = _by_tokens(history, request.get("tokens"))
        cancel_records(history, records)
        return _records(history, [history.get(r.id) for r in records])


def requeue(request: dict) -> dict:
    from jobctl.cli.requeue import requeue_record
    from jobctl.store.history import History

    tried = request.get("tried_to_allocate_bytes")
    with History.open() as history:
        (record,) = _by_tokens(history, [request.get("token")])
        out, res = requeue_record(history, record, smaller=bool(request.get("smaller")),
                                  tried_to_allocate_bytes=int(tried) if tried is not None else None)
        new = history.get(res["id"])
        return {"job": out, "records": [describe(history, history.get(record.id)), describe(history, new)]}


def submit(request: dict) -> dict:
    """Prepare each job from the uploaded recipe, plan and inventory (no re-planning: the plan
    is the laptop's), then submit them all through submitit, idempotently by token."""
    from jobctl.config import loader as config
    from jobctl.config import schema
    from jobctl.store.history import History
    from jobctl.jobs.submission import dry_run, prepare, submit_all

    token = request.get("token")
    if not isinstance(token, str) or not token:
        raise UsageError("a submission needs a token")
    jobs = request.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise UsageError("`jobs` must be a non-empty list")
    inv_path = request["inventory"]
    inv_data = json.loads(Path(inv_path).read_text())
    inv = config.Loaded(inv_path, _validated(schema.Inventory, inv_data, inv_path), inv_data, None, {})
    subs = []
    for job in jobs:
        recipe_data = json.loads(Path(job["recipe"]).read_text())
        rec = config.Loaded(job.get("recipe_path") or job["recipe"],
                            _validated(schema.Recipe, recipe_data, job["recipe"]), recipe_data, None, {})
        report = json.loads(Path(job["plan"]).read_text())
        sub = prepare(rec, inv, report, list(job.get("overrides") or []))
        sub.sweep_id = request.get("sweep_id")
        sub.token = job["token"]
        sub.policy = {**(job.get("policy") or sub.policy), "hooks": sub.policy.get("hooks", False)}
        sub.cwd = request.get("chdir")  # the synced working tree: Slurm starts the job there
        subs.append(sub)
    if request.get("dry_run"):
        return {"dry_run": dry_run(subs, check=bool(request.get("check")))}
    with History.open() as history:
        results = submit_all(subs, history)  # one submission per token at a time (a lock per token)
        answer = _records(history, [history.get(r["id"]) for r in results])
        answer["existing"] = [history.get(r["id"]).token for r in results if r.get("existing")]
        return answer


def _validated(model, data, path):
    from pydantic import ValidationError

    from jobctl.errors import ConfigError, ConfigIssue

    try:
        return model.model_validate(data)
    except ValidationError as e:  # the laptop validated it: a version difference
        raise ConfigError([ConfigIssue(path, None, ".".join(str(x) for x in err["loc"]), err["msg"])
                           for err in e.errors()], hint="the two jobctl versions differ? run `jobctl remote "
                          "bootstrap CLUSTER`") from None
