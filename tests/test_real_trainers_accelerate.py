"""Real trainers in CI (issue 33), accelerate: Hugging Face's Trainer (tests/trainers/hf_train.py)
trains a tiny transformers Llama with the TrainingArguments jobctl renders for the fsdp framework,
through `jobctl submit --wait`:

- on this machine's two CPU ranks (local scheduler, jobctl's torchrun with the accelerate
  environment jobctl renders): accelerate runs MULTI_CPU on gloo, and jobctl planned sharding
  none there because accelerate applies FSDP only on GPUs (state.py);
- on the dev Slurm cluster's two nodes (tests/data/clusters/dev-2x1.yaml: one rank per node),
  both ways a user starts it: `accelerate launch ${framework.launch_args}` (the YAML route, with
  each node's machine rank and the first node's address filled in per node) and jobctl's torchrun
  (the environment route). The nodes have no GPU, so the command adds --use_cpu (a test
  stand-in); the rest is as rendered.

Expectations from outside jobctl: accelerate's own state reports the world size and the
distributed type; an untrained model's loss is about ln(vocab) = ln(256); the task is learnable,
so the loss must fall well below it; 8 = 2 ranks x micro-batch 2 x accumulation 2.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jobctl_run import history_rows, jobctl, need_package

from jobctl.model import CHECKPOINT_DIR_TOKEN
from jobctl.planning import load_inventory, load_recipe, plan_on

ROOT = Path(__file__).resolve().parent.parent

RECIPE = "tests/data/trainers/hf-ddp.yaml"
LOCAL = "tests/data/trainers/cpu2.yaml"
DEV = "tests/data/clusters/dev-2x1.yaml"
VOCAB, STEPS = 256, 30  # as written in the recipe
SHAPE = ("--layers ${model.layers} --hidden ${model.hidden} --ffn-hidden ${model.ffn_hidden} --heads ${model.heads} "
         "--kv-heads ${model.kv_heads} --vocab ${model.vocab} --seq-len ${train.seq_len}")


def train(tmp_path, cluster, *overrides) -> tuple[dict, dict, list[str]]:
    need_package("accelerate")
    need_package("transformers")
    home = tmp_path / "home"
    r = jobctl("submit", RECIPE, *overrides, "--cluster", cluster, "--wait", env={"JOBCTL_HOME": str(home)},
               timeout=540)
    rows = history_rows(home)
    assert rows, (r.stdout[-2000:], r.stderr[-2000:])
    (row,) = rows
    folder = Path(row["job_folder"])
    logs = {int(p.stem.split("-")[1]): p.read_text(errors="replace") for p in (folder / "logs").glob("node-*.log")}
    assert r.returncode == 0 and row["state"] == "COMPLETED", (r.stderr[-2000:], {k: v[-3000:] for k, v in logs.items()})
    return json.loads(row["plan_json"]), logs, (folder / "framework" / "accelerate_config.yaml").read_text()


def check_learned(log: str) -> None:
    seen = {int(s): float(v) for s, v in re.findall(r"hf_train: step (\d+) loss ([\d.]+)", log)}
    assert sorted(seen) == list(range(1, STEPS + 1)), sorted(seen)
    assert abs(seen[1] - math.log(VOCAB)) < 0.5, seen[1]
    tail = sum(seen[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert tail < 0.4 * seen[1], seen


def world(log: str) -> tuple[int, str, int, int]:
    m = re.search(r"hf_train: world (\d+) type (\w+) micro (\d+) accum (\d+)", log)
    return int(m[1]), m[2], int(m[3]), int(m[4])


def test_accelerate_trains_on_cpu_ranks_as_planned_there(tmp_path):
    plan, logs, config = train(tmp_path, LOCAL)
    assert plan["sharding"] == "none" and plan["dp"] == 2  # FSDP is GPU-only in accelerate
    assert "use_cpu: true" in config
    assert world(logs[0]) == (2, "MULTI_CPU", 2, 2) and 2 * 2 * 2 == plan["global_batch_size"]
    check_learned(logs[0])


@pytest.mark.parametrize("route", ["accelerate launch", "torchrun"])
def test_two_node_accelerate_job_starts_and_trains(slurm_cluster, tmp_path, route):
    if route == "accelerate launch":
        overrides = ["launch.launcher=none", "launch.command=accelerate launch ${framework.launch_args} "
                     f"tests/trainers/hf_train.py ${{framework.args}} --use_cpu {SHAPE}"]
    else:
        overrides = [f"launch.command=python tests/trainers/hf_train.py ${{framework.args}} --use_cpu {SHAPE}"]
    plan, logs, config = train(tmp_path, DEV, "parallelism.sharding=none", *overrides)
    assert (plan["nodes"], plan["world_size"]) == (2, 2)
    assert "num_machines: 2" in config
    assert sorted(logs) == [0, 1]
    ranks = []
    for node, log in logs.items():  # one process on each node, told its node's rank
        (found,) = re.findall(r"hf_train: rank (\d) of 2 on \S+ \(node rank (\d)\)", log)
        assert found[1] == str(node), found
        ranks.append(found[0])
    assert sorted(ranks) == ["0", "1"]  # ... and both joined the same 2-rank world
    both = "\n".join(logs.values())  # rank 0 (which reports) may be on either node under torchrun's c10d
    assert world(both) == (2, "MULTI_CPU", 2, 2)
    check_learned(both)


def test_accelerate_trains_in_fp8_with_what_jobctl_renders_for_h100s(tmp_path):
    """accelerate's FP8 (torchao, tensor-wise) as jobctl renders it for two H100s (fp8 is refused
    on a CPU partition, so this is not `jobctl submit`), run by torchrun on this machine's two CPU
    ranks with the rendered environment and flags (--use_cpu added): torch's _scaled_mm runs the
    Float8 GEMMs on CPU and accelerate runs MULTI_CPU. The Trainer must hand accelerate fp8 and
    accelerate convert every Linear but the model's first and last (utils/ao.py: 2 layers x 7 - 1
    = 13, the feed-forward width 128 a multiple of 16 as Float8 needs), the loss must fall, and the
    Trainer's checkpoint at the last step must be written (under DDP jobctl renders no FP8
    all-gather, whose weight wrapper safetensors cannot save)."""
    for package in ("accelerate", "transformers", "torchao"):
        need_package(package)
    rec = load_recipe(RECIPE, ["train.precision=fp8", "model.ffn_hidden=128", "parallelism.dp=2",
                               "parallelism.sharding=none"])
    d = plan_on(rec, load_inventory("h100", []), alternatives=0, summary=False, learn=False).to_dict()
    assert d["feasible"], d["reasons"]
    fw = d["framework"]
    assert fw["env"]["ACCELERATE_MIXED_PRECISION"] == "fp8" and "--bf16" not in fw["args"]
    args = [a.replace(CHECKPOINT_DIR_TOKEN, str(tmp_path / "out")) for a in fw["args"]]
    shape = ["--layers", "2", "--hidden", "64", "--ffn-hidden", "128", "--heads", "4", "--kv-heads", "2",
             "--vocab", str(VOCAB), "--seq-len", "32"]
    env = {**os.environ, **fw["env"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "tests/trainers/hf_train.py", *args, "--use_cpu", *shape],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert world(r.stdout) == (2, "MULTI_CPU", 2, 2)
    assert "hf_train: float8 linears 13" in r.stdout, r.stdout[-2000:]
    check_learned(r.stdout)
    assert (tmp_path / "out" / "checkpoint-30" / "model.safetensors").is_file()
