"""PyTorch FSDP2 through HF accelerate (or a plain torchrun script): what it runs, the
accelerate FSDP configuration and the environment accelerate's launcher would export.

Read from accelerate 1.15.0: accelerate/commands/config/config_args.py (ClusterConfig),
commands/config/cluster.py (the YAML keys `accelerate config` writes), utils/launch.py
prepare_multi_gpu_env (the FSDP_* variables), utils/dataclasses.py FullyShardedDataParallelPlugin
(reads them back in the training process), utils/fsdp_utils.py (activation checkpointing,
fp32 upcast); and torch.distributed.fsdp fully_shard / CPUOffloadPolicy (torch 2.13).

jobctl's own torchrun launcher starts the processes, so the FSDP settings travel as the same
environment variables `accelerate launch` exports: `Accelerator()` in the script reads them.
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
    data_parallel_overlaps,
    file_path,
    hf_training_args,
)
from jobctl.model import MASTER_ADDR_TOKEN, MASTER_PORT_TOKEN, NODE_RANK_TOKEN

AC = "accelerate 1.15.0"
CONFIG_FILE = "accelerate_config.yaml"

CAPS = Capabilities(
    name="fsdp",
    title="PyTorch FSDP2 via HF accelerate (or torchrun + fully_shard)",
    package="accelerate",
    versions=("1.15.0",),
    tp=False,
    sequence_parallel="no",
    cp=False,
    pp=False,
    shardings=("none", "zero3", "hsdp"),
    recompute=("none", "full"),
    selective=Selective.NOT_OFFERED,
    offload=("none", "optimizer+params"),
    optimizers=("adamw", "lion", "adam8bit", "sgd", "sgd-momentum", "adafactor", "adam-mini"),
    methods=("full", "lora", "qlora"),
    precisions=("bf16-mixed", "bf16-pure", "fp16-mixed", "fp32", "fp8"),
    low_precision_note=("jobctl renders accelerate's FP8 with its torchao backend (fp8, tensor-wise); its "
                        "Transformer Engine backend, whose options include MXFP8 block scaling (utils/dataclasses.py "
                        "TERecipeKwargs use_mxfp8_block_scaling), is not rendered yet, and accelerate 1.15.0 has no "
                        "NVFP4"),
    fp8_recipes=("tensorwise",),
    fp8_backend="torchao",
    fsdp_float8_all_gather=True,
    fp8_loads_model_per_rank=True,
    state_recipe=StateRecipe.FP32_PARAMS,
    reduce_bytes=2,
    grad_buffer=GradBuffer.DDP_BUCKETS,
    frees_grads_each_step=True,
    fsdp_root_holds_embeddings=True,
    sdpa_gqa=True,
    sources=(
        ("transformers' SDPA attention passes grouped K and V to the kernel (enable_gqa) when no mask is needed "
         "(one causal sequence per row), so no repeat_kv copies are kept: traced, per block -96 MiB at 8B, seq 8192",
         "transformers 5.24.0 integrations/sdpa_attention.py use_gqa_in_sdpa, masking_utils.py"),
        ("accelerate's FSDP2 wraps each decoder layer (the model's _no_split_modules), then the root, which keeps "
         "the embedding, the final norm and the output layer: at the loss both matrices are gathered and the last "
         "layer is prefetched for backward (traced with transformers' Llama: 2.36 GiB at 8B)",
         f"{AC} utils/fsdp_utils.py fsdp2_prepare_model"),
        ("the loop frees gradients every step: HF Trainer calls model.zero_grad() and a torchrun script "
         "optimizer.zero_grad(), both set_to_none=True by default, so FSDP's sharded gradients are rebuilt "
         "in each backward (the torchtitan traces show what that does to the peak)",
         "torch optim/optimizer.py zero_grad, nn/modules/module.py zero_grad; transformers trainer.py"),
        ("FSDP2 reshard_after_forward True = full shard (ZeRO-3); HSDP = parallelism_config dp_replicate x dp_shard; "
         "no pipeline parallelism", f"{AC} utils/dataclasses.py FullyShardedDataParallelPlugin, parallelism_config.py"),
        ("SHARD_GRAD_OP (reshard_after_forward False) keeps whole parameters between forward and backward: not offered",
         f"{AC} utils/dataclasses.py; torch fully_shard docs"),
        ("fsdp_activation_checkpointing wraps every auto-wrapped layer (full recompute); no selective mode",
         f"{AC} utils/fsdp_utils.py fsdp2_apply_ac"),
        ("fsdp_offload_params = CPUOffloadPolicy: parameters, gradients and the optimizer step on the CPU",
         "torch/distributed/fsdp/_fully_shard/_fsdp_api.py CPUOffloadPolicy"),
        ("mixed_precision bf16: param, reduce and output dtype bf16 (gradients reduced in bf16); trainable "
         "parameters upcast to fp32 as the master copy", f"{AC} utils/dataclasses.py set_mixed_precision, fsdp_utils.py"),
        ("mixed_precision fp8 with ACCELERATE_FP8_BACKEND=AO: AORecipeKwargs builds torchao's Float8LinearConfig "
         "(dynamic tensor-wise scaling of inputs, weights and gradients; pad_inner_dim and, under FSDP2, FP8 "
         "all-gather of the weights on by default); prepare() converts every nn.Linear whose dimensions are "
         "multiples of 16 but the model's first and last (the first layer's query projection and the output "
         "layer) to Float8Linear; bf16 autocast and FSDP2's bf16 param dtype around them",
         f"{AC} accelerator.py _prepare_ao, utils/ao.py convert_model_to_fp8_ao, utils/dataclasses.py AORecipeKwargs"),
        ("torchao with FSDP2 and cpu_ram_efficient_loading is refused, so under fp8 every rank loads the whole "
         "model on the host (upcast there to fp32 before fully_shard)",
         f"{AC} accelerator.py __init__, utils/fsdp_utils.py fsdp2_prepare_model"),
        ("HF Trainer takes its mixed precision from ACCELERATE_MIXED_PRECISION unless --bf16 or --fp16 is given "
         "(so fp8 is rendered without either)", "transformers 5.24.0 training_args.py __post_init__"),
        ("tensor/context parallelism through ParallelismConfig need a model with a TP plan; not planned",
         f"{AC} parallelism_config.py"),
        ("the launcher exports ACCELERATE_USE_FSDP, FSDP_VERSION, FSDP_RESHARD_AFTER_FORWARD, FSDP_OFFLOAD_PARAMS, "
         "FSDP_AUTO_WRAP_POLICY, FSDP_TRANSFORMER_CLS_TO_WRAP, FSDP_STATE_DICT_TYPE, FSDP_ACTIVATION_CHECKPOINTING, "
         "PARALLELISM_CONFIG_*", f"{AC} utils/launch.py prepare_multi_gpu_env"),
    ),
)

# The decoder-layer class FSDP wraps, by model family (transformers' modeling files).
LAYER_CLASS = {"llama": "LlamaDecoderLayer", "gpt": "GPT2Block"}
MIXED = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "fp32": "no", "bf16-pure": "no",  # pure: a bf16 model
         "fp8": "fp8"}
# accelerate's FP8 through torchao, as `accelerate launch --fp8_backend ao` exports it with
# `accelerate config`'s defaults (utils/launch.py setup_fp8_env; AORecipeKwargs reads them back)
FP8_ENV = {"ACCELERATE_FP8_BACKEND": "AO", "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER": "true",
           "ACCELERATE_FP8_PAD_INNER_DIM": "true"}


def recipe_problems(w) -> list[str]:
    """What jobctl cannot render for accelerate whatever the layout."""
    if w.precision == "fp8" and w.method != "full":
        return [f"accelerate's FP8 converts every nn.Linear (utils/ao.py filter_linear_layers), which would take "
                f"PEFT's adapters and bitsandbytes' 4-bit layers too: jobctl renders it for method full only "
                f"(train.method is {w.method}; plan bf16-mixed)"]
    return []


def problems(plan, w) -> list[str]:
    out = common_problems(CAPS, plan, w)
    if plan.offload != "none" and plan.sharding == "none":
        out.append("FSDP offloads through CPUOffloadPolicy of sharded parameters: offload needs sharding zero3 or hsdp")
    if w.device == "cpu" and plan.sharding != "none":
        out.append("accelerate applies FSDP with accelerators only (state.py: FSDP is kept for GPU-like "
                   "distributed types; on CPU it runs data parallel): a CPU partition gets sharding none")
    return out


def _shard(plan) -> tuple[int, int]:
    """(dp_replicate, dp_shard)."""
    if plan.sharding == "hsdp" and plan.hsdp_shard:
        return plan.dp // plan.hsdp_shard, plan.hsdp_shard
    if plan.sharding == "none":
        return plan.dp, 1
    return 1, plan.dp


def environment(plan, w) -> dict[str, str]:
    env = {"ACCELERATE_MIXED_PRECISION": MIXED[w.precision]}
    if w.precision == "fp8":
        env.update(FP8_ENV)
        if plan.sharding == "none":
            # no all-gather to make FP8; and torchao's all-gather weight wrapper
            # (WeightWithDynamicFloat8CastTensor) has no storage safetensors can save, so HF
            # Trainer's checkpoint under DDP fails with it (seen here: save_pretrained, storage_ptr)
            env["ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"] = "false"
    if w.device == "cpu":
        # what `accelerate launch` exports for use_cpu (utils/launch.py); under torchrun's
        # WORLD_SIZE > 1 accelerate then runs MULTI_CPU on gloo (state.py _prepare_backend)
        env["ACCELERATE_USE_CPU"] = "true"
    if plan.sharding == "none":
        return env  # plain DDP: accelerate's default under torchrun
    rep, shard = _shard(plan)
    env.update({
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": "true",
        "FSDP_OFFLOAD_PARAMS": "true" if plan.offload != "none" else "false",
        "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": LAYER_CLASS.get(w.model.family, "LlamaDecoderLayer"),
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "FSDP_ACTIVATION_CHECKPOINTING": "true" if plan.recompute == "full" else "false",
        # what `accelerate launch` exports besides (utils/launch.py prepare_multi_gpu_env; its defaults)
        # (off under fp8: accelerate refuses it with torchao, accelerator.py)
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "false" if w.precision == "fp8" else "true",
        "FSDP_SYNC_MODULE_STATES": "true",
    })
    if plan.sharding == "hsdp":
        env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
        env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] = str(rep)
        env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] = str(shard)
    return env


def config_yaml(plan, w) -> str:
    """The same settings as `accelerate launch --config_file` reads them (keys as `accelerate
    config` writes them)."""
    lines = [
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: {'MULTI_GPU' if plan.sharding == 'none' else 'FSDP'}",
        f"mixed_precision: '{MIXED[w.precision]}'",
        f"num_machines: {plan.nodes}",
        f"num_processes: {plan.world_size}",
        # this node's rank and the first node's address come from ${framework.launch_args} (the
        # command line wins over the file), which jobctl fills in on each node
        "machine_rank: 0",
        "rdzv_backend: static",
        "same_network: true",
        "main_training_function: main",
        f"use_cpu: {'true' if w.device == 'cpu' else 'false'}",
        "debug: false",
    ]
    env = environment(plan, w)
    if w.precision == "fp8":
        gather = env["ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"]
        lines += ["fp8_config:", "  backend: AO", f"  enable_fsdp_float8_all_gather: {gather}", "  pad_inner_dim: true"]
    if plan.sharding != "none":
        lines += [
            "fsdp_config:",
            "  fsdp_version: 2",
            "  fsdp_reshard_after_forward: true",
            f"  fsdp_offload_params: {env['FSDP_OFFLOAD_PARAMS']}",
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
            f"  fsdp_transformer_layer_cls_to_wrap: {env['FSDP_TRANSFORMER_CLS_TO_WRAP']}",
            "  fsdp_state_dict_type: SHARDED_STATE_DICT",
            f"  fsdp_activation_checkpointing: {env['FSDP_ACTIVATION_CHECKPOINTING']}",
            f"  fsdp_cpu_ram_efficient_loading: {env['FSDP_CPU_RAM_EFFICIENT_LOADING']}",
            "  fsdp_sync_module_states: true",
        ]
        if plan.sharding == "hsdp":
            rep, shard = _shard(plan)
            lines += ["parallelism_config:", f"  parallelism_config_dp_replicate_size: {rep}",
                      f"  parallelism_config_dp_shard_size: {shard}", "  parallelism_config_tp_size: 1",
                      "  parallelism_config_cp_size: 1"]
    return "\n".join(lines) + "\n"


def render(plan, w) -> Rendered:
    args = hf_training_args(plan, w)
    if w.device == "cpu":
        args += ("--use_cpu",)  # TrainingArguments refuses --bf16 without a GPU otherwise
    notes = ["the FSDP settings are in the environment (what `accelerate launch` exports) under jobctl's torchrun; "
             "with `launch.launcher: none`, run `accelerate launch ${framework.launch_args} train.py ...`: the "
             f"same settings from {file_path(CONFIG_FILE)}, with this node's rank and the first node's address"]
    launch_args = ("--config_file", file_path(CONFIG_FILE), "--num_machines", str(plan.nodes),
                   "--num_processes", str(plan.world_size), "--machine_rank", NODE_RANK_TOKEN,
                   "--main_process_ip", MASTER_ADDR_TOKEN, "--main_process_port", MASTER_PORT_TOKEN)
    if w.precision == "fp8":
        notes.append("fp8: accelerate converts the Linear layers to torchao's Float8Linear (tensor-wise scaling; the "
                     "model's first and last Linear stay BF16) at accelerator.prepare(); under FSDP2 each rank loads "
                     "the whole model on the host first (accelerate refuses cpu_ram_efficient_loading with torchao)")
    if w.device == "cpu" and plan.world_size > 1:
        notes.append("CPU ranks: `accelerate launch` with use_cpu starts one process per node unless it runs under "
                     "mpirun (commands/launch.py simple_launcher); keep jobctl's torchrun, which starts them all")
    return Rendered(CAPS.name, args, {CONFIG_FILE: config_yaml(plan, w)}, environment(plan, w), tuple(notes),
                    launch_args=launch_args, overlaps=data_parallel_overlaps(plan))



FRAMEWORK = Framework(CAPS, problems, render, recipe_problems)
