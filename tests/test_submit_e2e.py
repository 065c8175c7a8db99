"""jobctl submit end to end: the real dev Slurm cluster (started by the test suite) and the
local executor. Jobs run real programs: the tiny training loop and tests/payloads/env_probe.py."""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from jobctl_run import jobctl

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "payloads" / "env_probe.py"
DEV2x2 = ROOT / "tests" / "data" / "clusters" / "dev-2x2.yaml"
HOSTILE = "it's \"quoted\" $(touch {marker}) `touch {marker}`; echo pwned > {marker}\nsecond line"



@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def rows(home):
    db = home / "history.sqlite"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    out = [dict(r) for r in con.execute("SELECT * FROM jobs ORDER BY id")]
    con.close()
    return out


def probe_recipe(tmp_path, name="probe", command=None, launcher="torchrun", env=None, pins=None):
    import yaml

    recipe = {
        "name": name,
        "model": {"family": "llama", "layers": 2, "hidden": 64, "ffn_hidden": 172, "heads": 4, "kv_heads": 2,
                  "vocab": 256},
        "train": {"seq_len": 64, "global_batch_size": 8, "precision": "fp32", "attention": "sdpa", "steps": 2},
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, **(pins or {})},
        "resources": {"time": "00:05:00"},
        "launch": {"launcher": launcher, "command": command or ["python", str(PROBE), "--mbs",
                                                                 "${plan.micro_batch_size}"],
                   "env": env or {}},
    }
    path = tmp_path / f"{name.split()[0]}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def probes(folder):
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in Path(folder).glob("probe-*.json")}


# --- real Slurm ------------------------------------------------------------------------------------

def test_tiny_recipe_one_node_completes_on_slurm(slurm_cluster, home):
    p = jobctl("submit", "recipes/tiny.yaml", "--cluster", "dev", "--wait")
    assert p.returncode == 0, p.stderr
    assert "loss" in p.stderr
    (job,) = rows(home)
    assert job["state"] == "COMPLETED" and job["scheduler"] == "slurm" and job["scheduler_job_id"]
    folder = Path(job["job_folder"])
    for name in ("recipe.yaml", "plan.json", "inventory.yaml", "sbatch.sh", "job.json"):
        assert (folder / name).exists(), name
    assert "step   20  loss" in (folder / "logs" / "node-0.log").read_text()
    rendered = (folder / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=1" in rendered
    # the script jobctl keeps is the one submitit handed to sbatch ...
    (submitted,) = folder.glob("*_submission.sh")
    assert rendered == submitted.read_text()
    # ... and the one --dry-run showed, but for the jobctl id a dry run cannot know
    dry = jobctl("submit", "recipes/tiny.yaml", "--cluster", "dev", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    shown = json.loads(dry.stdout)["sbatch"]
    assert shown.replace("/ID-tiny", f"/{job['id']}-tiny") == rendered


def test_two_nodes_torchrun_world_and_environment(slurm_cluster, home, tmp_path):
    pytest.importorskip("torch")
    recipe = probe_recipe(tmp_path, pins={"dp": 4})
    p = jobctl("submit", str(recipe), "--cluster", str(DEV2x2), "--wait", timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    (job,) = rows(home)
    plan = json.loads(job["plan_json"])
    assert (plan["nodes"], plan["gpus_per_node"], plan["dp"]) == (2, 2, 4)
    seen = probes(job["job_folder"])
    assert sorted(seen) == [0, 1, 2, 3]  # 2 nodes x 2 processes
    for rank, info in seen.items():
        env = info["env"]
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert (env["JOBCTL_TP"], env["JOBCTL_PP"], env["JOBCTL_DP"], env["JOBCTL_CP"]) == ("1", "1", "4", "1")
        assert env["JOBCTL_MICRO_BATCH_SIZE"] == str(plan["micro_batch_size"])
        assert env["JOBCTL_GRAD_ACCUM_STEPS"] == str(plan["grad_accum_steps"])
        assert info["argv"] == ["--mbs", str(plan["micro_batch_size"])]  # ${plan.micro_batch_size} resolved
        assert info["world"]["size"] == 4 and info["world"]["rank"] == rank
        gathered = info["world"]["gathered"]
        assert [g[0] for g in gathered] == [0, 1, 2, 3]
        assert sorted(g[1] for g in gathered) == [0, 0, 1, 1]  # two processes on each node


def test_hostile_strings_reach_the_job_intact(slurm_cluster, home, tmp_path):
    marker = tmp_path / "pwned"
    hostile = HOSTILE.format(marker=marker)
    recipe = probe_recipe(tmp_path, name="probe 'it' $(x)", launcher="none",
                          command=["python", str(PROBE), hostile, "two words", "$HOME"],
                          env={"HOSTILE_VALUE": hostile})
    p = jobctl("submit", str(recipe), "--cluster", "dev", "--wait")
    assert p.returncode == 0, p.stderr
    (job,) = rows(home)
    info = probes(job["job_folder"])[0]
    assert info["argv"] == [hostile, "two words", "$HOME"]
    assert info["env"]["HOSTILE_VALUE"] == hostile
    assert not marker.exists()
    assert job["recipe_name"] == "probe 'it' $(x)"


def test_sweep_with_equal_resources_is_one_sbatch_call(slurm_cluster, home, tmp_path):
    real = shutil.which("sbatch")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    count = tmp_path / "sbatch-calls"
    (bindir / "sbatch").write_text(f"#!/bin/sh\necho call >> '{count}'\nexec '{real}' \"$@\"\n")
    (bindir / "sbatch").chmod(0o755)
    p = jobctl("submit", "recipes/tiny.yaml", "--cluster", "dev", "--sweep", "train.lr=1e-4,3e-4",
               "--sweep", "train.steps=3,4", "--wait", env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert p.returncode == 0, p.stderr
    jobs = rows(home)
    assert len(jobs) == 4 and all(j["state"] == "COMPLETED" for j in jobs)
    assert len(count.read_text().splitlines()) == 1
    array = {j["scheduler_job_id"].split("_")[0] for j in jobs}
    assert len(array) == 1 and all("_" in j["scheduler_job_id"] for j in jobs)
    assert len({j["sweep_id"] for j in jobs}) == 1
    steps = sorted(json.loads(Path(j["job_folder"], "job.json").read_text())["command"][-3] for j in jobs)
    assert steps == ["3", "3", "4", "4"]


def test_unreachable_scheduler_records_nothing(slurm_cluster, home, tmp_path):
    conf = Path(os.environ["SLURM_CONF"])
    dead = tmp_path / "slurm.conf"
    text = "\n".join(("SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line)
                     for line in conf.read_text().splitlines())
    dead.write_text(text + "\n")
    p = jobctl("submit", "recipes/tiny.yaml", "--cluster", "dev", env={"SLURM_CONF": str(dead)})
    assert p.returncode == 5, p.stderr
    assert "Traceback" not in p.stderr and "controller" in p.stderr
    assert rows(home) == []


@pytest.mark.parametrize("change,needle", [
    ({"name": "nosuch"}, "partition"),
    ({"gpus_per_node": 16, "mem_gib": 60}, "node"),
])
def test_sbatch_rejection_is_shown_and_recorded(slurm_cluster, home, tmp_path, change, needle):
    import yaml

    inv = yaml.safe_load(DEV2x2.read_text())
    inv["name"] = "dev-bad"
    inv["partitions"][0].update(change)
    path = tmp_path / "dev-bad.yaml"
    path.write_text(yaml.safe_dump(inv))
    pins = ["parallelism.dp=16", "train.global_batch_size=16"] if "gpus_per_node" in change else []
    p = jobctl("submit", "recipes/tiny.yaml", "--cluster", str(path), *pins)
    assert p.returncode == 5, p.stderr + p.stdout
    assert "refused" in p.stderr and needle in p.stderr.lower() and "Traceback" not in p.stderr
    (job,) = rows(home)
    assert job["state"] == "SUBMIT_FAILED" and job["scheduler_job_id"] is None and job["detail"]


def test_dry_run_renders_and_check_asks_slurm(slurm_cluster, home, tmp_path):
    p = jobctl("submit", "recipes/tiny.yaml", "--cluster", str(DEV2x2), "parallelism.dp=4", "--dry-run", "--check",
               "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert "#SBATCH --nodes=2" in out["sbatch"] and "#SBATCH --ntasks-per-node=1" in out["sbatch"]
    assert out["env"]["JOBCTL_DP"] == "4" and len(out["nodes"]) == 2
    assert out["check"]["ok"] is True
    assert rows(home) == []  # a dry run submits and records nothing


# --- local executor ----------------------------------------------------------------------------------

def test_local_executor_runs_the_tiny_loop(home):
    p = jobctl("submit", "recipes/tiny.yaml", "--cluster", "local", "--wait")
    assert p.returncode == 0, p.stderr
    assert "step   20  loss" in p.stderr
    (job,) = rows(home)
    assert job["state"] == "COMPLETED" and job["scheduler"] == "local"


def test_local_executor_environment_and_hostile_strings(home, tmp_path):
    marker = tmp_path / "pwned"
    hostile = HOSTILE.format(marker=marker)
    recipe = probe_recipe(tmp_path, launcher="none", command=["python", str(PROBE), hostile],
                          env={"HOSTILE_VALUE": hostile, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    p = jobctl("submit", str(recipe), "--cluster", "local", "--wait")
    assert p.returncode == 0, p.stderr
    (job,) = rows(home)
    info = probes(job["job_folder"])[0]
    assert info["argv"] == [hostile]
    assert info["env"]["HOSTILE_VALUE"] == hostile
    assert info["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"  # the recipe overrides
    assert info["env"]["JOBCTL_WORLD_SIZE"] == "1"
    assert not marker.exists()


def test_failing_command_fails_the_job(home, tmp_path):
    recipe = probe_recipe(tmp_path, launcher="none", command=["python", "-c", "import sys; sys.exit(3)"])
    p = jobctl("submit", str(recipe), "--cluster", "local", "--wait")
    assert p.returncode == 4  # --wait: the job failed
    (job,) = rows(home)
    assert job["state"] == "FAILED"
