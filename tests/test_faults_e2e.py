"""Faults during submission, on the dev cluster (a real slurmctld): an sbatch whose answer is
lost, and jobctl killed while sbatch runs. Each ends with the history matching Slurm: the job
found by the comment its submission carries (`#SBATCH --comment=jobctl:<job folder>`), never
submitted twice, and never recorded as failed while it runs."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobctl_run import history_rows as rows
from jobctl_run import jobctl

ROOT = Path(__file__).resolve().parent.parent


def fake_sbatch(tmp_path, after: str) -> dict:
    """A `sbatch` first on PATH that runs the real one, then does `after` (shell)."""
    real = shutil.which("sbatch")
    assert real, "the dev cluster's sbatch"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(f'#!/bin/sh\n"{real}" "$@" >/dev/null || exit $?\n{after}\n')
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def slurm_jobs_with_comment(comment: str) -> list[str]:
    out = subprocess.run(["squeue", "--me", "-h", "-o", "%i|%k"], capture_output=True, text=True, check=True).stdout
    return [line.split("|")[0] for line in out.splitlines() if line.split("|", 1)[-1] == comment]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JOBCTL_RECONCILE_AFTER_S", "1")
    return tmp_path / "home"


def sleeper(tmp_path, name: str) -> Path:
    import yaml

    doc = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    doc["name"] = name
    doc["launch"] = {"launcher": "none", "command": ["sleep", "60"]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_lost_sbatch_answer_is_reconciled_never_resubmitted(slurm_cluster, home, tmp_path):
    env = fake_sbatch(tmp_path, 'echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv '
                               'operation" >&2; exit 1')
    r = jobctl("submit", str(sleeper(tmp_path, "lost-answer")), "--cluster", "dev", env=env)
    assert r.returncode == 5 and "Slurm may have made the job" in r.stderr, r.stderr
    (row,) = rows(home)
    assert row["state"] == "PREPARED" and row["scheduler_job_id"] is None  # not SUBMIT_FAILED: it may exist
    comment = f"jobctl:{home / 'jobs' / ('%d-lost-answer' % row['id'])}"
    (real_id,) = slurm_jobs_with_comment(comment)  # Slurm did make it
    time.sleep(1.5)
    st = jobctl("status", "--json")
    assert st.returncode == 0, st.stderr
    (row,) = rows(home)
    assert row["scheduler_job_id"] == real_id and row["state"] in ("SUBMITTED", "PENDING", "RUNNING"), row
    assert slurm_jobs_with_comment(comment) == [real_id]  # one job, never submitted again
    jobctl("cancel", str(row["id"]))


def test_jobctl_killed_during_sbatch_leaves_a_row_status_reconciles(slurm_cluster, home, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **fake_sbatch(tmp_path, "sleep 120; echo 'Submitted batch job 1'")}
    p = subprocess.Popen([sys.executable, "-m", "jobctl", "submit", str(sleeper(tmp_path, "killed")), "--cluster",
                          "dev"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    comment = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (home / "history.sqlite").exists() and rows(home):
            comment = f"jobctl:{home / 'jobs' / ('%d-killed' % rows(home)[0]['id'])}"
            if slurm_jobs_with_comment(comment):
                break
        time.sleep(0.5)
    assert comment and slurm_jobs_with_comment(comment), "the job never reached Slurm"
    os.killpg(p.pid, signal.SIGKILL)  # jobctl and its sbatch, mid-call: no answer recorded
    p.wait(timeout=30)
    (row,) = rows(home)
    assert row["state"] == "PREPARED"
    time.sleep(1.5)
    st = jobctl("status", "--json")
    assert st.returncode == 0, st.stderr
    shown = {j["id"]: j for j in json.loads(st.stdout)}
    (row,) = rows(home)
    assert row["scheduler_job_id"] == slurm_jobs_with_comment(comment)[0], row
    assert shown[row["id"]]["state"] in ("SUBMITTED", "PENDING", "RUNNING")
    jobctl("cancel", str(row["id"]))


def test_a_node_that_fails_mid_job_is_recorded_as_node_fail(slurm_cluster, home, tmp_path):
    """The node under a running job goes DOWN (what slurmctld does when a node stops
    answering; scontrol does it at once). Slurm ends that run as NODE_FAIL and requeues the
    job. `jobctl status` records NODE_FAIL at the time Slurm ended the run: from the run itself
    when it looks in time, else from sacct's list of the job's runs (-D), where only the
    requeued successor is current (tests/test_sacct_runs.py pins that parse)."""
    r = jobctl("submit", str(sleeper(tmp_path, "node-fail")), "--cluster", "dev", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = rows(home)
    sid = row["scheduler_job_id"]
    node = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not node:
        out = subprocess.run(["squeue", "-h", "-j", sid, "-o", "%T|%N"], capture_output=True, text=True).stdout.strip()
        if out.startswith("RUNNING|"):
            node = out.split("|")[1]
        time.sleep(0.5)
    assert node, "the job never ran"
    try:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=jobctl-test"], check=True)
        deadline = time.monotonic() + 60
        states = []
        while time.monotonic() < deadline and "NODE_FAIL" not in states:
            time.sleep(2)
            assert jobctl("status", "--json").returncode == 0
            con = sqlite3.connect(home / "history.sqlite")
            states = [s for (s,) in con.execute("SELECT state FROM transitions WHERE job_id = ? ORDER BY id",
                                                (row["id"],))]
            con.close()
        assert "NODE_FAIL" in states, states
        # whether a look saw the failed run itself or only its requeued successor, the failure is
        # recorded once, at the time Slurm ended the run, however often status looks again
        for _ in range(2):
            time.sleep(1)
            assert jobctl("status", "--json").returncode == 0
        con = sqlite3.connect(home / "history.sqlite")
        failed = con.execute("SELECT at FROM transitions WHERE job_id = ? AND state = 'NODE_FAIL'",
                             (row["id"],)).fetchall()
        con.close()
        assert len(failed) == 1, failed
    finally:
        subprocess.run(["scancel", sid], check=False)
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def test_a_cancelled_job_shows_how_long_it_ran(slurm_cluster, home, tmp_path):
    """Started, first looked at 5 s later, then cancelled: its elapsed time counts from when
    Slurm started it (sacct's Start), not from when jobctl first saw it running (which showed
    a fraction of a second)."""
    r = jobctl("submit", str(sleeper(tmp_path, "cancelled")), "--cluster", "dev", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = rows(home)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", row["scheduler_job_id"], "-o", "%T"], capture_output=True,
                             text=True).stdout.strip()
        if out == "RUNNING":
            break
        time.sleep(0.3)
    ran_from = time.monotonic()
    time.sleep(5)
    assert jobctl("status").returncode == 0  # the first look: RUNNING, 5 s after the start
    assert jobctl("cancel", str(row["id"])).returncode == 0
    ran = time.monotonic() - ran_from
    time.sleep(2)
    (shown,) = [j for j in json.loads(jobctl("status", "--json").stdout) if j["id"] == row["id"]]
    assert shown["state"] == "CANCELLED"
    # sacct's times are whole seconds: allow one second either way
    assert ran - 1.5 <= shown["elapsed_s"] <= ran + 2.5, (shown["elapsed_s"], ran)
