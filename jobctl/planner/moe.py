"""Mixture-of-experts and multi-head latent attention: what such a model is and how many
parameters it has in all and per token (issue 31, first step: the models).

A ModelSpec with `moe` set routes each token of its MoE layers to `top_k` of `experts`
feed-forward experts (plus any shared experts every token passes through); with `mla` set its
attention is DeepSeek's multi-head latent attention (low-rank Q and compressed K/V). The counts
follow the released models' modules one by one (each catalog entry names its config): they are
what `sum(p.numel())` of the model gives, and the active count is what one token's forward
touches (attention, norms, router, shared experts, top_k routed experts, the embedding row and
the output layer), the convention the models' authors publish.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoE:
    """The routed feed-forward of an MoE model."""

    experts: int  # routed experts per MoE layer
    top_k: int  # experts each token is sent to
    expert_ffn: int  # one expert's intermediate width (a gated, SwiGLU, expert: 3 matrices)
    shared_experts: int = 0  # experts every token passes through
    shared_ffn: int = 0  # one shared expert's width (0: expert_ffn)
    dense_layers: int = 0  # leading layers with a dense MLP instead (DeepSeek first_k_dense_replace)
    every: int = 1  # every n-th layer is MoE, counting from 1 (Llama 4 Maverick: 2, the odd ones)
    router_bias: bool = False  # a bias per expert on the router (gpt-oss)
    score_bias: bool = False  # DeepSeek-V3's per-expert e_score_correction_bias
    expert_bias: bool = False  # biases on the experts' matrices (gpt-oss)
    capacity_factor: float = 0.0  # 0: dropless; else tokens an expert takes, x its even share
    # group-limited routing (DeepSeek-V3 n_group 8, topk_group 4; torchtitan's router
    # num_expert_groups, num_limited_groups): 0 = none
    groups: int = 0
    groups_kept: int = 0

    def is_moe(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) routes its tokens to experts."""
        return layer >= self.dense_layers and (layer - self.dense_layers) % self.every == self.every - 1


@dataclass(frozen=True)
class MLA:
    """DeepSeek's multi-head latent attention: queries through a rank-q_lora_rank bottleneck (0:
    a full projection), keys and values from one kv_lora_rank latent plus a shared RoPE key."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


def attention_params(m) -> int:
    """One layer's attention: projections, their biases and norms, sinks."""
    h, a, g, d = m.hidden, m.heads, m.kv_heads, m.head_dim
    if m.mla is not None:
        x = m.mla
        qk = x.qk_nope_head_dim + x.qk_rope_head_dim
        q = (h * x.q_lora_rank + x.q_lora_rank + x.q_lora_rank * a * qk) if x.q_lora_rank else h * a * qk
        kv = h * (x.kv_lora_rank + x.qk_rope_head_dim) + x.kv_lora_rank + \
            x.kv_lora_rank * a * (x.qk_nope_head_dim + x.v_head_dim)
        return q + kv + a * x.v_head_dim * h
    out = h * a * d + 2 * h * g * d + a * d * h
    if m.attention_bias:
        out += a * d + 2 * g * d + h
    if m.qk_norm:  # one RMSNorm weight of head_dim for queries, one for keys (Qwen3)
        out += 2 * d
    if m.attention_sinks:  # a learned logit per head (gpt-oss)
        out += a
    return out


def _gated(h: int, f: int, bias: bool = False) -> int:
    """A SwiGLU MLP: gate, up and down (with biases 2f + h)."""
    return 3 * h * f + ((2 * f + h) if bias else 0)


def moe_mlp_params(m, active: bool = False) -> int:
    """One MoE layer's feed-forward: the router, the shared and the routed experts (top_k of
    them when `active`)."""
    x, h = m.moe, m.hidden
    router = h * x.experts + (x.experts if x.router_bias else 0) + (x.experts if x.score_bias else 0)
    shared = x.shared_experts * _gated(h, x.shared_ffn or x.expert_ffn)
    routed = (x.top_k if active else x.experts) * _gated(h, x.expert_ffn, x.expert_bias)
    return router + shared + routed


def routed_params(m) -> int:
    """One MoE layer's routed experts (all of them)."""
    x = m.moe
    return x.experts * _gated(m.hidden, x.expert_ffn, x.expert_bias)


def layer_params(m, layer: int, active: bool = False) -> int:
    """One layer: attention, its feed-forward (dense or MoE) and two norms."""
    ffn = moe_mlp_params(m, active) if m.moe is not None and m.moe.is_moe(layer) else _gated(m.hidden, m.ffn_hidden)
    return attention_params(m) + ffn + 2 * m.hidden


def mtp_params(m) -> int:
    """DeepSeek-V3's multi-token-prediction modules, each: two norms on the hidden state and the
    next token's embedding, their joint projection 2h -> h and one more transformer layer (an MoE
    one); the embedding and output layer are the main model's."""
    h = m.hidden
    return m.mtp_layers * (2 * h + 2 * h * h + layer_params(m, m.layers - 1) + h)


def total_params(m) -> int:
    """The main model (without multi-token prediction, as its authors count it)."""
    return sum(layer_params(m, i) for i in range(m.layers)) + m.embedding_params() + m.output_params() + \
        m.final_norm_params()


def active_params(m) -> int:
    """What one token's forward touches: every layer's attention and norms, top_k routed and all
    shared experts, the router, the embedding and the output layer."""
    return sum(layer_params(m, i, active=True) for i in range(m.layers)) + m.embedding_params() + \
        m.output_params() + m.final_norm_params()
