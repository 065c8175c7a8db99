"""The performance model: the time of one optimizer step and its parts (docs/memory-model.md §5).

An analytical model in the Megatron-LM/Calculon family: compute at an achievable fraction
of the GPU's peak, tensor-parallel collectives on the intra-node link, the pipeline bubble
(p−1)/(m·v + p−1), data-parallel gradient reduce-scatter and parameter all-gather on the
network (with what overlaps with compute), context-parallel K/V exchange, offload traffic
over PCIe and the CPU optimizer step. Every efficiency constant is named below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
from functools import lru_cache

from jobctl.frameworks import GradBuffer, Selective, ep_overlap, flex_backend, recompute_modules
from jobctl.planner.memory import Workload, recomputed_layers, stage_layers
from jobctl.planner.memory.workload import (DEEPSPEED_REDUCE_BUCKET_ELEMS, fp8_gathered_layers, fp8_params,
                                           low_precision_format, tp_overlap)
from jobctl.planner.plan import Plan

# --- efficiency constants -----------------------------------------------------------------------
# Fraction of the dense peak that a training step's matrix multiplications reach when they
# are large, for GPUs without a fitted value below (first calibrated on Megatron-Core's GPT-3
# 175B run on H100, 47% MFU). A large bf16 GEMM alone reaches ~0.8 of peak on an H200 here;
# training GEMMs are smaller, have epilogues and wait on layer-boundary kernels.
GEMM_EFFICIENCY = 0.67
# ... per GPU generation, where published runs pin it (fitted on the "fit" half of
# benchmarks/data/published_throughput.yaml by benchmarks/step_time_accuracy.py --fit; the
# "check" half and docs/step-time-accuracy.md show how it holds). Hopper's dense peak is
# harder to approach than Ampere's: the same training code reaches a lower fraction of it.
GEMM_EFFICIENCY_BY_GPU = {"a100": 0.80, "h100": 0.55, "h200": 0.55}
# ... in a Transformer Engine stack (Megatron-Core: TE's GEMMs with their fused norm, bias and
# cast epilogues, cuDNN attention, CUDA_DEVICE_MAX_CONNECTIONS=1 scheduling), per generation:
# the BF16 runs of Megatron-Core's H100 table (fit half, benchmarks/step_time_accuracy.py --fit)
# reach more of Hopper's peak than the 2023 FSDP rows above.
GEMM_EFFICIENCY_TE = {"hopper": 0.74}  # 5 fit rows: Megatron-Core H100 table 1.7B, 16B, 70B, 314B, 462B
# The layers' linear GEMMs under a low-precision recipe (Transformer Engine's fp8, mxfp8,
# nvfp4; attention and the output layer stay in BF16) reach this fraction of the format's dense
# peak, per GPU generation and format, casts and scaling included; fitted like the above on the
# "fit" half of benchmarks/data/published_throughput_2025.yaml. A pair not here is timed at the
# BF16 rate (no speed-up promised that was not measured), and the plan says so.
LOW_PRECISION_GEMM_EFFICIENCY: dict[tuple[str, str], float] = {
    ("hopper", "fp8"): 0.64,  # 7 fit rows: Megatron-Bridge 25.09-26.02 70B/405B H100, NeMo 24.07 H100
    ("blackwell", "fp8"): 0.60,  # 5 fit rows: Megatron-Bridge 8B/405B GB200
    ("blackwell", "mxfp8"): 0.60,  # 4 fit rows: Megatron-Bridge 8B B200/GB200, 70B/405B GB200
    ("blackwell", "nvfp4"): 0.84,  # 7 fit rows: Megatron-Bridge 70B/405B GB200
    # torchao's row-wise Float8 under torchtitan (torch._scaled_mm with per-row scales, each GEMM's
    # operands cast, and cast again along the other axis for backward): 2 fit pairs of torchtitan's
    # async-TP table (BF16 -> row-wise, compiled, TP 8 on H100), which ran 1.00x and 0.81x of BF16
    # (benchmarks/step_time_accuracy.py fit_rowwise). Below BF16's rate: it measured no faster.
    ("hopper", "fp8-rowwise"): 0.58,
}
# ... whose casts are memory-bound work of their own: torchao casts each GEMM's operands with
# per-row scales, and again along the other axis for the backward GEMMs (the input and weight
# column-wise for the weight gradient, the output gradient both ways), each an amax reduction
# and a scaled copy. Bytes moved per element of a linear's input and output, per token
# (forward, backward and the casts a recomputed forward repeats), fitted with the efficiency above.
ROWWISE_CAST_BYTES = 48.0
# The generation a catalog GPU belongs to, for the constants fitted per generation (B200 and
# GB200 share Blackwell's tensor cores; their peaks in the catalog differ by their clocks).
GENERATION = {"h100": "hopper", "h200": "hopper", "b200": "blackwell", "gb200": "blackwell"}
# Small GEMMs cannot fill the GPU: efficiency x/(x + x0) with x = tokens·hidden/tp of the
# activation tile (one saturation constant, fitted: 2^18 elements halves efficiency at ~256k).
GEMM_SATURATION_ELEMS = 1 << 18
# FlashAttention-2 forward+backward reaches 35-50% of H100 peak in isolation (Dao 2023,
# FlashAttention-2 paper, Fig. 7: ~330-340 TFLOP/s fwd+bwd at head dim 128 on H100 = ~0.35);
# in training steps the fit (docs/step-time-accuracy.md) puts it at 0.25.
ATTENTION_EFFICIENCY = 0.25
# ... at long sequences: its tiles need long query and key blocks. With context parallelism
# the causal load balancing splits each sequence into 2·cp chunks and every step of the ring
# works on one chunk pair, so efficiency falls as chunks shorten: L/(L + L0) with L the chunk
# length (FlashAttention-2 paper, Fig. 6-7: throughput at 512-1k tokens is about half of 16k).
ATTENTION_SATURATION_TOKENS = 1024
# torch.compile (torchtitan --compile.enable) fuses the memory-bound kernels of a layer (and their
# launches): they move this share of their eager bytes. Fitted on the fit pair of torchtitan's
# compile/eager runs (benchmarks/step_time_accuracy.py --fit; a speed-up of two runs on the same
# GPUs): the fit stops at the grid's edge, 0.05, and still explains only 1.07x of the measured
# 1.16x: eager torchtitan costs more than the memory-bound bytes the model counts.
COMPILE_MEMBOUND_SHARE = 0.05
# Memory-bound kernels (norms, SwiGLU, RoPE, residual adds, optimizer step) reach this
# fraction of the HBM bandwidth (fitted; small kernels rarely stream at full bandwidth).
MEMORY_EFFICIENCY = 0.60
# NCCL collectives reach this fraction of the nominal per-direction link bandwidth as "bus
# bandwidth" (nccl-tests all-reduce on 8x H100 NVLink: ~360-480 GB/s of 450 nominal).
INTRA_NODE_EFFICIENCY = 0.80
NETWORK_EFFICIENCY = 0.80
PCIE_EFFICIENCY = 0.75
# Share of the data-parallel gradient reduction hidden behind the last micro-batch's
# backward (Megatron --overlap-grad-reduce, DDP buckets, FSDP): all but the last bucket.
DP_OVERLAP = 0.90
# Tensor-parallel communication overlapped with the GEMMs (Megatron --tp-comm-overlap: Transformer
# Engine's userbuffers; module/base.py initialize_ub): the all-gathers before QKV and FC1 run as
# a ring exchange chunk by chunk under the GEMM, the reduce-scatters after the projection and
# FC2 as a pipeline of 4 splits whose last one has no GEMM left to hide behind, and the
# backward's all-gathers run in bulk beside the weight-gradient GEMMs. The share of the TP
# traffic still exposed (fitted with the low-precision efficiencies on the fit half of
# benchmarks/data/published_throughput_2025.yaml): what a layer's GEMMs cannot cover is
# exposed as well.
TP_OVERLAP_EXPOSED = 0.0
# ... and the overlapped traffic is not free: its kernels hold SMs the GEMMs would use
# (initialize_ub's default num_sm=16 per communicator, of the 132 SMs of an H100), so the
# GEMMs under it run slower by about that share of the overlapped time.
TP_OVERLAP_SM_SHARE = 16 / 132
# torchtitan's async TP (torch.compile's micro-pipeline TP pass: torch/distributed/
# _symmetric_memory/__init__.py _pipelined_all_gather_and_consume, _pipelined_produce_and_all2all)
# splits each sequence-parallel GEMM in tp chunks and copies each peer's chunk through symmetric
# memory while the previous chunk multiplies; the reduce-scatter's partial sums are added after
# the last copy. The share of the TP traffic it leaves exposed, fitted on its own pairs of runs
# (async TP on and off, the same GPUs: benchmarks/step_time_accuracy.py ASYNC_TP_PAIRS, fit
# half); the copies are peer copies, not resident kernels, so no SM share is charged.
ASYNC_TP_EXPOSED = 0.6
# Host memory bandwidth per node available to a CPU optimizer (DeepSpeed CPU-Adam is
# memory-bound: it reads and writes fp32 master, m, v and reads the gradient: 28 B/param).
HOST_MEMORY_GBS = 100.0
CPU_ADAM_BYTES_PER_PARAM = 28
# Bytes moved per token per layer by memory-bound kernels, forward + backward, in units of
# h and f (16-bit): 2 RMSNorms, 2 residual adds, RoPE and SwiGLU read and write their
# tensors; backward moves about twice the forward.
MEMBOUND_BYTES_H = 72
MEMBOUND_BYTES_F = 18
# Attention without a fused kernel (attention="eager": Megatron before FlashAttention, HF
# eager) materialises the a·s² scores: forward writes them (2 B), softmax reads and writes
# (4 B), dropout reads, writes and keeps a mask (5 B), the second matmul reads them (2 B):
# ~13 B per score element; backward moves about twice that (Korthikanti et al. 2022 §4.1 lists
# the same tensors as activations: 5·a·s²·b bytes per layer).
EAGER_SCORE_BYTES_FWD = 13
EAGER_SCORE_BYTES = 3 * EAGER_SCORE_BYTES_FWD
# Fixed costs that decide small models, where bandwidth terms vanish. A layer's forward and
# backward launch about 40 kernels (GEMMs, attention, norms, activations, their backward and
# gradient accumulation), each taking at least a launch (~4 us without CUDA graphs); every
# collective pays a start-up latency (nccl-tests all_reduce at 8 bytes: ~10-20 us inside an
# NVLink node, ~30-40 us across InfiniBand nodes). These give a toy model its honest answer:
# eight GPUs are not faster than one when each step is a few kernel launches.
KERNEL_LAUNCH_S = 4e-6
KERNELS_PER_LAYER = 40
LATENCY_INTRA_NODE_S = 15e-6
LATENCY_INTER_NODE_S = 35e-6
# Mixtures of experts (planner/perf.py _routed_experts): per GPU generation, the share of a
# dense GEMM's efficiency (at the same rows per expert) that a routed expert's work reaches
# (grouped GEMMs, and what the model does not itemise: router, dispatcher bookkeeping), fitted
# on the fit half of NVIDIA's MoE rows (benchmarks/moe_step_time.py --fit,
# docs/step-time-accuracy.md; Hopper's 0.16 is a catch-all for its FP8 experts: every 2025-11 to
# 2026-06 H100 row within -1% to +7%, the 25.09 token-dropping runs +27% and +31%); a generation
# without rows takes Hopper's. And the bytes a routed
# copy moves in memory-bound kernels per unit of h, forward and backward: permuted into expert
# order and back (a read and a write of h each way, 16-bit: 8·h forward), about twice that in
# backward.
MOE_GEMM_EFFICIENCY = {"hopper": 0.16, "blackwell": 0.48}
# ... those rows ran FP8 or MXFP8 experts. 16-bit experts have their own, fitted (issue 29) on the
# fit half's BF16 MoE rows once gpt-oss was rendered: Blackwell on 5 (gpt-oss-120b on 64 B200 and
# GB200, DeepSeek-V3 on 256 GB200), Hopper on 2 (gpt-oss-120b on 64 H100); until then each
# generation had kept the value its FP8 rows gave before HybridEP was modelled (0.38, 0.48)
MOE_GEMM_EFFICIENCY_16BIT = {"hopper": 0.32, "blackwell": 0.28}
MOE_PERMUTE_BYTES_H = 24
# ... and where the framework launches the routed experts' work expert by expert from the host
# (caps.moe_expert_launches: Megatron-Core's Transformer Engine GroupedLinear), host seconds
# per local expert, per MoE layer, per micro-batch (forward and backward). Each MoE layer syncs
# the host with the GPU once (the dispatcher's token counts: token_dispatcher.py
# _maybe_dtoh_and_synchronize, HybridEP's unbounded num_permuted_tokens; TEGroupedMLP.forward's
# tokens_per_expert.tolist()), so the host cannot run more than a layer ahead: a layer takes the
# longer of its GPU work and its host work (_layer_costs). None where CUDA graphs capture the
# experts (Megatron-Bridge's full-iteration graphs replay the step without the host). Fitted with
# MOE_GEMM_EFFICIENCY on the fit half (0.15 ms when the host time was added to the GPU's; 0.575
# ms as the longer of the two, which the one-node B200 runs at micro-batch 1 against 4 decide).
MOE_HOST_S_PER_EXPERT = 0.575e-3
# Gradient buckets, one collective each: torch DDP's bucket_cap_mb default 25 MB; Megatron-Core's
# max(40M, 1M x dp) parameters (distributed/distributed_data_parallel.py, bucket_size None);
# DeepSpeed's reduce_bucket_size 5e8 elements (memory/workload.py).
BUCKET_BYTES = 25e6
MEGATRON_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
# A ring collective across nodes pays a latency per step of the ring, not once: NCCL's own
# tuning model (src/graph/tuning.cc ncclTopoTuneModel, mirrored by torch/_inductor/
# comm_analysis.py), ring algorithm, Simple protocol (large messages): a base of 8.4 us, then
# 14 us per step that crosses the network and 3.4 us per step inside a node (NVLink); an
# all-gather or reduce-scatter of n ranks over N nodes takes n-1 steps, N-1 of them across the
# network (an all-reduce twice that). A 2,048-rank ring over 1,024 nodes: ~18 ms a call.
NCCL_RING_BASE_S = 8.4e-6
NCCL_RING_NET_STEP_S = 14e-6
NCCL_RING_NVLINK_STEP_S = 3.4e-6


@dataclass(frozen=True)
class Links:
    """Bandwidths, GB/s per direction per GPU."""

    intra_node_gbs: float
    inter_node_gbs: float
    pcie_gbs: float
    mem_bandwidth_gbs: float
    peak_tflops: float
    gemm_efficiency: float = 0.0  # 0: GEMM_EFFICIENCY; else the GPU's own (GEMM_EFFICIENCY_BY_GPU)
    te_gemm_efficiency: float = 0.0  # in a Transformer Engine stack (GEMM_EFFICIENCY_TE; 0: as above)
    # the layers' GEMMs in a low-precision format: its dense peak and fitted efficiency (0: BF16)
    low_tflops: float = 0.0
    low_efficiency: float = 0.0
    # row-wise Float8: bytes moved casting each linear's operands, per element of its input and
    # output per token (ROWWISE_CAST_BYTES; 0: none counted)
    low_cast_bytes: float = 0.0
    moe_efficiency: float = 1.0  # grouped expert GEMMs' share of a dense GEMM's (moe_gemm_ceiling)

    def __hash__(self) -> int:  # a key of the per-layer cost cache: hashed once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h


@dataclass(frozen=True)
class StepEstimate:
    step_time_s: float
    compute_s: float
    tp_comm_s: float
    pp_bubble_s: float
    pp_p2p_s: float
    dp_comm_s: float
    cp_comm_s: float
    offload_s: float
    optimizer_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    model_flops_per_step: float
    steps: int | None
    time_to_train_s: float | None
    gpu_hours: float | None
    ep_comm_s: float = 0.0  # a mixture of experts' token all-to-alls (dispatch and combine)
    moe_host_s: float = 0.0  # the host launching the routed experts' work (MOE_HOST_S_PER_EXPERT)

    def to_dict(self) -> dict:
        keys = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "time_to_train_s", "gpu_hours")
        out = {k: getattr(self, k) for k in keys}
        out["parts"] = {k: getattr(self, k) for k in ("compute_s", "tp_comm_s", "pp_bubble_s", "pp_p2p_s",
                                                        "dp_comm_s", "cp_comm_s", "ep_comm_s", "moe_host_s",
                                                        "offload_s", "optimizer_s")}
        out["steps"] = self.steps
        out["model_flops_per_step"] = self.model_flops_per_step
        return out


def attention_share(m, s: float) -> float:
    """The share of causal attention's score and value work a layer does, averaged over the
    layers: 1 without a window; a sliding window of W tokens (gpt-oss: 128 on alternate layers)
    has each query attend to at most W keys, sum_i min(i + 1, W) ≈ s·W - W²/2 of causal's s²/2."""
    if not m.sliding_window or s <= m.sliding_window:
        return 1.0
    windowed = 1 - 1 / m.window_full_every if m.window_full_every else 1.0
    r = m.sliding_window / s
    return 1 - windowed + windowed * (2 * r - r * r)


def model_flops_per_token(w: Workload) -> float:
    """Model FLOPs per token, forward + backward, without recomputation (the MFU numerator).

    6·Ψ for the weight matmuls (embedding lookups excluded; the output layer included),
    plus attention scores and values: 12·L·h·s per token (fwd+bwd), halved by causal masking
    (Narayanan et al. 2021, appendix; Llama 3 paper MFU convention).
    """
    m = w.model
    # a mixture of experts: each token through top_k of the routed experts (active parameters)
    routed = m.moe.top_k / m.moe.experts * m.routed_params_per_layer if m.moe is not None else 0.0
    matmul_params = m.layers * (m.layer_params() + routed) + m.vocab * m.hidden
    return 6 * matmul_params + 6 * m.layers * m.hidden * w.seq_len * attention_share(m, w.seq_len)


def gemm_efficiency(tile_elems: float, ceiling: float = 0.0) -> float:
    return (ceiling or GEMM_EFFICIENCY) * tile_elems / (tile_elems + GEMM_SATURATION_ELEMS)


def gemm_ceiling(gpu_key: str) -> float:
    """The large-GEMM efficiency of a GPU: its own where fitted, else GEMM_EFFICIENCY."""
    return GEMM_EFFICIENCY_BY_GPU.get(gpu_key.split("-")[0], GEMM_EFFICIENCY)


def generation(gpu_key: str) -> str:
    """The GPU generation the fitted constants are kept by (GENERATION; a kind not listed is its
    own): "h100-sxm-80gb" -> "hopper"."""
    kind = gpu_key.split("-")[0]
    return GENERATION.get(kind, kind)


def te_gemm_ceiling(gpu_key: str) -> float:
    """The large-GEMM efficiency of a GPU under Transformer Engine, or 0 (not fitted)."""
    return GEMM_EFFICIENCY_TE.get(generation(gpu_key), 0.0)


def moe_gemm_ceiling(gpu_key: str, low_precision: bool = True) -> float:
    """The fitted share of a dense GEMM's efficiency a routed expert's work reaches on a GPU, its
    experts in a low-precision format (FP8, MXFP8, NVFP4) or in 16-bit."""
    table = MOE_GEMM_EFFICIENCY if low_precision else MOE_GEMM_EFFICIENCY_16BIT
    return table.get(generation(gpu_key), table["hopper"])


def low_precision_cast_bytes(precision: str, fp8_recipe: str | None = None,
                             backend: str = "transformer-engine") -> float:
    """ROWWISE_CAST_BYTES under row-wise FP8, else 0 (Transformer Engine fuses its casts into the
    norms and GEMM epilogues, which its fitted efficiency already holds)."""
    return ROWWISE_CAST_BYTES if low_precision_format(precision, fp8_recipe, backend) == "fp8-rowwise" else 0.0


def low_precision_ceiling(gpu_key: str, precision: str, fp8_recipe: str | None = None,
                          backend: str = "transformer-engine") -> float:
    """The fitted large-GEMM efficiency of a low-precision format on a GPU, or 0 (not fitted);
    torchao's Float8Linear and MXFP8Linear have their own (row-wise under torchtitan; accelerate's
    eager tensor-wise and torchtitan's MXFP8 not fitted)."""
    fmt = low_precision_format(precision, fp8_recipe, backend)
    return LOW_PRECISION_GEMM_EFFICIENCY.get((generation(gpu_key), fmt), 0.0)


def _ring(n: int, nbytes: float, gbs: float, efficiency: float, factor: float, latency: float = 0.0) -> float:
    """Ring collective time: factor·(n−1)/n·bytes over the link (factor 2 = all-reduce,
    1 = reduce-scatter or all-gather), plus `latency` per call."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return latency + factor * (n - 1) / n * nbytes / (gbs * 1e9 * efficiency)


def _latency(gbs: float, links: Links) -> float:
    return LATENCY_INTRA_NODE_S if gbs >= links.intra_node_gbs else LATENCY_INTER_NODE_S


def ranks_per_node(gpus_per_node: int, stride: int, n: int) -> int:
    """How many of a group of `n` ranks `stride` apart share a node (or NVLink domain)."""
    return max(1, min(n, gpus_per_node // max(1, stride)))


def ring_gbs(links: Links, gpus_per_node: int, stride: int, n: int) -> float:
    """Bus bandwidth, GB/s per GPU, of a ring collective over `n` ranks `stride` apart in the
    rank order (Megatron's tp-cp-dp-pp: the data-parallel group's stride is tp). Inside a node,
    the intra-node link. Across nodes, NCCL runs one ring channel per NIC through the group's
    ranks in each node (every rank has its own NIC) and only the hop out of a node crosses the
    network, so the bus bandwidth is the group's NICs in a node together, k × the per-GPU network
    with k of its ranks per node, capped by the intra-node link that carries the other hops
    (NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel: busBw = nChannels × bwInter; its model
    caps Hopper at 370 GB/s, above the 8 × 50 × NETWORK_EFFICIENCY = 320 timed here). The other
    groups of the node (other TP ranks) reduce at the same time on the other NICs."""
    if stride * n <= gpus_per_node:
        return links.intra_node_gbs
    return min(links.intra_node_gbs, ranks_per_node(gpus_per_node, stride, n) * links.inter_node_gbs)


def ring_latency(gpus_per_node: int, stride: int, n: int, allreduce: bool = False) -> float:
    """Seconds of latency of one ring collective over `n` ranks `stride` apart (ring_gbs): inside
    a node the measured start-up (LATENCY_INTRA_NODE_S); across nodes NCCL's per-step latencies
    (NCCL_RING_*), at least the measured inter-node start-up."""
    if n <= 1:
        return 0.0
    if stride * n <= gpus_per_node:
        return LATENCY_INTRA_NODE_S
    nodes = -(-n // ranks_per_node(gpus_per_node, stride, n))
    rounds = 2 if allreduce else 1
    steps, net = rounds * (n - 1), rounds * (nodes - 1)
    return max(LATENCY_INTER_NODE_S,
               NCCL_RING_BASE_S + net * NCCL_RING_NET_STEP_S + (steps - net) * NCCL_RING_NVLINK_STEP_S)


def _buckets(w: Workload, plan: Plan, params: float, grad_b: float, layers: int) -> float:
    """Gradient buckets (one collective each) of `params` gradients of `grad_b` bytes over a
    stage of `layers` layers."""
    if w.caps.grad_buffer is GradBuffer.DDP_BUCKETS and plan.sharding != "none":
        return layers + 1.0  # FSDP: one collective per wrapped block, and the root's
    if w.caps.grad_buffer is GradBuffer.NONE:  # Megatron-Core's DDP
        per = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * plan.dp * plan.cp)
        return max(1.0, params / per)
    if w.caps.grad_buffer is GradBuffer.REDUCE_BUCKET:
        return max(1.0, params / DEEPSPEED_REDUCE_BUCKET_ELEMS)
    return max(1.0, params * grad_b / BUCKET_BYTES)


def dp_ring(plan: Plan, links: Links, gpus_per_node: int) -> dict | None:
    """How the data-parallel group's ring runs (for `plan --explain` and --json): its ranks, how
    many share a node (or NVLink domain), the nodes it spans, its bus bandwidth per GPU and NCCL's
    latency per call. None without data parallelism."""
    n = plan.dp * plan.cp
    if n <= 1:
        return None
    inside = plan.tp * n <= gpus_per_node
    k = n if inside else ranks_per_node(gpus_per_node, plan.tp, n)
    return {"ranks": n, "ranks_per_node": k, "nodes": -(-n // k), "inside_node": inside,
            "bus_gbs_per_gpu": dp_link_gbs(plan, links, gpus_per_node),
            "latency_s": ring_latency(gpus_per_node, plan.tp, n)}


def dp_link_gbs(plan: Plan, links: Links, gpus_per_node: int) -> float:
    """The data-parallel (and context-parallel) group's ring bandwidth: Megatron rank order
    tp-cp-dp-pp, so the group's ranks are tp apart (ring_gbs)."""
    return ring_gbs(links, gpus_per_node, plan.tp, plan.cp * plan.dp)


def estimate_step(w: Workload, plan: Plan, links: Links, gpus_per_node: int, steps: int | None = None) -> StepEstimate:
    """Time of one optimizer step of `plan` and its parts."""
    step, layers_max, layer_tp, layer_cp, layer_ep, stage_mb, p2p, bubble, dp, optimizer, offload, layer_host = \
        _step_parts(w, plan, links, gpus_per_node)
    micro = plan.grad_accum_steps
    peak = links.peak_tflops * 1e12
    tokens = w.global_batch_size * w.seq_len
    world = plan.world_size
    flops = model_flops_per_token(w) * tokens
    mfu = flops / (step * world * peak) if step > 0 else 0.0
    ttt = steps * step if steps else None
    host = micro * layers_max * layer_host  # the experts' launches where the host outruns the GPU
    return StepEstimate(
        step_time_s=step, compute_s=micro * stage_mb - micro * layers_max * (layer_tp + layer_cp + layer_ep) - host,
        moe_host_s=host,
        tp_comm_s=micro * layers_max * layer_tp, pp_bubble_s=bubble, pp_p2p_s=micro * p2p, dp_comm_s=dp,
        cp_comm_s=micro * layers_max * layer_cp, offload_s=offload, optimizer_s=optimizer,
        tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / world, mfu=mfu,
        model_flops_per_step=flops, steps=steps, time_to_train_s=ttt,
        gpu_hours=ttt * world / 3600 if ttt else None, ep_comm_s=micro * layers_max * layer_ep,
    )


class StepShape(NamedTuple):
    """The values of a plan that the step model reads (a Plan has them all): what the search's
    bounds build by the thousand, lighter than a Plan."""

    tp: int
    pp: int
    cp: int
    dp: int
    gpus_per_node: int
    world_size: int
    sharding: str
    micro_batch_size: int
    grad_accum_steps: int
    sequence_parallel: bool
    virtual_stages: int
    hsdp_shard: int = 0
    recompute: str = "none"
    recompute_layers: int = 0
    offload: str = "none"
    ep: int = 1

    @property
    def expert_dp(self) -> int:
        return self.tp * self.cp * self.dp // self.ep  # as Plan.expert_dp


def step_time(w: Workload, plan: Plan | StepShape, links: Links, gpus_per_node: int) -> float:
    """Seconds per optimizer step (estimate_step's step_time_s without its other figures: the
    search's bounds ask for thousands of them)."""
    return _step_parts(w, plan, links, gpus_per_node)[0]


def _step_parts(w: Workload, plan: Plan, links: Links, gpus_per_node: int) -> tuple:
    """(step, layers on the largest stage, one layer's TP, CP and EP seconds, one micro-batch on
    the slowest stage, its sends, the bubble, exposed DP communication, the optimizer step,
    offload, what the experts' host launches add to one layer)."""
    layers_max, layer_tp, layer_cp, layer_ep, stage_mb, p2p, bubble, layer_host = \
        _pipeline_parts(w, plan, links, gpus_per_node)
    pipeline = plan.grad_accum_steps * (stage_mb + p2p)
    rank_params = stage_params_per_rank(w, plan)
    trainable = rank_params if w.method == "full" else rank_params * 0.01
    dp = _data_parallel(w, plan, links, gpus_per_node, stage_mb, layers_max, trainable)
    optimizer, offload = _optimizer_and_offload(w, plan, links, trainable)
    if w.model.moe is not None:  # the routed experts: their gradients reduced, their step taken, over expert DP
        experts = layers_max * w.model.routed_params_per_layer / plan.ep
        dp += _expert_data_parallel(w, plan, links, gpus_per_node, stage_mb, experts)
        optimizer += _optimizer_and_offload(w, plan, links, experts, plan.expert_dp)[0]
    step = pipeline + bubble + dp + optimizer + offload
    return step, layers_max, layer_tp, layer_cp, layer_ep, stage_mb, p2p, bubble, dp, optimizer, offload, layer_host


def pipeline_time(w: Workload, plan: Plan | StepShape, links: Links, gpus_per_node: int) -> float:
    """The micro-batches through the slowest stage, their sends and the bubble: the step less its
    data-parallel communication, optimizer step and offload (none of which is negative), so a
    lower bound on step_time that does not depend on the sharding or the framework."""
    _, _, _, _, stage_mb, p2p, bubble, _ = _pipeline_parts(w, plan, links, gpus_per_node)
    return plan.grad_accum_steps * (stage_mb + p2p) + bubble


def stage_time(w: Workload, plan: Plan | StepShape, links: Links, gpus_per_node: int) -> float:
    """One micro-batch through the slowest pipeline stage (forward and backward), seconds."""
    return _pipeline_parts(w, plan, links, gpus_per_node)[4]


def host_side_time(w: Workload, plan: Plan | StepShape, links: Links) -> float:
    """The optimizer step and the offload transfers, seconds per step (parts of step_time)."""
    rank_params = stage_params_per_rank(w, plan)
    optimizer, offload = _optimizer_and_offload(w, plan, links, rank_params if w.method == "full" else rank_params * 0.01)
    return optimizer + offload


def clear_caches() -> None:
    """Forget the step model's kept per-layer and per-pipeline costs: they are kept by their
    arguments, not by the module's constants (a fit that moves a constant calls this)."""
    _pipeline_costs.cache_clear()
    _layer_costs.cache_clear()


def _pipeline_parts(w: Workload, plan, links: Links, gpus_per_node: int) -> tuple:
    """(layers on the largest stage, one layer's TP, CP and EP seconds, one micro-batch on the
    slowest stage, its sends, the bubble, what the experts' host launches add to one layer)."""
    m = w.model
    layers_max = stage_layers(m.layers, plan.pp)[1]
    rc = recomputed_layers(plan, layers_max) / layers_max  # share of layers whose forward reruns
    # the per-layer costs depend on a few of the plan's values and none of the framework's but
    # what selective recompute reruns: shared by every plan (and framework) that has them
    op_sac = (w.caps.fused_qkv,) if plan.recompute == "selective" and w.caps.selective is Selective.OP_SAC else None
    # te: the frameworks that run Transformer Engine's layers (Megatron-Core)
    v = max(plan.virtual_stages, 1)
    parts = _pipeline_costs(m, w.seq_len, w.act_bytes, w.attention, op_sac, tp_overlap(w, plan),
                            (w.caps.te_layernorm_mlp, w.compiled, w.caps.moe_expert_launches,
                             flex_backend(w, plan) is not None), links, gpus_per_node,
                            plan.tp, plan.pp, plan.cp, plan.dp, plan.micro_batch_size, plan.sequence_parallel, v,
                            plan.recompute, rc, plan.ep, _ep_hidden_share(w, plan), w.mtp_layers,
                            recompute_modules(w) if plan.recompute == "selective" else ())
    short = plan.pp - plan.grad_accum_steps
    if v > 1 and short > 0:
        # fewer micro-batches than stages under an interleaved schedule (torch's Interleaved1F1B
        # takes them: schedules.py, number_of_rounds = max(1, m // pp)): a micro-batch's next chunk
        # on the first stage waits for it to leave the last, so each of the v rounds lasts p
        # chunk-times, not m: v·p + m − 1 chunks in all where (p − 1)/v counts v·m + p − 1.
        layers_max, layer_tp, layer_cp, layer_ep, stage_mb, p2p, bubble, layer_host = parts
        bubble += short * (v - 1) / v * stage_mb
        parts = (layers_max, layer_tp, layer_cp, layer_ep, stage_mb, p2p, bubble, layer_host)
    return parts


def _ep_hidden_share(w: Workload, plan) -> float:
    """The share of a stage's chunk forwards and backwards that Megatron's combined 1F1B
    schedule pairs (frameworks.ep_overlap; 0 without it): all but the warm-up forwards of the
    first stage and as many cool-down backwards, of m·v each (one of m unpipelined; pipelined,
    (p-1)·2 + (v-1)·p + 2 with the schedule's extra warm-up forward)."""
    if not ep_overlap(w, plan):
        return 0.0
    p, v, m = plan.pp, max(plan.virtual_stages, 1), plan.grad_accum_steps
    warm = 1 if p == 1 else (p - 1) * 2 + (v - 1) * p + 2
    return max(0.0, 1 - warm / (m * v))


@lru_cache(maxsize=1 << 15)
def _pipeline_costs(m, s: int, act_bytes: int, attention: str, op_sac: tuple | None, overlap: str,
                    stack: tuple[bool, bool, bool, bool], links: Links, gpus_per_node: int, t: int, p: int, c: int,
                    dp: int, b: int, sequence_parallel: bool, v: int,
                    recompute: str, rc: float, ep: int = 1, ep_hidden: float = 0.0, mtp: int = 0,
                    modules: tuple[str, ...] = ()) -> tuple:
    layers_max = stage_layers(m.layers, p)[1]
    layer_compute, layer_tp, layer_cp, layer_ep, msg, head, layer_host = _layer_costs(
        m, s, act_bytes, attention, op_sac, overlap, stack, links, gpus_per_node, t, c, b, sequence_parallel, recompute,
        rc, ep, modules)
    if ep_hidden:  # paired steps: one's all-to-alls under the other's compute, only the excess shows
        layer_ep = (1 - ep_hidden) * layer_ep + ep_hidden * max(0.0, layer_ep - layer_compute)
    # the last stage's MTP modules: a layer each, and the output layer and loss again with the
    # module's 2h x h projection (2h/V of the output layer's GEMM; 11% for DeepSeek-V3)
    mtp_s = mtp * (layer_compute + layer_tp + layer_cp + layer_ep + head * (1 + 2 * m.hidden / m.vocab))
    stage_mb, p2p, bubble = _pipeline(m.layers, t, p, c, dp, sequence_parallel, v, layers_max,
                                      layer_compute + layer_tp + layer_cp + layer_ep, head, msg, links, gpus_per_node,
                                      mtp_s)
    return layers_max, layer_tp, layer_cp, layer_ep, stage_mb, p2p, bubble, layer_host


@lru_cache(maxsize=1 << 14)
def _layer_costs(m, s: int, act_bytes: int, attention: str, op_sac: tuple | None, overlap: str,
                 stack: tuple[bool, bool, bool, bool], links: Links, gpus_per_node: int, t: int, c: int, b: int,
                 sequence_parallel: bool, recompute: str,
                 rc: float, ep: int = 1, modules: tuple[str, ...] = ()) -> tuple:
    """One layer's (compute, tensor-parallel, context-parallel, expert all-to-all) seconds for one
    micro-batch on one rank, the tensor-parallel message (bytes), the output layer with the loss
    (seconds) and what the experts' host launches add to the compute (seconds, in it).
    op_sac: (fused_qkv,) when "selective" is torchtitan's op-level SAC, else None; overlap: how the
    TP collectives run under the GEMMs (tp_overlap: "", "userbuffers" or "async-tp"); stack:
    (Transformer Engine, whose BF16 GEMMs reach links.te_gemm_efficiency where fitted;
    torch.compile, which fuses memory-bound kernels; the routed experts launched one by one from
    the host, caps.moe_expert_launches; the tokens dispatched by DeepEP's HybridEP or normal kernels,
    flex_backend)."""
    te, compiled, launches, hybridep = stack
    peak = links.peak_tflops * 1e12
    sp = sequence_parallel and t > 1
    tokens_rank = b * s / c  # tokens of one micro-batch on one rank
    h, f = m.hidden, m.ffn_hidden

    # Per layer, per micro-batch, on one rank.
    matrix_params = m.layer_params() - (2 * h if m.family == "llama" else 4 * h)
    fwd_gemm = 2 * matrix_params / t * tokens_rank
    # causal: half of 4·b·s²·h, split over t and c (less under a sliding window)
    fwd_attn = 2 * b * (s / c) * s * h / t * attention_share(m, s)
    passes_gemm = 3 + rc
    # selective reruns the attention core, unless the framework names other modules instead
    passes_attn = 3 + (1 if recompute == "selective" and (not modules or "core_attn" in modules) else rc)
    if op_sac is not None:
        # torchtitan's op-level SAC reruns every second matmul, not attention: wo and w3 with a
        # fused wqkv; wk, wo and w3 with separate projections
        a, g = m.heads, m.kv_heads
        rerun = h * h + h * f + (0 if op_sac[0] else h * h * g / a)
        passes_gemm = 3 + rerun / matrix_params
        passes_attn = 3
    ceiling = links.te_gemm_efficiency if te and links.te_gemm_efficiency else links.gemm_efficiency
    eff = gemm_efficiency(tokens_rank * h / t, ceiling)
    chunk = s / (2 * c) if c > 1 else s
    att_eff = ATTENTION_EFFICIENCY * chunk / (chunk + ATTENTION_SATURATION_TOKENS)
    # fp8/mxfp8/nvfp4 GEMMs at the format's rate; attention stays BF16
    gemm_rate = links.low_tflops * 1e12 * gemm_efficiency(tokens_rank * h / t, links.low_efficiency) \
        if links.low_tflops else peak * eff
    gemm_s = fwd_gemm * passes_gemm / gemm_rate
    layer_ep = 0.0
    if m.moe is not None:  # the routed experts (matrix_params has the rest: attention, router, shared experts)
        gemm_moe, layer_ep = _routed_experts(m, act_bytes, links, gpus_per_node, t, tokens_rank, passes_gemm, rc, ep,
                                             ceiling, hybridep)
        gemm_s += gemm_moe
    layer_compute = gemm_s + fwd_attn * passes_attn / (peak * att_eff)
    if "mla_up_proj" in modules:  # MLA's query and key/value up-projections run again before attention's backward
        x = m.mla
        up = 2 * tokens_rank * m.heads * (x.q_lora_rank * (x.qk_nope_head_dim + x.qk_rope_head_dim)
                                          + x.kv_lora_rank * (x.qk_nope_head_dim + x.v_head_dim)) / t
        layer_compute += up / gemm_rate
    # memory-bound kernels run again in a recomputed forward (a third of their forward+backward)
    # (a mixture of experts: its dense layers' MLP and its shared experts here; the routed copies'
    # kernels in _routed_experts)
    f_mem = f if m.moe is None else (1 - m.moe_layers / m.layers) * f + m.moe_layers / m.layers * \
        m.moe.shared_experts * (m.moe.shared_ffn or m.moe.expert_ffn)
    membound = (MEMBOUND_BYTES_H * h / (t if sp else 1) + MEMBOUND_BYTES_F * f_mem / t) * tokens_rank * (1 + rc / 3)
    if "moe_act" in modules:  # the routed copies' SwiGLU forward again (a third of its bytes, as above)
        x = m.moe
        membound += m.moe_layers / m.layers * x.top_k * tokens_rank / t * MEMBOUND_BYTES_F * x.expert_ffn / 3
    # the dense layers' MLP (mlp) and the shared experts (shared_experts) forward again: their
    # GEMMs and a third of their memory-bound bytes
    mats = 3 if m.family == "llama" else 2  # gate, up, down (SwiGLU) or fc1, fc2
    dense = (1 - m.moe_layers / m.layers if m.moe is not None else 1.0) if "mlp" in modules else 0.0
    if dense:
        layer_compute += dense * 2 * mats * h * f / t * tokens_rank / gemm_rate
        membound += dense * tokens_rank / t * MEMBOUND_BYTES_F * f / 3
    if "shared_experts" in modules and m.moe is not None and m.moe.shared_experts:
        fs = m.moe.shared_experts * (m.moe.shared_ffn or m.moe.expert_ffn)
        routed_share = m.moe_layers / m.layers
        layer_compute += routed_share * 2 * mats * h * fs / t * tokens_rank / gemm_rate
        membound += routed_share * tokens_rank / t * MEMBOUND_BYTES_F * fs / 3
    if compiled:  # inductor fuses the norms, RoPE, SwiGLU and residual adds: fewer round trips to HBM
        membound *= COMPILE_MEMBOUND_SHARE
    if attention == "eager":
        # the a·s² score matrix is written, soft-maxed, dropped out and read back (causal: half
        # of it counts); selective and full recompute rerun that forward
        scores = b * m.heads / t * (s / c) * s / 2
        membound += scores * (EAGER_SCORE_BYTES + (EAGER_SCORE_BYTES_FWD if passes_attn > 3 else 0))
    if links.low_cast_bytes:  # row-wise Float8: each linear's operands cast for its GEMMs
        qkv_out = h * (1 + 2 * m.kv_heads / m.heads)
        mlp_io = 3 * (h + f) if m.family == "llama" else 2 * (h + f)
        membound += links.low_cast_bytes * (h + qkv_out + 2 * h + mlp_io) / t * tokens_rank * (1 + rc / 3)
    layer_compute += membound / (links.mem_bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY)
    kernels = KERNELS_PER_LAYER * (COMPILE_MEMBOUND_SHARE if compiled else 1)
    host = kernels * (1 + rc / 3) * KERNEL_LAUNCH_S
    gpu_or_host = max(layer_compute, host)
    # a mixture of experts launched expert by expert: the host's layer against the GPU's (the
    # layer's sync keeps the host from running further ahead); layer_host: what that adds
    moe_host = _moe_host(m, ep, rc) if launches and m.moe is not None else 0.0
    layer_compute = max(layer_compute, host + moe_host)
    layer_host = layer_compute - gpu_or_host
    # Tensor parallelism: 2 collectives forward, 2 backward (+2 when the forward is recomputed),
    # each an all-reduce (or reduce-scatter + all-gather with SP: the same bytes).
    msg = act_bytes * tokens_rank * h
    n_coll = 4 + 2 * rc + 2 * dense  # a recomputed MLP gathers its input and reduces its output again
    tp_gbs = links.intra_node_gbs if t <= gpus_per_node else links.inter_node_gbs
    layer_tp = n_coll * _ring(t, msg, tp_gbs, INTRA_NODE_EFFICIENCY if t <= gpus_per_node else NETWORK_EFFICIENCY, 2,
                              _latency(tp_gbs, links))
    # overlapped: only what the GEMMs do not cover or the share the overlap cannot hide, and (for the
    # userbuffers) the SMs it takes
    if overlap == "userbuffers":
        layer_tp = max(TP_OVERLAP_EXPOSED * layer_tp, layer_tp - gemm_s) + TP_OVERLAP_SM_SHARE * min(layer_tp, gemm_s)
    elif overlap == "async-tp":
        layer_tp = max(ASYNC_TP_EXPOSED * layer_tp, layer_tp - gemm_s)
    # Context parallelism: each rank passes its K and V chunk around the ring (c−1 hops) in
    # forward and again in backward, overlapped with the attention it feeds.
    kv = 2 * act_bytes * tokens_rank * h * m.kv_heads / m.heads / t
    cp_link = links.intra_node_gbs if t * c <= gpus_per_node else links.inter_node_gbs
    cp_time = 3 * (c - 1) * (kv / (cp_link * 1e9 * NETWORK_EFFICIENCY) + _latency(cp_link, links)) if c > 1 else 0.0
    layer_cp = max(0.0, cp_time - fwd_attn * passes_attn / (peak * att_eff))
    # The last stage also runs the output layer and the loss (vocabulary-parallel over t).
    out_flops = 2 * tokens_rank * h * m.vocab / t * 3
    head = out_flops / (peak * eff) + \
        14 * tokens_rank * m.vocab / t / (links.mem_bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY)
    return layer_compute, layer_tp, layer_cp, layer_ep, msg, head, layer_host


def _routed_experts(m, act_bytes: int, links: Links, gpus_per_node: int, t: int, tokens_rank: float,
                    passes_gemm: float, rc: float, ep: int, ceiling: float,
                    hybridep: bool = False) -> tuple[float, float]:
    """One layer's routed experts on one rank, averaged over the layers (moe_layers / layers of
    them route): (their GEMM and memory-bound seconds, the token all-to-all seconds).

    Megatron-Core's alltoall dispatcher with expert tensor parallelism 1: the rank's tokens
    (split by TP under sequence parallelism) go to top_k experts each; the experts of the EP
    group get, on average (a balanced router), top_k·T·ep/E tokens each, run as grouped GEMMs at
    links.moe_efficiency (MOE_GEMM_EFFICIENCY) of the efficiency of a GEMM of that many rows (gemm_efficiency: small
    expert batches run below the ceiling). Each copy is permuted into expert order and back
    (MOE_PERMUTE_BYTES_H·h bytes moved, forward and backward) and its SwiGLU runs on expert_ffn
    (MEMBOUND_BYTES_F); the host's launches of the experts (MOE_HOST_S_PER_EXPERT) are weighed
    against the whole layer in _layer_costs. Dispatch and combine are two all-to-alls
    forward and two backward (two more with the forward recomputed), each moving the rank's
    top_k·T token copies: to the other ranks of the NVLink domain over NVLink, to the ranks
    beyond it over the network, at the same time (the slower one counts). With `hybridep`
    (DeepEP's kernels: HybridEP's dispatch and combine, or its normal ones between 8-GPU nodes) a
    token crosses to each other NVLink domain holding one of its experts once, to its peer GPU
    there, which fans it out over NVLink (hybridep_copies).
    Under Megatron-Core's --overlap-moe-expert-parallel-comm only what the paired micro-batch's
    compute does not cover counts (_pipeline_costs)."""
    x = m.moe
    share = m.moe_layers / m.layers
    tokens = tokens_rank / t  # this rank's tokens into the router
    copies = x.top_k * tokens
    per_expert = copies * ep / x.experts
    fwd = 2 * copies * 3 * m.hidden * x.expert_ffn  # flops of the copies this rank's tokens make
    eff = links.moe_efficiency * gemm_efficiency(per_expert * m.hidden,
                                                links.low_efficiency if links.low_tflops else ceiling)
    rate = (links.low_tflops if links.low_tflops else links.peak_tflops) * 1e12 * eff
    membound = copies * (MOE_PERMUTE_BYTES_H * m.hidden + MEMBOUND_BYTES_F * x.expert_ffn) * (1 + rc / 3)
    compute_s = share * (fwd * passes_gemm / rate + membound / (links.mem_bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY))
    if ep <= 1:
        return compute_s, 0.0
    local = min(ep, gpus_per_node)  # the EP group's ranks inside this rank's NVLink domain
    over_nvlink, over_network = dispatch_copies(x.experts, x.top_k, ep, local, hybridep)
    token_b = act_bytes * m.hidden * tokens  # the rank's tokens, once each
    inside = token_b * over_nvlink / (links.intra_node_gbs * 1e9 * INTRA_NODE_EFFICIENCY)
    beyond = token_b * over_network / (links.inter_node_gbs * 1e9 * NETWORK_EFFICIENCY)
    gbs = links.intra_node_gbs if ep <= gpus_per_node else links.inter_node_gbs
    one = max(inside, beyond) + _latency(gbs, links)
    return compute_s, share * (4 + 2 * rc) * one


def dispatch_copies(experts: int, top_k: int, ep: int, local: int, hybridep: bool = False) -> tuple[float, float]:
    """Per token of a rank, how many copies of it one dispatch moves over NVLink and over the
    network (as many back in its combine), its EP group of `ep` ranks with `local` of them in each
    NVLink domain, the router balanced: NCCL's all-to-all sends each of its top_k copies straight to
    its expert's rank, (local - 1)/ep of them inside the domain and (ep - local)/ep beyond it;
    DeepEP's kernels (HybridEP, or the normal ones) across domains, hybridep_copies."""
    if hybridep and ep > local:
        return hybridep_copies(experts, top_k, ep // local, local)
    return top_k * (local - 1) / ep, top_k * (ep - local) / ep


def hybridep_copies(experts: int, top_k: int, domains: int, local: int) -> tuple[float, float]:
    """Per token of a rank, how many copies of it HybridEP moves over NVLink and over the network
    in one dispatch (as many back in its combine, which reduces a domain's copies before they
    cross), its EP group spanning `domains` NVLink domains of `local` ranks each, the router
    balanced (each token's top_k experts distinct and uniformly placed).

    DeepEP docs/Hybrid-EP_Implementation.md (§8, "RDMA communication pattern"): a token goes over
    InfiniBand to its peer (the GPU of the same local rank) in each other domain that holds one
    of its experts, once, and that peer writes it to the domain's ranks whose experts it needs over
    NVLink; §4.2: the RDMA buffer holds one slot per token and remote domain. A domain holds
    experts/domains of the experts, so it is missed by all top_k with probability
    C(experts - experts/domains, top_k) / C(experts, top_k): the network carries
    (domains - 1)(1 - that) copies. Over NVLink: the token's copies for the other ranks of its own
    domain, and the peer's for the other ranks of each remote domain: top_k (local - 1)/local in
    all (a copy lands on any rank of its domain alike; the peer keeps 1/local of them)."""
    per_domain = experts // domains
    missed = 1.0
    for i in range(top_k):
        missed *= max(0, experts - per_domain - i) / (experts - i)
    return top_k * (local - 1) / local, (domains - 1) * (1 - missed)


def _moe_host(m, ep: int, rc: float) -> float:
    """One layer's host time launching its routed experts' work on one rank for one micro-batch,
    averaged over the layers (moe_layers / layers of them route): MOE_HOST_S_PER_EXPERT per local
    expert, a third more for a recomputed forward."""
    return m.moe_layers / m.layers * m.moe.experts / ep * MOE_HOST_S_PER_EXPERT * (1 + rc / 3)


def _expert_data_parallel(w: Workload, plan, links: Links, gpus_per_node: int, stage_mb: float,
                          experts: float) -> float:
    """The routed experts' gradient reduction over the expert data-parallel group (the ranks
    holding the same experts: tp·cp·dp/ep), overlapped with the backward like the dense
    gradients' (Megatron-Core keeps expert parameters in their own buffers and reduces them over
    that group); seconds per step not hidden."""
    n = plan.expert_dp
    if n <= 1:
        return 0.0
    grad_b = 4 if w.precision == "fp32" else 2 if w.grad_reduce_dtype == "bf16" else w.caps.reduce_bytes
    # the expert group's ranks: ep apart (expert tensor parallelism 1), so inside a node while
    # tp·cp·dp is
    gbs = ring_gbs(links, gpus_per_node, plan.ep, n)
    factor = 2 if plan.sharding == "none" else 1
    reduce = _ring(n, experts * grad_b, gbs, NETWORK_EFFICIENCY, factor)
    gather = _ring(n, experts * (4 if w.precision == "fp32" else 2), gbs, NETWORK_EFFICIENCY, 1) \
        if plan.sharding != "none" else 0.0
    return max(reduce * (1 - DP_OVERLAP), reduce - stage_mb * 2 / 3) + max(0.0, gather - stage_mb / 3)


def _pipeline(layers: int, t: int, p: int, c: int, dp: int, sequence_parallel: bool, v: int, layers_max: int,
              layer: float, head: float, msg: float, links: Links, gpus_per_node: int,
              last_extra: float = 0.0) -> tuple[float, float, float]:
    """(one micro-batch on the slowest stage, its point-to-point sends, the bubble), seconds;
    `last_extra`: what the last stage runs besides its layers and the output layer (MTP modules)."""
    stage_mb = layers_max * layer
    if p == 1:
        stage_mb += head + last_extra
    else:
        stage_mb = max(stage_mb, stage_layers(layers, p)[2] * layer + head + last_extra)
    # Pipeline point-to-point: activations forward and gradients backward per micro-batch and chunk.
    p2p = 0.0
    if p > 1:
        sp = sequence_parallel and t > 1
        link = links.intra_node_gbs if t * c * dp * p <= gpus_per_node else links.inter_node_gbs
        p2p = 2 * v * (msg / (t if sp else 1) / (link * 1e9 * NETWORK_EFFICIENCY) + _latency(link, links))
    bubble = (p - 1) / v * stage_mb if p > 1 else 0.0
    return stage_mb, p2p, bubble


def _data_parallel(w: Workload, plan: Plan, links: Links, gpus_per_node: int, stage_mb: float,
                   layers_max: int, trainable: float) -> float:
    """Data-parallel communication over the shard group (dp·cp ranks hold replicas of the same
    weights) that compute does not hide, seconds per step; `trainable`: parameters one rank of
    the largest stage trains."""
    micro = plan.grad_accum_steps
    n = plan.dp * plan.cp
    # bytes per gradient element reduced (Megatron's --grad-reduce-in-bf16 reduces its bf16 buffer)
    grad_b = 4 if w.precision == "fp32" else 2 if w.grad_reduce_dtype == "bf16" else w.caps.reduce_bytes
    # bytes per weight gathered (Megatron's --fp8-param-gather gathers the layers' FP8 weights;
    # accelerate's FP8 under FSDP2 its decoder layers' Float8 weights, the embedding and output
    # layer in 16-bit)
    param_b = 4 if w.precision == "fp32" else 1 if fp8_params(w, plan.sharding) else 2
    if fp8_gathered_layers(w, plan.sharding) and trainable:
        in_layers = min(trainable, layers_max * w.model.layer_params() / plan.tp)
        param_b = (in_layers + 2 * (trainable - in_layers)) / trainable
    dp_gbs = dp_link_gbs(plan, links, gpus_per_node)
    backward_last = stage_mb * 2 / 3
    if plan.sharding in ("zero3", "hsdp"):
        shard = plan.hsdp_shard or n
        gbs_shard = links.intra_node_gbs if plan.sharding == "hsdp" else dp_gbs
        # per layer: an all-gather forward, another backward, a reduce-scatter
        alpha = 3 * layers_max * ring_latency(gpus_per_node, plan.tp, shard)
        per_mb = _ring(shard, trainable * param_b, gbs_shard, NETWORK_EFFICIENCY, 2) + \
            _ring(shard, trainable * grad_b, gbs_shard, NETWORK_EFFICIENCY, 1) + alpha
        dp = micro * max(0.0, per_mb - stage_mb)  # prefetching overlaps it with the layers' compute
        if plan.pp > 1 and not w.caps.reshard_under_pp and plan.offload == "none":
            # FSDP under PP keeps the stage unsharded across micro-batches (memory.py): one
            # all-gather per step and one reduce-scatter after the last backward
            once = _ring(shard, trainable * param_b, gbs_shard, NETWORK_EFFICIENCY, 1) + \
                _ring(shard, trainable * grad_b, gbs_shard, NETWORK_EFFICIENCY, 1) + alpha * 2 / 3
            dp = max(0.0, once - stage_mb)
        if plan.sharding == "hsdp" and n > shard:
            # the replicas' all-reduce: ranks tp·shard apart
            replicas = ring_gbs(links, gpus_per_node, plan.tp * shard, n // shard)
            dp += (1 - DP_OVERLAP) * _ring(n // shard, trainable * grad_b / shard, replicas, NETWORK_EFFICIENCY, 2)
        return dp
    factor = 2 if plan.sharding == "none" else 1
    buckets = _buckets(w, plan, trainable, grad_b, layers_max)
    reduce = _ring(n, trainable * grad_b, dp_gbs, NETWORK_EFFICIENCY, factor,
                   buckets * ring_latency(gpus_per_node, plan.tp, n, allreduce=factor == 2))
    gather = _ring(n, trainable * param_b, dp_gbs, NETWORK_EFFICIENCY, 1,
                   buckets * ring_latency(gpus_per_node, plan.tp, n)) if plan.sharding != "none" else 0.0
    hidden = max(reduce * (1 - DP_OVERLAP), reduce - backward_last)  # under the (last) backward
    if w.caps.dp_schedule == "zero-engine":
        # DeepSpeed (caps.dp_schedule): without ZeRO the engine all-reduces after the backward;
        # ZeRO-1/2 reduce under it (overlap_comm, rendered), ZeRO-2 at every micro-batch, and both
        # gather the updated weights inside optimizer.step, before the next forward starts
        if plan.sharding == "none":
            return reduce
        return (micro if plan.sharding == "zero2" else 1) * hidden + gather
    return hidden + max(0.0, gather - stage_mb / 3)


def _optimizer_and_offload(w: Workload, plan: Plan, links: Links, trainable: float,
                           n: int | None = None) -> tuple[float, float]:
    """(the optimizer step, the offload transfers over PCIe), seconds per step; `n`: the ranks
    the optimizer states are sharded over (dp·cp; expert data parallelism for routed experts)."""
    n = plan.dp * plan.cp if n is None else n
    param_b = 4 if w.precision == "fp32" else 2
    shard_o = n if plan.sharding != "none" else 1
    opt_params = trainable / shard_o
    if plan.offload == "none":
        return opt_params * CPU_ADAM_BYTES_PER_PARAM / (links.mem_bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY), 0.0
    ranks = plan.gpus_per_node
    optimizer = opt_params * CPU_ADAM_BYTES_PER_PARAM * ranks / (HOST_MEMORY_GBS * 1e9)
    offload = 2 * opt_params * param_b / (links.pcie_gbs * 1e9 * PCIE_EFFICIENCY)
    if plan.offload == "optimizer+params":  # weights stream in for forward and backward
        micro = plan.grad_accum_steps
        offload += micro * 2 * trainable / (plan.hsdp_shard or n) * param_b / (links.pcie_gbs * 1e9 * PCIE_EFFICIENCY)
    return optimizer, offload


def stage_params_per_rank(w: Workload, plan: Plan) -> float:
    """Parameters one rank of the largest pipeline stage holds after TP (for DP traffic)."""
    m = w.model
    layers = stage_layers(m.layers, plan.pp)[1]
    extra = m.vocab * m.hidden / plan.tp if plan.pp == 1 else 0.0
    return layers * m.layer_params() / plan.tp + extra
