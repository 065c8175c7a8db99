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
)

DS = "deepspeed 0.19.8"
CONFIG_FILE = "ds_config.json"

CAPS = Capabilities(
    name="deepspeed",
    title="DeepSpeed engine (alone, HF Trainer or accelerate)",
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
    state_recipe=StateRecipe.ZERO,
    reduce_bytes=2,
    grad_buffer=GradBuffer.REDUCE_BUCKET,
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


def config(plan, w) -> dict:
    zero: dict = {"stage": STAGE[plan.sharding]}
    if plan.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "zero_optimization": zero,
    }
    if w.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif w.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    if plan.pp > 1:
        cfg["pipeline"] = {"stages": "auto", "partition": "parameters"}
    return cfg


def render(plan, w) -> Rendered:
    text = json.dumps(config(plan, w), indent=2) + "\n"
    notes = ["HF Trainer: pass --deepspeed ${framework.files.ds_config} instead of ${framework.args}"]
    if plan.recompute == "full":
        notes.append("recompute=full: turn on your model's activation checkpointing (HF: --gradient_checkpointing; "
                     "a PipelineModule: activation_checkpoint_interval=1); JOBCTL_RECOMPUTE=full says so in the job")
    if plan.pp > 1:
        notes.append(f"pp={plan.pp}: build the model as deepspeed.pipe.PipelineModule(num_stages=JOBCTL_PP)")
    return Rendered(CAPS.name, ("--deepspeed", "--deepspeed_config", file_path(CONFIG_FILE)),
                    {CONFIG_FILE: text}, {}, tuple(notes))


FRAMEWORK = Framework(CAPS, problems, render)
