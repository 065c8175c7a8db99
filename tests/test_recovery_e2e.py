"""OOM recovery end to end on the real dev Slurm: a payload that fails exactly as PyTorch does
on CUDA OOM above a micro-batch budget. Nobody watches: the test submits without --wait and
only polls the history afterwards."""

import json
import sqlite3
import time
from pathlib import Path

import pytest
from jobctl_run import jobctl

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "tests" / "payloads" / "oom_payload.py"



def recipe(tmp_path, budget: int) -> Path:
    import yaml

    # Llama 3.2 1B, 2048 tokens, 16 sequences per step, on one (fake) H100 with recomputation
    # and offload pinned off: the planner's largest micro-batch is 8 (77.6 GiB predicted),
    # and halving gives 4 (48.4 GiB) and 2 (33.8 GiB): `jobctl plan ... --json` shows these.
    doc = {
        "name": "oom-test",
        "model": "llama3.2-1b",
        "train": {"seq_len": 2048, "global_batch_size": 16, "precision": "bf16-mixed", "attention": "sdpa"},
        "framework": "generic",
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "dp": 1, "recompute": "none", "offload": "none"},
        "resources": {"time": "00:05:00"},
        "launch": {"launcher": "none", "command": ["python", str(PAYLOAD)],
                   "env": {"OOM_MAX_MICRO_BATCH": str(budget)}},
    }
    path = tmp_path / "oom.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def history(home):
    con = sqlite3.connect(home / "history.sqlite")
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM jobs ORDER BY id")]
    finally:
        con.close()


def poll_until(home, done, timeout_s=240):
    """Poll the history and the scheduler (jobctl status) until `done(rows)` or time out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobctl("status", "--json")  # one batched sacct call; records transitions
        rows = history(home)
        if done(rows):
            return rows
        time.sleep(3)
    raise AssertionError(f"timed out; history: {json.dumps(history(home), default=str)[:3000]}")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_oom_steps_down_and_completes_without_a_client(slurm_cluster, home, tmp_path):
    # The planner picks micro-batch 8 (x2 accumulation); the payload "fits" up to 2 sequences:
    # 8 -> 4 -> 2 by the ladder's micro-batch rung, 3 attempts.
    p = jobctl("submit", str(recipe(tmp_path, budget=2)), "--cluster", "dev", "--json")
    assert p.returncode == 0, p.stderr

    def finished(rows):
        return any(r["state"] == "COMPLETED" for r in rows)

    rows = poll_until(home, finished)
    assert [r["attempt"] for r in rows] == [1, 2, 3]
    assert [r["parent_id"] for r in rows] == [None, rows[0]["id"], rows[1]["id"]]
    plans = [json.loads(r["plan_json"]) for r in rows]
    assert [pl["micro_batch_size"] for pl in plans] == [8, 4, 2]
    assert {pl["global_batch_size"] for pl in plans} == {16}
    assert [pl["grad_accum_steps"] for pl in plans] == [2, 4, 8]
    assert [r["state"] for r in rows][:2] == ["FAILED", "FAILED"] and rows[2]["state"] == "COMPLETED"
    first = Path(rows[0]["job_folder"])
    outcome = json.loads((first / "outcome-node0.json").read_text())
    assert outcome["failure"]["kind"] == "CUDA_OOM"
    assert outcome["failure"]["oom"]["tried_to_allocate_bytes"] == 2 * (1 << 30)  # 0.25 GiB x mbs 8
    successor = json.loads((first / "successor.json").read_text())
    assert successor["jobctl_id"] == rows[1]["id"] and successor["rung"] == "micro-batch"


def test_always_oom_stops_after_max_attempts(slurm_cluster, home, tmp_path):
    p = jobctl("submit", str(recipe(tmp_path, budget=0)), "--cluster", "dev", "--max-attempts", "2", "--json")
    assert p.returncode == 0, p.stderr

    def settled(rows):
        return len(rows) == 2 and all(r["state"] == "FAILED" for r in rows) and \
            (Path(rows[-1]["job_folder"]) / "final.json").exists()

    rows = poll_until(home, settled)
    final = json.loads((Path(rows[-1]["job_folder"]) / "final.json").read_text())
    assert "attempt 2 of 2" in final["stopped"]
    assert len(history(home)) == 2  # no third job
