"""Mixtures of experts planned (issue 31, second step): expert parallelism in the search, the
routed experts' states over EP and expert data parallelism, the routed tokens' activations, the
token all-to-alls, and the refusals where a framework or a pin cannot run one.

Expected values are hand derivations from the models' configs (Mixtral-8x7B: 32 layers, hidden
4096, 8 experts of 14336, top 2; Qwen3-30B-A3B: 48 layers, hidden 2048, 128 experts of 768,
top 8) and from Megatron-Core's MoE parallel folding (experts on EP x expert-DP over a stage's
tp·cp·dp ranks, expert tensor parallelism 1)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from jobctl_run import jobctl

from jobctl import frameworks
from jobctl.frameworks import megatron
from jobctl.planner import inputs
from jobctl.planner.memory import GIB, Workload, estimate, layer_activation_terms
from jobctl.planner.models import PRESETS
from jobctl.model import duration
from jobctl.planner.perf import estimate_step, model_flops_per_token
from jobctl.planner.plan import Plan
from jobctl.planner.search import Constraints, search
from jobctl.planning import load_inventory

MIXTRAL_ROUTED = 32 * 8 * 3 * 4096 * 14336  # layers x experts x (gate, up, down) x h x f_e


def plan(**kw):
    base = dict(nodes=1, gpus_per_node=8, tp=1, pp=1, dp=8, cp=1, sharding="zero1", micro_batch_size=1,
                grad_accum_steps=32, global_batch_size=256, recompute="none", offload="none",
                sequence_parallel=False)
    base.update(kw)
    return Plan(**base)


def h100():
    """The shipped h100 inventory's partition as the planner sees it (16 nodes of 8 H100 SXM)."""
    inv = load_inventory("h100", []).value
    return inputs.target(inv, inv.partitions[0], "bf16-mixed")


def term(mem, name):
    return next(t.bytes for t in mem.terms if t.name == name)


def test_routed_experts_are_split_ep_ways_and_their_optimizer_over_expert_dp():
    w = Workload(PRESETS["mixtral-8x7b"], 4096, 256, framework="megatron", grad_reduce="fp32")
    assert PRESETS["mixtral-8x7b"].routed_params_per_layer * 32 == MIXTRAL_ROUTED
    for ep in (1, 2, 8):
        mem = estimate(w, 80 * 2**30, plan(ep=ep))
        per_rank = MIXTRAL_ROUTED / ep
        edp = 8 // ep  # the stage's tp·cp·dp = 8 ranks hold each expert edp times
        assert term(mem, "expert weights") == pytest.approx(per_rank * 2)  # bf16
        assert term(mem, "expert gradients") == pytest.approx(per_rank * 4)  # Megatron's fp32 main grads
        # the distributed optimizer: fp32 master + Adam's m and v, sharded over expert DP
        assert term(mem, "expert optimizer states") == pytest.approx(per_rank * 12 / edp)
    # the rest (attention, norms, router, embedding, output) is sharded as a dense model's
    dense = PRESETS["mixtral-8x7b"].params() - MIXTRAL_ROUTED
    assert term(estimate(w, 80 * 2**30, plan(ep=8)), "weights") == pytest.approx(dense * 2)


def test_fp8_parameters_cover_the_experts_too():
    # Megatron's --fp8-param-gather builds the whole model inside Transformer Engine's
    # fp8_model_init: the experts' GroupedLinear keeps FP8 primary weights as the dense layers'
    # Linear does (no 16-bit copy). Hopper keeps each FP8 weight row-wise and transposed: 2 B.
    m = PRESETS["mixtral-8x7b"]
    p = plan(ep=8)
    fp8 = Workload(m, 4096, 256, framework="megatron", precision="fp8", fp8_recipe="tensorwise",
                   grad_reduce="fp32", formats=("bf16", "fp8"))
    names = {t.name: t.bytes for t in estimate(fp8, 80 * 2**30, p).terms}
    assert names["expert fp8 weights"] == pytest.approx(MIXTRAL_ROUTED / 8 * 2)
    assert "expert weights" not in names and "expert fp8 weight copies" not in names
    # per-block scaling renders no --fp8-param-gather (frameworks.fp8_param_gather): the experts
    # keep their 16-bit weights and a cached FP8 copy beside them
    blockwise = Workload(m, 4096, 256, framework="megatron", precision="fp8", fp8_recipe="blockwise",
                         grad_reduce="fp32", formats=("bf16", "fp8"))
    names = {t.name: t.bytes for t in estimate(blockwise, 80 * 2**30, p).terms}
    assert names["expert weights"] == pytest.approx(MIXTRAL_ROUTED / 8 * 2)
    assert names["expert fp8 weight copies"] == pytest.approx(MIXTRAL_ROUTED / 8 * 2)


def test_routed_tokens_activations_by_hand():
    # Megatron, flash attention, no recompute, tp 1: a rank's s·b tokens make top_k copies; each
    # copy keeps its permuted input (2·h bytes, fc1's) and its 16-bit routing probability, which
    # megatron-core applies inside the expert (experts.py TEGroupedMLP: bias_act_func weights the
    # SwiGLU product; the combine's unpermute gets no probabilities and keeps nothing), and, in the
    # expert, fc1's gate and up outputs and the SwiGLU product (3 · 2·f_e bytes, Transformer Engine)
    w = Workload(PRESETS["mixtral-8x7b"], 4096, 256, framework="megatron")
    terms = {n: b for n, b, _ in layer_activation_terms(w, plan(), 1)}
    s, k, h, fe = 4096, 2, 4096, 14336
    assert terms["routed tokens"] == pytest.approx(k * s * (2 * h + 2))
    assert terms["expert intermediates"] == pytest.approx(3 * 2 * k * s * fe)
    assert terms["router"] == pytest.approx(8 * s * 8)  # fp32 logits and probabilities, 8 experts
    assert "mlp intermediates" not in terms  # the dense MLP's term is replaced, not added
    # sequence parallelism splits the tokens over tp before they are routed
    sp = {n: b for n, b, _ in layer_activation_terms(w, plan(tp=2, dp=4, sequence_parallel=True), 1)}
    assert sp["routed tokens"] == pytest.approx(terms["routed tokens"] / 2)


def test_the_mfu_numerator_counts_active_parameters():
    # 6 x the matmul parameters a token passes through (top 2 of 8 experts, attention, router,
    # the output layer; not the embedding lookup) + causal attention 6·L·h·s
    m = PRESETS["mixtral-8x7b"]
    w = Workload(m, 4096, 256, framework="megatron")
    active_matmuls = m.active_params() - m.vocab * m.hidden  # less the embedding lookup
    assert model_flops_per_token(w) == pytest.approx(6 * active_matmuls + 6 * 32 * 4096 * 4096, rel=1e-4)


def test_all_to_alls_cost_nothing_without_ep_and_more_across_nodes():
    t = h100()
    w = Workload(PRESETS["qwen3-30b-a3b"], 4096, 512, framework="megatron")
    one = estimate_step(w, plan(nodes=2, dp=16, global_batch_size=512, grad_accum_steps=32, ep=1), t.links, 8)
    inside = estimate_step(w, plan(nodes=2, dp=16, global_batch_size=512, grad_accum_steps=32, ep=8), t.links, 8)
    across = estimate_step(w, plan(nodes=2, dp=16, global_batch_size=512, grad_accum_steps=32, ep=16), t.links, 8)
    assert one.ep_comm_s == 0
    assert 0 < inside.ep_comm_s < across.ep_comm_s  # NVLink inside the node, the network across
    assert inside.to_dict()["parts"]["ep_comm_s"] == inside.ep_comm_s


def test_the_combined_schedule_hides_the_all_to_alls_and_holds_one_layer_more():
    # Megatron's --overlap-moe-expert-parallel-comm (model_chunk_schedule_plan.py run): after one
    # micro-batch's forward, each step runs layer i's forward of the next one before layer
    # L-1-i's backward of this one frees it: L + 1 layers at the peak, not 2·L; pipelined, the
    # schedule adds one warm-up chunk forward (schedules.py num_warmup_microbatches + 1)
    w = Workload(PRESETS["mixtral-8x7b"], 4096, 256, framework="megatron")
    apart = Workload(PRESETS["mixtral-8x7b"], 4096, 256, framework=megatron.FRAMEWORK.with_caps(ep_overlap=False))
    flat = plan(ep=8)
    assert term(estimate(w, 80 * GIB, flat), "layer activations") == pytest.approx(
        term(estimate(apart, 80 * GIB, flat), "layer activations") * 33 / 32)  # 32 layers, one more
    # pp 4, v 2, 32 micro-batches: the first stage ran (p-1)·2 + (v-1)·p + 1 = 11 chunk forwards
    # before its first backward (5.5 stages' worth); combined, 12 (6 stages' worth)
    piped = plan(ep=8, pp=4, dp=2, virtual_stages=2)
    assert term(estimate(w, 80 * GIB, piped), "layer activations") == pytest.approx(
        term(estimate(apart, 80 * GIB, piped), "layer activations") * 6 / 5.5)
    # pipelined without virtual stages megatron-core refuses it: jobctl leaves it off
    assert not frameworks.ep_overlap(w, plan(ep=8, pp=4, dp=2))
    assert not frameworks.ep_overlap(w, plan(ep=8, recompute="full"))

    # time: of each layer's all-to-alls E only what the paired micro-batch's compute C does not
    # cover shows, max(0, E - C), in all but the first forward and last backward of m (E and C:
    # the step model's own per-layer costs, perf._layer_costs, which the overlap does not change)
    from jobctl.planner import perf

    t, m, qwen = h100(), 8, PRESETS["qwen3-30b-a3b"]  # 48 layers of 128 small experts (top 8)
    # a 100 Gb/s network per GPU, on which two nodes' all-to-alls outrun the compute
    t = replace(t, links=replace(t.links, inter_node_gbs=12.5))
    w, apart = (Workload(qwen, 4096, 512, framework=f) for f in ("megatron", apart.framework))
    for nodes in (1, 2):  # inside NVLink (compute covers the all-to-alls), and across the network
        p = plan(nodes=nodes, dp=8 * nodes, ep=8 * nodes, grad_accum_steps=m, global_batch_size=m * 8 * nodes)
        on, off = estimate_step(w, p, t.links, 8), estimate_step(apart, p, t.links, 8)
        c, _, _, e, _, _, _ = perf._layer_costs(qwen, 4096, w.act_bytes, w.attention, None, "",
                                                (True, False, True, False), t.links, 8, 1, 1, 1, False, "none", 0.0,
                                                p.ep)
        assert off.ep_comm_s == pytest.approx(m * 48 * e)
        assert on.ep_comm_s == pytest.approx(m * 48 * (e / m + (1 - 1 / m) * max(0.0, e - c)))
        assert on.step_time_s == pytest.approx(off.step_time_s - off.ep_comm_s + on.ep_comm_s)
        assert (e > c) == (nodes == 2)  # across the network the all-to-alls outrun the compute: the excess shows


def test_the_recipe_can_turn_the_combined_schedule_off_and_asks_megatron_for_it():
    on = json.loads(jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "gb200", "--json").stdout)
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "gb200", "train.ep_overlap=false", "--json")
    assert r.returncode == 0, r.stderr
    off = json.loads(r.stdout)
    assert "--overlap-moe-expert-parallel-comm" in on["framework"]["args"]
    assert not {"--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"} & set(off["framework"]["args"])
    assert not any("EP all-to-alls" in o for o in off["framework"]["overlaps"])
    # true is auto's meaning for Megatron, and refused for a framework without it
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "gb200", "train.ep_overlap=true",
               "framework=torchtitan", "--json")
    assert r.returncode == 3
    assert any("train.ep_overlap=true" in x and "megatron only" in x for x in json.loads(r.stdout)["reasons"])


def test_megatrons_experts_launched_one_by_one_cost_host_time_per_local_expert():
    # Megatron-Core's GroupedLinear launches each local expert's GEMMs and casts from the host:
    # MOE_HOST_S_PER_EXPERT per local expert, per MoE layer, per micro-batch. Each MoE layer syncs
    # the host with the GPU (the token counts), so the host runs at most a layer ahead: a layer
    # takes the longer of its GPU work G and its host work H (the layer's kernel launches and the
    # experts'), and the experts' launches add max(G, H) - max(G, launches alone). Replayed CUDA
    # graphs launch none of it.
    from jobctl.planner import perf

    qwen, t = PRESETS["qwen3-30b-a3b"], h100()
    # (without the combined schedule, whose all-to-alls the host time would partly cover)
    apart = megatron.FRAMEWORK.with_caps(ep_overlap=False)
    launched = Workload(qwen, 4096, 512, framework=apart)
    replayed = Workload(qwen, 4096, 512, framework=apart.with_caps(moe_expert_launches=False))
    bound = set()
    for ep, mbs in ((2, 1), (16, 1), (8, 4), (16, 8)):
        p = plan(nodes=2, dp=16, ep=ep, micro_batch_size=mbs, grad_accum_steps=32 // mbs, global_batch_size=512)
        on, off = estimate_step(launched, p, t.links, 8), estimate_step(replayed, p, t.links, 8)
        micro, local_experts = 32 // mbs, 128 // ep
        # G: the layer's GPU work, as the step model has it without the launches (perf._layer_costs)
        g = perf._layer_costs(qwen, 4096, launched.act_bytes, launched.attention, None, "", (True, False, False, False),
                              t.links, 8, 1, 1, mbs, False, "none", 0.0, ep)[0]
        kernels = perf.KERNELS_PER_LAYER * perf.KERNEL_LAUNCH_S
        h = kernels + local_experts * perf.MOE_HOST_S_PER_EXPERT
        host = micro * 48 * (max(g, h) - max(g, kernels))
        bound.add("host" if h > g else "gpu")
        # (a longer stage hides more of the experts' gradient reduction: the exposed DP part, its own
        # term, may shrink, so it is set aside)
        assert (on.step_time_s - on.dp_comm_s) - (off.step_time_s - off.dp_comm_s) == pytest.approx(host, rel=1e-6)
        # reported as its own part of the step (the "why not" lines name it), not as compute
        assert (on.moe_host_s, off.moe_host_s) == (pytest.approx(host), 0.0)
        assert on.compute_s == pytest.approx(off.compute_s)
    assert bound == {"host", "gpu"}  # small micro-batches wait for the host, large ones hide it
    assert perf.MOE_HOST_S_PER_EXPERT > 0
    # torchtitan runs all its experts in one grouped kernel (torch._grouped_mm)
    assert not Workload(qwen, 4096, 512, framework="torchtitan").caps.moe_expert_launches


def test_the_search_splits_the_experts_and_renders_megatrons_moe_flags():
    r = jobctl("plan", "recipes/mixtral-8x7b.yaml", "--cluster", "h100", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    p = d["plan"]
    assert 8 % p["ep"] == 0 and (p["tp"] * p["cp"] * p["dp"]) % p["ep"] == 0 and p["ep"] > 1
    args = d["framework"]["args"]
    assert args[args.index("--expert-model-parallel-size") + 1] == str(p["ep"])
    assert args[args.index("--num-experts") + 1] == "8" and args[args.index("--moe-router-topk") + 1] == "2"
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "1"
    names = {t["name"] for t in d["memory"]["terms"]}
    assert {"expert weights", "expert gradients", "expert optimizer states"} <= names
    assert d["model"]["active_params"] == PRESETS["mixtral-8x7b"].active_params()


def test_a_pinned_ep_is_kept_and_a_wrong_one_refused():
    r = jobctl("plan", "recipes/mixtral-8x7b.yaml", "--cluster", "h100", "parallelism.ep=4", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["plan"]["ep"] == 4
    r = jobctl("plan", "recipes/mixtral-8x7b.yaml", "--cluster", "h100", "parallelism.ep=3", "--json")
    assert r.returncode == 3
    assert any("ep=3 does not divide the 8 experts" in x for x in json.loads(r.stdout)["reasons"])
    r = jobctl("plan", "recipes/llama8b.yaml", "--cluster", "h100", "parallelism.ep=2", "--json")
    assert r.returncode == 3
    assert any("has no experts to split" in x for x in json.loads(r.stdout)["reasons"])


@pytest.mark.parametrize("framework", ["deepspeed", "fsdp", "custom"])
def test_frameworks_without_moe_say_so_and_name_the_one_with_it(framework):
    w = Workload(PRESETS["qwen3-30b-a3b"], 4096, 512, framework=framework)
    res = search(w, h100(), Constraints())
    assert res.best is None and res.considered == 0
    assert any(f"not {framework}" in x and "megatron, torchtitan" in x for x in res.reasons), res.reasons


def test_torchtitan_plans_qwen3_moe_with_its_registry_config_and_expert_parallelism():
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "framework=torchtitan", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    p, args = d["plan"], d["framework"]["args"]
    assert args[:2] == ["--module=qwen3", "--config=qwen3_30b_a3b"]  # torchtitan's own 30B-A3B
    assert f"--parallelism.expert_parallel_degree={p['ep']}" in args and p["ep"] > 1
    assert "--training.disable_cuda_graphs" in args  # the all-to-all's sizes go through the CPU
    assert p["sharding"] in ("zero3", "hsdp") and p["recompute"] != "selective"


def test_torchtitan_plans_deepseek_v3_with_its_671b_config():
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "framework=torchtitan", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    args = d["framework"]["args"]
    assert args[:2] == ["--module=deepseek_v3", "--config=deepseek_v3_671b"]
    assert f"--parallelism.expert_parallel_degree={d['plan']['ep']}" in args and d["plan"]["ep"] > 1
    # the 671B config compiles the loss only: jobctl's compiled model (and async TP) needs the model too
    assert "--compile.components=model,loss" in args


def test_torchtitan_refuses_what_it_does_not_model_of_moe():
    from jobctl.frameworks import torchtitan

    q = Workload(PRESETS["qwen3-30b-a3b"], 4096, 512, framework="torchtitan")
    z3 = dict(sharding="zero3", grad_accum_steps=64)
    assert any("splits the experts by tensor parallelism" in x
               for x in torchtitan.problems(plan(tp=2, dp=4, ep=1, sequence_parallel=True, **z3), q))
    assert any("selective recompute of an MoE block" in x
               for x in torchtitan.problems(plan(ep=8, recompute="selective", **z3), q))
    assert any("ep 16 does not divide it" in x for x in torchtitan.problems(plan(ep=16, **z3), q))
    assert not torchtitan.problems(plan(tp=2, dp=4, ep=8, sequence_parallel=True, **z3), q)


def test_a_pin_the_framework_refuses_everywhere_is_named_as_the_reason():
    """Pinned to recompute=selective, torchtitan's MoE plans that fit in memory are all refused
    (its op-level SAC of an MoE block is not modelled): the answer says so, with the count, before
    the smallest layout's memory (which is not why nothing is offered), and that layout is marked
    as one the framework refuses too."""
    from jobctl.planning import load_inventory, load_recipe, plan_on
    d = plan_on(load_recipe("recipes/qwen3-30b-a3b.yaml", ["framework=torchtitan", "parallelism.recompute=selective"]),
                load_inventory("h100", ["partitions.0.nodes=2"]), alternatives=0, summary=False, learn=False).to_dict()
    assert not d["feasible"]
    refused = [x for x in d["reasons"] if "refused by torchtitan" in x]
    assert refused and "selective recompute of an MoE block" in refused[0], d["reasons"]
    assert int(refused[0].split()[0]) <= d["search"]["rejected"]["the framework refuses it"]
    smallest = next(i for i, x in enumerate(d["reasons"]) if "smallest needs" in x)
    assert d["reasons"].index(refused[0]) < smallest
    # the smallest layout is selective too: the framework's check comes after memory's, so it says so
    assert "recompute=selective" in d["reasons"][smallest] and "torchtitan would refuse it too" in d["reasons"][smallest]


def test_a_group_limited_router_keeps_its_group_choices():
    """torchtitan's group-limited router (models/common/moe.py _get_node_limited_routing_scores),
    eager: topk(2) inside each group keeps its int64 indices (2 x 8 B per group), the topk over
    the groups the kept groups' (8 B each), masked_fill its bool group mask (1 B per group):
    DeepSeek-V3's 8 groups keeping 4 (torchtitan's deepseek_v3_671b: router_num_expert_groups 8,
    router_num_limited_groups 4), 8 x 16 + 4 x 8 + 8 = 168 B per token, on the 58 of 61 layers
    that route. Compiled they are recomputed. (benchmarks/compiled_activations.py measures the
    same block with 4 groups keeping 2: 84 B per token.)"""
    import dataclasses
    ds = PRESETS["deepseek-v3"]
    assert (ds.moe.groups, ds.moe.groups_kept) == (8, 4)
    flat = dataclasses.replace(ds, moe=dataclasses.replace(ds.moe, groups=0, groups_kept=0))
    T = 4096

    def router(spec, compile_=False):
        w = Workload(spec, T, 512, framework="torchtitan", compile=compile_)
        return {n: b for n, b, _ in layer_activation_terms(w, plan(sharding="zero3"), 1)}["router"]
    assert router(ds) - router(flat) == pytest.approx(58 / 61 * T * (8 * 16 + 4 * 8 + 8))
    assert router(ds, True) == router(flat, True)


def test_moe_expert_groups_are_checked_in_the_recipe():
    from jobctl.config.schema import MoEArch
    ok = dict(experts=256, top_k=8, expert_ffn_hidden=2048)
    assert MoEArch(**ok, expert_groups=8, expert_groups_kept=4).expert_groups == 8
    for bad in (dict(expert_groups=7, expert_groups_kept=4),   # 256 experts do not split in 7
                dict(expert_groups=8),                          # kept missing
                dict(expert_groups=8, expert_groups_kept=9),    # more kept than there are
                dict(expert_groups=128, expert_groups_kept=3)):  # 3 groups of 2 hold 6 experts < top 8
        with pytest.raises(ValueError):
            MoEArch(**ok, **bad)


def test_torchtitan_moe_activations_by_hand():
    # torchtitan's MoE block (models/common/moe.py, token_dispatcher.py), Qwen3-30B-A3B, s·b = T
    # tokens, k = 8 copies each, no recompute, tp 1. The router's gate under autocast(float32)
    # keeps fp32 copies of its input (4·h per token) and its weight (4·E·h); softmax its fp32
    # probabilities (4·E); top-k: int64 ids (8·k), the gathered scores and their sum for the
    # normalisation (4·k + 4). The dispatcher: argsort ids and token ids (2 · 8 B per copy), the
    # sorted scores (4 B), the gathered 16-bit copies (2·h, kept by the w1/w3 grouped GEMMs);
    # the combine's fp32 cast of each expert output (4·h). The experts: w1 and w3 outputs, SiLU
    # output and the product (4 · 2·f_e per copy). The norm's 16-bit output is kept by nobody
    # (the router keeps its fp32 copy; Qwen3 has no shared expert).
    w = Workload(PRESETS["qwen3-30b-a3b"], 4096, 512, framework="torchtitan")
    terms = {n: b for n, b, _ in layer_activation_terms(w, plan(sharding="zero3"), 1)}
    T, k, h, E, fe = 4096, 8, 2048, 128, 768
    assert terms["router"] == pytest.approx(T * (4 * h + 4 * E + 8 * k + 4 * k + 4) + 4 * E * h)
    assert terms["routed tokens"] == pytest.approx(k * T * (2 * h + 4 * h + 8 + 8 + 4))
    assert terms["expert intermediates"] == pytest.approx(4 * 2 * k * T * fe)
    assert "mlp input" not in terms
    # Qwen3's q/k RMSNorms keep each head's 16-bit input and fp32 rstd: 32 query and 4 key heads of 128
    assert terms["q/k norm inputs"] == pytest.approx(T * (32 + 4) * (2 * 128 + 4))


def test_fsdp_gathers_an_moe_block_with_the_ranks_experts():
    # torchtitan wraps each block whole (experts included) in one FSDP unit: the gathered unit is
    # the block's attention, router and norms plus its 128 / ep experts' (gate, up, down) h x f_e,
    # or the V x h output layer where that is larger (ep 8: 75M expert parameters, 311M in V x h)
    w = Workload(PRESETS["qwen3-30b-a3b"], 4096, 512, framework="torchtitan")
    dense_block = PRESETS["qwen3-30b-a3b"].layer_params()
    for ep, larger in ((1, "block"), (8, "output")):
        mem = estimate(w, 80 * 2**30, plan(sharding="zero3", grad_accum_steps=64, ep=ep))
        block, output = dense_block + 128 // ep * 3 * 2048 * 768, 151936 * 2048
        unit = block if larger == "block" else output
        assert unit == max(block, output)
        # gathered twice in bf16 (this block and the prefetched one) + its bf16 gradient and the
        # fp32 reduce-scatter input
        assert term(mem, "gathered weights") == pytest.approx(unit * (2 * 2 + 2 + 4))


def test_moe_with_tp_needs_sequence_parallelism_as_megatron_says():
    w = Workload(PRESETS["mixtral-8x7b"], 4096, 256, framework="megatron")
    bad = megatron.problems(plan(tp=2, dp=4, ep=4, sequence_parallel=False), w)
    assert "When using expert parallelism and tensor parallelism, sequence parallelism must be used." in bad
    assert not megatron.problems(plan(tp=2, dp=4, ep=4, sequence_parallel=True), w)


def test_deepseek_v3_fits_on_a_shipped_inventory_and_names_its_stage():
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["memory"]["total_bytes"] <= d["memory"]["gpu_usable_bytes"]
    args = d["framework"]["args"]
    assert "--multi-latent-attention" in args and args[args.index("--kv-lora-rank") + 1] == "512"
    # its first 3 layers are dense: the per-layer list says which route
    freq = args[args.index("--moe-layer-freq") + 1]
    assert freq == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    assert d["memory"]["total_bytes"] / GIB < 80


def test_the_oom_ladder_splits_the_experts_further_before_it_moves_the_layout():
    # after a CUDA OOM of Qwen3-30B-A3B on 32 GPUs with each rank holding all 128 experts (ep 1:
    # 29 B routed parameters x 4 B of bf16 weights and gradients per rank, more than 80 GB), with
    # recompute pinned off and the micro-batch at 1: the next plan spreads the experts over more
    # of the same 32 ranks and keeps tp, pp, cp and dp
    from jobctl.planner.ladder import next_plan

    w = Workload(PRESETS["qwen3-30b-a3b"], 4096, 512, framework="megatron", grad_reduce="auto")
    failed = plan(nodes=4, dp=32, global_batch_size=512, grad_accum_steps=16, ep=1)
    step = next_plan(w, h100(), Constraints(recompute="none"), failed)
    assert step is not None and step.rung == "parallelism", step
    assert step.plan.ep > 1 and 128 % step.plan.ep == 0
    assert (step.plan.tp, step.plan.pp, step.plan.cp, step.plan.dp, step.plan.nodes) == (1, 1, 1, 32, 4)
    assert step.memory.total_bytes < estimate(w, 80 * 2**30, failed).total_bytes
    # a pinned ep stays
    pinned = next_plan(w, h100(), Constraints(recompute="none", ep=1), failed)
    assert pinned is None or pinned.plan.ep == 1


def test_mla_keeps_its_latents_and_the_decompressed_key_value_by_hand():
    # DeepSeek-V3 (config.json: q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64,
    # qk_nope_head_dim 128, v_head_dim 128, 128 heads), per token, tp 1 (torchtitan's and
    # Megatron's MLA alike: models/deepseek_v3/model.py Attention.forward): the query latent's
    # norm keeps its 16-bit input and fp32 rstd, the up-projection the normed latent (2·1536 +
    # 4 + 2·1536); the key/value latent is split from a 512 + 64 wide projection whose storage its
    # norm keeps (2·576 + 4), the up-projection the normed 512 (2·512); V is a view of the
    # decompressed [k_nope | v] (128 x (128 + 128) per token), kept whole
    w = Workload(PRESETS["deepseek-v3"], 4096, 512, framework="torchtitan")
    terms = {n: b for n, b, _ in layer_activation_terms(w, plan(sharding="zero3"), 1)}
    T = 4096
    assert terms["mla latents"] == pytest.approx(T * ((2 * 1536 + 4 + 2 * 1536) + (2 * 576 + 4 + 2 * 512)))
    assert terms["q, k, v"] == pytest.approx(T * 2 * (128 * 192 + 128 * 192 + 128 * 256))



@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "fsdp"])
@pytest.mark.parametrize("model", ["llama3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"])
def test_a_layer_names_each_activation_term_once(model, framework):
    # each term is one set of tensors: a name twice would count them twice (or hide a slip)
    w = Workload(PRESETS[model], 4096, 512, framework=framework)
    for kw in ({}, {"tp": 2, "dp": 4, "sequence_parallel": True}):
        names = [n for n, _, _ in layer_activation_terms(w, plan(sharding="zero3", **kw), 1)]
        assert len(names) == len(set(names)), names


def test_hybridep_sends_a_token_once_to_each_other_node_and_fans_it_out_there():
    # DeepEP's HybridEP (docs/Hybrid-EP_Implementation.md §8): a token crosses InfiniBand once to
    # its peer GPU in each other node that holds one of its experts, which writes it over NVLink to
    # the ranks that need it; Megatron's alltoall sends a copy per expert. Qwen3-30B-A3B (128
    # experts, top 8) over EP 16 on two 8-GPU nodes: 64 experts per node, so a token misses the
    # other node with probability C(64, 8) / C(128, 8), and each remote copy of the alltoall, 8 x
    # 8/16 = 4 per token, becomes 1 - that = 0.9969 node crossings.
    import math

    from jobctl.planner import perf

    crossings = 1 - math.comb(64, 8) / math.comb(128, 8)
    assert crossings == pytest.approx(0.99690, abs=1e-5)
    assert perf.hybridep_copies(128, 8, 2, 8) == (pytest.approx(8 * 7 / 8), pytest.approx(crossings))
    assert perf.hybridep_copies(128, 8, 4, 8)[1] == pytest.approx(3 * (1 - math.comb(96, 8) / math.comb(128, 8)))

    qwen, t = PRESETS["qwen3-30b-a3b"], h100()
    apart = megatron.FRAMEWORK.with_caps(ep_overlap=False)
    nccl, hybrid = (Workload(qwen, 4096, 512, framework=apart, moe_dispatcher=d) for d in ("alltoall", "hybridep"))
    across = plan(nodes=2, dp=16, ep=16, grad_accum_steps=32, global_batch_size=512)
    a, h = estimate_step(nccl, across, t.links, 8), estimate_step(hybrid, across, t.links, 8)
    # per layer and micro-batch, four exchanges (dispatch and combine, forward and backward) of the
    # rank's 4096 tokens of 2048 x 2 B, each the slower of its NVLink and network parts plus the
    # network's latency: the network part is the larger in both
    token_b = 2 * 2048 * 4096
    net = t.links.inter_node_gbs * 1e9 * perf.NETWORK_EFFICIENCY
    nvl = t.links.intra_node_gbs * 1e9 * perf.INTRA_NODE_EFFICIENCY
    lat = perf._latency(t.links.inter_node_gbs, t.links)
    for est, over_net, over_nvl in ((a, 8 * 8 / 16, 8 * 7 / 16), (h, crossings, 8 * 7 / 8)):
        one = max(token_b * over_nvl / nvl, token_b * over_net / net) + lat
        assert est.ep_comm_s == pytest.approx(32 * 48 * 4 * one)
    assert a.ep_comm_s / h.ep_comm_s > 3.5
    assert h.compute_s == pytest.approx(a.compute_s)
    # inside one node there is nothing to deduplicate: the same all-to-all
    inside = plan(ep=8)
    assert estimate_step(hybrid, inside, t.links, 8).ep_comm_s == pytest.approx(
        estimate_step(nccl, inside, t.links, 8).ep_comm_s)


def test_hybridep_keeps_its_registered_buffer_and_is_megatrons_only():
    # DeepEP docs/Hybrid-EP_Implementation.md §4.2, per rank: room for every rank of the EP group to
    # send all its tokens (BF16: Megatron-Core dispatches without FP8, fused_a2a.py) with fp32
    # probabilities for the node's experts, and across nodes an RDMA slot per token and remote node.
    # Qwen3-30B-A3B, micro-batch 2 of 4096 tokens, EP 16 over two nodes: 8 experts per rank, 64 per node
    qwen = PRESETS["qwen3-30b-a3b"]
    w = Workload(qwen, 4096, 512, framework="megatron", moe_dispatcher="hybridep")
    p = plan(nodes=2, dp=16, ep=16, micro_batch_size=2, grad_accum_steps=16, global_batch_size=512)
    tokens = 2 * 4096
    by_hand = tokens * 16 * (2048 * 2 + 64 * 4) + tokens * 1 * 2048 * 2 + tokens * 1 * 64 * 4
    mem = estimate(w, 80 * GIB, p)
    assert term(mem, "hybridep buffers") == by_hand
    # --explain says where its sizes come from, and that nothing measured them
    from jobctl.planner.explain import memory_checks

    check = next(c for c in memory_checks(w, p, mem.to_dict()["terms"]) if c["term"] == "hybridep buffers")
    assert check["check"] == "modelled" and "§4.2" in check["by"]
    # on a partition whose NVLink domain spans the nodes (a GB200 NVL72 rack, 72 GPUs), the 16 ranks
    # are one domain: 128 experts over it, no inter-node slots
    rack = replace(w, nvlink_gpus=72)
    p4 = replace(p, nodes=4, gpus_per_node=4)
    assert term(estimate(rack, 186 * GIB, p4), "hybridep buffers") == tokens * 16 * (2048 * 2 + 128 * 4)
    # the plan on the shipped GB200 inventory is told its rack
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "gb200", "train.moe_dispatcher=hybridep",
               "parallelism.ep=16", "parallelism.tp=1", "parallelism.pp=1", "parallelism.cp=1",
               "parallelism.micro_batch_size=2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["plan"]["gpus_per_node"] == 4 and d["plan"]["ep"] == 16
    assert next(t["bytes"] for t in d["memory"]["terms"] if t["name"] == "hybridep buffers") == \
        tokens * 16 * (2048 * 2 + 128 * 4)
    alltoall = Workload(qwen, 4096, 512, framework="megatron")
    assert "hybridep buffers" not in {t.name for t in estimate(alltoall, 80 * GIB, p).terms}
    assert estimate(w, 80 * GIB, p).total_bytes > estimate(alltoall, 80 * GIB, p).total_bytes

    # rendered for Megatron only; a dense model has no tokens to dispatch
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "train.moe_dispatcher=hybridep",
               "framework=torchtitan", "--json")
    assert r.returncode == 3
    assert any("train.moe_dispatcher=hybridep" in x and "megatron only" in x for x in json.loads(r.stdout)["reasons"])
    r = jobctl("plan", "recipes/llama8b.yaml", "--cluster", "h100", "train.moe_dispatcher=hybridep",
               "framework=megatron", "--json")
    assert r.returncode == 3
    assert any("no experts to dispatch to" in x for x in json.loads(r.stdout)["reasons"])
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "train.moe_dispatcher=nccl")
    assert r.returncode == 2 and "moe_dispatcher" in r.stderr and "Traceback" not in r.stderr


def test_a_plan_whose_experts_cross_nodes_says_what_hybridep_would_do():
    # the plan's own layout with HybridEP instead (the step model's estimate of it), said only
    # where the EP group crosses the NVLink domain and the dispatcher is NCCL's
    pins = ["parallelism.ep=16", "parallelism.tp=1", "parallelism.pp=1", "parallelism.dp=16", "parallelism.cp=1",
            "parallelism.micro_batch_size=1"]
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", *pins, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    note = [x for x in d["warnings"] or [] if "train.moe_dispatcher: hybridep" in x]
    assert len(note) == 1 and "1.00 times instead of 4.00" in note[0], d["warnings"]
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", *pins, "train.moe_dispatcher=hybridep",
               "--json")
    h = json.loads(r.stdout)
    assert h["plan"] == d["plan"]
    assert f"would take {duration(h['estimate']['step_time_s'])}" in note[0]
    assert not [x for x in h.get("warnings") or [] if "train.moe_dispatcher: hybridep" in x]
    # the report says which dispatcher the plan is for (a mixture of experts only), and so does its summary
    assert (d["train"]["moe_dispatcher"], h["train"]["moe_dispatcher"]) == ("alltoall", "hybridep")
    text = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", *pins, "train.moe_dispatcher=hybridep")
    assert "HybridEP dispatch" in text.stdout and "HybridEP dispatch" not in jobctl(
        "plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", *pins).stdout
    dense = json.loads(jobctl("plan", "recipes/llama8b.yaml", "--cluster", "h100", "--json").stdout)
    assert "moe_dispatcher" not in dense["train"]
    inside = json.loads(jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "parallelism.ep=8",
                               "--json").stdout)
    assert not [x for x in inside.get("warnings") or [] if "moe_dispatcher" in x]


# DeepSeek-V3's 61 layers: no even split over 4, 8 or 16 stages (61, 62 and 63 are not multiples
# of 4), so Megatron-Bridge writes its layout down (recipes/deepseek/h100/deepseek_v3.py
# _get_deepseek_v3_pipeline_layout): ceil(61/p) layers per rank, the last rank what is left.
def test_a_layer_count_no_even_split_takes_is_laid_out_with_the_last_stage_short():
    from jobctl.planner.memory import front_loaded, stage_layers
    # by hand: 61 = 3 x 16 + 13 = 7 x 8 + 5 = 15 x 4 + 1; 32 stages of 2 would need 62
    assert stage_layers(61, 4) == (16, 16, 13)
    assert stage_layers(61, 8) == (8, 8, 5)
    assert stage_layers(61, 16) == (4, 4, 1)
    assert stage_layers(61, 32) is None
    # virtual stages: each of the p·v takes ceil(61/p)/v, the last what is left (at least one):
    # over 4 ranks, v = 4 leaves 61 - 15 x 4 = 1 on the last; v = 8 would need 31 x 2 = 62
    assert [front_loaded(61, 4, v) is not None for v in (1, 2, 4, 8)] == [True, True, True, False]
    assert front_loaded(61, 4, 4) == (16, 16, 13)  # the last rank: 3 stages of 4 and the 1
    assert front_loaded(61, 8, 4) is None and front_loaded(61, 16, 2) is None
    # an even split where there is one: 62 = 2 x 31 (last one short), 80 = 4 x 20
    assert stage_layers(61, 2) == (31, 31, 30) and stage_layers(80, 4) == (20, 20, 20)


def test_megatron_renders_the_layout_and_refuses_one_that_leaves_the_last_stage_empty():
    w = Workload(PRESETS["deepseek-v3"], 4096, 4096, framework=frameworks.get("megatron"))
    p = plan(nodes=16, tp=1, pp=4, dp=32, ep=32, grad_accum_steps=128, global_batch_size=4096, virtual_stages=2)
    args = [str(a) for a in megatron.render(p, w).args]
    # 8 stages of 8 layers, the last of 5 (7 x 8 + 5) with the MTP module, in Megatron's layout grammar
    # (PipelineParallelLayerLayout.parse_str_to_list: E embedding, t layer, m MTP, L loss, | stage, (..)*n)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*8|(t*8|)*6t*5mL"
    assert megatron.pipeline_layout(61, 4, 1) == "Et*16|(t*16|)*2t*13L"
    assert not megatron.problems(p, w)
    msgs = megatron.problems(replace(p, virtual_stages=8), w)
    assert any("61 layers do not split over pp=4" in m and "virtual stages of 2" in m for m in msgs), msgs


def test_the_search_offers_laid_out_pipelines_to_megatron_only():
    from jobctl.planner.space import offered_pp
    mega, titan = frameworks.get("megatron").caps, frameworks.get("torchtitan").caps
    assert [p for p in (2, 3, 4, 6, 8, 16, 32) if offered_pp(61, p, mega)] == [2, 3, 4, 8, 16]
    assert [p for p in (2, 3, 4, 6, 8, 16, 32) if offered_pp(61, p, titan)] == [2, 3]
    # Llama 3 70B's 80 layers: the even splits only; 6 stages (14 x 5 + 10) only when pinned
    assert not offered_pp(80, 6, mega) and offered_pp(80, 5, mega)
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "parallelism.pp=16", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["framework"]["args"]
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*4|(t*4|)*14t*1mL"
    assert "--num-layers-per-virtual-pipeline-stage" not in args
    # the plan says how the stages hold them: 4 on each, 1 and the MTP module on the last
    assert json.loads(r.stdout)["memory"]["stage_layers"] == {"first": 4, "middle": 4, "last": 1, "mtp_on_last": 1}
    shown = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "parallelism.pp=16")
    assert "pp 16 (layers 4/4/1 + MTP)" in " ".join(shown.stdout.split()), shown.stdout[:400]
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "parallelism.pp=32", "--json")
    assert r.returncode == 3
    assert any("pp=32 cannot split 61 layers" in x and "31 x 2 >= 61" in x for x in json.loads(r.stdout)["reasons"])


def test_deepep_keeps_its_fixed_queues_and_sends_across_8_gpu_nodes_as_hybridep_does():
    from jobctl.frameworks.megatron import deepep_problems
    from jobctl.planner.memory.breakdown import _deepep_buffer

    # DeepEP's csrc/legacy/config.hpp size hints for its recommended configs (deep_ep/buffers/legacy.py):
    # EP 16 = 2 nodes of 8 NVLink peers, 20 SMs = 10 channels, BF16 tokens of h = 2048 (4096 B), each
    # queued token with 8 B of source metadata, 128 int64 top-k ids, 128 fp32 weights and scales.
    # NVLink: dispatch and combine both queue 288 tokens per channel and peer, plus 2·2 + 3 counters;
    # RDMA: dispatch's 128 receive slots aligned to its 20-token sends (140, combine's 132), x 2.
    per_token = 8 + 128 * 8 + 128 * 4 + 128 * 4
    nvl = 10 * 8 * (2 * 2 + 3) * 4 + 10 * 8 * 288 * (4096 + per_token)
    rdma = 10 * 2 * (8 * 2 + 2) * 2 * 4 + 10 * 2 * 140 * 2 * (4096 + per_token + 16)
    assert _deepep_buffer(2048, 16)[0] == -(-nvl // 128) * 128 + -(-rdma // 128) * 128
    # inside one node: no RDMA queues; counters for max(8 // 8, 1) = 1 RDMA rank, 2 + 3
    assert _deepep_buffer(2048, 8)[0] == -(-(10 * 8 * (2 * 1 + 3) * 4 + 10 * 8 * 256 * (4096 + per_token)) // 128) * 128
    qwen, t = PRESETS["qwen3-30b-a3b"], h100()
    p = plan(nodes=2, dp=16, ep=16, grad_accum_steps=32, global_batch_size=512)
    deep = Workload(qwen, 4096, 512, framework="megatron", moe_dispatcher="deepep")
    assert term(estimate(deep, 80 * GIB, p), "deepep buffers") == _deepep_buffer(2048, 16)[0]
    # across two 8-GPU nodes DeepEP's normal kernels send a token once to its peer in the other
    # node and forward it there over NVLink, as HybridEP does: the same all-to-all time, less than NCCL's
    hyb, nccl = (replace(deep, moe_dispatcher=d) for d in ("hybridep", "alltoall"))
    d, h, a = (estimate_step(x, p, t.links, 8).ep_comm_s for x in (deep, hyb, nccl))
    assert d == h < a
    # EP sizes DeepEP has a config for; across nodes only with 8 NVLink peers per node
    assert deepep_problems(16, 8) == [] and deepep_problems(4, 4) == []
    assert "get_dispatch_config" in deepep_problems(12, 8)[0]
    assert "8 NVLink peers" in deepep_problems(16, 4)[0] and "hybridep" in deepep_problems(16, 4)[0]
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "gb200", "train.moe_dispatcher=deepep",
               "parallelism.ep=16", "--json")
    assert r.returncode == 3 and any("8 NVLink peers" in x for x in json.loads(r.stdout)["reasons"])
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "train.moe_dispatcher=deepep",
               "framework=torchtitan", "--json")
    assert r.returncode == 3
    assert any("DeepEP's normal kernels" in x and "megatron only" in x for x in json.loads(r.stdout)["reasons"])


def test_deepseek_v3s_mtp_module_rides_on_the_last_stage_under_megatron_only():
    # DeepSeek-V3 trains one multi-token-prediction module (its config.json: num_nextn_predict_layers
    # 1); Megatron-Core builds it on the last stage (multi_token_prediction.py): one more transformer
    # layer, the norms of the next tokens' embedding and of the decoder output and a final one
    # (3·h), their 2h -> h projection split by TP, and, pipelined, a copy of the word embedding
    # (gpt_model.py: the embedding is built where pre_process or mtp_process)
    from jobctl.frameworks import ep_overlap
    from jobctl.planner.memory import estimate_stage

    m = PRESETS["deepseek-v3"]
    with_mtp = Workload(m, 4096, 4096, framework="megatron")
    without = Workload(replace(m, mtp_layers=0), 4096, 4096, framework="megatron")
    assert (with_mtp.mtp_layers, Workload(m, 4096, 4096, framework="torchtitan").mtp_layers) == (1, 0)
    p = plan(nodes=16, tp=8, pp=4, dp=4, ep=32, grad_accum_steps=1024, global_batch_size=4096, virtual_stages=2,
             sequence_parallel=True)
    h, vocab = 7168, 130048  # 129,280 padded to a multiple of 128 x tp 8
    dense = m.layer_params() / 8 + 3 * h + 2 * h * h / 8 + vocab * h / 8  # one more layer's TP share and the rest
    last = [estimate_stage(x, 80 * GIB, p, "last") for x in (with_mtp, without)]
    assert term(last[0], "weights") - term(last[1], "weights") == pytest.approx(2 * dense)
    # its routed experts: one more layer's, over ep 32
    assert term(last[0], "expert weights") - term(last[1], "expert weights") == \
        pytest.approx(2 * m.routed_params_per_layer / 32)
    # its logits and loss beside the main ones: as large
    assert term(last[0], "mtp logits and loss") == term(last[0], "logits and loss")
    # the first stage does not change; over 4 stages the last holds 13 layers and the module, fewer
    # than the 16 of the others, as Megatron-Bridge's DeepSeek-V3 layout intends: the step is the same
    t = h100()
    assert estimate_stage(with_mtp, 80 * GIB, p, "first").total_bytes == \
        estimate_stage(without, 80 * GIB, p, "first").total_bytes
    assert estimate_step(with_mtp, p, t.links, 8).step_time_s == estimate_step(without, p, t.links, 8).step_time_s
    # unpipelined, the module runs after all 61 layers: one layer and the output layer more (both
    # without the combined schedule, which Megatron refuses there with MTP, below)
    one = plan(nodes=32, tp=8, pp=1, dp=32, ep=64, grad_accum_steps=128, global_batch_size=4096)
    a, b = (estimate_step(replace(x, ep_overlap=False), one, t.links, 8).step_time_s for x in (with_mtp, without))
    assert 1 + 1 / 61 < a / b < 1 + 3 / 61
    # Megatron-Core's combined 1F1B schedule takes one MTP module and only pipelined
    # (transformer_config.py: 'Pipeline model parallel size must be larger than 1 when enabling
    # overlap_moe_expert_parallel_comm with MTP layer')
    assert not ep_overlap(with_mtp, one) and ep_overlap(without, one)
    args = [str(x) for x in megatron.render(p, with_mtp).args]
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*8|(t*8|)*6t*5mL"
    # torchtitan's DeepSeek-V3 config builds none: the plan says it trains the main model only
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "framework=torchtitan", "--json")
    assert r.returncode == 0, r.stderr
    assert any("multi-token-prediction" in x and "main model only" in x for x in json.loads(r.stdout)["warnings"])


def test_megatrons_selective_recompute_names_mlas_up_projection_and_the_experts_swiglu():
    # megatron-core's --recompute-modules (transformer_config.py recompute_modules). DeepSeek-V3,
    # BF16, tp 1, one 4096-token micro-batch, by hand from its config (128 heads, q/k 128 + 64
    # wide, v 128; 8 of 256 experts of 2048; 58 of 61 layers route):
    m = PRESETS["deepseek-v3"]
    w = Workload(m, 4096, 4096, framework="megatron")
    assert frameworks.recompute_modules(w) == ("mla_up_proj", "moe_act")
    none, sel = ({n: b for n, b, _ in layer_activation_terms(w, plan(recompute=r), 1)} for r in ("none", "selective"))
    s, a, share = 4096, 128, 58 / 61
    # mla_up_proj: the decompressed q and k (192 wide) and the kept [k_nope | v] (256) go
    # (multi_latent_attention.py qkv_up_checkpoint frees them after attention's forward)
    assert none["q, k, v"] == pytest.approx(2 * s * a * (192 + 192 + 256)) and sel["q, k, v"] == 0
    # moe_act: each routed copy's weighted SwiGLU product (fc2's 16-bit input, 2·f_e) goes, fc1's
    # gate and up outputs (2 · 2·f_e) stay (experts.py: CheckpointWithoutOutput around the activation)
    assert none["expert intermediates"] - sel["expert intermediates"] == pytest.approx(share * 8 * s * 2 * 2048)
    assert sel["shared expert intermediates"] == none["shared expert intermediates"]
    # the attention core is not recomputed (flash attention keeps no scores), and the step pays
    # only the up-projections again and the SwiGLU: a few percent
    t = h100()
    p = plan(nodes=16, tp=8, pp=4, dp=4, ep=32, grad_accum_steps=1024, global_batch_size=4096, virtual_stages=2,
             sequence_parallel=True)
    base, again = (estimate_step(w, replace(p, recompute=r), t.links, 8).step_time_s for r in ("none", "selective"))
    assert base < again < 1.05 * base
    # under FP8 fc2 keeps its quantised input anyway: the experts' SwiGLU is not picked; a dense
    # model keeps Megatron's default, the attention core
    assert frameworks.recompute_modules(replace(w, precision="fp8")) == ("mla_up_proj",)
    assert frameworks.recompute_modules(Workload(PRESETS["llama3.1-8b"], 4096, 256, framework="megatron")) == \
        ("core_attn",)
    assert frameworks.recompute_modules(Workload(m, 4096, 4096, framework="torchtitan")) == ()
    # a recipe names them; refused where they cannot apply
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "parallelism.recompute=selective",
               "train.recompute_modules=[mla_up_proj]", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["framework"]["args"]
    i = args.index("--recompute-modules")
    assert args[i + 1] == "mla_up_proj" and args[i + 2].startswith("--")  # that one module only
    # the plan says what its selective recomputes, in --json and in words
    assert json.loads(r.stdout)["train"]["recompute_modules"] == ["mla_up_proj"]
    r = jobctl("plan", "recipes/deepseek-v3.yaml", "--cluster", "h100", "parallelism.recompute=selective",
               "train.recompute_modules=[mla_up_proj]")
    assert "recompute selective (mla_up_proj)" in r.stdout, r.stdout[:600]
    for extra, message in ((["recipes/llama8b.yaml", "framework=megatron", "train.recompute_modules=[mla_up_proj]"],
                            "does not have"),
                           (["recipes/deepseek-v3.yaml", "framework=torchtitan", "train.recompute_modules=[moe_act]"],
                            "megatron only"),
                           (["recipes/qwen3-30b-a3b.yaml", "train.precision=fp8", "train.fp8_recipe=delayed",
                             "train.recompute_modules=[moe_act]"], "Delayed scaling does not support moe_act")):
        r = jobctl("plan", extra[0], "--cluster", "h100", *extra[1:], "--json")
        assert r.returncode == 3, (extra, r.stdout[-500:])
        assert any(message in x for x in json.loads(r.stdout)["reasons"]), (extra, r.stdout[-500:])


def test_the_search_offers_the_named_modules_where_they_free_memory():
    # Megatron-Bridge's DeepSeek-V3 runs on 256 GB200s (performance summary 25.11-26.08: TP1 PP4
    # VP4 EP64, micro-batch 1, MXFP8) recompute `mla_up_proj` only (its perf recipe's
    # recompute_modules). With that layout pinned and the recompute left to the search, the search
    # must try it: no recompute fits only with the optimizer on the host, and full recompute reruns
    # every layer.
    from jobctl.planning import load_recipe, plan_on
    pinned = ["train.precision=mxfp8", "parallelism.tp=1", "parallelism.pp=4", "parallelism.virtual_stages=4",
              "parallelism.ep=64", "parallelism.cp=1", "parallelism.micro_batch_size=1"]
    inv = load_inventory("gb200", ["partitions.0.nodes=64"])
    got = {}
    for extra in ([], ["parallelism.recompute=none"], ["parallelism.recompute=full"]):
        d = plan_on(load_recipe("recipes/deepseek-v3.yaml", pinned + extra), inv, alternatives=0, summary=False,
                    learn=False).to_dict()
        got[extra[0] if extra else "search"] = d
    # without recompute it fits only with the optimizer offloaded to the host
    assert got["parallelism.recompute=none"]["plan"]["offload"] != "none"
    chosen = got["search"]
    assert chosen["feasible"] and chosen["plan"]["recompute"] == "selective"
    args = chosen["framework"]["args"]
    assert args[args.index("--recompute-modules") + 1] == "mla_up_proj"  # FP8-family: no moe_act
    for other in ("parallelism.recompute=none", "parallelism.recompute=full"):
        assert chosen["estimate"]["tokens_per_s"] > got[other]["estimate"]["tokens_per_s"], other
    # a dense model under flash attention gets no selective step: Megatron's default module, the
    # attention core, would only save the a·s² scores flash attention never keeps
    from jobctl.planner.space import Constraints as SpaceConstraints, knob_options
    dense = Workload(PRESETS["llama3.1-8b"], 4096, 256, framework="megatron")
    deep = Workload(PRESETS["deepseek-v3"], 4096, 4096, framework="megatron")
    assert not any(k[1] == "selective" for k in knob_options(dense, SpaceConstraints(), 8, 1, 8, 1))
    assert any(k[1] == "selective" for k in knob_options(deep, SpaceConstraints(), 8, 1, 8, 1))


def test_megatrons_mlp_and_shared_experts_modules():
    # megatron-core 0.16 transformer_layer.py: "mlp" checkpoints a dense layer's MLP whole (its
    # RMSNorm fused into fc1 with Transformer Engine: TELayerNormColumnParallelLinear), keeping
    # only the residual stream's tensor the norm reads; MoE layers are skipped. shared_experts.py:
    # "shared_experts" checkpoints the shared MLP. By hand, BF16, tp 1, one 4096-token micro-batch.
    s = 4096
    llama = PRESETS["llama3.1-8b"]
    w = Workload(llama, s, 256, framework="megatron", recompute_modules=("mlp",))
    kept = {n: b for n, b, _ in layer_activation_terms(replace(w, recompute_modules=()), plan(), 1)}
    rebuilt = {n: b for n, b, _ in layer_activation_terms(w, plan(recompute="selective"), 1)}
    h, f = llama.hidden, llama.ffn_hidden
    assert kept["mlp input"] == pytest.approx(2 * s * h) and rebuilt["mlp input"] == 0
    # TE's LayerNormMLP keeps fc1's gate and up and the SwiGLU output: 3 · 2·sf
    assert kept["mlp intermediates"] == pytest.approx(3 * 2 * s * f) and rebuilt["mlp intermediates"] == 0
    # DeepSeek-V3: 3 dense layers of 61 (18,432 wide), one shared expert of 2048 on the 58 others
    m = PRESETS["deepseek-v3"]
    w = Workload(m, s, 4096, framework="megatron", precision="fp8")  # auto: mla_up_proj only
    named = replace(w, recompute_modules=("mla_up_proj", "mlp", "shared_experts"))
    auto, both = ({n: b for n, b, _ in layer_activation_terms(x, plan(recompute="selective"), 1)} for x in (w, named))
    assert auto["dense mlp intermediates"] > 0 and both["dense mlp intermediates"] == 0
    assert auto["shared expert intermediates"] > 0 and both["shared expert intermediates"] == 0
    # the mlp input goes on the dense layers only: the MoE layers' router and experts read theirs
    assert both["mlp input"] == pytest.approx(auto["mlp input"] * 58 / 61)
    # the step pays the dense MLPs' and the shared experts' forward again: a little slower, far
    # from full recompute
    t = h100()
    p = plan(nodes=16, tp=8, pp=4, dp=4, ep=32, grad_accum_steps=1024, global_batch_size=4096, virtual_stages=2,
             sequence_parallel=True)
    lw = Workload(llama, s, 4096, framework="megatron")
    none, mlp, full = (estimate_step(x, replace(p, ep=1, recompute=r), t.links, 8).step_time_s
                       for x, r in ((lw, "none"), (replace(lw, recompute_modules=("mlp",)), "selective"),
                                    (lw, "full")))
    assert none < mlp < full
    # refused where nothing would be recomputed: every Qwen3 layer routes; Llama has no shared expert
    for recipe, modules, message in (("recipes/qwen3-30b-a3b.yaml", "[mlp]", "every layer of"),
                                     ("recipes/llama70b.yaml", "[shared_experts]", "does not have")):
        r = jobctl("plan", recipe, "--cluster", "h100", "parallelism.recompute=selective",
                   f"train.recompute_modules={modules}", "--json")
        assert r.returncode == 3, r.stdout[-500:]
        assert any(message in x for x in json.loads(r.stdout)["reasons"]), r.stdout[-500:]


def test_gpt_oss_plans_under_megatron_with_its_windows_and_sinks():
    # gpt-oss-120b (its config: sliding_window 128 on alternate layers, sinks, biases): planned for
    # Megatron, which renders them (the flags are checked by megatron-core in
    # test_framework_configs.py); refused where the framework would build another model
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "model=gpt-oss-120b", "--json")
    assert r.returncode == 0, r.stdout[-800:]
    args = json.loads(r.stdout)["framework"]["args"]
    for flag, value in (("--softmax-type", "learnable"), ("--window-size", "127,0"), ("--window-attn-skip-freq", "2"),
                        ("--attention-backend", "auto")):
        assert str(args[args.index(flag) + 1]) == value, flag
    assert "--add-qkv-bias" in args and "--disable-bias-linear" not in args and "--quick-geglu" in args
    r = jobctl("plan", "recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "model=gpt-oss-120b", "framework=torchtitan",
               "--json")
    assert r.returncode == 3 and any("renders for megatron only" in x for x in json.loads(r.stdout)["reasons"])
    # a query attends to at most 128 keys on the windowed half of the layers: by hand at 4096
    # tokens, half the layers causal (s/2 keys on average), half sum_i min(i+1, 128) = 128·4096 - 128²/2
    from jobctl.planner.perf import attention_share
    m = PRESETS["gpt-oss-120b"]
    windowed = (128 * 4096 - 128 * 128 / 2) / (4096 * 4096 / 2)
    assert attention_share(m, 4096) == pytest.approx(0.5 + 0.5 * windowed)
    assert attention_share(PRESETS["qwen3-30b-a3b"], 4096) == 1.0 and attention_share(m, 128) == 1.0
