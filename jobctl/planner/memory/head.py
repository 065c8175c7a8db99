"""The output layer's share: the logits and the loss's fp32 copies and gradients on the stage
that computes the loss (docs/memory-model.md, "Logits")."""

from __future__ import annotations

from functools import lru_cache

from jobctl.frameworks import loss_chunks
from jobctl.planner.memory.stages import framework_vocab
from jobctl.planner.memory.workload import GIB, Workload, _collector


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
    if w.fused_cross_entropy == "te" and w.caps.te_cross_entropy:
        # Transformer Engine's CrossEntropyFunction saves the 16-bit logits themselves (and 12 B of
        # fp32 row statistics per token) and its backward kernel overwrites them with their
        # gradient (cross_entropy.py, triton/cross_entropy.py cross_entropy_backward_kernel)
        return float(w.act_bytes), "Transformer Engine's fused cross-entropy: the 16-bit logits, their gradient written in place"
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
    if loss_chunks(w, pp):  # the chunk loop holds its chunk's 16-bit logits through the chunk's backward
        return w.act_bytes + 12.0, "a chunk's 16-bit logits, its fp32 log-probs and two fp32 gradients"
    if not w.caps.keeps_logits_through_loss and pp == 1:
        return 12.0, "fp32 log-probs and two fp32 gradients; the loop drops the 16-bit logits"
    return w.act_bytes + 12.0, "16-bit logits, fp32 log-probs and two fp32 gradients" + (
        kept if not w.caps.keeps_logits_through_loss else "")


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
    # measured 8·sbh (eager) / 4·sbh (fused, GPT) in 16-bit (jobctl_measure/torch_reference.py).
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
    chunks = loss_chunks(w, pp)
    if chunks:
        # torchtitan's ChunkedLossWrapper (components/loss.py): the model stops at the final norm;
        # the hidden state is cut into `chunks` contiguous copies along the sequence (replicated on
        # the TP ranks first), each chunk's logits are made, lost and back-propagated in turn, and
        # each chunk's hidden-state gradient lands in an fp32 accumulator (GradAccumulator)
        whole = (w.seq_len / cp) * b * m.hidden
        add("chunked loss copies", (e_ + 4) * whole, "activations", lambda:
            f"the hidden state's {chunks} chunk copies (2·sbh, whole on every TP rank) and its fp32 gradient "
            "accumulator (4·sbh)")
        elems /= chunks
        # a chunk's loss peaks in its cross-entropy's backward, or in the output layer's backward:
        # the chunk's 16-bit logits and their gradient, the layer's new 16-bit weight gradient and
        # its fp32 sum with the accumulated one (torch's FSDP to_accumulated_grad_if_needed)
        head_w = vocab * m.hidden / tp
        loss = max(elems * per, 2 * e_ * elems + (e_ + 4) * head_w)
        label = (f"s·b·V/t / {chunks} chunks = {elems:.4g} logits; the larger of their loss ({per:g} B each: "
                 f"{loss_label}) and the output layer's backward (2 · {e_} B per logit, and the layer's "
                 f"{e_}-B gradient and its fp32 sum: {e_ + 4} B x {head_w:.4g} V·h/t)")
    else:
        loss, label = elems * per, f"s·b·V/t = {elems:.4g} logits x {per:g} B ({loss_label})"
    add("logits and loss", loss, "logits", lambda: label)
    mtp = w.mtp_layers
    if mtp:
        # Megatron-Core's MTP modules (multi_token_prediction.py): the next tokens' embedding and its
        # norm, the decoder output's second norm, their concatenation kept by the projection
        # (5·sbh), then a final norm and the output layer again, whose logits and loss are kept
        # beside the main ones until the backward (gpt_model.py _postprocess: each module's loss
        # joins the graph through MTPLossAutoScaler)
        add("mtp inputs", mtp * (5 * e_ * sbh_head / rep + head_in), "activations", lambda:
            f"{mtp} MTP module(s): the next tokens' embedding and the two norms' outputs, their 2h concatenation "
            "(5·sbh in 16-bit), the final norm's input and output")
        add("mtp logits and loss", mtp * loss, "logits", lambda: f"{mtp} x the main output's: {label}")
    excess = max(0.0, working_set - loss)
    if working_set:
        add("recompute working set", excess, "activations", lambda:
            f"one layer rematerialised in its backward, {working_set / GIB:.3g} GiB, after the logits are "
            f"freed: {excess / GIB:.3g} GiB beyond their peak")
    return tuple(items)
