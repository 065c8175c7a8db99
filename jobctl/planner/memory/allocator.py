"""The caching allocator's share and the fixed overheads: blocks FSDP2's streams keep cached,
the phases whose peaks never coexist, the CUDA context, NCCL buffers, the allocator reserve, what an
earlier OOM taught (docs/memory-model.md, "Overheads")."""

from __future__ import annotations

from jobctl.frameworks import graphed_step, loss_chunks
from jobctl.planner.memory.buffers import _FsdpUnderPP
from jobctl.planner.memory.stages import framework_vocab
from jobctl.planner.memory.workload import GIB, Workload, _compute_bytes, gathered_layer_bytes
from jobctl.planner.plan import Plan

# the caching allocator's terms under FSDP2 (_fsdp2_allocator_terms), by name
FSDP2_ALLOCATOR_TERMS = ("cached gradients (reduce-scatter stream)", "cached all-gather buffers",
                         "fresh reduce-scatter input after the schedule", "freed 16-bit logits block",
                         "cached blocks in use at the peak")


def _fsdp2_allocator_terms(add, w: Workload, plan: Plan, stage: str, groups: dict, phases, transient: float,
                           compute_b: int) -> None:
    """What PyTorch's caching allocator keeps reserved beyond the tensors at their peak, under FSDP2.

    From replaying every allocation of torchtitan's own training steps (traced on fake tensors)
    through a model of c10/cuda/CUDACachingAllocator.cpp (jobctl_measure/caching_allocator.py,
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
    # without the phases the gradients are counted as held; under a CUDA-graphed step they are
    # zeroed in place, held (the phases count them), never freed to the cache
    grads = groups["grads"] if phases and not graphed_step(w, plan) else 0.0
    if grads:
        add("cached gradients (reduce-scatter stream)", grads, "overhead", lambda:
            "the sharded gradients, freed by zero_grad before the activation peak, stay cached on "
            "FSDP2's reduce-scatter stream")
    # FSDP units on this rank (16-bit when gathered, the layers' Float8 weights in one byte under
    # accelerate's FP8): the decoder layers and the root's: torchtitan wraps the embedding and the
    # output layer apart, accelerate keeps both in its root unit
    layer = m.layer_params() / plan.tp * gathered_layer_bytes(w, plan.sharding)
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
    # (a chunked loss keeps each chunk's logits through its backward, and the next chunk's, of the
    # same size, take their block)
    if (stage in ("last", "only") and not w.caps.keeps_logits_through_loss and not w.fused_cross_entropy
            and not w.caps.in_place_cross_entropy and not loss_chunks(w, plan.pp)):
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
        # the output layer, gathered; through a chunked loss also its fp32 accumulated gradient
        head_unit = framework_vocab(w, plan.tp) * m.hidden / plan.tp * (
            compute_b + 4 if loss_chunks(w, plan.pp) else compute_b)
        # under a CUDA-graphed step the trainer zeroes them in place: they exist at the activation
        # peak too (torchtitan 0.3.0 without PP or EP; traced with --cuda-graphs)
        kept = groups["grads"] if graphed_step(w, plan) else 0.0
        at_acts = groups["activations"] + groups["logits"] + min(groups["buffers"], head_unit) + kept
        if kept:
            # and in the last block's backward, once the logits are freed, that block's gathered
            # weights and gradients beside the activations: the peak where a block outweighs the
            # logits (DeepSeek-V3's MoE blocks at ep 1, traced: 11.5B parameters each)
            at_acts = max(at_acts, groups["activations"] + groups["buffers"] + kept)

        if w.caps.fsdp_root_holds_embeddings:
            # accelerate's root unit (embedding + output layer) stays gathered from forward to the
            # end of backward (FSDP2 does not reshard the root after forward). At the loss one
            # decoder layer is prefetched; in the last block's backward that block is gathered,
            # the next one prefetched, the block rematerialised and its unsharded gradient built
            # before the reduce-scatter (traced at 405B: root + 2 layers + a layer's gradient)
            root = head_unit * (1 if m.tied_embeddings else 2)
            layer_grad = m.layer_params() / plan.tp * compute_b
            layer_gathered = m.layer_params() / plan.tp * gathered_layer_bytes(w, plan.sharding)
            at_loss = groups["activations"] + groups["logits"] + root + layer_gathered
            at_block = acts + working_set + root + 2 * layer_gathered + layer_grad
            at_acts = max(at_loss, at_block)
        at_end = groups["grads"] + groups["buffers"]
        summed = groups["activations"] + groups["logits"] + groups["grads"] + groups["buffers"]
        add_phases(at_acts, at_end, summed, lambda which: (
            ("FSDP2 frees gradients each step: at the activation peak activations + logits + the output "
             "layer gathered" if not kept else "under the CUDA-graphed step the gradients are zeroed in place, not "
             "freed: at the activation peak activations + logits + the output layer gathered + the gradients "
             "(or the last block's gathered weights and gradients with its activations)") + " "
            f"({at_acts / GIB:.3g} GiB), at the end of backward gradients + gathered "
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
