"""Real trainers in CI (issue 33), torchtitan: `jobctl submit --wait` on this machine's two CPU
ranks runs torchtitan 0.3.0's own trainer (torchtitan.train.main: its ConfigManager/tyro parser,
ParallelDims, FSDP2, DTensor TP, pipeline schedules, optimizer and LR scheduler) with exactly the
argv jobctl renders, its `activation_checkpoint:` subcommand last. tests/trainers/tt_cpu_train.py
is the test-only shim that lets it run without a GPU (each patch explained there).

Expectations from outside jobctl: torchtitan's own log says which mesh it built ("Building
device mesh with parallelism: ...") and which activation checkpointing it applied; an untrained
model's loss is about ln(vocab) = ln(2048) = 7.6 (the debug model starts a little above); the
synthetic corpus is learnable (each word determines the next), so the loss must fall well below.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from jobctl_run import history_rows, jobctl, need_package

RECIPE = "tests/data/trainers/tt_fsdp.yaml"
CLUSTER = "tests/data/trainers/cpu2.yaml"
VOCAB, STEPS = 2048, 30  # llama3_debugmodel's vocabulary; the recipe's train.steps
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def train(tmp_path, *overrides, cluster=CLUSTER) -> tuple[dict, str]:
    need_package("torchtitan")
    home = tmp_path / "home"
    r = jobctl("submit", RECIPE, *overrides, "--cluster", cluster, "--wait", env={"JOBCTL_HOME": str(home)},
               timeout=540)
    (row,) = history_rows(home)
    # every node's log: torchrun's c10d rendezvous may give global rank 0 to any node
    log = "\n".join(ANSI.sub("", p.read_text(errors="replace"))
                    for p in sorted((Path(row["job_folder"]) / "logs").glob("node-*.log")))
    assert r.returncode == 0 and row["state"] == "COMPLETED", (r.stdout[-2000:], r.stderr[-2000:], log[-4000:])
    return json.loads(row["plan_json"]), log


def mesh(log: str) -> dict:
    m = re.search(r"Building device mesh with parallelism: (.*)", log)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[1])}


def losses(log: str) -> dict[int, float]:
    """step -> loss, from the rank that computes it (pipeline stages without the loss print -1)."""
    out = {}
    for step, loss in re.findall(r"step:\s+(\d+)\s+loss:\s+(-?[\d.]+)", log):
        if float(loss) >= 0:
            out[int(step)] = float(loss)
    return out


def check_learned(log: str) -> None:
    seen = losses(log)
    assert sorted(seen) == list(range(1, STEPS + 1)), sorted(seen)
    assert abs(seen[1] - math.log(VOCAB)) < 1.0, seen[1]
    tail = sum(seen[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert tail < 0.5 * seen[1], seen


def test_torchtitan_trains_fsdp_as_rendered_with_an_option_after_its_args(tmp_path):
    """Also the ordering mistake the issue reported: an option after `activation_checkpoint:...`
    is read as the subcommand's and tyro exits 2. jobctl moves its subcommand to the end of the
    user's command, so an option written after ${framework.args} still parses."""
    command = ("python tests/trainers/tt_cpu_train.py --module llama3 --config llama3_debugmodel "
               "${framework.args} --metrics.log_freq=1")
    plan, log = train(tmp_path, f"launch.command={command}")
    # the first rank's line: its array alone (both ranks print to the node's log, and a second
    # rank's output can land on the same line)
    marker = "tt_cpu_train: argv "
    started = json.JSONDecoder().raw_decode(log, log.index(marker) + len(marker))[0]
    assert started[-1].startswith("activation_checkpoint:"), started[-3:]
    assert "--metrics.log_freq=1" in started
    assert plan["sharding"] == "zero3" and plan["dp"] == 2
    assert mesh(log) == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "ep": 1}
    assert "Applied FSDP to the model" in log
    check_learned(log)


def test_torchtitan_trains_tp_with_full_activation_checkpointing(tmp_path):
    plan, log = train(tmp_path, "parallelism.tp=2", "parallelism.dp=1", "parallelism.sharding=none",
                      "parallelism.recompute=full")
    assert (plan["tp"], plan["recompute"]) == (2, "full")
    assert mesh(log)["tp"] == 2 and mesh(log)["dp_shard"] == 1
    assert "Applied FullAC activation checkpointing" in log
    check_learned(log)


def test_torchtitan_trains_an_interleaved_pipeline(tmp_path):
    plan, log = train(tmp_path, "parallelism.pp=2", "parallelism.dp=1", "parallelism.sharding=none")
    assert plan["pp"] == 2
    assert mesh(log)["pp"] == 2
    # local batch 8 (global 8 / dp 1) in micro-batches of the plan's size
    m = re.search(r"Using pipeline schedule (\w+) with (\d+) microbatches and (\d+) stages", log)
    assert m, log[-3000:]
    # more than one stage per rank: an interleaved schedule, pp x virtual stages in all
    assert plan["virtual_stages"] > 1 and m[1] == "Interleaved1F1B"
    assert (int(m[2]), int(m[3])) == (8 // plan["micro_batch_size"], plan["pp"] * plan["virtual_stages"])
    check_learned(log)


def test_torchtitan_trains_fsdp_across_the_dev_clusters_two_nodes(slurm_cluster, tmp_path):
    """The multi-node path: one rank on each of the dev cluster's two Slurm nodes
    (tests/data/clusters/dev-2x1.yaml), FSDP2 across them through jobctl's torchrun rendezvous."""
    plan, log = train(tmp_path, cluster="tests/data/clusters/dev-2x1.yaml")
    assert (plan["nodes"], plan["dp"], plan["sharding"]) == (2, 2, "zero3")
    assert mesh(log)["dp_shard"] == 2
    check_learned(log)


def test_the_fp8_config_module_loads_in_the_job_as_torchtitan_loads_it(tmp_path):
    """Precision fp8: the job folder's framework/jobctl_torchtitan_float8.py is found through the
    PYTHONPATH the runner sets, and torchtitan's own ConfigManager, given the rendered argv in a
    real `jobctl submit --wait`, builds the model config with every block's Linear in Float8.
    The command is tests/trainers/tt_load_config.py, which loads the config as torchtitan.train
    does first and trains nothing (no FP8 tensor cores here; the plan is for an inventory of
    H100s run by the local scheduler). Llama 3.1 8B: 32 blocks of 5 Linears (torchtitan's fused
    wqkv, wo, w1, w2, w3), the output layer left 16-bit."""
    need_package("torchtitan")
    need_package("torchao")
    inventory = tmp_path / "h100-here.yaml"
    inventory.write_text("name: h100-here\nscheduler: local\npartitions:\n  - name: gpu\n    gpu: h100-sxm-80gb\n"
                         "    gpus_per_node: 8\n    nodes: 1\n    cpus_per_node: 2\n    mem_gib: 16\n")
    home = tmp_path / "home"
    r = jobctl("submit", "recipes/llama8b.yaml", "train.precision=fp8", "launch.launcher=none",
               "launch.command=python tests/trainers/tt_load_config.py ${framework.args}", "--cluster", str(inventory),
               "--wait", env={"JOBCTL_HOME": str(home)}, timeout=300)
    (row,) = history_rows(home)
    folder = Path(row["job_folder"])
    log = (folder / "logs" / "node-0.log").read_text(errors="replace")
    assert r.returncode == 0 and row["state"] == "COMPLETED", (r.stdout[-2000:], r.stderr[-2000:], log[-3000:])
    assert (folder / "framework" / "jobctl_torchtitan_float8.py").is_file()
    assert "tt_load_config: module torchtitan.trainer float8 linears 160 other linears 1" in log
