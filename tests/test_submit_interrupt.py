"""Ctrl-C during `jobctl submit` leaves the history consistent with the scheduler: every job
Slurm knows is recorded with its id, and every row without an id was never submitted."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ctrl_c_at_any_moment_keeps_history_and_slurm_in_step(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = dict(os.environ, JOBCTL_HOME=str(home), PYTHONPATH=str(ROOT))
    name = f"interrupt-{os.getpid()}"
    delays = [0.15, 0.3, 0.6, 0.9, 1.2, 1.6, 2.5]  # from just after start-up to after sbatch
    for delay in delays:
        p = subprocess.Popen([sys.executable, "-m", "jobctl", "submit", "recipes/tiny.yaml", "--cluster", "dev",
                              f"name={name}", "train.steps=2"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        # finished, interrupted cleanly, or killed by the signal before Python handled signals
        assert p.returncode in (0, 130, -signal.SIGINT), (p.returncode, err)
        assert b"Traceback" not in err
    time.sleep(1)
    rows = []
    if (home / "history.sqlite").exists():
        con = sqlite3.connect(home / "history.sqlite")
        rows = con.execute("SELECT id, state, scheduler_job_id FROM jobs").fetchall()
        con.close()
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-S", "now-1hours", "--name", name, "-o", "JobID"],
                         capture_output=True, text=True, check=True).stdout.split()
    in_slurm = set(out)
    recorded = {sid for _, _, sid in rows if sid}
    assert in_slurm == recorded  # nothing submitted without a record, nothing recorded that Slurm lacks
    for _, state, sid in rows:
        assert (state == "PREPARED") == (sid is None)  # an unsubmitted row stays visibly PREPARED
