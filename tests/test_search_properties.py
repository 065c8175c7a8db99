"""Properties of the search and the OOM ladder on random small-but-valid workloads and targets."""

import math
from dataclasses import replace

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jobctl.model import OOMFigures
from jobctl.planner.catalog import GIB, gpu_names, lookup_gpu
from jobctl.planner.ladder import next_plan
from jobctl.planner.memory import Workload, estimate
from jobctl.planner.models import ModelSpec
from jobctl.planner.perf import Links
from jobctl.planner.search import (
    MAX_CP,
    SCALING_EFFICIENCY,
    WHOLE_NODE_GAIN,
    Constraints,
    Target,
    divisors,
    search,
)

# Global batch sizes with many divisors (so many dp x micro-batch splits exist), and a few without.
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 36, 48, 60, 64, 96, 120, 128, 240, 256, 360, 512, 720, 1024)
GPUS = tuple(k for k in gpu_names() if not lookup_gpu(k).is_cpu)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw):
    family = draw(st.sampled_from(("llama", "gpt")))
    heads = draw(st.sampled_from((4, 8, 16, 32)))
    head_dim = draw(st.sampled_from((32, 64, 128)))
    hidden = heads * head_dim
    kv_heads = draw(st.sampled_from([d for d in divisors(heads)]))
    ffn = draw(st.sampled_from((2 * hidden, 4 * hidden, 64 * math.ceil(8 * hidden / 3 / 64))))
    vocab = draw(st.one_of(st.sampled_from((32000, 50257, 128256)), st.integers(256, 65536)))
    layers = draw(st.integers(1, 48))
    gpt = family == "gpt"
    return ModelSpec(
        name="random", family=family, layers=layers, hidden=hidden, ffn_hidden=ffn, heads=heads,
        kv_heads=kv_heads, vocab=vocab, tied_embeddings=draw(st.booleans()),
        max_seq_len=8192 if gpt else 0, dropout=draw(st.sampled_from((0.0, 0.1))) if gpt else 0.0,
    )


@st.composite
def workloads(draw):
    return Workload(
        model=draw(models()),
        seq_len=128 * draw(st.integers(1, 64)),
        global_batch_size=draw(st.sampled_from(BATCHES)),
        optimizer=draw(st.sampled_from(("adamw", "adam8bit", "lion", "sgd", "sgd-momentum", "adafactor", "adam-mini"))),
        precision=draw(st.sampled_from(("bf16-mixed", "bf16-pure", "fp32"))),
        method=draw(st.sampled_from(("full", "full", "lora", "qlora"))),
        attention=draw(st.sampled_from(("flash", "eager"))),
        fused_cross_entropy=draw(st.booleans()),
        framework=draw(st.sampled_from(("generic", "deepspeed", "megatron", "fsdp", "torchtitan"))),
    )


@st.composite
def targets(draw, precision="bf16-mixed"):
    gpu = lookup_gpu(draw(st.sampled_from(GPUS)))
    gpn = draw(st.sampled_from((1, 2, 4, 8)))
    nodes = draw(st.integers(1, 16))
    links = Links(gpu.intra_node_gbs, gpu.inter_node_gbit / 8, gpu.pcie_gbs, gpu.mem_bandwidth_gbs,
                  gpu.peak_tflops(precision))
    host = draw(st.sampled_from((64, 256, 1024, 2048))) * GIB
    return Target("random", "part", gpu, gpn, nodes, host, gpu.memory_bytes, links)


def check_plan(w: Workload, t: Target, plan):
    assert plan.check() == []
    assert plan.tp * plan.pp * plan.dp * plan.cp == plan.world_size == plan.nodes * plan.gpus_per_node
    assert plan.micro_batch_size * plan.grad_accum_steps * plan.dp == w.global_batch_size == plan.global_batch_size
    assert plan.world_size <= t.total_gpus and plan.gpus_per_node <= t.gpus_per_node
    assert plan.tp <= plan.gpus_per_node and w.model.heads % plan.tp == 0 and w.model.kv_heads % plan.tp == 0


@SETTINGS
@given(w=workloads(), t=targets())
def test_every_plan_the_search_returns_fits_and_adds_up(w, t):
    r = search(w, t, Constraints())
    if r.best is None:
        assert r.reasons  # nothing fits: the search says why
        return
    for cand in [r.best] + r.ranked:
        mem = estimate(w, t.gpu_memory_bytes, cand.plan, t.host_mem_bytes)
        assert mem.fits, cand.plan.summary()
        assert mem.total_bytes <= t.gpu_memory_bytes - w.overheads.safety_margin_gib * GIB
        check_plan(w, t, cand.plan)
    assert r.best.plan == r.ranked[0].plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), t=targets())
def test_the_default_plan_is_the_fastest_that_keeps_the_stated_efficiency(w, t):
    """Issue 15's properties of the default objective ("balanced"), against every feasible plan
    (keep_all: no pruning), so the search's bounds are checked too: the fastest plan whose
    tokens/s per GPU keeps the stated efficiency of the best; part of a node only when no plan on
    the whole node is faster; never a longer step than the fewest-GPUs plan."""
    r = search(w, t, Constraints())
    assert r.objective == "balanced"
    assume(r.best is not None and r.best.estimate is not None)
    every = [c for c in search(w, t, Constraints(), keep_all=True).ranked if c.estimate is not None]

    def fastest_efficient(cands):
        top = max(c.tokens_per_s_per_gpu for c in cands)
        keeps = [c for c in cands if c.tokens_per_s_per_gpu >= top * SCALING_EFFICIENCY * (1 - 1e-9)]
        return top, keeps, max(c.tokens_per_s for c in keeps)

    best = r.best
    top, keeps, fastest = fastest_efficient(every)
    whole = [c for c in every if c.plan.gpus_per_node == t.gpus_per_node]
    if best.plan.gpus_per_node < t.gpus_per_node:
        # part of a node: the fastest plan that keeps the efficiency, and the same rule over the
        # whole-node plans gives none faster
        assert best.tokens_per_s_per_gpu >= top * SCALING_EFFICIENCY * (1 - 1e-9)
        assert best.tokens_per_s >= fastest * (1 - 1e-9)
        if whole:
            assert fastest_efficient(whole)[2] <= best.tokens_per_s * (1 + WHOLE_NODE_GAIN + 1e-9)
    elif best.tokens_per_s_per_gpu >= top * SCALING_EFFICIENCY * (1 - 1e-9):
        assert best.tokens_per_s >= fastest * (1 - 1e-9)  # the pruned search lost nothing
    else:
        # the fastest efficient plan takes part of a node, and the same rule over the whole-node
        # plans gives a faster one: that one
        top_w, keeps_w, fastest_w = fastest_efficient(whole)
        assert best.tokens_per_s_per_gpu >= top_w * SCALING_EFFICIENCY * (1 - 1e-9)
        assert best.tokens_per_s >= fastest_w * (1 - 1e-9)
        assert best.tokens_per_s > fastest * (1 + WHOLE_NODE_GAIN)
    # its step is never longer than the fewest-GPUs plan's
    fewest = search(w, t, Constraints(), objective="gpus").best
    assert best.estimate.step_time_s <= fewest.estimate.step_time_s * (1 + 1e-9)


def ladder_bound(w: Workload, t: Target, mbs: int) -> int:
    """Steps a ladder can take (ladder.py): the micro-batch at least halves, recompute climbs
    selective + 4 quarters, sharding 4 stages, tp·pp·cp at least doubles (tp <= GPUs per node,
    pp <= layers, cp <= MAX_CP), offload 2 stages; every step moves at least one of them."""
    cp = math.floor(math.log2(MAX_CP)) if w.caps.cp else 0
    return math.floor(math.log2(mbs)) + 5 + 4 + math.floor(math.log2(t.gpus_per_node)) \
        + math.floor(math.log2(w.model.layers)) + cp + 2


@SETTINGS
@given(w=workloads(), t=targets(), data=st.data())
def test_the_ladder_from_a_fitting_plan_only_goes_down_and_ends(w, t, data):
    objective = data.draw(st.sampled_from(("balanced", "throughput", "time")), label="objective")
    r = search(w, t, Constraints(), objective=objective)
    assume(r.best is not None)
    plan = data.draw(st.sampled_from([c.plan for c in r.ranked]), label="start")
    # the largest micro-batch that fits with the plan's other knobs
    per_dp = w.global_batch_size // plan.dp
    for mbs in sorted(divisors(per_dp), reverse=True):
        bigger = replace(plan, micro_batch_size=mbs, grad_accum_steps=per_dp // mbs)
        if estimate(w, t.gpu_memory_bytes, bigger, t.host_mem_bytes).fits:
            plan = bigger
            break
    # pins the ladder must keep: the start plan's own tp and/or pp
    pins = data.draw(st.sampled_from(((), ("tp",), ("pp",), ("tp", "pp"))), label="pins")
    c = Constraints(**{k: getattr(plan, k) for k in pins})
    bound = ladder_bound(w, t, plan.micro_batch_size)
    assert bound <= 50  # the shapes drawn here: micro-batch <= 1024, 8 GPUs per node, 48 layers, cp <= 32
    prev = estimate(w, t.gpu_memory_bytes, plan, t.host_mem_bytes).total_bytes
    # the first OOM may come with "Tried to allocate X", from tiny to 1000x the whole prediction
    tried = data.draw(st.one_of(st.none(), st.integers(0, 1000 * prev)), label="tried")
    failure = OOMFigures(tried_to_allocate_bytes=tried)
    start, history, cal = plan, (), None
    for _ in range(bound + 1):
        step = next_plan(w, t, c, plan, failure, history, cal)
        if step is None:
            break
        check_plan(w, t, step.plan)
        assert step.plan not in history and step.plan != plan
        assert all(getattr(step.plan, k) == getattr(start, k) for k in pins)
        total = estimate(w, t.gpu_memory_bytes, step.plan, t.host_mem_bytes).total_bytes
        assert total == step.memory.total_bytes
        assert total < prev and step.memory.fits_host  # strictly lower each step, by the model ...
        failed_calibrated = step.calibration.predict(estimate(w, t.gpu_memory_bytes, plan, t.host_mem_bytes))
        assert step.calibrated_bytes < failed_calibrated  # ... and by the calibrated model
        assert step.expected_to_fit == (step.calibrated_bytes <= step.usable_bytes)
        history += (plan,)
        plan, prev, failure, cal = step.plan, total, OOMFigures(), step.calibration
    else:
        raise AssertionError(f"the ladder did not end within {bound} steps")


def test_a_host_too_small_for_offload_does_not_hide_the_plans_without_it():
    """The search's first test of a layout, its least-GPU-memory setting, offloads; when that
    fails only on host RAM, the layout's settings without offload must still be tried.

    Hand numbers: Llama 3.2 1B (1.24e9 params) with DeepSpeed on exactly one whole node of 8
    H100s (resources.nodes: 1) with 40 GiB of host RAM. The host keeps 8 GiB for the OS and 3 GiB
    per rank: 32 GiB, 8 GiB left. ZeRO optimizer offload puts fp32 master, Adam's m and v and
    fp32 gradients on the host: 16 B per param over 8 ranks, 2.5 GB per rank, 20 GB per node:
    more than 8 GiB. Without offload the states are 1.24e9 x 16 B / 8 = 2.5 GB per GPU
    (ZeRO-2): far below 80 GB."""
    from jobctl.planner.models import PRESETS

    gpu = lookup_gpu("h100-sxm-80gb")
    w = Workload(PRESETS["llama3.2-1b"], 2048, 64, framework="deepspeed")
    links = Links(gpu.intra_node_gbs, gpu.inter_node_gbit / 8, gpu.pcie_gbs, gpu.mem_bandwidth_gbs,
                  gpu.peak_tflops("bf16-mixed"))
    t = Target("small-host", "gpu", gpu, 8, 1, 40 * GIB, gpu.memory_bytes, links)
    r = search(w, t, Constraints(nodes=1))
    assert r.best is not None, r.reasons
    assert r.best.plan.offload == "none" and r.best.memory.fits and r.best.plan.world_size == 8
    offloading = search(w, t, Constraints(nodes=1, offload="optimizer"))
    assert offloading.best is None and "host RAM" in " ".join(offloading.reasons)
