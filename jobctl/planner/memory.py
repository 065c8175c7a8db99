"""The memory model: bytes on the most loaded rank, term by term, each with its source.

See docs/memory-model.md. Notation: s sequence, b micro-batch, h hidden,
a heads, g KV heads, f FFN hidden, L layers, V vocabulary, t tp, p pp, c cp, N shard group.
Every term is a named field of `MemoryBreakdown`; nothing is multiplied by an unnamed
factor. Defaults of the overhead terms live in `Overheads` and can be overridden by a
recipe or an inventory (`memory:` block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from jobctl import frameworks
from jobctl.frameworks import Framework, GradBuffer, Selective, StateRecipe
from jobctl.planner.models import ModelSpec, padded_vocab
from jobctl.planner.plan import Plan

GIB = 1 << 30

# What each framework runs and keeps (fused kernels, state recipe, vocabulary padding, gradient
# buffers, what "selective" recomputes) is its capability table in jobctl.frameworks.

# DeepSpeed defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size 5e8 elements.
DEEPSPEED_REDUCE_BUCKET_ELEMS = 500_000_000
# bitsandbytes 8-bit blockwise optimizers: 2048-element blocks, one fp32 absmax per block.
BNB_BLOCK = 2048
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
    fused_cross_entropy: bool = False
    framework: Framework = field(default_factory=lambda: frameworks.get("custom"))
    overheads: Overheads = field(default_factory=Overheads)

    def __post_init__(self):
        if not isinstance(self.framework, Framework):  # a name: its table
            object.__setattr__(self, "framework", frameworks.get(self.framework))

    @property
    def caps(self) -> frameworks.Capabilities:
        return self.framework.caps

    def __hash__(self) -> int:  # hashed on every cache lookup of the search: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element: 16-bit under every recipe but fp32."""
        return 4 if self.precision == "fp32" else 2


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


# --- model states ---------------------------------------------------------------------------

@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state under a precision recipe (docs/memory-model.md §2)."""

    weight: float
    grad: float
    master: float  # fp32 master copy kept by the optimizer (0 when params are fp32 already)
    state_elem: float  # bytes of one optimizer-state element
    label: str


@lru_cache(maxsize=None)
def state_bytes(framework: str | Framework, precision: str, optimizer: str) -> StateBytes:
    """The precision recipe of a framework.

    mixed (bf16/fp16), ZeRO paper & DeepSpeed: 2 (16-bit weights) + 2 (16-bit grads) + 4 (fp32
      master) + fp32 states: 16 bytes with Adam (Rajbhandari et al. 2020, §3.1, K = 12).
    mixed, Megatron-LM: fp32 main grads (accumulate_allreduce_grads_in_fp32): 2 + 4 + 4 + states.
    mixed, FSDP/torchtitan: fp32 sharded parameters are the master copy; 16-bit copies exist only
      for gathered layers (counted as buffers); fp32 gradients (reduce_dtype float32): 4 + 4 + states.
    pure bf16: 2 + 2 + 16-bit states; fp32: 4 + 4 + fp32 states.
    """
    st = 1.0 if optimizer == "adam8bit" else None
    if precision == "fp32":
        return StateBytes(4, 4, 0, st or 4, "fp32: 4 B weights + 4 B grads + fp32 optimizer states")
    if precision == "bf16-pure":
        return StateBytes(2, 2, 0, st or 2, "pure bf16: 2 B weights + 2 B grads + bf16 optimizer states")
    recipe = frameworks.get(framework).caps.state_recipe
    if recipe is StateRecipe.FP32_PARAMS:
        return StateBytes(4, 4, 0, st or 4, "FSDP mixed: fp32 sharded params + fp32 grads + fp32 states")
    if recipe is StateRecipe.MEGATRON:
        return StateBytes(2, 4, 4, st or 4, "Megatron mixed: 2 B weights + 4 B fp32 main grads + 4 B master + fp32 states")
    return StateBytes(2, 2, 4, st or 4, "mixed: 2 B weights + 2 B grads + 4 B fp32 master + fp32 states (ZeRO paper)")


def optimizer_state_elements(optimizer: str, matrices: list[tuple[float, float, float]]) -> float:
    """Optimizer-state elements for parameters given as (rows, cols, count) matrices.

    Vectors are (n, 1). AdamW: m and v. Lion (Chen et al. 2023) and SGD with momentum: one
    buffer. Adam-mini (Zhang et al. 2024): m plus one v per block; we take one v per output
    row, an upper bound. Adafactor (Shazeer & Stern 2018; torch.optim.Adafactor): no first
    moment, the second moment factored into rows + cols per matrix, full for vectors.
    """
    n = sum(r * c * k for r, c, k in matrices)
    if optimizer in ("adamw", "adam8bit"):
        return 2.0 * n
    if optimizer in ("lion", "sgd-momentum"):
        return float(n)
    if optimizer == "sgd":
        return 0.0
    if optimizer == "adam-mini":
        return n + sum(r * k for r, c, k in matrices)
    if optimizer == "adafactor":
        return float(sum(((r + c) if c > 1 else r) * k for r, c, k in matrices))
    raise ValueError(f"unknown optimizer {optimizer!r}")


def model_state_terms(params: float, state_elems: float, sb: StateBytes, optimizer: str, sharding: str, n: int,
                      offload: str, compute_b: int, weight_name: str = "weights", detail: bool = True,
                      grads_stay: bool = False) -> list[Term]:
    """The model-state terms as a list (see add_model_states)."""
    out: list[Term] = []

    def add(name, value, group, formula):
        out.append(Term(name, float(value), group, formula() if detail else ""))

    add_model_states(add, params, state_elems, sb, optimizer, sharding, n, offload, compute_b, weight_name, grads_stay)
    return out


def add_model_states(add, params: float, state_elems: float, sb: StateBytes, optimizer: str, sharding: str, n: int,
                     offload: str, compute_b: int, weight_name: str = "weights", grads_stay: bool = False) -> None:
    """Weights, gradients and optimizer states of `params` trainable parameters on one rank.

    ZeRO (Rajbhandari et al. 2020, §5) over a shard group of n ranks: stage 1 divides the
    optimizer states (and fp32 master) by n, stage 2 also the gradients, stage 3 / FSDP
    also the weights. Offload (ZeRO-Offload, Ren et al. 2021): the fp32 master, optimizer
    states and fp32 gradients live in host RAM, the GPU keeps 16-bit gradients only in a
    reduce bucket; with parameters offloaded too (ZeRO-Infinity) the weights also move.
    Host bytes come back as terms of group "host". grads_stay: the framework keeps its gradient
    buffer on the GPU and copies it to the host for the step (Megatron's --optimizer-cpu-offload).
    """
    shard_w = n if sharding in ("zero3", "hsdp") else 1
    shard_g = n if sharding in ("zero2", "zero3", "hsdp") else 1
    shard_o = n if sharding != "none" else 1
    weights = params * sb.weight / shard_w
    grads = params * sb.grad / shard_g
    master = params * sb.master / shard_o
    states = state_elems * sb.state_elem / shard_o
    if optimizer == "adam8bit":  # one fp32 absmax per 2048-element block, for m and for v
        states += 2 * (params / BNB_BLOCK) * 4 / shard_o
    def sharded(k):
        return f" / {k} (sharded)" if k > 1 else ""

    def opt_formula():  # the arithmetic first (the plan's one-line view shows it), then what it counts
        k = state_elems / max(params, 1)
        per = (f"{sb.master:g} B master + " if sb.master else "") + f"{k:.3g} x {sb.state_elem:g} B"
        over = f" / {shard_o}" if shard_o > 1 else ""
        return (f"{params:.4g} params x ({per}){over}; "
                + ("the fp32 master copy and " if sb.master else "")
                + f"{k:.3g} optimizer state elements per parameter"
                + (f", sharded over {shard_o} ranks" if shard_o > 1 else "") + f"; {sb.label}")

    params_off = offload == "optimizer+params"
    add(weight_name, 0.0 if params_off else weights, "weights",
        lambda: f"{params:.4g} params x {sb.weight:g} B" + sharded(shard_w) + ("; offloaded to CPU" if params_off else ""))
    if params_off:
        add("offloaded weights", weights, "host", lambda: "")
    if offload in ("optimizer", "optimizer+params") and grads_stay:
        add("gradients", grads, "grads", lambda: f"{params:.4g} params x {sb.grad:g} B" + sharded(shard_g)
            + "; the gradient buffer stays on the GPU")
        add("optimizer states", 0, "optimizer", lambda: opt_formula() + "; offloaded to CPU")
        add("offloaded states", master + states + params * 4 / shard_o, "host", lambda: "")
    elif offload in ("optimizer", "optimizer+params"):
        bucket = min(grads, DEEPSPEED_REDUCE_BUCKET_ELEMS * compute_b)
        add("gradients", bucket, "grads",
            lambda: f"offloaded; GPU keeps a reduce bucket of min(grads, 5e8 elements x {compute_b} B)")
        add("optimizer states", 0, "optimizer", lambda: opt_formula() + "; offloaded to CPU")
        add("offloaded states", master + states + params * 4 / shard_g, "host", lambda: "")
    else:
        add("gradients", grads, "grads", lambda: f"{params:.4g} params x {sb.grad:g} B" + sharded(shard_g))
        add("optimizer states", master + states, "optimizer", opt_formula)


def lora_params_per_layer(model: ModelSpec, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable LoRA parameters of one layer: r·(in + out) per targeted matrix (Hu et al. 2021)."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    shapes = {
        "q": (h, model.heads * d), "k": (h, model.kv_heads * d), "v": (h, model.kv_heads * d),
        "o": (model.heads * d, h), "gate": (h, f), "up": (h, f), "down": (f, h),
        "fc1": (h, f), "fc2": (f, h), "qkv": (h, (model.heads + 2 * model.kv_heads) * d),
    }
    return sum(rank * (i + o) for t, (i, o) in shapes.items() if t in targets and _has(model, t))


def _has(model: ModelSpec, target: str) -> bool:
    if model.family == "llama":
        return target in ("q", "k", "v", "o", "gate", "up", "down")
    return target in ("qkv", "o", "fc1", "fc2")


# --- activations ------------------------------------------------------------------------------

def layer_activation_terms(w: Workload, plan: Plan, b: int) -> list[tuple[str, float, str]]:
    """Bytes one transformer layer saves for backward, per term, for micro-batch b on one rank.

    GPT layers follow Korthikanti et al. 2022 (§4.1): s·b·h·(34 + 5·a·s/h) with 16-bit
    activations and dropout; tensor parallelism divides the 24·sbh and 5·as²b parts by t,
    sequence parallelism also the remaining 10·sbh. Llama layers are derived the same way
    from what their backward keeps (see tests/torch_reference.py for the measurement):
    RMSNorm inputs (+ fp32 copies in eager PyTorch), the QKV input, Q/K/V after RoPE,
    the attention output and its fp32 log-sum-exp, the SwiGLU gate, SiLU, up and product.
    FlashAttention/SDPA keep O(s) state instead of the a·s² scores. Totals (16-bit, t = 1):
      llama, eager (HF-style):  24·sbh + 8·sbf + 8·sb + 4·asb
      llama, fused kernels:     (12 + 4g/a)·sbh + 8·sbf + 8·sb + 4·asb  (6·sbf with TE's LayerNormMLP)
      gpt, eager with dropout:  34·sbh + 5·as²b (+ LayerNorm statistics)
    """
    m = w.model
    t, c = plan.tp, plan.cp
    sp = plan.sequence_parallel and t > 1
    s = w.seq_len / c  # context parallelism splits the sequence (Megatron-LM CP)
    h, f, a, g = m.hidden, m.ffn_hidden, m.heads, m.kv_heads
    e = w.act_bytes
    sbh = s * b * h
    rep = t if sp else 1  # divisor of the parts that TP alone leaves replicated
    # what the column-parallel matmuls keep: the shard (Megatron gathers it again in backward)
    # or the all-gathered whole sequence (torchtitan's DTensor plan; caps.sp_keeps_gathered_input)
    mm_rep = 1 if w.caps.sp_keeps_gathered_input else rep
    eager_attn = w.attention == "eager"
    core_recomputed = plan.recompute == "selective"  # Korthikanti: recompute the attention core
    dropout = m.dropout > 0
    terms: list[tuple[str, float, str]] = []

    def add(name, value, formula):
        terms.append((name, value, formula))

    if plan.recompute == "selective" and w.caps.selective is Selective.OP_SAC:
        return _op_sac_terms(w, plan, b)
    if m.family == "gpt":
        add("layernorm inputs", 2 * e * sbh / rep + 2 * 8 * s * b / rep, "2 LayerNorms: 2·sbh (16-bit) + fp32 mean/rstd 8·sb each")
        add("qkv input", e * sbh / mm_rep, "LayerNorm output kept by the QKV matmul: 2·sbh")
        add("q, k, v", e * sbh * (a + 2 * g) / a / t, "Q, K, V: 2·sbh·(a+2g)/a /t")
        if eager_attn and not core_recomputed:
            probs = e * a * s * s * b / t
            add("attention scores", probs + (a * s * s * b / t) * (1 if dropout else 0) + (probs if dropout else 0),
                "softmax output 2·as²b, dropout mask as²b and output 2·as²b (with dropout) /t")
        elif not eager_attn:
            add("attention lse", 4 * a * s * b / t, "FlashAttention keeps fp32 log-sum-exp: 4·asb /t")
        add("attention output", e * sbh / t, "context kept by the output projection: 2·sbh /t")
        if dropout:
            add("dropout masks", 2 * sbh / rep, "masks after attention and MLP: 1 byte each, 2·sbh")
        add("mlp input", e * sbh / mm_rep, "LayerNorm output kept by fc1: 2·sbh")
        add("mlp intermediates", 2 * e * s * b * f / t, "GELU input and output: 2 · 2·sbf /t (f=4h: 16·sbh)")
        return terms

    fused = w.caps.fused_kernels
    if fused:
        add("rmsnorm inputs", 2 * e * sbh / rep + 2 * 4 * s * b / rep, "fused RMSNorm keeps input + fp32 rstd: 2 · (2·sbh + 4·sb)")
    else:
        add("rmsnorm inputs", 2 * (4 * sbh + e * sbh) / rep + 2 * 4 * s * b / rep,
            "eager (HF-style) RMSNorm keeps an fp32 copy (4·sbh), the normalised 16-bit tensor (2·sbh) and rstd (4·sb), twice")
    add("qkv input", e * sbh / mm_rep, "RMSNorm output kept by the Q/K/V matmuls: 2·sbh"
        + (" (all-gathered: not /t under SP)" if mm_rep != rep else ""))
    # eager repeat_kv copies K and V up to a heads; fused kernels (and HF's SDPA path, which
    # hands grouped K/V to the kernel: caps.sdpa_gqa) keep them at g heads
    grouped = fused or (w.caps.sdpa_gqa and not eager_attn)
    kv = (2 * g / a) if grouped else 2.0
    add("q, k, v", e * sbh * (1 + kv) / t,
        "Q after RoPE 2·sbh, K and V 2·sbh·g/a each /t" if grouped else "Q after RoPE, repeat_kv copies of K and V: 3 · 2·sbh /t")
    if eager_attn and not core_recomputed:
        # softmax(dtype=float32).to(q.dtype): a copy only when training in 16-bit
        add("attention scores", (4 + (e if e != 4 else 0)) * a * s * s * b / t,
            "eager softmax in fp32 (4·as²b) and its 16-bit copy (2·as²b) /t")
    elif not eager_attn:
        add("attention lse", 4 * a * s * b / t, "FlashAttention keeps fp32 log-sum-exp: 4·asb /t")
    # SDPA/flash return a transposed view of a [b, s, a, d] buffer, so o_proj keeps the same
    # storage (measured: no copy even after .contiguous() on the transposed view).
    add("attention output", e * sbh / t, "attention output, shared with o_proj's input: 2·sbh /t")
    add("mlp input", e * sbh / mm_rep, "RMSNorm output kept by gate/up: 2·sbh"
        + (" (all-gathered: not /t under SP)" if mm_rep != rep else ""))
    if w.caps.te_layernorm_mlp:
        # TransformerEngine's LayerNormMLP saves fc1's output (gate and up, 2 · 2·sbf) and the
        # SwiGLU output (2·sbf), recomputing SiLU in backward (layernorm_mlp.py, save_for_backward).
        add("mlp intermediates", 3 * e * s * b * f / t, "TE LayerNormMLP: fc1 output (gate, up) and SwiGLU output: 3 · 2·sbf /t")
    else:
        add("mlp intermediates", 4 * e * s * b * f / t, "SwiGLU gate, SiLU, up and product: 4 · 2·sbf /t")
    return terms


def _op_sac_terms(w: Workload, plan: Plan, b: int) -> list[tuple[str, float, str]]:
    """What torchtitan's op-level selective AC keeps of a Llama block (activation_checkpoint.py,
    the default save list and "recompute every second mm"): the block input (the checkpoint's
    own input), the outputs of every odd matmul in forward order (fused wqkv, w1, w2 with
    torchtitan's `wqkv`; wq, wv, w1, w2 with separate projections), the attention kernel's output
    and log-sum-exp, and under TP + SP the two reduce-scatter outputs. Norms, RoPE, SiLU and
    products are recomputed."""
    m = w.model
    t, c = plan.tp, plan.cp
    sp = plan.sequence_parallel and t > 1
    s = w.seq_len / c
    h, f, a, g = m.hidden, m.ffn_hidden, m.heads, m.kv_heads
    e = w.act_bytes
    sbh = s * b * h
    rep = t if sp else 1
    out = [("block input", e * sbh / rep, "the checkpointed block's input: 2·sbh (/t with SP)")]
    if w.caps.fused_qkv:  # wqkv(1) saved, wo(2) recomputed, w1(3) saved, w3(4) recomputed, w2(5) saved
        out.append(("wqkv output", e * sbh * (a + 2 * g) / a / t, "1st mm (wqkv) saved: 2·sbh·(a+2g)/a /t"))
    else:
        out += [("wq output", e * sbh / t, "1st mm (wq) saved: 2·sbh /t"),
                ("wv output", e * sbh * g / a / t, "3rd mm (wv) saved: 2·sbh·g/a /t")]
    w1 = "3rd" if w.caps.fused_qkv else "5th"
    w2 = "5th" if w.caps.fused_qkv else "7th"
    out += [
        ("attention output", e * sbh / t, "attention kernel output saved: 2·sbh /t"),
        ("attention lse", 4 * a * s * b / t, "its fp32 log-sum-exp: 4·asb /t"),
        ("w1 output", e * s * b * f / t, f"{w1} mm (w1, the SiLU input) saved: 2·sbf /t"),
        ("w2 output", e * sbh, f"{w2} mm (w2) saved: 2·sbh (a partial sum before the TP reduction)"),
    ]
    if sp:
        out.append(("reduce-scatter outputs", 2 * e * sbh / t, "wo and w2 reduce-scatter outputs (SP): 2 · 2·sbh /t"))
    return out


def layer_activation_bytes(w: Workload, plan: Plan, b: int) -> float:
    return _layer_bytes(w, plan.tp, plan.cp, plan.sequence_parallel, plan.recompute, b)


@lru_cache(maxsize=4096)
def _layer_bytes(w: Workload, tp: int, cp: int, sp: bool, recompute: str, b: int) -> float:
    """Cached sum of layer_activation_terms (the search asks for the same layer many times)."""
    plan = Plan(1, 1, tp, 1, 1, cp, "none", b, 1, b, recompute, "none", sp)
    return sum(v for _, v, _ in layer_activation_terms(w, plan, b))


def stored_layer_bytes(w: Workload, plan: Plan, b: int) -> float:
    """What one layer keeps between forward and backward under the recompute policy."""
    if plan.recompute == "full":
        # Only the layer input is checkpointed (Korthikanti §4.2: 2·sbh, /t with SP).
        rep = plan.tp if plan.sequence_parallel and plan.tp > 1 else 1
        return w.act_bytes * (w.seq_len / plan.cp) * b * w.model.hidden / rep
    return layer_activation_bytes(w, plan, b)


def pipeline_in_flight(plan: Plan, stage: str) -> float:
    """Micro-batches of a stage's activations held at once (in units of the whole stage).

    1F1B: stage r holds min(m, p − r) micro-batches (the first p, the second p − 1, the last 1).
    Interleaved (v chunks of L/(p·v) layers): Megatron's rank r runs (p − r − 1)·2 + (v − 1)·p
    chunk forwards before its first backward and holds one more, of m·v in all
    (Megatron-Core pipeline_parallel/schedules.py; torchtitan's Interleaved1F1B is the same:
    torch distributed/pipelining/schedules.py _get_warmup_ops, p micro-batches per round); in
    stages that is ((p − r − 1)·2 + (v − 1)·p + 1)/v:
    p·(1 + (p − 1)/(p·v)) on the first (Korthikanti et al. 2022 §4.2.3) and ((v − 1)·p + 1)/v
    on the last, where 1F1B holds one."""
    p, v, m = plan.pp, plan.virtual_stages, plan.grad_accum_steps
    if p == 1:
        return 1.0
    r = {"first": 0, "middle": 1, "last": p - 1}.get(stage, 0)
    if v <= 1:
        return float(min(m, p - r))
    chunks = min((p - r - 1) * 2 + (v - 1) * p + 1, m * v)
    return chunks / v


def recomputed_layers(plan: Plan, layers: float) -> float:
    """Layers of a stage whose forward is recomputed: all under full recompute unless
    plan.recompute_layers limits it (block recompute); none otherwise."""
    if plan.recompute != "full":
        return 0
    if plan.recompute_layers and plan.recompute_layers < layers:
        return plan.recompute_layers
    return layers


def logits_bytes_per_elem(w: Workload, tp: int = 1, pp: int = 1) -> float:
    """Peak bytes per logit element around the loss (docs/memory-model.md §3).

    Unfused: the 16-bit logits (2), their fp32 log-softmax kept for backward (4), and in
    backward the incoming fp32 gradient (4) and the produced one (4): 14 bytes.
    Fused/chunked cross-entropy computes the gradient in place: the 16-bit logits only.
    fp32 training: 4 + 4 + 4 + 4. A training loop that drops the logits once the loss is
    computed (torchtitan's `del pred`; caps.keeps_logits_through_loss) keeps only the 12
    fp32 bytes: what benchmarks/trace_memory.py traces at the loss backward. Under tensor
    parallelism a framework's vocabulary-parallel loss may hold more per local logit
    (caps.loss_parallel_logit_bytes: torchtitan's 16, traced at 70B with TP 8). Under pipeline
    parallelism no loop drops them: torch's PipelineStage keeps each micro-batch's output (on
    the last stage, the logits) in its forward cache until that micro-batch's backward
    (distributed/pipelining/stage.py forward_one_chunk), traced on torchtitan's last stage: +2 B.
    """
    return _loss_bytes(w, tp, pp)[0]


def _loss_bytes(w: Workload, tp: int, pp: int = 1) -> tuple[float, str]:
    """Bytes per logit element at the loss's peak, and what they are made of (one decision for
    both, so the --explain label cannot drift from the number)."""
    # under PP the pipeline stage keeps its output (the logits) for the backward: no `del pred`
    kept = "; the pipeline stage keeps the 16-bit logits for its backward" if pp > 1 else ""
    if w.fused_cross_entropy and w.caps.fused_cross_entropy_logit_bytes:
        return (w.caps.fused_cross_entropy_logit_bytes,
                "the framework's fused cross-entropy, compiled: fp32 softmax, fp32 gradient and its 16-bit cast")
    if w.fused_cross_entropy:
        return float(w.act_bytes), "fused cross-entropy"
    if w.caps.in_place_cross_entropy:  # Megatron: the 16-bit logits and one fp32 copy
        return (w.act_bytes if w.act_bytes < 4 else 0) + 4.0, "16-bit logits + one fp32 copy, worked in place"
    if tp > 1 and w.caps.loss_parallel_logit_bytes:
        return (w.caps.loss_parallel_logit_bytes + (w.act_bytes if pp > 1 else 0),
                "loss parallel: fp32 log-probs, and in backward zeros, exp and their sum" + kept)
    if not w.caps.keeps_logits_through_loss and pp == 1:
        return 12.0, "fp32 log-probs and two fp32 gradients; the loop drops the 16-bit logits"
    return w.act_bytes + 12.0, "16-bit logits, fp32 log-probs and two fp32 gradients" + (
        kept if not w.caps.keeps_logits_through_loss else "")


# --- the breakdown ------------------------------------------------------------------------------

def stage_layers(layers: int, pp: int, counts_ends: bool = False) -> tuple[int, int, int] | None:
    """Layers on the (first, a middle, the last) pipeline stage, or None if pp cannot split them.

    Even splits, or the first and/or last stage one layer short to make room for the
    embedding and the output layer (Megatron-LM --decoder-first/last-pipeline-num-layers;
    the Llama 3 paper §3.3.2 does this for 126 layers on 16 stages).

    counts_ends (torchtitan's default split, distributed/pipeline_parallel.py
    _generate_llm_fqn_per_model_part): the embedding and the output layer count as one layer
    each, the L + 2 are spread over the stages with the remainder on the first ones; the
    middle stage reported is the second (the one pipeline_in_flight calls "middle").
    """
    if pp == 1:
        return layers, layers, layers
    if counts_ends:
        per, extra = divmod(layers + 2, pp)
        if per < 1:
            return None
        first, last = per + (extra > 0) - 1, per + (extra > pp - 1) - 1
        middle = per + (extra > 1) if pp > 2 else last  # the second stage
        return first, middle, last
    if pp > layers:
        return None
    if layers % pp == 0:
        k = layers // pp
        return k, k, k
    if (layers + 1) % pp == 0:
        k = (layers + 1) // pp
        return k, k, k - 1
    if (layers + 2) % pp == 0 and pp > 2:
        k = (layers + 2) // pp
        return k - 1, k, k - 1
    return None


def framework_vocab(w: Workload, tp: int) -> int:
    """The vocabulary as the framework allocates it: Megatron pads it to a multiple of 128·tp
    (--make-vocab-size-divisible-by, tokenizer.py _vocab_size_with_padding)."""
    k = w.caps.vocab_multiple_per_tp
    return padded_vocab(w.model.vocab, k * tp) if k > 1 else w.model.vocab


def _stage_params(w: Workload, plan: Plan, stage: str) -> tuple[float, float, float]:
    """(layer params, embedding+output params, layers) held by one rank of `stage`, after TP."""
    return _stage_params_cached(w, plan.tp, plan.pp, stage)


@lru_cache(maxsize=4096)
def _stage_params_cached(w: Workload, tp: int, pp: int, stage: str) -> tuple[float, float, float]:
    m = w.model
    vocab = framework_vocab(w, tp)
    first, middle, last = stage_layers(m.layers, pp, w.caps.pp_split_counts_ends)
    layers = {"only": m.layers, "first": first, "middle": middle, "last": last}[stage]
    layer_p = layers * m.layer_params() / tp
    emb = vocab * m.hidden / tp + m.max_seq_len * m.hidden
    out = vocab * m.hidden / tp
    if stage == "only":
        extra = emb + (0 if m.tied_embeddings else out) + m.final_norm_params()
    elif stage == "first":
        extra = emb
    elif stage == "middle":
        extra = 0.0
    else:  # last: the output layer (a copy of the embedding when tied, as Megatron-LM does)
        extra = out + m.final_norm_params()
    return layer_p, extra, layers


def _stage_matrices(w: Workload, plan: Plan, stage: str) -> list[tuple[float, float, float]]:
    """(rows, cols, count) of the weights one rank of `stage` holds (rows split by TP)."""
    m = w.model
    vocab = framework_vocab(w, plan.tp)
    _, _, layers = _stage_params(w, plan, stage)
    out = [(r / plan.tp if c > 1 else r, c, layers) for r, c in m.layer_matrices()]
    if stage in ("first", "only"):
        out.append((vocab / plan.tp, m.hidden, 1))
        if m.max_seq_len:
            out.append((m.max_seq_len, m.hidden, 1))
    if stage == "last" or (stage == "only" and not m.tied_embeddings):
        out.append((vocab / plan.tp, m.hidden, 1))
    if stage in ("last", "only"):
        out.append((m.hidden, 1, m.final_norm_params() // m.hidden))
    return out


@lru_cache(maxsize=4096)
def _stage_state_elements(w: Workload, tp: int, pp: int, stage: str) -> float:
    plan = Plan(1, 1, tp, pp, 1, 1, "none", 1, 1, 1, "none", "none", False)
    return optimizer_state_elements(w.optimizer, _stage_matrices(w, plan, stage))


def estimate(w: Workload, gpu_memory_bytes: int, plan: Plan, host_mem_bytes: int | None = None,
             detail: bool = True) -> MemoryBreakdown:
    """Memory of the most loaded rank of `plan` (the max over first and last pipeline stage).

    detail=False skips formatting the formulas (the search evaluates many layouts)."""
    stages = ("only",) if plan.pp == 1 else ("first", "middle", "last") if plan.pp > 2 else ("first", "last")
    best = None
    for st in stages:
        groups, terms = _stage_groups(w, plan, st, detail)
        g = groups  # the GPU groups in _GPU_GROUPS' order, summed as sum() would (the same bits)
        total = int(0 + g["weights"] + g["grads"] + g["optimizer"] + g["activations"] + g["logits"] + g["buffers"]
                    + g["overlap"] + g["overhead"])
        if best is None or total > best[0]:
            best = (total, st, groups, terms)
    return _breakdown(w, plan, best[1], best[2], best[3], gpu_memory_bytes, host_mem_bytes)


# the caching allocator's terms under FSDP2 (_fsdp2_allocator_terms), by name
FSDP2_ALLOCATOR_TERMS = ("cached gradients (reduce-scatter stream)", "cached all-gather buffers",
                         "fresh reduce-scatter input after the schedule", "freed 16-bit logits block",
                         "cached blocks in use at the peak")


def _fsdp2_allocator_terms(add, w: Workload, plan: Plan, stage: str, groups: dict, phases, transient: float,
                           compute_b: int) -> None:
    """What PyTorch's caching allocator keeps reserved beyond the tensors at their peak, under FSDP2.

    From replaying every allocation of torchtitan's own training steps (traced on fake tensors)
    through a model of c10/cuda/CUDACachingAllocator.cpp (benchmarks/caching_allocator.py,
    trace_memory.py --allocator; docs/memory-accuracy.md, "Reserved memory"). A freed block stays
    cached in the pool of the stream it was allocated on, and FSDP2 allocates on three:
      * its reduce-scatter stream makes the sharded gradients (the reduce-scatter outputs), which
        zero_grad(set_to_none) frees before the next step's activation peak: their blocks stay
        reserved on that stream, where the default stream cannot reuse them;
      * its all-gather copy-in stream makes the flat all-gather buffers, the current unit's and
        the prefetched one's: cached there through the activation peak;
      * on the default stream, where the training loop drops the 16-bit logits once the loss is
        computed (torchtitan), their freed block is a hole the loss's backward cannot use: it
        asks for fp32 blocks twice their size (transformers' loop keeps the logits: no hole).
    If the end of backward is the tensors' peak, that much of the above is already in use."""
    m, o = w.model, w.overheads
    grads = groups["grads"] if phases else 0.0  # without the phases the gradients are counted as held
    if grads:
        add("cached gradients (reduce-scatter stream)", grads, "overhead", lambda:
            "the sharded gradients, freed by zero_grad before the activation peak, stay cached on "
            "FSDP2's reduce-scatter stream")
    # FSDP units on this rank (16-bit when gathered): the decoder layers and the root's: torchtitan
    # wraps the embedding and the output layer apart, accelerate keeps both in its root unit
    layer = m.layer_params() / plan.tp * compute_b
    vocab_unit = framework_vocab(w, plan.tp) * m.hidden / plan.tp * compute_b
    if stage == "only":
        roots = [2 * vocab_unit] if w.caps.fsdp_root_holds_embeddings and not m.tied_embeddings else (
            [vocab_unit] * (1 if m.tied_embeddings else 2))
    else:
        roots = [vocab_unit] if stage in ("first", "last") else []
    largest, second = sorted([*roots, layer, layer], reverse=True)[:2]
    ag = largest + second
    add("cached all-gather buffers", ag, "overhead", lambda:
        f"the flat all-gather buffers of the two largest units ({largest / GIB:.3g} + {second / GIB:.3g} GiB, "
        "current and prefetched) cached on FSDP2's all-gather copy-in stream")
    fresh = 0.0
    if plan.pp > 1 and phases:
        # under PP, FSDP2 reduces after the schedule, unit by unit, into an fp32 reduce-scatter
        # input on the default stream; the activations' freed blocks there are cut up by the
        # accumulated gradients (allocated during the first backward, between them) and the
        # largest unit's input takes fresh memory (traced: 8B PP 4 first stage, 1.96 GiB)
        acc_b = max(w.caps.reduce_bytes, compute_b)
        fresh = largest / compute_b * acc_b
        add("fresh reduce-scatter input after the schedule", fresh, "overhead", lambda:
            f"the largest unit's fp32 reduce-scatter input ({fresh / GIB:.3g} GiB) does not fit the freed "
            "activations' blocks")
    hole = 0.0
    if (stage in ("last", "only") and not w.caps.keeps_logits_through_loss and not w.fused_cross_entropy
            and not w.caps.in_place_cross_entropy):
        elems = (w.seq_len / plan.cp) * plan.micro_batch_size * framework_vocab(w, plan.tp) / plan.tp
        hole = elems * w.act_bytes
        add("freed 16-bit logits block", hole, "overhead", lambda:
            f"{elems:.4g} logits x {w.act_bytes:g} B: freed by the loss's fp32 upcast, too small for the "
            "fp32 blocks its backward asks for")
    cached = grads + ag + fresh + hole
    if phases and phases[1] > phases[0]:
        used = min(cached, phases[1] - phases[0])
        add("cached blocks in use at the peak", -used, "overhead", lambda:
            f"the tensors peak at the end of backward, {used / GIB:.3g} GiB above the activation phase: "
            "that much of the cached blocks is in use there")
    # without expandable segments, segments of different size classes never merge: more slack
    # (simulated at 8B and 70B: -3.5 .. +5.6 GiB over expandable segments; 5% of transient tensors)
    frac = o.allocator_reserve_fraction if o.allocator_reserve_fraction is not None else (
        0.0 if o.expandable_segments else 0.05)
    if frac:
        add("allocator reserve", transient * frac, "overhead", lambda:
            f"{frac:.0%} of transient tensors ({'as configured' if o.allocator_reserve_fraction is not None else 'default allocator'})")


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

    def apply(items):
        if not detail:
            for _, value, group, _ in items:
                groups[group] += value
            return
        for name, value, group, formula in items:
            groups[group] += value
            if group != "host":
                terms.append(Term(name, float(value), group, formula()))

    def add(name, value, group, formula):  # formula: a callable, formatted only when detail
        groups[group] += value
        if detail and group != "host":
            terms.append(Term(name, float(value), group, formula()))

    tp, pp, cp, sp, b = plan.tp, plan.pp, plan.cp, plan.sequence_parallel, plan.micro_batch_size
    in_flight = pipeline_in_flight(plan, stage)
    apply(_state_items(w, tp, pp, stage, plan.sharding, plan.shard_group, plan.offload))
    buffers, fsdp_pp = _framework_buffer_items(w, tp, pp, stage, plan.sharding, plan.offload, plan.dp * cp > 1)
    apply(buffers)
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


def _collector():
    """A list of (name, bytes, group, formula) items and the `add` that appends to it."""
    items: list = []

    def add(name, value, group, formula):
        items.append((name, value, group, formula))

    return items, add


def _compute_bytes(w: Workload) -> int:
    return 4 if w.precision == "fp32" else 2


@lru_cache(maxsize=1 << 12)
def _state_items(w: Workload, tp: int, pp: int, stage: str, sharding: str, n: int, offload: str) -> tuple:
    """Weights, gradients and optimizer states (of the LoRA adapters and the frozen base under
    LoRA/QLoRA) on one rank of `stage`, sharded over n ranks (docs/memory-model.md §2)."""
    items, add = _collector()
    m = w.model
    sb = state_bytes(w.framework, w.precision, w.optimizer)
    layer_p, extra_p, layers = _stage_params_cached(w, tp, pp, stage)
    rank_params = layer_p + extra_p
    compute_b = _compute_bytes(w)
    if w.method == "full":
        trainable = rank_params
        state_elems = _stage_state_elements(w, tp, pp, stage)
        weight_name = "weights"
    else:
        base_b = float(compute_b)
        frozen_layers = layer_p * (QLORA_WEIGHT_BYTES if w.method == "qlora" else base_b)
        add("frozen base weights", frozen_layers + extra_p * base_b, "weights", lambda:
            f"{layer_p:.4g} layer params x {QLORA_WEIGHT_BYTES if w.method == 'qlora' else base_b:.4g} B "
            f"({'NF4, QLoRA' if w.method == 'qlora' else 'frozen 16-bit'}) + {extra_p:.4g} embedding/output x {base_b:g} B")
        trainable = layers * lora_params_per_layer(m, w.lora_rank, w.lora_targets) / tp
        # LoRA adapters are thin matrices; factored optimizers gain nothing: count as vectors.
        state_elems = optimizer_state_elements(w.optimizer, [(trainable, 1, 1)])
        weight_name = "lora adapters"
    add_model_states(add, trainable, state_elems, sb, w.optimizer, sharding, n, offload, compute_b, weight_name,
                     w.caps.offload_keeps_grads)
    return tuple(items)


class _FsdpUnderPP(NamedTuple):
    """What the phases of FSDP2 under pipeline parallelism read of the buffer terms."""

    stage_bytes: float  # the stage kept unsharded: weights + accumulated gradients
    layer_unit: float  # parameters of one decoder layer on this rank
    root_unit: float  # parameters of the stage's root unit (embedding or output layer)
    acc_b: int  # bytes per accumulated gradient element


@lru_cache(maxsize=1 << 12)
def _framework_buffer_items(w: Workload, tp: int, pp: int, stage: str, sharding: str, offload: str,
                            data_parallel: bool) -> tuple[tuple, _FsdpUnderPP | None]:
    """The buffers a framework keeps beside the model states (FSDP2's unsharded stage under PP,
    gathered layers, DDP buckets, DeepSpeed's reduce bucket), and what FSDP2-under-PP's phases
    read of them (None unless that is the case)."""
    items, add = _collector()
    m = w.model
    sb = state_bytes(w.framework, w.precision, w.optimizer)
    layer_p, extra_p, _ = _stage_params_cached(w, tp, pp, stage)
    rank_params = layer_p + extra_p
    trainable = rank_params  # the buffers below are for full training only
    compute_b = _compute_bytes(w)
    fsdp_pp = None
    unsharded_stage = (sharding in ("zero3", "hsdp") and pp > 1 and not w.caps.reshard_under_pp
                       and w.method == "full" and offload == "none")
    if unsharded_stage:
        # FSDP2 under pipeline parallelism (torchtitan): parameters stay unsharded from the first
        # micro-batch's forward to the last one's backward (reshard_after_forward False under PP,
        # torchtitan distributed/fsdp.py get_fsdp_reshard_after_forward_policy), and gradients
        # accumulate unsharded, upcast to the fp32 reduce dtype, until the last backward
        # (torch distributed/pipelining/stage.py backward_maybe_with_nosync:
        # set_requires_gradient_sync(False); fsdp _fsdp_param.py to_accumulated_grad_if_needed)
        acc_b = max(w.caps.reduce_bytes, compute_b)
        stage_bytes = rank_params * (compute_b + acc_b)
        add("unsharded stage (FSDP under PP)", stage_bytes, "buffers", lambda:
            f"{rank_params:.4g} stage params kept whole: {compute_b} B weights + {acc_b} B accumulated gradients")
        # FSDP units: the decoder layers and the stage's root (the embedding on the first stage,
        # the output layer on the last). A layer's backward makes its 16-bit gradient before it is
        # added to the accumulated one, while the micro-batches in flight hold their activations.
        # The root's comes last in a micro-batch's backward, once that micro-batch's activations
        # are freed (first stage), or after the logits are (last stage), so it is not added; nor
        # the layers' on the last stage, whose peak is at the loss (traced, first and last stage).
        layer_unit = m.layer_params() / tp
        root_unit = framework_vocab(w, tp) * m.hidden / tp if stage in ("first", "last") else 0.0
        if stage != "last":
            add("gradient before accumulation", layer_unit * compute_b, "buffers", lambda:
                f"one layer's {compute_b}-B gradient, made in its backward before it joins the accumulated one")
        fsdp_pp = _FsdpUnderPP(stage_bytes, layer_unit, root_unit, acc_b)
    elif sharding in ("zero3", "hsdp") or offload == "optimizer+params":
        unit = max(m.layer_params(), m.vocab * m.hidden) / tp
        add("gathered weights", unit * (2 * compute_b + compute_b + sb.grad), "buffers", lambda:
            "ZeRO-3/FSDP: largest unit (layer or V·h) gathered twice (current + prefetch) in 16-bit, "
            "plus its unsharded gradient before reduce-scatter")
    elif data_parallel and w.method == "full" and offload == "none":
        if w.caps.grad_buffer is GradBuffer.DDP_BUCKETS and sharding == "none":
            add("ddp buckets", trainable * sb.grad, "buffers", lambda:
                "DDP copies gradients into flat buckets (gradient_as_bucket_view=False, the default)")
        elif w.caps.grad_buffer is GradBuffer.REDUCE_BUCKET and sharding == "none":
            add("reduce bucket", min(trainable, DEEPSPEED_REDUCE_BUCKET_ELEMS) * sb.grad, "buffers", lambda:
                "DeepSpeed without ZeRO: gradients flattened into all-reduce buckets of up to 5e8 elements")
    if (w.caps.grad_buffer is GradBuffer.REDUCE_BUCKET and w.method == "full" and offload == "none"
            and sharding != "none"):
        # DeepSpeed's ZeRO (contiguous_gradients, the default) allocates its gradient bucket at
        # reduce_bucket_size elements whatever the model's size: at every backward for stages 1
        # and 2 (stage_1_and_2.py setup_buckets), once at start for stage 3 (stage3.py); measured
        # on CPU with DeepSpeed's own engine (benchmarks/deepspeed_memory.py): 1.0e9 bytes in bf16
        # for a 1.9M-parameter model, at 1 and 2 ranks
        add("reduce bucket", DEEPSPEED_REDUCE_BUCKET_ELEMS * compute_b, "buffers", lambda:
            f"DeepSpeed reduce_bucket_size: 5e8 elements x {compute_b} B, allocated whatever the model's size")
    return tuple(items), fsdp_pp


@lru_cache(maxsize=1 << 14)
def _activation_items(w: Workload, tp: int, cp: int, sp: bool, recompute: str, recompute_layers: int, b: int,
                      pp: int, in_flight: float, stage: str) -> tuple[tuple, float, float]:
    """The layers' activations kept for backward on `stage` with `in_flight` micro-batches, and
    the layer a recomputing backward rematerialises; also (activations, working set) in bytes."""
    items, add = _collector()
    plan = Plan(1, 1, tp, pp, 1, cp, "none", b, 1, b, recompute, "none", sp, 1, 0, recompute_layers)
    layers = _stage_params_cached(w, tp, pp, stage)[2]
    # Megatron-LM --recompute-method block --recompute-num-layers N: only N layers of each
    # stage are recomputed (plan.recompute_layers; 0 = all of them).
    per_layer = stored_layer_bytes(w, plan, b)
    n_rc = recomputed_layers(plan, layers)
    if recompute == "full" and n_rc < layers:
        kept = layer_activation_bytes(w, plan, b)
        acts = (per_layer * n_rc + kept * (layers - n_rc)) * in_flight
    else:
        kept = per_layer
        acts = per_layer * layers * in_flight

    def label():
        if recompute == "full":
            return (f"{n_rc:g} of {layers:g} layers recomputed keep only their input (2·sbh), the others "
                    f"{kept / GIB:.3g} GiB each")
        return "; ".join(f"{n_} {v / GIB:.3g}" for n_, v, _ in layer_activation_terms(w, plan, b))
    add("layer activations", acts, "activations", lambda:
        f"{per_layer / GIB:.3g} GiB/layer x {layers:g} layers x {in_flight:g} in flight; the micro-batches whose "
        f"activations the schedule holds at once [{label()}]")
    # One layer's activations are rematerialised during its backward. On the stage that computes
    # the loss that happens after the logits and their gradients are freed (the output layer's
    # backward runs first): the two peaks never coexist, only the excess counts (the torchtitan
    # 8B trace, docs/memory-accuracy.md: counting both put activations+logits 9.2% high under
    # full AC and 2.8% under op-level SAC).
    working_set = 0.0
    if recompute == "full":
        working_set = layer_activation_bytes(w, plan, b)
    elif recompute == "selective" and w.caps.selective is Selective.OP_SAC:
        working_set = _layer_bytes(w, tp, cp, sp, "none", b)
    if working_set and stage not in ("last", "only"):
        add("recompute working set", working_set, "activations", lambda:
            "one layer's activations rematerialised during its backward")
    return tuple(items), acts, working_set


@lru_cache(maxsize=1 << 14)
def _pipeline_items(w: Workload, tp: int, cp: int, sp: bool, b: int, pp: int, v: int, m: int, stage: str,
                    in_flight: float) -> tuple[tuple, float]:
    """torch's PipelineStage receive buffers and GPT's embedding dropout mask; also the receive
    buffers' bytes."""
    items, add = _collector()
    # one stage-boundary tensor's elements on this rank: s·b·h, split by cp and, under SP, by tp
    sbh_local = (w.seq_len / cp) * b * w.model.hidden / (tp if sp else 1)
    recv = 0.0
    if pp > 1 and w.caps.pp_stage_recv_buffers:
        # torch's PipelineStage (distributed/pipelining/stage.py _setup_forward_recv_info,
        # _setup_backward_recv_info) allocates, for each of the m micro-batches, a buffer for every
        # boundary tensor the stage receives (activations unless it is the first stage, gradients
        # unless it is the last; per model chunk when interleaved) and keeps them through the step.
        # A micro-batch in flight holds its received input as its first layer's saved input,
        # already counted above; the rest are extra (traced: 31 x 32 MiB on 405B's last stage).
        boundary = sbh_local * w.act_bytes
        first, last = stage == "first", stage == "last"
        n_recv = (v - first) + (v - last)
        chunks = in_flight * v  # chunk forwards in flight on this rank
        held_inputs = (v - 1) * pp if first else chunks  # in-flight inputs that arrived as received buffers
        n_buf = max(0.0, m * n_recv - min(held_inputs, m * (v - first)))
        recv = n_buf * boundary
        add("pipeline receive buffers", recv, "buffers", lambda:
            f"{n_buf:g} x {boundary / GIB:.3g} GiB: a buffer per micro-batch for each received activation and gradient "
            f"(torch PipelineStage), less the inputs of the micro-batches in flight")
    if w.model.family == "gpt" and w.model.dropout > 0 and stage in ("first", "only"):
        add("embedding dropout mask", sbh_local * in_flight, "activations",
            lambda: "dropout mask on the embeddings: sbh bytes")
    return tuple(items), recv


@lru_cache(maxsize=1 << 14)
def _head_items(w: Workload, tp: int, cp: int, sp: bool, b: int, pp: int, stage: str, working_set: float) -> tuple:
    """The final norm and output layer's kept inputs, the logits and the loss, and what a
    recomputed layer's backward adds beyond their peak (the stage that computes the loss)."""
    items, add = _collector()
    m = w.model
    vocab = framework_vocab(w, tp)
    elems = (w.seq_len / cp) * b * vocab / tp
    per, loss_label = _loss_bytes(w, tp, pp)
    # The final norm keeps what a layer's norm keeps and the output layer its input:
    # measured 8·sbh (eager) / 4·sbh (fused, GPT) in 16-bit (tests/torch_reference.py).
    # Measured: the norm's input and output (2·e·sbh); eager RMSNorm also keeps an fp32
    # copy (4·sbh) — in fp32 training the input itself is that copy, still 4·sbh.
    rep = tp if sp and tp > 1 else 1
    e_ = w.act_bytes
    per_token = 2 * e_ if (m.family == "gpt" or w.caps.fused_kernels) else 4 + 2 * e_
    sbh_head = (w.seq_len / cp) * b * m.hidden
    head_in = sbh_head * per_token / rep
    if w.caps.sp_keeps_gathered_input and rep > 1:
        # the output layer keeps its all-gathered input (e·sbh) instead of the shard
        head_in += e_ * sbh_head * (1 - 1 / rep)
    add("final norm and output input", head_in, "activations",
        lambda: "final norm input and output kept for the output layer's backward: 4·sbh (8·sbh eager)")
    add("logits and loss", elems * per, "logits", lambda:
        f"s·b·V/t = {elems:.4g} logits x {per:g} B ({loss_label})")
    excess = max(0.0, working_set - elems * per)
    if working_set:
        add("recompute working set", excess, "activations", lambda:
            f"one layer rematerialised in its backward, {working_set / GIB:.3g} GiB, after the logits are "
            f"freed: {excess / GIB:.3g} GiB beyond their peak")
    return tuple(items)


def _phases(add, w: Workload, plan: Plan, stage: str, groups: dict, acts: float, working_set: float,
            fsdp_pp: _FsdpUnderPP | None, recv: float):
    """FSDP2's phases that never coexist, as one (negative) "never held together" term; returns
    (activation phase, end-of-backward phase) when they are counted, else None."""
    m = w.model
    compute_b = _compute_bytes(w)

    def add_phases(at_acts, at_end, summed, describe):
        """Two phases of a step that never coexist: count the larger instead of their sum (term
        "never held together"); describe(True when the activation phase is the peak)."""
        overlap = max(at_acts, at_end) - summed
        if overlap < 0:
            add("never held together", overlap, "overlap", lambda: describe(at_acts >= at_end))

    # FSDP2 frees the sharded gradients every step (zero_grad(set_to_none=True)) and rebuilds
    # them block by block in backward, so the sum of maxima overstates the peak: at the
    # activation peak (the loss's backward) no gradient exists and only the output layer is
    # gathered; at the end of backward the gradients and the gathered buffers exist and the
    # activations are gone (the torchtitan traces, docs/memory-accuracy.md: totals +5% to +37%
    # over the traced peak without this). Only for one micro-batch per step without pipelining:
    # with accumulation the gradients of the earlier micro-batches are held.
    if (w.caps.frees_grads_each_step and plan.sharding in ("zero3", "hsdp") and plan.pp == 1
            and plan.grad_accum_steps == 1 and w.method == "full" and plan.offload == "none"):
        head_unit = framework_vocab(w, plan.tp) * m.hidden / plan.tp * compute_b  # the output layer, gathered
        at_acts = groups["activations"] + groups["logits"] + min(groups["buffers"], head_unit)
        if w.caps.fsdp_root_holds_embeddings:
            # accelerate's root unit (embedding + output layer) stays gathered from forward to the
            # end of backward (FSDP2 does not reshard the root after forward). At the loss one
            # decoder layer is prefetched; in the last block's backward that block is gathered,
            # the next one prefetched, the block rematerialised and its unsharded gradient built
            # before the reduce-scatter (traced at 405B: root + 2 layers + a layer's gradient)
            root = head_unit * (1 if m.tied_embeddings else 2)
            layer_gathered = m.layer_params() / plan.tp * compute_b
            at_loss = groups["activations"] + groups["logits"] + root + layer_gathered
            at_block = acts + working_set + root + 3 * layer_gathered
            at_acts = max(at_loss, at_block)
        at_end = groups["grads"] + groups["buffers"]
        summed = groups["activations"] + groups["logits"] + groups["grads"] + groups["buffers"]
        add_phases(at_acts, at_end, summed, lambda which: (
            f"FSDP2 frees gradients each step: at the activation peak activations + logits + the output "
            f"layer gathered ({at_acts / GIB:.3g} GiB), at the end of backward gradients + gathered "
            f"buffers ({at_end / GIB:.3g} GiB); the peak is the {'activation peak' if which else 'end of backward'}"))
        return at_acts, at_end
    if w.caps.frees_grads_each_step and fsdp_pp is not None:
        # The same under pipeline parallelism, with other phases (torchtitan's first and last
        # stages traced, benchmarks/trace_memory.py --pp): during the schedule the stage is
        # unsharded, its gradients accumulate unsharded and no sharded gradient exists; they are
        # reduced after the last micro-batch's backward, when the activations are gone, unit by
        # unit: a unit frees its gathered 16-bit weights, copies its accumulated gradients into
        # an fp32 reduce-scatter input and receives its shard. The largest unit bounds that phase.
        acc_b, n = fsdp_pp.acc_b, plan.shard_group
        reduce = max(fsdp_pp.layer_unit, fsdp_pp.root_unit) * (acc_b + acc_b / n - compute_b)
        at_acts = groups["activations"] + groups["logits"] + groups["buffers"]
        at_end = fsdp_pp.stage_bytes + recv + reduce
        add_phases(at_acts, at_end, at_acts + groups["grads"], lambda which: (
            f"FSDP2 under PP makes sharded gradients only after the schedule: during it activations + "
            f"unsharded stage ({at_acts / GIB:.3g} GiB), after it the stage + one unit's reduce-scatter "
            f"({at_end / GIB:.3g} GiB); the peak is the {'schedule' if which else 'gradient reduction after it'}"))
        return at_acts, at_end
    return None


def _overheads(add, w: Workload, plan: Plan, stage: str, groups: dict, phases) -> None:
    """What the GPU holds besides tensors (docs/memory-model.md §4): the CUDA context, NCCL's
    buffers, the caching allocator's share and what an earlier OOM taught."""
    o = w.overheads
    transient = groups["activations"] + groups["logits"] + groups["buffers"]
    add("cuda context", o.cuda_context_gib * GIB, "overhead", lambda: "CUDA context, kernels, cuBLAS workspace")
    comms = (plan.tp > 1) + (plan.pp > 1) + (plan.dp * plan.cp > 1)
    if comms:
        add("nccl buffers", comms * o.nccl_gib * GIB, "overhead", lambda: f"{comms} communicator(s) x {o.nccl_gib:g} GiB")
    if w.caps.frees_grads_each_step and plan.sharding in ("zero3", "hsdp") and plan.offload == "none":
        _fsdp2_allocator_terms(add, w, plan, stage, groups, phases, transient, _compute_bytes(w))
    else:
        add("allocator reserve", transient * o.reserve_fraction, "overhead", lambda:
            f"{o.reserve_fraction:.0%} of transient tensors ({'expandable_segments' if o.expandable_segments else 'default allocator'})")
    if o.learned_gap_bytes or o.learned_per_scaling:
        scaling = groups["activations"] + groups["logits"]
        add("learned from an OOM", o.learned_gap_bytes + o.learned_per_scaling * scaling, "overhead", lambda:
            f"{o.learned_from}: {o.learned_gap_bytes / GIB:.2f} GiB + {o.learned_per_scaling:.3g} x activations and "
            "logits the model missed")
