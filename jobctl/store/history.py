"""Job history: a sqlite database (WAL) of every submission, its plan, attempts and outcome.

Where it lives (``default_path``): ``$JOBCTL_HOME/history.sqlite`` if JOBCTL_HOME is set,
else ``$XDG_STATE_HOME/jobctl/history.sqlite``, else ``~/.local/state/jobctl/history.sqlite``.
Keep it on a local disk: sqlite's WAL mode needs shared memory that NFS/Lustre do not give.

Submitting is two commits around the scheduler call::

    id = history.prepare(...)                          # 1. PREPARED row, committed
    job = executor.submit(...)                         # 2. talk to Slurm
    history.mark_submitted(id, job.job_id, folder)     # 3. SUBMITTED, with the Slurm id

A crash or Ctrl-C between 1 and 3 leaves a row in state PREPARED with no scheduler id;
``list`` shows it as PREPARED (it is never hidden or guessed at), ``active`` skips it (no
scheduler id to ask about). Retrying with the same ``token`` returns the same row instead
of a duplicate, so a caller that lost the answer can finish step 3.

Job references (``get``): ``12``, ``"12"``, ``"#12"`` and ``"jobctl:12"`` are jobctl ids;
``"slurm:4242"`` / ``"local:4242"`` are scheduler ids; a bare number is the jobctl id when
one exists, else a scheduler id (jobctl ids win because they are what jobctl prints); a
reference with ``_`` (``"4242_3"``, a Slurm array task) is always a scheduler id.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from jobctl.errors import UsageError
from jobctl.model import TERMINAL_STATES, FailureKind, JobState, Scheduler, parse_state
from jobctl.store.records import (  # noqa: F401  (re-exported: the history's values and errors)
    AmbiguousJobError,
    HistoryDamaged,
    HistoryError,
    JobRecord,
    Transition,
    UnknownJobError,
    _iso,
    default_path,
    utc_now,
)
from jobctl.store.schema import (  # noqa: F401  (re-exported: doctor's checks)
    MIGRATIONS,
    SCHEMA_VERSION,
    Guarded,
    check_file,
    keep_damaged_copy,
    reset_file,
    translate,
)

BUSY_TIMEOUT_MS = 30_000  # writers queue behind each other; a write holds the lock for ~ms


SUSPECT_TTL_S = 24 * 3600.0  # a suspect node stays out this long (a repaired node comes back by itself)


class History:
    """The job history. Use ``with History.open() as h:`` (or call ``close()``)."""

    def __init__(self, db: sqlite3.Connection, path: Path, clock: Callable[[], datetime] = utc_now):
        self._db = db
        self.path = path
        self._clock = clock

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike | None = None, *, clock: Callable[[], datetime] = utc_now) -> "History":
        """Open (creating folders, file and schema as needed) the history at ``path`` or the default."""
        p = Path(path).expanduser() if path is not None else default_path()
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not p.exists():
            # Recipes can carry tokens in their env: keep the file private. sqlite gives the
            # -wal and -shm files the permissions of the database file.
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
        # isolation_level=None: no implicit transactions; writes use BEGIN IMMEDIATE (below).
        try:
            db = Guarded(sqlite3.connect(p, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None), p)
        except sqlite3.DatabaseError as e:
            raise translate(e, p) from None
        try:
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = _when_unlocked(lambda: db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise HistoryError(f"{p}: sqlite could not switch to WAL mode (got {mode!r})",
                                   hint="Put the history on a local disk: set JOBCTL_HOME.")
            # FULL: a committed PREPARED row survives a power cut too; writes are a few per job.
            db.execute("PRAGMA synchronous = FULL")
            db.execute("PRAGMA foreign_keys = ON")
            history = cls(db, p, clock)
            history._migrate()
        except BaseException:
            db.close()
            raise
        return history

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"{self.path} has schema version {version}; this jobctl knows up to {SCHEMA_VERSION}",
                hint="Upgrade jobctl, or point JOBCTL_HOME at another folder.",
            )
        with self._write():
            # Re-read inside the lock: another process may have migrated meanwhile.
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](self._db)
                version += 1
                self._db.execute(f"PRAGMA user_version = {version}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self):
        return _WriteTransaction(self._db)

    def _now(self, at: datetime | None = None) -> str:
        return _iso(at if at is not None else self._clock())

    # -- writes --------------------------------------------------------------------------

    def prepare(
        self,
        *,
        recipe_name: str,
        recipe_text: str,
        plan: Any,
        cluster: str,
        scheduler: str,
        partition: str | None = None,
        recipe_path: str | None = None,
        parent_id: int | None = None,
        attempt: int | None = None,
        token: str | None = None,
        predicted_peak_bytes: int | None = None,
        sweep_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
        remote_cluster: str | None = None,
    ) -> int:
        """Record a PREPARED job (committed before the scheduler is contacted); return its id.

        ``plan`` is a Plan (anything with ``to_dict()``), a dict, or JSON text. ``attempt``
        defaults to 1, or the parent's attempt + 1. With a ``token`` already in the history
        the existing id is returned (idempotent retry), provided it is the same recipe.
        """
        try:
            scheduler = Scheduler(scheduler).value
        except ValueError:
            raise UsageError(f"scheduler must be 'slurm' or 'local', got {scheduler!r}") from None
        plan_json = _plan_json(plan)
        recipe_hash = hashlib.sha256(recipe_text.encode("utf-8")).hexdigest()
        import uuid  # only a write needs one (plan reads the history: start-up time)

        token = token or uuid.uuid4().hex
        now = self._now()
        with self._write():
            row = self._db.execute("SELECT id, recipe_hash FROM jobs WHERE token = ?", (token,)).fetchone()
            if row is not None:
                if row["recipe_hash"] != recipe_hash:
                    raise HistoryError(f"submission token {token!r} is already used by job #{row['id']} "
                                       "for a different recipe text")
                return row["id"]
            if parent_id is not None:
                parent = self._db.execute("SELECT attempt FROM jobs WHERE id = ?", (parent_id,)).fetchone()
                if parent is None:
                    raise UnknownJobError(f"parent job #{parent_id} is not in the history ({self.path})")
                if attempt is None:
                    attempt = parent["attempt"] + 1
            attempt = 1 if attempt is None else attempt
            cur = self._db.execute(
                """INSERT INTO jobs (created_at, recipe_path, recipe_name, recipe_text, recipe_hash,
                       plan_json, cluster, "partition", scheduler, state, parent_id, attempt, token,
                       predicted_peak_bytes, sweep_id, extra_json, remote_cluster)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (now, recipe_path, recipe_name, recipe_text, recipe_hash, plan_json, cluster, partition,
                 scheduler, JobState.PREPARED.value, parent_id, attempt, token, predicted_peak_bytes,
                 sweep_id, json.dumps(dict(extra or {})), remote_cluster),
            )
            job_id = cur.lastrowid
            self._db.execute("INSERT INTO transitions (job_id, at, state, detail) VALUES (?, ?, ?, ?)",
                             (job_id, now, JobState.PREPARED.value, None))
            return job_id

    def mark_submitted(self, job_id: int, scheduler_job_id: str, job_folder: str | os.PathLike | None,
                       *, at: datetime | None = None) -> None:
        """The scheduler accepted job ``job_id`` as ``scheduler_job_id``: state SUBMITTED.

        Repeating the call with the same scheduler id is a no-op (idempotent retry).
        """
        scheduler_job_id = str(scheduler_job_id)
        now = self._now(at)
        with self._write():
            row = self._row(job_id)
            if row["scheduler_job_id"] is not None:
                if row["scheduler_job_id"] == scheduler_job_id:
                    return
                raise HistoryError(f"job #{job_id} is already submitted as {row['scheduler_job_id']}, "
                                   f"not {scheduler_job_id}")
            if row["state"] != JobState.PREPARED.value:
                raise HistoryError(f"job #{job_id} is {row['state']}, only a PREPARED job can be marked submitted")
            self._db.execute(
                "UPDATE jobs SET scheduler_job_id = ?, job_folder = ?, submitted_at = ? WHERE id = ?",
                (scheduler_job_id, None if job_folder is None else str(job_folder), now, job_id),
            )
            self._set_state(row, JobState.SUBMITTED, None, now)

    def mark_submit_failed(self, job_id: int, detail: str, *, at: datetime | None = None) -> None:
        """The scheduler refused job ``job_id`` (or could not be reached): state SUBMIT_FAILED,
        its answer kept as the job's detail."""
        now = self._now(at)
        with self._write():
            row = self._row(job_id)
            if row["state"] != JobState.PREPARED.value:
                raise HistoryError(f"job #{job_id} is {row['state']}, only a PREPARED job can fail to submit")
            self._db.execute("UPDATE jobs SET detail = ? WHERE id = ?", (detail, job_id))
            self._set_state(row, JobState.SUBMIT_FAILED, detail, now)

    def transition(self, job_id: int, state: str | JobState, note: str | None = None,
                   at: datetime | None = None, *, failure_kind: FailureKind | str | None = None,
                   exit_code: str | None = None, detail: str | None = None,
                   expect: str | JobState | None = None) -> bool:
        """Move job ``job_id`` to ``state``; True if that changed it (same state: nothing recorded).

        ``note`` goes with the transition (why it changed); ``failure_kind``, ``exit_code`` and
        ``detail``, when given, are recorded on the job (why it ended). Entering RUNNING sets
        started_at (the first time only); entering a terminal state sets ended_at; leaving a
        terminal state (a requeue after preemption) clears ended_at.

        ``expect``: the state the caller's decision was based on. When the row holds another
        one, someone recorded a change since the caller read it (the job's first node writing
        its CUDA_OOM verdict while the scheduler still says RUNNING): nothing is recorded, and
        the caller's next look decides from fresh data.
        """
        new = parse_state(state)
        if new is JobState.PREPARED:
            raise UsageError("PREPARED is set by prepare() only")
        now = self._now(at)
        with self._write():
            row = self._row(job_id)
            if row["state"] == new.value:
                return False
            if expect is not None and row["state"] != parse_state(expect).value:
                return False
            self._set_ending(job_id, failure_kind, exit_code, detail)
            self._set_state(row, new, note, now)
            return True

    def set_failure(self, job_id: int, failure_kind: FailureKind | str | None, detail: str | None = None) -> None:
        """Record why job ``job_id`` failed (a later, better verdict: CUDA_OOM instead of exit 1:0)."""
        with self._write():
            self._row(job_id)
            self._db.execute("UPDATE jobs SET failure_kind = ? WHERE id = ?",
                             (None if failure_kind is None else FailureKind(failure_kind).value, job_id))
            if detail is not None:
                self._db.execute("UPDATE jobs SET detail = ? WHERE id = ?", (detail, job_id))

    def _set_ending(self, job_id: int, failure_kind, exit_code: str | None, detail: str | None) -> None:
        for column, value in (("failure_kind", None if failure_kind is None else FailureKind(failure_kind).value),
                              ("exit_code", exit_code), ("detail", detail)):
            if value is not None:
                self._db.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (value, job_id))

    def set_extra(self, job_id: int, extra: Mapping[str, Any]) -> None:
        """Replace the free-form ``extra`` of job ``job_id`` (its overrides, a calibration)."""
        with self._write():
            self._row(job_id)
            self._db.execute("UPDATE jobs SET extra_json = ? WHERE id = ?", (json.dumps(dict(extra)), job_id))

    def set_remote(self, job_id: int, cluster: str, remote_id: int | None, folder: str | None) -> None:
        """Where job ``job_id`` runs: on ``cluster``'s login node, as its job ``remote_id`` in ``folder``."""
        with self._write():
            self._row(job_id)
            self._db.execute("UPDATE jobs SET remote_cluster = ?, remote_id = ?, remote_folder = ? WHERE id = ?",
                             (cluster, remote_id, folder, job_id))

    def set_measured_peak(self, job_id: int, measured_peak_bytes: int) -> None:
        """Record the largest GPU memory peak measured on any rank of the job."""
        with self._write():
            self._row(job_id)
            self._db.execute("UPDATE jobs SET measured_peak_bytes = ? WHERE id = ?", (measured_peak_bytes, job_id))

    def _set_state(self, row: sqlite3.Row, new: JobState, detail: str | None, now: str) -> None:
        sets, args = ["state = ?"], [new.value]
        if new is JobState.RUNNING and row["started_at"] is None:
            sets.append("started_at = ?")
            args.append(now)
        if new in TERMINAL_STATES:
            sets.append("ended_at = ?")
            args.append(now)
        elif row["ended_at"] is not None:
            sets.append("ended_at = NULL")
        self._db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*args, row["id"]))
        self._db.execute("INSERT INTO transitions (job_id, at, state, detail) VALUES (?, ?, ?, ?)",
                         (row["id"], now, new.value, detail))

    def _row(self, job_id: int) -> sqlite3.Row:
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (int(job_id),)).fetchone()
        if row is None:
            raise UnknownJobError(f"no job #{job_id} in the history ({self.path})",
                                  hint="Run `jobctl history` to see the jobs it knows.")
        return row

    # -- reads ---------------------------------------------------------------------------

    def get(self, ref: int | str, *, cluster: str | None = None) -> JobRecord:
        """The job a reference names (see the module docstring); raises UnknownJobError."""
        kind, value = _parse_ref(ref)
        if kind in ("jobctl", "bare"):
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (int(value),)).fetchone()
            if row is not None:
                return JobRecord._from_row(row)
            if kind == "jobctl":
                raise UnknownJobError(f"no job #{value} in the history ({self.path})",
                                      hint="Run `jobctl history` to see the jobs it knows.")
        sql, args = "SELECT * FROM jobs WHERE scheduler_job_id = ?", [value]
        if kind in ("slurm", "local"):
            sql += " AND scheduler = ?"
            args.append(kind)
        if cluster is not None:
            sql += " AND cluster = ?"
            args.append(cluster)
        rows = self._db.execute(sql + " ORDER BY id", args).fetchall()
        if not rows:
            raise UnknownJobError(f"no job {ref!r} in the history ({self.path}): neither a jobctl id "
                                  "nor a scheduler job id it has recorded",
                                  hint="Run `jobctl history` to see the jobs it knows.")
        if len(rows) > 1:
            which = ", ".join(f"#{r['id']} ({r['cluster']}, {r['created_at'][:19]})" for r in rows)
            raise AmbiguousJobError(f"scheduler job id {value} matches several jobs: {which}",
                                    hint=f"Name one by its jobctl id, e.g. `#{rows[-1]['id']}`, or give the cluster.")
        return JobRecord._from_row(rows[0])

    def find_by_token(self, token: str) -> JobRecord | None:
        row = self._db.execute("SELECT * FROM jobs WHERE token = ?", (token,)).fetchone()
        return None if row is None else JobRecord._from_row(row)

    def list(self, recipe: str | None = None, state: str | JobState | Iterable[str | JobState] | None = None,
             cluster: str | None = None, limit: int | None = None, *,
             sweep_id: str | None = None) -> list[JobRecord]:
        """Jobs, newest first. ``recipe`` matches the recipe name or path; ``state`` one or several."""
        where, args = [], []
        if recipe is not None:
            where.append("(recipe_name = ? OR recipe_path = ?)")
            args += [recipe, recipe]
        if state is not None:
            states = [state] if isinstance(state, (str, JobState)) else list(state)
            values = [parse_state(s).value for s in states]
            where.append(f"state IN ({', '.join('?' * len(values))})")
            args += values
        if cluster is not None:
            where.append("cluster = ?")
            args.append(cluster)
        if sweep_id is not None:
            where.append("sweep_id = ?")
            args.append(sweep_id)
        sql = "SELECT * FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [JobRecord._from_row(r) for r in self._db.execute(sql, args)]

    def chain(self, job_id: int) -> list[JobRecord]:
        """The attempt chain through ``job_id``: its first ancestor, then every descendant.

        Ordered by (attempt, id). Two resubmissions of the same parent both appear.
        """
        self._row(job_id)
        root = self._db.execute(
            """WITH RECURSIVE up(id, parent_id, depth) AS (
                   SELECT id, parent_id, 0 FROM jobs WHERE id = ?
                   UNION
                   SELECT j.id, j.parent_id, up.depth + 1 FROM jobs j JOIN up ON j.id = up.parent_id
                   WHERE up.depth < 100000
               ) SELECT id FROM up ORDER BY depth DESC LIMIT 1""",
            (int(job_id),),
        ).fetchone()["id"]
        rows = self._db.execute(
            """WITH RECURSIVE down(id) AS (
                   SELECT ? UNION SELECT j.id FROM jobs j JOIN down ON j.parent_id = down.id
               ) SELECT jobs.* FROM jobs JOIN down ON jobs.id = down.id ORDER BY attempt, jobs.id""",
            (root,),
        )
        return [JobRecord._from_row(r) for r in rows]

    def active(self) -> list[JobRecord]:
        """Jobs the scheduler still has to be asked about: submitted and not in a terminal state."""
        terminal = [s.value for s in TERMINAL_STATES]
        rows = self._db.execute(
            f"""SELECT * FROM jobs WHERE scheduler_job_id IS NOT NULL
                AND state NOT IN ({', '.join('?' * len(terminal))}) ORDER BY cluster, id""",
            terminal,
        )
        return [JobRecord._from_row(r) for r in rows]

    def add_suspect_node(self, cluster: str, node: str, kind: FailureKind | str, reason: str,
                         job_id: int | None = None, ttl_s: float = SUSPECT_TTL_S) -> None:
        """Keep `node` of `cluster` out of the next attempts for `ttl_s` (a hardware fault or a
        hang pinned to it, in job `job_id`)."""
        now = self._clock()
        with self._write():
            self._db.execute(
                "INSERT INTO suspect_nodes (cluster, node, kind, reason, job_id, at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (cluster, node, FailureKind(kind).value, reason[:500], job_id, self._now(now),
                 self._now(now + timedelta(seconds=ttl_s))))

    def suspect_nodes(self, cluster: str | None = None) -> list[dict]:
        """The suspect nodes not expired yet (of `cluster`, or all), newest report of each node first."""
        now = self._now()
        sql = "SELECT cluster, node, kind, reason, job_id, at, expires_at FROM suspect_nodes WHERE expires_at > ?"
        args: list[Any] = [now]
        if cluster is not None:
            sql += " AND cluster = ?"
            args.append(cluster)
        out, seen = [], set()
        for r in self._db.execute(sql + " ORDER BY id DESC", args):
            if (r["cluster"], r["node"]) not in seen:
                seen.add((r["cluster"], r["node"]))
                out.append(dict(r))
        return out

    def transitions(self, job_id: int) -> list[Transition]:
        """Every state the job went through, oldest first."""
        self._row(job_id)
        rows = self._db.execute("SELECT job_id, at, state, detail FROM transitions WHERE job_id = ? ORDER BY id",
                                (int(job_id),))
        return [Transition(r["job_id"], r["at"], JobState(r["state"]), r["detail"]) for r in rows]


def _when_unlocked(op: Callable[[], Any], timeout_s: float = BUSY_TIMEOUT_MS / 1000):
    """Run `op`, retrying while another connection holds the lock. Switching a new file to WAL
    answers "database is locked" at once, without sqlite's busy handler, when another process
    is creating the same history at that moment (two first submissions racing)."""
    import time

    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return op()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(0.5, delay * 2)


def recent_jobs(path: str | os.PathLike, cluster: str, *, recent: int, failure_kind: FailureKind,
                max_failed: int, finished_states: tuple[JobState, ...], max_finished: int) -> dict[str, list[JobRecord]]:
    """What `jobctl plan` learns from, read-only, among the newest `recent` jobs of the history
    at `path` on `cluster`: the newest jobs that failed with `failure_kind` (at most
    `max_failed`), the jobs that continued them, and the newest jobs in `finished_states` with a
    predicted and a measured peak (at most `max_finished`). A rowid range bounds the scan and
    LIMIT the rows, so the cost stays flat however long the history grows.

    An older schema is migrated first (the one write this makes); a newer one is HistoryError."""
    try:
        return _recent_jobs(path, cluster, recent, failure_kind, max_failed, finished_states, max_finished)
    except sqlite3.Error as e:
        raise HistoryError(f"{path}: {e}") from None


def _recent_jobs(path, cluster, recent, failure_kind, max_failed, finished_states, max_finished):
    from urllib.parse import quote

    db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=1.0)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            db.close()
            History.open(path).close()
            db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=1.0)
        elif version > SCHEMA_VERSION:
            raise HistoryError(f"{path} has schema version {version}; this jobctl knows up to {SCHEMA_VERSION}")
        db.row_factory = sqlite3.Row
        window = "id > (SELECT COALESCE(MAX(id), 0) FROM jobs) - ? AND cluster = ?"
        failed = db.execute(f"SELECT * FROM jobs WHERE {window} AND failure_kind = ? ORDER BY id DESC LIMIT ?",
                            (recent, cluster, FailureKind(failure_kind).value, max_failed)).fetchall()
        states = [JobState(s).value for s in finished_states]
        finished = db.execute(
            f"""SELECT * FROM jobs WHERE {window} AND state IN ({", ".join("?" * len(states))})
                AND predicted_peak_bytes > 0 AND measured_peak_bytes > 0 ORDER BY id DESC LIMIT ?""",
            (recent, cluster, *states, max_finished)).fetchall()
        completed = db.execute(
            f"""SELECT * FROM jobs WHERE {window} AND state = ? AND predicted_peak_bytes > 0
                ORDER BY id DESC LIMIT ?""", (recent, cluster, JobState.COMPLETED.value, max_finished)).fetchall()
        children = []
        if failed:
            ids = [r["id"] for r in failed]
            children = db.execute(f"SELECT * FROM jobs WHERE parent_id IN ({', '.join('?' * len(ids))}) ORDER BY id",
                                  ids).fetchall()
    finally:
        db.close()
    return {"failed": [JobRecord._from_row(r) for r in failed], "finished": [JobRecord._from_row(r) for r in finished],
            "children": [JobRecord._from_row(r) for r in children],
            "completed": [JobRecord._from_row(r) for r in completed]}


class _WriteTransaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (KeyboardInterrupt included).

    IMMEDIATE takes the write lock up front, so busy_timeout applies: a deferred transaction
    that reads then writes can fail at once with SQLITE_BUSY when another writer got there first.
    """

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")


_REF = re.compile(r"(?:(?P<prefix>jobctl|slurm|local):|(?P<hash>#))?(?P<value>[0-9]+(?:_[0-9]+)?)")


def _parse_ref(ref: int | str) -> tuple[str, str]:
    """('jobctl' | 'slurm' | 'local' | 'bare' | 'scheduler', value) for a job reference."""
    if isinstance(ref, bool):
        raise UsageError(f"not a job reference: {ref!r}")
    if isinstance(ref, int):
        return "jobctl", str(ref)
    m = _REF.fullmatch(str(ref).strip())
    if not m:
        raise UsageError(f"not a job reference: {ref!r}",
                         hint="Use a jobctl id (12, #12, jobctl:12) or a scheduler id (4242, 4242_3, slurm:4242).")
    value = m["value"]
    if m["hash"] or m["prefix"] == "jobctl":
        if "_" in value:
            raise UsageError(f"not a jobctl id: {ref!r} (jobctl ids are whole numbers)")
        return "jobctl", value
    if m["prefix"]:
        return m["prefix"], value
    return ("scheduler" if "_" in value else "bare"), value


def _plan_json(plan: Any) -> str:
    if isinstance(plan, str):
        json.loads(plan)  # must be valid JSON
        return plan
    if hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    return json.dumps(plan)


def sync_measured_peak(history: History, record: JobRecord, measured_bytes: Iterable[int | None]) -> int | None:
    """Record the largest of `measured_bytes` (peaks of the job's GPUs or ranks, None for
    "not measured") as the job's measured_peak_bytes; return it, or None when nothing was
    measured. Writes only when the value changes, so reading reports stays read-only."""
    values = [int(v) for v in measured_bytes if v is not None]
    if not values:
        return None
    peak = max(values)
    if record.measured_peak_bytes != peak:
        history.set_measured_peak(record.id, peak)
    return peak


