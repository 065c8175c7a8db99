"""torchtitan 0.3.0: what it runs and its command-line overrides.

Read from the torchtitan 0.3.0 wheel: torchtitan/config/configs.py (TrainingConfig,
ParallelismConfig), config/manager.py (ConfigManager: `--module`, `--config`, tyro overrides),
trainer.py (batch arithmetic, CUDA-graph and micro-batch checks),
distributed/activation_checkpoint.py (the AC policies), distributed/fsdp.py (reshard policy),
distributed/pipeline_parallel.py (schedules, stages per rank), distributed/parallel_dims.py,
components/loss.py (ChunkedLossWrapper), models/qwen3 and models/deepseek_v3 (MoE, MLA, their
registry configs), models/common/moe.py and token_dispatcher.py.

0.3.0 has no TOML job file: a run is `python -m torchtitan.train --module M --config F` plus
`--section.key=value` overrides, the activation-checkpointing policy a trailing subcommand.
"""

from __future__ import annotations

import re

from jobctl.frameworks.base import (
    Capabilities,
    Framework,
    GradBuffer,
    Rendered,
    Selective,
    StateRecipe,
    common_problems,
    data_parallel_overlaps,
    graphed_step,
    num,
    ratio,
)
from jobctl.model import CHECKPOINT_DIR_TOKEN, FRAMEWORK_ON_PYTHONPATH

TT = "torchtitan 0.3.0"

CAPS = Capabilities(
    name="torchtitan",
    title="torchtitan (python -m torchtitan.train)",
    package="torchtitan",
    versions=("0.3.0",),
    skews=(("torch", "2.13", "torchtitan 0.3.0 calls torch.distributed.set_timeout (distributed/utils.py:595), "
            "which torch 2.13 does not have (the run fails after its first step), and passes arg_mbs= to the "
            "pipeline schedule's step (trainer.py:857), which torch 2.13's schedules (pipelining/schedules.py "
            "step) take as a model keyword; seen on CPU ranks, its default parallelism.spmd_backend "
            "'spmd_types' hands fully_shard parameters torch 2.13's FSDP2 refuses ('all parameters must be "
            "DTensors on the full SPMD mesh', models/llama3/parallelize.py:71), where "
            "--parallelism.spmd_backend=partial_dtensor runs"),),
    tp=True,
    sequence_parallel="with tp",
    cp=True,
    pp=True,
    schedules=("1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"),
    interleaved=True,
    shardings=("none", "zero3", "hsdp"),
    recompute=("none", "selective", "full"),
    selective=Selective.OP_SAC,
    recompute_layers=False,
    offload=("none", "optimizer+params"),
    optimizers=("adamw",),
    methods=("full",),
    # fp8, mxfp8: torchao's row-wise Float8 and MXFP8 through torchtitan's own converters, in a
    # registry config jobctl writes around the model's (render: LOW_PRECISION_MODULES)
    precisions=("bf16-mixed", "fp32", "fp8", "mxfp8"),
    fp8_recipes=("rowwise",),
    fp8_backend="torchao",
    low_precision_note=("jobctl renders torchtitan 0.3.0's Float8 (fp8, row-wise) and MXFP8; its NVFP4 "
                        "converter (models/llama3/config_registry.py *_nvfp4, with the spmd_types backend) is not "
                        "rendered yet: name such a config in your command with framework custom"),
    vocab_multiple_per_tp=1,
    state_recipe=StateRecipe.FP32_PARAMS,
    reduce_bytes=4,
    grad_buffer=GradBuffer.DDP_BUCKETS,
    fused_kernels=True,
    reshard_under_pp=False,
    keeps_logits_through_loss=False,
    fused_qkv=True,
    compiles=True,
    async_tp=True,
    sp_keeps_gathered_input=True,
    frees_grads_each_step=True,
    cuda_graphs=True,
    loss_chunks=8,
    loss_parallel_logit_bytes=16.0,
    pp_split_counts_ends=True,
    pp_stage_recv_buffers=True,
    moe=True,
    mla=True,
    moe_fp32_copies=True,
    sources=(
        ("mixtures of experts: parallelism.expert_parallel_degree; the experts' mesh borrows its ranks "
         "from FSDP and TP (efsdp = dp_shard x cp x tp / ep: expert tensor parallelism 1 when ep > 1); "
         "with ep 1 and tp > 1 the experts are split by TP instead", f"{TT} config/configs.py ParallelismConfig, "
         "distributed/parallel_dims.py, models/common/moe_sharding.py"),
        ("an MoE block is one FSDP unit, its routed experts sharded over efsdp (their own mesh when ep > 1)",
         f"{TT} distributed/fsdp.py apply_fsdp_to_decoder"),
        ("the MoE layer: fp32 gate under autocast, top-k of softmax/sigmoid scores, argsort dispatch, "
         "grouped GEMMs (torch._grouped_mm), fp32-weighted combine by scatter_add; no capacity factor in the "
         "default all-to-all dispatcher", f"{TT} models/common/moe.py, token_dispatcher.py"),
        ("registered MoE configs: qwen3_30b_a3b (Qwen3 30B-A3B), deepseek_v3_671b (MLA, one shared expert, 3 dense "
         "blocks first, sigmoid router over 8 expert groups; compile of the loss only, which --compile.components "
         "widens to the model where jobctl compiles it)",
         f"{TT} models/qwen3/config_registry.py, models/deepseek_v3/config_registry.py"),
        ("the default pipeline split gives each of the p stages (L + 2) // p 'layers', the first "
         "(L + 2) % p stages one more, the embedding counting as one on the first stage and the norm "
         "and output layer as one on the last (pipeline_parallel_first/last_stage_less_layers = 1); "
         "Llama 3 8B on PP 4: 8, 9, 8, 7 blocks (the last stage's 7 traced)", f"{TT} distributed/pipeline_parallel.py "
         "_generate_llm_fqn_per_model_part, config/configs.py"),
        ("under PP with FSDP, the 1F1B schedule's stage keeps each micro-batch's output (on the last "
         "stage: the logits) for its backward, and the sharded gradients are made only after the last "
         "backward (PipelineStage.perform_reduce_grad), when the activations are gone; traced on the "
         "first and last stages of 8B PP 2/4 and 405B TP 8 x PP 8 x FSDP 8",
         "torch distributed/pipelining/stage.py (fwd_cache, perform_reduce_grad)"),
        ("the trainer zeroes gradients with zero_grad(set_to_none=training.disable_cuda_graphs): where "
         "CUDA graphs are off (jobctl turns them off under PP and EP) FSDP2's sharded gradients are "
         "allocated block by block in backward (traced: none exist at the activation peak of a "
         "one-micro-batch step); under the default CUDA graphs they stay allocated (traced)",
         f"{TT} trainer.py train_step, components/optimizer.py; torch optim/optimizer.py"),
        ("under TP the norms run on sequence shards and their outputs are redistributed to whole "
         "sequences (Shard(1) -> Replicate) before the column-parallel wqkv / w1, w3 and output "
         "matmuls, which keep that gathered tensor for backward; traced (70B, TP 8): per block -41% -> "
         "exact without AC", f"{TT} models/llama3/model.py (TP plan), torch distributed/tensor/parallel/style.py"),
        ("loss parallel (TP > 1) runs _LossParallelCrossEntropy: it keeps the fp32 local log-probabilities "
         "and its backward allocates zeros_like(log_probs), exp(log_probs) and their sum before the cast: "
         "16 B per local logit at the peak (12 B without TP)", f"{TT} components/loss.py"),
        ("attention projects q, k and v with one fused `wqkv` linear, so op-level SAC's \"every second "
         "mm\" saves wqkv (q, k, v), w1 and w2 and recomputes wo and w3; traced: the per-block saved set "
         "moved from -3.1% to exact", f"{TT} models/common/attention.py (wqkv), distributed/activation_checkpoint.py"),
        ("the training step drops the bf16 logits once the loss is computed (`del pred`); the loss "
         "upcasts them (`pred.flatten(0, 1).float()`), so the fp32 log-probabilities and gradients remain; "
         "traced: 11.75 GiB at the loss backward for 8B, seq 8192, local batch 1 = 3 x 4 B x s x V "
         "(benchmarks/trace_memory.py, docs/memory-accuracy.md)",
         f"{TT} torchtitan/trainer.py forward_backward_step, components/loss.py cross_entropy_loss"),
        ("degrees: data_parallel_replicate_degree, data_parallel_shard_degree, tensor_parallel_degree, "
         "pipeline_parallel_degree, context_parallel_degree; enable_sequence_parallel defaults to True",
         f"{TT} torchtitan/config/configs.py ParallelismConfig"),
        ("FSDP2 is always applied; the mesh is dp_shard x cp, HSDP when dp_replicate > 1",
         f"{TT} torchtitan/models/llama3/parallelize.py, distributed/parallel_dims.py"),
        ("schedules by torch.distributed.pipelining names; multi-stage schedules with "
         "pipeline_parallel_layers_per_stage; embedding and output count as one layer each "
         "(pipeline_parallel_first/last_stage_less_layers = 1)", f"{TT} distributed/pipeline_parallel.py"),
        ("selective = op-level SAC: save the outputs of the 1st, 3rd, 5th... mm/linear of each block, "
         "attention and reduce-scatter outputs; recompute everything else. No layer-level SAC "
         "(removed before 0.3.0); full = checkpoint every block", f"{TT} distributed/activation_checkpoint.py"),
        ("under PP, fsdp_reshard_after_forward 'default' keeps parameters unsharded between forward and backward",
         f"{TT} distributed/fsdp.py get_fsdp_reshard_after_forward_policy"),
        ("offload: training.enable_cpu_offload = FSDP2 CPUOffloadPolicy (parameters, gradients, optimizer states)",
         f"{TT} config/configs.py TrainingConfig"),
        ("mixed precision: mixed_precision_param bfloat16|float32, mixed_precision_reduce float32 only; "
         "fp32 sharded parameters are the master copy", f"{TT} config/configs.py"),
        ("pipeline parallelism needs --training.disable_cuda_graphs, and so does expert parallelism with the "
         "all-to-all dispatcher (its split sizes go through the CPU); weight tying is refused under PP",
         f"{TT} trainer.py _validate_cuda_graphs; models/common/decoder.py"),
        ("gradient accumulation = global / (local_batch_size x dp_replicate x dp_shard); under PP "
         "local_batch_size is split into pipeline_parallel_microbatch_size micro-batches", f"{TT} trainer.py"),
        ("LoRA only as a model converter in a Python config (not reachable from the command line); no QLoRA",
         f"{TT} torchtitan/components/lora.py"),
        ("optimizer name AdamW or Adam (torch.optim)", f"{TT} torchtitan/components/optimizer.py"),
        ("Float8: the registry config's Linear layers swapped for torchao's Float8Linear by Float8LinearConverter "
         "(recipes rowwise and rowwise_with_gw_hp; the converter is built inside the config function, as "
         "llama3_405b's is), the output layer filtered out by name (lm_head); row-wise scaling casts at each GEMM "
         "and saves the 16-bit input and weight (torchao float8_linear.py)",
         f"{TT} components/quantization/float8.py, models/llama3/config_registry.py llama3_405b"),
        ("MXFP8: every Linear layer (the output layer too) swapped for torchao's MXFP8Linear by MXFP8LinearConverter "
         "(an empty fqns list converts all), as llama3_8b_mxfp8 does; it needs compute capability 10.0 and saves the "
         "16-bit input and weight (torchao prototype/moe_training/mxfp8_linear.py mx_mm)",
         f"{TT} components/quantization/mx.py, models/llama3/config_registry.py llama3_8b_mxfp8"),
    ),
)

# precision fp8 or mxfp8: a registry config jobctl writes into the job's framework folder, which
# the job puts on PYTHONPATH (runtime/runner.py): torchtitan's --module takes a module path
# (config/manager.py: "Fully qualified module path"), and a converter can only be named in Python
LOW_PRECISION_TEMPLATE = '''"""{doc}"""

from torchtitan.components.quantization import {converter}
from torchtitan.models.{module}.config_registry import {config} as registry_config


def {function}():
    config = registry_config()
    converter = {converter}.Config({converter_args}model_compile_enabled={compiled})
    config.model_spec.model = converter.build().convert(config.model_spec.model)
    return config
'''
# per precision: (module, config suffix, converter, its arguments, what it does)
LOW_PRECISION_MODULES = {
    "fp8": ("jobctl_torchtitan_float8", "float8", "Float8LinearConverter", 'recipe_name="{recipe}", filter_fqns=["lm_head"], ',
            "its Linear layers converted to Float8 by torchtitan's own Float8LinearConverter (torchao, {recipe} "
            "scaling), as its llama3_405b config does; the output layer (lm_head) stays 16-bit"),
    "mxfp8": ("jobctl_torchtitan_mxfp8", "mxfp8", "MXFP8LinearConverter", "",
              "every Linear layer converted to MXFP8 by torchtitan's own MXFP8LinearConverter (torchao), as its "
              "llama3_8b_mxfp8 config does"),
}
FLOAT8_MODULE = LOW_PRECISION_MODULES["fp8"][0]


def low_precision_module(precision: str, known: tuple[str, str], recipe: str, compiled: bool) -> tuple[str, str, str]:
    """(module, config function, the module's text) of the registry config `known` converted to
    `precision` by torchtitan's own converter."""
    import textwrap  # low-precision rendering only: not imported by every `plan`

    lp_module, suffix, converter, args, what = LOW_PRECISION_MODULES[precision]
    function = f"{known[1]}_{suffix}"
    doc = textwrap.fill(f"Written by jobctl: torchtitan's registry config {known[0]}.{known[1]} with "
                        f"{what.format(recipe=recipe)}. The job runs it as `--module {lp_module} --config "
                        f"{function}`, with this folder on PYTHONPATH.", width=96)
    text = LOW_PRECISION_TEMPLATE.format(
        doc=doc, module=known[0], config=known[1], function=function,
        converter=converter, converter_args=args.format(recipe=recipe), compiled=compiled)
    return lp_module, function, text


# The Llama 3 configs torchtitan registers (torchtitan/models/llama3/config_registry.py).
KNOWN_CONFIGS = {"8b": "llama3_8b", "70b": "llama3_70b"}  # llama3_405b turns on float8 (torchao)
# ... and the mixtures of experts jobctl plans for it (models/qwen3/config_registry.py)
# models/deepseek_v3/config_registry.py: deepseek_v3_671b builds no multi-token-prediction module
# (num_mtp_layers 0): caps.mtp is off, and the plan says it trains the main model only
KNOWN_MOE_CONFIGS = {"qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"), "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b")}


# The shapes of those configs (models/llama3/__init__.py _8b and _70b: dim, n_layers, n_heads,
# n_kv_heads, vocab_size; hidden_dim = compute_ffn_hidden_dim(dim, multiple_of 1024 or 4096,
# ffn_dim_multiplier 1.3)): (layers, hidden, heads, kv_heads, ffn_hidden, vocab)
REGISTRY_SHAPES = {"llama3_8b": (32, 4096, 32, 8, 14336, 128256), "llama3_70b": (80, 8192, 64, 8, 28672, 128256)}


def registry_config(model) -> tuple[str, str] | None:
    """(module, config function) of a model torchtitan registers, or None: named as one ("Llama 3.1
    8B", "meta-llama-3-70b", "llama3.1-8b"; spaces and underscores read as hyphens) and, for the
    dense Llama configs, of its shape (a model named like one but of another shape is not it)."""
    name = re.sub(r"[\s_]+", "-", model.name.strip().lower())
    if model.moe is not None:
        return KNOWN_MOE_CONFIGS.get(name)
    if model.family != "llama" or not re.match(r"^(meta-)?llama-?3(\.\d)?-", name):
        return None
    config = KNOWN_CONFIGS.get(name.rsplit("-", 1)[-1])
    shape = (model.layers, model.hidden, model.heads, model.kv_heads, model.ffn_hidden, model.vocab)
    return ("llama3", config) if config and REGISTRY_SHAPES[config] == shape else None


def degrees(plan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree): FSDP shards over dp_shard x cp."""
    if plan.sharding == "none":
        return plan.dp, 1
    if plan.sharding == "hsdp" and plan.hsdp_shard:
        shard = max(1, plan.hsdp_shard // plan.cp)
        return plan.dp // shard, shard
    return 1, plan.dp


def layers_per_stage(plan, w) -> int | None:
    """pipeline_parallel_layers_per_stage for an interleaved schedule: (L + 2) / (pp x v), the
    embedding and the output each counted as a layer, or None when it does not divide."""
    v = getattr(plan, "virtual_stages", 1)
    total = w.model.layers + 2
    return total // (plan.pp * v) if total % (plan.pp * v) == 0 else None


def problems(plan, w) -> list[str]:
    out = common_problems(CAPS, plan, w)
    v = getattr(plan, "virtual_stages", 1)
    if plan.cp > 1 and plan.sharding == "none":
        out.append("torchtitan shards parameters over the context-parallel ranks (its FSDP mesh is dp_shard x cp): "
                   "with cp > 1 sharding is zero3 or hsdp")
    if plan.offload != "none" and plan.sharding == "none":
        out.append("torchtitan offloads through FSDP2's CPUOffloadPolicy: offload needs sharding zero3 or hsdp")
    sp = plan.tp if plan.tp > 1 else 1
    div = sp * (2 * plan.cp if plan.cp > 1 else 1)
    if w.seq_len % div:
        out.append(f"torchtitan needs seq_len divisible by tp x 2cp = {div} (trainer.py): {w.seq_len} % {div}")
    if plan.pp > 1 and w.model.tied_embeddings:
        out.append("torchtitan refuses weight tying under pipeline parallelism (decoder.py)")
    if w.model.moe is not None:
        out += _moe_problems(plan, w)
    if w.cuda_graphs is True and (plan.pp > 1 or plan.ep > 1):
        out.append("train.cuda_graphs=true: torchtitan captures no CUDA graph under pipeline or expert parallelism "
                   "(trainer.py _validate_cuda_graphs)")
    if v > 1:
        if layers_per_stage(plan, w) is None:
            out.append(f"Interleaved1F1B: {w.model.layers} layers + embedding + output = {w.model.layers + 2} "
                       f"do not split into pp x virtual stages = {plan.pp * v} equal stages")
        n = plan.grad_accum_steps
        rounds = max(1, n // plan.pp)
        if n % rounds:
            out.append(f"Interleaved1F1B needs the micro-batch count ({n}) divisible by its rounds ({rounds} = "
                       f"max(1, {n} // pp)) (torch.distributed.pipelining ScheduleInterleaved1F1B)")
    return out


def recipe_problems(w) -> list[str]:
    """What jobctl cannot render for torchtitan whatever the layout."""
    out = []
    if w.precision not in LOW_PRECISION_MODULES:
        return out
    converter = LOW_PRECISION_MODULES[w.precision][2]
    if w.model.moe is not None:
        out.append(f"train.precision={w.precision} under torchtitan: {converter} converts the Linear layers, not the "
                   "grouped experts (their path is a separate MoE converter), which jobctl does not render; "
                   "use bf16-mixed, or framework megatron")
    elif registry_config(w.model) is None:
        out.append(f"train.precision={w.precision} under torchtitan: jobctl converts a registry config's Linear layers "
                   f"with {converter}, and {w.model.name} is not one (it knows llama3_8b and llama3_70b); name your "
                   "own config in the command with framework custom")
    return out


def _moe_problems(plan, w) -> list[str]:
    """What torchtitan's expert parallelism allows of a plan, and what jobctl models of it."""
    out = []
    ep = plan.ep
    rep, shard = degrees(plan)
    region = shard * plan.cp * plan.tp  # the dense region the experts' mesh folds into
    if region % ep:
        out.append(f"torchtitan folds expert parallelism into dp_shard x cp x tp = {region} ranks "
                   f"(parallel_dims.py: efsdp = dp_shard·cp·tp / ep): ep {ep} does not divide it")
    if plan.tp > 1 and ep == 1:
        out.append("with ep 1 torchtitan splits the experts by tensor parallelism (moe_sharding.py), which jobctl "
                   "does not model: ep > 1 borrows the TP ranks (expert tensor parallelism 1)")
    if plan.recompute == "selective":
        out.append("torchtitan's op-level selective recompute of an MoE block (which grouped GEMMs it saves) is not "
                   "modelled: recompute none or full")
    return out


def render(plan, w) -> Rendered:
    a: list[str] = []
    notes: list[str] = []

    def opt(key, value=None):
        a.append(f"--{key}" if value is None else f"--{key}={value}")

    known = registry_config(w.model)
    files, env = {}, {}
    if known and w.precision in LOW_PRECISION_MODULES:
        module, function, text = low_precision_module(w.precision, known, w.fp8_recipe, bool(w.compiled))
        files[module + ".py"] = text
        env[FRAMEWORK_ON_PYTHONPATH] = "1"
        opt("module", module)
        opt("config", function)
        what = (f"Float8 ({w.fp8_recipe} scaling, torchao; lm_head stays 16-bit)" if w.precision == "fp8" else
                "MXFP8 (torchao, lm_head included, as torchtitan's llama3_8b_mxfp8)")
        notes.append(f"{w.precision}: framework/{module}.py is torchtitan's {known[1]} with its Linear layers in "
                     f"{what}; the job puts that folder on PYTHONPATH. Needs torchao and a GPU of compute "
                     f"capability {'8.9' if w.precision == 'fp8' else '10.0'} or later")
    elif known:
        opt("module", known[0])
        opt("config", known[1])
    else:
        notes.append(f"{w.model.name} is not a torchtitan registry config: put your own --module/--config "
                     "before ${framework.args} in the command")
    rep, shard = degrees(plan)
    opt("parallelism.data_parallel_replicate_degree", rep)
    opt("parallelism.data_parallel_shard_degree", shard)
    opt("parallelism.tensor_parallel_degree", plan.tp)
    if plan.tp > 1 and not plan.sequence_parallel:
        opt("parallelism.no_enable_sequence_parallel")
    opt("parallelism.context_parallel_degree", plan.cp)
    opt("parallelism.pipeline_parallel_degree", plan.pp)
    if w.model.moe is not None:
        opt("parallelism.expert_parallel_degree", plan.ep)
    v = getattr(plan, "virtual_stages", 1)
    if plan.pp > 1:
        opt("parallelism.pipeline_parallel_schedule", "Interleaved1F1B" if v > 1 else "1F1B")
        if v > 1:
            opt("parallelism.pipeline_parallel_layers_per_stage", layers_per_stage(plan, w))
        opt("parallelism.pipeline_parallel_microbatch_size", plan.micro_batch_size)
        # one step = one local batch split into all the micro-batches: no extra accumulation
        opt("training.local_batch_size", plan.micro_batch_size * plan.grad_accum_steps)
        opt("training.disable_cuda_graphs")
    else:
        opt("training.local_batch_size", plan.micro_batch_size)
    if plan.pp == 1 and not graphed_step(w, plan):
        # the recipe turned them off, or the all-to-all dispatcher syncs with the CPU for its split
        # sizes, which CUDA graphs (on by default) refuse (Trainer.Config validation: "CUDA graphs
        # support only expert parallel token dispatcher configurations without CPU synchronization")
        opt("training.disable_cuda_graphs")
    opt("training.global_batch_size", plan.global_batch_size)
    opt("training.seq_len", w.seq_len)
    if plan.offload != "none":
        opt("training.enable_cpu_offload")
    opt("training.mixed_precision_param", "float32" if w.precision == "fp32" else "bfloat16")
    if w.compiled:  # the model and the loss (CompileConfig.components' default, which a registry
        opt("compile.enable")  # config may narrow: deepseek_v3_671b compiles the loss only)
        opt("compile.components", "model,loss")
        if plan.tp > 1 and plan.sequence_parallel:
            # TP collectives pipelined with the matmuls; needs compile of the model (configs.py
            # CompileConfig.__post_init__), counted by the step model (planner/perf.py tp_overlap)
            opt("compile.enable_async_tensor_parallel")
    a.extend(_training_args(w))
    if w.training.tokenizer != "null":
        opt("hf_assets_path", w.training.tokenizer_path)  # the tokenizer's folder (config/manager.py)
    # the activation-checkpointing policy is a tyro subcommand: it comes last
    sub = "activation_checkpoint:" + {"none": "none", "selective": "selective", "full": "full"}[plan.recompute]
    a.append(sub)
    # tyro reads every option after the subcommand as the subcommand's: the command's own options
    # must come before it (resolve_launch moves it to the end of the command)
    overlaps = []
    if "--compile.enable_async_tensor_parallel" in a:
        overlaps.append("async TP (--compile.enable_async_tensor_parallel: TP collectives pipelined with the "
                        "matmuls)")
    overlaps += data_parallel_overlaps(plan)
    return Rendered(CAPS.name, tuple(a), files, env, tuple(notes), last=(sub,), overlaps=tuple(overlaps))


def _training_args(w) -> list[str]:
    """The recipe's steps, schedule, optimizer settings and seed in torchtitan's config
    (trainer.py Trainer.Config: training, lr_scheduler, optimizer.param_groups, debug); the
    registry config's own values (a 200-step warm-up, its lr) are replaced by the recipe's."""
    t = w.training
    a = [f"--training.steps={t.steps}"] if t.steps else []
    a += [f"--training.max_norm={num(t.grad_clip)}", f"--debug.seed={t.seed}"]
    # DCP checkpoints in the chain's folder (an absolute folder is not joined to the dump folder);
    # the checkpointer loads the newest step-N there by itself (components/checkpointer/dcp.py)
    a += ["--checkpoint.enable", f"--checkpoint.folder={CHECKPOINT_DIR_TOKEN}"]
    if t.checkpoint_every:
        a.append(f"--checkpoint.interval={t.checkpoint_every}")
    # the metrics line ("step: N ...") every step: the runner's hang watchdog reads it (default 10)
    a.append("--metrics.log_freq=1")
    if t.lr is not None:
        group = "--optimizer.param_groups.0.optimizer_kwargs"
        a += [f"{group}.lr={num(t.lr)}", f"{group}.weight_decay={num(t.weight_decay)}"]
        if w.optimizer == "adamw":
            a += [f"{group}.eps={num(t.eps)}", f"{group}.betas", num(t.betas[0]), num(t.betas[1])]
        a += [f"--lr_scheduler.warmup_steps={t.warmup_steps or 0}"]
        if t.schedule == "constant":
            a.append("--lr_scheduler.decay_ratio=0.0")  # warm-up, then stable (no decay steps)
        else:
            a.append(f"--lr_scheduler.decay_type={t.schedule}")
            a.append(f"--lr_scheduler.min_lr_factor={num(ratio(t.min_lr or 0.0, t.lr))}")
    return a


FRAMEWORK = Framework(CAPS, problems, render, recipe_problems)
