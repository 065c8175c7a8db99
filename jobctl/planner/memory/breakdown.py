"""The breakdown on a rank: each group of terms built by its own module, summed, and the rank
that holds the most (`estimate`); `estimate_stage` for one pipeline stage."""

from __future__ import annotations

from jobctl import frameworks
from jobctl.planner.memory.activations import (
    _activation_items,
    _pipeline_items,
    pipeline_in_flight,
)
from jobctl.planner.memory.allocator import _overheads, _phases
from jobctl.planner.memory.buffers import _framework_buffer_items
from jobctl.planner.memory.head import _head_items
from jobctl.planner.memory.stages import stage_layers
from jobctl.planner.memory.states import _state_items
from jobctl.planner.memory.workload import (
    GIB,
    LOW_PRECISION_WEIGHT_BYTES,
    UB_BUFFERS,
    UB_EXTRA_WORKSPACE_BYTES,
    UB_FP8_BUFFERS,
    MemoryBreakdown,
    Term,
    Workload,
    tp_overlap,
)
from jobctl.planner.plan import Plan


def estimate(w: Workload, gpu_memory_bytes: int, plan: Plan, host_mem_bytes: int | None = None,
             detail: bool = True) -> MemoryBreakdown:
    """Memory of the most loaded rank of `plan` (the max over first and last pipeline stage).

    detail=False skips formatting the formulas (the search evaluates many layouts)."""
    stages = ("only",) if plan.pp == 1 else ("first", "last")
    if plan.pp > 2 and not _middle_within_first(w, plan):
        stages = ("first", "middle", "last")
    best = None
    for st in stages:
        groups, terms = _stage_groups(w, plan, st, detail)
        g = groups  # the GPU groups in _GPU_GROUPS' order, summed as sum() would (the same bits)
        total = int(0 + g["weights"] + g["grads"] + g["optimizer"] + g["activations"] + g["logits"] + g["buffers"]
                    + g["overlap"] + g["overhead"])
        if best is None or total > best[0]:
            best = (total, st, groups, terms)
    return _breakdown(w, plan, best[1], best[2], best[3], gpu_memory_bytes, host_mem_bytes)


def _middle_within_first(w: Workload, plan: Plan) -> bool:
    """A middle stage holds no more than the first, term by term, so the first bounds it: it has
    no more layers (stage_layers), fewer micro-batches in flight (pipeline_in_flight falls with
    the rank), neither embedding nor its gradient buffers, and receives no buffers the first does
    not hold in its in-flight micro-batches (true unless torch's PipelineStage keeps a receive
    buffer per micro-batch: pp_stage_recv_buffers, where the middle receives from both sides).
    tests/test_memory_model.py checks it against every stage's own breakdown."""
    if w.caps.pp_stage_recv_buffers:
        return False
    split = stage_layers(w.model.layers, plan.pp, w.caps.pp_split_counts_ends)
    return split is not None and split[1] <= split[0]


def estimate_stage(w: Workload, gpu_memory_bytes: int, plan: Plan, stage: str, host_mem_bytes: int | None = None,
                   detail: bool = True) -> MemoryBreakdown:
    """Memory of one rank of one pipeline stage: "only" (no PP), "first", "middle" or "last".

    estimate() takes the most loaded of them; a measurement of one stage (Megatron-LM logs the
    last one, a trace follows one rank) is compared with this."""
    groups, terms = _stage_groups(w, plan, stage, detail)
    return _breakdown(w, plan, stage, groups, terms, gpu_memory_bytes, host_mem_bytes)


# The groups of a stage's bytes: those on the GPU, in the order they are summed, then the host's.
_GROUPS = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "overlap", "overhead", "host")


def _stage_groups(w: Workload, plan: Plan, stage: str, detail: bool) -> tuple[dict, list[Term]]:
    """Bytes per group on one rank of `stage`, and the terms (with formulas when `detail`).

    The terms come in groups, each built by one function of the few plan values it reads and
    kept once built (the search asks for the same groups across micro-batches, knobs and
    objectives): model states (_state_items), the framework's gradient and gather buffers
    (_framework_buffer_items), the layers' activations (_activation_items), the pipeline's
    receive buffers (_pipeline_items), the output layer and the loss (_head_items); then the
    phases that never coexist and the overheads, which read the groups' sums."""
    terms: list[Term] = []
    groups = dict.fromkeys(_GROUPS, 0.0)

    if detail:
        def apply(items):
            for name, value, group, formula in items:
                groups[group] += value
                if group != "host":
                    terms.append(Term(name, float(value), group, formula()))

        def add(name, value, group, formula):  # formula: a callable, formatted only when detail
            groups[group] += value
            if group != "host":
                terms.append(Term(name, float(value), group, formula()))
    else:  # the search's path: sums only (thousands of calls per plan command)
        def apply(items):
            for item in items:
                groups[item[2]] += item[1]

        def add(name, value, group, formula):
            groups[group] += value

    tp, pp, cp, sp, b = plan.tp, plan.pp, plan.cp, plan.sequence_parallel, plan.micro_batch_size
    in_flight = pipeline_in_flight(plan, stage, w.model.layers if frameworks.ep_overlap(w, plan) else 0)
    apply(_state_items(w, tp, pp, stage, plan.sharding, plan.shard_group, plan.offload, plan.ep))
    buffers, fsdp_pp = _framework_buffer_items(w, tp, pp, stage, plan.sharding, plan.offload, plan.dp * cp > 1,
                                                  plan.ep)
    apply(buffers)
    if tp_overlap(w, plan) == "userbuffers":  # Transformer Engine's (async TP's workspace is not counted)
        tokens = b * w.seq_len // cp
        low = UB_FP8_BUFFERS if w.precision in LOW_PRECISION_WEIGHT_BYTES else 0
        ub = tokens * w.model.hidden * ((UB_BUFFERS - low) * w.act_bytes + low) + UB_EXTRA_WORKSPACE_BYTES
        add("tp overlap buffers", ub, "buffers", lambda:
            f"{UB_BUFFERS} userbuffers of s·b/cp x h = {tokens} x {w.model.hidden}"
            + (f" ({low} of them 1-B FP8)" if low else "")
            + " and 2 more 32 MiB cuBLAS workspaces (Transformer Engine initialize_ub)")
    backend = frameworks.flex_backend(w, plan)
    if backend == "hybridep":
        add("hybridep buffers", *_hybridep_buffer(w, plan, b, tp, cp, sp))
    elif backend == "deepep":
        add("deepep buffers", *_deepep_buffer(w.model.hidden, plan.ep))
    acts_items, acts, working_set = _activation_items(w, tp, cp, sp, plan.recompute, plan.recompute_layers, b, pp,
                                                      in_flight, stage)
    apply(acts_items)
    pipe_items, recv = _pipeline_items(w, tp, cp, sp, b, pp, plan.virtual_stages, plan.grad_accum_steps, stage,
                                       in_flight)
    apply(pipe_items)
    if stage in ("last", "only"):
        apply(_head_items(w, tp, cp, sp, b, pp, stage, working_set))
    phases = _phases(add, w, plan, stage, groups, acts, working_set, fsdp_pp, recv)
    _overheads(add, w, plan, stage, groups, phases)
    return groups, terms


# HybridEP's registered buffers: BF16 tokens (Megatron-Core passes fp8_dispatch=False: fused_a2a.py
# HybridEPDispatch), fp32 probabilities, each inter-node one capped at 1 GB (DeepEP
# docs/Hybrid-EP_Implementation.md §4.2)
HYBRIDEP_TOKEN_BYTES = 2
HYBRIDEP_PROB_BYTES = 4
HYBRIDEP_RDMA_CAP_BYTES = 1 << 30


def _hybridep_buffer(w: Workload, plan: Plan, b: int, tp: int, cp: int, sp: bool) -> tuple:
    """HybridEP's buffer on each rank (one for dispatch and combine, use_shared_buffer's default),
    sized at the first dispatch for the rank's tokens (fused_a2a.py init_hybrid_ep_buffer: the
    input's rows, b·s/cp, split over tp under sequence parallelism) as DeepEP's
    docs/Hybrid-EP_Implementation.md §4.2 gives it: room for every rank of the EP group to send it
    all its tokens, their probabilities for the experts of its domain, and with more than one
    domain an inter-node slot per token and remote domain. The domain is the partition's NVLink
    domain (w.nvlink_gpus: a GB200 NVL72 rack's 72 GPUs hold an EP group of up to 64 with no
    inter-node slots), else the plan's node."""
    x, h, ep = w.model.moe, w.model.hidden, plan.ep
    tokens = b * w.seq_len // cp // (tp if sp else 1)
    local = min(ep, max(plan.gpus_per_node, w.nvlink_gpus))
    domains = ep // local
    per_rank = x.experts // ep
    intra = tokens * ep * (h * HYBRIDEP_TOKEN_BYTES + per_rank * local * HYBRIDEP_PROB_BYTES)
    rdma = min(HYBRIDEP_RDMA_CAP_BYTES, tokens * (domains - 1) * h * HYBRIDEP_TOKEN_BYTES) + \
        min(HYBRIDEP_RDMA_CAP_BYTES, tokens * (domains - 1) * per_rank * local * HYBRIDEP_PROB_BYTES)
    return intra + rdma, "buffers", lambda: (
        f"{tokens} tokens x ep {ep} slots of h = {h} in BF16 + fp32 probabilities for {per_rank * local} experts "
        f"of the domain" + (f"; inter-node: {tokens} x {domains - 1} remote nodes, tokens and probabilities"
                            if domains > 1 else "") + " (DeepEP Hybrid-EP_Implementation.md §4.2)")


# DeepEP's normal kernels (Megatron-Core's flex dispatcher, backend deepep): the SMs they run on
# (TransformerConfig.moe_deepep_num_sms), and the chunked receive queues of the configs DeepEP
# recommends per EP size, (NVLink receive tokens, RDMA send tokens, RDMA receive tokens) for
# dispatch and for combine (deep_ep/buffers/legacy.py get_dispatch_config, get_combine_config)
DEEPEP_NUM_SMS = 20
DEEPEP_QUEUES = {
    2: ((256, 6, 128), (256, 6, 128)), 4: ((256, 6, 128), (256, 6, 128)), 8: ((256, 6, 128), (256, 6, 128)),
    16: ((288, 20, 128), (288, 12, 128)), 24: ((288, 8, 128), (288, 8, 128)), 32: ((288, 8, 128), (288, 8, 128)),
    48: ((288, 8, 128), (288, 8, 128)), 64: ((288, 8, 128), (288, 8, 128)), 96: ((480, 12, 128), (480, 8, 128)),
    128: ((560, 12, 128), (560, 8, 128)), 144: ((720, 12, 128), (720, 8, 128)), 160: ((720, 12, 128), (720, 8, 128)),
}


def _deepep_buffer(hidden: int, ep: int) -> tuple:
    """DeepEP's buffer on each rank: the larger of dispatch's and combine's NVLink and RDMA sizes
    (Megatron-Core fused_a2a.py get_buffer), each as DeepEP's csrc/legacy/config.hpp
    get_nvl_buffer_size_hint and get_rdma_buffer_size_hint give it for BF16 tokens (hidden_bytes
    2·h): per channel (one per 2 SMs) and peer, its receive queue of tokens with their 8-B source
    metadata, 128 int64 top-k ids, 128 fp32 weights and 128 fp32 scales, and a few counters;
    across nodes (more than 8 ranks) an RDMA queue per remote node, twice over (send and
    receive). Fixed: it does not grow with the tokens."""
    hidden_bytes, channels = 2 * hidden, DEEPEP_NUM_SMS // 2
    nvl_ranks, rdma_ranks = min(ep, 8), max(ep // 8, 1)
    per_token = 8 + 128 * 8 + 128 * 4 + 128 * 4  # source meta, top-k ids, weights, scales

    def align(n: int, k: int = 128) -> int:
        return -(-n // k) * k

    nvl = rdma = 0
    for nvl_recv, rdma_send, rdma_recv in DEEPEP_QUEUES[ep]:
        nvl = max(nvl, align(channels * nvl_ranks * (2 * rdma_ranks + 3) * 4
                             + channels * nvl_ranks * nvl_recv * (hidden_bytes + per_token)))
        if ep > 8:
            recv = align(rdma_recv, rdma_send)
            rdma = max(rdma, align(channels * rdma_ranks * (8 * 2 + 2) * 2 * 4
                                   + channels * rdma_ranks * recv * 2 * (hidden_bytes + per_token + 16)))
    return nvl + rdma, "buffers", lambda: (
        f"DeepEP's queues for ep {ep}: {channels} channels x {nvl_ranks} NVLink peers of tokens of 2·h = "
        f"{hidden_bytes} B and their routing metadata" + (f", and {rdma_ranks} RDMA peers' send and receive "
                                                          "queues" if ep > 8 else "")
        + " (csrc/legacy/config.hpp size hints, deep_ep/buffers/legacy.py configs)")


def _breakdown(w: Workload, plan: Plan, stage: str, groups: dict, terms: list[Term], gpu_memory_bytes: int,
               host_mem_bytes: int | None) -> MemoryBreakdown:
    """The groups' bytes of one stage against what the GPU and the node can hold."""
    o = w.overheads
    groups = dict(groups)
    host = groups.pop("host")
    total = sum(groups.values())
    usable = gpu_memory_bytes - o.safety_margin_gib * GIB
    ranks_per_node = plan.gpus_per_node
    host_node = (host + o.host_per_process_gib * GIB) * ranks_per_node
    host_usable = (host_mem_bytes - o.host_reserve_gib * GIB) if host_mem_bytes else float("inf")
    return MemoryBreakdown(
        weights_bytes=int(groups["weights"]), grads_bytes=int(groups["grads"]),
        optimizer_bytes=int(groups["optimizer"]), activations_bytes=int(groups["activations"]),
        logits_bytes=int(groups["logits"]), buffers_bytes=int(groups["buffers"]),
        overhead_bytes=int(groups["overhead"]), total_bytes=int(total), gpu_usable_bytes=int(usable),
        overlap_bytes=int(groups["overlap"]),
        host_bytes_per_node=int(host_node), host_usable_bytes=int(min(host_usable, 1 << 62)),
        stage=stage, terms=tuple(terms),
    )


