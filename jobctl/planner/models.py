"""Model architectures and their exact parameter counts (docs/memory-model.md §1)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from jobctl.planner import moe as _moe
from jobctl.planner.moe import MLA, MoE


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, enough of it to count parameters and activations.

    family "llama": SwiGLU MLP (gate, up, down), RMSNorm, GQA, RoPE, no biases.
    family "gpt": GELU MLP (2 matrices), LayerNorm with bias, biases on every linear,
    learned position embeddings (GPT-2/GPT-3 style).
    """

    name: str
    family: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool = False
    max_seq_len: int = 0  # learned position embeddings (gpt); 0 = rotary, no parameters
    dropout: float = 0.0
    rope_theta: float = 10000.0  # RoPE base (llama family)
    rope_scaling: float = 0.0  # Llama 3.1's RoPE scaling factor (low 1, high 4, original 8192); 0: none
    norm_eps: float = 1e-5
    # mixture of experts and the attention variants of today's MoE models (planner/moe.py)
    moe: MoE | None = None
    mla: MLA | None = None
    explicit_head_dim: int = 0  # a head width other than hidden / heads (Qwen3, gpt-oss, Llama 4)
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (Qwen3)
    attention_bias: bool = False  # biases on Q, K, V and the output projection (gpt-oss)
    attention_sinks: bool = False  # a learned sink logit per head (gpt-oss)
    # sliding-window attention: a window of this many tokens on every layer but each
    # window_full_every-th, which attends to the whole sequence (gpt-oss: 128 on alternate layers)
    sliding_window: int = 0
    window_full_every: int = 0
    # the gated MLP's activation: "swiglu" (SiLU), or "clamped-geglu" (gpt-oss: quick GELU on the
    # gate, the linear half offset by 1, both clamped at 7)
    activation: str = "swiglu"
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3), not in params()

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def __hash__(self) -> int:  # a key of the planner's caches, hashed on every lookup: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    # --- parameter counts -------------------------------------------------------------
    def layer_params(self) -> int:
        return self._layer_params

    @cached_property
    def _layer_params(self) -> int:
        """Parameters of one transformer layer.

        llama: 2·h·a·d (Q, O) + 2·h·g·d (K, V) + 3·h·f (gate, up, down) + 2·h (two RMSNorms)
        gpt:   4·h² + 4·h (QKV and output with biases) + 2·h·f + f + h (MLP with biases)
               + 4·h (two LayerNorms, weight and bias)
        """
        h, f, a, g, d = self.hidden, self.ffn_hidden, self.heads, self.kv_heads, self.head_dim
        if self.moe is not None or self.mla is not None:
            # everything but the routed experts, averaged over the layers: attention, norms, the
            # router, the shared experts and the dense layers' MLPs, which tensor parallelism
            # splits; the routed experts are counted apart (routed_params_per_layer: EP splits them)
            return (sum(_moe.layer_params(self, i) for i in range(self.layers)) - self.layers *
                    self.routed_params_per_layer) / self.layers
        if self.family == "llama":
            return 2 * h * a * d + 2 * h * g * d + 3 * h * f + 2 * h
        qkv = h * (a + 2 * g) * d + (a + 2 * g) * d
        out = a * d * h + h
        return qkv + out + (2 * h * f + f + h) + 4 * h

    @cached_property
    def routed_params_per_layer(self) -> float:
        """The routed experts' parameters, averaged over the layers (0 for a dense model)."""
        if self.moe is None:
            return 0.0
        return _moe.routed_params(self) * self.moe_layers / self.layers

    @cached_property
    def moe_layers(self) -> int:
        """Layers whose feed-forward is a mixture of experts."""
        return sum(self.moe.is_moe(i) for i in range(self.layers)) if self.moe is not None else 0

    def embedding_params(self, vocab: int | None = None) -> int:
        v = self.vocab if vocab is None else vocab
        return v * self.hidden + self.max_seq_len * self.hidden

    def output_params(self, vocab: int | None = None) -> int:
        """The output layer: V·h unless tied to the embedding."""
        v = self.vocab if vocab is None else vocab
        return 0 if self.tied_embeddings else v * self.hidden

    def final_norm_params(self) -> int:
        return self.hidden if self.family == "llama" else 2 * self.hidden

    def params(self, vocab: int | None = None) -> int:
        """Exact parameter count, equal to sum(p.numel()) of the same model in PyTorch."""
        if self.moe is not None or self.mla is not None:
            return _moe.total_params(self)
        return (
            self.layers * self.layer_params()
            + self.embedding_params(vocab)
            + self.output_params(vocab)
            + self.final_norm_params()
        )

    def active_params(self) -> int:
        """Parameters one token's forward touches: all of them but the experts it is not routed to."""
        if self.moe is not None or self.mla is not None:
            return _moe.active_params(self)
        return self.params()

    def layer_matrices(self) -> list[tuple[int, int]]:
        """(rows, cols) of every weight matrix of one layer; vectors as (n, 1).

        Used by optimizers whose state depends on shapes (Adafactor, Adam-mini) and by LoRA.
        """
        h, f, a, g, d = self.hidden, self.ffn_hidden, self.heads, self.kv_heads, self.head_dim
        if self.moe is not None or self.mla is not None:
            # one vector of layer_params() elements: exact for element-wise optimizers (Adam);
            # a factored one (Adafactor) is counted unfactored, an over-estimate
            return [(self.layer_params(), 1)]
        if self.family == "llama":
            return [(a * d, h), (g * d, h), (g * d, h), (h, a * d), (f, h), (f, h), (h, f), (h, 1), (h, 1)]
        return [
            ((a + 2 * g) * d, h), ((a + 2 * g) * d, 1), (h, a * d), (h, 1),
            (f, h), (f, 1), (h, f), (h, 1), (h, 1), (h, 1), (h, 1), (h, 1),
        ]


def padded_vocab(vocab: int, multiple: int) -> int:
    """Round the vocabulary up to a multiple (Megatron-LM --make-vocab-size-divisible-by · tp)."""
    return int(math.ceil(vocab / multiple) * multiple) if multiple > 1 else vocab


def _llama(name, layers, hidden, ffn, heads, kv, vocab, tied=False, theta=10000.0, scaling=0.0):
    return ModelSpec(name, "llama", layers, hidden, ffn, heads, kv, vocab, tied, rope_theta=theta, rope_scaling=scaling)


# Llama 2 (Touvron et al. 2023, Table 1 and the released configs), Llama 3.1 (Llama 3 paper,
# Table 3; vocabulary 128256), Llama 3.2 1B/3B (released configs: tied embeddings). RoPE base
# and scaling from the released config.json files: Llama 2 rope_theta 10000; Llama 3.1
# rope_theta 500000 with rope_scaling {rope_type llama3, factor 8, low_freq_factor 1,
# high_freq_factor 4, original_max_position_embeddings 8192}; Llama 3.2 the same with factor 32;
# rms_norm_eps 1e-5 in all of them.
# GPT-2 small (Radford et al. 2019; 124M with tied head) and GPT-3 175B (Brown et al. 2020,
# Table 2.1), used by Korthikanti et al. 2022.
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000),
        _llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000),
        _llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000),
        _llama("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256, theta=500000.0, scaling=8.0),
        _llama("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256, theta=500000.0, scaling=8.0),
        _llama("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256, theta=500000.0, scaling=8.0),
        _llama("llama3.2-1b", 16, 2048, 8192, 32, 8, 128256, tied=True, theta=500000.0, scaling=32.0),
        _llama("llama3.2-3b", 28, 3072, 8192, 24, 8, 128256, tied=True, theta=500000.0, scaling=32.0),
        ModelSpec("gpt2", "gpt", 12, 768, 3072, 12, 12, 50257, True, 1024, 0.1),
        ModelSpec("gpt3-175b", "gpt", 96, 12288, 49152, 96, 96, 51200, True, 2048, 0.1),
        # Mixtures of experts (issue 31), from their released configs:
        # DeepSeek-V3: transformers' DeepseekV3Config defaults (= deepseek-ai/DeepSeek-V3), MLA and
        # 3 dense layers of 18432, 256 experts of 2048 + 1 shared, top 8 from the best 4 of 8
        # expert groups (n_group, topk_group), one MTP module.
        ModelSpec("deepseek-v3", "llama", 61, 7168, 18432, 128, 128, 129280,
                  moe=MoE(256, 8, 2048, shared_experts=1, dense_layers=3, score_bias=True, groups=8, groups_kept=4),
                  mla=MLA(1536, 512, 64, 128, 128), mtp_layers=1, norm_eps=1e-6),
        # Qwen3 MoE: Qwen/Qwen3-235B-A22B and -30B-A3B config.json (head_dim 128, q/k norms, every
        # layer MoE, no shared expert; Megatron-Bridge's Qwen3 MoE provider @5ca1c1a1).
        # RoPE base 1e6 and RMSNorm eps 1e-6 from those config.json files (transformers' class
        # defaults differ: 10000; Megatron-Bridge's Qwen3 MoE bridge test uses 1e6).
        ModelSpec("qwen3-235b-a22b", "llama", 94, 4096, 12288, 64, 4, 151936, moe=MoE(128, 8, 1536),
                  explicit_head_dim=128, qk_norm=True, rope_theta=1e6, norm_eps=1e-6),
        ModelSpec("qwen3-30b-a3b", "llama", 48, 2048, 6144, 32, 4, 151936, moe=MoE(128, 8, 768),
                  explicit_head_dim=128, qk_norm=True, rope_theta=1e6, norm_eps=1e-6),
        # Mixtral: MixtralConfig defaults (= Mixtral-8x7B-v0.1); 8x22B-v0.1's config.json as vendored
        # in public test suites (NeMo's MixtralConfig8x22B: 56 layers, 6144, 48 heads, 16384).
        # (RoPE base 1e6: MixtralConfig's default)
        ModelSpec("mixtral-8x7b", "llama", 32, 4096, 14336, 32, 8, 32000, moe=MoE(8, 2, 14336), rope_theta=1e6),
        ModelSpec("mixtral-8x22b", "llama", 56, 6144, 16384, 48, 8, 32000, moe=MoE(8, 2, 16384), rope_theta=1e6),
        # gpt-oss-120b: GptOssConfig defaults (= openai/gpt-oss-120b): head_dim 64, biases on the
        # attention, router and experts, a sink per head; 128 experts of 2880, top 4; a 128-token
        # window on alternate layers (layer_types: sliding first); RoPE base 150,000 (its YaRN
        # scaling, factor 32 over 4,096, is not rendered: RoPE unscaled, as DeepSeek-V3's)
        ModelSpec("gpt-oss-120b", "llama", 36, 2880, 2880, 64, 8, 201088,
                  moe=MoE(128, 4, 2880, router_bias=True, expert_bias=True), explicit_head_dim=64,
                  attention_bias=True, attention_sinks=True, sliding_window=128, window_full_every=2,
                  activation="clamped-geglu", rope_theta=150000.0),
        # gpt-oss-20b (openai/gpt-oss-20b's config.json): the same layer, 24 of them, 32 experts
        ModelSpec("gpt-oss-20b", "llama", 24, 2880, 2880, 64, 8, 201088,
                  moe=MoE(32, 4, 2880, router_bias=True, expert_bias=True), explicit_head_dim=64,
                  attention_bias=True, attention_sinks=True, sliding_window=128, window_full_every=2,
                  activation="clamped-geglu", rope_theta=150000.0),
        # Llama 4 Maverick (meta-llama/Llama-4-Maverick-17B-128E text model): MoE on the odd layers
        # (interleave_moe_layer_step 2), 128 experts of 8192 + 1 shared, top 1; dense layers 16384.
        ModelSpec("llama4-maverick", "llama", 48, 5120, 16384, 40, 8, 202048,
                  moe=MoE(128, 1, 8192, shared_experts=1, every=2), explicit_head_dim=128),
    )
}


def with_name(spec: ModelSpec, name: str) -> ModelSpec:
    return replace(spec, name=name)
