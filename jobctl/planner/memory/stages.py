"""How a pipeline stage is cut: its layers (`stage_layers`), the parameters and optimizer-state
elements it holds, the vocabulary its framework pads to."""

from __future__ import annotations

from functools import lru_cache

from jobctl.frameworks.base import even_split, front_loaded
from jobctl.planner.memory.workload import Workload
from jobctl.planner.models import padded_vocab
from jobctl.planner.plan import Plan


def stage_layers(layers: int, pp: int, counts_ends: bool = False) -> tuple[int, int, int] | None:
    """Layers on the (first, a middle, the last) pipeline stage, or None if pp cannot split them.

    Even splits, or the first and/or last stage one layer short to make room for the
    embedding and the output layer (Megatron-LM --decoder-first/last-pipeline-num-layers;
    the Llama 3 paper §3.3.2 does this for 126 layers on 16 stages); failing those, the last
    stage short by what is left (`front_loaded`).

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
    return front_loaded(layers, pp)


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
    mtp = w.mtp_layers if stage in ("last", "only") else 0
    if mtp:
        # Megatron-Core's MTP modules, on the last stage (multi_token_prediction.py
        # MultiTokenPredictionLayer): each one more transformer layer (counted as the model's
        # average layer: DeepSeek-V3's routes like 58 of its 61), two norms and the final one (3·h),
        # the column-parallel projection of the two normed halves (2h x h / t); and, pipelined,
        # the word embedding the next tokens are looked up in, kept in step with the first
        # stage's (gpt_model.py builds it where mtp_process)
        layers += mtp
        extra += mtp * (3 * m.hidden + 2 * m.hidden * m.hidden / tp) + (vocab * m.hidden / tp if stage == "last" else 0)
    layer_p = layers * m.layer_params() / tp
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


