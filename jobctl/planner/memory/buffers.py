"""What each framework allocates around the model states: gradient buckets, gathered FSDP
units, DeepSpeed's reduce buckets, pipeline receive buffers (docs/memory-model.md, "Buffers")."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from jobctl.frameworks import GradBuffer, deepspeed, loss_chunks
from jobctl.planner.memory.stages import _stage_params_cached, framework_vocab
from jobctl.planner.moe import routed_params
from jobctl.planner.memory.states import state_bytes
from jobctl.planner.memory.workload import (
    DEEPSPEED_REDUCE_BUCKET_ELEMS,
    Workload,
    _collector,
    _compute_bytes,
    gathered_layer_bytes,
)


class _FsdpUnderPP(NamedTuple):
    """What the phases of FSDP2 under pipeline parallelism read of the buffer terms."""

    stage_bytes: float  # the stage kept unsharded: weights + accumulated gradients
    layer_unit: float  # parameters of one decoder layer on this rank
    root_unit: float  # parameters of the stage's root unit (embedding or output layer)
    acc_b: int  # bytes per accumulated gradient element


@lru_cache(maxsize=1 << 12)
def _framework_buffer_items(w: Workload, tp: int, pp: int, stage: str, sharding: str, offload: str,
                            data_parallel: bool, ep: int = 1) -> tuple[tuple, _FsdpUnderPP | None]:
    """The buffers a framework keeps beside the model states (FSDP2's unsharded stage under PP,
    gathered layers, DDP buckets, DeepSpeed's reduce bucket), and what FSDP2-under-PP's phases
    read of them (None unless that is the case). A mixture of experts' FSDP unit is its whole
    block, the rank's routed experts (all of them / ep, expert tensor parallelism 1) with the
    rest (torchtitan distributed/fsdp.py apply_fsdp_to_decoder: one fully_shard per block,
    the experts on their own mesh when ep > 1)."""
    items, add = _collector()
    m = w.model
    sb = state_bytes(w.framework, w.precision, w.optimizer, w.grad_reduce_dtype)
    layer_p, extra_p, layers = _stage_params_cached(w, tp, pp, stage)
    routed = m.routed_params_per_layer / ep  # averaged over the layers, as the states count them
    rank_params = layer_p + extra_p + layers * routed
    routed_unit = routed_params(m) / ep if m.moe is not None else 0.0  # one MoE block's
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
        layer_unit = m.layer_params() / tp + routed_unit
        root_unit = framework_vocab(w, tp) * m.hidden / tp if stage in ("first", "last") else 0.0
        if stage != "last":
            add("gradient before accumulation", layer_unit * compute_b, "buffers", lambda:
                f"one layer's {compute_b}-B gradient, made in its backward before it joins the accumulated one")
        fsdp_pp = _FsdpUnderPP(stage_bytes, layer_unit, root_unit, acc_b)
    elif sharding in ("zero3", "hsdp") or offload == "optimizer+params":
        layer_unit, vocab_unit = m.layer_params() / tp + routed_unit, m.vocab * m.hidden / tp
        g = gathered_layer_bytes(w, sharding)
        # the layer gathered twice (current + prefetch), plus its unsharded gradient before the
        # reduce-scatter; in FP8, the first layer's query projection stays 16-bit (accelerate's
        # filter keeps the model's first and last Linear out of Float8, utils/ao.py)
        first_q = m.hidden * m.heads * m.head_dim / tp * (compute_b - g)
        gathered = max(layer_unit * (2 * g + compute_b + sb.grad) + first_q,
                       vocab_unit * (3 * compute_b + sb.grad))
        head = m.vocab * m.hidden / tp * (compute_b + 4) if loss_chunks(w, pp) and stage in ("only", "last") else 0
        add("gathered weights", max(gathered, head), "buffers", lambda:
            "ZeRO-3/FSDP: largest unit (layer or V·h) gathered twice (current + prefetch) in "
            + ("FP8 (a layer's Float8 weights; V·h in 16-bit)" if g < compute_b else "16-bit")
            + ", plus its unsharded gradient before reduce-scatter" + (
                "; or the output layer through the chunked loss: kept gathered across the chunks, its "
                "gradient accumulated unsharded in fp32 (2 + 4 B per V·h/t)" if head > gathered else ""))
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
        # for a 1.9M-parameter model, at 1 and 2 ranks. With overlap_comm, which jobctl renders,
        # stages 1 and 2 fill a second one while the first is reduced: +1.0e9 bytes measured the
        # same way (stage 3's buckets are its own)
        buckets = 2 if sharding in ("zero1", "zero2") and deepspeed.overlap_comm(sharding, data_parallel) else 1
        add("reduce bucket", buckets * DEEPSPEED_REDUCE_BUCKET_ELEMS * compute_b, "buffers", lambda:
            f"DeepSpeed reduce_bucket_size: 5e8 elements x {compute_b} B, allocated whatever the model's size"
            + (", twice (overlap_comm: one filled while the other is reduced)" if buckets == 2 else ""))
    if w.caps.fp8_loads_model_per_rank and w.precision == "fp8" and sharding in ("zero3", "hsdp"):
        # accelerate refuses torchao's Float8 with FSDP2's cpu_ram_efficient_loading
        # (accelerator.py), so every rank loads the whole model into host memory, where
        # fsdp2_prepare_model upcasts it to fp32 before fully_shard moves its shard to the GPU
        # (utils/fsdp_utils.py): at start-up, beside anything offloaded later
        whole = m.params()
        add("whole model on the host at load", whole * 4, "host", lambda:
            f"{whole:.4g} params x 4 B on each rank (fp8: no cpu_ram_efficient_loading; upcast to fp32 before sharding)")
    return tuple(items), fsdp_pp
