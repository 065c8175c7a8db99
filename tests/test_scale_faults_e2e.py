"""What stops big jobs, on the dev Slurm cluster (issue 30), through `jobctl submit ... --wait`:
a hang, a GPU fault on one node, a node going down under a job, an OOM chain, each followed by
an attempt that resumes from the chain's checkpoint instead of step 0.

The payload (tests/payloads/hang_payload.py) checkpoints every step as a step-N folder in
$JOBCTL_CHECKPOINT_DIR, resumes after $JOBCTL_RESUME_STEP, and appends every step it runs to
steps-run.txt beside the checkpoints: the steps of all attempts together must be 1..N, each once.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from jobctl_run import history_rows as rows
from jobctl_run import jobctl

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "tests" / "payloads" / "hang_payload.py"
STEPS = 8


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def recipe(tmp_path, env: dict, steps: int = STEPS, **train) -> Path:
    import yaml

    doc = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    doc["name"] = "faults"
    doc["train"].update(train)
    doc["resources"]["time"] = "00:05:00"
    doc["launch"] = {"launcher": "none", "command": ["python", str(PAYLOAD), str(steps)],
                     "env": {k: str(v) for k, v in env.items()}}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def steps_run(first_folder: str) -> list[int]:
    return [int(x) for x in (Path(first_folder) / "steps-run.txt").read_text().split()]


def outcome(folder: str, node: int = 0) -> dict:
    return json.loads((Path(folder) / f"outcome-node{node}.json").read_text())


def test_a_hang_is_caught_its_stacks_kept_and_the_next_attempt_resumes(slurm_cluster, home, tmp_path):
    # the payload stops for good before step 4; the watchdog's threshold is 5 s (--hang-after)
    r = jobctl("submit", str(recipe(tmp_path, {"HANG_AT_STEP": 4})), "--cluster", "dev", "--hang-after", "5",
               "--wait", timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    first, second = rows(home)
    assert (first["state"], first["failure_kind"], second["state"]) == ("FAILED", "HANG", "COMPLETED")
    assert (second["parent_id"], second["attempt"]) == (first["id"], 2)
    got = outcome(first["job_folder"])
    assert (got["failure"]["kind"], got["last_step"], got["checkpoint_step"]) == ("HANG", 3, 3)
    # detected within its threshold: the watchdog looks every 2 s, so at most 5 + 2 s idle
    idle = int(re.search(r"no progress for (\d+) s after step 3", got["failure"]["summary"])[1])
    assert 5 <= idle <= 7, got["failure"]
    # every rank's Python stack is in the job folder: the payload's own frame where it waits
    stacks = (Path(first["job_folder"]) / "stacks" / "node0.txt").read_text()
    assert "in stuck_in_a_collective" in stacks, stacks
    # the next attempt resumed from step 3 and ran 4..8: the planned 8 steps in total, each once
    successor = json.loads((Path(first["job_folder"]) / "successor.json").read_text())
    assert (successor["resumes_from_step"], successor["rung"]) == (3, "same plan")
    log = (Path(second["job_folder"]) / "logs" / "node-0.log").read_text()
    assert "resuming from the chain's checkpoint of step 3" in log
    assert steps_run(first["job_folder"]) == list(range(1, STEPS + 1))
    extra = json.loads(first["extra_json"])
    assert extra["progress"] == {"last_step": 3, "checkpoint_step": 3}


def test_an_xid_on_one_node_keeps_that_node_out_and_the_chain_completes_on_the_other(slurm_cluster, home, tmp_path):
    r = jobctl("submit", str(recipe(tmp_path, {"XID_ON_FIRST_NODE": 1})), "--cluster", "dev", "--wait", timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    first, second = rows(home)
    bad = outcome(first["job_folder"])["host"]
    assert bad in ("node1", "node2")
    assert (first["failure_kind"], second["state"]) == ("HARDWARE", "COMPLETED")
    # the next attempt's own sbatch script keeps the node out, and it ran on the other one
    script = (Path(second["job_folder"]) / "sbatch.sh").read_text()
    assert f"#SBATCH --exclude={bad}" in script, script
    assert outcome(second["job_folder"])["host"] == ({"node1", "node2"} - {bad}).pop()
    assert steps_run(first["job_folder"]) == list(range(1, STEPS + 1))
    # the history keeps the suspect node, with why, until it expires; `clusters check` lists it
    c = jobctl("clusters", "check", "dev", "--json")
    (suspect,) = json.loads(c.stdout)["suspect_nodes"]
    assert (suspect["node"], suspect["kind"], suspect["job_id"]) == (bad, "HARDWARE", first["id"])
    assert "fatal Xid" in suspect["reason"] and "79, pid=4242" in suspect["reason"]  # the payload's driver line


def test_a_node_set_down_under_a_running_job_is_not_where_it_resumes(slurm_cluster, home, tmp_path):
    """scontrol sets the node DOWN (what slurmctld does when a node stops answering): Slurm ends
    the run NODE_FAIL and requeues the job. The dev cluster's nodes come back at once
    (ReturnToService=2), so Slurm alone could give the job the same node again: `submit --wait`
    sees the failed run, records the node as a suspect and keeps the waiting job off it
    (ExcNodeList); the job runs again on the other node and resumes from its checkpoint."""
    path = recipe(tmp_path, {"STEP_S": 0.5}, steps=16)
    result: dict = {}
    waiter = threading.Thread(target=lambda: result.update(r=jobctl("submit", str(path), "--cluster", "dev",
                                                                    "--wait", timeout=400)))
    waiter.start()
    node = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and node is None:
        found = rows(home) if (home / "history.sqlite").exists() else []
        if found and found[0]["job_folder"] and (Path(found[0]["job_folder"]) / "steps-run.txt").exists():
            sid = found[0]["scheduler_job_id"]
            out = subprocess.run(["squeue", "-h", "-j", sid, "-o", "%T|%N"], capture_output=True, text=True).stdout
            if out.startswith("RUNNING|"):
                node = out.strip().split("|")[1]
        time.sleep(0.5)
    assert node, "the job never ran"
    try:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=jobctl-test"], check=True)
        waiter.join(timeout=400)
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    r = result["r"]
    (row,) = rows(home)
    assert r.returncode == 0 and row["state"] == "COMPLETED", (r.stdout[-3000:], r.stderr[-3000:])
    assert outcome(row["job_folder"])["host"] != node  # the requeued run landed elsewhere
    shown = subprocess.run(["scontrol", "show", "job", row["scheduler_job_id"]], capture_output=True, text=True).stdout
    assert f"ExcNodeList={node}" in shown, shown
    c = jobctl("clusters", "check", "dev", "--json")
    assert [(s["node"], s["kind"]) for s in json.loads(c.stdout)["suspect_nodes"]] == [(node, "NODE_FAIL")]
    log = (Path(row["job_folder"]) / "logs" / "node-0.log").read_text()
    assert "resuming from the chain's checkpoint of step" in log
    done = steps_run(row["job_folder"])
    assert sorted(set(done)) == list(range(1, 17)) and len(done) - len(set(done)) <= 1  # at most the step in flight


def test_an_oom_chains_next_attempt_resumes_from_the_last_checkpoint(slurm_cluster, home, tmp_path):
    # Llama 3.2 1B at 2048 tokens on one (fake) H100: the planner picks micro-batch 8, the
    # payload fits 4 and runs out of memory at step 3 (after checkpoints 1 and 2)
    path = recipe(tmp_path, {"OOM_AT_STEP": 3, "OOM_MAX_MICRO_BATCH": 4})
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["model"] = "llama3.2-1b"
    doc["train"].update({"seq_len": 2048, "global_batch_size": 16, "precision": "bf16-mixed"})
    doc["parallelism"] = {"tp": 1, "pp": 1, "cp": 1, "dp": 1, "recompute": "none", "offload": "none"}
    path.write_text(yaml.safe_dump(doc))
    r = jobctl("submit", str(path), "--cluster", "dev", "--wait", timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    first, second = rows(home)
    assert first["failure_kind"] == "CUDA_OOM"
    plans = [json.loads(x["plan_json"]) for x in (first, second)]
    assert [p["micro_batch_size"] for p in plans] == [8, 4] and plans[1]["global_batch_size"] == 16
    successor = json.loads((Path(first["job_folder"]) / "successor.json").read_text())
    assert (successor["rung"], successor["resumes_from_step"]) == ("micro-batch", 2)
    log = (Path(second["job_folder"]) / "logs" / "node-0.log").read_text()
    assert "resuming from the chain's checkpoint of step 2" in log
    assert steps_run(first["job_folder"]) == list(range(1, STEPS + 1))
