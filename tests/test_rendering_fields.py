"""Every plan field lands in the flag or key that means it, for each framework, without the frameworks.

tests/test_framework_configs.py runs the frameworks' own configuration code on what jobctl
renders, but skips where megatron-core, torchtitan, deepspeed or accelerate are not installed;
these tests need none of them. Each plan below gives its fields pairwise different values
(tp 4, pp 3, cp 5, dp 7, micro-batch 11, accumulation 9, ...), so a field rendered from the
wrong source shows up as a wrong number. The expected values are written by hand from what
each flag means in the framework's own documentation or source (cited at each table), and the
derivations (global batch = micro-batch x accumulation x dp, layers per virtual stage, ...)
are spelled out here, never read back from jobctl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from jobctl import frameworks
from jobctl.jobs.environment import plan_environment
from jobctl.model import CHECKPOINT_DIR_TOKEN, JOB_FOLDER_TOKEN
from jobctl.planner.memory import Workload
from jobctl.planner.models import ModelSpec
from jobctl.planner.plan import Plan

HERE = Path(__file__).parent

# A made-up Llama whose sizes collide with no plan value below (not a torchtitan registry
# config, so torchtitan gets no --module/--config and a note instead).
MODEL = ModelSpec(name="toy-llama", family="llama", layers=60, hidden=6144, ffn_hidden=16384, heads=48,
                  kv_heads=12, vocab=32000)
SEQ = 4080  # a multiple of 2·cp (Megatron, cp 5) and of tp·2·cp (torchtitan, tp 4, cp 3)


def plan(**kw) -> Plan:
    """A Plan from keyword fields; its arithmetic is checked so each case is a real layout."""
    defaults = dict(tp=1, pp=1, cp=1, sharding="none", recompute="none", offload="none", sequence_parallel=False)
    p = Plan(**{**defaults, **kw})
    assert p.check() == [], p.check()
    return p


def rendered(name: str, p: Plan, model: ModelSpec = MODEL, precision: str = "bf16-mixed", supports=None):
    """The framework's rendering of `p`, after checking that the framework accepts the plan (so
    no case below is something jobctl would never render)."""
    fw = frameworks.get(name, supports)
    w = Workload(model, SEQ, p.global_batch_size, precision=precision, framework=fw)
    assert fw.problems(p, w) == [], fw.problems(p, w)
    return fw.render(p, w)


# -- Megatron-LM ------------------------------------------------------------------------------
# Meanings from Megatron-LM core_v0.16.1 megatron/training/arguments.py (the argparse help):
#   --tensor-model-parallel-size / --pipeline-model-parallel-size / --context-parallel-size:
#     "Degree of tensor / pipeline / context parallelism"
#   --micro-batch-size: "Batch size per model instance (local batch size). Global batch size is
#     local batch size times data parallel size times number of micro batches."
#   --global-batch-size: "Training batch size ... a multiple of micro-batch-size times
#     data-parallel-size"; dp is not a flag, Megatron derives it as world / (tp·pp·cp)
#     (megatron/core/parallel_state.py), and the micro-batch count as global // (micro · dp)
#     (megatron/core/num_microbatches_calculator.py ConstantNumMicroBatchesCalculator).
#   --num-layers-per-virtual-pipeline-stage: layers of one model chunk; validate_args makes
#     vpp = (num_layers / pp) / that.
#   --recompute-num-layers with --recompute-method block: "the number of transformer layers to
#     recompute within each pipeline stage" (megatron/core/transformer/transformer_config.py),
#     counted per TransformerBlock, i.e. per model chunk under interleaving
#     (transformer_block.py _checkpointed_forward loops over that block's layers); with
#     uniform: the size of each recomputed group of layers.
#   --use-distributed-optimizer: optimizer states sharded over dp (ZeRO-1);
#   --optimizer-cpu-offload needs --use-precision-aware-optimizer (validate_args).
# Flag -> argparse dest and arity from Megatron-LM's own parser: tests/data/megatron_lm_flags.json.
MEGATRON_FLAGS = json.loads((HERE / "data" / "megatron_lm_flags.json").read_text())["flags"]


def megatron_namespace(args: tuple[str, ...]) -> dict:
    """What Megatron-LM's argparse makes of `args`: {dest: value}, switches True. Refuses a flag
    Megatron does not have and a flag given twice (the second would silently win)."""
    ns, i = {}, 0
    while i < len(args):
        flag = args[i]
        assert flag in MEGATRON_FLAGS, f"{flag} is not a Megatron-LM flag"
        spec = MEGATRON_FLAGS[flag]
        assert spec["dest"] not in ns, f"{flag} given twice"
        if spec["nargs"] == 0:
            ns[spec["dest"]] = True
            i += 1
        else:
            value = args[i + 1]
            ns[spec["dest"]] = int(value) if value.lstrip("-").isdigit() else value
            i += 2
    return ns


def test_megatron_puts_every_plan_field_in_the_flag_that_means_it():
    # world = 30 nodes x 14 GPUs = 420 = tp 4 x pp 3 x cp 5 x dp 7
    # global = micro 11 x accumulation 9 x dp 7 = 693 (accumulation a multiple of pp for interleaving)
    # 60 layers / pp 3 = 20 per stage; / 2 virtual stages = 10 per model chunk
    # recompute 16 layers per stage = 16 / 2 = 8 per model chunk (block method)
    p = plan(nodes=30, gpus_per_node=14, tp=4, pp=3, cp=5, dp=7, micro_batch_size=11, grad_accum_steps=9,
             global_batch_size=693, sharding="zero1", recompute="full", recompute_layers=16,
             sequence_parallel=True, virtual_stages=2)
    r = rendered("megatron", p)
    ns = megatron_namespace(r.args)
    assert {k: ns.get(k) for k in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size", "sequence_parallel",
        "micro_batch_size", "global_batch_size", "num_layers_per_virtual_pipeline_stage",
        "use_distributed_optimizer", "recompute_granularity", "recompute_method", "recompute_num_layers",
        "optimizer_cpu_offload",
    )} == {
        "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 3, "context_parallel_size": 5,
        "sequence_parallel": True, "micro_batch_size": 11, "global_batch_size": 693,
        "num_layers_per_virtual_pipeline_stage": 10, "use_distributed_optimizer": True,
        "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 8,
        "optimizer_cpu_offload": None,
    }
    # the model, as Megatron builds it from flags (GQA: --num-query-groups = KV heads)
    assert {k: ns.get(k) for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                   "group_query_attention", "num_query_groups", "seq_length")} == {
        "num_layers": 60, "hidden_size": 6144, "ffn_hidden_size": 16384, "num_attention_heads": 48,
        "group_query_attention": True, "num_query_groups": 12, "seq_length": 4080}
    # Megatron's own derivations from those flags give back the plan's dp, micro-batches, vpp
    dp = 420 // (ns["tensor_model_parallel_size"] * ns["pipeline_model_parallel_size"] * ns["context_parallel_size"])
    assert dp == 7
    assert ns["global_batch_size"] // (ns["micro_batch_size"] * dp) == 9
    assert ns["num_layers"] // ns["pipeline_model_parallel_size"] // ns["num_layers_per_virtual_pipeline_stage"] == 2
    # tp > 1: validate_args needs CUDA_DEVICE_MAX_CONNECTIONS=1 on Hopper and older
    assert r.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


# (sharding, recompute, recompute_layers, offload, sequence_parallel, tp) -> the memory flags
MEGATRON_KNOBS = [
    # DDP, Megatron's selective recompute (attention core): granularity only, no method/num-layers
    # (TransformerConfig.__post_init__ refuses them with selective); sp off: no flag
    (("none", "selective", 0, "none", False, 2),
     {"recompute_granularity": "selective"}),
    # full recompute of every layer: uniform groups of 1; optimizer offload with its two companions
    (("zero1", "full", 0, "optimizer", True, 2),
     {"use_distributed_optimizer": True, "recompute_granularity": "full", "recompute_method": "uniform",
      "recompute_num_layers": 1, "optimizer_cpu_offload": True, "use_precision_aware_optimizer": True,
      "sequence_parallel": True}),
    # sequence parallelism exists only with tp > 1 (validate_args turns it off at tp 1)
    (("none", "none", 0, "none", True, 1), {}),
]


@pytest.mark.parametrize("knobs,expected", MEGATRON_KNOBS, ids=["selective", "full-offload", "tp1"])
def test_megatron_memory_knobs(knobs, expected):
    sharding, recompute, layers, offload, sp, tp = knobs
    dp = 16 // tp
    p = plan(nodes=2, gpus_per_node=8, tp=tp, dp=dp, micro_batch_size=3, grad_accum_steps=5,
             global_batch_size=3 * 5 * dp, sharding=sharding, recompute=recompute, recompute_layers=layers,
             offload=offload, sequence_parallel=sp)
    ns = megatron_namespace(rendered("megatron", p).args)
    knob_dests = ("use_distributed_optimizer", "recompute_granularity", "recompute_method", "recompute_num_layers",
                  "optimizer_cpu_offload", "use_precision_aware_optimizer", "sequence_parallel")
    assert {k: ns[k] for k in knob_dests if k in ns} == expected
    assert (ns["micro_batch_size"], ns["global_batch_size"], ns["tensor_model_parallel_size"]) == (3, 15 * dp, tp)


# -- torchtitan 0.3.0 -------------------------------------------------------------------------
# Meanings from the torchtitan 0.3.0 wheel, torchtitan/config/configs.py (the field docstrings):
#   parallelism.data_parallel_replicate_degree: "weights will be replicated across" that many
#     ranks; data_parallel_shard_degree: "weights will be sharded across" that many ranks (FSDP
#     over dp_shard x cp, distributed/parallel_dims.py); tensor_/pipeline_/context_parallel_degree:
#     "... degree. 1 means disabled."; enable_sequence_parallel defaults to True (tyro turns
#     `--...no_enable_sequence_parallel` into False).
#   training.local_batch_size: "Batch size processed per data-parallel rank in one gradient
#     accumulation step. With pipeline parallelism, this is split into pipeline microbatches."
#   parallelism.pipeline_parallel_microbatch_size: "The size of each pipeline parallel
#     microbatch"; n_microbatches = local_batch_size // that (distributed/pipeline_parallel.py).
#   training.global_batch_size: "across data-parallel ranks and gradient accumulation steps";
#     trainer.py: gradient_accumulation_steps = global // (local x dp_replicate x dp_shard).
#   parallelism.pipeline_parallel_layers_per_stage: "layers per (virtual) pipeline stage", the
#     embedding and the output each counting as one (pipeline_parallel_first/last_stage_less_layers).
#   training.enable_cpu_offload: FSDP's CPU offload of parameters, gradients and optimizer states.
#   activation_checkpoint:{none,selective,full}: the AC policy subcommand (config/manager.py).


def torchtitan_namespace(args: tuple[str, ...]) -> tuple[dict, str]:
    """({section.key: value}, the activation_checkpoint subcommand) as tyro reads `args`: `--k=v`,
    a switch `--k` (`--no_k`: False), or `--k v1 v2` for a list."""
    ns: dict = {}
    *overrides, ac = args
    assert ac.startswith("activation_checkpoint:"), args
    i = 0
    while i < len(overrides):
        a = overrides[i]
        assert a.startswith("--"), a
        key, eq, value = a[2:].partition("=")
        section, _, field = key.rpartition(".")
        values = []
        while not eq and i + 1 < len(overrides) and not overrides[i + 1].startswith("--"):
            values.append(float(overrides[i + 1]))
            i += 1
        if values:
            value = tuple(values)
        elif not eq and field.startswith("no_"):
            key, value = f"{section}.{field[3:]}", False
        elif not eq:
            value = True
        else:
            value = int(value) if value.isdigit() else value
        assert key not in ns, f"{key} given twice"
        ns[key] = value
        i += 1
    return ns, ac.split(":", 1)[1]


# The recipe's training setup (tested in the last section) is left out where a test is about the layout.
TRAINING_KEYS = ("debug.", "optimizer.", "lr_scheduler.", "training.max_norm", "training.steps", "checkpoint.",
                 "metrics.")


def layout_only(ns: dict) -> dict:
    return {k: v for k, v in ns.items() if not k.startswith(TRAINING_KEYS)}


def test_torchtitan_puts_every_plan_field_in_the_override_that_means_it():
    # world = 336 x 10 = 3360 = tp 4 x pp 5 x cp 3 x dp 56; HSDP: shard groups of 24 ranks = dp_shard 8 x cp 3,
    # so dp_shard 8 and dp_replicate 56 / 8 = 7
    # global = micro 11 x accumulation 9 x dp 56 = 5544; under PP one step is one local batch of
    # 11 x 9 = 99 split into 9 micro-batches of 11
    # (58 layers + embedding + output) / (pp 5 x 2 virtual stages) = 6 layers per stage
    model = ModelSpec(name="toy-llama", family="llama", layers=58, hidden=6144, ffn_hidden=16384, heads=48,
                      kv_heads=12, vocab=32000)
    p = plan(nodes=336, gpus_per_node=10, tp=4, pp=5, cp=3, dp=56, micro_batch_size=11, grad_accum_steps=9,
             global_batch_size=5544, sharding="hsdp", hsdp_shard=24, recompute="selective",
             offload="optimizer+params", sequence_parallel=False, virtual_stages=2)
    ns, ac = torchtitan_namespace(rendered("torchtitan", p, model).args)
    ns = layout_only(ns)
    assert ns == {
        "parallelism.data_parallel_replicate_degree": 7, "parallelism.data_parallel_shard_degree": 8,
        "parallelism.tensor_parallel_degree": 4, "parallelism.enable_sequence_parallel": False,
        "parallelism.context_parallel_degree": 3, "parallelism.pipeline_parallel_degree": 5,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "parallelism.pipeline_parallel_layers_per_stage": 6, "parallelism.pipeline_parallel_microbatch_size": 11,
        "training.local_batch_size": 99, "training.global_batch_size": 5544, "training.seq_len": 4080,
        "training.disable_cuda_graphs": True, "training.enable_cpu_offload": True,
        "training.mixed_precision_param": "bfloat16",
    }
    assert ac == "selective"
    # torchtitan's own arithmetic on those values gives back the plan
    degree = ns["parallelism.data_parallel_replicate_degree"] * ns["parallelism.data_parallel_shard_degree"]
    assert ns["training.global_batch_size"] // (ns["training.local_batch_size"] * degree) == 1  # no extra accumulation
    assert ns["training.local_batch_size"] // ns["parallelism.pipeline_parallel_microbatch_size"] == 9
    assert degree * 4 * 5 * 3 == 3360


@pytest.mark.parametrize("sharding,replicate,shard", [("zero3", 1, 5), ("none", 5, 1)])
def test_torchtitan_without_pipeline_accumulates_micro_batches(sharding, replicate, shard):
    # world 10 = tp 2 x dp 5; global = 3 x 7 x 5 = 105; torchtitan's accumulation = 105 // (3 x 5) = 7
    p = plan(nodes=1, gpus_per_node=10, tp=2, dp=5, micro_batch_size=3, grad_accum_steps=7, global_batch_size=105,
             sharding=sharding, recompute="full", sequence_parallel=True)
    ns, ac = torchtitan_namespace(rendered("torchtitan", p).args)
    ns = layout_only(ns)
    assert ns == {
        "parallelism.data_parallel_replicate_degree": replicate, "parallelism.data_parallel_shard_degree": shard,
        "parallelism.tensor_parallel_degree": 2, "parallelism.context_parallel_degree": 1,
        "parallelism.pipeline_parallel_degree": 1, "training.local_batch_size": 3, "training.global_batch_size": 105,
        "training.seq_len": 4080, "training.mixed_precision_param": "bfloat16",
    }  # sequence parallel is torchtitan's default with tp > 1: no override
    assert ac == "full"
    assert 105 // (ns["training.local_batch_size"] * replicate * shard) == 7


# -- DeepSpeed 0.19.8 -------------------------------------------------------------------------
# Meanings from the deepspeed 0.19.8 wheel and https://www.deepspeed.ai/docs/config-json/:
#   train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size with
#   runtime/config.py _batch_assertion: train_batch_size == micro x accumulation x data-parallel
#   world size (the pipeline engine's dp: world / pp);
#   zero_optimization.stage: runtime/zero/config.py ZeroStageEnum (0 disabled, 1 optimizer
#   states, 2 gradients, 3 weights); zero_optimization.offload_optimizer / offload_param with
#   device "cpu" (runtime/zero/offload_config.py); bf16.enabled / fp16.enabled
#   (runtime/precision_config.py); `--deepspeed --deepspeed_config FILE` from
#   deepspeed/__init__.py _add_core_arguments.
DEEPSPEED_CASES = [
    # pp 3 x dp 5 on 15 GPUs: train batch = 11 x 13 x 5 = 715; ZeRO-1 with optimizer offload
    (dict(nodes=1, gpus_per_node=15, pp=3, dp=5, micro_batch_size=11, grad_accum_steps=13, global_batch_size=715,
          sharding="zero1", offload="optimizer", recompute="full"), "bf16-mixed",
     {"train_batch_size": 715, "train_micro_batch_size_per_gpu": 11, "gradient_accumulation_steps": 13,
      "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True},
      "pipeline": True}),
    # dp 14: 3 x 2 x 14 = 84; ZeRO-3 with parameters offloaded too
    (dict(nodes=2, gpus_per_node=7, dp=14, micro_batch_size=3, grad_accum_steps=2, global_batch_size=84,
          sharding="zero3", offload="optimizer+params"), "fp16-mixed",
     {"train_batch_size": 84, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
      "fp16": {"enabled": True}}),
    (dict(nodes=1, gpus_per_node=6, dp=6, micro_batch_size=5, grad_accum_steps=4, global_batch_size=120,
          sharding="zero2"), "fp32",
     {"train_batch_size": 120, "train_micro_batch_size_per_gpu": 5, "gradient_accumulation_steps": 4,
      "zero_optimization": {"stage": 2}}),
    (dict(nodes=1, gpus_per_node=2, dp=2, micro_batch_size=9, grad_accum_steps=1, global_batch_size=18), "bf16-mixed",
     {"train_batch_size": 18, "train_micro_batch_size_per_gpu": 9, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}),
]


def _deepspeed_view(cfg: dict) -> dict:
    """The config's keys that carry plan fields (offload: the device only; pipeline: present)."""
    zero = {"stage": cfg["zero_optimization"]["stage"]}
    for key in ("offload_optimizer", "offload_param"):
        if key in cfg["zero_optimization"]:
            zero[key] = {"device": cfg["zero_optimization"][key]["device"]}
    out = {k: cfg[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")}
    out["zero_optimization"] = zero
    out.update({k: cfg[k] for k in ("bf16", "fp16") if k in cfg})
    if "pipeline" in cfg:
        out["pipeline"] = True
    return out


@pytest.mark.parametrize("fields,precision,expected", DEEPSPEED_CASES, ids=["pp-zero1", "zero3", "zero2", "zero0"])
def test_deepspeed_config_keys_mean_the_plan(fields, precision, expected):
    r = rendered("deepspeed", plan(**fields), precision=precision)
    assert r.args == ("--deepspeed", "--deepspeed_config", f"{JOB_FOLDER_TOKEN}/framework/ds_config.json")
    assert _deepspeed_view(json.loads(r.files["ds_config.json"])) == expected


# -- PyTorch FSDP2 through accelerate 1.15.0 ----------------------------------------------------
# Meanings from the accelerate 1.15.0 wheel: utils/launch.py prepare_multi_gpu_env (what
# `accelerate launch` exports) read back by utils/dataclasses.py
# FullyShardedDataParallelPlugin.__post_init__: FSDP_VERSION, FSDP_RESHARD_AFTER_FORWARD (true =
# full shard), FSDP_OFFLOAD_PARAMS (CPUOffloadPolicy), FSDP_ACTIVATION_CHECKPOINTING;
# parallelism_config.py: PARALLELISM_CONFIG_DP_REPLICATE_SIZE / _DP_SHARD_SIZE (HSDP);
# ACCELERATE_MIXED_PRECISION: PrecisionType no|fp16|bf16; FSDP_CPU_RAM_EFFICIENT_LOADING and
# FSDP_SYNC_MODULE_STATES, which `accelerate launch` exports with its defaults "true"
# (commands/launch.py --fsdp_cpu_ram_efficient_loading / --fsdp_sync_module_states). Config file keys as `accelerate config`
# writes them (commands/config/cluster.py); commands/launch.py: --num_processes "The total number
# of processes to be launched in parallel", --num_machines "The total number of machines".
# HF TrainingArguments (transformers 5.24.0 training_args.py): per_device_train_batch_size "The
# batch size per device", gradient_accumulation_steps, "Effective batch size =
# per_device_train_batch_size * num_devices * gradient_accumulation_steps".
FSDP_CASES = [
    # HSDP: 30 ranks on 5 nodes of 6, shard groups of 10, 30 / 10 = 3 replicas; 11 x 13 x 30 = 4290
    (dict(nodes=5, gpus_per_node=6, dp=30, micro_batch_size=11, grad_accum_steps=13, global_batch_size=4290,
          sharding="hsdp", hsdp_shard=10, recompute="full", offload="optimizer+params"), "bf16-mixed",
     {"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
      "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "true", "FSDP_ACTIVATION_CHECKPOINTING": "true",
      "FSDP_CPU_RAM_EFFICIENT_LOADING": "true", "FSDP_SYNC_MODULE_STATES": "true",
      "ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "3",
      "PARALLELISM_CONFIG_DP_SHARD_SIZE": "10"},
     ["--per_device_train_batch_size", "11", "--gradient_accumulation_steps", "13", "--bf16"],
     {"distributed_type": "FSDP", "num_machines": 5, "num_processes": 30, "mixed_precision": "bf16",
      "fsdp_offload_params": True, "fsdp_activation_checkpointing": True, "fsdp_reshard_after_forward": True,
      "dp_replicate": 3, "dp_shard": 10}),
    # full shard over 12 ranks on 3 nodes of 4; 2 x 7 x 12 = 168
    (dict(nodes=3, gpus_per_node=4, dp=12, micro_batch_size=2, grad_accum_steps=7, global_batch_size=168,
          sharding="zero3"), "fp16-mixed",
     {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
      "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "false", "FSDP_ACTIVATION_CHECKPOINTING": "false",
      "FSDP_CPU_RAM_EFFICIENT_LOADING": "true", "FSDP_SYNC_MODULE_STATES": "true"},
     ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "7", "--fp16"],
     {"distributed_type": "FSDP", "num_machines": 3, "num_processes": 12, "mixed_precision": "fp16",
      "fsdp_offload_params": False, "fsdp_activation_checkpointing": False, "fsdp_reshard_after_forward": True}),
    # plain DDP (accelerate's default under torchrun): no FSDP variables at all
    (dict(nodes=1, gpus_per_node=8, dp=8, micro_batch_size=4, grad_accum_steps=3, global_batch_size=96), "fp32",
     {"ACCELERATE_MIXED_PRECISION": "no"},
     ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "3"],
     {"distributed_type": "MULTI_GPU", "num_machines": 1, "num_processes": 8, "mixed_precision": "no"}),
]


def _accelerate_view(text: str) -> dict:
    doc = yaml.safe_load(text)
    out = {k: doc[k] for k in ("distributed_type", "num_machines", "num_processes", "mixed_precision")}
    fsdp = doc.get("fsdp_config") or {}
    out.update({k: fsdp[k] for k in ("fsdp_offload_params", "fsdp_activation_checkpointing",
                                     "fsdp_reshard_after_forward") if k in fsdp})
    pc = doc.get("parallelism_config") or {}
    if pc:
        out["dp_replicate"] = pc["parallelism_config_dp_replicate_size"]
        out["dp_shard"] = pc["parallelism_config_dp_shard_size"]
    return out


@pytest.mark.parametrize("fields,precision,env,args,config", FSDP_CASES, ids=["hsdp", "full-shard", "ddp"])
def test_fsdp_environment_args_and_config_mean_the_plan(fields, precision, env, args, config):
    r = rendered("fsdp", plan(**fields), precision=precision)
    plan_env = {k: v for k, v in r.env.items() if k not in ("FSDP_AUTO_WRAP_POLICY", "FSDP_TRANSFORMER_CLS_TO_WRAP",
                                                              "FSDP_STATE_DICT_TYPE")}
    assert plan_env == env
    assert list(r.args[:len(args)]) == args  # then the recipe's training setup (the last section)
    assert _accelerate_view(r.files["accelerate_config.yaml"]) == config


# -- custom: the job's JOBCTL_* environment ------------------------------------------------------
# README "Submission": the plan reaches the job as JOBCTL_TP, JOBCTL_PP, JOBCTL_DP, JOBCTL_CP,
# JOBCTL_MICRO_BATCH_SIZE, JOBCTL_GRAD_ACCUM_STEPS, JOBCTL_GLOBAL_BATCH_SIZE, JOBCTL_ZERO_STAGE, ...
# (the "Frameworks" table: custom renders no arguments, the code reads these). The names are the
# glossary's (docs/style: tp, pp, dp, cp, micro_batch_size, grad_accum_steps, global_batch_size);
# the ZeRO stage of a sharding is the ZeRO paper's (Rajbhandari et al. 2020: 1 optimizer states,
# 2 + gradients, 3 + parameters; HSDP shards all three inside its group).
CUSTOM_SUPPORTS = {"tp": True, "pp": True, "cp": True, "sequence_parallel": True, "interleaved": True,
                   "recompute_layers": True, "sharding": ["none", "zero2"], "recompute": ["full"],
                   "offload": ["optimizer"]}


def test_custom_code_reads_every_plan_field_from_its_own_variable():
    # world = 15 x 14 = 210 = tp 2 x pp 3 x dp 5 x cp 7; global = 11 x 13 x 5 = 715; ep 35 of tp·cp·dp = 70
    p = plan(nodes=15, gpus_per_node=14, tp=2, pp=3, dp=5, cp=7, micro_batch_size=11, grad_accum_steps=13,
             global_batch_size=715, sharding="zero2", recompute="full", recompute_layers=9, offload="optimizer",
             sequence_parallel=True, virtual_stages=4, ep=35)
    r = rendered("custom", p, supports=CUSTOM_SUPPORTS)
    assert (r.args, r.files, r.env) == ((), {}, {})
    env = plan_environment(p, "toy")
    assert {k: v for k, v in env.items() if k != "JOBCTL_PLAN"} == {
        "JOBCTL_TP": "2", "JOBCTL_PP": "3", "JOBCTL_DP": "5", "JOBCTL_CP": "7", "JOBCTL_EP": "35",
        "JOBCTL_MICRO_BATCH_SIZE": "11",
        "JOBCTL_GRAD_ACCUM_STEPS": "13", "JOBCTL_GLOBAL_BATCH_SIZE": "715", "JOBCTL_SHARDING": "zero2",
        "JOBCTL_ZERO_STAGE": "2", "JOBCTL_RECOMPUTE": "full", "JOBCTL_OFFLOAD": "optimizer",
        "JOBCTL_SEQUENCE_PARALLEL": "1", "JOBCTL_VIRTUAL_STAGES": "4", "JOBCTL_RECOMPUTE_LAYERS": "9",
        "JOBCTL_NODES": "15", "JOBCTL_GPUS_PER_NODE": "14", "JOBCTL_WORLD_SIZE": "210", "JOBCTL_RECIPE_NAME": "toy",
    }
    whole = json.loads(env["JOBCTL_PLAN"])  # the whole plan, for code that wants one variable
    assert {k: whole[k] for k in ("tp", "pp", "dp", "cp", "micro_batch_size", "grad_accum_steps",
                                  "global_batch_size", "virtual_stages", "recompute_layers", "world_size")} == {
        "tp": 2, "pp": 3, "dp": 5, "cp": 7, "micro_batch_size": 11, "grad_accum_steps": 13,
        "global_batch_size": 715, "virtual_stages": 4, "recompute_layers": 9, "world_size": 210}


@pytest.mark.parametrize("sharding,stage", [("none", "0"), ("zero1", "1"), ("zero2", "2"), ("zero3", "3"),
                                            ("hsdp", "3")])
def test_custom_zero_stage_is_the_zero_papers(sharding, stage):
    p = plan(nodes=1, gpus_per_node=4, dp=4, micro_batch_size=1, grad_accum_steps=1, global_batch_size=4,
             sharding=sharding, hsdp_shard=2 if sharding == "hsdp" else 0)
    env = plan_environment(p, "toy")
    assert (env["JOBCTL_SHARDING"], env["JOBCTL_ZERO_STAGE"]) == (sharding, stage)


# -- the recipe's training setup, in each framework's own names (issue 33) ----------------------
# Every value distinct: steps 4321, lr 3.7e-4, min lr 3.7e-5 (a tenth), warm-up 17, weight decay
# 0.07, betas 0.83 / 0.97, eps 2e-7, clipping 0.6, seed 2024.
#   Megatron (arguments.py): --train-iters, --lr, --min-lr, --lr-decay-style, --lr-warmup-iters,
#     --weight-decay, --adam-beta1/2, --adam-eps, --clip-grad, --seed; --tokenizer-type
#     NullTokenizer counts one end-of-document token on top of --vocab-size
#     (megatron/training/tokenizer/tokenizer.py _NullTokenizer.vocab_size = given + 1);
#     --rotary-base (RoPE theta), --use-rope-scaling with --rope-scaling-factor, --norm-epsilon.
#   torchtitan 0.3.0 (trainer.py Trainer.Config): training.steps, training.max_norm, debug.seed,
#     optimizer.param_groups.0.optimizer_kwargs.{lr,betas,eps,weight_decay},
#     lr_scheduler.{warmup_steps,decay_type,min_lr_factor} (the floor as a fraction of the lr).
#   DeepSpeed 0.19.8 (runtime/config.py, runtime/lr_schedules.py): optimizer {type, params},
#     scheduler WarmupCosineLR {total_num_steps, warmup_num_steps, warmup_min_ratio,
#     cos_min_ratio (the floor as a ratio of the lr)}, gradient_clipping.
#   HF TrainingArguments (transformers training_args.py): --learning_rate, --lr_scheduler_type,
#     --warmup_steps, --max_steps, --weight_decay, --max_grad_norm, --seed, --adam_beta1/2,
#     --adam_epsilon.
from jobctl.planner.memory import Training  # noqa: E402

SETUP = Training(steps=4321, lr=3.7e-4, min_lr=3.7e-5, warmup_steps=17, schedule="cosine", weight_decay=0.07,
                 betas=(0.83, 0.97), eps=2e-7, grad_clip=0.6, seed=2024, checkpoint_every=250)
ROPE_MODEL = ModelSpec(name="toy-llama31", family="llama", layers=60, hidden=6144, ffn_hidden=16384, heads=48,
                       kv_heads=12, vocab=32000, rope_theta=250000.0, rope_scaling=16.0, norm_eps=3e-6)


def rendered_with(name: str, p: Plan, training: Training, model: ModelSpec = MODEL):
    fw = frameworks.get(name)
    w = Workload(model, SEQ, p.global_batch_size, framework=fw, training=training)
    assert fw.problems(p, w) == [], fw.problems(p, w)
    return fw.render(p, w)


def test_megatron_gets_the_schedule_optimizer_tokenizer_and_rope_the_recipe_states():
    p = plan(nodes=1, gpus_per_node=8, tp=2, dp=4, micro_batch_size=3, grad_accum_steps=5, global_batch_size=60)
    ns = megatron_namespace(rendered_with("megatron", p, SETUP, ROPE_MODEL).args)
    assert {k: ns[k] for k in ("train_iters", "lr", "min_lr", "lr_decay_style", "lr_warmup_iters", "weight_decay",
                               "adam_beta1", "adam_beta2", "adam_eps", "clip_grad", "seed")} == {
        "train_iters": 4321, "lr": "0.00037", "min_lr": "3.7e-05", "lr_decay_style": "cosine",
        "lr_warmup_iters": 17, "weight_decay": "0.07", "adam_beta1": "0.83", "adam_beta2": "0.97",
        "adam_eps": "2e-07", "clip_grad": "0.6", "seed": 2024}
    assert (ns["tokenizer_type"], ns["vocab_size"] + 1) == ("NullTokenizer", 32000)
    assert (ns["rotary_base"], ns["use_rope_scaling"], ns["rope_scaling_factor"], ns["layernorm_epsilon"]) == (
        250000, True, 16, "3e-06")
    # saves to and loads from the chain's folder (the runner's token) every 250 steps
    assert (ns["save"], ns["load"], ns["save_interval"]) == (CHECKPOINT_DIR_TOKEN, CHECKPOINT_DIR_TOKEN, 250)
    assert ns["log_interval"] == 1  # "iteration N/ M" every step, for the hang watchdog
    # a tokenizer of the recipe's own
    hf = Training(lr=1e-4, tokenizer="huggingface", tokenizer_path="/data/tok")
    ns = megatron_namespace(rendered_with("megatron", p, hf).args)
    assert (ns["tokenizer_type"], ns["tokenizer_model"]) == ("HuggingFaceTokenizer", "/data/tok")
    assert "vocab_size" not in ns


def test_torchtitan_gets_the_schedule_optimizer_and_seed():
    p = plan(nodes=1, gpus_per_node=8, dp=8, micro_batch_size=3, grad_accum_steps=5, global_batch_size=120,
             sharding="zero3")
    ns, _ = torchtitan_namespace(rendered_with("torchtitan", p, SETUP).args)
    group = "optimizer.param_groups.0.optimizer_kwargs."
    assert {k: v for k, v in ns.items() if k.startswith(TRAINING_KEYS)} == {
        "training.steps": 4321, "training.max_norm": "0.6", "debug.seed": 2024,
        group + "lr": "0.00037", group + "weight_decay": "0.07", group + "eps": "2e-07", group + "betas": (0.83, 0.97),
        "lr_scheduler.warmup_steps": 17, "lr_scheduler.decay_type": "cosine", "lr_scheduler.min_lr_factor": "0.1",
        "checkpoint.enable": True, "checkpoint.folder": CHECKPOINT_DIR_TOKEN, "checkpoint.interval": 250,
        "metrics.log_freq": 1}  # a metrics line every step, for the hang watchdog


def test_deepspeed_builds_the_optimizer_and_schedule_and_the_trainer_agrees():
    p = plan(nodes=1, gpus_per_node=8, dp=8, micro_batch_size=3, grad_accum_steps=5, global_batch_size=120,
             sharding="zero2", offload="optimizer")
    r = rendered_with("deepspeed", p, SETUP)
    cfg = json.loads(r.files["ds_config.json"])
    assert cfg["optimizer"] == {"type": "AdamW", "params": {"lr": 3.7e-4, "weight_decay": 0.07, "betas": [0.83, 0.97],
                                                            "eps": 2e-7}}
    assert cfg["scheduler"] == {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 4321, "warmup_num_steps": 17, "warmup_min_ratio": 0.0, "cos_min_ratio": pytest.approx(0.1)}}
    assert cfg["gradient_clipping"] == 0.6 and "pipeline" not in cfg  # stages are PipelineModule's, not the file's
    assert cfg["steps_per_print"] == 1  # the engine's "step=N" line every step, for the hang watchdog
    hf = list(r.hf_args)
    assert hf[:2] == ["--deepspeed", f"{JOB_FOLDER_TOKEN}/framework/ds_config.json"]
    hf_no_switch = [a for a in hf[2:] if a != "--bf16"]  # bf16-mixed: the one switch
    pairs = dict(zip(hf_no_switch[::2], hf_no_switch[1::2]))
    assert pairs == {"--per_device_train_batch_size": "3", "--gradient_accumulation_steps": "5",
                     "--learning_rate": "0.00037", "--lr_scheduler_type": "cosine", "--warmup_steps": "17",
                     "--max_steps": "4321", "--weight_decay": "0.07", "--max_grad_norm": "0.6", "--seed": "2024",
                     "--adam_beta1": "0.83", "--adam_beta2": "0.97", "--adam_epsilon": "2e-07",
                     "--output_dir": CHECKPOINT_DIR_TOKEN, "--save_strategy": "steps", "--save_steps": "250"}
    # the pipeline engine's activation checkpointing is what the file says
    pp = plan(nodes=1, gpus_per_node=8, pp=2, dp=4, micro_batch_size=3, grad_accum_steps=5, global_batch_size=60,
              sharding="zero1", recompute="full")
    cfg = json.loads(rendered_with("deepspeed", pp, SETUP).files["ds_config.json"])
    assert cfg["pipeline"] == {"activation_checkpoint_interval": 1}


def test_accelerate_multi_node_launch_args_carry_each_nodes_rank_and_the_first_nodes_address():
    from jobctl.model import MASTER_ADDR_TOKEN, MASTER_PORT_TOKEN, NODE_RANK_TOKEN, per_node

    p = plan(nodes=2, gpus_per_node=4, dp=8, micro_batch_size=3, grad_accum_steps=5, global_batch_size=120,
             sharding="zero3")
    r = rendered_with("fsdp", p, SETUP)
    la = list(r.launch_args)
    assert dict(zip(la[::2], la[1::2])) == {
        "--config_file": f"{JOB_FOLDER_TOKEN}/framework/accelerate_config.yaml", "--num_machines": "2",
        "--num_processes": "8", "--machine_rank": NODE_RANK_TOKEN, "--main_process_ip": MASTER_ADDR_TOKEN,
        "--main_process_port": MASTER_PORT_TOKEN}
    # the runner fills them in on each node
    assert [per_node(a, 1, "node-a", 29123) for a in la[-6:]] == [
        "--machine_rank", "1", "--main_process_ip", "node-a", "--main_process_port", "29123"]
