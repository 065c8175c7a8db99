"""The memory model against published numbers and hand derivations (docs/memory-model.md)."""

import pytest

from jobctl.planner.memory import (
    GIB,
    Overheads,
    Workload,
    estimate,
    estimate_stage,
    layer_activation_bytes,
    model_state_terms,
    optimizer_state_elements,
    stage_layers,
    state_bytes,
    stored_layer_bytes,
)
from jobctl.planner.models import PRESETS, ModelSpec
from jobctl.planner.plan import Plan


def plan(**kw):
    base = dict(nodes=1, gpus_per_node=1, tp=1, pp=1, dp=1, cp=1, sharding="none", micro_batch_size=1,
                grad_accum_steps=1, global_batch_size=1, recompute="none", offload="none", sequence_parallel=False)
    base.update(kw)
    return Plan(**base)


# --- ZeRO paper (Rajbhandari et al. 2020), Figure 1: Psi = 7.5B, N_d = 64, K = 12 -------------
ZERO_PAPER_GB = {"none": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}  # decimal GB


@pytest.mark.parametrize("sharding,expected_gb", sorted(ZERO_PAPER_GB.items()))
def test_zero_paper_worked_example(sharding, expected_gb):
    n_params = 7.5e9
    sb = state_bytes("generic", "bf16-mixed", "adamw")  # 2 + 2 + K(=12)
    terms = model_state_terms(n_params, optimizer_state_elements("adamw", [(n_params, 1, 1)]), sb, "adamw",
                              sharding, 64, "none", 2)
    total = sum(t.bytes for t in terms if t.group in ("weights", "grads", "optimizer"))
    assert total / 1e9 == pytest.approx(expected_gb, abs=0.05)


def test_zero_paper_example_through_the_cli(capsys):
    import json

    from jobctl.cli import main

    for stage, gb in zip(range(4), (120.0, 31.4, 16.6, 1.9)):
        rc = main(["memory", "--params", "7.5e9", "--num-gpus", "64", "--zero-stage", str(stage), "--json"])
        mem = json.loads(capsys.readouterr().out)["memory"]
        states = mem["weights_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]
        assert states / 1e9 == pytest.approx(gb, abs=0.05)
        assert rc == (0 if stage else 3)  # 120 GB does not fit an 80 GB card


def test_megatron_distributed_optimizer_bytes_per_param():
    # docs/memory-model.md §2: Megatron's distributed optimizer is 6 + 12/N_d bytes per parameter.
    for nd in (1, 8, 64):
        sb = state_bytes("megatron", "bf16-mixed", "adamw")
        terms = model_state_terms(1e9, 2e9, sb, "adamw", "zero1" if nd > 1 else "none", nd, "none", 2)
        per = sum(t.bytes for t in terms if t.group != "host") / 1e9
        assert per == pytest.approx(6 + 12 / nd)


@pytest.mark.parametrize("precision,framework,expected", [
    ("bf16-mixed", "generic", 16), ("bf16-mixed", "deepspeed", 16), ("bf16-mixed", "megatron", 18),
    ("bf16-mixed", "torchtitan", 16), ("fp32", "generic", 16), ("bf16-pure", "generic", 8),
])
def test_model_state_bytes_per_param_table(precision, framework, expected):
    # docs/memory-model.md §2 table: totals per parameter with AdamW.
    sb = state_bytes(framework, precision, "adamw")
    assert sb.weight + sb.grad + sb.master + 2 * sb.state_elem == expected


@pytest.mark.parametrize("optimizer,states", [("sgd", 0), ("sgd-momentum", 1), ("lion", 1), ("adamw", 2)])
def test_optimizer_state_counts(optimizer, states):
    assert optimizer_state_elements(optimizer, [(1000, 10, 3)]) == states * 30000


def test_adafactor_factored_second_moment():
    # Shazeer & Stern 2018: rows + cols per matrix, full for vectors; here 3 x (4096x4096) + 2 x 4096 vectors.
    assert optimizer_state_elements("adafactor", [(4096, 4096, 3), (4096, 1, 2)]) == 3 * 8192 + 2 * 4096


def test_adam8bit_is_two_bytes_plus_block_scales():
    sb = state_bytes("generic", "bf16-pure", "adam8bit")
    terms = model_state_terms(2048e3, 2 * 2048e3, sb, "adam8bit", "none", 1, "none", 2)
    opt = next(t.bytes for t in terms if t.name == "optimizer states")
    assert opt == 2 * 2048e3 + 2 * 1000 * 4  # two 1-byte states + one fp32 absmax per 2048 block each


# --- Korthikanti et al. 2022: activations of a GPT layer -----------------------------------------
GPT3 = PRESETS["gpt3-175b"]  # a = 96, h = 12288, dropout


def gpt_work(attention="eager", **kw):
    return Workload(GPT3, seq_len=2048, global_batch_size=8, attention=attention, framework="megatron", **kw)


def korthikanti(s, b, h, a, t=1, sp=False, selective=False):
    """Section 4 of the paper: sbh(10 + 24/t + 5as/(ht)), SP divides the 10 by t,
    selective recomputation drops the 5as/(ht) term."""
    ten = 10 / t if sp else 10
    core = 0 if selective else 5 * a * s / (h * t)
    return s * b * h * (ten + 24 / t + core)


def layernorm_stats(s, b, t=1, sp=False):
    # Not in the paper's count: each LayerNorm keeps fp32 mean and rstd, 8 bytes per token.
    return 2 * 8 * s * b / (t if sp else 1)


@pytest.mark.parametrize("t,sp,selective", [(1, False, False), (8, False, False), (8, True, False),
                                            (8, True, True), (4, False, True)])
def test_gpt_layer_activations_match_korthikanti(t, sp, selective):
    s, b, h, a = 2048, 1, 12288, 96
    w = gpt_work()
    p = plan(tp=t, sequence_parallel=sp, recompute="selective" if selective else "none")
    got = layer_activation_bytes(w, p, b)
    assert got == pytest.approx(korthikanti(s, b, h, a, t, sp, selective) + layernorm_stats(s, b, t, sp))


def test_gpt_layer_total_34_plus_5as_over_h():
    # The headline formula: sbh(34 + 5as/h) without parallelism.
    s, b, h, a = 2048, 2, 12288, 96
    got = layer_activation_bytes(gpt_work(), plan(micro_batch_size=b), b)
    assert got - layernorm_stats(s, b) == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_full_recompute_keeps_2sbh_per_layer():
    s, b, h = 2048, 1, 12288
    w = gpt_work()
    assert stored_layer_bytes(w, plan(recompute="full"), b) == 2 * s * b * h
    assert stored_layer_bytes(w, plan(recompute="full", tp=8, sequence_parallel=True), b) == 2 * s * b * h / 8


def test_flash_attention_removes_the_s_squared_term():
    s, b, h, a = 2048, 1, 12288, 96
    eager = layer_activation_bytes(gpt_work("eager"), plan(), b)
    flash = layer_activation_bytes(gpt_work("flash"), plan(), b)
    # Flash keeps an fp32 log-sum-exp per head and token (4·asb) instead of 5·as²b.
    assert eager - flash == pytest.approx(5 * a * s * s * b - 4 * a * s * b)


def test_context_parallel_divides_the_sequence():
    w = Workload(PRESETS["llama3.1-8b"], 8192, 8, framework="megatron")
    one = layer_activation_bytes(w, plan(), 1)
    four = layer_activation_bytes(w, plan(cp=4), 1)
    assert four == pytest.approx(one / 4)


def test_pipeline_first_stage_holds_p_microbatches():
    # 1F1B: the first stage keeps min(m, p) micro-batches of L/p layers.
    m = PRESETS["llama3.1-70b"]
    w = Workload(m, 4096, 64, framework="megatron")
    per_layer = stored_layer_bytes(w, plan(pp=4, recompute="full"), 1)
    p4 = plan(pp=4, nodes=1, gpus_per_node=4, grad_accum_steps=64, global_batch_size=64, recompute="full")
    first = estimate_stage(w, 80 * GIB, p4, "first", None)
    acts = next(t.bytes for t in first.terms if t.name == "layer activations")
    assert acts == pytest.approx(per_layer * 20 * 4)
    last = estimate_stage(w, 80 * GIB, p4, "last", None)
    assert next(t.bytes for t in last.terms if t.name == "layer activations") == pytest.approx(per_layer * 20)
    assert estimate(w, 80 * GIB, p4).total_bytes == max(first.total_bytes, last.total_bytes)
    # few micro-batches: only m are in flight
    p2 = plan(pp=4, nodes=1, gpus_per_node=4, grad_accum_steps=2, global_batch_size=2, recompute="full")
    w2 = Workload(m, 4096, 2, framework="megatron")
    first = estimate_stage(w2, 80 * GIB, p2, "first", None)
    acts2 = next(t.bytes for t in first.terms if t.name == "layer activations")
    assert acts2 == pytest.approx(per_layer * 20 * 2)


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp", "torchtitan", "custom"])
def test_most_loaded_stage_is_the_max_over_every_stage(framework):
    # estimate() may skip the middle stage where the first bounds it; the oracle here is every
    # stage's own breakdown (estimate_stage), over pipelines whose middle stage has fewer, as
    # many or more layers than the first (126 layers on 16 stages: 7, 8, 7; 80 on 4: 20 each)
    cases = [("llama3.1-405b", 16, 8, 8), ("llama3.1-405b", 8, 8, 1), ("llama3.1-70b", 4, 8, 2),
             ("llama3.1-70b", 3, 8, 1), ("llama3.1-8b", 6, 1, 1), ("llama3.1-8b", 5, 2, 1)]
    for model, pp, tp, v in cases:
        w = Workload(PRESETS[model], 8192, 128, framework=framework)
        for sharding in ("zero1", "zero3"):
            for recompute in ("none", "full"):
                p = plan(tp=tp, pp=pp, dp=2, nodes=max(1, tp * pp * 2 // 8), gpus_per_node=min(8, tp * pp * 2),
                         sharding=sharding, micro_batch_size=1, grad_accum_steps=64, global_batch_size=128,
                         recompute=recompute, sequence_parallel=tp > 1, virtual_stages=v)
                if stage_layers(w.model.layers, pp, w.caps.pp_split_counts_ends) is None:
                    continue
                every = [estimate_stage(w, 80 * GIB, p, st).total_bytes for st in ("first", "middle", "last")]
                assert estimate(w, 80 * GIB, p).total_bytes == max(every), (model, pp, tp, v, sharding, recompute)


def test_logits_are_large_for_llama3_vocabulary():
    # docs/memory-model.md §3: s·b·V at V = 128256, s = 8192 is several GiB per micro-batch.
    w = Workload(PRESETS["llama3.1-8b"], 8192, 1)
    mem = estimate(w, 80 * GIB, plan())
    logits = next(t.bytes for t in mem.terms if t.name == "logits and loss")
    # 16-bit logits (2) + fp32 log-probs (4) + fp32 gradient in and out (4 + 4) = 14 B per element
    assert logits == 8192 * 128256 * 14
    assert logits / GIB > 10


def test_megatron_losses_by_hand():
    # Megatron's losses at s = 8192, V = 128256, tp 1 (one micro-batch's logits on the last rank):
    # the default vocab-parallel loss upcasts the 16-bit logits once and works on that fp32 copy in
    # place (2 + 4 B); Megatron-Core's own fused loss, compiled, holds 10 B (measured); Transformer
    # Engine's kernel saves the 16-bit logits themselves and overwrites them with their gradient
    # (transformer_engine/pytorch/cross_entropy.py CrossEntropyFunction: save_for_backward(_input);
    # triton/cross_entropy.py cross_entropy_backward_kernel stores into X_ptr): 2 B
    elems = 8192 * 128256
    def logits(fused):
        w = Workload(PRESETS["llama3.1-8b"], 8192, 1, framework="megatron", fused_cross_entropy=fused)
        return next(t.bytes for t in estimate(w, 80 * GIB, plan()).terms if t.name == "logits and loss")
    assert logits(False) == elems * (2 + 4)
    assert logits(True) == elems * 10
    assert logits("te") == elems * 2


def test_te_cross_entropy_is_planned_for_megatron_and_refused_elsewhere():
    import json
    from jobctl_run import jobctl
    r = jobctl("plan", "recipes/llama8b.yaml", "--cluster", "h100", "framework=megatron",
               "train.fused_cross_entropy=te", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["framework"]["args"]
    assert args[args.index("--cross-entropy-fusion-impl") - 1:][:3] == [
        "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    r = jobctl("plan", "recipes/llama8b.yaml", "--cluster", "h100", "framework=torchtitan",
               "train.fused_cross_entropy=te", "--json")
    assert r.returncode == 3
    assert any("fused_cross_entropy=te" in x and "megatron only" in x for x in json.loads(r.stdout)["reasons"])


def test_breakdown_total_is_the_sum_of_its_parts():
    w = Workload(PRESETS["llama3.1-70b"], 8192, 64, framework="megatron")
    mem = estimate(w, 80 * GIB, plan(tp=8, pp=4, dp=2, nodes=8, gpus_per_node=8, sharding="zero1",
                                     grad_accum_steps=32, global_batch_size=64, sequence_parallel=True))
    parts = (mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes + mem.activations_bytes
             + mem.logits_bytes + mem.buffers_bytes + mem.overhead_bytes)
    assert abs(mem.total_bytes - parts) <= 7  # integer rounding of each group
    assert mem.total_bytes == pytest.approx(sum(t.bytes for t in mem.terms))


def test_overheads_are_named_and_configurable():
    w = Workload(PRESETS["llama3.2-1b"], 2048, 8, overheads=Overheads(cuda_context_gib=2.0, safety_margin_gib=3.0))
    mem = estimate(w, 24 * GIB, plan())
    assert next(t.bytes for t in mem.terms if t.name == "cuda context") == 2 * GIB
    assert mem.gpu_usable_bytes == 21 * GIB


def test_offload_moves_states_to_host_ram():
    # ZeRO-Offload: fp32 master (4) + Adam m, v (8) + fp32 grads (4) = 16 B/param in host RAM.
    m = PRESETS["llama2-7b"]
    w = Workload(m, 2048, 1, framework="deepspeed")
    mem = estimate(w, 24 * GIB, plan(offload="optimizer", recompute="full"), host_mem_bytes=256 * GIB)
    per_process = Overheads().host_per_process_gib * GIB
    assert mem.host_bytes_per_node == pytest.approx(16 * m.params() + per_process, rel=1e-9)
    assert mem.optimizer_bytes == 0


def test_torchtitan_pipeline_split_is_torchtitans_own():
    # the oracle is torchtitan's own split (distributed/pipeline_parallel.py): module names per
    # stage, with the embedding on the first and the norm + output layer on the last
    from jobctl_run import need_package
    need_package("torchtitan")
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
    )

    for layers in (4, 16, 32, 80, 126):
        for pp in (2, 3, 4, 8, 16):
            if pp > layers // 2:
                continue
            names = _generate_llm_fqn_per_model_part(pp, layers)
            blocks = [sum(n.startswith("layers.") for n in stage) for stage in names]
            assert stage_layers(layers, pp, counts_ends=True) == (blocks[0], blocks[1], blocks[-1]), (layers, pp)
