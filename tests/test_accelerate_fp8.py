"""accelerate's FP8 as jobctl plans it (issue 29): precision fp8 under framework fsdp is
accelerate 1.15.0's torchao backend (ACCELERATE_MIXED_PRECISION=fp8, ACCELERATE_FP8_BACKEND=AO).

Expectations from outside jobctl, read in accelerate's and torchao's code:
- AORecipeKwargs builds torchao's Float8LinearConfig with dynamic tensor-wise scaling and, under
  FSDP2, FP8 all-gather of the weights (utils/dataclasses.py); prepare() converts every nn.Linear
  but the model's first and last (utils/ao.py convert_model_to_fp8_ao): for a Llama, every
  decoder layer's seven projections except the first layer's q_proj, and not lm_head.
- torchao's WeightWithDynamicFloat8CastTensor casts the weight shard to FP8 before FSDP2's
  all-gather (float8/fsdp_utils.py fsdp_pre_all_gather): a layer gathers in one byte per weight.
- Float8Linear saves the 16-bit input and weight and keeps no FP8 weight between GEMMs
  (float8/float8_linear.py): no weight copies, as in BF16.
- accelerate refuses torchao with FSDP2's cpu_ram_efficient_loading (accelerator.py), so each
  rank loads the whole model on the host, upcast to fp32 before fully_shard (utils/fsdp_utils.py).
The framework's own acceptance of what jobctl renders is tests/test_framework_configs.py."""

from jobctl.planner import inputs
from jobctl.planner.memory import estimate
from jobctl.planner.plan import Plan
from jobctl.planning import load_inventory, load_recipe, plan_on

# Llama 3.1 405B (Meta's config.json): hidden 16384, intermediate 53248, 126 layers, 128 heads of
# 128, 8 KV heads, vocabulary 128256, untied embeddings
H, F, LAYERS, HEADS, KV, HD, V = 16384, 53248, 126, 128, 8, 128, 128256
Q = H * HEADS * HD  # the first layer's q_proj, which accelerate keeps 16-bit
LAYER = 2 * Q + 2 * H * KV * HD + 3 * H * F + 2 * H  # q, o; k, v; gate, up, down; two RMSNorms
PARAMS = LAYERS * LAYER + 2 * V * H + H  # + embedding, output layer, final norm


def _estimate(precision, sharding="zero3", recipe="llama405b", dp=64, cluster="h100"):
    inv = load_inventory(cluster, []).value
    part = inv.partitions[0]
    rec = load_recipe(f"recipes/{recipe}.yaml", ["framework=fsdp", f"train.precision={precision}"]).value
    w = inputs.workload(rec, inv)
    t = inputs.target(inv, part, w.precision, w.fp8_recipe, w.caps.fp8_backend)
    gbs = rec.train.global_batch_size
    plan = Plan(nodes=dp // 8, gpus_per_node=8, tp=1, pp=1, dp=dp, cp=1, sharding=sharding, micro_batch_size=1,
                grad_accum_steps=gbs // dp, global_batch_size=gbs, recompute="full", offload="none",
                sequence_parallel=False)
    return w, t, estimate(w, t.gpu_memory_bytes, plan, t.host_mem_bytes)


def _terms(m):
    return {t.name: t.bytes for t in m.terms}


def test_the_405b_dimensions_are_metas():
    w, _, _ = _estimate("fp8")
    assert (w.model.hidden, w.model.vocab, w.model.layer_params(), w.model.params()) == (H, V, LAYER, PARAMS)


def test_fsdp2_gathers_the_layers_in_fp8_and_each_rank_loads_the_model_on_the_host():
    """405B under FSDP2 (zero3, dp 64), BF16 against FP8, term by term (hand derivation):
    - gathered weights, the largest unit gathered twice plus its 16-bit gradient and fp32 reduce:
      BF16 a layer at 2 + 2 + 2 + 4 B; FP8 at 1 + 1 + 2 + 4 B, with the first layer's q_proj at
      2 B in one of the two copies (the V·h unit, 10 B x 2.1e9, is smaller in both);
    - FSDP2's cached all-gather buffers, the two largest units: the root (embedding + output layer,
      16-bit) and a layer, 2 B or 1 B per weight;
    - the host: each rank holds the whole model at 4 B while it loads;
    - nothing else moves (no FP8 weight copies, 16-bit activations)."""
    _, _, bf16 = _estimate("bf16-mixed")
    _, _, fp8 = _estimate("fp8")
    a, b = _terms(bf16), _terms(fp8)
    assert a["gathered weights"] == LAYER * (2 + 2 + 2 + 4)
    assert b["gathered weights"] == LAYER * (1 + 1 + 2 + 4) + Q * (2 - 1)
    assert a["cached all-gather buffers"] == 2 * V * H * 2 + LAYER * 2
    assert b["cached all-gather buffers"] == 2 * V * H * 2 + LAYER * 1
    moved = {"gathered weights", "cached all-gather buffers"}
    assert {k: v for k, v in a.items() if k not in moved} == {k: v for k, v in b.items() if k not in moved}
    # host RAM per node: 8 ranks, each with its 3 GiB of process memory (workload.Overheads) and,
    # under FP8, the whole model at 4 B
    assert bf16.host_bytes_per_node == 8 * 3 * 2**30
    assert fp8.host_bytes_per_node == 8 * (PARAMS * 4 + 3 * 2**30)


def test_without_sharding_fp8_holds_what_bf16_holds():
    """Under DDP no weight is gathered and accelerate loads nothing differently: the same bytes."""
    _, _, bf16 = _estimate("bf16-mixed", sharding="none", recipe="llama3.2-1b-a10g", dp=8)
    _, _, fp8 = _estimate("fp8", sharding="none", recipe="llama3.2-1b-a10g", dp=8)
    assert _terms(fp8) == _terms(bf16)


def test_fp8_is_planned_at_the_bf16_rate_and_says_so():
    """No published run of accelerate's (eager, tensor-wise) torchao Float8 is among jobctl's
    sources, so its GEMMs are counted at BF16's rate and the plan says it."""
    _, t, _ = _estimate("fp8", recipe="llama8b")
    assert t.links.low_tflops == 0
    rec = load_recipe("recipes/llama8b.yaml", ["framework=fsdp", "train.precision=fp8"])
    d = plan_on(rec, load_inventory("h100", []), alternatives=0, summary=False, learn=False).to_dict()
    assert d["feasible"]
    assert any("BF16 rate" in x and "all-gathered in FP8" in x for x in d["warnings"]), d["warnings"]
    assert any("host RAM" in x and "cpu_ram_efficient_loading" in x for x in d["warnings"]), d["warnings"]


def test_fp8_gathers_cost_less_time_only_in_the_gathers():
    """The same layout (8B over 128 ranks) on a slow network (5 GB/s between nodes), where the
    gathers are not hidden: the FP8 all-gather moves a layer's weights in one byte instead of
    two; compute is unchanged."""
    from dataclasses import replace

    from jobctl.planner.perf import estimate_step

    parts = {}
    for precision in ("bf16-mixed", "fp8"):
        w, t, _ = _estimate(precision, recipe="llama8b", dp=128)
        plan = Plan(nodes=16, gpus_per_node=8, tp=1, pp=1, dp=128, cp=1, sharding="zero3", micro_batch_size=1,
                    grad_accum_steps=4, global_batch_size=512, recompute="none", offload="none",
                    sequence_parallel=False)
        parts[precision] = estimate_step(w, plan, replace(t.links, inter_node_gbs=5.0), 8).to_dict()["parts"]
    assert parts["fp8"]["compute_s"] == parts["bf16-mixed"]["compute_s"]
    assert 0 < parts["fp8"]["dp_comm_s"] < parts["bf16-mixed"]["dp_comm_s"]


def test_fp8_with_adapters_is_refused_with_the_reason():
    rec = load_recipe("recipes/llama8b.yaml", ["framework=fsdp", "train.precision=fp8", "train.method=lora"])
    d = plan_on(rec, load_inventory("h100", []), alternatives=0, summary=False, learn=False).to_dict()
    assert not d["feasible"]
    assert any("method full only" in r for r in d["reasons"]), d["reasons"]
