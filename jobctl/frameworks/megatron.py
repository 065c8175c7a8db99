"""Megatron-LM / Megatron-Core: what it runs and its `pretrain_gpt.py` flags.

Read from Megatron-LM tag core_v0.16.1 (megatron/training/arguments.py, the argument
definitions and `validate_args`) and the megatron-core 0.16.1 wheel
(megatron/core/transformer/transformer_config.py, model_parallel_config.py,
pipeline_parallel/schedules.py, optimizer/optimizer_config.py, num_microbatches_calculator.py).
"""

from __future__ import annotations

from jobctl.frameworks.base import (
    Capabilities,
    Framework,
    GradBuffer,
    Rendered,
    Selective,
    StateRecipe,
    common_problems,
    ep_overlap,
    flex_backend,
    fp8_param_gather,
    front_loaded,
    num,
    recompute_modules,
)
from jobctl.model import CHECKPOINT_DIR_TOKEN

ARGS = "megatron/training/arguments.py@core_v0.16.1"

CAPS = Capabilities(
    name="megatron",
    title="Megatron-LM (pretrain_gpt.py) on Megatron-Core",
    package="megatron-core",
    versions=("0.16.1",),
    tp=True,
    sequence_parallel="optional",
    cp=True,
    pp=True,
    schedules=("1F1B", "interleaved 1F1B"),
    interleaved=True,
    pipeline_layout=True,
    mtp=True,
    shardings=("none", "zero1"),
    recompute=("none", "selective", "full"),
    selective=Selective.CORE_ATTENTION,
    recompute_modules=("core_attn", "mla_up_proj", "moe_act", "mlp", "shared_experts"),
    recompute_layers=True,
    offload=("none", "optimizer"),
    optimizers=("adamw", "sgd", "sgd-momentum"),
    methods=("full",),
    precisions=("bf16-mixed", "fp16-mixed", "fp32", "fp8", "mxfp8", "nvfp4"),
    vocab_multiple_per_tp=128,
    state_recipe=StateRecipe.MEGATRON,
    reduce_bytes=4,
    grad_buffer=GradBuffer.NONE,
    fused_kernels=True,
    te_layernorm_mlp=True,
    tp_comm_overlap=True,
    fp8_param_gather=True,
    offload_keeps_grads=True,
    in_place_cross_entropy=True,
    fused_cross_entropy_logit_bytes=10.0,
    te_cross_entropy=True,
    moe=True,
    mla=True,
    gpt_oss=True,
    ep_overlap=True,
    moe_dispatchers=("alltoall", "hybridep", "deepep"),
    moe_expert_launches=True,
    sources=(
        ("--cross-entropy-loss-fusion (native impl) runs the same steps as jit-compiled functions "
         "(torch.compile); compiled, the gradient is not made in place: backward holds the kept fp32 "
         "softmax, an fp32 gradient and its bf16 cast, 10 B per logit (the bf16 logits are freed after "
         "forward); measured on Megatron-Core's own functions compiled on CPU "
         "(benchmarks/megatron_cross_entropy.py), and against the functional tests' memory",
         "megatron/core/fusions/fused_cross_entropy.py, megatron/core/jit.py, "
         "models/common/language_module/language_module.py compute_language_model_loss"),
        ("train.fused_cross_entropy: te renders --cross-entropy-fusion-impl te: Transformer Engine's "
         "CrossEntropyFunction saves the 16-bit logits themselves (with 12 B of fp32 row statistics per "
         "token) and its backward kernel writes their gradient over them: 2 B per logit, no fp32 copy; "
         "what every Megatron-Bridge perf run uses (scripts/performance overrides: cross_entropy_fusion_impl 'te')",
         "megatron/core/models/common/language_module/language_module.py compute_language_model_loss; "
         "transformer_engine/pytorch/cross_entropy.py, triton/cross_entropy.py"),
        ("the loss (vocab-parallel at any tp) upcasts the logits once, then exponentiates and "
         "normalises that fp32 copy in place and saves it as the softmax; backward turns it into the "
         "gradient in place: 16-bit logits + 4 B per element at the peak; checked against Megatron-LM's "
         "functional-test memory (benchmarks/megatron_memory.py: the 7B rows from -23%/+7% to within 1%)",
         "megatron/core/tensor_parallel/cross_entropy.py (calculate_logits_max, calculate_predicted_logits, "
         "backward)"),
        ("interleaved 1F1B: rank r runs (p - r - 1)·2 + (v - 1)·p chunk forwards before its first "
         "backward, so even the last stage holds ((v - 1)·p + 1)/v micro-batches of activations",
         "megatron/core/pipeline_parallel/schedules.py (get_pp_rank_microbatches, num_warmup_microbatches)"),
        ("tp, pp, cp, sequence parallel, vocabulary padding", f"{ARGS}: --tensor-model-parallel-size, "
         "--pipeline-model-parallel-size, --context-parallel-size, --sequence-parallel, --make-vocab-size-divisible-by "
         "(default 128, times tp in tokenizer.py _vocab_size_with_padding)"),
        ("schedules: 1F1B, or interleaved 1F1B when virtual stages are set; no schedule flag",
         "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func"),
        ("interleaved needs micro-batches a multiple of pp (microbatch_group_size_per_vp_stage defaults to pp)",
         "megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving"),
        ("sharding: DDP, or --use-distributed-optimizer (optimizer states and fp32 main params over dp*cp = ZeRO-1)",
         "megatron/core/distributed/distributed_data_parallel_config.py use_distributed_optimizer"),
        ("selective = checkpoint core_attn on every layer; full = --recompute-method uniform|block "
         "--recompute-num-layers N (N per model chunk)", "megatron/core/transformer/transformer_block.py "
         "_checkpointed_forward; transformer_config.py recompute_* docstrings"),
        ("offload: optimizer only, --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs "
         "the distributed optimizer and adam", f"{ARGS} validate_args; megatron/core/optimizer/optimizer_config.py"),
        ("optimizer offload copies the main grads to the host for the step; the GPU grad buffer stays",
         "megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py"),
        ("optimizers: --optimizer adam (decoupled weight decay, AdamW) | sgd (--sgd-momentum)", ARGS),
        ("bf16 turns accumulate_allreduce_grads_in_fp32 on: fp32 main grads, fp32 all-reduce", f"{ARGS} validate_args"),
        ("no LoRA/QLoRA in Megatron-LM's training scripts (PEFT lives in NeMo / Megatron-Bridge)", ARGS),
        ("TransformerEngine LayerNormMLP keeps fc1 output and the SwiGLU output", "transformer_engine/pytorch/module/layernorm_mlp.py"),
        ("--tp-comm-overlap: the sequence-parallel all-gathers and reduce-scatters run under the GEMMs on "
         "Transformer Engine's userbuffers (bootstrapped over NCCL by default, --tp-comm-bootstrap-backend); "
         "validate_args requires --sequence-parallel with it; one registered buffer of (seq·micro-batch/cp, "
         "hidden) per overlapped GEMM, 10 in all", f"{ARGS} validate_args; megatron/training/initialize.py "
         "_initialize_tp_communicators; transformer_engine/pytorch/module/base.py initialize_ub"),
        ("--overlap-moe-expert-parallel-comm: after one micro-batch's forward, each step pairs layer i's "
         "forward of the next micro-batch with layer L-1-i's backward of this one (attention forward, MLP "
         "backward, dispatch forward, dispatch backward, MLP forward, combine forward, attention backward), "
         "so one's all-to-alls run under the other's compute and a stage holds one layer more (one model "
         "chunk more when pipelined: one more warm-up forward); --delay-wgrad-compute moves the experts' "
         "weight gradients under the backward dispatch. TransformerConfig requires ep > 1, the alltoall or "
         "flex dispatcher, no full recompute, virtual stages with pp > 1, a bf16/fp16 model",
         "megatron/core/models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run; "
         "pipeline_parallel/combined_1f1b.py; schedules.py (num_warmup_microbatches + 1); "
         "transformer/transformer_config.py __post_init__"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep (train.moe_dispatcher: "
         "hybridep): DeepEP's HybridEP kernels, which the container must have, dispatch and combine the tokens; "
         "a token crosses to its peer GPU in each other node holding one of its experts once and is written to "
         "that node's ranks over NVLink; one registered buffer per rank, sized at the first dispatch; float32 "
         "routing probabilities (--moe-router-dtype fp32); BF16 dispatch (no FP8 dispatch)",
         "megatron/core/transformer/moe/token_dispatcher.py _HybridEPManager; moe/fused_a2a.py "
         "HybridEPDispatch, init_hybrid_ep_buffer; deepseek-ai/DeepEP docs/Hybrid-EP_Implementation.md §4.2, §8"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep (train.moe_dispatcher: "
         "deepep): DeepEP's normal kernels, which the container must have; across nodes a token crosses to its "
         "peer GPU in each other node holding one of its experts once and is forwarded there over NVLink; one "
         "buffer per rank of fixed size (DeepEP's recommended configs for the EP size, 20 SMs); float32 routing "
         "probabilities. EP groups of 2-160 ranks from DeepEP's table, 8 NVLink peers per node across nodes "
         "(not a GB200 rack's domain: hybridep)",
         "megatron/core/transformer/moe/token_dispatcher.py _DeepepManager; moe/fused_a2a.py get_buffer; "
         "deepseek-ai/DeepEP deep_ep/buffers/legacy.py get_dispatch_config, get_combine_config; "
         "csrc/legacy/config.hpp get_nvl_buffer_size_hint, get_rdma_buffer_size_hint"),
    ),
)

# --recompute-method uniform|block, --recompute-num-layers: TransformerConfig.__post_init__
# requires both with granularity full, and neither with selective.


def pipeline_split(layers: int, pp: int) -> tuple[int, bool, bool] | None:
    """(layers per stage counted with the embedding/loss, account for embedding, account for loss):
    Megatron counts the embedding and/or the loss as a layer in the split when asked
    (--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split,
    arguments.py validate_args), which shortens the first and/or last stage by one layer — the
    split jobctl's memory model uses (planner/memory.py stage_layers). None: no even split."""
    for emb, loss in ((False, False), (False, True), (True, True)):
        total = layers + emb + loss
        if total % pp == 0:
            return total // pp, emb, loss
    return None


def pipeline_layout(layers: int, pp: int, v: int, mtp: int = 0) -> str:
    """--pipeline-model-parallel-layout for the split no even one takes (stage_layers'
    front_loaded): pp·v stages separated by "|", the embedding ("E") on the first, the MTP modules
    ("m") and the loss ("L") on the last, k decoder layers ("t") on each but the last, which holds
    the rest; "(...)*n" repeats (PipelineParallelLayerLayout.parse_str_to_list). 61 layers over 4
    stages with one MTP module: "Et*16|(t*16|)*2t*13mL", as Megatron-Bridge lays out DeepSeek-V3.
    The stages go round the ranks: stage i on rank i % pp."""
    per_rank = front_loaded(layers, pp, v)[0]
    k, stages = per_rank // v, pp * v
    middle = f"(t*{k}|)*{stages - 2}" if stages > 2 else ""
    return f"Et*{k}|{middle}t*{layers - (stages - 1) * k}{'m' * mtp}L"


# The EP group sizes DeepEP's normal kernels have a recommended config for (deep_ep/buffers/legacy.py
# get_dispatch_config asserts the size is one of them), and the NVLink peers its internode
# kernels assume in a node (csrc/kernels/legacy/compiled.cuh LEGACY_NUM_MAX_NVL_PEERS)
DEEPEP_EP_SIZES = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160)
DEEPEP_NVL_PEERS = 8


def deepep_problems(ep: int, gpus_per_node: int) -> list[str]:
    out = []
    if ep not in DEEPEP_EP_SIZES:
        out.append(f"ep={ep}: DeepEP's normal kernels take EP groups of {', '.join(map(str, DEEPEP_EP_SIZES))} ranks "
                   "(deep_ep/buffers/legacy.py get_dispatch_config)")
    if ep > gpus_per_node and gpus_per_node != DEEPEP_NVL_PEERS:
        out.append(f"ep={ep} crosses nodes of {gpus_per_node} GPUs: DeepEP's internode kernels assume "
                   f"{DEEPEP_NVL_PEERS} NVLink peers per node (LEGACY_NUM_MAX_NVL_PEERS; Megatron-Core: only hybridep "
                   "spans a multi-node NVLink domain): use train.moe_dispatcher: hybridep")
    return out


def problems(plan, w) -> list[str]:
    out = common_problems(CAPS, plan, w)
    v = getattr(plan, "virtual_stages", 1)
    split = pipeline_split(w.model.layers, plan.pp) if plan.pp > 1 else (w.model.layers, False, False)
    if split is None and front_loaded(w.model.layers, plan.pp, v) is None:
        per_rank = -(-w.model.layers // plan.pp)
        out.append(f"{w.model.layers} layers do not split over pp={plan.pp}, even counting the embedding and "
                   f"the loss as layers (arguments.py validate_args), nor with a layout of {per_rank} per rank"
                   + (f" in {v} virtual stages of {per_rank / v:g}" if v > 1 else "")
                   + " and the last stage short (--pipeline-model-parallel-layout; the last needs at least one)")
    if v > 1:
        if plan.grad_accum_steps % plan.pp or plan.grad_accum_steps < plan.pp:
            out.append(f"Megatron's interleaved schedule needs the micro-batch count ({plan.grad_accum_steps}) to be "
                       f"a multiple of pp ({plan.pp}) (schedules.py, microbatch_group_size_per_vp_stage = pp)")
        if split is not None and split[0] % v:
            out.append(f"--num-layers-per-virtual-pipeline-stage: {split[0]} layers per stage do not divide into "
                       f"{v} virtual stages (arguments.py validate_args)")
    if plan.offload == "optimizer" and plan.sharding != "zero1":
        out.append("Megatron offloads the optimizer only with the distributed optimizer (--optimizer-cpu-offload needs "
                   "--use-precision-aware-optimizer, which needs --use-distributed-optimizer): sharding must be zero1")
    if plan.offload == "optimizer" and w.optimizer != "adamw":
        out.append("Megatron's CPU optimizer offload runs Adam(W) only (optimizer/__init__.py: decoupled_weight_decay)")
    if plan.recompute == "full" and plan.recompute_layers and v > 1 and plan.recompute_layers % v:
        out.append(f"--recompute-num-layers counts layers per model chunk: {plan.recompute_layers} layers per stage "
                   f"do not divide over {v} virtual stages")
    if plan.cp > 1 and w.seq_len % (2 * plan.cp):
        out.append(f"seq-length should be a multiple of 2 * context-parallel-size: {w.seq_len} % {2 * plan.cp}")
    ep = getattr(plan, "ep", 1)
    if flex_backend(w, plan) == "deepep":
        out += deepep_problems(ep, plan.gpus_per_node)
    if w.model.moe is not None:
        if w.model.moe.experts % ep:
            out.append(f"--expert-model-parallel-size {ep} does not divide --num-experts {w.model.moe.experts}")
        if ep > 1 and plan.tp > 1 and not plan.sequence_parallel:  # validate_args, word for word
            out.append("When using expert parallelism and tensor parallelism, sequence parallelism must be used.")
    return out


def render(plan, w) -> Rendered:
    """The plan as pretrain_gpt.py's flags (the model, parallelism, batch, memory knobs,
    precision), and the environment Megatron needs for them."""
    a = [*_model_flags(w), *_moe_flags(plan, w), *_parallel_flags(plan, w.model.layers, w.mtp_layers),
         *_memory_flags(plan, w),
         *_training_flags(w),
         *_schedule_flags(w), *_tokenizer_flags(w), *_checkpoint_flags(w), *_grad_reduce_flags(w)]
    env = {}
    if plan.tp > 1 or plan.cp > 1:
        # validate_args refuses tp/cp > 1 without it on Hopper and older (compute/comm ordering)
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    notes = ["dp and the number of micro-batches are derived by Megatron: dp = world / (tp*pp*cp) = "
             f"{plan.dp}, micro-batches = global / (micro * dp) = {plan.grad_accum_steps}"]
    if w.grad_reduce == "auto" and w.grad_reduce_dtype == "bf16":
        notes.append("gradients are kept and reduced in bf16 (--grad-reduce-in-bf16), as Megatron-Bridge's perf "
                     "recipes run; train.grad_reduce: fp32 restores Megatron-LM's fp32 main grads (+2 B per parameter)")
    if w.training.lr is None:
        notes.append("train.lr is not set: Megatron's scheduler needs --lr (training.py fails on float(None)); "
                     "set train.lr in the recipe")
    if w.training.steps is None:
        notes.append("train.steps (or train.tokens) is not set: give Megatron --train-iters or --train-samples")
    return Rendered(CAPS.name, tuple(str(x) for x in a), {}, env, tuple(notes), overlaps=tuple(_overlaps_on(plan, w)))


def _model_flags(w) -> list:
    """The model, which Megatron builds from flags."""
    m = w.model
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden,
         "--num-attention-heads", m.heads]
    if m.kv_heads != m.heads:
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    a += ["--seq-length", w.seq_len, "--max-position-embeddings", max(w.seq_len, m.max_seq_len or 0)]
    if m.family == "llama":
        a += ["--position-embedding-type", "rope", "--rotary-base", num(m.rope_theta), "--normalization", "RMSNorm"]
        a += _activation_flags(m)
        # biases: none, or (gpt-oss) on every linear, Q, K and V included (add_bias_linear is
        # Megatron's default; the search refuses a model biased on some linears only)
        a += ["--add-qkv-bias"] if m.attention_bias else ["--disable-bias-linear"]
        if m.rope_scaling:  # Llama 3.1's (megatron/core/models/common/embeddings/rope_utils.py)
            a += ["--use-rope-scaling", "--rope-scaling-factor", num(m.rope_scaling)]
        if not m.tied_embeddings:
            a.append("--untie-embeddings-and-output-weights")
    if m.attention_sinks:  # a learned logit per head beside the keys (dot_product_attention.py softmax_type)
        a += ["--softmax-type", "learnable"]
    if m.sliding_window:  # Megatron-Bridge's gpt-oss bridge: window (W - 1, 0), full attention every N-th layer
        a += ["--window-size", f"{m.sliding_window - 1},0"]
        if m.window_full_every:
            a += ["--window-attn-skip-freq", m.window_full_every]
    if w.mtp_layers:  # built on the last stage (multi_token_prediction.py), loss weight 0.1 by default
        a += ["--mtp-num-layers", w.mtp_layers]
    return a + ["--norm-epsilon", num(m.norm_eps)]


def _activation_flags(m) -> list:
    """The gated MLP's activation: SwiGLU, or gpt-oss's clamped GEGLU as Megatron-Bridge's gpt-oss
    bridge sets it (quick_gelu with gated_linear_unit, glu_linear_offset 1.0,
    activation_func_clamp_value 7.0: models/gpt_oss/gpt_oss_bridge.py @067f987df0)."""
    if m.activation == "clamped-geglu":
        return ["--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0"]
    return ["--swiglu"]


def _moe_flags(plan, w) -> list:
    """A mixture of experts and multi-head latent attention in Megatron-LM's flags (arguments.py
    _add_moe_args, _add_mla_args): the routed experts with their width and top-k, the shared
    experts, which layers route (--moe-layer-freq as a per-layer list where not all do), the
    router's scoring, expert parallelism with expert tensor parallelism 1 (the planner's
    model: Megatron's default ETP is TP), grouped GEMMs and the alltoall dispatcher; MLA's ranks
    and head widths; a head width other than h/a (--kv-channels) and per-head q/k norms."""
    m, a = w.model, []
    if m.explicit_head_dim and m.mla is None:
        a += ["--kv-channels", m.explicit_head_dim]
    if m.qk_norm or m.mla is not None:  # MLA: the norms on the compressed q and kv latents
        a.append("--qk-layernorm")
    if m.mla is not None:
        x = m.mla
        a += ["--multi-latent-attention", "--kv-lora-rank", x.kv_lora_rank, "--qk-head-dim", x.qk_nope_head_dim,
              "--qk-pos-emb-head-dim", x.qk_rope_head_dim, "--v-head-dim", x.v_head_dim]
        if x.q_lora_rank:
            a += ["--q-lora-rank", x.q_lora_rank]
    x = m.moe
    if x is None:
        return a
    a += ["--num-experts", x.experts, "--moe-ffn-hidden-size", x.expert_ffn, "--moe-router-topk", x.top_k,
          "--expert-model-parallel-size", plan.ep, "--expert-tensor-parallel-size", 1,
          "--moe-grouped-gemm"]
    backend = flex_backend(w, plan)
    if backend:
        # DeepEP's kernels take float32 routing probabilities (token_dispatcher.py
        # _HybridEPManager.dispatch and _DeepepManager.setup_metadata cast and warn otherwise)
        a += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", backend,
              "--moe-router-dtype", "fp32"]
    else:
        a += ["--moe-token-dispatcher-type", "alltoall"]
    if ep_overlap(w, plan):  # paired as Megatron-Bridge's MoE perf recipes pair them
        # (perf_recipes/deepseek/common.py:76-77 @067f987df0)
        a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    # the load-balancing loss the model was trained with: DeepSeek-V3's small sequence-wise loss
    # beside its expert bias, the others' auxiliary loss (Megatron-LM's default is none; jobctl
    # models a balanced router, so the rendered run balances it)
    balance, coeff = ("seq_aux_loss", 1e-4) if x.score_bias else ("aux_loss", MOE_AUX_LOSS_COEFF)
    a += ["--moe-router-load-balancing-type", balance, "--moe-aux-loss-coeff", num(coeff)]
    if x.shared_experts:
        a += ["--moe-shared-expert-intermediate-size", x.shared_experts * (x.shared_ffn or x.expert_ffn)]
    if m.moe_layers != m.layers:
        a += ["--moe-layer-freq", "[" + ",".join(str(int(x.is_moe(i))) for i in range(m.layers)) + "]"]
    if x.score_bias:  # DeepSeek-V3: sigmoid scores with a per-expert bias that balances the load
        a += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
    if x.groups:  # group-limited routing (DeepSeek-V3: top 8 experts from the best 4 of 8 groups)
        a += ["--moe-router-num-groups", x.groups, "--moe-router-group-topk", x.groups_kept]
    if x.capacity_factor:
        a += ["--moe-expert-capacity-factor", num(x.capacity_factor)]
    return a


# The auxiliary load-balancing loss's weight (Megatron-LM's default is 0.0, no balancing): 1e-3,
# the router_aux_loss_coef of Mixtral's and Qwen3-MoE's released configs (transformers'
# MixtralConfig, Qwen3MoeConfig) and Megatron-Bridge's Qwen3 MoE bridge (qwen3_moe_bridge.py:65
# @067f987df0). DeepSeek-V3 (a router with expert bias): a sequence-wise loss of 1e-4, its
# paper's alpha, as Megatron-Bridge's deepseek_v3_bridge.py:68-71 sets it.
MOE_AUX_LOSS_COEFF = 1e-3


def _schedule_flags(w) -> list:
    """The recipe's steps, learning-rate schedule, optimizer settings and seed (Megatron's own
    defaults differ: weight decay 0.01, beta2 0.999)."""
    t = w.training
    a = ["--train-iters", t.steps] if t.steps else []
    if t.lr is not None:
        a += ["--lr", num(t.lr), "--lr-decay-style", t.schedule]
        if t.min_lr is not None:
            a += ["--min-lr", num(t.min_lr)]
        if t.warmup_steps:
            a += ["--lr-warmup-iters", t.warmup_steps]
    a += ["--weight-decay", num(t.weight_decay), "--clip-grad", num(t.grad_clip), "--seed", t.seed]
    if w.optimizer == "adamw":
        a += ["--adam-beta1", num(t.betas[0]), "--adam-beta2", num(t.betas[1]), "--adam-eps", num(t.eps)]
    return a


def _checkpoint_flags(w) -> list:
    """Save to and load from the chain's checkpoint folder: Megatron loads the newest checkpoint
    there (latest_checkpointed_iteration.txt) and starts afresh when there is none
    (training/checkpointing.py load_checkpoint). Its default format, torch_dist, reshards on
    load, so an OOM ladder's next attempt with other tp/pp resumes too."""
    a = ["--save", CHECKPOINT_DIR_TOKEN, "--load", CHECKPOINT_DIR_TOKEN]
    a += ["--save-interval", w.training.checkpoint_every] if w.training.checkpoint_every else []
    # "iteration N/ M" every step (the default, 100, would leave the hang watchdog blind for 100 steps)
    return a + ["--log-interval", 1]


# The recipe's tokenizer as Megatron's (megatron/training/tokenizer/tokenizer.py build_tokenizer):
# NullTokenizer (mock data) counts one end-of-document token on top of --vocab-size.
_TOKENIZERS = {"huggingface": "HuggingFaceTokenizer", "sentencepiece": "SentencePieceTokenizer",
               "tiktoken": "TikTokenizer"}


def _tokenizer_flags(w) -> list:
    t = w.training
    if t.tokenizer == "null":
        return ["--tokenizer-type", "NullTokenizer", "--vocab-size", w.model.vocab - 1]
    a = ["--tokenizer-type", _TOKENIZERS[t.tokenizer], "--tokenizer-model", t.tokenizer_path]
    return a + (["--tiktoken-pattern", "v2"] if t.tokenizer == "tiktoken" else [])


def _parallel_flags(plan, layers: int, mtp: int = 0) -> list:
    """tp, pp (with its uneven split and virtual stages), cp, sequence parallel, the batch (dp
    and the micro-batch count are derived: dp = world/(tp*pp*cp), micro-batches = global/(micro*dp))."""
    a = ["--tensor-model-parallel-size", plan.tp, "--pipeline-model-parallel-size", plan.pp,
         "--context-parallel-size", plan.cp]
    if plan.sequence_parallel and plan.tp > 1:
        a += ["--sequence-parallel", *_tp_overlap_flags(plan)]
    split = pipeline_split(layers, plan.pp) if plan.pp > 1 else None
    if plan.pp > 1 and split is None:  # the last stage short: written down stage by stage
        a += ["--pipeline-model-parallel-layout", pipeline_layout(layers, plan.pp, plan.virtual_stages, mtp)]
    elif plan.pp > 1:
        per_stage, emb, loss = split
        if emb:
            a.append("--account-for-embedding-in-pipeline-split")
        if loss:
            a.append("--account-for-loss-in-pipeline-split")
        if plan.virtual_stages > 1:
            a += ["--num-layers-per-virtual-pipeline-stage", per_stage // plan.virtual_stages]
    return a + ["--micro-batch-size", plan.micro_batch_size, "--global-batch-size", plan.global_batch_size]


def _memory_flags(plan, w) -> list:
    """The distributed optimizer (with FP8 weights where the recipe is fp8/mxfp8), recomputation
    and optimizer offload."""
    a = ["--use-distributed-optimizer"] if plan.sharding == "zero1" else []
    if fp8_param_gather(CAPS, w.precision, w.fp8_recipe, plan.sharding):
        # the layers' weights in FP8 only, gathered in FP8 (memory: planner/memory/states.py); MXFP8
        # gathers into the gradient buffer, as Megatron-Bridge's MXFP8 perf recipes run
        a += ["--fp8-param-gather"] + (["--reuse-grad-buf-for-mxfp8-param-ag"] if w.precision == "mxfp8" else [])
    if plan.recompute == "selective":
        a += ["--recompute-granularity", "selective", "--recompute-modules", *recompute_modules(w)]
    elif plan.recompute == "full":
        a += ["--recompute-granularity", "full"]
        n = plan.recompute_layers
        if n:  # the first n layers of each model chunk are recomputed, the rest kept
            a += ["--recompute-method", "block", "--recompute-num-layers", max(1, n // max(plan.virtual_stages, 1))]
        else:  # every layer, one at a time
            a += ["--recompute-method", "uniform", "--recompute-num-layers", 1]
    if plan.offload == "optimizer":
        a += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
    return a + _overlap_flags(plan)


def _overlaps_on(plan, w) -> list[str]:
    """What the rendered flags overlap, in words (the plan says which overlaps it turned on)."""
    out = []
    if _tp_overlap_flags(plan):
        out.append("TP under GEMMs (--tp-comm-overlap)")
    if plan.dp * plan.cp > 1:
        out.append("grad reduce (--overlap-grad-reduce, under the backward)")
        if plan.sharding == "zero1":
            out.append("param gather (--overlap-param-gather, under the forward"
                       + ("; in FP8: --fp8-param-gather)" if fp8_param_gather(CAPS, w.precision, w.fp8_recipe,
                                                                             plan.sharding) else ")"))
    if ep_overlap(w, plan):
        out.append("EP all-to-alls (--overlap-moe-expert-parallel-comm: one micro-batch's dispatch and combine "
                   "under the next one's compute)")
    if plan.pp > 1 and plan.virtual_stages > 1:
        out.append("P2P sends (overlap_p2p_comm under the interleaved stages, Megatron's default)")
    return out


def _tp_overlap_flags(plan) -> list:
    """Tensor-parallel communication under the GEMMs, which the step model counts on
    (planner/perf.py tp_overlap): Megatron-Bridge's Llama 3 perf recipes turn it on wherever
    tp > 1 with sequence parallelism (perf_recipes/llama/h100/llama3.py, 70B)."""
    return ["--tp-comm-overlap"] if plan.tp > 1 and plan.sequence_parallel else []


def _grad_reduce_flags(w) -> list:
    """The main-grad buffer and its reduction in bf16 (train.grad_reduce: bf16, or auto)."""
    return ["--grad-reduce-in-bf16"] if w.grad_reduce_dtype == "bf16" else []


def _overlap_flags(plan) -> list:
    """The data-parallel overlaps the step model counts on (planner/perf.py _data_parallel: the
    gradient reduce-scatter behind the backward, the parameter all-gather behind the forward),
    off by default in Megatron-LM: --overlap-grad-reduce with any data-parallel group, and
    --overlap-param-gather with the distributed optimizer, which validate_args requires of it
    together with --overlap-grad-reduce (arguments.py). The interleaved schedule's P2P overlap
    is on by default (--no-overlap-p2p-communication turns it off)."""
    if plan.dp * plan.cp == 1:
        return []
    return ["--overlap-grad-reduce"] + (["--overlap-param-gather"] if plan.sharding == "zero1" else [])


def _training_flags(w) -> list:
    """Precision, optimizer, attention backend and the fused loss."""
    a = {"bf16-mixed": ["--bf16"], "fp16-mixed": ["--fp16"]}.get(w.precision, [])
    a += _low_precision_flags(w)
    a += ["--optimizer", "adam" if w.optimizer == "adamw" else "sgd"]
    if w.optimizer == "sgd":
        a += ["--sgd-momentum", 0.0]
    if w.attention == "flash":
        # learnable sinks (gpt-oss): Transformer Engine (>= 2.8) picks a kernel that takes them,
        # cuDNN's fused attention, as Megatron-Bridge's gpt-oss perf recipes let it ("auto")
        a += ["--attention-backend", "auto" if w.model.attention_sinks else "flash"]
    if w.fused_cross_entropy:  # Megatron-Core's own fused loss (fusions/fused_cross_entropy.py),
        # or Transformer Engine's (language_module.py compute_language_model_loss: te_parallel_cross_entropy)
        a += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl",
              "te" if w.fused_cross_entropy == "te" else "native"]
    return a


def _low_precision_flags(w) -> list:
    """FP8/MXFP8/NVFP4 as Megatron-LM's arguments.py (core_v0.16.1) names them: Transformer
    Engine's recipes over BF16 training (the main weights, gradients and optimizer stay as under
    --bf16). fp8: the hybrid format (E4M3 forward, E5M2 gradients) with the recipe's scaling,
    delayed scaling from a 1024-step amax history (TE's default length, max of the history);
    mxfp8: E4M3 with block scales (Blackwell); nvfp4: E2M1 with --fp4-recipe nvfp4."""
    if w.precision == "fp8":
        a = ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", w.fp8_recipe]
        if w.fp8_recipe == "delayed":
            a += ["--fp8-amax-history-len", 1024, "--fp8-amax-compute-algo", "max"]
        return a
    if w.precision == "mxfp8":
        return ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    if w.precision == "nvfp4":
        return ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    return []


FRAMEWORK = Framework(CAPS, problems, render)
