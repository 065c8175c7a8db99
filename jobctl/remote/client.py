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
from pathlib import Path

from jobctl import __version__
from jobctl.errors import JobctlError, SubmissionUncertain, UsageError
from jobctl.model import slug
from jobctl.remote.protocol import APPENDED, agent_argv, source_digest
from jobctl.store.paths import history_path

_SESSIONS: dict = {}  # cluster name -> connected, version-checked Remote


# --- which jobs are remote ------------------------------------------------------------------

def cluster_of(record) -> str | None:
    """The remote cluster of a history record, or None for a job submitted from here."""
    return getattr(record, "remote_cluster", None)


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


def mirror_folder(cluster: str, job_id: int, recipe_name: str) -> Path:
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
    """A cluster behind a login node, as the job services see it: submit, status, cancel and
    requeue run jobctl there (the agent) and answer what it says of its jobs ("described"
    records, agent.describe); `copy_files` brings their folders' changed files here. It records
    nothing: jobs/mirror.py writes what it says into this history."""

    def __init__(self, cluster: str, inventory):
        self.cluster = cluster
        self.inventory = inventory  # the loaded inventory (config.Loaded), with its `login:` block

    @property
    def remote(self):
        return session(self.cluster, self.inventory.value)

    def ask(self, records, action: str) -> list[dict]:
        """Ask the login node once about `records` (and the attempts continuing them): "status"
        or "cancel"; what it says of each."""
        return agent(self.remote, action, {"tokens": [r.token for r in records]})["records"]

    def copy_files(self, described: list[dict], id_map: dict[int, int]) -> None:
        """Copy what changed in the described jobs' folders to their local copies (mirror_folder,
        by local id)."""
        for d in described:
            if d.get("files"):
                _copy_files(self.remote.files, mirror_folder(self.cluster, id_map[d["id"]], d["recipe_name"]),
                            d["files"], id_map)

    def requeue(self, record, *, smaller: bool, tried_to_allocate_bytes: int | None) -> dict:
        """`jobctl requeue` of a remote job, done on the login node: its answer ({"job", "records"})."""
        return agent(self.remote, "requeue", {"token": record.token, "smaller": smaller,
                                              "tried_to_allocate_bytes": tried_to_allocate_bytes})

    def stage(self, subs: list, *, token: str, sync_dir: str | None = None, dry_run: bool = False,
              check: bool = False, progress=None) -> dict:
        """The request to submit `subs` on the login node, its files put there over SFTP into
        <workdir>/requests/<token>/; with `sync_dir`, that working tree goes to
        <workdir>/trees/<name> (changed files only) and the job runs there."""
        say = progress or (lambda text: None)
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
            say(f"synced {src} to {remote}:{chdir}: {res.uploaded} file(s) uploaded, {res.unchanged} unchanged, "
                f"{res.deleted} removed")
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
        return request

    def submit(self, request: dict) -> dict:
        """Submit a staged request there: its answer ({"records", "existing"}).
        SubmissionUncertain, saying to run again with the same token, when the connection dropped
        after it was sent (it may or may not have been submitted)."""
        from jobctl.remote.ssh import OutcomeUnknownError

        try:
            return agent(self.remote, "submit", request)
        except OutcomeUnknownError as e:
            raise SubmissionUncertain(e.message, hint=f"run the same command again with --token {request['token']}: "
                                      "it returns the job if it was submitted, and submits it if not") from None

    def dry_run(self, subs: list, *, token: str, sync_dir: str | None = None, check: bool = False) -> list[dict]:
        """The jobs rendered on the login node (its python, paths and sbatch); nothing submitted."""
        request = self.stage(subs, token=token, sync_dir=sync_dir, dry_run=True, check=check)
        return agent(self.remote, "submit", request)["dry_run"]
