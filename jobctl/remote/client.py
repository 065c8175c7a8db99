"""Jobs on a cluster reached over SSH, seen from the laptop.

A cluster whose inventory has a `login:` block is driven through its login node: jobctl runs
itself there (`jobctl remote agent ACTION`, jobctl.jobs.agent) as short-lived commands answering
JSON, over one connection per cluster for the whole command (`session`), version-checked once:
`python_argv` is the login block's python, `remote_version` what `python -m jobctl --version`
says there, `check_same_jobctl` refuses anything but this very build.

The login node's history is the source of truth for its jobs (their in-job OOM recovery
writes there). This history mirrors it: each remote job has a row here with the same
submission token (so mirroring is idempotent), `extra.remote = {cluster, id}`, its parent
mapped to the local id, and a local copy of its job folder (`mirror_folder`) that is brought up
to date over SFTP (only what changed; logs and sampler CSVs from where the copy ends) each
time the job is refreshed. So `logs`, `watch`, `report` and `history` read local files and
rows, as for local jobs. Ids inside copied files (successor.json) are translated to local ids.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import uuid
from datetime import datetime
from pathlib import Path

from jobctl import __version__
from jobctl.errors import JobctlError, SchedulerError, UsageError
from jobctl.model import TERMINAL_STATES, JobStatus, slug
from jobctl.remote.protocol import APPENDED, agent_argv, source_digest
from jobctl.store.paths import history_path

_SESSIONS: dict = {}  # cluster name -> connected, version-checked Remote


# --- which jobs are remote ------------------------------------------------------------------

def cluster_of(record) -> str | None:
    """The remote cluster of a history record, or None for a job submitted from here."""
    try:
        remote = json.loads(record.extra_json).get("remote")
    except (ValueError, AttributeError):
        return None
    return remote.get("cluster") if isinstance(remote, dict) else None


def split(records) -> tuple[list, list]:
    """(remote records, the others)."""
    remote = [r for r in records if cluster_of(r)]
    return remote, [r for r in records if not cluster_of(r)]


def _by_cluster(records) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(cluster_of(r), []).append(r)
    return out


# --- connections ---------------------------------------------------------------------------

def session(cluster: str, inventory):
    """The open connection to `cluster`'s login node (opened and version-checked on first use);
    `inventory` (its validated inventory, with `login:`) says how to reach it."""
    if cluster in _SESSIONS:
        return _SESSIONS[cluster]
    from jobctl.remote.ssh import Remote

    remote = Remote.for_inventory(inventory)
    try:
        remote.connect()
        check_same_jobctl(remote)
    except BaseException:
        remote.close()
        raise
    _SESSIONS[cluster] = remote
    return remote


def python_argv(remote, remote_python: str | None = None) -> list[str]:
    """login.remote_python as argv (it may be several words, e.g. `conda run -n env python`), ~ expanded."""
    argv = shlex.split(remote_python or remote.login.remote_python)
    if not argv:
        raise UsageError("login.remote_python is empty", hint="set it to the python that has jobctl installed")
    if argv[0] == "~" or argv[0].startswith("~/"):
        argv[0] = remote.files.remote_path(argv[0])
    return argv


def remote_version(remote, remote_python: str | None = None) -> str:
    """The version of `remote_python -m jobctl --version` on the login node."""
    argv = [*python_argv(remote, remote_python), "-m", "jobctl", "--version"]
    res = remote.run(argv, idempotent=True, timeout_s=120)
    m = re.fullmatch(r"jobctl (\S+)", res.stdout.strip())
    if res.rc != 0 or not m:
        why = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or [f"exit code {res.rc}"])[-1]
        raise UsageError(f"jobctl is not usable with `{shlex.join(argv[:-3])}` on {remote}: {why[:300]}",
                         hint=f"run `jobctl remote bootstrap {remote.cluster}`, or set login.remote_python to a "
                         "python that has jobctl")
    return m.group(1)


def check_version(remote, local: str | None = None) -> str:
    """The remote jobctl version; UsageError unless it equals `local` (default: this jobctl's)."""
    if local is None:
        local = __version__
    version = remote_version(remote)
    if version != local:
        raise UsageError(f"remote jobctl {version} != local {local} on {remote}",
                         hint=f"run `jobctl remote bootstrap {remote.cluster}` to install jobctl {local} there")
    return version


def check_same_jobctl(remote) -> str:
    """Refuse (UsageError, exit 2) unless the login node runs this very jobctl: the same
    version, built from the same sources (agent.source_digest); returns the version."""

    try:
        answer = agent(remote, "version", {})
    except JobctlError:
        check_version(remote)  # no jobctl there, or one without the agent: say which, and how to fix it
        raise
    if answer.get("version") != __version__:
        raise UsageError(f"remote jobctl {answer.get('version')} != local {__version__} on {remote}",
                         hint=f"run `jobctl remote bootstrap {remote.cluster}` to install jobctl {__version__} there")
    if answer.get("source") != source_digest():
        raise UsageError(f"the jobctl {__version__} on {remote} was built from other sources than this one "
                         f"(source digest {str(answer.get('source'))[:12]} there, {source_digest()[:12]} here)",
                         hint=f"run `jobctl remote bootstrap {remote.cluster}` to install this build there")
    return __version__


def close_all() -> None:
    while _SESSIONS:
        _, remote = _SESSIONS.popitem()
        remote.close()


def agent(remote, action: str, request: dict, *, timeout_s: float = 600.0):
    """Run `jobctl remote agent ACTION` on the login node; every action is safe to repeat
    (submissions by their token), so a dropped connection is retried."""
    return remote.json_command(agent_argv(python_argv(remote), action), idempotent=True,
                               input_text=json.dumps(request, default=str), timeout_s=timeout_s)


# --- submitting ---------------------------------------------------------------------------

def new_token() -> str:
    return uuid.uuid4().hex


# --- mirroring -----------------------------------------------------------------------------

def mirror_root() -> Path:
    return history_path().parent / "remote"


def _remote_folder(record) -> str | None:
    try:
        return json.loads(record.extra_json)["remote"].get("folder")
    except (ValueError, KeyError, AttributeError):
        return None


def mirror(history, cluster: str, files, described: list[dict]) -> dict[int, int]:
    """Record the login node's jobs (agent.describe) in this history and copy their folders'
    changed files (read through `files`, a Remote's files); {remote id: local id}."""
    id_map: dict[int, int] = {}
    for d in sorted(described, key=lambda d: d["id"]):  # parents before children
        rec = history.find_by_token(d["token"])
        if rec is None:
            parent = history.find_by_token(d["parent_token"]) if d.get("parent_token") else None
            extra = {**json.loads(d.get("extra_json") or "{}"), "remote": {"cluster": cluster}}
            jid = history.prepare(
                recipe_name=d["recipe_name"], recipe_text=d["recipe_text"], plan=d["plan_json"], cluster=d["cluster"],
                scheduler=d["scheduler"], partition=d.get("partition"), recipe_path=d.get("recipe_path"),
                parent_id=parent.id if parent else None, attempt=d["attempt"], token=d["token"],
                predicted_peak_bytes=d.get("predicted_peak_bytes"), sweep_id=d.get("sweep_id"), extra=extra)
            rec = history.get(jid)
        id_map[d["id"]] = rec.id
        if not _remote_folder(rec) or json.loads(rec.extra_json)["remote"].get("id") != d["id"]:
            extra = json.loads(rec.extra_json)
            extra["remote"] = {"cluster": cluster, "id": d["id"], "folder": d.get("job_folder")}
            history.set_extra(rec.id, extra)
        folder = _mirror_folder(cluster, rec.id, rec.recipe_name)
        if d.get("scheduler_job_id") and not rec.scheduler_job_id:
            history.mark_submitted(rec.id, d["scheduler_job_id"], folder)
        state = d["state"]
        if state == "SUBMIT_FAILED" and rec.state.value == "PREPARED":
            history.mark_submit_failed(rec.id, d.get("detail") or f"refused on {cluster}")
        elif state not in ("PREPARED", "SUBMIT_FAILED") and state != history.get(rec.id).state.value:
            if d.get("started_at") and not history.get(rec.id).started_at and state != "RUNNING":
                # it ran between two looks: record when it started, as the login node did
                history.transition(rec.id, "RUNNING", f"on {cluster}", at=datetime.fromisoformat(d["started_at"]))
            at = d.get("ended_at") if state in _terminal() else d.get("started_at") if state == "RUNNING" else None
            history.transition(rec.id, state, f"on {cluster}", failure_kind=d.get("failure_kind"),
                               exit_code=d.get("exit_code"), detail=d.get("detail"),
                               at=datetime.fromisoformat(at) if at else None)
        now = history.get(rec.id)
        if now.state.value == state and d.get("failure_kind") and d["failure_kind"] != now.failure_kind:
            history.set_failure(rec.id, d["failure_kind"], d.get("detail"))  # the first node's verdict came after sacct's
        if d.get("measured_peak_bytes") and d["measured_peak_bytes"] != rec.measured_peak_bytes:
            history.set_measured_peak(rec.id, int(d["measured_peak_bytes"]))
    for d in described:
        if d.get("files"):
            _copy_files(files, _mirror_folder(cluster, id_map[d["id"]], d["recipe_name"]), d["files"], id_map)
    return id_map


def _terminal():
    return {s.value for s in TERMINAL_STATES}


def _mirror_folder(cluster: str, job_id: int, recipe_name: str) -> Path:
    """The local copy of a remote job's folder: names from the login node are data, never
    paths (a recipe name "../../x" must not lead out of the mirror)."""
    return mirror_root() / slug(cluster) / f"{int(job_id)}-{slug(recipe_name)}"


def _safe_name(name: str) -> bool:
    """A file name from the login node that stays inside the copy (no absolute path, no '..')."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts) and "\\" not in name


def _copy_files(remote_files, folder: Path, files: list[dict], id_map: dict[int, int]) -> None:
    """Bring the copy of a job folder up to date: files whose size or time changed; files that only
    grow (logs, CSVs) from where the copy ends."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    inside = folder.resolve()
    seen_path = folder / ".remote-files.json"
    try:
        seen = json.loads(seen_path.read_text())
    except (OSError, ValueError):
        seen = {}
    changed = False
    for f in files:
        name = f.get("name", "")
        if not _safe_name(name) or name == seen_path.name:
            continue
        local = folder / name
        if not local.parent.resolve().is_relative_to(inside) or local.is_symlink():
            continue  # a link in the copy (never made by jobctl) must not lead the write elsewhere
        stamp = [f["size"], f["mtime"]]
        if seen.get(name) == stamp:
            continue
        local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        have = local.stat().st_size if local.exists() else 0
        if name.endswith(APPENDED) and name in seen and 0 < have <= f["size"]:
            data = remote_files.get_bytes(f["path"], offset=have)
            with os.fdopen(os.open(local, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "ab") as out:
                out.write(data)
        else:
            data = remote_files.get_bytes(f["path"])
            data = _translate(name, data, id_map, folder)
            tmp = local.with_name(local.name + ".part")
            tmp.unlink(missing_ok=True)
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(data)  # owner-only, like the job folder it copies
            os.replace(tmp, local)
        seen[name] = stamp
        changed = True
    if changed:
        seen_path.write_text(json.dumps(seen))


def _translate(name: str, data: bytes, id_map: dict[int, int], folder: Path) -> bytes:
    """Files that name jobs or places: the login node's ids become this history's, and
    submitit's folder becomes the copy (so that `jobctl logs` finds its output files)."""
    if name not in ("successor.json", "submitit.json"):
        return data
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    if name == "successor.json":
        for key in ("jobctl_id", "parent_id"):
            if isinstance(doc.get(key), int):
                doc[key] = id_map.get(doc[key], doc[key])
    else:
        doc["remote_submitit_folder"] = doc.get("submitit_folder")
        doc["submitit_folder"] = str(folder)
    return (json.dumps(doc, indent=2) + "\n").encode()


# --- the backend -----------------------------------------------------------------------------

class RemoteBackend:
    """A cluster behind a login node, as the job services see it: submit, refresh, cancel and
    requeue run jobctl there (the agent) and mirror its answer into this history, with a copy
    of each job folder; refresh answers like any backend ({scheduler id: JobStatus})."""

    def __init__(self, cluster: str, history, inventory):
        self.cluster = cluster
        self.history = history
        self.inventory = inventory  # the loaded inventory (config.Loaded), with its `login:` block

    @property
    def remote(self):
        return session(self.cluster, self.inventory.value)

    def _ask(self, records, action: str) -> dict[int, dict]:
        """Ask the login node once about `records`, mirror the answer; {local id: described job}."""
        remote = self.remote
        answer = agent(remote, action, {"tokens": [r.token for r in records]})
        ids = mirror(self.history, self.cluster, remote.files, answer["records"])
        return {ids[d["id"]]: d for d in answer["records"]}

    def refresh(self, records) -> dict[str, JobStatus]:
        """Ask the login node (once) about `records` and the attempts continuing them, mirror
        what changed; {scheduler id: JobStatus} for the records asked about."""
        described = self._ask(records, "status")
        return {r.scheduler_job_id: JobStatus(d["state"], d.get("exit_code"), None, d.get("started_at"),
                                              d.get("ended_at"), failure_kind=d.get("failure_kind"),
                                              detail=d.get("detail"))
                for r in records if (d := described.get(r.id)) is not None and r.scheduler_job_id}

    def sync(self, records) -> None:
        """Bring the copies of these jobs' folders (and their rows) up to date, ended or not."""
        self._ask(records, "status")

    def cancel(self, records) -> None:
        self._ask(records, "cancel")

    def requeue(self, record, *, smaller: bool, tried_to_allocate_bytes: int | None) -> tuple[dict, dict]:
        """`jobctl requeue` of a remote job, done on the login node; (summary, result) in local ids."""
        remote = self.remote
        answer = agent(remote, "requeue", {"token": record.token, "smaller": smaller,
                                           "tried_to_allocate_bytes": tried_to_allocate_bytes})
        id_map = mirror(self.history, self.cluster, remote.files, answer["records"])
        out = dict(answer["job"])
        out["remote_job_folder"] = out.get("job_folder")
        out["jobctl_id"] = id_map[out["jobctl_id"]]
        out["parent_id"] = id_map.get(out.get("parent_id"), record.id)
        new = self.history.get(out["jobctl_id"])
        out["job_folder"] = new.job_folder
        return out, _result(new)

    def submit(self, subs: list, *, token: str, sync_dir: str | None = None, dry_run: bool = False,
               check: bool = False, progress=None) -> list[dict]:
        """Submit prepared Submissions on a remote cluster; results like submit.submit_all's.

        The files each job needs go over SFTP into <workdir>/requests/<token>/; with `sync_dir`,
        that working tree goes to <workdir>/trees/<name> (changed files only) and the job runs there.
        A local PREPARED row is recorded (with the token) before the login node is asked; a dry run
        (rendered on the login node) records nothing and needs no history."""
        say = progress or (lambda text: None)
        inv, history = self.inventory.value, self.history
        remote = self.remote
        workdir = remote.workdir
        stage = posixpath.join(workdir, "requests", token)
        chdir = None
        if sync_dir:
            src = Path(sync_dir).expanduser().resolve()
            if not src.is_dir():
                raise UsageError(f"--sync {sync_dir}: not a directory")
            import hashlib

            from jobctl.remote.sync import sync_tree

            tag = hashlib.sha256(str(src).encode()).hexdigest()[:8]
            chdir = posixpath.join(workdir, "trees", f"{src.name}-{tag}")
            res = sync_tree(remote, src, chdir)
            say(f"synced {src} to {remote}:{chdir}: {res.uploaded} file(s) uploaded, {res.unchanged} unchanged, {res.deleted} removed")
        inv_data = {k: v for k, v in self.inventory.data.items() if k != "login"}
        inv_data["workdir"] = posixpath.join(workdir, "jobs")
        request = {"token": token, "inventory": remote.files.put_text(json.dumps(inv_data, default=str),
                                                                       posixpath.join(stage, "inventory.json")),
                   "sweep_id": subs[0].sweep_id, "chdir": chdir, "dry_run": dry_run, "check": check, "jobs": []}
        for i, sub in enumerate(subs):
            request["jobs"].append({
                "recipe": remote.files.put_text(json.dumps(sub.recipe_source, default=str),
                                                posixpath.join(stage, f"recipe-{i}.json")),
                "plan": remote.files.put_text(json.dumps(sub.plan_report, default=str),
                                              posixpath.join(stage, f"plan-{i}.json")),
                "overrides": sub.overrides, "recipe_path": sub.recipe_path, "policy": sub.policy.to_dict(),
                "token": sub.token})
        if dry_run:
            return agent(remote, "submit", request)["dry_run"]
        ids = []
        for sub in subs:
            known = history.find_by_token(sub.token)
            ids.append(known.id if known else history.prepare(
                recipe_name=sub.recipe_name, recipe_text=sub.recipe_text, plan=sub.plan, cluster=sub.cluster,
                scheduler=sub.scheduler, partition=sub.partition, recipe_path=sub.recipe_path, sweep_id=sub.sweep_id,
                token=sub.token, predicted_peak_bytes=sub.plan_report["memory"]["total_bytes"],
                extra={"overrides": sub.overrides, "remote": {"cluster": inv.name}}))
        from jobctl.remote.ssh import OutcomeUnknownError

        try:
            answer = agent(remote, "submit", request)
        except OutcomeUnknownError as e:  # the rows stay PREPARED: whether it was submitted is not known here
            raise SchedulerError(e.message, hint=f"run the same command again with --token {token}: it returns the "
                                 "job if it was submitted, and submits it if not") from None
        except JobctlError as e:  # the login node answered: it did not submit
            for jid in ids:
                if history.get(jid).state.value == "PREPARED":
                    history.mark_submit_failed(jid, e.message)
            raise
        mirror(history, inv.name, remote.files, answer["records"])
        results = []
        for jid in ids:
            rec = history.get(jid)
            again = rec.token in answer.get("existing", [])
            results.append({**_result(rec), "existing": again})
            say(f"#{rec.id} was already submitted with token {rec.token} as slurm job {rec.scheduler_job_id} on "
                f"{inv.name}: not submitted again" if again else
                f"submitted #{rec.id} as slurm job {rec.scheduler_job_id} on {inv.name} ({_remote_folder(rec)})")
        return results




def _result(rec) -> dict:
    """A mirrored job as submission.submit_all describes what it submitted."""
    return {"id": rec.id, "scheduler_job_id": rec.scheduler_job_id, "job_folder": rec.job_folder,
            "recipe": rec.recipe_name, "remote_folder": _remote_folder(rec), "token": rec.token}
