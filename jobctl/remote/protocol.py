"""The wire between a laptop's jobctl and the one on a login node (`jobctl remote agent ACTION`):
one JSON request on stdin, one JSON answer on stdout. Both sides import this module; neither
imports the other.

Actions (request -> answer):
  version  {}                                         -> {version, source} (source: source_digest())
  submit   {token, inventory, jobs: [{recipe, plan, overrides, recipe_path, policy, token}],
            sweep_id, chdir, dry_run, check}          -> {records, existing} or {dry_run: [...]}
  status   {tokens}                                   -> {records} (each token's job and its descendants)
  cancel   {tokens}                                   -> {records}
  requeue  {token, smaller, tried_to_allocate_bytes}  -> {job, records}

A record is the login node's history row (JobRecord.to_dict) plus `parent_token` and `files`:
[{name (inside the job folder), path (on the login node), size, mtime}]. Errors are answered
as {"error": {type, exit_code, message, hint[, issues]}} with the error's exit code, and
raised again on the laptop as the same class.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from jobctl.errors import (
    ConfigError,
    ConfigIssue,
    InfeasibleError,
    JobctlError,
    SchedulerError,
    UsageError,
)

ACTIONS = ("version", "submit", "status", "cancel", "requeue")
# Files not worth copying to the laptop: submitit's pickles (the callable, its result).
SKIP_SUFFIXES = (".pkl",)
MAX_FILE_BYTES = 256 << 20
APPENDED = (".log", ".out", ".err", ".csv")  # files that only grow: fetched from where the copy ends

_ERROR_CLASSES = {c.__name__: c for c in (JobctlError, UsageError, ConfigError, InfeasibleError, SchedulerError)}
_ERROR_BY_EXIT = {UsageError.exit_code: UsageError, InfeasibleError.exit_code: InfeasibleError,
                  SchedulerError.exit_code: SchedulerError}


def agent_argv(python: list[str], action: str) -> list[str]:
    return [*python, "-m", "jobctl", "remote", "agent", action]


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


def error_payload(e: JobctlError) -> dict:
    """The JSON shape of an error for a remote caller (error_from_payload reads it)."""
    err = {"type": type(e).__name__ if type(e).__module__.startswith("jobctl") else "JobctlError",
           "exit_code": e.exit_code, "message": e.message, "hint": e.hint}
    if isinstance(e, ConfigError):
        err["issues"] = [{"file": i.file, "line": i.line, "key": i.key, "problem": i.problem} for i in e.issues]
    return {"error": err}


def error_from_payload(payload: Any) -> JobctlError | None:
    """The JobctlError a remote jobctl reported as {"error": {...}}, or None if payload is not one."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    hint = error.get("hint") if isinstance(error.get("hint"), str) else None
    cls = _ERROR_CLASSES.get(error.get("type")) or _ERROR_BY_EXIT.get(error.get("exit_code"), JobctlError)
    if cls is ConfigError:
        issues = [ConfigIssue(str(i.get("file", "")), i.get("line") if isinstance(i.get("line"), int) else None,
                              str(i.get("key", "")), str(i.get("problem", "")))
                  for i in error.get("issues", []) if isinstance(i, dict)]
        return ConfigError(issues or [ConfigIssue("remote", None, "", error["message"])], hint)
    return cls(error["message"], hint)
