"""The performance model: published large-scale runs and hand-derived pieces (docs/memory-model.md §5)."""

from dataclasses import replace

import pytest

from jobctl.planner import inputs
from jobctl.planner.memory import Workload
from jobctl.planner.models import PRESETS
from jobctl.planner.perf import (
    INTRA_NODE_EFFICIENCY,
    LATENCY_INTRA_NODE_S,
    Links,
    estimate_step,
    model_flops_per_token,
    ring_gbs,
    ring_latency,
    stage_time,
)
from jobctl.planner.plan import Plan
from jobctl.planner.search import search
from jobctl.planning import load_inventory, load_recipe

H100 = Links(intra_node_gbs=450, inter_node_gbs=50, pcie_gbs=64, mem_bandwidth_gbs=3350, peak_tflops=989)


def llama3_405b(nodes, framework="megatron"):
    inv = load_inventory("h100", [f"partitions.0.nodes={nodes}"])
    rec = load_recipe("recipes/llama405b.yaml", [f"framework={framework}"])
    w = inputs.workload(rec.value, inv.value)
    return w, inputs.target(inv.value, inv.value.partitions[0]), inputs.constraints(rec.value)


# Llama 3 paper ("The Llama 3 Herd of Models", 2024), Table 4: 405B pre-training on H100,
# sequence 8192, 16M tokens (2048 sequences) per step.
PUBLISHED = [
    (1024, dict(tp=8, cp=1, pp=16, dp=64), 0.43),   # 8192 GPUs, 430 TFLOP/s per GPU
    (2048, dict(tp=8, cp=1, pp=16, dp=128), 0.41),  # 16384 GPUs, 400 TFLOP/s per GPU
]


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
@pytest.mark.parametrize("nodes,layout,published_mfu", PUBLISHED)
def test_llama3_405b_published_layout_is_runnable_interleaved(nodes, layout, published_mfu, framework):
    w, t, c = llama3_405b(nodes, framework)
    published = search(w, t, replace(c, **layout), objective="time").best
    assert published is not None and published.plan.world_size == nodes * 8
    assert published.plan.virtual_stages > 1  # an interleaved schedule
    assert w.framework.problems(published.plan, w) == []


_NOT_CHOSEN = pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-29 (issue 29): at 80 GiB the published TP8 PP16 CP1 layout needs full recompute of 4 "
    "layers per stage under megatron and is predicted 0.86x/0.82x of the best plan, which uses cp=2 without "
    "recompute (its MFU, 46.6%/42.0% against the published 43%/41%, passes); Meta trained without recompute "
    "at 8K (issue 14). torchtitan's (selective AC) is within 3% of its best at both sizes"))


@pytest.mark.parametrize(("nodes", "layout", "published_mfu", "framework"), [
    pytest.param(*row, fw, marks=[] if fw == "torchtitan" else [_NOT_CHOSEN])
    for row in PUBLISHED for fw in ("megatron", "torchtitan")])
def test_llama3_405b_published_layout_is_chosen_or_within_5_percent(nodes, layout, published_mfu, framework):
    w, t, c = llama3_405b(nodes, framework)
    best = search(w, t, c, objective="time").best
    published = search(w, t, replace(c, **layout), objective="time").best
    same = all(getattr(best.plan, k) == v for k, v in layout.items())
    assert same or published.estimate.tokens_per_s >= 0.95 * best.estimate.tokens_per_s, (
        best.plan.summary(), published.plan.summary())


@pytest.mark.parametrize("nodes,layout,published_mfu", PUBLISHED)
def test_llama3_405b_published_layout_runs_near_the_published_mfu(nodes, layout, published_mfu):
    """MFU near the published 41-43% (model FLOPs: 6·Ψ + attention, no recomputation) where the
    layout runs on a stack like Meta's: Megatron's, with TP communication under the GEMMs.
    torchtitan's plan of the same layout is slower: it needs selective AC at 80 GiB where Meta ran
    none, and torch's async TP hides less of the TP traffic than Transformer Engine's userbuffers
    (torchtitan's own async-TP pairs: tests/test_tp_overlap.py)."""
    w, t, c = llama3_405b(nodes, "megatron")
    published = search(w, t, replace(c, **layout), objective="time").best
    assert published.estimate.mfu == pytest.approx(published_mfu, abs=0.04)
    w, t, c = llama3_405b(nodes, "torchtitan")
    titan = search(w, t, replace(c, **layout), objective="time").best
    assert titan.plan.recompute != "none"
    assert titan.estimate.mfu < published.estimate.mfu


def test_virtual_stages_one_pins_the_plain_schedule():
    # a recipe's parallelism.virtual_stages: "auto" (the default) lets the search interleave, as
    # it does for the published 405B layout; 1 pins 1F1B (torchtitan's published 405B run)
    w, t, c = llama3_405b(1024, "torchtitan")
    layout = dict(tp=8, cp=1, pp=16, dp=64)
    auto = search(w, t, replace(c, **layout), objective="time").best
    pinned = search(w, t, replace(c, **layout, virtual_stages=1), objective="time").best
    assert auto.plan.virtual_stages > 1
    assert pinned is not None and pinned.plan.virtual_stages == 1


def test_model_flops_per_token_by_hand():
    # 6·(L·layer + V·h) + 6·L·h·s  (causal attention halves 12·L·h·s)
    m = PRESETS["llama3.1-8b"]
    w = Workload(m, 8192, 1)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    expected = 6 * (32 * layer + 128256 * 4096) + 6 * 32 * 4096 * 8192
    assert model_flops_per_token(w) == expected


def plan(**kw):
    base = dict(nodes=1, gpus_per_node=8, tp=1, pp=1, dp=8, cp=1, sharding="zero1", micro_batch_size=1,
                grad_accum_steps=8, global_batch_size=64, recompute="none", offload="none", sequence_parallel=False)
    base.update(kw)
    return Plan(**base)


def test_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    w = Workload(PRESETS["llama3.1-70b"], 4096, 64, framework="megatron")
    p = plan(tp=2, pp=4, dp=1, nodes=1, grad_accum_steps=64, global_batch_size=64)
    e = estimate_step(w, p, H100, 8)
    # bubble / (pipeline time incl. bubble) = (p−1)/(m+p−1) with m = 64, p = 4
    pipeline = e.compute_s + e.tp_comm_s + e.cp_comm_s + e.pp_p2p_s
    busy = e.pp_bubble_s / (e.pp_bubble_s + pipeline - e.pp_p2p_s)
    assert busy == pytest.approx(3 / (64 + 3), rel=1e-6)
    # interleaving v chunks divides the bubble by v
    e4 = estimate_step(w, replace(p, virtual_stages=4), H100, 8)
    assert e4.pp_bubble_s == pytest.approx(e.pp_bubble_s / 4)


def test_interleaved_bubble_with_fewer_micro_batches_than_stages():
    # torch's Interleaved1F1B takes m < p micro-batches; a micro-batch's next chunk on the first
    # stage waits for it to leave the last, so each of the v rounds lasts p chunk-times: with
    # p = 4, v = 4, m = 2, 4·4 + 2 − 1 = 17 chunk-times, of which m·v = 8 are this rank's work;
    # the bubble is 17 − 8 = 9 chunk-times = 9/4 of a micro-batch's stage time (the textbook
    # (p − 1)/v would give 3/4).
    w = Workload(PRESETS["llama3.1-70b"], 4096, 2, framework="torchtitan")
    p = plan(tp=2, pp=4, dp=1, nodes=1, grad_accum_steps=2, global_batch_size=2, virtual_stages=4, sharding="zero3")
    e = estimate_step(w, p, H100, 8)
    stage_mb = stage_time(w, p, H100, 8)
    assert e.pp_bubble_s == pytest.approx(9 / 4 * stage_mb, rel=1e-9)
    # without interleaving (v = 1) the textbook (p − 1) micro-batch stage times stand
    e1 = estimate_step(w, replace(p, virtual_stages=1), H100, 8)
    assert e1.pp_bubble_s == pytest.approx(3 * stage_time(w, replace(p, virtual_stages=1), H100, 8), rel=1e-9)


def test_a_data_parallel_ring_across_nodes_uses_the_groups_nics_together():
    # NCCL (src/graph/tuning.cc: busBw = nChannels x bwInter): one channel per NIC through the
    # group's ranks in each node, so k ranks of the group per node move k x 50 GB/s, up to the
    # NVLink's 450; the group of ranks tp apart has 8/tp of them in each 8-GPU node.
    assert ring_gbs(H100, 8, stride=1, n=64) == 400     # 8 per node: 8 NICs
    assert ring_gbs(H100, 8, stride=2, n=32) == 200     # TP 2: 4 per node
    assert ring_gbs(H100, 8, stride=8, n=16) == 50      # TP 8: one per node, one NIC
    assert ring_gbs(H100, 8, stride=1, n=8) == 450      # inside the node: NVLink
    assert ring_gbs(replace(H100, intra_node_gbs=300), 8, stride=1, n=64) == 300  # capped by NVLink
    # NCCL's ring latency (Simple protocol): 8.4 us + 14 us per step across the network + 3.4 us
    # per step inside a node; an all-gather of 512 ranks, 8 per node (64 nodes): 511 steps, 63
    # of them across the network
    assert ring_latency(8, 1, 512) == pytest.approx(8.4e-6 + 63 * 14e-6 + 448 * 3.4e-6)
    assert ring_latency(8, 1, 512, allreduce=True) == pytest.approx(8.4e-6 + 126 * 14e-6 + 896 * 3.4e-6)
    assert ring_latency(8, 1, 8) == LATENCY_INTRA_NODE_S  # inside a node: the measured start-up


def test_megatron_data_parallel_traffic_by_hand():
    # GPT-7.1B of Megatron-Core's H100 table: TP 2, DP 48 on 12 nodes, micro-batch 1 x 4. The
    # distributed optimizer reduce-scatters fp32 gradients (Megatron-LM turns
    # accumulate_allreduce_grads_in_fp32 on for bf16) and all-gathers bf16 weights, over a ring of
    # 48 ranks 2 apart: 4 per node, 4 NICs, 4 x 50 GB/s at 80% (NETWORK_EFFICIENCY). Buckets:
    # max(40M, 1M x 48) parameters (megatron-core distributed_data_parallel.py), each paying the
    # ring's latency: 8.4 us + 11 network steps x 14 us + 36 NVLink steps x 3.4 us. The reduce
    # hides behind the last micro-batch's backward (2/3 of it) but for its last bucket (10%), the
    # gather behind the first forward (1/3).
    from jobctl.planner.perf import stage_params_per_rank
    w = Workload(replace(PRESETS["llama3.1-8b"], layers=30, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384,
                         vocab=131072), 4096, 192, framework="megatron")
    p = plan(tp=2, dp=48, nodes=12, grad_accum_steps=4, global_batch_size=192, sequence_parallel=True)
    e = estimate_step(w, p, H100, 8)
    params = stage_params_per_rank(w, p)
    stage_mb = stage_time(w, p, H100, 8)
    latency = 8.4e-6 + 11 * 14e-6 + 36 * 3.4e-6
    buckets = params / 48e6
    bw = 4 * 50e9 * 0.8
    reduce = buckets * latency + 47 / 48 * params * 4 / bw
    gather = buckets * latency + 47 / 48 * params * 2 / bw
    expected = max(0.1 * reduce, reduce - stage_mb * 2 / 3) + max(0.0, gather - stage_mb / 3)
    assert e.dp_comm_s == pytest.approx(expected, rel=1e-9)
    assert e.dp_comm_s > 0


def test_tensor_parallel_allreduce_by_hand():
    # 4 all-reduces per layer per micro-batch (2 forward, 2 backward) of s·b·h 16-bit values:
    # ring all-reduce time 2(t−1)/t · bytes / (bandwidth · efficiency), plus the start-up
    # latency every collective pays.
    m = PRESETS["llama3.1-70b"]
    w = Workload(m, 4096, 8, framework="megatron")
    p = plan(tp=8, dp=1, grad_accum_steps=8, global_batch_size=8)
    e = estimate_step(w, p, H100, 8)
    msg = 2 * 4096 * 1 * 8192
    per_ar = 2 * 7 / 8 * msg / (450e9 * INTRA_NODE_EFFICIENCY) + LATENCY_INTRA_NODE_S
    assert e.tp_comm_s == pytest.approx(8 * 80 * 4 * per_ar)


def test_tp_across_nodes_is_much_slower():
    w = Workload(PRESETS["llama3.1-70b"], 4096, 8, framework="megatron")
    inside = estimate_step(w, plan(tp=8, dp=1, grad_accum_steps=8, global_batch_size=8), H100, 8)
    across = estimate_step(w, plan(tp=8, dp=1, nodes=2, gpus_per_node=4, grad_accum_steps=8, global_batch_size=8),
                           H100, 4)
    assert across.tp_comm_s > 5 * inside.tp_comm_s


def test_recompute_costs_one_forward():
    w = Workload(PRESETS["llama3.1-8b"], 4096, 64)
    none = estimate_step(w, plan(), H100, 8)
    full = estimate_step(w, plan(recompute="full"), H100, 8)
    # forward is 1/3 of forward+backward: full recompute adds up to a third of the layers'
    # compute; the output layer, the loss and memory-bound kernels are not recomputed.
    assert 1.25 < full.compute_s / none.compute_s < 4 / 3


def test_time_to_train_and_gpu_hours():
    w = Workload(PRESETS["llama3.1-8b"], 4096, 64)
    e = estimate_step(w, plan(), H100, 8, steps=1000)
    assert e.time_to_train_s == pytest.approx(1000 * e.step_time_s)
    assert e.gpu_hours == pytest.approx(e.time_to_train_s * 8 / 3600)
    assert e.tokens_per_s == pytest.approx(64 * 4096 / e.step_time_s)


def test_deepspeeds_data_parallel_traffic_runs_as_its_engine_runs_it():
    # deepspeed 0.19.8 (runtime/engine.py allreduce_gradients, runtime/zero/stage_1_and_2.py):
    # ZeRO-2 reduce-scatters at every micro-batch (partition_gradients), ZeRO-1 once at the
    # accumulation boundary, both under the backward with overlap_comm (jobctl renders it);
    # without ZeRO the engine all-reduces after the backward. Llama 3.1 8B on 2 nodes of 8 H100s.
    w = Workload(PRESETS["llama3.1-8b"], 4096, 256, framework="deepspeed")

    def dp_comm(sharding, accum, framework="deepspeed"):
        p = Plan(nodes=2, gpus_per_node=8, tp=1, pp=1, dp=16, cp=1, sharding=sharding, micro_batch_size=1,
                 grad_accum_steps=accum, global_batch_size=16 * accum, recompute="none", offload="none",
                 sequence_parallel=False)
        ww = replace(w, global_batch_size=16 * accum) if framework == "deepspeed" else \
            Workload(PRESETS["llama3.1-8b"], 4096, 16 * accum, framework=framework)
        return estimate_step(ww, p, H100, 8).dp_comm_s

    assert dp_comm("zero1", 8) == pytest.approx(dp_comm("zero1", 1))  # once a step
    one, two, eight = (dp_comm("zero2", k) for k in (1, 2, 8))
    per_micro_batch = two - one
    assert per_micro_batch > 0 and eight - one == pytest.approx(7 * per_micro_batch)
    # without ZeRO nothing hides the all-reduce; DDP's buckets (FSDP via accelerate, sharding
    # none) overlap it with the backward
    assert dp_comm("none", 1) > 5 * dp_comm("none", 1, framework="fsdp")
