"""DeepSpeed (the engine alone, or through HF Trainer / accelerate): what it runs and its
`ds_config.json`.

Read from the deepspeed 0.19.8 wheel: deepspeed/runtime/config.py (DeepSpeedConfig, batch
arithmetic `_set_batch_related_parameters` / `_batch_assertion`), runtime/zero/config.py
(DeepSpeedZeroConfig, stages), runtime/zero/offload_config.py, runtime/pipe/engine.py and
pipe/schedule.py (the pipeline engine), runtime/precision_config.py, ops/adam/cpu_adam.py.
"""

from __future__ import annotations

import json

from jobctl.frameworks.base import (
    Capabilities,
    Framework,
    GradBuffer,
    Rendered,
    Selective,
    StateRecipe,
    common_problems,
    file_path,
    hf_training_args,
    ratio,
)

DS = "deepspeed 0.19.8"
CONFIG_FILE = "ds_config.json"

CAPS = Capabilities(
    name="deepspeed",
    title="DeepSpeed engine (alone, HF Trainer or accelerate)",
    package="deepspeed",
    versions=("0.19.8",),
    tp=False,
    sequence_parallel="no",
    cp=False,
    pp=True,
    schedules=("1F1B",),
    interleaved=False,
    shardings=("none", "zero1", "zero2", "zero3"),
    recompute=("none", "full"),
    selective=Selective.NOT_OFFERED,
    offload=("none", "optimizer", "optimizer+params"),
    optimizers=("adamw", "lion", "adam8bit", "sgd", "sgd-momentum", "adafactor", "adam-mini"),
    methods=("full", "lora", "qlora"),
    precisions=("bf16-mixed", "fp16-mixed", "fp32"),
    low_precision_note=("DeepSpeed has no FP8 training recipe of its own (ds_config has no fp8 section): FP8 comes "
                        "from the model's layers, e.g. Transformer Engine's, in code of your own (framework custom)"),
    state_recipe=StateRecipe.ZERO,
    reduce_bytes=2,
    grad_buffer=GradBuffer.REDUCE_BUCKET,
    dp_schedule="zero-engine",
    sources=(
        ("zero_optimization.stage 0-3", f"{DS} deepspeed/runtime/zero/config.py ZeroStageEnum"),
        ("offload_optimizer valid with stage 1, 2 and 3; offload_param only with stage 3",
         f"{DS} deepspeed/runtime/zero/offload_config.py"),
        ("the pipeline engine (PipelineModule) refuses ZeRO-2/3: 'ZeRO-2 and ZeRO-3 are incompatible with "
         "pipeline parallelism'; its TrainSchedule is 1F1B-like; no interleaving", f"{DS} runtime/pipe/engine.py, pipe/schedule.py"),
        ("train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel world",
         f"{DS} runtime/config.py _batch_assertion"),
        ("activation checkpointing is the model's (HF gradient_checkpointing / deepspeed.checkpointing): whole "
         "layers, no selective mode", f"{DS} runtime/activation_checkpointing/config.py"),
        ("ZeRO-Offload runs the optimizer step with DeepSpeedCPUAdam (Adam/AdamW) or DeepSpeedCPULion; "
         "zero_force_ds_cpu_optimizer refuses a client optimizer", f"{DS} runtime/engine.py, ops/adam/cpu_adam.py"),
        ("mixed precision: 16-bit weights and gradients, fp32 master weights and states in the ZeRO optimizer",
         f"{DS} runtime/precision_config.py; Rajbhandari et al. 2020"),
        ("reduce_bucket_size default 5e8 elements", f"{DS} runtime/zero/config.py"),
        ("ZeRO allocates its gradient bucket at reduce_bucket_size elements whatever the model's size: each "
         "backward for stages 1-2, once for stage 3 (contiguous_gradients); measured on CPU with the engine "
         "(benchmarks/deepspeed_memory.py, 1.0 GB for a 1.9M-parameter model)",
         f"{DS} runtime/zero/stage_1_and_2.py setup_buckets, runtime/zero/stage3.py"),
        ("zero_optimization.overlap_comm: the gradient reduction on its own stream under the backward, with a "
         "second reduce_bucket_size bucket to fill while the first is reduced; on by default for stage 3 only "
         "(validator overlap_comm_valid); measured on CPU with the engine: +1.0e9 B at stages 1 and 2 in bf16 "
         "(benchmarks/deepspeed_memory.py, 2 ranks: the engine runs the zero_optimization jobctl renders)",
         f"{DS} runtime/zero/config.py, runtime/zero/stage_1_and_2.py setup_buckets"),
        ("without ZeRO the engine all-reduces the gradients after the backward (allreduce_gradients: "
         "buffered_allreduce_fallback); ZeRO-2 reduces at every micro-batch (partition_gradients), ZeRO-1 at "
         "the accumulation boundary; ZeRO-1/2 all-gather the updated 16-bit weights inside optimizer.step",
         f"{DS} runtime/engine.py allreduce_gradients, runtime/zero/stage_1_and_2.py step"),
        ("tensor parallelism (AutoTP) and Ulysses sequence parallelism need model code; jobctl does not plan them",
         f"{DS} runtime/tensor_parallel/config.py, runtime/sequence_parallel/ulysses_sp.py"),
    ),
)

STAGE = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}


def problems(plan, w) -> list[str]:
    out = common_problems(CAPS, plan, w)
    if plan.pp > 1 and plan.sharding in ("zero2", "zero3"):
        out.append("DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 ('ZeRO-2 and ZeRO-3 are incompatible "
                   "with pipeline parallelism', runtime/pipe/engine.py)")
    if plan.offload == "optimizer" and plan.sharding == "none":
        out.append("DeepSpeed offloads the optimizer from ZeRO stage 1 up (offload_optimizer: 'Valid with stage 1, 2, and 3')")
    if plan.offload == "optimizer+params" and plan.sharding != "zero3":
        out.append("DeepSpeed offloads parameters with ZeRO-3 only (offload_param: 'Valid only with stage 3')")
    if plan.offload != "none" and w.optimizer not in ("adamw", "lion"):
        out.append(f"ZeRO-Offload steps on the CPU with DeepSpeedCPUAdam or DeepSpeedCPULion, not {w.optimizer}")
    return out


def overlap_comm(sharding: str, data_parallel: bool) -> bool:
    """Whether jobctl turns on zero_optimization.overlap_comm: with ZeRO and a data-parallel group
    to reduce over (stage 3's default; stages 1 and 2 default to off, and an expert turns it on:
    the reduction hides under the backward for a second 5e8-element bucket, which the memory
    model counts: planner/memory/buffers.py)."""
    return sharding != "none" and data_parallel


def config(plan, w) -> dict:
    zero: dict = {"stage": STAGE[plan.sharding]}
    if overlap_comm(plan.sharding, plan.dp > 1):
        zero["overlap_comm"] = True
    if plan.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "zero_optimization": zero,
        # the engine's "step=N, skipped=..." line every step: the runner's hang watchdog reads
        # the step from it (0.19.8's default, None, prints none)
        "steps_per_print": 1,
    }
    if w.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif w.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    t = w.training
    if t.grad_clip:
        cfg["gradient_clipping"] = t.grad_clip
    optimizer = _optimizer(w, plan)
    if optimizer:
        cfg["optimizer"] = optimizer
        scheduler = _scheduler(t)
        if scheduler:
            cfg["scheduler"] = scheduler
    # the pipeline engine reads activation_checkpoint_interval from here (runtime/pipe/engine.py,
    # `self._config.pipeline['activation_checkpoint_interval']`); the stages and the partition
    # method are PipelineModule(num_stages=..., partition_method=...) arguments, not this file's
    if plan.pp > 1 and plan.recompute == "full":
        cfg["pipeline"] = {"activation_checkpoint_interval": 1}
    return cfg


# The recipe's optimizer as DeepSpeed builds it (runtime/engine.py _configure_basic_optimizer):
# AdamW and Lion; under ZeRO-Offload the same names give DeepSpeedCPUAdam / DeepSpeedCPULion.
_OPTIMIZERS = {"adamw": "AdamW", "lion": "Lion"}


def _optimizer(w, plan) -> dict | None:
    t = w.training
    name = _OPTIMIZERS.get(w.optimizer)
    if name is None or t.lr is None:
        return None
    params: dict = {"lr": t.lr, "weight_decay": t.weight_decay}
    if w.optimizer == "adamw":
        params.update(betas=list(t.betas), eps=t.eps)
        if w.device == "cpu" and plan.offload == "none":
            # on CPU ranks FusedAdam is a C++ op JIT-compiled at start-up (ops/adam/fused_adam.py);
            # `torch_adam` takes torch.optim.AdamW instead (engine.py get_optimizer_configuration)
            params["torch_adam"] = True
    return {"type": name, "params": params}


def _scheduler(t) -> dict | None:
    """The recipe's schedule as one of DeepSpeed's (runtime/lr_schedules.py): WarmupCosineLR
    (its floors are ratios of the optimizer's lr), WarmupDecayLR (linear), WarmupLR (constant)."""
    warmup = t.warmup_steps or 0
    if t.schedule == "constant":
        return {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": t.lr,
                                               "warmup_num_steps": warmup}}
    if not t.steps:
        return None
    if t.schedule == "cosine":
        return {"type": "WarmupCosineLR", "params": {"total_num_steps": t.steps, "warmup_num_steps": warmup,
                                                     "warmup_min_ratio": 0.0,
                                                     "cos_min_ratio": ratio(t.min_lr or 0.0, t.lr)}}
    return {"type": "WarmupDecayLR", "params": {"total_num_steps": t.steps, "warmup_num_steps": warmup,
                                                "warmup_min_lr": 0.0, "warmup_max_lr": t.lr}}


def render(plan, w) -> Rendered:
    cfg = config(plan, w)
    text = json.dumps(cfg, indent=2) + "\n"
    notes = []
    if plan.pp == 1:
        notes.append("HF Trainer: pass ${framework.hf_args} (--deepspeed with the file, and the Trainer's own batch, "
                     "precision and optimizer arguments, consistent with it) instead of ${framework.args}")
    if "optimizer" not in cfg:
        notes.append("no optimizer block: " + ("train.lr is not set" if w.training.lr is None else
                     f"DeepSpeed builds no {w.optimizer}") + "; the script passes its own optimizer to "
                     "deepspeed.initialize (ZeRO-Offload refuses one: zero_force_ds_cpu_optimizer)")
    # the Trainer wraps a plain module with deepspeed.initialize; only a PipelineModule gets the
    # pipeline engine, so a pp > 1 plan has no Trainer arguments
    hf: tuple[str, ...] = ()
    if plan.pp == 1:
        hf = ("--deepspeed", file_path(CONFIG_FILE), *hf_training_args(plan, w),
              *(("--gradient_checkpointing",) if plan.recompute == "full" else ()))
    if plan.recompute == "full":
        notes.append("recompute=full: ${framework.hf_args} turns on the Trainer's --gradient_checkpointing, the file "
                     "a PipelineModule's (pipeline.activation_checkpoint_interval 1; give it checkpointable_layers=[your block "
                     "class] so the embedding is not checkpointed); a script of your own checkpoints "
                     "its layers itself (JOBCTL_RECOMPUTE=full says so in the job)")
    if plan.pp > 1:
        notes.append(f"pp={plan.pp}: build the model as deepspeed.pipe.PipelineModule(num_stages=JOBCTL_PP) in a "
                     "script of your own; HF Trainer does not drive DeepSpeed's pipeline engine (no hf_args)")
    overlaps = []
    if overlap_comm(plan.sharding, plan.dp > 1):
        overlaps.append("grad reduce (zero_optimization.overlap_comm: on a side stream under the backward"
                        + ("; ZeRO-3's prefetch gathers the next layers' weights under the compute)"
                           if plan.sharding == "zero3" else ")"))
    return Rendered(CAPS.name, ("--deepspeed", "--deepspeed_config", file_path(CONFIG_FILE)),
                    {CONFIG_FILE: text}, {}, tuple(notes), hf_args=hf, overlaps=tuple(overlaps))


FRAMEWORK = Framework(CAPS, problems, render)
