"""Turn validated recipe and inventory values into the planner's plain dataclasses."""

from __future__ import annotations

from dataclasses import fields, replace

from jobctl import frameworks
from jobctl.planner.catalog import GIB, lookup_gpu
from jobctl.planner.memory import Overheads, Training, Workload
from jobctl.planner.models import PRESETS, ModelSpec
from jobctl.planner.moe import MLA, MoE
from jobctl.planner.perf import (
    Links,
    gemm_ceiling,
    low_precision_cast_bytes,
    low_precision_ceiling,
    moe_gemm_ceiling,
    te_gemm_ceiling,
)
from jobctl.planner.search import Constraints, Target


def model_spec(model) -> ModelSpec:
    """A preset name or an explicit architecture (schema.ModelArch) as a ModelSpec."""
    if isinstance(model, str):
        return PRESETS[model]
    x, a = model.moe, model.attention
    moe = MoE(x.experts, x.top_k, x.expert_ffn_hidden, x.shared_experts, x.shared_expert_ffn_hidden,
              x.first_dense_layers, x.moe_every, x.router_bias, x.score_bias, x.expert_bias,
              x.capacity_factor or 0.0, x.expert_groups, x.expert_groups_kept) if x is not None else None
    mla = MLA(a.q_lora_rank, a.kv_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim) \
        if a is not None and a.kind == "mla" else None
    return ModelSpec(
        name=model.name, family=model.family, layers=model.layers, hidden=model.hidden,
        ffn_hidden=model.ffn_hidden, heads=model.heads, kv_heads=model.kv_heads or model.heads,
        vocab=model.vocab, tied_embeddings=model.tied_embeddings, max_seq_len=model.max_seq_len,
        dropout=model.dropout, rope_theta=model.rope_theta, rope_scaling=model.rope_scaling, norm_eps=model.norm_eps,
        moe=moe, mla=mla, explicit_head_dim=(a.head_dim or 0) if a is not None else 0,
        qk_norm=bool(a and a.qk_norm), attention_bias=bool(a and a.bias), attention_sinks=bool(a and a.sinks),
        sliding_window=a.sliding_window if a is not None else 0,
        window_full_every=a.full_every if a is not None else 0,
        activation=model.activation, mtp_layers=model.mtp_layers,
    )


def overheads(*knob_blocks, cpu: bool = False) -> Overheads:
    """Defaults, then each `memory:` block in order (inventory first, recipe last, so it wins)."""
    o = Overheads()
    if cpu:  # no CUDA context, gloo instead of NCCL
        o = replace(o, cuda_context_gib=0.0, nccl_gib=0.0)
    names = {f.name for f in fields(Overheads)}
    for block in knob_blocks:
        if block is None:
            continue
        changes = {k: v for k, v in block.model_dump().items() if v is not None and k in names}
        o = replace(o, **changes)
    return o


def framework(recipe) -> frameworks.Framework:
    """The recipe's framework: a name, or {name, supports} for custom code."""
    f = recipe.framework
    if isinstance(f, str):
        return frameworks.get(f)
    supports = None if f.supports is None else {k: v for k, v in f.supports.model_dump().items() if v is not None}
    return frameworks.get(f.name, supports)


def workload(recipe, inventory=None, cpu: bool = False, learned: dict | None = None,
             formats: tuple[str, ...] = (), under: frameworks.Framework | None = None,
             nvlink_gpus: int = 0) -> Workload:
    """The recipe as the planner sees it; `learned` ({fixed_gap_bytes, per_scaling, from}): what an
    earlier CUDA OOM of this workload on this partition showed the model missed; `under`: run
    under this framework instead of the recipe's (its default fp8 scaling where the recipe has none)."""
    t = recipe.train
    o = overheads(inventory.memory if inventory is not None else None, recipe.memory, cpu=cpu)
    if learned:
        o = replace(o, learned_gap_bytes=int(learned.get("fixed_gap_bytes") or 0),
                    learned_per_scaling=float(learned.get("per_scaling") or 0.0), learned_from=str(learned.get("from", "")))
    fw = under or framework(recipe)
    return Workload(
        model=model_spec(recipe.model), seq_len=t.seq_len, global_batch_size=t.global_batch_size,
        optimizer=t.optimizer, precision=t.precision, method=t.method, lora_rank=t.lora_rank,
        lora_targets=tuple(t.lora_targets), attention=t.attention, fused_cross_entropy=t.fused_cross_entropy,
        framework=fw,
        overheads=o,
        training=training(recipe),
        device="cpu" if cpu else "gpu",
        fp8_recipe=frameworks.default_fp8_recipe(fw.caps, t.fp8_recipe),
        grad_reduce=t.grad_reduce,
        compile=t.compile,
        cuda_graphs=t.cuda_graphs,
        ep_overlap=t.ep_overlap,
        moe_dispatcher=t.moe_dispatcher,
        recompute_modules=() if t.recompute_modules == "auto" else tuple(dict.fromkeys(t.recompute_modules)),
        formats=tuple(formats),
        nvlink_gpus=nvlink_gpus,
    )


def training(recipe) -> Training:
    """The recipe's schedule, optimizer settings, seed and tokenizer (planner.memory.Training)."""
    t, tok = recipe.train, recipe.tokenizer
    steps = t.steps
    if steps is None and t.tokens:
        steps = -(-t.tokens // (t.global_batch_size * t.seq_len))
    return Training(steps=steps, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, schedule=t.lr_schedule,
                    weight_decay=t.weight_decay, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps,
                    grad_clip=t.grad_clip, seed=t.seed, tokenizer=tok.type, tokenizer_path=tok.path,
                    checkpoint_every=t.checkpoint_interval)


def links(partition, gpu, precision: str, fp8_recipe: str | None = None,
          fp8_backend: str = "transformer-engine") -> Links:
    """Link bandwidths: the partition's fields where given, else the catalog's defaults (all of
    them with `partition` None: a published run's GPU, jobctl_measure); the fitted GEMM
    efficiencies of the GPU, of `precision` under its fp8 scaling and the framework's
    low-precision GEMMs (caps.fp8_backend)."""
    p = partition
    if p is not None and p.inter_node_gbit is not None:
        inter = p.inter_node_gbit / 8
    elif p is not None and p.inter_node_gbit_per_node is not None:
        inter = p.inter_node_gbit_per_node / 8 / p.gpus_per_node
    else:
        inter = gpu.inter_node_gbit / 8
    low = low_precision_ceiling(gpu.key, precision, fp8_recipe, fp8_backend)
    return Links(
        intra_node_gbs=(p and p.intra_node_gbs) or gpu.intra_node_gbs, inter_node_gbs=inter,
        pcie_gbs=(p and p.pcie_gbs) or gpu.pcie_gbs, mem_bandwidth_gbs=gpu.mem_bandwidth_gbs,
        peak_tflops=gpu.peak_tflops(precision), gemm_efficiency=gemm_ceiling(gpu.key),
        te_gemm_efficiency=te_gemm_ceiling(gpu.key),
        low_tflops=gpu.low_precision_tflops(precision) if low else 0.0, low_efficiency=low,
        low_cast_bytes=low_precision_cast_bytes(precision, fp8_recipe, fp8_backend) if low else 0.0,
        moe_efficiency=moe_gemm_ceiling(gpu.key, low_precision=bool(low)),
    )


def nvlink_domain(partition, gpu) -> int | None:
    """GPUs one NVLink domain joins on `partition`: the inventory's word, else the GPU's (catalog)."""
    return getattr(partition, "nvlink_domain_gpus", None) or gpu.nvlink_domain_gpus


def target(inventory, partition, precision: str = "bf16-mixed", fp8_recipe: str | None = None,
           fp8_backend: str = "transformer-engine") -> Target:
    gpu = lookup_gpu(partition.gpu)
    if partition.gpu_memory_gib:
        mem = int(partition.gpu_memory_gib * GIB)
    elif gpu.is_cpu:
        mem = int(partition.mem_gib * GIB)  # a CPU "device" uses the node's RAM
    else:
        mem = gpu.memory_bytes
    return Target(
        cluster=inventory.name, partition=partition.name, gpu=gpu, gpus_per_node=partition.gpus_per_node,
        nodes=partition.nodes, host_mem_bytes=int(partition.mem_gib * GIB), gpu_memory_bytes=mem,
        links=links(partition, gpu, precision, fp8_recipe, fp8_backend),
        domain_gpus=nvlink_domain(partition, gpu),
        checkpoint_write_gbs_per_node=getattr(partition, "checkpoint_write_gbs_per_node", None),
        interruptions_per_node_day=getattr(partition, "interruptions_per_node_day", None),
    )


def constraints(recipe) -> Constraints:
    p = recipe.parallelism

    def pin(v):
        return None if v == "auto" else v

    return Constraints(
        tp=pin(p.tp), pp=pin(p.pp), dp=pin(p.dp), cp=pin(p.cp), sharding=pin(p.sharding),
        micro_batch_size=pin(p.micro_batch_size), recompute=pin(p.recompute), offload=pin(p.offload),
        sequence_parallel=pin(p.sequence_parallel), virtual_stages=pin(p.virtual_stages), ep=pin(p.ep),
        max_nodes=recipe.resources.nodes or recipe.resources.max_nodes, nodes=recipe.resources.nodes,
    )
