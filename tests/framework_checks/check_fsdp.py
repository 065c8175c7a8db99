"""accelerate: the rendered accelerate_config.yaml through accelerate's own ClusterConfig loader
(unknown keys and bad enums refused), and the rendered FSDP_* environment through
FullyShardedDataParallelPlugin (what Accelerator() builds in the training process) and
ParallelismConfig for HSDP.

Under mixed precision fp8 also: Accelerator() built from the rendered environment (its FP8
backend and the torchao Float8LinearConfig AORecipeKwargs makes), HF TrainingArguments parsed from
the rendered flags under that environment (the precision the Trainer hands accelerate), and a
two-layer Llama of transformers' converted by the Accelerator's own _prepare_ao (which Linear
layers become Float8Linear). Refused: a Trainer that would not train in fp8, and torchao with
FSDP2's cpu_ram_efficient_loading, which Accelerator.__init__ refuses on GPUs (this CPU run builds
no FSDP state, so the checker reads the plugin's setting against that guard, which it first finds
in accelerate's source)."""

import json
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
from accelerate.commands.config.config_args import ClusterConfig  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin  # noqa: E402


def check(case):
    fw = case["framework"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "accelerate_config.yaml")
        with open(path, "w") as f:
            f.write(fw["files"]["accelerate_config.yaml"])
        cc = ClusterConfig.from_yaml_file(path)
    out = {"ok": True, "distributed_type": str(cc.distributed_type), "num_processes": cc.num_processes,
           "mixed_precision": str(cc.mixed_precision)}
    env = fw["env"]
    if env.get("ACCELERATE_USE_FSDP") == "true":
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            pl = FullyShardedDataParallelPlugin()
            out.update(fsdp_version=pl.fsdp_version, reshard_after_forward=pl.reshard_after_forward,
                       offload=type(pl.cpu_offload).__name__, activation_checkpointing=pl.activation_checkpointing,
                       wrap=list(pl.transformer_cls_names_to_wrap or []))
            if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
                from accelerate.parallelism_config import ParallelismConfig

                pc = ParallelismConfig()
                out.update(dp_replicate=pc.dp_replicate_size, dp_shard=pc.dp_shard_size, total=pc.total_size)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    if env.get("ACCELERATE_MIXED_PRECISION") == "fp8":
        out.update(_fp8(fw, env))
    return out


def _fp8(fw, env):
    import inspect

    import torch
    from accelerate import Accelerator
    from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, TrainingArguments

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
                [a.replace("{JOBCTL_CHECKPOINT_DIR}", tmp) for a in fw["args"]] + ["--use_cpu"])
        if args.mixed_precision != "fp8":
            raise ValueError(f"HF Trainer would hand accelerate mixed_precision={args.mixed_precision}, not fp8")
        # (after TrainingArguments, which resets accelerate's shared state)
        acc = Accelerator(mixed_precision=args.mixed_precision)
        config = acc.ao_recipe_handler.config
        guard = "torchao with FSDP2 and cpu_ram_efficient_loading is not supported"
        if guard not in inspect.getsource(Accelerator.__init__):
            raise AssertionError("accelerate's guard against torchao with cpu_ram_efficient_loading moved: recheck")
        if env.get("ACCELERATE_USE_FSDP") == "true" and FullyShardedDataParallelPlugin().cpu_ram_efficient_loading:
            raise ValueError(guard + " (accelerator.py Accelerator.__init__)")
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
        (model,) = acc._prepare_ao(model)
        kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"fp8_backend": str(acc.fp8_backend.value), "trainer_mixed_precision": args.mixed_precision,
            "scaling": [str(c.scaling_granularity.value) for c in (config.cast_config_input, config.cast_config_weight,
                                                                   config.cast_config_grad_output)],
            "fp8_all_gather": config.enable_fsdp_float8_all_gather, "pad_inner_dim": config.pad_inner_dim,
            "float8_linears": sorted(n for n, k in kinds.items() if k == "Float8Linear"),
            "other_linears": sorted(n for n, k in kinds.items() if k != "Float8Linear")}


out = []
for case in json.load(sys.stdin):
    try:
        out.append(check(case))
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
