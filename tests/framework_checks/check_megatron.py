"""Megatron: the rendered flags against Megatron-LM's parser (the option table dumped from
core_v0.16.1, tests/data/megatron_lm_flags.json), then megatron-core's own TransformerConfig
(built the way Megatron-LM's core_transformer_config_from_args builds it: every argument whose
name is a config field) and its micro-batch calculator."""

import ast
import dataclasses
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator  # noqa: E402
from megatron.core.fusions.fused_bias_geglu import quick_gelu  # noqa: E402  (arguments.py imports this one)
from megatron.core.transformer.enums import LayerType  # noqa: E402
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout  # noqa: E402
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: E402

TABLE = json.loads((Path(__file__).parent.parent / "data" / "megatron_lm_flags.json").read_text())["flags"]


def parse(args):
    ns, i = {}, 0
    while i < len(args):
        flag = args[i]
        if flag not in TABLE:
            raise ValueError(f"unrecognized argument {flag}")
        spec = TABLE[flag]
        if spec["nargs"] == 0:
            ns[spec["dest"]] = not flag.startswith("--disable-") and not flag.startswith("--no-")
            i += 1
            continue
        if spec["nargs"] in ("+", "*"):  # argparse takes every value up to the next option
            j = i + 1
            while j < len(args) and not str(args[j]).startswith("--"):
                j += 1
            if spec["nargs"] == "+" and j == i + 1:
                raise ValueError(f"argument {flag}: expected at least one argument")
            ns[spec["dest"]] = [int(v) if v.lstrip("-").isdigit() else v for v in args[i + 1:j]]
            i = j
            continue
        value = args[i + 1]
        choices = spec["choices"]
        if choices and not any(c.startswith("AttnBackend.") for c in choices) and value not in choices:
            raise ValueError(f"argument {flag}: invalid choice {value!r} (choose from {choices})")
        ns[spec["dest"]] = int(value) if value.lstrip("-").isdigit() else value
        i += 2
    return ns


def check(case):
    ns = parse(case["framework"]["args"])
    for dest in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):  # validate_args, word for word
        if isinstance(ns.get(dest), list) and len(ns[dest]) == 1:
            ns[dest] = ns[dest][0]
    plan = case["plan"]
    world = plan["world_size"]
    dp = world // (ns["tensor_model_parallel_size"] * ns["pipeline_model_parallel_size"] * ns["context_parallel_size"])
    layers = ns["num_layers"] + ns.get("account_for_embedding_in_pipeline_split", 0) + \
        ns.get("account_for_loss_in_pipeline_split", 0)
    pp = ns["pipeline_model_parallel_size"]
    layout = ns.get("pipeline_model_parallel_layout")
    if layout is not None:  # validate_args: one way to give virtual stages; their count from the layout
        if ns.get("num_layers_per_virtual_pipeline_stage") is not None:
            raise ValueError("No more than one of the following arguments can be set at the same time: "
                             "--num-layers-per-virtual-pipeline-stage, --pipeline-model-parallel-layout")
        stages = PipelineParallelLayerLayout.get_num_stages_from_str(layout)
        if stages % pp:
            raise ValueError("The length of pipeline_model_parallel_layout must be divisible by "
                             "pipeline_model_parallel_size")
    elif layers % pp:  # validate_args: 'Number of layers should be divisible by the pipeline-model-parallel size'
        raise ValueError("number of layers not divisible by pp")
    if ns.get("overlap_param_gather"):  # arguments.py validate_args, word for word
        if not ns.get("use_distributed_optimizer"):
            raise ValueError("--overlap-param-gather only supported with distributed optimizer")
        if not ns.get("overlap_grad_reduce"):
            raise ValueError("Must use --overlap-param-gather with --overlap-grad-reduce")
    if ns.get("delay_wgrad_compute") and ns.get("transformer_impl", "transformer_engine") != "transformer_engine":
        raise ValueError("Delaying wgrad compute is only supported with transformer_engine implementation")  # validate_args
    if ns.get("tp_comm_overlap") and not ns.get("sequence_parallel"):  # validate_args, word for word
        raise ValueError("Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is "
                         "enabled")
    vpp = None
    if ns.get("num_layers_per_virtual_pipeline_stage"):
        per_stage = layers // pp
        if per_stage % ns["num_layers_per_virtual_pipeline_stage"]:
            raise ValueError("number of layers per pipeline stage must be divisible number of layers per virtual stage")
        vpp = per_stage // ns["num_layers_per_virtual_pipeline_stage"]
        vpp = None if vpp == 1 else vpp
    elif layout is not None:
        vpp = None if stages // pp == 1 else stages // pp
    # core_transformer_config_from_args: MLATransformerConfig under --multi-latent-attention,
    # num_moe_experts from --num-experts; moe_freq_type evaluates a list-valued --moe-layer-freq
    config_class = MLATransformerConfig if ns.get("multi_latent_attention") else TransformerConfig
    if isinstance(ns.get("moe_layer_freq"), str):
        ns["moe_layer_freq"] = ast.literal_eval(ns["moe_layer_freq"])  # moe_freq_type evaluates it (a list here)
    fields = {f.name for f in dataclasses.fields(config_class)}
    kw = {k: v for k, v in ns.items() if k in fields}
    if "num_experts" in ns:
        kw["num_moe_experts"] = ns["num_experts"]
    kw["num_query_groups"] = ns.get("num_query_groups")
    # core_transformer_config_from_args: the activation and its bias fusion (the arguments'
    # defaults: bias_swiglu_fusion and bias_gelu_fusion on)
    kw["gated_linear_unit"] = bool(ns.get("swiglu"))
    if ns.get("swiglu"):
        kw["activation_func"] = F.silu
        kw["bias_activation_fusion"] = ns.get("bias_swiglu_fusion", True)
    else:
        kw["bias_activation_fusion"] = ns.get("bias_gelu_fusion", True)
    if ns.get("quick_geglu"):  # gated quick_gelu
        kw["gated_linear_unit"] = True
        kw["activation_func"] = quick_gelu
    for dest in ("glu_linear_offset", "activation_func_clamp_value"):  # their arguments' type=float
        if dest in kw:
            kw[dest] = float(kw[dest])
    if "window_size" in kw:  # arguments.py tuple_type: "127,0" -> (127, 0)
        kw["window_size"] = tuple(int(i) for i in str(kw["window_size"]).strip("()").split(","))
    kw["virtual_pipeline_model_parallel_size"] = vpp
    if ns.get("bf16"):
        kw["params_dtype"] = torch.bfloat16
    if pp > 1:
        kw["pipeline_dtype"] = kw.get("params_dtype", torch.float32)
    # core_transformer_config_from_args: fp8_param is --fp8-param-gather
    kw["fp8_param"] = bool(ns.get("fp8_param_gather"))
    cfg = config_class(**kw)
    # training.py get_megatron_ddp_config builds the DDP config from the same-named arguments
    ddp_fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    ddp = DistributedDataParallelConfig(**{k: v for k, v in ns.items() if k in ddp_fields})
    calc = ConstantNumMicroBatchesCalculator(ns["global_batch_size"], ns["micro_batch_size"], dp, False, 0)
    return {"ok": True, "dp": dp, "num_microbatches": calc.get(), "vpp": vpp or 1,
            "layers_per_rank": [[x.count(LayerType.decoder) for x in rank] for rank in
                                cfg.pipeline_model_parallel_layout.layout] if layout is not None else None,
            "mtp_num_layers": cfg.mtp_num_layers,
            "mtp_on_last_stage": LayerType.mtp in cfg.pipeline_model_parallel_layout.layout[-1][-1]
            if layout is not None else None,
            "recompute": cfg.recompute_granularity,
            "recompute_modules": cfg.recompute_modules if cfg.recompute_granularity == "selective" else None,
            "recompute_method": cfg.recompute_method,
            "recompute_num_layers": cfg.recompute_num_layers, "sequence_parallel": cfg.sequence_parallel,
            "distributed_optimizer": bool(ns.get("use_distributed_optimizer")),
            "cpu_offload": bool(ns.get("optimizer_cpu_offload")),
            "overlap_grad_reduce": bool(ns.get("overlap_grad_reduce")),
            "overlap_param_gather": bool(ns.get("overlap_param_gather")),
            "tp_comm_overlap": cfg.tp_comm_overlap, "fp8_param": cfg.fp8_param,
            "overlap_moe_expert_parallel_comm": cfg.overlap_moe_expert_parallel_comm,
            "delay_wgrad_compute": cfg.delay_wgrad_compute,
            "moe_token_dispatcher_type": cfg.moe_token_dispatcher_type,
            "moe_flex_dispatcher_backend": cfg.moe_flex_dispatcher_backend, "moe_router_dtype": cfg.moe_router_dtype,
            "cross_entropy_loss_fusion": cfg.cross_entropy_loss_fusion,
            "cross_entropy_fusion_impl": cfg.cross_entropy_fusion_impl,
            "reuse_grad_buf_for_mxfp8_param_ag": ddp.reuse_grad_buf_for_mxfp8_param_ag,
            "num_moe_experts": cfg.num_moe_experts, "ep": cfg.expert_model_parallel_size,
            "etp": cfg.expert_tensor_parallel_size, "moe_layer_freq": cfg.moe_layer_freq,
            "mla": isinstance(cfg, MLATransformerConfig), "qk_layernorm": cfg.qk_layernorm,
            "softmax_type": cfg.softmax_type, "window_size": cfg.window_size,
            "window_attn_skip_freq": cfg.window_attn_skip_freq, "add_bias_linear": cfg.add_bias_linear,
            "add_qkv_bias": cfg.add_qkv_bias, "glu_linear_offset": cfg.glu_linear_offset,
            "activation_func_clamp_value": cfg.activation_func_clamp_value,
            "activation": cfg.activation_func.__name__,
            "moe_router_load_balancing_type": cfg.moe_router_load_balancing_type,
            "moe_router_groups": [cfg.moe_router_num_groups, cfg.moe_router_group_topk],
            "fp8": cfg.fp8, "fp8_recipe": str(getattr(cfg.fp8_recipe, "value", cfg.fp8_recipe)) if cfg.fp8 else None,
            "fp4": getattr(cfg, "fp4", None),
            "fp4_recipe": str(getattr(cfg.fp4_recipe, "value", cfg.fp4_recipe)) if getattr(cfg, "fp4", None) else None}


out = []
for case in json.load(sys.stdin):
    try:
        out.append(check(case))
    except Exception as e:  # the framework's refusal, reported per case
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
