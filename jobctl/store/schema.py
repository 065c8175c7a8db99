"""The history file's schema and its migrations; a damaged, read-only or full file said clearly
(`translate`, `Guarded`); what `jobctl doctor` checks and resets (`check_file`, `reset_file`)."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from jobctl.model import FailureKind
from jobctl.store.records import HistoryDamaged, default_path, utc_now

SCHEMA_VERSION = 4


# Migrations: MIGRATIONS[v] takes a database at user_version v to v + 1. Each runs inside
# the same write transaction as the version bump, so a half-migrated file cannot exist.
# To change the schema: append a function and bump SCHEMA_VERSION.
def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    statements = [
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids are printed and kept in logs
            created_at TEXT NOT NULL,
            recipe_path TEXT,
            recipe_name TEXT NOT NULL,
            recipe_text TEXT NOT NULL,
            recipe_hash TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            cluster TEXT NOT NULL,
            "partition" TEXT,
            scheduler TEXT NOT NULL CHECK (scheduler IN ('slurm', 'local')),
            scheduler_job_id TEXT,
            job_folder TEXT,
            state TEXT NOT NULL,
            exit_reason TEXT,
            parent_id INTEGER REFERENCES jobs(id),
            attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
            token TEXT NOT NULL UNIQUE,
            submitted_at TEXT,
            started_at TEXT,
            ended_at TEXT,
            predicted_peak_bytes INTEGER,
            measured_peak_bytes INTEGER,
            sweep_id TEXT,
            extra_json TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX jobs_scheduler_job_id ON jobs(scheduler_job_id)",
        "CREATE INDEX jobs_parent_id ON jobs(parent_id)",
        "CREATE INDEX jobs_state ON jobs(state)",
        "CREATE INDEX jobs_recipe_name ON jobs(recipe_name)",
        "CREATE INDEX jobs_sweep_id ON jobs(sweep_id)",
        """CREATE TABLE transitions (
            id INTEGER PRIMARY KEY,
            job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            at TEXT NOT NULL,
            state TEXT NOT NULL,
            detail TEXT
        )""",
        "CREATE INDEX transitions_job_id ON transitions(job_id, id)",
    ]
    for sql in statements:
        db.execute(sql)


_EXIT_CODE = r"^[0-9]+:[0-9]+$"


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """exit_reason carried a failure kind (CUDA_OOM), a scheduler exit code (1:0) or free text
    (sbatch's refusal) in one column: each goes to its own column, nothing is dropped."""
    kinds = [k.value for k in FailureKind]
    db.execute("ALTER TABLE jobs ADD COLUMN failure_kind TEXT")
    db.execute("ALTER TABLE jobs ADD COLUMN exit_code TEXT")
    db.execute("ALTER TABLE jobs ADD COLUMN detail TEXT")
    rows = db.execute("SELECT id, exit_reason FROM jobs WHERE exit_reason IS NOT NULL").fetchall()
    import re

    for job_id, reason in rows:
        column = ("failure_kind" if reason in kinds else
                  "exit_code" if re.match(_EXIT_CODE, reason) else "detail")
        db.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (reason, job_id))
    db.execute("ALTER TABLE jobs DROP COLUMN exit_reason")
    db.execute("CREATE INDEX jobs_failure_kind ON jobs(failure_kind)")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """Where a job runs was a key of extra_json ({"remote": {"cluster", "id", "folder"}}, a job
    submitted through a login node): it becomes three columns, read and written like the others.
    A row whose extra_json does not parse keeps it as it was; no row is dropped."""
    db.execute("ALTER TABLE jobs ADD COLUMN remote_cluster TEXT")
    db.execute("ALTER TABLE jobs ADD COLUMN remote_id INTEGER")
    db.execute("ALTER TABLE jobs ADD COLUMN remote_folder TEXT")
    rows = db.execute("SELECT id, extra_json FROM jobs WHERE extra_json LIKE '%\"remote\"%'").fetchall()
    for job_id, text in rows:
        try:
            extra = json.loads(text)
        except ValueError:
            continue
        remote = extra.pop("remote", None) if isinstance(extra, dict) else None
        if not isinstance(remote, dict):
            continue
        rid = remote.get("id")
        db.execute("UPDATE jobs SET remote_cluster = ?, remote_id = ?, remote_folder = ?, extra_json = ? WHERE id = ?",
                   (_text(remote.get("cluster")), rid if isinstance(rid, int) and not isinstance(rid, bool) else None,
                    _text(remote.get("folder")), json.dumps(extra), job_id))
    db.execute("CREATE INDEX jobs_remote_cluster ON jobs(remote_cluster)")


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    """Suspect nodes (issue 30): a node a hardware fault or a hang was pinned to, per cluster,
    with the kind, why, the job and when; the next attempts leave it out until it expires."""
    db.execute("""CREATE TABLE suspect_nodes (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            cluster TEXT NOT NULL,
            node TEXT NOT NULL,
            kind TEXT NOT NULL,
            reason TEXT NOT NULL,
            job_id INTEGER,
            at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        )""")
    db.execute("CREATE INDEX suspect_nodes_cluster ON suspect_nodes(cluster, expires_at)")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1, _migrate_1_to_2, _migrate_2_to_3,
                                                          _migrate_3_to_4]


# -- a damaged, read-only or full history ------------------------------------------------------

DAMAGED = ("not a database", "malformed", "corrupt", "file is encrypted", "unsupported file format")


def translate(e: sqlite3.DatabaseError, path: Path) -> BaseException:
    """sqlite's failures that are the file's, not jobctl's, as one clear HistoryDamaged; the
    rest (a lock being waited for, a constraint) unchanged."""
    text = str(e)
    if isinstance(e, sqlite3.IntegrityError) or "locked" in text or "busy" in text:
        return e
    if "readonly" in text or "read-only" in text:
        return HistoryDamaged(f"the history {path} is read-only ({text}): jobctl cannot record jobs",
                              hint=f"make it and its folder writable (chmod u+w {shlex.quote(str(path))} "
                                   f"{shlex.quote(str(path.parent))}), or set JOBCTL_HOME to a writable folder")
    if "full" in text:
        return HistoryDamaged(f"the disk holding the history {path} is full ({text})",
                              hint="free some space there, or set JOBCTL_HOME to a folder on another disk")
    if any(word in text for word in DAMAGED):
        copy = keep_damaged_copy(path)
        kept = f"; a copy is kept at {copy}" if copy else ""
        return HistoryDamaged(f"the history {path} is damaged ({text}){kept}",
                              hint="`jobctl doctor` checks it and says what can be recovered; `jobctl doctor "
                                   "--reset` moves it aside and starts an empty history (job folders are kept)")
    if isinstance(e, sqlite3.OperationalError) and "disk I/O" in text:
        return HistoryDamaged(f"the history {path} cannot be read or written: {text}",
                              hint="check the disk (dmesg) and that the file is on a local disk (JOBCTL_HOME)")
    return e


def keep_damaged_copy(path: Path) -> Path | None:
    """A copy of a damaged history next to it, once per state of the file (its size and
    modification time name the copy), owner-only; None when it cannot be made."""
    import shutil

    try:
        st = path.stat()
        copy = path.with_name(f"{path.name}.damaged-{int(st.st_mtime)}-{st.st_size}")
        if not copy.exists():
            tmp = copy.with_name(f".{copy.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out)
            tmp.replace(copy)
        return copy
    except OSError:
        return None


class Guarded:
    """The sqlite connection (and its cursors) with the file's failures translated (above)."""

    def __init__(self, inner, path: Path):
        self._inner, self._path = inner, path

    def _call(self, fn, *args):
        try:
            out = fn(*args)
        except sqlite3.DatabaseError as e:
            raise translate(e, self._path) from None
        return Guarded(out, self._path) if isinstance(out, sqlite3.Cursor) else out

    def execute(self, *args):
        return self._call(self._inner.execute, *args)

    def executemany(self, *args):
        return self._call(self._inner.executemany, *args)

    def executescript(self, *args):
        return self._call(self._inner.executescript, *args)

    def fetchone(self):
        return self._call(self._inner.fetchone)

    def fetchall(self):
        return self._call(self._inner.fetchall)

    def fetchmany(self, *args):
        return self._call(self._inner.fetchmany, *args)

    def __iter__(self):
        return iter(self.fetchall())

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):  # row_factory and the like belong to the connection
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)


# -- doctor ------------------------------------------------------------------------------------


def check_file(path: str | os.PathLike | None = None) -> dict:
    """What is known about the history file without changing it: where it is, its mode, its
    schema version, sqlite's own integrity check, the jobs it holds per state, and the copies
    kept of damaged versions. `ok` is False when it cannot be used as it is."""
    from urllib.parse import quote

    p = Path(path).expanduser() if path is not None else default_path()
    out: dict[str, Any] = {"path": str(p), "exists": p.exists(), "ok": True, "problems": [],
                           "copies": sorted(str(c) for c in p.parent.glob(f"{p.name}.damaged-*")) if p.parent.is_dir()
                           else []}
    if not p.exists():
        return out
    st = p.stat()
    out.update(size=st.st_size, mode=f"{st.st_mode & 0o777:04o}")
    if st.st_mode & 0o077:
        out["problems"].append(f"readable by others (mode {out['mode']}): recipes' launch.env may hold tokens; "
                               f"chmod 600 {shlex.quote(str(p))}")
    if not os.access(p, os.W_OK) or not os.access(p.parent, os.W_OK):
        out["ok"] = False
        out["problems"].append("read-only: jobctl cannot record jobs; make it and its folder writable")
    try:
        db = sqlite3.connect(f"file:{quote(str(p))}?mode=ro", uri=True, timeout=2.0)
        try:
            out["schema_version"] = db.execute("PRAGMA user_version").fetchone()[0]
            result = [r[0] for r in db.execute("PRAGMA integrity_check(20)").fetchall()]
            out["integrity"] = "ok" if result == ["ok"] else result
            if result != ["ok"]:
                out["ok"] = False
                out["problems"].append("sqlite's integrity check failed: " + "; ".join(result[:3]))
            out["jobs"] = dict(db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        out["ok"] = False
        out["problems"].append(f"sqlite cannot read it: {e}")
    return out


def reset_file(path: str | os.PathLike | None = None, *, clock: Callable[[], datetime] = utc_now) -> Path | None:
    """Move the history (with its -wal and -shm files) aside, to `<name>.reset-<time>`, so
    that the next command starts an empty one; returns where it went (None: there was none).
    Nothing is deleted: job folders stay, and the moved file can be inspected or restored."""
    p = Path(path).expanduser() if path is not None else default_path()
    if not p.exists():
        return None
    aside = p.with_name(f"{p.name}.reset-{clock().strftime('%Y%m%dT%H%M%S')}")
    for suffix in ("-wal", "-shm"):
        extra = p.with_name(p.name + suffix)
        if extra.exists():
            extra.replace(aside.with_name(aside.name + suffix))
    p.replace(aside)
    return aside
