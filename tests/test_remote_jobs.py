"""The laptop side of remote jobs without SSH: mirroring the login node's answers into a real
sqlite history and a local copy of job folders, the remote error shape, and submission tokens.
The login node is replaced by recorded answers (jobctl.jobs.agent.describe's shape) and a stand-in
for the SFTP reads; the end-to-end path over a real sshd is tests/test_remote_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jobctl_run import ROOT, jobctl  # noqa: E402

from jobctl.errors import ConfigError, ConfigIssue, SchedulerError, UsageError  # noqa: E402
from jobctl.jobs import mirror  # noqa: E402
from jobctl.remote import client as remote_jobs  # noqa: E402
from jobctl.remote.protocol import (
    error_from_payload,  # noqa: E402
    error_payload,  # noqa: E402
)
from jobctl.store.history import History  # noqa: E402


class FakeFiles:
    """What the login node's files hold; counts the reads and their offsets."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.reads: list[tuple[str, int]] = []

    def get_bytes(self, path: str, *, offset: int = 0) -> bytes:
        self.reads.append((path, offset))
        return self.files[path][offset:]


class FakeLoginNode(remote_jobs.RemoteBackend):
    """The real RemoteBackend of cluster "big", its SFTP reads served by FakeFiles."""

    def __init__(self, files: FakeFiles):
        super().__init__("big", None)
        self.fake_files = files

    @property
    def remote(self):
        from types import SimpleNamespace

        return SimpleNamespace(files=self.fake_files)


def _described(rid, token, *, state="SUBMITTED", parent_token=None, attempt=1, files=(), failure_kind=None, exit_code=None,
               started_at=None, ended_at=None, sid=None, folder=None):
    return {"id": rid, "token": token, "parent_token": parent_token, "recipe_name": "oom", "recipe_text": "name: oom\n",
            "plan_json": json.dumps({"micro_batch_size": 8 // attempt}), "cluster": "big", "scheduler": "slurm",
            "partition": "gpu", "recipe_path": "oom.yaml", "attempt": attempt, "predicted_peak_bytes": 1 << 30,
            "sweep_id": None, "extra_json": "{}", "scheduler_job_id": sid or str(100 + rid), "state": state,
            "failure_kind": failure_kind, "exit_code": exit_code, "detail": None, "started_at": started_at, "ended_at": ended_at, "measured_peak_bytes": None,
            "job_folder": folder or f"/remote/jobs/{rid}-oom", "files": list(files)}


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))
    return tmp_path


def test_mirror_records_a_chain_with_local_ids(home):
    with History.open() as h:
        h.prepare(recipe_name="other", recipe_text="x", plan={}, cluster="here", scheduler="local")  # id 1 here
        answer = [
            _described(7, "tok", state="FAILED", exit_code="1:0", started_at="2026-11-21T10:00:00+00:00",
                       ended_at="2026-11-21T10:01:00+00:00"),
            _described(8, "child", parent_token="tok", attempt=2, state="RUNNING",
                       started_at="2026-11-21T10:02:00+00:00"),
        ]
        ids = mirror.mirror(h, FakeLoginNode(FakeFiles({})), answer)
        assert ids == {7: 2, 8: 3}
        parent, child = h.get(2), h.get(3)
        assert (parent.token, parent.state.value, parent.exit_code) == ("tok", "FAILED", "1:0")
        assert parent.started_at.startswith("2026-11-21T10:00:00") and parent.ended_at.startswith("2026-11-21T10:01")
        assert (child.parent_id, child.attempt, child.state.value) == (2, 2, "RUNNING")
        assert remote_jobs.cluster_of(child) == "big" and remote_jobs.cluster_of(h.get(1)) is None
        assert (child.remote_cluster, child.remote_id, child.remote_folder) == ("big", 8, "/remote/jobs/8-oom")
        # asked again later: nothing duplicated; the first node's verdict replaces sacct's exit code
        answer[0]["failure_kind"] = "CUDA_OOM"
        answer[1].update(state="COMPLETED", ended_at="2026-11-21T10:03:00+00:00")
        assert mirror.mirror(h, FakeLoginNode(FakeFiles({})), answer) == {7: 2, 8: 3}
        assert len(h.list()) == 3
        assert h.get(2).failure_kind == "CUDA_OOM" and h.get(3).state.value == "COMPLETED"
        assert [t.state.value for t in h.transitions(3)] == ["PREPARED", "SUBMITTED", "RUNNING", "COMPLETED"]


def test_mirror_copies_folders_incrementally_and_translates_ids(home):
    log = "/remote/jobs/7-oom/logs/node-0.log"
    files = FakeFiles({log: b"step 1\n", "/remote/jobs/7-oom/successor.json": json.dumps(
        {"jobctl_id": 8, "parent_id": 7, "rung": "micro-batch"}).encode(),
        "/remote/jobs/7-oom/submitit.json": b'{"job_id": "107", "submitit_folder": "/remote/jobs/7-oom"}',
        "/etc/passwd": b"root:x:0:0"})

    def listing():
        return [{"name": "logs/node-0.log", "path": log, "size": len(files.files[log]), "mtime": len(files.files[log])},
                {"name": "successor.json", "path": "/remote/jobs/7-oom/successor.json", "size": 1, "mtime": 1},
                {"name": "submitit.json", "path": "/remote/jobs/7-oom/submitit.json", "size": 1, "mtime": 1},
                {"name": "../../escape", "path": "/etc/passwd", "size": 9, "mtime": 1},
                {"name": "/etc/x", "path": "/etc/passwd", "size": 9, "mtime": 1}]

    with History.open() as h:
        answer = [_described(7, "tok", state="FAILED", files=listing()),
                  _described(8, "child", parent_token="tok", attempt=2)]
        mirror.mirror(h, FakeLoginNode(files), answer)
        folder = Path(h.get(1).job_folder)
        assert folder == home / "remote" / "big" / "1-oom"
        assert (folder / "logs" / "node-0.log").read_bytes() == b"step 1\n"
        assert json.loads((folder / "successor.json").read_text())["jobctl_id"] == 2  # the local id of remote #8
        assert json.loads((folder / "successor.json").read_text())["parent_id"] == 1
        assert json.loads((folder / "submitit.json").read_text())["submitit_folder"] == str(folder)
        assert not (home / "escape").exists() and not any("/etc/" in p and "passwd" in p for p, _ in files.reads)
        # the log grew: only the new bytes are read; unchanged files are not read again
        files.files[log] += b"step 2\n"
        files.reads.clear()
        answer[0]["files"] = listing()
        mirror.mirror(h, FakeLoginNode(files), answer)
        assert files.reads == [(log, len(b"step 1\n"))]
        assert (folder / "logs" / "node-0.log").read_bytes() == b"step 1\nstep 2\n"


@pytest.mark.parametrize("name,ok", [("logs/node-0.log", True), ("a", True), ("../x", False), ("/abs", False),
                                      ("a/../../b", False), ("a//b", False), ("", False), ("a\\..\\b", False)])
def test_copied_names_stay_inside_the_copy(name, ok):
    assert remote_jobs._safe_name(name) is ok


@pytest.mark.parametrize("error", [
    UsageError("bad flag", hint="use --x"),
    SchedulerError("sbatch refused: invalid partition", hint=None),
    ConfigError([ConfigIssue("recipe.json", 3, "train.seq_len", "must be > 0")], hint="fix it"),
])
def test_remote_error_shape_round_trips(error):
    """What `jobctl remote agent` prints for an error is read back as the same error class,
    message, hint and exit code (so a remote failure exits here as it did there)."""
    back = error_from_payload(json.loads(json.dumps(error_payload(error))))
    assert type(back) is type(error)
    assert (back.message, back.hint, back.exit_code) == (error.message, error.hint, error.exit_code)
    if isinstance(error, ConfigError):
        assert back.issues == error.issues


def test_local_submission_token_returns_the_same_job(tmp_path):
    env = {"JOBCTL_HOME": str(tmp_path), "JOBCTL_NO_CACHE": "1"}
    first = jobctl("submit", "recipes/tiny.yaml", "-c", "local", "--token", "t-1", "--json", env=env)
    assert first.returncode == 0, first.stderr
    again = jobctl("submit", "recipes/tiny.yaml", "-c", "local", "--token", "t-1", "--json", env=env)
    assert again.returncode == 0, again.stderr
    (a,), (b,) = json.loads(first.stdout), json.loads(again.stdout)
    assert (b["id"], b["scheduler_job_id"], b.get("existing")) == (a["id"], a["scheduler_job_id"], True)
    import sqlite3

    con = sqlite3.connect(tmp_path / "history.sqlite")
    assert con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 1
    con.close()


def test_concurrent_submissions_with_one_token_make_one_job(tmp_path, monkeypatch):
    """Two submissions with one token at the same moment (a retry racing the first attempt), each
    with its own connection to the history: one reaches the scheduler, the other waits for it and
    returns its job. The scheduler is a stand-in that takes 0.5 s to answer, so that without the
    lock both would check the token before either had recorded it, and both would submit."""
    import threading
    import time

    from jobctl.jobs import submission as submit
    from jobctl.planning import load_inventory, load_recipe, plan_on

    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))
    monkeypatch.chdir(ROOT)
    rec, inv = load_recipe("recipes/tiny.yaml", []), load_inventory("local")
    report = plan_on(rec, inv).to_dict()
    calls = []

    from jobctl.backends.base import Submitted
    from jobctl.jobs import placement

    class SlowScheduler:  # a JobBackend that takes 0.5 s to answer
        def check(self):
            pass

        def submit(self, requests, cwd=None):
            calls.append(requests)
            time.sleep(0.5)
            return [Submitted(str(4000 + len(calls)), r.folder.path) for r in requests]

    monkeypatch.setattr(placement, "backend", lambda scheduler: SlowScheduler())
    results, errors = [], []

    def one() -> None:
        sub = submit.prepare(rec, inv, report, [])
        sub.token = "race"
        try:
            with History.open() as h:
                results.append(submit.submit_all([sub], h)[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(calls) == 1
    assert len({(r["id"], r["scheduler_job_id"]) for r in results}) == 1 and len(results) == 2
    assert sorted(bool(r.get("existing")) for r in results) == [False, True]


def test_bad_token_and_sync_without_login_are_usage_errors(tmp_path):
    env = {"JOBCTL_HOME": str(tmp_path)}
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "local", "--token", "a b;rm", env=env)
    assert res.returncode == 2 and "--token" in res.stderr and "Traceback" not in res.stderr
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "local", "--sync", str(tmp_path), env=env)
    assert res.returncode == 2 and "no `login:` block" in res.stderr
    res = jobctl("remote", "bootstrap", "local", env=env)
    assert res.returncode == 2 and "no `login:` block" in res.stderr


def test_a_recipe_name_from_the_login_node_cannot_lead_the_copy_out_of_the_mirror(home, tmp_path):
    """The login node says the job's recipe is named "../../../../outside" (which, pasted into
    <mirror>/big/<id>-<name>, leads to the folder above JOBCTL_HOME); its files land in the
    mirror under a safe slug, owner-only, and nothing is written outside it."""
    log = "/remote/jobs/7-x/logs/node-0.log"
    files = FakeFiles({log: b"hello\n"})
    d = _described(7, "tok", state="FAILED", files=[{"name": "logs/node-0.log", "path": log, "size": 6, "mtime": 1}])
    d["recipe_name"] = "../../../../outside"
    with History.open() as h:
        mirror.mirror(h, FakeLoginNode(files), [d])
        folder = Path(h.get(1).job_folder)
    assert folder == home / "remote" / "big" / "1-outside"
    assert (folder / "logs" / "node-0.log").read_bytes() == b"hello\n"
    assert (folder / "logs" / "node-0.log").stat().st_mode & 0o077 == 0
    assert not (home.parent / "outside").exists() and not (home / "remote" / "outside").exists()
