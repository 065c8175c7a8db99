"""Real trainers in CI (issue 33): `jobctl submit --wait` plans a tiny recipe on this machine's
two CPU ranks (tests/data/trainers/cpu2.yaml, the local scheduler under torchrun), renders the
framework's configuration, and the framework's own engine trains with it; the loss must fall.

DeepSpeed here: tests/trainers/ds_train.py builds no optimizer of its own, so the optimizer, the
learning-rate schedule, the batch triple, ZeRO stage, offload and pipeline settings all come
from the ds_config.json jobctl rendered. Every expectation below is from outside jobctl: the
task's untrained loss is ln(vocab) (a uniform guess over 256 tokens), and the last step's
learning rate is the recipe's min_lr (cosine decay ends there, DeepSpeed runtime/lr_schedules.py
WarmupCosineLR). The layout line is what DeepSpeed's engine reports about itself.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from jobctl_run import history_rows, jobctl, need_package

RECIPE = "tests/data/trainers/ds-zero1.yaml"
CLUSTER = "tests/data/trainers/cpu2.yaml"
VOCAB, MIN_LR, STEPS = 256, 0.001, 20  # as written in the recipe above


@pytest.fixture(scope="module")
def extensions(tmp_path_factory) -> str:
    """One torch-extensions folder for this module's runs: DeepSpeed JIT-compiles its CPU ops
    (shm comm, CPU Adam) once per run, and a compile killed in an earlier run leaves a lock
    file under ~/.cache that would make every later start wait forever."""
    return str(tmp_path_factory.mktemp("torch_extensions"))


def train(tmp_path, extensions, *overrides, cluster=CLUSTER) -> tuple[dict, dict, list[str]]:
    """Submit and wait; (the plan, the rendered ds_config.json, rank 0's `ds_train:` lines)."""
    need_package("deepspeed")
    home = tmp_path / "home"
    r = jobctl("submit", RECIPE, *overrides, "--cluster", cluster, "--wait",
               env={"JOBCTL_HOME": str(home), "TORCH_EXTENSIONS_DIR": extensions}, timeout=540)
    (row,) = history_rows(home)
    folder = Path(row["job_folder"])
    log = (folder / "logs" / "node-0.log").read_text(errors="replace")
    assert r.returncode == 0 and row["state"] == "COMPLETED", (r.stdout[-2000:], r.stderr[-2000:], log[-4000:])
    plan = json.loads(row["plan_json"])
    config = json.loads((folder / "framework" / "ds_config.json").read_text())
    lines = [ln for ln in log.splitlines() if ln.startswith("ds_train:")]
    return plan, config, lines


def layout(lines: list[str]) -> dict:
    words = lines[0].split()[1:]
    return dict(zip(words[::2], words[1::2]))


def losses(lines: list[str]) -> list[tuple[int, float, float]]:
    out = []
    for ln in lines:
        m = re.match(r"ds_train: step (\d+) loss ([\d.]+) lr ([\d.e+-]+)", ln)
        if m:
            out.append((int(m[1]), float(m[2]), float(m[3])))
    return out


def check_learned(lines: list[str]) -> None:
    steps = losses(lines)
    assert [s for s, _, _ in steps] == list(range(1, STEPS + 1))
    first, last = steps[0][1], steps[-1][1]
    assert abs(first - math.log(VOCAB)) < 0.5  # untrained: about ln(vocab)
    assert last < 0.4 * first, steps  # learned the successor task
    assert steps[-1][2] == pytest.approx(MIN_LR, rel=1e-3)  # the rendered schedule ran to min_lr


@pytest.mark.parametrize("sharding, stage", [("zero1", 1), ("zero3", 3)])  # ZeRO-2: the offload test
def test_deepspeed_trains_with_the_rendered_zero_stage(tmp_path, extensions, sharding, stage):
    plan, config, lines = train(tmp_path, extensions, f"parallelism.sharding={sharding}")
    got = layout(lines)
    assert plan["sharding"] == sharding and config["zero_optimization"]["stage"] == stage
    assert (got["ranks"], got["dp"], got["pp"]) == ("2", "2", "1")
    assert int(got["zero_stage"]) == stage
    # the engine reduces under the backward: jobctl turns overlap_comm on over the 2 ranks
    # (DeepSpeed's default for stage 1 is off)
    assert config["zero_optimization"]["overlap_comm"] is True and got["overlap_comm"] == "True"
    assert (int(got["micro_batch_size"]), int(got["grad_accum_steps"]), int(got["train_batch_size"])) == (
        plan["micro_batch_size"], plan["grad_accum_steps"], plan["global_batch_size"])
    # the optimizer and schedule DeepSpeed built from the rendered blocks, none passed by the script
    assert (got["optimizer"], got["scheduler"]) == ("AdamW", "WarmupCosineLR")
    check_learned(lines)


def test_deepspeed_trains_with_the_optimizer_offloaded(tmp_path, extensions):
    """ZeRO-Offload refuses a client optimizer: the rendered optimizer block is what makes it run."""
    plan, config, lines = train(tmp_path, extensions, "parallelism.sharding=zero2", "parallelism.offload=optimizer")
    got = layout(lines)
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert (got["offload_optimizer"], got["optimizer"]) == ("True", "DeepSpeedCPUAdam")
    check_learned(lines)


def test_deepspeed_pipeline_trains_with_recompute(tmp_path, extensions):
    """pp=2 over the two ranks: the script builds PipelineModule(num_stages=JOBCTL_PP) as the
    rendered note says, and the engine takes activation_checkpoint_interval from the file."""
    plan, config, lines = train(tmp_path, extensions, "parallelism.pp=2", "parallelism.dp=1",
                                "parallelism.sharding=none", "parallelism.recompute=full")
    got = layout(lines)
    assert (plan["pp"], plan["dp"]) == (2, 1)
    assert config["pipeline"] == {"activation_checkpoint_interval": 1}
    assert (got["dp"], got["pp"]) == ("1", "2")
    assert int(got["grad_accum_steps"]) == plan["grad_accum_steps"] == 8 // (1 * 2)  # global / (dp x micro)
    check_learned(lines)

