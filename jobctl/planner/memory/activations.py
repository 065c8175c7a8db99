"""Activations a rank keeps for the backward: per layer and per term, under recomputation,
tensor/sequence/context parallelism, and the pipeline's micro-batches in flight (docs/memory-model.md,
"Activations")."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from jobctl.frameworks import Selective, recompute_modules
from jobctl.planner.memory.stages import _stage_params_cached
from jobctl.planner.memory.workload import GIB, LOW_PRECISION_SAVED_BYTES, Workload, _collector
from jobctl.planner.plan import Plan


def layer_activation_terms(w: Workload, plan: Plan, b: int) -> list[tuple[str, float, str]]:
    """Bytes one transformer layer saves for backward, per term, for micro-batch b on one rank.

    GPT layers follow Korthikanti et al. 2022 (§4.1): s·b·h·(34 + 5·a·s/h) with 16-bit
    activations and dropout; tensor parallelism divides the 24·sbh and 5·as²b parts by t,
    sequence parallelism also the remaining 10·sbh. Llama layers are derived the same way
    from what their backward keeps (see jobctl_measure/torch_reference.py for the measurement):
    RMSNorm inputs (+ fp32 copies in eager PyTorch), the QKV input, Q/K/V after RoPE,
    the attention output and its fp32 log-sum-exp, the SwiGLU gate, SiLU, up and product.
    FlashAttention/SDPA keep O(s) state instead of the a·s² scores. Totals (16-bit, t = 1):
      llama, eager (HF-style):  24·sbh + 8·sbf + 8·sb + 4·asb
      llama, fused kernels:     (12 + 4g/a)·sbh + 8·sbf + 8·sb + 4·asb  (6·sbf with TE's LayerNormMLP)
      gpt, eager with dropout:  34·sbh + 5·as²b (+ LayerNorm statistics)
    """
    if plan.recompute == "selective" and w.caps.selective is Selective.OP_SAC:
        return _op_sac_terms(w, plan, b)
    d = _dims(w, plan, b)
    return _gpt_layer_terms(w, d) if w.model.family == "gpt" else _llama_layer_terms(w, d)


class _Dims(NamedTuple):
    """One layer's sizes on one rank, as the formulas name them (module docstring)."""

    s: float  # the sequence on this rank (cp splits it)
    b: int
    h: int
    f: int
    a: int
    g: int
    e: int  # bytes per activation element
    t: int
    rep: int  # divisor of the parts that TP alone leaves replicated (t under sequence parallelism)
    mm_rep: int  # what the column-parallel matmuls keep: the shard, or the all-gathered sequence
    eager_attn: bool
    core_recomputed: bool  # selective recompute of the attention core (Korthikanti)
    modules: tuple[str, ...] = ()  # the named submodules selective recompute reruns (Megatron-Core's)

    @property
    def sbh(self) -> float:
        return self.s * self.b * self.h


def _dims(w: Workload, plan: Plan, b: int) -> _Dims:
    m = w.model
    t = plan.tp
    rep = t if plan.sequence_parallel and t > 1 else 1
    # Megatron gathers the shard again in backward; torchtitan's DTensor plan keeps the all-gathered
    # whole sequence (caps.sp_keeps_gathered_input)
    mm_rep = 1 if w.caps.sp_keeps_gathered_input else rep
    selective = plan.recompute == "selective"
    modules = recompute_modules(w) if selective else ()
    return _Dims(w.seq_len / plan.cp, b, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, w.act_bytes, t, rep, mm_rep,
                 w.attention == "eager", selective and (not modules or "core_attn" in modules), modules)


def _gpt_layer_terms(w: Workload, d: _Dims) -> list[tuple[str, float, str]]:
    """A GPT layer: Korthikanti et al. 2022 (§4.1), term by term."""
    s, b, f, a, g, e, t, rep, mm_rep, sbh = d.s, d.b, d.f, d.a, d.g, d.e, d.t, d.rep, d.mm_rep, d.sbh
    dropout = w.model.dropout > 0
    # Transformer Engine under fp8/mxfp8/nvfp4: a GEMM keeps the quantised copy of its input
    q8 = LOW_PRECISION_SAVED_BYTES.get(w.precision) if w.caps.te_layernorm_mlp else None
    qn = f"{q8:.3g}-B {w.precision}" if q8 else ""
    terms = [("layernorm inputs", 2 * e * sbh / rep + 2 * 8 * s * b / rep, "2 LayerNorms: 2·sbh (16-bit) + fp32 mean/rstd 8·sb each"),
             ("qkv input", q8 * sbh / mm_rep, f"LayerNorm output kept by the QKV GEMM as {qn}: sbh") if q8 else
             ("qkv input", e * sbh / mm_rep, "LayerNorm output kept by the QKV matmul: 2·sbh"),
             ("q, k, v", e * sbh * (a + 2 * g) / a / t, "Q, K, V: 2·sbh·(a+2g)/a /t")]
    if d.eager_attn and not d.core_recomputed:
        probs = e * a * s * s * b / t
        terms.append(("attention scores", probs + (a * s * s * b / t) * (1 if dropout else 0) + (probs if dropout else 0),
                      "softmax output 2·as²b, dropout mask as²b and output 2·as²b (with dropout) /t"))
    elif not d.eager_attn:
        terms.append(("attention lse", 4 * a * s * b / t, "FlashAttention keeps fp32 log-sum-exp: 4·asb /t"))
    terms.append(("attention output", e * sbh / t, "context kept by the output projection: 2·sbh /t"))
    if dropout:
        terms.append(("dropout masks", 2 * sbh / rep, "masks after attention and MLP: 1 byte each, 2·sbh"))
    if q8:  # fc1 and fc2 keep their inputs quantised too
        terms.append(("proj input", q8 * sbh / t, f"the output projection's {qn} input: sbh /t"))
        terms.append(("mlp input", q8 * sbh / mm_rep, f"LayerNorm output kept by fc1 as {qn}: sbh"))
        terms.append(("mlp intermediates", (e + q8) * s * b * f / t,
                      f"activation input 2·sbf for its backward, fc2's {qn} input sbf /t"))
        return terms
    terms.append(("mlp input", e * sbh / mm_rep, "LayerNorm output kept by fc1: 2·sbh"))
    terms.append(("mlp intermediates", 2 * e * s * b * f / t, "GELU input and output: 2 · 2·sbf /t (f=4h: 16·sbh)"))
    return terms


def _llama_layer_terms(w: Workload, d: _Dims) -> list[tuple[str, float, str]]:
    """A Llama layer: what its backward keeps, eager (HF-style) or with fused kernels."""
    s, b, f, a, g, e, t, rep, mm_rep, sbh = d.s, d.b, d.f, d.a, d.g, d.e, d.t, d.rep, d.mm_rep, d.sbh
    terms: list[tuple[str, float, str]] = []
    gathered = " (all-gathered: not /t under SP)" if mm_rep != rep else ""
    fused = w.caps.fused_kernels
    if fused:
        terms.append(("rmsnorm inputs", 2 * e * sbh / rep + 2 * 4 * s * b / rep,
                      "fused RMSNorm keeps input + fp32 rstd: 2 · (2·sbh + 4·sb)"))
    else:
        terms.append(("rmsnorm inputs", 2 * (4 * sbh + e * sbh) / rep + 2 * 4 * s * b / rep,
                      "eager (HF-style) RMSNorm keeps an fp32 copy (4·sbh), the normalised 16-bit tensor (2·sbh) "
                      "and rstd (4·sb), twice"))
    # Transformer Engine under fp8/mxfp8/nvfp4: a GEMM keeps the quantised copy of its input
    q8 = LOW_PRECISION_SAVED_BYTES.get(w.precision) if w.caps.te_layernorm_mlp else None
    qn = f"{q8:.3g}-B {w.precision}" if q8 else ""
    compiled = _compiled_set(w, d)
    if q8:
        terms.append(("qkv input", q8 * sbh / mm_rep, f"RMSNorm output kept by the QKV GEMM as {qn}: sbh" + gathered))
    elif compiled == "float8-tp":
        terms.append(("qkv input", sbh / mm_rep, "compiled Float8 under TP: the all-gathered RMSNorm output kept as "
                      "its FP8 cast: sbh" + gathered))
    elif compiled != "float8":
        terms.append(("qkv input", e * sbh / mm_rep, "RMSNorm output kept by the Q/K/V matmuls: 2·sbh" + gathered))
    # eager repeat_kv copies K and V up to a heads; fused kernels (and HF's SDPA path, which
    # hands grouped K/V to the kernel: caps.sdpa_gqa) keep them at g heads
    grouped = fused or (w.caps.sdpa_gqa and not d.eager_attn)
    kv = (2 * g / a) if grouped else 2.0
    m = w.model
    wide = m.mla is not None or m.head_dim * a != d.h  # heads wider or narrower than h/a (MLA, Qwen3, gpt-oss)
    if m.mla and "mla_up_proj" in d.modules:
        # Megatron's recompute_up_proj: the decompressed q, k, v are freed after attention's forward
        # and rebuilt from the latents before its backward (multi_latent_attention.py qkv_up_checkpoint)
        terms.append(("q, k, v", 0.0, "rebuilt from the latents in backward (--recompute-modules mla_up_proj)"))
    elif grouped and wide:
        dq, dv = (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim, m.mla.v_head_dim) if m.mla else (m.head_dim,) * 2
        gk = a if m.mla else g  # MLA decompresses a key and a value per head
        # MLA's V is a view of the decompressed [k_nope | v] tensor, which it keeps whole
        kept_v = m.mla.qk_nope_head_dim + dv if m.mla else dv
        qkv = s * b * (a * dq + gk * dq + gk * kept_v)
        terms.append(("q, k, v", e * qkv / t, f"Q and K after RoPE, V: 2·sb·(a·{dq} + {gk}·{dq} + {gk}·{kept_v}) /t"
                      + (" (V a view of the decompressed k_nope|v)" if m.mla else "")))
    else:
        terms.append(("q, k, v", e * sbh * (1 + kv) / t, "Q after RoPE 2·sbh, K and V 2·sbh·g/a each /t" if grouped
                      else "Q after RoPE, repeat_kv copies of K and V: 3 · 2·sbh /t"))
    if m.mla:
        x = m.mla
        q_lat = (2 * e * x.q_lora_rank + 4) if x.q_lora_rank else 0
        kv_lat = e * (x.kv_lora_rank + x.qk_rope_head_dim) + 4 + e * x.kv_lora_rank
        terms.append(("mla latents", (q_lat + kv_lat) * s * b, f"the compressed query ({x.q_lora_rank}) and key/value "
                      f"({x.kv_lora_rank} + the {x.qk_rope_head_dim}-wide RoPE key) latents: each norm's 16-bit input "
                      f"and fp32 rstd, its output kept by the up-projection: ({q_lat} + {kv_lat}) B x sb (whole on "
                      "every TP rank)"))
    if m.qk_norm:  # each head's query and key RMSNorm, as the block's norms
        qk, dh = s * b * (a + g), m.head_dim
        if fused:
            terms.append(("q/k norm inputs", (e * dh + 4) * qk / t, f"fused RMSNorm on each head's query and key "
                          f"(Qwen3) keeps its 16-bit input and fp32 rstd: (2·{dh} + 4) B x sb·(a+g) /t"))
        else:
            terms.append(("q/k norm inputs", ((4 + e) * dh + 4) * qk / t, f"eager RMSNorm on each head's query and "
                          f"key (Qwen3): an fp32 copy, the normalised {e:g}-B tensor and rstd: ({4 + e:g}·{dh} + 4) B x "
                          f"sb·(a+g) /t"))
    if d.eager_attn and not d.core_recomputed:
        # softmax(dtype=float32).to(q.dtype): a copy only when training in 16-bit
        terms.append(("attention scores", (4 + (e if e != 4 else 0)) * a * s * s * b / t,
                      "eager softmax in fp32 (4·as²b) and its 16-bit copy (2·as²b) /t"))
    elif not d.eager_attn:
        terms.append(("attention lse", 4 * a * s * b / t, "FlashAttention keeps fp32 log-sum-exp: 4·asb /t"))
    # SDPA/flash return a transposed view of a [b, s, a, d] buffer, so o_proj keeps the same
    # storage (measured: no copy even after .contiguous() on the transposed view).
    if grouped and wide:
        dv = m.mla.v_head_dim if m.mla else m.head_dim
        terms.append(("attention output", e * s * b * a * dv / t, f"attention output, shared with o_proj's input: "
                      f"2·sb·a·{dv} /t"))
    else:
        terms.append(("attention output", e * sbh / t, "attention output, shared with o_proj's input: 2·sbh /t"))
    # Megatron's --recompute-modules mlp: the dense layers' MLP (its RMSNorm fused into fc1 with
    # Transformer Engine) checkpointed whole, keeping only its input, the residual stream's tensor
    # the norm inputs count (transformer_layer.py recompute_mlp); MoE layers are left as they are
    dense_share = 1 - (m.moe_layers / m.layers if m.moe is not None else 0)
    mlp_rc = dense_share if "mlp" in d.modules and w.caps.te_layernorm_mlp else 0.0
    rc_note = f" (the dense layers' {mlp_rc:.3g} rebuilt in backward: --recompute-modules mlp)" if mlp_rc else ""
    if q8:  # the attention keeps its 16-bit output; the projection its quantised input besides
        terms.append(("proj input", q8 * sbh / t, f"the output projection's {qn} input: sbh /t"))
        terms.append(("mlp input", (1 - mlp_rc) * q8 * sbh / mm_rep, f"RMSNorm output kept by fc1 as {qn}: sbh"
                      + gathered + rc_note))
        if w.model.moe is not None:
            return terms + _moe_terms(w, d, 2 * e + q8, q8)
        terms.append(("mlp intermediates", (1 - mlp_rc) * (2 * e + q8) * s * b * f / t,
                      f"fc1 output (gate, up) 2 · 2·sbf for the SwiGLU backward, fc2's {qn} input sbf /t" + rc_note))
        return terms
    x = w.model.moe
    if x is not None and w.caps.moe_fp32_copies and not x.shared_experts:
        # torchtitan's MoE: the router keeps an fp32 copy instead (_moe_terms); only the dense
        # layers' MLPs keep the 16-bit norm output
        share = w.model.moe_layers / w.model.layers
        if share < 1:
            terms.append(("mlp input", (1 - share) * e * sbh / mm_rep, f"RMSNorm output kept by the dense layers' "
                          f"gate/up: 2·sbh x {1 - share:.3g} of the layers" + gathered))
    elif compiled == "float8-tp":
        terms.append(("mlp input", sbh / mm_rep, "compiled Float8 under TP: the all-gathered RMSNorm output kept as "
                      "its FP8 cast: sbh" + gathered))
    elif compiled != "float8":
        terms.append(("mlp input", (1 - mlp_rc) * e * sbh / mm_rep, "RMSNorm output kept by gate/up: 2·sbh" + gathered
                      + rc_note))
    if x is not None:
        if compiled == "moe":  # the routed experts' SiLU output is recomputed, as the dense MLP's
            share = m.moe_layers / m.layers
            terms.append(("moe output", share * e * sbh / rep, f"compiled: the MoE's 16-bit output (routed and shared "
                          f"experts combined), kept by the partitioner: 2·sbh x {share:.3g} of the layers"))
            return terms + _moe_terms(w, d, 3 * e, compiled=True)
        if "moe_act" in d.modules:  # the experts' weighted SwiGLU product (fc2's input) is rebuilt in backward
            # from fc1's output (experts.py TEGroupedMLP: CheckpointWithoutOutput around bias_act_func)
            return terms + _moe_terms(w, d, 2 * e, routed_per_f=True)
        return terms + _moe_terms(w, d, 3 * e if w.caps.te_layernorm_mlp else 4 * e)
    if w.caps.te_layernorm_mlp:
        # TransformerEngine's LayerNormMLP saves fc1's output (gate and up, 2 · 2·sbf) and the
        # SwiGLU output (2·sbf), recomputing SiLU in backward (layernorm_mlp.py, save_for_backward).
        terms.append(("mlp intermediates", (1 - mlp_rc) * 3 * e * s * b * f / t,
                      "TE LayerNormMLP: fc1 output (gate, up) and SwiGLU output: 3 · 2·sbf /t" + rc_note))
    elif compiled == "16-bit":
        terms.append(("mlp intermediates", 3 * e * s * b * f / t, "SwiGLU gate, up and product: 3 · 2·sbf /t "
                      "(compiled: SiLU recomputed from the gate in backward)"))
    elif compiled in ("float8", "float8-tp"):
        terms.append(("mlp intermediates", 2 * e * s * b * f / t, "SwiGLU gate and up: 2 · 2·sbf /t (compiled "
                      "with Float8: SiLU and the product recomputed, as are both RMSNorm outputs)"))
        if compiled == "float8-tp":
            h, ad = d.h, a * m.head_dim
            terms.append(("fp8 weight copies", (ad * h + 3 * h * f) / t + 16 * h + 2 * f / t, f"compiled Float8 "
                          f"under TP: the FP8 casts of wo, w1, w2 and w3's shards, kept for the backward GEMMs "
                          f"(1 B x (a·d·h + 3·h·f) /t, with their scales: 16·h + 2·f/t B), per micro-batch in "
                          f"flight, whatever its size"))
    else:
        terms.append(("mlp intermediates", 4 * e * s * b * f / t, "SwiGLU gate, SiLU, up and product: 4 · 2·sbf /t"))
    return terms


def compiled_set(w: Workload, plan: Plan) -> str | None:
    """The compiled block's saved set on `plan` (see _compiled_set), for what reports it."""
    return _compiled_set(w, _dims(w, plan, 1))


def _compiled_set(w: Workload, d: _Dims) -> str | None:
    """What torch.compile's partitioner keeps of a torchtitan block in place of eager's set: None
    (eager, or not measured: Transformer Engine, MLA without experts, a mixture of experts in low
    precision), "16-bit", "float8" or "float8-tp" (torchao's row-wise Float8Linear, one rank or
    tensor-parallel) for a dense Llama block,
    "moe" for a mixture of experts in 16-bit (Qwen3's block; DeepSeek-V3's, with MLA). Measured on
    torchtitan 0.3.0's own blocks, compiled as its apply_compile does (per block, fullgraph,
    inductor), their saved tensors counted through autograd's saved-tensor hooks on CPU
    (benchmarks/compiled_activations.py): in 16-bit the backward recomputes SiLU's output from the
    gate (3 of SwiGLU's 4 sbf tensors kept); with Float8 it also recomputes the product and both
    RMSNorm outputs from the norms' inputs and rstd (the backward casts them again). "float8-tp":
    under TP (torchtitan's, with sequence parallelism; measured at TP 2 and 4 on rank 0, with and
    without FSDP) the norm outputs are all-gathered before the GEMMs and a collective is not
    recomputed: each gathered output is kept as its FP8 cast (1 B per element); and the
    partitioner keeps the FP8 casts of wo's, w1's, w2's and w3's weight shards (with their
    scales) for the backward GEMMs, where on one rank it recasts the weights. "moe": the experts
    (routed and shared) recompute SiLU, the combine keeps each expert output in 16 bits and
    recomputes its fp32 cast, and the MoE's output is kept (h wide; the block's input to the MoE
    norm is rebuilt from the output projection's output, kept instead, of the same size). In
    DeepSeek-V3's block the MLA attention and its latents keep what eager keeps."""
    if not w.compiled or w.caps.te_layernorm_mlp or (w.model.mla is not None and w.model.moe is None):
        return None
    if w.model.moe is not None:  # torchtitan's MoE block (its router's fp32 copies), 16-bit
        return "moe" if w.caps.moe_fp32_copies and w.precision not in LOW_PRECISION_SAVED_BYTES else None
    if w.precision == "fp8" and w.caps.fp8_backend == "torchao" and w.fp8_recipe == "rowwise":
        return "float8" if d.t == 1 else "float8-tp"
    return "16-bit"


def _moe_terms(w: Workload, d: _Dims, per_f: float, q8: float | None = None,
               compiled: bool = False, routed_per_f: bool = False) -> list[tuple[str, float, str]]:
    """A mixture-of-experts feed-forward's activations, averaged over the layers (a share
    moe_layers / layers of them route; the rest are dense MLPs of ffn_hidden). `per_f`: bytes a
    SwiGLU MLP keeps per token and intermediate unit (as the dense term: 3·e with Transformer
    Engine's fused MLP, 4·e eager, 2·e + the quantised fc2 input under FP8).

    Routed tokens (Megatron-Core's alltoall dispatcher, expert tensor parallelism 1): a rank's
    s·b/t tokens (sequence parallelism splits them, as Megatron requires with TP and EP) are
    sent to top_k experts each, so on average its experts receive top_k·s·b/t tokens: their
    permuted input (kept by the experts' fc1; quantised, `q8` bytes, under a Transformer Engine
    low-precision recipe, as the dense GEMMs keep theirs), h wide, and routing probability (kept
    by the weighted SwiGLU: megatron-core weights each copy inside its expert, experts.py
    activation_func_with_probs / bias_act_func, so the combine's unpermute takes no
    probabilities and keeps nothing); their fc1 outputs and SwiGLU products, expert_ffn wide.
    The router keeps its fp32 logits and probabilities (2 · 4·E per token). A dropless router's
    load is taken as even (its auxiliary balancing loss); a capacity factor c caps an expert at
    c times its even share, counted in full. Shared experts run on every token as a dense MLP of
    their width, split by TP. torchtitan's layer keeps another set
    (caps.moe_fp32_copies: _eager_router_and_copies), traced term by term; Megatron-Core's is
    derived from its code, not traced."""
    m, x = w.model, w.model.moe
    s, b, h, e, t, rep = d.s, d.b, d.h, d.e, d.t, d.rep
    share = m.moe_layers / m.layers
    tokens = s * b / rep  # this rank's tokens (SP)
    cf = x.capacity_factor or 1.0
    routed = x.top_k * tokens * cf
    capped = f" x capacity {cf:g}" if x.capacity_factor else ""
    # the probabilities in the router's dtype: fp32 under DeepEP's kernels (--moe-router-dtype fp32),
    # else the activations' (router.py topk_softmax_with_capacity casts them back to the logits')
    probs_b = 4 if w.moe_dispatcher != "alltoall" else e
    if w.caps.moe_fp32_copies:
        out = _eager_router_and_copies(w, d, share, tokens, routed, capped, compiled)
    else:
        out = [("router", share * 8 * tokens * x.experts, f"fp32 router logits and probabilities: 2 · 4·E per token x "
                f"{share:.3g} of the layers"),
               ("routed tokens", share * ((q8 or e) * h + probs_b) * routed, f"the top_{x.top_k} copies of each "
                f"token, permuted into the experts ({f'{q8:.3g}-B {w.precision}' if q8 else '2-B'}·h, fc1's input) "
                f"with their {probs_b}-B routing probability (the weighted SwiGLU's; the combine keeps nothing)"
                f"{capped} x {share:.3g} of the layers")]
    out.append(("expert intermediates", share * per_f * routed * x.expert_ffn, f"each copy's fc1 output and SwiGLU "
                f"product in its expert: {per_f:g}·f_e per copy (f_e = {x.expert_ffn}) x {share:.3g} of the layers"
                + (" (the product recomputed: --recompute-modules moe_act)" if routed_per_f else "")))
    if routed_per_f:  # what follows is not the routed experts': Transformer Engine's fused MLP keeps 3·e
        per_f = 3 * e
    if x.shared_experts:
        fs = x.shared_experts * (x.shared_ffn or x.expert_ffn)
        if "shared_experts" in d.modules:  # checkpointed whole, keeping the MoE norm's output (shared_experts.py)
            out.append(("shared expert intermediates", 0.0, "rebuilt in backward (--recompute-modules shared_experts)"))
        else:
            out.append(("shared expert intermediates", share * per_f * s * b * fs / t, f"the shared experts' MLP on "
                        f"every token: {per_f:g}·sb·{fs} /t x {share:.3g} of the layers"))
    if share < 1:
        if "mlp" in d.modules:
            out.append(("dense mlp intermediates", 0.0, "rebuilt in backward (--recompute-modules mlp)"))
        else:
            out.append(("dense mlp intermediates", (1 - share) * per_f * s * b * d.f / t, f"the dense layers' MLP: "
                        f"{per_f:g}·sbf /t x {1 - share:.3g} of the layers"))
    return out


def _eager_router_and_copies(w: Workload, d: _Dims, share: float, tokens: float, routed: float,
                             capped: str, compiled: bool = False) -> list[tuple[str, float, str]]:
    """torchtitan's router and routed copies (models/common/moe.py TokenChoiceTopKRouter, MoE;
    token_dispatcher.py LocalTokenDispatcher). The gate runs under autocast to fp32: the linear
    keeps fp32 copies of its input (4·h per token) and of its E x h weight; softmax or sigmoid
    keeps its fp32 probabilities (4·E), the top-k gather its int64 expert ids (8·k), the
    normalisation of the top-k scores (the catalog's routers all normalise) the scores and their
    sum (4·k + 4). The dispatcher sorts the k·T copies by expert (argsort and the token index of
    each copy: 2 · 8 B, the sorted score 4 B per copy) and gathers them (the grouped GEMMs keep
    that 16-bit copy, 2·h); the combine casts each expert output to fp32 to weight it, keeping
    that fp32 copy (4·h per copy). Traced (benchmarks/trace_memory.py --model 30B-A3B). A
    group-limited router (_get_node_limited_routing_scores) also keeps, eager, each group's top-2
    indices (int64: 16·G), the kept groups' indices (8·G_kept) and the bool group mask its
    masked_fill reads (G) per token. Compiled (`compiled`), the combine keeps the 16-bit expert
    output instead, and the sorted score and the group terms are recomputed (measured:
    benchmarks/compiled_activations.py)."""
    x = w.model.moe
    h, e, k, E = d.h, d.e, x.top_k, x.experts
    groups = 0 if compiled else 17 * x.groups + 8 * x.groups_kept
    per_token = 4 * h + 4 * E + 12 * k + 4 + groups
    router = ("router", share * (per_token * tokens + 4 * E * h), f"fp32 copies of the gate's input and weight, "
              f"probabilities, top-k ids and scores: ({4 * h} + {4 * E} + {12 * k + 4}"
              + (f" + {groups} for the expert groups" if groups else "")
              + f") B per token + 4·E·h x {share:.3g} of the layers")
    if compiled:
        return [router, ("routed tokens", share * (2 * e * h + 16) * routed, f"the top_{k} copies of each token "
                         f"sorted to their experts (2·h, the grouped GEMMs' input), their 16-bit outputs kept for "
                         f"the combine, compiled (2·h), and the sort's indices (16 B){capped} x {share:.3g} of the "
                         "layers")]
    return [router,
            ("routed tokens", share * ((e + 4) * h + 20) * routed, f"the top_{k} copies of each token sorted to "
             f"their experts (2·h, the grouped GEMMs' input), their fp32 outputs weighted in the combine (4·h) and "
             f"the sort's indices and scores (20 B){capped} x {share:.3g} of the layers")]


def _op_sac_terms(w: Workload, plan: Plan, b: int) -> list[tuple[str, float, str]]:
    """What torchtitan's op-level selective AC keeps of a Llama block (activation_checkpoint.py,
    the default save list and "recompute every second mm"): the block input (the checkpoint's
    own input), the outputs of every odd matmul in forward order (fused wqkv, w1, w2 with
    torchtitan's `wqkv`; wq, wv, w1, w2 with separate projections), the attention kernel's output
    and log-sum-exp, and under TP + SP the two reduce-scatter outputs. Norms, RoPE, SiLU and
    products are recomputed. Compiled, the partitioner keeps only what the backward reads: not
    w2's output, nor under SP w2's reduce-scatter output; wo's is read to recompute the FFN norm's
    input (measured on a dense block, one rank and TP 2: benchmarks/compiled_activations.py)."""
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
    ]
    if not w.compiled or m.moe is not None:
        # compiled, only what the backward reads is kept, and none reads w2's output (measured on a
        # dense block, one rank: benchmarks/compiled_activations.py; a mixture of experts' is not)
        out.append(("w2 output", e * sbh, f"{w2} mm (w2) saved: 2·sbh (a partial sum before the TP reduction)"))
    if sp and w.compiled and m.moe is None:
        out.append(("reduce-scatter output", e * sbh / t, "wo's reduce-scatter output (SP; the FFN norm's input is "
                    "recomputed from it): 2·sbh /t; compiled, w2's is read by nothing and not kept"))
    elif sp:
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


def pipeline_in_flight(plan: Plan, stage: str, combined_layers: float = 0) -> float:
    """Micro-batches of a stage's activations held at once (in units of the whole stage).

    1F1B: stage r holds min(m, p − r) micro-batches (the first p, the second p − 1, the last 1).
    Interleaved (v chunks of L/(p·v) layers): Megatron's rank r runs (p − r − 1)·2 + (v − 1)·p
    chunk forwards before its first backward and holds one more, of m·v in all
    (Megatron-Core pipeline_parallel/schedules.py; torchtitan's Interleaved1F1B is the same:
    torch distributed/pipelining/schedules.py _get_warmup_ops, p micro-batches per round); in
    stages that is ((p − r − 1)·2 + (v − 1)·p + 1)/v:
    p·(1 + (p − 1)/(p·v)) on the first (Korthikanti et al. 2022 §4.2.3) and ((v − 1)·p + 1)/v
    on the last, where 1F1B holds one.

    combined_layers: the stage's layers when Megatron's combined 1F1B schedule runs
    (frameworks.ep_overlap): each of its steps runs layer i's forward of one micro-batch before
    layer L-1-i's backward of the one before frees it (model_chunk_schedule_plan.py), one layer
    more than a micro-batch at its peak; pipelined, one more chunk forward in the warm-up
    (schedules.py: num_warmup_microbatches + 1)."""
    p, v, m = plan.pp, plan.virtual_stages, plan.grad_accum_steps
    if p == 1:
        return 1.0 + (1 / combined_layers if combined_layers and m > 1 else 0.0)
    r = {"first": 0, "middle": 1, "last": p - 1}.get(stage, 0)
    if v <= 1:
        return float(min(m, p - r))
    chunks = min((p - r - 1) * 2 + (v - 1) * p + 1 + (1 if combined_layers else 0), m * v)
    return chunks / v


def recomputed_layers(plan: Plan, layers: float) -> float:
    """Layers of a stage whose forward is recomputed: all under full recompute unless
    plan.recompute_layers limits it (block recompute); none otherwise."""
    if plan.recompute != "full":
        return 0
    if plan.recompute_layers and plan.recompute_layers < layers:
        return plan.recompute_layers
    return layers


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
        f"activations the schedule holds at once" + (" (the combined 1F1B schedule of --overlap-moe-expert-parallel-"
                                                     "comm: one layer more)" if pp == 1 and in_flight > 1 else "")
        + f" [{label()}]")
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
    elif recompute == "selective" and set(recompute_modules(w)) - {"core_attn"}:
        # Megatron's named modules (mla_up_proj, moe_act, mlp, shared_experts) rebuild what they
        # dropped just before that part's backward, beside all the layer keeps; the parts' backwards
        # run one after another, so the largest one counts
        whole = _layer_bytes(w, tp, cp, sp, "none", b)
        working_set = max(whole - _layer_bytes(replace(w, recompute_modules=(name,)), tp, cp, sp, "selective", b)
                          for name in recompute_modules(w) if name != "core_attn")
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
