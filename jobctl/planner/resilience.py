"""Planning for failures (issue 30): the checkpoint a plan writes, how long it takes, how often a
job of this size is interrupted, the checkpoint interval that wastes least, and the time to
train with interruptions (pure arithmetic on the plan, the memory model's state bytes and the
inventory).

Interruptions: the Llama 3 paper (Llama Team 2024, section 3.3.4) counts 419 unexpected
interruptions in a 54-day snapshot of pre-training on 16,384 H100s (2,048 nodes of 8): one per
54 x 24 x 2048 / 419 = 6,335 node-hours, about one every 3 hours for the whole job. A partition
may say its own rate (`interruptions_per_node_day`).

Interval: Young's first-order optimum, tau = sqrt(2 x delta x M) for a checkpoint that takes
delta seconds and a mean time M between interruptions (Young 1974; Daly 2006 refines it for
delta not small against M). The expected waste per unit of work is delta/tau for writing,
(tau + delta)/(2M) for the work lost at an interruption (half an interval on average) and R/M
for the restart (requeue, start-up, loading the checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LLAMA3_INTERRUPTIONS = 419  # unexpected interruptions, Llama 3 paper Table 5
LLAMA3_DAYS = 54
LLAMA3_NODES = 16384 // 8
INTERRUPTIONS_PER_NODE_DAY = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * LLAMA3_NODES)  # 0.00379
# A node's share of a parallel file system's write bandwidth when every node writes its shards
# at once (GB/s): the stated default, which an inventory replaces with its own measurement.
CHECKPOINT_WRITE_GBS_PER_NODE = 2.0
# Requeue, start-up (NCCL set-up, the first step's compilation and allocation) and loading the
# checkpoint back: the stated default cost of one interruption beyond the lost work.
RESTART_S = 600.0


# Hangs (the runner's watchdog, jobctl/runtime/progress.py): a step that has not ended after
# HANG_STEPS step times plus two checkpoint writes (a step that saves one takes that much longer)
# is stuck -- three times the planned step leaves room for the model's error (within 30% on the
# published runs, docs/step-time-accuracy.md) and a slow step -- with a floor of HANG_FLOOR_S -- half of PyTorch's default collective timeout for
# NCCL (10 min, torch/distributed/constants.py default_pg_nccl_timeout), so that the watchdog
# sees a stuck collective before NCCL's own watchdog turns it into an NCCL error without stacks.
# The first step includes NCCL set-up, loading the model and a checkpoint, and compilation:
# FIRST_STEP_FACTOR times that, at least FIRST_STEP_FLOOR_S. A user's resources.hang_after
# replaces the steady threshold, and the first-step one is FIRST_STEP_FACTOR times it.
HANG_STEPS = 3
HANG_FLOOR_S = 300.0
FIRST_STEP_FACTOR = 3
FIRST_STEP_FLOOR_S = 1800.0


def hang_thresholds(step_s: float | None, write_s: float | None = None,
                    hang_after: int | None = None) -> tuple[float, float]:
    """(first-step threshold, threshold between steps) in seconds; (0, 0) when hang_after is 0
    (the watchdog off)."""
    if hang_after == 0:
        return 0.0, 0.0
    if hang_after:
        return float(FIRST_STEP_FACTOR * hang_after), float(hang_after)
    after = max(HANG_FLOOR_S, HANG_STEPS * (step_s or 0.0) + 2 * (write_s or 0.0))
    return max(FIRST_STEP_FLOOR_S, FIRST_STEP_FACTOR * after), after


@dataclass(frozen=True)
class Resilience:
    checkpoint_bytes: float  # what one checkpoint writes, all ranks together (each state once)
    write_s: float  # how long writing it takes
    mtbi_s: float  # mean time between interruptions of the whole job
    interval_steps: int  # steps between checkpoints
    interval_s: float
    waste: float  # expected time lost per unit of useful time
    time_to_train_s: float | None  # with interruptions and checkpoints

    @property
    def goodput(self) -> float:
        return 1.0 / (1.0 + self.waste)

    def to_dict(self) -> dict:
        return {"checkpoint_bytes": int(self.checkpoint_bytes), "write_s": round(self.write_s, 1),
                "mtbi_h": round(self.mtbi_s / 3600, 2), "interval_steps": self.interval_steps,
                "interval_s": round(self.interval_s, 1), "goodput": round(self.goodput, 4),
                "time_to_train_s": None if self.time_to_train_s is None else round(self.time_to_train_s, 1)}


def checkpoint_bytes(trained_params: float, weight_b: float, master_b: float, state_elems: float,
                     state_elem_b: float) -> float:
    """Each model state written once (distributed checkpoints save every shard, replicas once):
    the weights, the fp32 master copy and the optimizer's `state_elems` elements (the memory
    model's count for the whole model); gradients are not saved."""
    return trained_params * (weight_b + master_b) + state_elems * state_elem_b


def plan_for_failures(ckpt_bytes: float, nodes: int, step_s: float, time_to_train_s: float | None,
                      write_gbs_per_node: float | None = None, interruptions_per_node_day: float | None = None,
                      restart_s: float = RESTART_S) -> Resilience:
    per_node = write_gbs_per_node or CHECKPOINT_WRITE_GBS_PER_NODE
    rate = interruptions_per_node_day if interruptions_per_node_day is not None else INTERRUPTIONS_PER_NODE_DAY
    write_s = ckpt_bytes / (per_node * 1e9 * max(1, nodes))
    mtbi_s = 86400.0 / (rate * max(1, nodes)) if rate > 0 else math.inf
    tau = math.sqrt(2 * write_s * mtbi_s) if math.isfinite(mtbi_s) else math.inf
    steps = max(1, round(tau / step_s)) if math.isfinite(tau) and step_s > 0 else 0
    interval_s = steps * step_s
    if steps:
        waste = write_s / interval_s + (interval_s + write_s) / (2 * mtbi_s) + restart_s / mtbi_s
    else:
        waste = 0.0
    total = time_to_train_s * (1 + waste) if time_to_train_s else None
    return Resilience(ckpt_bytes, write_s, mtbi_s, steps, interval_s, waste, total)
