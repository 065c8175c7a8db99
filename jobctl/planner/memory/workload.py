"""What the memory model is given and what it answers: the workload as the planner sees it
(`Workload`, its `Overheads`), one term (`Term`) and the breakdown on a rank (`MemoryBreakdown`);
the named constants its terms use."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from jobctl import frameworks
from jobctl.frameworks import Framework
from jobctl.frameworks.base import LOW_PRECISIONS
from jobctl.planner.models import ModelSpec

GIB = 1 << 30


# DeepSpeed defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size 5e8 elements.
DEEPSPEED_REDUCE_BUCKET_ELEMS = 500_000_000


# bitsandbytes 8-bit blockwise optimizers: 2048-element blocks, one fp32 absmax per block.
BNB_BLOCK = 2048


# Bytes per weight of the low-precision copies Transformer Engine quantizes each GEMM weight into
# and keeps through the step (cached across micro-batches): a row-wise copy for the forward and a
# column-wise (transposed) one for the backward's data gradient, each with its scales
# (transformer_engine/pytorch/tensor: Float8Tensor one fp32 scale per tensor; MXFP8Tensor one
# E8M0 byte per 32 values; NVFP4Tensor 4-bit values with one E4M3 byte per 16).
LOW_PRECISION_WEIGHT_BYTES = {"fp8": 2 * 1.0, "mxfp8": 2 * (1 + 1 / 32), "nvfp4": 2 * (0.5 + 1 / 16)}
# QLoRA (Dettmers et al. 2023): NF4 weights (0.5 byte) with double-quantised constants:
# 8-bit absmax per 64 weights plus one fp32 per 256 such blocks = 0.5 + 1/64 + 4/(64·256).
QLORA_WEIGHT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class Overheads:
    """Named, configurable terms for what the GPU holds besides tensors (docs/memory-model.md §4)."""

    # CUDA context, kernels and cuBLAS workspace per process: typically 0.5-1 GiB on
    # Hopper with CUDA 12 lazy loading; measure as nvidia-smi used minus memory_reserved().
    cuda_context_gib: float = 0.75
    # NCCL buffers per communicator of size > 1 (NCCL_BUFFSIZE 4 MiB x channels x peers).
    nccl_gib: float = 0.25
    # Kept free under the GPU total so that a small misprediction is not an OOM.
    safety_margin_gib: float = 1.0
    # Caching-allocator fragmentation, as a fraction of the transient tensors (activations,
    # logits, buffers). expandable_segments:True (which jobctl sets) maps pages into one
    # segment and leaves far less slack than the default segment-per-size-class allocator.
    allocator_reserve_fraction: float | None = None
    expandable_segments: bool = True
    # Host side, per node: OS and page cache kept free; each rank's process (Python, CUDA
    # host allocations, dataloader workers).
    host_reserve_gib: float = 8.0
    host_per_process_gib: float = 3.0
    # Learned from an earlier CUDA OOM of this workload on this partition (planner/ladder.py,
    # Calibration): bytes the model missed, fixed plus per byte of activations and logits.
    learned_gap_bytes: int = 0
    learned_per_scaling: float = 0.0
    learned_from: str = ""

    @property
    def reserve_fraction(self) -> float:
        if self.allocator_reserve_fraction is not None:
            return self.allocator_reserve_fraction
        return 0.05 if self.expandable_segments else 0.15


@dataclass(frozen=True)
class Training:
    """What the recipe says of training beyond the layout: the steps, the learning-rate schedule,
    the optimizer's settings, the seed and the tokenizer. The frameworks' renderings put it in
    their own names; the memory and speed models do not read it."""

    steps: int | None = None
    lr: float | None = None
    min_lr: float | None = None
    warmup_steps: int | None = None
    schedule: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0: none
    seed: int = 1234
    tokenizer: str = "null"  # null | huggingface | sentencepiece | tiktoken
    tokenizer_path: str | None = None
    checkpoint_every: int | None = None  # steps between checkpoints (None: no periodic save rendered)


@dataclass(frozen=True)
class Workload:
    """What is trained, independent of where: the planner's view of a recipe."""

    model: ModelSpec
    seq_len: int
    global_batch_size: int
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"
    method: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    attention: str = "flash"
    fused_cross_entropy: bool | str = False  # True, False or "te" (train.fused_cross_entropy)
    framework: Framework = field(default_factory=lambda: frameworks.get("custom"))
    overheads: Overheads = field(default_factory=Overheads)
    training: Training = field(default_factory=Training)
    device: str = "gpu"  # "cpu": a CPU partition (gloo, no CUDA context; frameworks' CPU paths)
    fp8_recipe: str = "tensorwise"  # the scaling of precision fp8 (config/schema.py Fp8Recipe)
    grad_reduce: str = "fp32"  # fp32 | bf16 | auto: Megatron's main-grad buffer and gradient reduction
    formats: tuple[str, ...] = ()  # the low-precision formats the partition's GPU runs (catalog)
    compile: bool | str = False  # torch.compile of the model: True, False or "auto" (train.compile)
    cuda_graphs: bool | str = "auto"  # the step as one CUDA graph where the framework does it (train.cuda_graphs)
    ep_overlap: bool | str = "auto"  # "auto": the EP all-to-alls overlapped where the framework does it; False: not
    moe_dispatcher: str = "alltoall"  # alltoall | hybridep | deepep (train.moe_dispatcher; frameworks.flex_backend)
    # GPUs one NVLink domain joins on the partition (a GB200 NVL72 rack: 72); 0: a node. Read by
    # the terms whose size depends on what crosses the network (HybridEP's inter-node slots)
    nvlink_gpus: int = 0
    # the submodules "selective" recomputes where the framework names them (train.recompute_modules;
    # frameworks.recompute_modules): () lets jobctl choose
    recompute_modules: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.framework, Framework):  # a name: its table
            object.__setattr__(self, "framework", frameworks.get(self.framework))

    # The derived values below are read tens of thousands of times per search: each is computed
    # once per workload (cached_property writes the instance's __dict__, which a frozen dataclass
    # allows; equality and the hash read the fields only).
    @cached_property
    def caps(self) -> frameworks.Capabilities:
        return self.framework.caps

    @cached_property
    def mtp_layers(self) -> int:
        """The multi-token-prediction modules trained with the model: the model's where the
        framework builds them (caps.mtp), else none."""
        return self.model.mtp_layers if self.caps.mtp else 0

    def __hash__(self) -> int:  # hashed on every cache lookup of the search: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    @cached_property
    def grad_reduce_dtype(self) -> str:
        """fp32 or bf16: train.grad_reduce, with auto resolved (bf16 where Megatron renders
        --grad-reduce-in-bf16 under --bf16: the bf16 and low-precision recipes)."""
        if self.grad_reduce != "auto":
            return self.grad_reduce
        bf16 = self.precision == "bf16-mixed" or self.precision in LOW_PRECISION_WEIGHT_BYTES
        return "bf16" if bf16 and self.caps.state_recipe is frameworks.StateRecipe.MEGATRON else "fp32"

    @cached_property
    def compiled(self) -> bool:
        """torch.compile is on: asked for, or auto where the framework renders and models it, on GPUs."""
        # auto: on GPUs only (a CPU partition's gloo runs have neither inductor's GPU kernels nor async TP)
        return self.caps.compiles and (self.compile is True or (self.compile == "auto" and self.device == "gpu"))

    @cached_property
    def act_bytes(self) -> int:
        """Bytes per activation element: 16-bit under every recipe but fp32."""
        return 4 if self.precision == "fp32" else 2


def tp_overlap(w: Workload, plan) -> str:
    """How the plan's tensor-parallel collectives run under its GEMMs ("" where they do not):
    "userbuffers" (Megatron's --tp-comm-overlap, Transformer Engine's userbuffers) or "async-tp"
    (torchtitan's async TP under torch.compile: torch's micro-pipelined symmetric-memory
    collectives). Both need sequence-parallel reduce-scatters and all-gathers (Megatron-LM
    validate_args: the overlap needs --sequence-parallel; torchtitan CompileConfig)."""
    if not (plan.sequence_parallel and plan.tp > 1):
        return ""
    if w.caps.tp_comm_overlap:
        return "userbuffers"
    return "async-tp" if w.caps.async_tp and w.compiled else ""


def low_precision_format(precision: str, fp8_recipe: str | None, backend: str = "transformer-engine") -> str:
    """The GEMM format a precision runs in: its name under Transformer Engine; under torchao's
    Float8Linear and MXFP8Linear "fp8-rowwise" (torchtitan's row-wise scaling), else the precision
    with "-torchao" (accelerate's eager tensor-wise Float8, torchtitan's MXFP8), whose efficiency,
    casts and memory are their own."""
    if backend != "torchao" or precision not in LOW_PRECISIONS:
        return precision
    return "fp8-rowwise" if precision == "fp8" and fp8_recipe == "rowwise" else f"{precision}-torchao"


def low_weight_bytes(w: Workload) -> float:
    """Bytes per layer weight of its low-precision copies (0: none): row-wise and transposed,
    except per-tensor FP8 on Blackwell, whose FP8 GEMMs take every layout, so Transformer Engine
    makes no transposed copy (pytorch/utils.py is_non_tn_fp8_gemm_supported: compute
    capability 10.x; the GPUs whose formats include nvfp4 here). torchao keeps none: Float8Linear
    and MXFP8Linear cast the 16-bit weight at each GEMM and save the 16-bit input and weight for
    backward (float8/float8_linear.py matmul_with_hp_or_float8_args, prototype/moe_training/
    mxfp8_linear.py mx_mm), so their memory is BF16's (but for the FP8 all-gather under FSDP2:
    fp8_gathered_layers)."""
    if w.caps.fp8_backend == "torchao":
        return 0.0
    low = LOW_PRECISION_WEIGHT_BYTES.get(w.precision, 0.0)
    return low / 2 if w.precision == "fp8" and "nvfp4" in w.formats else low


def fp8_gathered_layers(w: Workload, sharding: str) -> bool:
    """FSDP2 all-gathers the decoder layers' Float8 weights in one byte (caps.fsdp_float8_all_gather:
    torchao's WeightWithDynamicFloat8CastTensor casts the shard before the all-gather,
    float8/fsdp_utils.py fsdp_pre_all_gather); the embedding, the output layer and the norms
    stay 16-bit."""
    return (w.caps.fsdp_float8_all_gather and w.precision == "fp8" and w.method == "full"
            and sharding in ("zero3", "hsdp"))


def gathered_layer_bytes(w: Workload, sharding: str) -> float:
    """Bytes per element of a decoder layer's weights as FSDP all-gathers them."""
    return 1.0 if fp8_gathered_layers(w, sharding) else float(_compute_bytes(w))


def fp8_params(w: Workload, sharding: str) -> bool:
    """The layers' weights live in FP8 only (frameworks.fp8_param_gather)."""
    return frameworks.fp8_param_gather(w.caps, w.precision, w.fp8_recipe, sharding)


# Bytes per element of an activation a Transformer Engine GEMM saves for its backward under a
# low-precision recipe: the quantised copy of its input the weight-gradient GEMM reads (one
# usage, with its scales: 1/32 E8M0 byte per MXFP8 value, 1/16 E4M3 byte per NVFP4 value).
LOW_PRECISION_SAVED_BYTES = {"fp8": 1.0, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16}


# Transformer Engine's userbuffers for --tp-comm-overlap (module/base.py initialize_ub): one
# registered buffer of Megatron's (seq·micro-batch/cp, hidden) per overlapped GEMM (4 ring
# exchanges, 2 pipelined reduce-scatters, 4 bulk overlaps), the 6 all-gather ones in one byte
# under an FP8 recipe; and the cuBLAS workspace repeated for its 3 streams (32 MiB each on Hopper
# and later, of which one is counted with the CUDA context).
UB_BUFFERS = 10
UB_FP8_BUFFERS = 6
UB_EXTRA_WORKSPACE_BYTES = 2 * 32 * 2**20


class Term(NamedTuple):
    name: str
    bytes: float
    group: str  # weights | grads | optimizer | activations | logits | buffers | overhead | host
    formula: str


class MemoryBreakdown(NamedTuple):
    """Bytes on the most loaded rank, by group, plus every term with its formula. (An immutable
    value like the planner's dataclasses; a named tuple because a search makes thousands, and
    _replace gives the same bytes against another GPU's usable memory.)"""

    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    buffers_bytes: int
    overhead_bytes: int
    total_bytes: int
    gpu_usable_bytes: int
    host_bytes_per_node: int
    host_usable_bytes: int
    stage: str  # which pipeline stage is the most loaded: "first", "last" or "only"
    terms: tuple[Term, ...] = ()
    overlap_bytes: int = 0  # (<= 0) terms that are never held together (FSDP2's phases)

    @property
    def tensor_bytes(self) -> int:
        """The tensors' bytes: the total less the overheads (CUDA context, NCCL buffers, the
        allocator's reserve, what was learned from an OOM), which no tensor holds; what
        torch.cuda.max_memory_allocated or a trace of live tensors measures."""
        return self.total_bytes - self.overhead_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.total_bytes <= self.gpu_usable_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes_per_node <= self.host_usable_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    def to_dict(self) -> dict:
        keys = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
                "buffers_bytes", "overhead_bytes", "total_bytes", "gpu_usable_bytes", "host_bytes_per_node")
        out = {k: int(getattr(self, k)) for k in keys}
        out["overlap_bytes"] = int(self.overlap_bytes)
        out["host_usable_bytes"] = int(self.host_usable_bytes)
        out["stage"] = self.stage
        out["terms"] = [{"name": t.name, "group": t.group, "bytes": int(t.bytes), "formula": t.formula}
                        for t in self.terms]
        return out


def _collector():
    """A list of (name, bytes, group, formula) items and the `add` that appends to it."""
    items: list = []

    def add(name, value, group, formula):
        items.append((name, value, group, formula))

    return items, add


def _compute_bytes(w: Workload) -> int:
    return 4 if w.precision == "fp32" else 2
