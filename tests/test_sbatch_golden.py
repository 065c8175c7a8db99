"""The sbatch scripts jobctl submits, pinned by golden files: one per shipped Slurm inventory,
for a one-node job, a multi-node job and a job array (a sweep).

The text is submitit's own (backends/slurm.py renders it through submitit's executor); these
files pin what jobctl asks of it: nodes, GPUs, CPUs, memory, time, partition, the signal for
checkpointing, the job array. Paths that depend on this machine are written as <home> (the
job folders' root) and <python>. Layouts are pinned in the overrides, so the planner's choices
do not move these files. To accept a deliberate change: JOBCTL_UPDATE_GOLDEN=1 pytest this file,
then read the diff.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from jobctl.jobs.submission import dry_run, prepare
from jobctl.planning import load_inventory, load_recipe, plan_on

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "golden" / "sbatch"

# (name, recipe, inventory, overrides, sweeps)
CASES = [
    ("tiny@dev-one-node", "recipes/tiny.yaml", "dev", ["parallelism.dp=1"], []),
    ("tiny@dev-array", "recipes/tiny.yaml", "dev", ["parallelism.dp=1"], ["train.lr=1e-4", "train.lr=3e-4",
                                                                          "train.lr=1e-3"]),
    ("llama8b@a100-80-one-node", "recipes/llama8b.yaml", "a100-80",
     ["parallelism.tp=1", "parallelism.pp=1", "parallelism.cp=1", "parallelism.dp=8"], []),
    ("llama8b@a100-40-multi-node", "recipes/llama8b.yaml", "a100-40",
     ["parallelism.tp=2", "parallelism.pp=1", "parallelism.cp=1", "parallelism.dp=16"], []),
    ("llama3.2-1b@a10g-multi-node", "recipes/llama3.2-1b-a10g.yaml", "a10g",
     ["parallelism.tp=1", "parallelism.pp=1", "parallelism.cp=1", "parallelism.dp=8", "resources.max_nodes=2",
      "launch.command=python train.py"], []),
    ("llama70b@h100-multi-node", "recipes/llama70b.yaml", "h100",
     ["parallelism.tp=8", "parallelism.pp=4", "parallelism.cp=1", "parallelism.dp=2"], []),
    ("llama405b@h100-multi-node", "recipes/llama405b.yaml", "h100",
     ["parallelism.tp=8", "parallelism.pp=16", "parallelism.cp=1", "parallelism.dp=1",
      "launch.command=python pretrain_gpt.py"], []),
]


@pytest.fixture(autouse=True)
def _home(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JOBCTL_NO_CACHE", "1")


def _script(recipe: str, inventory: str, overrides: list[str], sweeps: list[str]) -> list[str]:
    inv = load_inventory(inventory)
    subs = []
    for extra in ([[s] for s in sweeps] or [[]]):
        rec = load_recipe(recipe, overrides + extra)
        result = plan_on(rec, inv, alternatives=0)
        assert result.feasible, result.reasons
        subs.append(prepare(rec, inv, result.to_dict(), overrides + extra))
    out = dry_run(subs)
    scripts = {o["sbatch"] for o in out}
    assert len(scripts) == 1, "one sbatch call per group of equal resources"
    return scripts.pop()


@pytest.mark.parametrize("name, recipe, inventory, overrides, sweeps", CASES, ids=[c[0] for c in CASES])
def test_sbatch_script_matches_its_golden_file(name, recipe, inventory, overrides, sweeps, tmp_path):
    text = _script(recipe, inventory, overrides, sweeps)
    text = text.replace(str(tmp_path / "home" / "jobs"), "<home>/jobs").replace(sys.executable, "<python>")
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("JOBCTL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with JOBCTL_UPDATE_GOLDEN=1 and read it"
    assert text == path.read_text(), f"the sbatch script for {name} changed; see the diff above"


def test_golden_files_say_what_jobctl_asks_for():
    """What the files must hold, written out by hand from the inventories and the pinned
    layouts (so that a wrong golden file cannot pass): nodes = tp*pp*dp*cp / gpus per node;
    the node's CPUs and memory in proportion to the GPUs used; one task per node; the USR2 checkpoint signal."""
    expect = {
        # tiny uses 1 of the node's 8 GPUs: 1/8 of its 16 CPUs = 2, of its 62 GiB = 7.75 GiB = 7936 MiB
        "tiny@dev-one-node": {"--nodes=1", "--ntasks-per-node=1", "--partition=gpu", "--signal=USR2@30",
                              "--cpus-per-task=2", "--mem=7936M"},
        "tiny@dev-array": {"--array=0-2%3", "--nodes=1"},
        "llama8b@a100-80-one-node": {"--nodes=1", "--gpus-per-node=8", "--gres=gpu:8"},
        "llama8b@a100-40-multi-node": {"--nodes=4", "--gpus-per-node=8"},  # 2*1*16 = 32 GPUs
        "llama3.2-1b@a10g-multi-node": {"--nodes=2", "--gpus-per-node=4", "--gres=gpu:4"},  # 8 GPUs, 4 a node
        "llama70b@h100-multi-node": {"--nodes=8", "--cpus-per-task=192", "--mem=2000G"},  # 8*4*2 = 64
        "llama405b@h100-multi-node": {"--nodes=16", "--gpus-per-node=8"},  # 8*16 = 128
    }
    for name, flags in expect.items():
        lines = {line.removeprefix("#SBATCH ") for line in (GOLDEN / f"{name}.sh").read_text().splitlines()}
        assert flags <= lines, (name, flags - lines)
