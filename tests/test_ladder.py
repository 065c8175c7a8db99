"""The OOM ladder against hand-derived steps: llama3.1-8b on one node of 8x H100 SXM."""

import math
from dataclasses import replace

import pytest

from jobctl.planner.catalog import GIB, lookup_gpu
from jobctl.planner.ladder import (
    RUNGS, LadderStep, OOMInfo, ladder, learned_usable_bytes, next_plan,
)
from jobctl.planner.memory import Workload, estimate
from jobctl.planner.models import PRESETS
from jobctl.planner.perf import Links
from jobctl.planner.plan import Plan
from jobctl.planner.search import Constraints, Target

H100 = lookup_gpu("h100-sxm-80gb")
GBS = 64


def target(nodes=1, gpus_per_node=8, host_gib=2000):
    links = Links(H100.intra_node_gbs, H100.inter_node_gbit / 8, H100.pcie_gbs, H100.mem_bandwidth_gbs,
                  H100.peak_tflops("bf16-mixed"))
    return Target("h100", "gpu", H100, gpus_per_node, nodes, host_gib * GIB, H100.memory_bytes, links)


def work(seq_len=1024, framework="deepspeed", **kw):
    return Workload(PRESETS["llama3.1-8b"], seq_len, GBS, framework=framework, **kw)


def plan(**kw):
    base = dict(nodes=1, gpus_per_node=8, tp=1, pp=1, dp=8, cp=1, sharding="zero2", micro_batch_size=4,
                grad_accum_steps=GBS // (8 * 4), global_batch_size=GBS, recompute="none", offload="none",
                sequence_parallel=False)
    base.update(kw)
    return Plan(**base)


def peak(w, t, p):
    return estimate(w, t.gpu_memory_bytes, p, t.host_mem_bytes).total_bytes


T = target()
W = work()
START = plan()  # dp 8, ZeRO-2, micro-batch 4 x 2 accumulation steps


def test_start_plan_fits_the_model():
    # the ladder starts from a plan the model said fits: the OOM is the model's miss
    assert START.check() == []
    assert estimate(W, T.gpu_memory_bytes, START, T.host_mem_bytes).fits


def test_first_rung_halves_the_micro_batch_and_doubles_accumulation():
    s = next_plan(W, T, Constraints(), START)
    assert isinstance(s, LadderStep)
    assert s.rung == "micro-batch"
    assert s.plan.micro_batch_size == 2
    # global 64 = dp 8 x micro-batch 2 x accumulation 4
    assert s.plan.grad_accum_steps == 64 // (8 * 2) == 4
    assert s.plan.global_batch_size == 64
    assert (s.plan.tp, s.plan.pp, s.plan.dp, s.plan.sharding, s.plan.recompute) == (1, 1, 8, "zero2", "none")
    assert s.memory.total_bytes == peak(W, T, s.plan) < peak(W, T, START)
    assert "micro_batch_size 4 -> 2" in s.reason and "grad_accum_steps 2 -> 4" in s.reason


# The ladder's documented minimum step (planner/ladder.py, module docstring): every step
# predicts at least 2% less than the plan that failed. Written here, not imported.
TWO_PERCENT = 0.02


def test_default_margin_is_two_percent_of_the_failed_peak():
    p = peak(W, T, START)
    s = next_plan(W, T, Constraints(), START)
    assert s.usable_bytes == p - math.ceil(TWO_PERCENT * p)
    assert s.memory.total_bytes <= s.usable_bytes


def test_tried_to_allocate_sets_the_margin():
    # "Tried to allocate 3.91 GiB": the next plan predicts at most P - 3.91 GiB
    tried = int(3.91 * GIB)
    p = peak(W, T, START)
    assert tried > TWO_PERCENT * p  # 3.91 GiB > 2% of ~65 GiB, so the figure binds
    s = next_plan(W, T, Constraints(), START, OOMInfo(tried_to_allocate_bytes=tried))
    assert s.usable_bytes == p - tried
    assert s.memory.total_bytes <= p - tried


def test_a_large_failed_allocation_skips_micro_batches():
    # micro-batch 2 predicts ~47.3 GiB, 1 ~38.7 GiB: wanting 20 GiB more than P ~64.7 leaves ~44.7
    p = peak(W, T, START)
    p2 = peak(W, T, plan(micro_batch_size=2, grad_accum_steps=4))
    p1 = peak(W, T, plan(micro_batch_size=1, grad_accum_steps=8))
    tried = 20 * GIB
    assert p1 <= p - tried < p2
    s = next_plan(W, T, Constraints(), START, OOMInfo(tried_to_allocate_bytes=tried))
    assert (s.plan.micro_batch_size, s.plan.grad_accum_steps) == (1, 8)


def test_total_capacity_and_free_figures():
    # "GPU 0 has a total capacity of 79.14 GiB of which 0.2 GiB is free": the process wanted
    # 79.14 - 0.2 + 3.91 GiB where the model said P, an under-prediction u it will repeat.
    cap, free, tried = int(79.14 * GIB), int(0.2 * GIB), int(3.91 * GIB)
    p = peak(W, T, START)
    u = cap - free + tried - p
    expected = min(cap - GIB - u, p - tried)  # safety margin 1 GiB
    assert expected == cap - GIB - u  # free < safety margin: this rule binds
    got = learned_usable_bytes(W, T, p, OOMInfo(tried, cap, free))
    assert got == expected
    s = next_plan(W, T, Constraints(), START, OOMInfo(tried, cap, free))
    assert s.usable_bytes == expected and s.memory.total_bytes <= expected


def test_measured_peak_above_the_prediction_lowers_the_limit():
    p = peak(W, T, START)
    measured = p + 6 * GIB  # the monitor saw 6 GiB more than predicted
    got = learned_usable_bytes(W, T, p, OOMInfo(measured_peak_bytes=measured))
    assert got == min(T.gpu_memory_bytes - GIB - 6 * GIB, p - math.ceil(0.02 * p))
    # a smaller reported capacity than the catalog's lowers the model's own limit
    assert learned_usable_bytes(W, T, 100 * GIB, OOMInfo(total_capacity_bytes=70 * GIB)) == 69 * GIB


def test_micro_batch_one_goes_to_recompute():
    one = plan(micro_batch_size=1, grad_accum_steps=8)
    s = next_plan(W, T, Constraints(), one)
    assert s.rung == "recompute"
    # flash attention: no selective step; block recompute of a quarter of the 32 layers
    assert (s.plan.recompute, s.plan.recompute_layers) == ("full", 8)
    assert (s.plan.micro_batch_size, s.plan.grad_accum_steps) == (1, 8)


def test_eager_attention_tries_selective_recompute_first():
    w = work(attention="eager")
    one = plan(micro_batch_size=1, grad_accum_steps=8)
    s = next_plan(w, T, Constraints(), one)
    assert (s.rung, s.plan.recompute) == ("recompute", "selective")


def test_full_recompute_goes_to_sharding_then_offload():
    full = plan(micro_batch_size=1, grad_accum_steps=8, recompute="full")
    c = Constraints(tp=1, pp=1)  # no model parallelism: sharding, then offload
    s = next_plan(W, T, c, full)
    assert (s.rung, s.plan.sharding) == ("sharding", "zero3")  # DeepSpeed: zero2 -> zero3
    s2 = next_plan(W, T, c, s.plan, history=(full,))
    assert (s2.rung, s2.plan.offload) == ("offload", "optimizer")
    s3 = next_plan(W, T, c, s2.plan, history=(full, s.plan))
    assert (s3.rung, s3.plan.offload) == ("offload", "optimizer+params")  # ZeRO-3: parameters too
    assert next_plan(W, T, c, s3.plan) is None
    for st in (s, s2, s3):
        assert st.plan.global_batch_size == GBS and (st.plan.tp, st.plan.pp, st.plan.dp) == (1, 1, 8)
        assert st.memory.fits_host


def test_megatron_shards_only_to_zero1_then_grows_tp():
    w = work(framework="megatron")
    full = plan(sharding="zero1", micro_batch_size=1, grad_accum_steps=8, recompute="full")
    s = next_plan(w, T, Constraints(), full)
    # no zero2/zero3 in Megatron-LM: model parallelism, tp 1 -> 2 on the same 8 GPUs
    assert s.rung == "parallelism"
    assert (s.plan.tp, s.plan.dp, s.plan.world_size) == (2, 4, 8)
    assert s.plan.grad_accum_steps == 64 // (4 * 1) == 16
    assert s.plan.sequence_parallel  # Megatron turns on SP with tp when it is not pinned


def test_pinned_tp_stays_and_pp_grows():
    w = work(framework="megatron")
    full = plan(sharding="zero1", micro_batch_size=1, grad_accum_steps=8, recompute="full")
    s = next_plan(w, T, Constraints(tp=1), full)
    assert s.rung == "parallelism"
    assert (s.plan.tp, s.plan.pp, s.plan.dp) == (1, 2, 4)
    assert s.plan.grad_accum_steps == 64 // 4 == 16
    for st in ladder(w, T, Constraints(tp=1), START):
        assert st.plan.tp == 1


def test_pinned_tp_and_pp_stay_along_the_whole_ladder():
    c = Constraints(tp=1, pp=1)
    steps = ladder(W, T, c, START)
    assert [s.rung for s in steps] == (
        ["micro-batch", "micro-batch"] + ["recompute"] * 4 + ["sharding", "offload", "offload"])
    assert all((s.plan.tp, s.plan.pp, s.plan.dp) == (1, 1, 8) for s in steps)


def test_more_gpus_of_the_partition_when_the_node_is_used_up():
    # one GPU of a two-node partition, nothing left to shrink on it: tp grows onto 2 GPUs
    w = Workload(PRESETS["llama3.2-1b"], 1024, 8, framework="megatron")
    t = target(nodes=2)
    one = Plan(1, 1, 1, 1, 1, 1, "none", 1, 8, 8, "full", "none", False)
    s = next_plan(w, t, Constraints(), one)
    assert s.rung == "parallelism"
    assert (s.plan.tp, s.plan.dp, s.plan.world_size, s.plan.nodes, s.plan.gpus_per_node) == (2, 1, 2, 1, 2)
    assert s.plan.grad_accum_steps == 8  # dp kept, so accumulation too


def test_the_smallest_plan_has_no_next():
    # tp 8 on the only node: micro-batch 1, all layers recomputed, nothing to shard over (dp 1),
    # the optimizer offloaded (parameter offload needs ZeRO-3), and no GPU left to grow onto.
    small = plan(tp=8, dp=1, sharding="none", micro_batch_size=1, grad_accum_steps=64, recompute="full",
                 offload="optimizer")
    assert small.check() == []
    assert next_plan(W, T, Constraints(), small) is None
    assert ladder(W, T, Constraints(), small) == []


def test_never_returns_a_plan_from_history():
    first = next_plan(W, T, Constraints(), START)
    again = next_plan(W, T, Constraints(), START, history=(first.plan,))
    assert again.plan != first.plan and again.plan != START
    assert again.memory.total_bytes < peak(W, T, START)


def test_combines_rungs_when_no_single_rung_fits():
    # Wanting 30 GiB below P ~64.7 GiB: micro-batch 1 alone (~38.7 GiB) and recompute alone are
    # not enough, nor is ZeRO-3 at micro-batch 4 with tp and pp pinned; both micro-batch and
    # recompute together are.
    c = Constraints(tp=1, pp=1)
    p = peak(W, T, START)
    s = next_plan(W, T, c, START, OOMInfo(tried_to_allocate_bytes=30 * GIB))
    assert s.memory.total_bytes <= p - 30 * GIB
    assert "+" in s.rung and set(s.rung.split("+")) <= set(RUNGS)
    assert s.plan.global_batch_size == GBS


def test_the_ladder_strictly_lowers_memory_and_keeps_the_batch():
    steps = ladder(W, T, Constraints(), START, OOMInfo(tried_to_allocate_bytes=int(3.91 * GIB)))
    assert steps
    prev = peak(W, T, START)
    for s in steps:
        assert s.plan.check() == []
        assert s.plan.global_batch_size == GBS
        assert s.memory.total_bytes < prev and s.memory.total_bytes <= s.usable_bytes
        prev = s.memory.total_bytes
    assert len({s.plan for s in steps}) == len(steps)
    assert next_plan(W, T, Constraints(), steps[-1].plan) is None


def test_pure_and_deterministic():
    a = ladder(W, T, Constraints(), START)
    b = ladder(W, T, Constraints(), START)
    assert a == b


@pytest.mark.parametrize("bad", [
    dict(global_batch_size=32, grad_accum_steps=1),  # not the workload's batch
    dict(dp=4),  # tp * pp * dp * cp != world size
])
def test_an_invalid_failed_plan_is_an_error(bad):
    with pytest.raises(ValueError, match="invalid plan"):
        next_plan(W, T, Constraints(), replace(START, **bad))


def test_context_parallelism_when_nothing_else_is_left():
    # A single layer on one GPU, fully recomputed, tp pinned to 1: no pp to add, nothing to
    # shard over. Megatron-LM can still split the 16k-token sequence over 2 GPUs (cp 2).
    m = replace(PRESETS["llama3.2-1b"], layers=1)
    w = Workload(m, 16384, 1, framework="megatron")
    one = Plan(1, 1, 1, 1, 1, 1, "none", 1, 1, 1, "full", "none", False)
    s = next_plan(w, T, Constraints(tp=1), one)
    assert s.rung == "parallelism"
    assert (s.plan.tp, s.plan.pp, s.plan.cp, s.plan.dp, s.plan.world_size) == (1, 1, 2, 1, 2)
    assert s.plan.grad_accum_steps == 1
