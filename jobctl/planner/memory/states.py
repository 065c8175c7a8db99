"""Model states: weights, gradients and optimizer states of the parameters a rank holds, sharded
by ZeRO/FSDP or offloaded to the host (docs/memory-model.md, "Model states")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from jobctl import frameworks
from jobctl.frameworks import Framework, StateRecipe
from jobctl.planner.memory.stages import _stage_matrices, _stage_params_cached
from jobctl.planner.memory.workload import (
    BNB_BLOCK,
    DEEPSPEED_REDUCE_BUCKET_ELEMS,
    LOW_PRECISION_WEIGHT_BYTES,
    QLORA_WEIGHT_BYTES,
    Term,
    Workload,
    _collector,
    _compute_bytes,
    fp8_params,
    low_weight_bytes,
)
from jobctl.planner.models import ModelSpec
from jobctl.planner.plan import Plan


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state under a precision recipe (docs/memory-model.md §2)."""

    weight: float
    grad: float
    master: float  # fp32 master copy kept by the optimizer (0 when params are fp32 already)
    state_elem: float  # bytes of one optimizer-state element
    label: str


@lru_cache(maxsize=None)
def state_bytes(framework: str | Framework, precision: str, optimizer: str, grad_reduce: str = "fp32") -> StateBytes:
    """The precision recipe of a framework.

    mixed (bf16/fp16), ZeRO paper & DeepSpeed: 2 (16-bit weights) + 2 (16-bit grads) + 4 (fp32
      master) + fp32 states: 16 bytes with Adam (Rajbhandari et al. 2020, §3.1, K = 12).
    mixed, Megatron-LM: fp32 main grads (accumulate_allreduce_grads_in_fp32): 2 + 4 + 4 + states;
      with --grad-reduce-in-bf16 (`grad_reduce` "bf16") the buffer is the params' dtype
      (megatron/core/distributed/distributed_data_parallel.py: grad_dtype = torch.float if
      ddp_config.grad_reduce_in_fp32 else param.dtype): 2 + 2 + 4 + states.
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
        if grad_reduce == "bf16":
            return StateBytes(2, 2, 4, st or 4, "Megatron mixed, --grad-reduce-in-bf16: 2 B weights + 2 B bf16 main "
                                                "grads + 4 B master + fp32 states")
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


@lru_cache(maxsize=1 << 12)
def _state_items(w: Workload, tp: int, pp: int, stage: str, sharding: str, n: int, offload: str, ep: int = 1) -> tuple:
    """Weights, gradients and optimizer states (of the LoRA adapters and the frozen base under
    LoRA/QLoRA) on one rank of `stage`, sharded over n ranks (docs/memory-model.md §2); a
    mixture of experts' routed experts apart, split over `ep` ranks (_expert_state_items)."""
    items = list(_dense_state_items(w, tp, pp, stage, sharding, n, offload))
    if w.model.moe is not None:
        items += _expert_state_items(w, tp, pp, stage, sharding, n, offload, ep)
    return tuple(items)


def _expert_state_items(w: Workload, tp: int, pp: int, stage: str, sharding: str, n: int, offload: str,
                        ep: int) -> list:
    """The routed experts' states on one rank: its stage's experts / ep (expert tensor
    parallelism 1), their optimizer states sharded by the distributed optimizer over the expert
    data-parallel group, tp·n/ep ranks (Megatron-Core's MoE parallel folding: experts on
    ETP x EP x EDP over the same ranks as attention's TP x CP x DP; distributed/
    param_and_grad_buffer.py keeps expert parameters in their own buffers, sharded over
    expert_data_parallel_group). The same bytes per parameter as the dense ones."""
    items, add = _collector()
    m = w.model
    layers = _stage_params_cached(w, tp, pp, stage)[2]
    params = layers * m.routed_params_per_layer / ep
    edp = max(1, tp * n // ep)  # n is 1 unsharded: nothing to shard the experts' states over
    sb = state_bytes(w.framework, w.precision, w.optimizer, w.grad_reduce_dtype)
    add_model_states(add, params, params * optimizer_state_elements(w.optimizer, [(1, 1, 1)]), sb, w.optimizer,
                     sharding, edp, offload, _compute_bytes(w), "expert weights", w.caps.offload_keeps_grads)
    low = low_weight_bytes(w)
    if low and fp8_params(w, sharding):
        # under --fp8-param-gather the experts are built inside fp8_model_init too: Transformer
        # Engine's GroupedLinear keeps FP8 primary weights (grouped_linear.py: primary_weights_in_fp8,
        # get_weight_workspace returns the quantized weight itself), no 16-bit copy
        items[:] = [(f"expert {w.precision} weights", params * low, group, lambda: f"{params:.4g} expert params x {low:.4g} B ({w.precision} "
                     "data with their scales; the fp32 master stays with the optimizer: --fp8-param-gather)")
                    if name == "expert weights" else (name, value, group, formula)
                    for name, value, group, formula in items]
    elif low:
        add(f"expert {w.precision} weight copies", params * low, "weights", lambda:
            f"{params:.4g} expert params x {low:.4g} B ({w.precision} copies with their scales, kept through the step)")
    out = []
    for name, value, group, formula in items:
        if not name.startswith("expert") and group != "host":
            name = "expert " + name
        out.append((name, value, group, lambda f=formula, e=edp: f"{f()} [routed experts: {layers:g} layers' "
                    f"{m.routed_params_per_layer:.4g} / ep {ep}; optimizer over the {e} expert-data-parallel ranks]"))
    return out


def _dense_state_items(w: Workload, tp: int, pp: int, stage: str, sharding: str, n: int, offload: str) -> tuple:
    items, add = _collector()
    m = w.model
    sb = state_bytes(w.framework, w.precision, w.optimizer, w.grad_reduce_dtype)
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
    low = low_weight_bytes(w)
    if low and w.method == "full" and fp8_params(w, sharding):
        # no 16-bit copy of the layers' weights: only the embedding and output layer keep one
        items[:] = [(name, extra_p * compute_b, group, lambda: f"{extra_p:.4g} embedding/output params x "
                     f"{compute_b} B (the layers' weights are {w.precision} only: --fp8-param-gather)")
                    if name == "weights" else (name, value, group, formula)
                    for name, value, group, formula in items]
        add(f"{w.precision} weights", layer_p * low, "weights", lambda:
            f"{layer_p:.4g} layer params x {low:.4g} B ({w.precision} data with their scales, row-wise "
            f"{'only: Blackwell needs no transposed copy' if low < LOW_PRECISION_WEIGHT_BYTES[w.precision] else 'and transposed'}; "
            "the fp32 master stays with the optimizer)")
    elif low:
        add(f"{w.precision} weight copies", layer_p * low, "weights", lambda:
            f"{layer_p:.4g} layer params x {low:.4g} B ({w.precision} copies with their scales, row-wise"
            f"{'' if low < LOW_PRECISION_WEIGHT_BYTES[w.precision] else ' and transposed'}, kept through the step)")
    return tuple(items)


def model_state_elements(w: Workload) -> float:
    """Optimizer-state elements of the whole model, unsharded (what a checkpoint holds)."""
    return _stage_state_elements(w, 1, 1, "only")


@lru_cache(maxsize=4096)
def _stage_state_elements(w: Workload, tp: int, pp: int, stage: str) -> float:
    plan = Plan(1, 1, tp, pp, 1, 1, "none", 1, 1, 1, "none", "none", False)
    return optimizer_state_elements(w.optimizer, _stage_matrices(w, plan, stage))
