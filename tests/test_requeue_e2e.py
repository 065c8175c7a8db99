"""Preemption on the real dev Slurm: the runner is checkpointable, so submitit requeues the
job and the training loop resumes from its own checkpoint instead of starting over."""

import sqlite3
import subprocess
import time
from pathlib import Path

from jobctl_run import jobctl

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "tests" / "payloads" / "resumable.py"



def test_preempted_job_is_requeued_and_resumes(slurm_cluster, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    recipe = tmp_path / "resumable.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "resumable",
        "model": {"family": "llama", "layers": 2, "hidden": 64, "ffn_hidden": 172, "heads": 4, "kv_heads": 2,
                  "vocab": 256},
        "train": {"seq_len": 64, "global_batch_size": 8, "precision": "fp32", "attention": "sdpa"},
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "dp": 1},
        "resources": {"time": "00:10:00"},
        "launch": {"launcher": "none", "command": ["python", str(PAYLOAD), "40"]},
    }))
    p = jobctl("submit", str(recipe), "--cluster", "dev", "--json")
    assert p.returncode == 0, p.stderr
    con = sqlite3.connect(tmp_path / "home" / "history.sqlite")
    (slurm_id, folder), = con.execute("SELECT scheduler_job_id, job_folder FROM jobs").fetchall()
    con.close()
    ckpt = Path(folder) / "checkpoint-step.txt"
    deadline = time.monotonic() + 120
    while not (ckpt.exists() and int(ckpt.read_text() or 0) >= 5):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)
    # What Slurm sends before preempting (and before a time limit): submitit's signal.
    subprocess.run(["scancel", "--signal=USR2", slurm_id], check=True)
    deadline = time.monotonic() + 240
    while True:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "State", "-j", slurm_id],
                             capture_output=True, text=True).stdout.split()
        if out and out[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        assert time.monotonic() < deadline, f"the requeued job did not finish: {out}"
        time.sleep(2)
    assert out[0] == "COMPLETED"
    starts = [int(x) for x in (Path(folder) / "starts.txt").read_text().split()]
    assert len(starts) >= 2 and starts[0] == 0 and starts[-1] >= 5  # resumed, not restarted
    assert int(ckpt.read_text()) == 40
