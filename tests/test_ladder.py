"""The OOM ladder against hand-derived steps: llama3.1-8b on one node of 8x H100 SXM."""

from dataclasses import replace

import pytest

from jobctl.model import OOMFigures
from jobctl.planner.catalog import GIB, lookup_gpu
from jobctl.planner.ladder import (
    RUNGS,
    Calibration,
    CalibrationPoint,
    LadderStep,
    ladder,
    next_host_plan,
    next_plan,
    scaling_bytes,
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


def mem(w, t, p):
    return estimate(w, t.gpu_memory_bytes, p, t.host_mem_bytes)


USABLE = H100.memory_bytes - GIB  # the catalog's H100 less the 1 GiB safety margin


def test_one_failure_calibrates_the_terms_the_rungs_shrink():
    """PyTorch's figures: total 79.14 GiB, 0.2 GiB free, tried 3.91 GiB. The step needed at
    least D = 79.14 - 0.2 + 3.91 GiB; the model said P. The gap D - P is put on the
    activations and logits S (gamma = (D - P) / S), so a plan with S' is calibrated at
    P' + gamma * S' (derived here, not taken from the ladder)."""
    cap, free, tried = int(79.14 * GIB), int(0.2 * GIB), int(3.91 * GIB)
    m0 = mem(W, T, START)
    d = cap - free + tried
    gamma = (d - m0.total_bytes) / scaling_bytes(m0)
    s = next_plan(W, T, Constraints(), START, OOMFigures(tried, cap, free))
    assert s.calibration.per_scaling == pytest.approx(gamma) and s.calibration.fixed_gap_bytes == 0
    assert s.calibration.points == (CalibrationPoint(m0.total_bytes, scaling_bytes(m0), d,
                                                     "OOM message: in use + tried to allocate"),)
    m2 = mem(W, T, s.plan)
    assert s.calibrated_bytes == int(m2.total_bytes + gamma * scaling_bytes(m2))
    # the usable memory is the reported capacity (smaller than the catalog's) less the margin
    assert s.usable_bytes == cap - GIB and s.calibrated_bytes <= s.usable_bytes and s.expected_to_fit
    assert (s.rung, s.plan.micro_batch_size) == ("micro-batch", 2)  # the largest that fits, calibrated


def test_a_failure_far_above_the_prediction_still_has_a_next_step():
    """The case the old ladder stopped at: a "Tried to allocate" 1000x what the model predicted for
    the whole step (an unmodelled buffer). The usable memory never goes negative: the ladder
    picks the plan whose calibrated need is the least, and says the evidence does not promise it fits."""
    m0 = mem(W, T, START)
    tried = 1000 * m0.total_bytes
    s = next_plan(W, T, Constraints(), START, OOMFigures(tried, int(79.14 * GIB), int(0.2 * GIB)))
    assert s is not None and not s.expected_to_fit
    assert s.memory.total_bytes < m0.total_bytes and s.calibrated_bytes < s.calibration.points[0].observed_bytes
    # it is the least-demanding step (by the calibration) among the single rungs and combinations
    assert s.plan.micro_batch_size == 1 and s.plan.recompute == "full"


def test_ten_times_the_prediction_is_cured_by_a_small_enough_micro_batch_and_recompute():
    m0 = mem(W, T, START)
    cap, free = H100.memory_bytes, int(0.5 * GIB)
    tried = 10 * m0.total_bytes - (cap - free)  # the step wanted 10x what the model said
    s = next_plan(W, T, Constraints(tp=1, pp=1), START, OOMFigures(tried, cap, free))
    gamma = (10 * m0.total_bytes - m0.total_bytes) / scaling_bytes(m0)
    m1 = mem(W, T, s.plan)
    assert s.expected_to_fit and m1.total_bytes + gamma * scaling_bytes(m1) <= USABLE
    assert s.plan.global_batch_size == GBS and s.memory.total_bytes < m0.total_bytes


def test_measured_peak_is_evidence_too():
    m0 = mem(W, T, START)
    seen = m0.total_bytes + 20 * GIB  # the sampler saw 20 GiB more than predicted
    s = next_plan(W, T, Constraints(), START, OOMFigures(measured_peak_bytes=seen))
    assert s.calibration.points[0].observed_bytes == max(seen, T.gpu_memory_bytes)
    assert s.calibration.points[0].source in ("measured peak", "no figures: more than the GPU's capacity")


def test_without_figures_the_demand_is_at_least_the_capacity():
    m0 = mem(W, T, START)
    s = next_plan(W, T, Constraints(), START)
    assert s.calibration.points[0].observed_bytes == T.gpu_memory_bytes  # it did not fit: > capacity
    assert s.calibration.per_scaling == pytest.approx((T.gpu_memory_bytes - m0.total_bytes) / scaling_bytes(m0))


def test_two_failures_separate_a_gap_no_rung_changes():
    """Two points, hand-solved: gaps 30 and 20 GiB at S = 40 and 20 GiB give gamma = 0.5 and
    beta = 10 GiB (30 = 10 + 0.5 * 40; 20 = 10 + 0.5 * 20)."""
    p1 = CalibrationPoint(60 * GIB, 40 * GIB, 90 * GIB, "a")
    p2 = CalibrationPoint(45 * GIB, 20 * GIB, 65 * GIB, "b")
    cal = Calibration.fit((p1, p2))
    assert cal.per_scaling == pytest.approx(0.5) and cal.fixed_gap_bytes == 10 * GIB
    # a constant gap (a leak): gamma 0, beta the gap
    cal = Calibration.fit((CalibrationPoint(60 * GIB, 40 * GIB, 80 * GIB, "a"),
                           CalibrationPoint(45 * GIB, 20 * GIB, 65 * GIB, "b")))
    assert cal.per_scaling == 0 and cal.fixed_gap_bytes == 20 * GIB
    # points that would need a negative beta keep both explained with gamma alone
    cal = Calibration.fit((CalibrationPoint(60 * GIB, 40 * GIB, 62 * GIB, "a"),
                           CalibrationPoint(45 * GIB, 20 * GIB, 65 * GIB, "b")))
    assert all(p.predicted_bytes + cal.fixed_gap_bytes + cal.per_scaling * p.scaling_bytes >= p.observed_bytes
               for p in cal.points)
    assert Calibration.from_dict(cal.to_dict()) == cal


GRID = [  # (micro-batch of the failed plan, tried GiB, free GiB, capacity GiB)
    (mbs, tried, free, cap)
    for mbs in (8, 4, 1)
    for tried in (0.05, 3.91, 40.0, 4000.0)
    for free in (0.0, 0.7, 12.0)
    for cap in (79.14, 40.0)
]


@pytest.mark.parametrize("mbs, tried, free, cap", GRID)
def test_grid_next_plan_exists_until_the_bottom_and_never_predicts_more(mbs, tried, free, cap):
    """Over a grid of PyTorch's figures (including a capacity below the catalog's): there is a
    next plan until the real bottom, and no step predicts more than the plan that failed, by
    the model or by the calibration."""
    c = Constraints(tp=1, pp=1)  # a short ladder: micro-batch, recompute, sharding, offload
    failed = plan(micro_batch_size=mbs, grad_accum_steps=GBS // (8 * mbs))
    info = OOMFigures(int(tried * GIB), int(cap * GIB), int(free * GIB))
    history, cal = (), None
    for _ in range(30):
        s = next_plan(W, T, c, failed, info, history, cal)
        if s is None:
            break
        before = mem(W, T, failed)
        assert s.memory.total_bytes < before.total_bytes
        assert s.calibrated_bytes < s.calibration.predict(before)
        assert s.plan.global_batch_size == GBS
        history, failed, info, cal = history + (failed,), s.plan, None, s.calibration
    else:
        raise AssertionError("the ladder did not end")
    # the bottom: micro-batch 1, every layer recomputed, ZeRO-3, the optimizer and the parameters offloaded
    assert (failed.micro_batch_size, failed.recompute, failed.recompute_layers, failed.sharding, failed.offload) == \
        (1, "full", 0, "zero3", "optimizer+params")


def test_host_oom_steps_offload_back_or_stops():
    offloaded = plan(sharding="zero3", offload="optimizer+params", micro_batch_size=1, grad_accum_steps=8)
    s = next_host_plan(W, T, Constraints(), offloaded)
    assert s.plan.offload == "optimizer" and s.rung == "host offload"
    assert s.memory.host_bytes_per_node < mem(W, T, offloaded).host_bytes_per_node and s.memory.fits_gpu
    assert next_host_plan(W, T, Constraints(), START) is None  # nothing offloaded: nothing jobctl can do


def test_micro_batch_one_goes_to_recompute():
    one = plan(micro_batch_size=1, grad_accum_steps=8)
    s = next_plan(W, T, Constraints(), one)
    assert s.rung == "recompute"
    # DeepSpeed (HF gradient checkpointing) recomputes every layer or none
    assert (s.plan.recompute, s.plan.recompute_layers) == ("full", 0)
    assert (s.plan.micro_batch_size, s.plan.grad_accum_steps) == (1, 8)


def test_megatron_recomputes_a_quarter_of_the_layers_first():
    # flash attention: no selective step (Megatron's selective recomputes only the a·s² scores);
    # --recompute-method block of a quarter of the 32 layers
    one = plan(micro_batch_size=1, grad_accum_steps=8, sharding="zero1")
    s = next_plan(work(framework="megatron"), T, Constraints(), one)
    assert (s.rung, s.plan.recompute, s.plan.recompute_layers) == ("recompute", "full", 8)


def test_eager_attention_tries_selective_recompute_first():
    w = work(attention="eager", framework="megatron")
    one = plan(micro_batch_size=1, grad_accum_steps=8, sharding="zero1")
    s = next_plan(w, T, Constraints(), one)
    assert (s.rung, s.plan.recompute) == ("recompute", "selective")


def test_deepspeed_never_gets_selective_recompute_it_does_not_have():
    one = plan(micro_batch_size=1, grad_accum_steps=8)
    s = next_plan(work(attention="eager"), T, Constraints(), one)
    assert (s.rung, s.plan.recompute, s.plan.recompute_layers) == ("recompute", "full", 0)


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
        ["micro-batch", "micro-batch", "recompute", "sharding", "offload", "offload"])
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
    # 170 GiB more than was there, with tp and pp pinned: neither micro-batch 1 alone nor full
    # recompute alone is calibrated to fit; both together are (checked below, by the model).
    c = Constraints(tp=1, pp=1)
    s = next_plan(W, T, c, START, OOMFigures(170 * GIB, H100.memory_bytes, 0))
    assert s.expected_to_fit and s.calibrated_bytes <= USABLE
    assert "+" in s.rung and set(s.rung.split("+")) <= set(RUNGS)
    assert s.plan.global_batch_size == GBS
    for single in (plan(micro_batch_size=1, grad_accum_steps=8), replace(START, recompute="full")):
        assert s.calibration.predict(mem(W, T, single)) > USABLE


def test_the_ladder_strictly_lowers_memory_and_keeps_the_batch():
    steps = ladder(W, T, Constraints(), START, OOMFigures(tried_to_allocate_bytes=int(3.91 * GIB)))
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


def test_a_mixture_of_experts_under_megatron_tries_its_named_modules_first():
    # flash attention, but the experts' 16-bit SwiGLU product is Megatron's `moe_act` module
    # (--recompute-modules moe_act): selective frees memory here, unlike the attention core alone,
    # so the recompute rung offers it before recomputing whole layers
    from jobctl.planner.ladder import _recompute_options
    w = Workload(PRESETS["qwen3-30b-a3b"], 4096, GBS, framework="megatron")
    one = plan(micro_batch_size=1, grad_accum_steps=8, sharding="zero1", ep=8)
    first = next(_recompute_options(w, T, Constraints(), one))
    assert (first.recompute, first.recompute_layers) == ("selective", 0)
    # each routed copy's 2·f_e bytes of 16-bit SwiGLU product go, per layer: 8 of 128 experts of
    # 768, 4096 tokens
    from jobctl.planner.memory import layer_activation_terms
    kept, recomputed = ({n: b for n, b, _ in layer_activation_terms(w, p, 1)} for p in (one, first))
    assert kept["expert intermediates"] - recomputed["expert intermediates"] == pytest.approx(8 * 4096 * 2 * 768)
    assert peak(w, T, first) < peak(w, T, one)
    dense = next(_recompute_options(work(framework="megatron"), T, Constraints(), one))
    assert dense.recompute == "full"  # Llama: nothing but the attention core to name
