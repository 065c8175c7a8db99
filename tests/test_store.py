"""store: the job history, against a real sqlite file (WAL) in tmp_path."""

from __future__ import annotations

import hashlib
import multiprocessing
import sqlite3
import stat
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pytest

from jobctl.errors import UsageError
from jobctl.model import JobState as State
from jobctl.planner.plan import Plan
from jobctl.store import history as store
from jobctl.store.history import (
    SCHEMA_VERSION,
    AmbiguousJobError,
    History,
    HistoryError,
    UnknownJobError,
    default_path,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
PLAN = Plan(nodes=1, gpus_per_node=8, tp=2, pp=1, dp=4, cp=1, sharding="zero1", micro_batch_size=1,
            grad_accum_steps=8, global_batch_size=32, recompute="none", offload="none", sequence_parallel=False)
RECIPE_TEXT = "name: tiny\nmodel: llama3-8b\ntrain:\n  seq_len: 2048\n  global_batch_size: 32\n"


class Clock:
    """A clock that moves one second per reading."""

    def __init__(self, start: datetime = T0):
        self.now = start

    def __call__(self) -> datetime:
        t = self.now
        self.now += timedelta(seconds=1)
        return t


def iso(dt: datetime) -> str:
    return dt.isoformat(timespec="microseconds")


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state" / "history.sqlite"


@pytest.fixture
def h(db_path):
    with History.open(db_path, clock=Clock()) as history:
        yield history


def prep(h: History, **kw) -> int:
    args = dict(recipe_name="tiny", recipe_text=RECIPE_TEXT, plan=PLAN, cluster="dev", scheduler="slurm",
                partition="gpu", recipe_path="recipes/tiny.yaml")
    args.update(kw)
    return h.prepare(**args)


# -- the file ----------------------------------------------------------------------------------


def test_open_creates_folders_and_a_wal_database(db_path):
    with History.open(db_path) as h:
        prep(h)
    assert db_path.exists()
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600
    raw = sqlite3.connect(db_path)  # a plain connection sees what is on disk
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"jobs", "transitions"} <= tables
    finally:
        raw.close()


def test_connection_settings(h):
    db = h._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] == store.BUSY_TIMEOUT_MS
    with pytest.raises(sqlite3.IntegrityError):  # parent_id references jobs
        db.execute("INSERT INTO jobs (created_at, recipe_name, recipe_text, recipe_hash, plan_json, cluster, "
                   "scheduler, state, parent_id, token) VALUES ('t', 'r', '', 'h', '{}', 'c', 'slurm', "
                   "'PREPARED', 999, 'tok')")


def test_default_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert str(default_path({"JOBCTL_HOME": "/data/jc", "XDG_STATE_HOME": "/x"})) == "/data/jc/history.sqlite"
    assert str(default_path({"XDG_STATE_HOME": "/x/state"})) == "/x/state/jobctl/history.sqlite"
    home_default = str(tmp_path / "home" / ".local" / "state" / "jobctl" / "history.sqlite")
    assert str(default_path({"XDG_STATE_HOME": "relative/state"})) == home_default  # XDG: relative is ignored
    assert str(default_path({"JOBCTL_HOME": "", "XDG_STATE_HOME": ""})) == home_default
    assert str(default_path({})) == home_default


def test_open_without_path_uses_jobctl_home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "jc" / "deep"))
    with History.open() as h:
        prep(h)
    assert (tmp_path / "jc" / "deep" / "history.sqlite").exists()


def test_newer_schema_is_refused(db_path):
    History.open(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(HistoryError, match=f"schema version {SCHEMA_VERSION + 1}; this jobctl knows up to"):
        History.open(db_path)


def test_migration_hook(db_path, monkeypatch):
    with History.open(db_path) as h:
        job = prep(h)
    assert len(store.MIGRATIONS) == SCHEMA_VERSION

    def add_column(db):
        db.execute("ALTER TABLE jobs ADD COLUMN note TEXT DEFAULT 'migrated'")

    monkeypatch.setattr(store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setattr(store, "MIGRATIONS", [*store.MIGRATIONS, add_column])
    with History.open(db_path) as h:
        assert h._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert h._db.execute("SELECT note FROM jobs WHERE id = ?", (job,)).fetchone()[0] == "migrated"


# -- writing -----------------------------------------------------------------------------------


def test_prepare_records_everything(h):
    job = prep(h, predicted_peak_bytes=70 * 2**30, sweep_id="s1", extra={"note": "x"}, token="tok-1")
    r = h.get(job)
    assert (r.id, r.state, r.attempt, r.parent_id) == (1, State.PREPARED, 1, None)
    assert r.created_at == iso(T0) == "2025-03-01T12:00:00.000000+00:00"
    assert r.recipe_hash == hashlib.sha256(RECIPE_TEXT.encode()).hexdigest()
    assert (r.recipe_name, r.recipe_path, r.recipe_text) == ("tiny", "recipes/tiny.yaml", RECIPE_TEXT)
    assert Plan.from_dict(r.plan) == PLAN
    assert (r.cluster, r.partition, r.scheduler) == ("dev", "gpu", "slurm")
    assert r.scheduler_job_id is None and r.job_folder is None and r.submitted_at is None
    assert (r.predicted_peak_bytes, r.sweep_id, r.extra, r.token) == (70 * 2**30, "s1", {"note": "x"}, "tok-1")
    assert [(t.state, t.at) for t in h.transitions(job)] == [(State.PREPARED, iso(T0))]


def test_prepare_with_a_known_token_returns_the_same_job(h):
    first = prep(h, token="abc")
    assert prep(h, token="abc") == first
    assert h.find_by_token("abc").id == first
    assert h.find_by_token("nope") is None
    assert len(h.list()) == 1
    with pytest.raises(HistoryError, match="already used by job #1 for a different recipe"):
        prep(h, token="abc", recipe_text="name: other\n")
    assert prep(h) != prep(h)  # without a token, every call is a new job


def test_prepare_refuses_bad_input(h):
    with pytest.raises(UsageError, match="scheduler must be 'slurm' or 'local'"):
        prep(h, scheduler="pbs")
    with pytest.raises(UnknownJobError, match="parent job #42"):
        prep(h, parent_id=42)
    assert h.list() == []


def test_submission_lifecycle(h):
    job = prep(h)
    h.mark_submitted(job, "4242", "/shared/jobs/4242")
    r = h.get(job)
    assert (r.state, r.scheduler_job_id, r.job_folder) == (State.SUBMITTED, "4242", "/shared/jobs/4242")
    assert r.submitted_at == iso(T0 + timedelta(seconds=1))
    h.mark_submitted(job, "4242", "/shared/jobs/4242")  # a retry after a lost answer: no-op
    with pytest.raises(HistoryError, match="already submitted as 4242"):
        h.mark_submitted(job, "9999", "/elsewhere")

    assert h.transition(job, "PENDING") is True
    assert h.transition(job, State.PENDING, "still pending") is False  # same state: nothing recorded
    assert h.transition(job, "RUNNING", "node1,node2") is True
    started = h.get(job).started_at
    assert started == h.transitions(job)[-1].at
    assert h.get(job).ended_at is None
    assert h.transition(job, "CANCELLED by 0", "scancel", detail="cancelled by user") is True
    r = h.get(job)
    assert (r.state, r.detail, r.started_at) == (State.CANCELLED, "cancelled by user", started)
    assert r.ended_at == h.transitions(job)[-1].at > started
    assert [(t.state, t.detail) for t in h.transitions(job)] == [
        (State.PREPARED, None), (State.SUBMITTED, None), (State.PENDING, None),
        (State.RUNNING, "node1,node2"), (State.CANCELLED, "scancel")]
    assert [t.at for t in h.transitions(job)] == sorted(t.at for t in h.transitions(job))


def test_transition_at_is_used_and_requeue_clears_ended_at(h):
    job = prep(h)
    h.mark_submitted(job, "77", "/f")
    at = datetime(2025, 3, 2, 8, 30, tzinfo=timezone(timedelta(hours=2)))  # stored in UTC
    h.transition(job, "RUNNING", at=at)
    assert h.get(job).started_at == "2025-03-02T06:30:00.000000+00:00"
    h.transition(job, "PREEMPTED")
    assert h.get(job).ended_at is not None and h.get(job).terminal
    h.transition(job, "PENDING", "requeued by submitit")
    r = h.get(job)
    assert r.ended_at is None and not r.terminal
    h.transition(job, "RUNNING")
    assert h.get(job).started_at == "2025-03-02T06:30:00.000000+00:00"  # the first start is kept


def test_a_verdict_recorded_while_sacct_lags_is_kept(h, monkeypatch):
    """The race CI once hit: a status reads the job as SUBMITTED; the job runs, fails, and its
    first node records FAILED (CUDA_OOM) while Slurm still says RUNNING (the node is submitting
    the next attempt); the status then records what sacct said. It must not take the job back
    to RUNNING, nor replace CUDA_OOM by sacct's exit code "1:0" on the next look."""
    from jobctl.backends.slurm import SlurmBackend
    from jobctl.jobs import status
    from jobctl.model import JobStatus as JobState

    job = prep(h)
    h.mark_submitted(job, "77", "/f")
    h.transition(job, "SUBMITTED")
    seen = [h.get(job)]  # what the status read
    h.transition(job, "FAILED", "CUDA out of memory", failure_kind="CUDA_OOM")  # the job's first node
    answers = iter([{"77": JobState("RUNNING")}, {"77": JobState("FAILED", "1:0")}])
    monkeypatch.setattr(SlurmBackend, "refresh", lambda self, records: next(answers))
    status.refresh(h, seen)
    assert (h.get(job).state.value, h.get(job).failure_kind) == ("FAILED", "CUDA_OOM")
    status.refresh(h, [h.get(job)])  # a later look, once Slurm has the job ended
    assert (h.get(job).state.value, h.get(job).failure_kind) == ("FAILED", "CUDA_OOM")
    assert [t.state.value for t in h.transitions(job)][-2:] == ["SUBMITTED", "FAILED"]


def test_transition_expect(h):
    job = prep(h)
    h.mark_submitted(job, "77", "/f")
    assert not h.transition(job, "RUNNING", expect="PENDING")  # the row says SUBMITTED
    assert h.get(job).state.value == "SUBMITTED"
    assert h.transition(job, "RUNNING", expect="SUBMITTED")
    assert h.get(job).state.value == "RUNNING"


def test_transition_errors(h):
    job = prep(h)
    with pytest.raises(UsageError, match="unknown job state 'DONE'"):
        h.transition(job, "DONE")
    with pytest.raises(UsageError, match="PREPARED is set by prepare"):
        h.transition(job, "PREPARED")
    with pytest.raises(UnknownJobError, match="no job #99"):
        h.transition(99, "RUNNING")
    with pytest.raises(ValueError, match="timezone-aware"):
        h.transition(job, "RUNNING", at=datetime(2025, 1, 1))


def test_submit_failed(h):
    job = prep(h)
    h.mark_submit_failed(job, "sbatch: error: invalid partition")
    r = h.get(job)
    assert (r.state, r.detail, r.scheduler_job_id) == (State.SUBMIT_FAILED, "sbatch: error: invalid partition",
                                                           None)
    assert r.ended_at is not None
    with pytest.raises(HistoryError, match="only a PREPARED job"):
        h.mark_submitted(job, "1", "/f")


def test_a_failed_write_leaves_nothing_behind(h, monkeypatch):
    """Ctrl-C in the middle of a write: the transaction rolls back as a whole."""
    job = prep(h)
    original = History._set_state

    def interrupted(self, *args):
        original(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(History, "_set_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        h.mark_submitted(job, "4242", "/f")
    monkeypatch.undo()
    r = h.get(job)
    assert (r.state, r.scheduler_job_id) == (State.PREPARED, None)
    assert len(h.transitions(job)) == 1
    h.mark_submitted(job, "4242", "/f")  # and the history is usable afterwards
    assert h.get(job).state is State.SUBMITTED


def test_ctrl_c_between_prepare_and_submit_leaves_a_prepared_row(db_path):
    """A process killed by SIGINT after prepare(): the PREPARED row is on disk, listed as such."""
    code = textwrap.dedent(f"""
        import os, signal
        # Ctrl-C as a terminal delivers it: Python raises KeyboardInterrupt only when it started
        # with SIGINT at its default, and a suite run as a background job (`pytest &` in a
        # non-interactive shell) hands its children SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from jobctl.store.history import History
        h = History.open({str(db_path)!r})
        h.prepare(recipe_name="tiny", recipe_text="x", plan={{}}, cluster="dev", scheduler="slurm", token="t1")
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C while "talking to Slurm"
        h.mark_submitted(1, "4242", "/f")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode != 0 and "KeyboardInterrupt" in res.stderr
    with History.open(db_path) as h:
        [r] = h.list()
        assert (r.state, r.scheduler_job_id, r.token) == (State.PREPARED, None, "t1")
        assert h.list(state="PREPARED") == [r]
        assert h.active() == []  # nothing to ask the scheduler about
        assert h.prepare(recipe_name="tiny", recipe_text="x", plan={}, cluster="dev", scheduler="slurm",
                         token="t1") == r.id  # a retry picks the row up again


# -- references --------------------------------------------------------------------------------


def test_get_resolves_references(h):
    a = prep(h)  # jobctl #1 = slurm 4242
    b = prep(h)  # jobctl #2 = slurm 1     (a Slurm id equal to a jobctl id)
    c = prep(h)  # jobctl #3 = slurm 77_3  (an array task)
    h.mark_submitted(a, "4242", "/f/a")
    h.mark_submitted(b, "1", "/f/b")
    h.mark_submitted(c, "77_3", "/f/c")
    for ref in (1, "1", "#1", "jobctl:1", " #1 ", "4242", "slurm:4242"):
        assert h.get(ref).id == a, ref
    # bare numbers prefer the jobctl id; the prefix says otherwise
    assert h.get("1").id == a
    assert h.get("slurm:1").id == b
    assert h.get("77_3").id == c and h.get("slurm:77_3").id == c
    with pytest.raises(UnknownJobError):
        h.get("local:4242")  # it is a Slurm job
    with pytest.raises(UnknownJobError, match="no job #4242"):
        h.get("#4242")  # an explicit jobctl id does not fall back
    with pytest.raises(UnknownJobError, match="no job '5555'"):
        h.get("5555")


@pytest.mark.parametrize("ref", ["", "abc", "#", "slurm:", "pbs:12", "#1_2", "12.0", "-1", True, "1 2"])
def test_get_rejects_what_is_not_a_reference(h, ref):
    with pytest.raises(UsageError):
        h.get(ref)


def test_scheduler_id_on_two_clusters_is_ambiguous(h):
    x = prep(h, cluster="a")
    y = prep(h, cluster="b")
    h.mark_submitted(x, "500", "/a")
    h.mark_submitted(y, "500", "/b")
    with pytest.raises(AmbiguousJobError, match=r"matches several jobs: #1 \(a, .*\), #2 \(b, .*\)"):
        h.get("500")
    assert h.get("500", cluster="b").id == y
    assert h.get("slurm:500", cluster="a").id == x


# -- lineage, listing, active ------------------------------------------------------------------


def test_chain_follows_parents_and_children(h):
    first = prep(h)
    other = prep(h, recipe_name="other")
    second = prep(h, parent_id=first)
    third = prep(h, parent_id=second)
    unrelated_child = prep(h, parent_id=other)
    attempts = {r.id: r.attempt for r in h.list()}
    assert (attempts[first], attempts[second], attempts[third], attempts[unrelated_child]) == (1, 2, 3, 2)
    for member in (first, second, third):
        assert [r.id for r in h.chain(member)] == [first, second, third]
    assert [r.id for r in h.chain(other)] == [other, unrelated_child]
    with pytest.raises(UnknownJobError):
        h.chain(999)


def test_list_200_jobs(h):
    ids = []
    for i in range(200):
        job = prep(h, recipe_name=f"r{i % 4}", cluster="h100" if i % 2 else "a100",
                   recipe_path=f"recipes/r{i % 4}.yaml")
        ids.append(job)
        if i % 5 == 0:
            h.mark_submitted(job, str(10_000 + i), f"/jobs/{i}")
            h.transition(job, "COMPLETED" if i % 10 == 0 else "RUNNING")
    everything = h.list()
    assert [r.id for r in everything] == sorted(ids, reverse=True)  # newest first
    assert len(everything) == 200 == len(set(r.id for r in everything))
    assert [r.id for r in h.list(limit=3)] == ids[-3:][::-1]
    assert {r.recipe_name for r in h.list(recipe="r1")} == {"r1"} and len(h.list(recipe="r1")) == 50
    assert len(h.list(recipe="recipes/r2.yaml")) == 50
    assert len(h.list(cluster="h100")) == 100
    assert len(h.list(state="COMPLETED")) == 20  # i = 0, 10, ..., 190
    assert len(h.list(state=["RUNNING", State.COMPLETED])) == 40
    assert len(h.list(state="PREPARED")) == 160
    assert len(h.list(recipe="r0", cluster="a100", state="COMPLETED")) == 10  # i = 0, 20, ... (even i, i%4 == 0)
    active = h.active()
    assert len(active) == 20 and all(r.state is State.RUNNING and r.scheduler_job_id for r in active)


def test_active_skips_terminal_and_unsubmitted_jobs(h):
    prepared = prep(h)
    pending = prep(h)
    done = prep(h)
    unknown = prep(h)
    for job, sid in ((pending, "1"), (done, "2"), (unknown, "3")):
        h.mark_submitted(job, sid, "/f")
    h.transition(pending, "PENDING")
    h.transition(done, "OUT_OF_MEMORY")
    h.transition(unknown, "UNKNOWN")
    assert [r.id for r in h.active()] == [pending, unknown]
    assert prepared not in [r.id for r in h.active()]


def test_set_measured_peak(h):
    job = prep(h)
    h.set_measured_peak(job, 71 * 2**30)
    assert h.get(job).measured_peak_bytes == 71 * 2**30


# -- two processes writing at once -------------------------------------------------------------


def _writer(path: str, name: str, count: int, barrier) -> None:
    barrier.wait()
    with History.open(path) as h:
        for i in range(count):
            job = h.prepare(recipe_name=name, recipe_text=f"{name} {i}", plan={"i": i}, cluster=name,
                            scheduler="slurm", token=f"{name}-{i}")
            h.mark_submitted(job, f"{name}-{i}", f"/jobs/{name}/{i}")
            h.transition(job, "RUNNING")


def test_concurrent_writers_lose_nothing(db_path):
    History.open(db_path).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    count = 150
    procs = [ctx.Process(target=_writer, args=(str(db_path), name, count, barrier)) for name in ("p1", "p2")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    with History.open(db_path) as h:
        jobs = h.list()
        assert len(jobs) == 2 * count
        assert sorted(r.id for r in jobs) == list(range(1, 2 * count + 1))
        for name in ("p1", "p2"):
            mine = h.list(cluster=name)
            assert sorted(r.token for r in mine) == sorted(f"{name}-{i}" for i in range(count))
            assert all(r.state is State.RUNNING for r in mine)
        counts = h._db.execute("SELECT count(*) FROM transitions").fetchone()[0]
        assert counts == 2 * count * 3  # PREPARED, SUBMITTED, RUNNING
        assert h._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- migrations -----------------------------------------------------------------------------------

# The schema as jobctl 0.1.0 (schema version 1) created it, verbatim: a fixture of what users have
# on disk, kept here so that the migration is tested against the old file, not against the new code.
V1_SCHEMA = [
    """CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, recipe_path TEXT,
        recipe_name TEXT NOT NULL, recipe_text TEXT NOT NULL, recipe_hash TEXT NOT NULL, plan_json TEXT NOT NULL,
        cluster TEXT NOT NULL, "partition" TEXT,
        scheduler TEXT NOT NULL CHECK (scheduler IN ('slurm', 'local')), scheduler_job_id TEXT, job_folder TEXT,
        state TEXT NOT NULL, exit_reason TEXT, parent_id INTEGER REFERENCES jobs(id),
        attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1), token TEXT NOT NULL UNIQUE, submitted_at TEXT,
        started_at TEXT, ended_at TEXT, predicted_peak_bytes INTEGER, measured_peak_bytes INTEGER, sweep_id TEXT,
        extra_json TEXT NOT NULL DEFAULT '{}')""",
    "CREATE INDEX jobs_scheduler_job_id ON jobs(scheduler_job_id)",
    "CREATE INDEX jobs_parent_id ON jobs(parent_id)",
    "CREATE INDEX jobs_state ON jobs(state)",
    "CREATE INDEX jobs_recipe_name ON jobs(recipe_name)",
    "CREATE INDEX jobs_sweep_id ON jobs(sweep_id)",
    """CREATE TABLE transitions (id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, at TEXT NOT NULL, state TEXT NOT NULL,
        detail TEXT)""",
    "CREATE INDEX transitions_job_id ON transitions(job_id, id)",
]


def test_an_old_history_keeps_every_row(db_path):
    """A schema-1 database (exit_reason held a failure kind, an exit code or free text in one
    column) opened by this jobctl: every row and transition is kept, and each exit_reason lands
    in the column that says what it is."""
    db_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(db_path)
    for sql in V1_SCHEMA:
        raw.execute(sql)
    reasons = ["CUDA_OOM", "1:0", "sbatch: error: invalid partition specified: nope", None, "HOST_OOM", "0:9"]
    states = ["FAILED", "FAILED", "SUBMIT_FAILED", "COMPLETED", "FAILED", "CANCELLED"]
    for i, (reason, state) in enumerate(zip(reasons, states), 1):
        raw.execute("""INSERT INTO jobs (created_at, recipe_name, recipe_text, recipe_hash, plan_json, cluster,
                       "partition", scheduler, scheduler_job_id, job_folder, state, exit_reason, parent_id, attempt,
                       token, measured_peak_bytes, extra_json)
                       VALUES (?, 'tiny', 'name: tiny', 'h', '{"tp": 1}', 'dev', 'gpu', 'slurm', ?, ?, ?, ?, ?, ?,
                       ?, ?, '{"overrides": ["a=1"]}')""",
                    (iso(T0), str(100 + i), f"/jobs/{i}-tiny", state, reason, i - 1 if i > 1 else None, i,
                     f"tok{i}", 1000 * i))
        raw.execute("INSERT INTO transitions (job_id, at, state, detail) VALUES (?, ?, 'PREPARED', NULL)", (i, iso(T0)))
        raw.execute("INSERT INTO transitions (job_id, at, state, detail) VALUES (?, ?, ?, 'seen')", (i, iso(T0), state))
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()

    with History.open(db_path) as h:
        assert h._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert h.suspect_nodes() == []  # version 4's table, made empty
        rows = sorted(h.list(), key=lambda r: r.id)
        assert [r.id for r in rows] == [1, 2, 3, 4, 5, 6]
        assert [(r.failure_kind, r.exit_code, r.detail) for r in rows] == [
            ("CUDA_OOM", None, None), (None, "1:0", None),
            (None, None, "sbatch: error: invalid partition specified: nope"), (None, None, None),
            ("HOST_OOM", None, None), (None, "0:9", None)]
        assert [r.state.value for r in rows] == states
        assert [(r.scheduler_job_id, r.job_folder, r.parent_id, r.attempt, r.token, r.measured_peak_bytes)
                for r in rows] == [(str(100 + i), f"/jobs/{i}-tiny", i - 1 if i > 1 else None, i, f"tok{i}", 1000 * i)
                                   for i in range(1, 7)]
        assert all(r.extra == {"overrides": ["a=1"]} and r.plan == {"tp": 1} for r in rows)
        assert [[(t.state.value, t.detail) for t in h.transitions(r.id)] for r in rows] == \
            [[("PREPARED", None), (s, "seen")] for s in states]
        assert [r.id for r in h.chain(3)] == [1, 2, 3, 4, 5, 6]
        # and it is writable in the new shape
        h.set_failure(2, "CUDA_OOM", "CUDA out of memory")
        assert (h.get(2).failure_kind, h.get(2).exit_code, h.get(2).detail) == ("CUDA_OOM", "1:0", "CUDA out of memory")


def test_where_a_job_runs_moves_from_extra_json_to_its_columns(db_path):
    """A schema-2 database (where a remote job runs was extra_json's "remote" key) opened by
    this jobctl: every row kept, the place in remote_cluster/remote_id/remote_folder and out of
    extra_json; rows whose extra_json is not what it should be are left as they were."""
    from jobctl.store.schema import MIGRATIONS

    db_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(db_path)
    for migrate in MIGRATIONS[:2]:  # the schema as jobctl 2 left it
        migrate(raw)
    extras = ['{"overrides": ["a=1"], "remote": {"cluster": "big", "id": 7, "folder": "/r/jobs/7-x"}}',
              '{"remote": {"cluster": "big"}}', '{"overrides": []}', 'not json "remote"',
              '{"remote": "big"}', '{"remote": {"cluster": "big", "id": true, "folder": 5}}']
    for i, extra in enumerate(extras, 1):
        raw.execute("""INSERT INTO jobs (created_at, recipe_name, recipe_text, recipe_hash, plan_json, cluster,
                       scheduler, state, attempt, token, extra_json)
                       VALUES (?, 'x', 'name: x', 'h', '{}', 'big', 'slurm', 'COMPLETED', 1, ?, ?)""",
                    (iso(T0), f"tok{i}", extra))
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    with History.open(db_path) as h:
        rows = {r.id: r for r in h.list()}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert [(r.remote_cluster, r.remote_id, r.remote_folder) for _, r in sorted(rows.items())] == [
        ("big", 7, "/r/jobs/7-x"), ("big", None, None), (None, None, None), (None, None, None),
        (None, None, None), ("big", None, None)]
    assert rows[1].extra == {"overrides": ["a=1"]} and rows[2].extra == {} and rows[3].extra == {"overrides": []}
    assert rows[4].extra_json == 'not json "remote"' and rows[5].extra == {"remote": "big"}
