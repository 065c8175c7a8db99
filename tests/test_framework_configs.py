"""What jobctl renders is accepted by the frameworks' own configuration code (megatron-core,
torchtitan, deepspeed, accelerate: test dependencies, never imported by jobctl), for a matrix of
plans jobctl itself chose, and the framework derives the same numbers as the plan (data-parallel
size, micro-batches, accumulation, schedule). Each framework runs in a subprocess
(tests/framework_checks/). Each checker is also shown to refuse a bad configuration, so a pass
means something.

Where a check cannot run the framework's code here: Megatron-LM's `validate_args` lives in the
Megatron-LM repository, not in any package; its option table (tests/data/megatron_lm_flags.json,
dumped from tag core_v0.16.1) stands in for its argparse, and megatron-core's TransformerConfig
runs its own checks.
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobctl.model import CHECKPOINT_DIR_TOKEN
from jobctl.planner.memory import stage_layers
from jobctl.planner.models import PRESETS
from jobctl.planning import load_inventory, load_recipe, plan_on

HERE = Path(__file__).parent
PYTHON = os.environ.get("JOBCTL_FRAMEWORK_PYTHON", sys.executable)
MODULES = {"megatron": "megatron.core", "torchtitan": "torchtitan", "deepspeed": "deepspeed", "fsdp": "accelerate"}



def _available(framework: str) -> bool:
    if PYTHON != sys.executable:
        return subprocess.run([PYTHON, "-c", f"import {MODULES[framework]}"], capture_output=True).returncode == 0
    return importlib.util.find_spec(MODULES[framework].split(".")[0]) is not None


def _need(framework: str):
    if not _available(framework):
        if os.environ.get("JOBCTL_REQUIRE_FRAMEWORKS"):
            pytest.fail(f"{MODULES[framework]} is not installed (pip install -e '.[test]')")
        pytest.skip(f"{MODULES[framework]} is not installed")


def run_checker(framework: str, cases: list[dict]) -> list[dict]:
    proc = subprocess.run([PYTHON, str(HERE / "framework_checks" / f"check_{framework}.py")],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# (recipe, cluster, overrides): plans chosen by jobctl, pins steering it into each feature
MATRIX = {
    "megatron": [
        ("llama70b", "h100", []),
        ("llama405b", "h100", []),
        ("llama405b", "h100", ["parallelism.tp=8", "parallelism.pp=16", "parallelism.cp=1", "parallelism.dp=64",
                               "partitions.0.nodes=1024"]),
        ("llama70b", "h100", ["parallelism.recompute=selective", "train.attention=eager", "train.seq_len=2048"]),
        ("llama8b", "a100-40", ["framework=megatron", "parallelism.pp=2", "parallelism.recompute=full"]),
        ("llama8b", "h100", ["framework=megatron", "parallelism.cp=2", "parallelism.tp=4"]),
        ("llama70b", "h100", ["parallelism.offload=optimizer", "parallelism.sharding=zero1"]),
        ("llama8b", "h100", ["framework=megatron", "train.fused_cross_entropy=true"]),  # --cross-entropy-loss-fusion
        ("llama8b", "h100", ["framework=megatron", "train.fused_cross_entropy=te"]),  # ... --cross-entropy-fusion-impl te
        ("llama70b", "h100", ["train.precision=fp8"]),  # --fp8-format hybrid --fp8-recipe tensorwise
        ("llama70b", "h100", ["train.precision=fp8", "train.fp8_recipe=delayed"]),
        ("llama70b", "b200", ["train.precision=mxfp8"]),
        ("llama70b", "b200", ["train.precision=nvfp4"]),  # --fp4-format e2m1 --fp4-recipe nvfp4
        ("llama70b", "h100", ["train.grad_reduce=bf16"]),  # --grad-reduce-in-bf16
        ("mixtral-8x7b", "h100", []),  # --num-experts, --expert-model-parallel-size, grouped GEMM, alltoall
        ("qwen3-30b-a3b", "h100", []),  # --kv-channels, --qk-layernorm
        ("deepseek-v3", "h100", []),  # MLA, shared expert, sigmoid router with expert bias, --moe-layer-freq
        # 61 layers over 8 and 16 stages: --pipeline-model-parallel-layout, the last stage short
        ("deepseek-v3", "h100", ["parallelism.pp=8", "parallelism.virtual_stages=2"]),
        ("deepseek-v3", "h100", ["parallelism.pp=16"]),
        # selective: MLA's up-projections and the experts' SwiGLU (--recompute-modules)
        ("deepseek-v3", "h100", ["parallelism.recompute=selective"]),
        # gpt-oss: learnable sinks, biases on every linear, a 128-token window on alternate layers,
        # clamped GEGLU (Megatron-Bridge's gpt-oss bridge)
        ("qwen3-30b-a3b", "h100", ["model=gpt-oss-120b"]),
        # ... and named: the dense layers' MLP and the shared experts too
        ("deepseek-v3", "h100", ["parallelism.recompute=selective",
                                 "train.recompute_modules=[mla_up_proj,mlp,shared_experts]"]),
        ("mixtral-8x7b", "h100", ["parallelism.recompute=selective"]),
        # the flex dispatcher on HybridEP across two nodes, as Megatron-Bridge's H100 Qwen3-30B runs it
        ("qwen3-30b-a3b", "h100", ["train.moe_dispatcher=hybridep", "parallelism.ep=16", "parallelism.tp=1",
                                   "parallelism.pp=1"]),
        # ... and on DeepEP's normal kernels
        ("qwen3-30b-a3b", "h100", ["train.moe_dispatcher=deepep", "parallelism.ep=16", "parallelism.tp=1",
                                   "parallelism.pp=1"]),
    ],
    "torchtitan": [
        ("llama8b", "h100", []),
        ("llama8b", "a100-40", []),
        ("llama405b", "h100", ["framework=torchtitan"]),
        ("llama405b", "h100", ["framework=torchtitan", "parallelism.tp=8", "parallelism.pp=16", "parallelism.cp=1",
                               "parallelism.dp=64", "partitions.0.nodes=1024"]),
        ("llama70b", "h100", ["framework=torchtitan", "parallelism.recompute=selective"]),
        ("llama8b", "h100", ["parallelism.cp=2", "parallelism.sharding=zero3"]),
        ("llama8b", "a10g", ["parallelism.offload=optimizer+params"]),
        # expert parallelism over FSDP (--module=qwen3 --config=qwen3_30b_a3b, expert_parallel_degree)
        ("qwen3-30b-a3b", "h100", ["framework=torchtitan"]),
        ("qwen3-30b-a3b", "h100", ["framework=torchtitan", "parallelism.tp=2", "parallelism.ep=16"]),
        # --module=deepseek_v3 --config=deepseek_v3_671b (MLA), with async TP: --compile.components widened
        ("deepseek-v3", "h100", ["framework=torchtitan"]),
        # fp8: a registry config module of jobctl's (Float8LinearConverter, row-wise) in the files
        ("llama70b", "h100", ["framework=torchtitan", "train.precision=fp8"]),
        ("llama8b", "h100", ["train.precision=fp8"]),
        # mxfp8 on B200: the same with MXFP8LinearConverter
        ("llama70b", "b200", ["framework=torchtitan", "train.precision=mxfp8"]),
    ],
    "deepspeed": [
        ("llama3.2-1b-a10g", "a10g", []),
        ("llama3.2-1b-a10g", "h100", ["parallelism.sharding=zero3"]),
        ("llama2-7b-24gb", "rtx4090", ["framework=deepspeed", "train.method=full", "parallelism.offload=optimizer"]),
        ("llama8b", "a100-40", ["framework=deepspeed", "parallelism.offload=optimizer+params"]),
        ("llama8b", "h100", ["framework=deepspeed", "parallelism.pp=2", "parallelism.sharding=zero1"]),
    ],
    "fsdp": [
        ("llama2-7b-24gb", "rtx4090", []),
        ("llama8b", "h100", ["framework=fsdp"]),
        ("llama8b", "a100-40", ["framework=fsdp", "parallelism.sharding=hsdp"]),
        ("llama8b", "a100-40", ["framework=fsdp", "parallelism.offload=optimizer+params"]),
        ("llama3.2-1b-a10g", "h100", ["framework=fsdp", "parallelism.sharding=none"]),
        # fp8: accelerate's torchao backend, under FSDP2 (FP8 all-gather) and under DDP
        ("llama8b", "h100", ["framework=fsdp", "train.precision=fp8"]),
        ("llama3.2-1b-a10g", "h100", ["framework=fsdp", "parallelism.sharding=none", "train.precision=fp8"]),
    ],
}


def plans(framework: str) -> list[dict]:
    """The matrix's plans for `framework` (planned once per test session; callers copy, not edit)."""
    return list(_plans(framework))


@functools.cache
def _plans(framework: str) -> tuple[dict, ...]:
    out = []
    for recipe, cluster, overrides in MATRIX[framework]:
        inv_over = [o for o in overrides if o.startswith("partitions.")]
        rec_over = [o for o in overrides if not o.startswith("partitions.")]
        rec = load_recipe(f"recipes/{recipe}.yaml", rec_over)
        inv = load_inventory(cluster, inv_over)
        data = plan_on(rec, inv, alternatives=0).to_dict()
        assert data["feasible"], (recipe, cluster, overrides, data["reasons"])
        assert data["framework"]["name"] == framework
        out.append({"plan": data["plan"], "framework": data["framework"], "case": [recipe, cluster, overrides]})
    return tuple(out)


def test_megatron_accepts_what_jobctl_renders():
    _need("megatron")
    cases = plans("megatron")
    results = run_checker("megatron", cases)
    for case, r in zip(cases, results):
        p = case["plan"]
        assert r["ok"], (case["case"], r)
        assert (r["dp"], r["num_microbatches"], r["vpp"]) == (p["dp"], p["grad_accum_steps"], p["virtual_stages"])
        assert r["sequence_parallel"] == (p["sequence_parallel"] and p["tp"] > 1)
        assert r["distributed_optimizer"] == (p["sharding"] == "zero1")
        assert r["cpu_offload"] == (p["offload"] == "optimizer")
        # the overlaps the step model counts on are on: the gradient reduce with any data-parallel
        # group, the parameter gather with the distributed optimizer
        assert r["overlap_grad_reduce"] == (p["dp"] * p["cp"] > 1)
        assert r["overlap_param_gather"] == (p["dp"] * p["cp"] > 1 and p["sharding"] == "zero1")
        # TP communication under the GEMMs wherever it is sequence-parallel (the step model's tp_overlap)
        assert r["tp_comm_overlap"] == (p["tp"] > 1 and p["sequence_parallel"])
        assert r["recompute"] == {"none": None, "selective": "selective", "full": "full"}[p["recompute"]]
        if p["recompute"] == "selective":  # by hand: what each model has that is cheap to rebuild
            model = PRESETS.get(case["case"][0])
            named = [o.split("=", 1)[1] for o in case["case"][2] if o.startswith("train.recompute_modules=")]
            expected = named[0].strip("[]").split(",") if named else \
                {"deepseek-v3": ["mla_up_proj", "moe_act"], "mixtral-8x7b": ["moe_act"]}.get(case["case"][0],
                                                                                          ["core_attn"])
            assert r["recompute_modules"] == expected, case["case"]
        if p["recompute"] == "full":  # the first N layers of each model chunk (block), or all (uniform)
            per_chunk = p["recompute_layers"] // p["virtual_stages"]
            assert (r["recompute_method"], r["recompute_num_layers"]) == (
                ("block", per_chunk) if p["recompute_layers"] else ("uniform", 1))
        # TransformerConfig's fp8/fp4 fields as Megatron-LM sets them from --fp8-format/--fp8-recipe and
        # --fp4-format/--fp4-recipe: what the recipe's precision means in Transformer Engine's terms
        precision = dict(o.split("=") for o in case["case"][2] if o.startswith("train.")).get("train.precision")
        recipe = dict(o.split("=") for o in case["case"][2] if o.startswith("train.")).get("train.fp8_recipe")
        expected = {None: (None, None, None, None), "fp8": ("hybrid", recipe or "tensorwise", None, None),
                    "mxfp8": ("e4m3", "mxfp8", None, None), "nvfp4": (None, None, "e2m1", "nvfp4")}[precision]
        assert (r["fp8"], r["fp8_recipe"], r["fp4"], r["fp4_recipe"]) == expected, case["case"]
        # a mixture of experts: its experts split ep ways (expert tensor parallelism 1), the layers
        # that route as the model's own (DeepSeek-V3: its first 3 dense), MLA where the model has it
        # the MoE recipes are named after their model, unless the case names another
        model = PRESETS.get(dict(o.split("=", 1) for o in case["case"][2] if o.startswith("model=")).get(
            "model", case["case"][0]))
        if model is not None:
            # gpt-oss as Megatron-Bridge's bridge builds it (models/gpt_oss/gpt_oss_bridge.py @067f987df0):
            # learnable softmax (sinks), window (sliding_window - 1, 0) skipped every 2nd layer,
            # biases on every linear and on Q, K, V, quick_gelu GLU with offset 1.0 and clamp 7.0;
            # the others: vanilla softmax, no window, no biases, SwiGLU
            oss = model.name == "gpt-oss-120b"
            assert (r["softmax_type"], r["window_size"], r["window_attn_skip_freq"]) == (
                ("learnable", [127, 0], 2) if oss else ("vanilla", None, None)), case["case"]
            assert (r["add_bias_linear"], r["add_qkv_bias"]) == (oss, oss), case["case"]
            assert (r["activation"], r["glu_linear_offset"], r["activation_func_clamp_value"]) == (
                ("quick_gelu", 1.0, 7.0) if oss else ("silu", 0.0, None)), case["case"]
        if model is not None and model.moe is not None:
            assert (r["num_moe_experts"], r["ep"], r["etp"]) == (model.moe.experts, p["ep"], 1)
            freq = r["moe_layer_freq"]
            routes = [bool(freq[i]) for i in range(model.layers)] if isinstance(freq, list) else \
                [i % freq == 0 for i in range(model.layers)]
            assert routes == [model.moe.is_moe(i) for i in range(model.layers)]
            assert r["mla"] == (model.mla is not None)
            # MLA's norms on its compressed latents and Qwen3's per-head q/k norms are in the model
            # jobctl counts (moe.attention_params): Megatron builds them only with --qk-layernorm
            assert r["qk_layernorm"] == (model.mla is not None or model.qk_norm)
            # DeepSeek-V3's sequence-wise balancing beside its expert bias; the others' aux loss
            assert r["moe_router_load_balancing_type"] == ("seq_aux_loss" if model.moe.score_bias else "aux_loss")
            # DeepSeek-V3's group-limited routing (its config: n_group 8, topk_group 4), as the
            # TransformerConfig built from the flags holds it
            assert r["moe_router_groups"] == ([8, 4] if case["case"][0] == "deepseek-v3" else [None, None])
            # DeepSeek-V3's multi-token-prediction module (its config: num_nextn_predict_layers 1),
            # built on the last stage, in the layout's last stage where there is one
            assert r["mtp_num_layers"] == (model.mtp_layers or None)
            assert r["mtp_on_last_stage"] in ((None, True) if model.mtp_layers else (None,))
            # the all-to-alls under the paired micro-batch's compute wherever megatron-core's
            # TransformerConfig takes it (its __post_init__): experts split, no full recompute,
            # virtual stages when pipelined; the experts' weight gradients delayed with it
            combined = p["ep"] > 1 and p["recompute"] != "full" and (p["pp"] == 1 or p["virtual_stages"] > 1)
            assert (r["overlap_moe_expert_parallel_comm"], r["delay_wgrad_compute"]) == (combined, combined)
            # the token dispatcher the recipe asks for: NCCL's all-to-alls, or the flex dispatcher on
            # DeepEP's HybridEP kernels with the float32 routing probabilities HybridEP takes
            backend = next((o.split("=")[1] for o in case["case"][2] if o.startswith("train.moe_dispatcher=")), None)
            assert (r["moe_token_dispatcher_type"], r["moe_flex_dispatcher_backend"], r["moe_router_dtype"]) == (
                ("flex", backend, "fp32") if backend else ("alltoall", "deepep", None)), case["case"]
        # FP8 weights gathered in FP8 under the distributed optimizer (per-tensor and MXFP8 scaling)
        fp8_weights = p["sharding"] == "zero1" and (precision == "mxfp8" or (
            precision == "fp8" and (recipe or "tensorwise") in ("tensorwise", "delayed")))
        assert r["fp8_param"] == fp8_weights, case["case"]
        assert r["reuse_grad_buf_for_mxfp8_param_ag"] == (fp8_weights and precision == "mxfp8")
        # the fused loss as the recipe asks: Megatron-Core's own, or Transformer Engine's kernel
        fused = dict(o.split("=") for o in case["case"][2] if o.startswith("train.")).get("train.fused_cross_entropy")
        assert (r["cross_entropy_loss_fusion"], r["cross_entropy_fusion_impl"]) == {
            None: (False, "native"), "true": (True, "native"), "te": (True, "te")}[fused], case["case"]
        if r["layers_per_rank"] is not None:
            # the layout megatron-core built: its decoder layers per virtual stage in layer order
            # (stage i on rank i % pp) as Megatron-Bridge lays out DeepSeek-V3's 61 for the same
            # pp and v, and the layers per rank jobctl's memory and step models hold
            ranks = r["layers_per_rank"]
            order = [ranks[i % p["pp"]][i // p["pp"]] for i in range(p["pp"] * p["virtual_stages"])]
            assert order == BRIDGE_DEEPSEEK_V3[(p["pp"], p["virtual_stages"])], case["case"]
            first, _, last = stage_layers(61, p["pp"])
            assert (sum(ranks[0]), sum(ranks[-1])) == (first, last)
    assert any(c["plan"]["virtual_stages"] > 1 for c in cases)  # the interleaved schedule was exercised
    assert sum(r["layers_per_rank"] is not None for r in results) >= 3  # a layout with and without v
    assert any("--overlap-moe-expert-parallel-comm" in c["framework"]["args"] for c in cases)
    assert any("hybridep" in c["framework"]["args"] for c in cases)
    assert any("deepep" in c["framework"]["args"] for c in cases)


# Megatron-Bridge's DeepSeek-V3 layouts, decoder layers per (virtual) stage in layer order, by
# (pp, v) (recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout @067f987df0; the
# embedding rides on the first, the MTP module and the loss on the last)
BRIDGE_DEEPSEEK_V3 = {(4, 1): [16, 16, 16, 13], (4, 2): [8] * 7 + [5], (8, 1): [8] * 7 + [5],
                      (4, 4): [4] * 15 + [1], (8, 2): [4] * 15 + [1], (16, 1): [4] * 15 + [1]}


def _one_more_layer(args):
    """The layout's last stage given one more decoder layer than the model has."""
    i = args.index("--pipeline-model-parallel-layout") + 1
    head, last = args[i].rsplit("t*", 1)
    count = last.rstrip("mL")
    return args[:i] + [f"{head}t*{int(count) + 1}{last[len(count):]}"] + args[i + 1:]


def _without(args, *flags):
    return [a for a in args if a not in flags]


def _fp8_recipe_rowwise(args):
    args = list(args)
    args[args.index("--fp8-recipe") + 1] = "rowwise"  # torchao's name; Megatron's choices differ
    return args


def _no_fp8_format(args):
    i = args.index("--fp8-format")
    return args[:i] + args[i + 4:]  # drop --fp8-format X --fp8-recipe Y


# (a flag the rendered plan has, how it is broken, what Megatron says): validate_args word for word,
# megatron-core's TransformerConfig and DistributedDataParallelConfig __post_init__
WRONG_MEGATRON = [
    ("--fp8-recipe", _fp8_recipe_rowwise, "--fp8-recipe"),
    ("--overlap-param-gather", lambda a: _without(a, "--use-distributed-optimizer"), "distributed optimizer"),
    ("--tp-comm-overlap", lambda a: _without(a, "--sequence-parallel"), "only when sequence parallelism is enabled"),
    ("--fp8-param-gather", _no_fp8_format, "fp8_param must be used together with fp8 mode"),
    ("--fp8-param-gather", lambda a: _without(a, "--fp8-param-gather") + ["--reuse-grad-buf-for-mxfp8-param-ag"],
     "Reuse grad buffer only when keeping params in MXFP8"),
    # megatron-core's TransformerConfig on a mixture of experts: experts split without experts,
    # DeepSeek's expert bias without its sigmoid scores
    ("--expert-model-parallel-size", lambda a: _without_value(_without_value(a, "--num-experts"), "--moe-ffn-hidden-size"),
     "num_moe_experts must be non None to use expert-parallel"),
    ("--moe-router-enable-expert-bias", lambda a: _without_value(a, "--moe-router-score-function"),
     "Expert bias for aux-loss-free routing only supports sigmoid score function"),
    # group-limited routing: more groups kept than there are
    ("--moe-router-num-groups", lambda a: _with_value(a, "--moe-router-group-topk", "9"),
     "should be smaller than"),
    # the combined 1F1B schedule: not with full recompute; the delayed weight gradients not without it
    ("--overlap-moe-expert-parallel-comm", lambda a: a + ["--recompute-granularity", "full", "--recompute-method",
                                                          "uniform", "--recompute-num-layers", "1"],
     "disable full recomputation when enabling overlap_moe_expert_parallel_comm"),
    ("--delay-wgrad-compute", lambda a: _without(a, "--overlap-moe-expert-parallel-comm"),
     "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"),
    # the flex dispatcher takes one backend: HybridEP and DeepEP's deprecated switch together
    ("--moe-flex-dispatcher-backend", lambda a: a + ["--moe-enable-deepep"],
     "Only one backend is supported for flex token dispatcher"),
    # a layout beside another way of giving virtual stages (validate_args); one that builds a
    # layer the model does not have (PipelineParallelLayerLayout.validate_layer_layout)
    ("--pipeline-model-parallel-layout", lambda a: a + ["--num-layers-per-virtual-pipeline-stage", "4"],
     "No more than one of the following arguments"),
    ("--pipeline-model-parallel-layout", _one_more_layer, "must match num_layers 61"),
    # a layout with DeepSeek-V3's MTP module, the module count dropped
    ("--mtp-num-layers", lambda a: _without_value(a, "--mtp-num-layers"), "mtp layers in layout must match"),
    # MLA's up-projections recomputed in a model without MLA (TransformerConfig)
    ("--recompute-modules", lambda a: _with_value(a, "--recompute-modules", "mla_up_proj"),
     "mla_up_proj in recompute_modules is only supported with multi_latent_attention"),
    # Megatron-LM's parser: the fused loss's implementations are native and te
    ("--cross-entropy-fusion-impl", lambda a: _with_value(a, "--cross-entropy-fusion-impl", "triton"),
     "invalid choice 'triton'"),
    # gpt-oss's GLU offset with SwiGLU in place of quick GELU (TransformerConfig), and a softmax
    # type its parser does not have
    ("--quick-geglu", lambda a: [x if x != "--quick-geglu" else "--swiglu" for x in a],
     "glu_linear_offset is non-zero, activation function must be quick_gelu"),
    ("--softmax-type", lambda a: _with_value(a, "--softmax-type", "sink"), "invalid choice 'sink'"),
]


def _with_value(args: list, flag: str, value: str) -> list:
    """The arguments with `flag`'s value replaced."""
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


def _without_value(args: list, flag: str) -> list:
    """The arguments less `flag` and its value."""
    i = args.index(flag)
    return args[:i] + args[i + 2:]


def _tp_of_three(args):
    args = list(args)
    args[args.index("--tensor-model-parallel-size") + 1] = "3"  # 64 heads % 3
    return args


def test_megatron_checker_refuses_each_flag_broken_as_megatron_refuses_it():
    # (one checker run for all: each case a rendered plan with one flag broken) besides WRONG_MEGATRON,
    # a flag Megatron-LM does not have (argparse) and a tp that does not divide the heads (TransformerConfig)
    _need("megatron")
    cases = plans("megatron")
    wrong = WRONG_MEGATRON + [
        ("--tensor-model-parallel-size", lambda a: a + ["--virtual-pipeline-model-parallel-size", "4"], "unrecognized"),
        ("--tensor-model-parallel-size", _tp_of_three, "tensor_model_parallel_size")]
    broken = []
    for flag, breaks, _ in wrong:
        base = next(c for c in cases if flag in c["framework"]["args"])
        broken.append(dict(base, framework=dict(base["framework"], args=breaks(list(base["framework"]["args"])))))
    for (flag, _, message), r in zip(wrong, run_checker("megatron", broken)):
        assert not r["ok"] and message in r["error"], (flag, r)


def test_torchtitan_accepts_what_jobctl_renders():
    _need("torchtitan")
    cases = plans("torchtitan")
    results = run_checker("torchtitan", cases)
    for case, r in zip(cases, results):
        p = case["plan"]
        assert r["ok"], (case["case"], r)
        assert r["dp_replicate"] * r["dp_shard"] == p["dp"]
        assert (r["tp"], r["pp"], r["cp"]) == (p["tp"], p["pp"], p["cp"])
        # the plan's micro-batches per step: torchtitan's accumulation, or its pipeline micro-batches
        assert r["accum"] * r["n_microbatches"] == p["grad_accum_steps"]
        if p["pp"] > 1:
            assert r["schedule"] == ("ScheduleInterleaved1F1B" if p["virtual_stages"] > 1 else "Schedule1F1B")
        assert (r["ac"] or "none").split(".")[0] == {"none": "none", "selective": "SelectiveAC",
                                                      "full": "FullAC"}[p["recompute"]]
        assert r["cpu_offload"] == (p["offload"] != "none")
        # train.compile auto: compiled, with async TP wherever tp > 1 is sequence-parallel
        assert r["compile"] is True
        assert r["async_tp"] == (p["tp"] > 1 and p["sequence_parallel"])
        # experts: the model the run builds has the recipe's, and its meshes fold EP into
        # dp_shard x cp x tp as jobctl's expert data parallelism counts it
        # Qwen/Qwen3-30B-A3B config.json: 128 experts, 8 per token; deepseek-ai/DeepSeek-V3: 256, 8
        experts = {"qwen3-30b-a3b": (128, 8), "deepseek-v3": (256, 8)}.get(case["case"][0])
        if experts:
            assert (r["experts"], r["top_k"]) == experts
            assert r["ep"] == p["ep"] > 1
            assert r["efsdp"] * r["ep"] == p["dp"] * p["cp"] * p["tp"]  # jobctl's expert DP x EP
        # fp8: every Linear of the blocks the run builds is torchao's Float8Linear, five per block
        # (torchtitan's fused wqkv, wo, w1, w2, w3), and the output layer stays 16-bit, as in
        # torchtitan's own llama3_405b config; 80 and 32 blocks (Llama 3.1 70B and 8B, config.json)
        blocks = {"llama70b": 80, "llama8b": 32}.get(case["case"][0])
        if "train.precision=fp8" in case["case"][2]:
            assert r["linears"]["float8"] == 5 * blocks and r["linears"]["mxfp8"] == 0, r["linears"]
            assert r["linears"]["other_names"] == ["lm_head"] and r["linears"]["other"] == 1
            assert any(a.startswith("--module=jobctl_torchtitan_float8") for a in case["framework"]["args"])
        elif "train.precision=mxfp8" in case["case"][2]:
            # every Linear, the output layer too, as torchtitan's own llama3_8b_mxfp8 converts them
            assert r["linears"]["mxfp8"] == 5 * blocks + 1 and r["linears"]["float8"] == 0, r["linears"]
            assert r["linears"]["other"] == 0
            assert any(a.startswith("--module=jobctl_torchtitan_mxfp8") for a in case["framework"]["args"])
        else:
            assert r["linears"]["float8"] == r["linears"]["mxfp8"] == 0
    assert sum("train.precision=fp8" in c["case"][2] for c in cases) == 2
    assert sum("train.precision=mxfp8" in c["case"][2] for c in cases) == 1
    assert any(c["plan"]["virtual_stages"] > 1 for c in cases)
    assert any(c["plan"]["tp"] > 1 for c in cases)  # async TP was exercised
    assert sum(c["plan"]["ep"] > 1 for c in cases) == 3


def test_torchtitan_checker_refuses_wrong_values():
    """Each checked by torchtitan's own code, in one checker run: async TP without the model
    compiled (CompileConfig.__post_init__), a global batch the data-parallel degree does not
    divide (the trainer's arithmetic), an expert-parallel size that does not fold into
    dp_shard x cp x tp (ParallelDims.build_mesh cannot carve the experts' mesh from those ranks),
    a Float8 recipe name torchao does not know in the rendered config module
    (Float8LinearConfig.from_recipe_name, reached through Float8LinearConverter), and a scaling
    recipe given to MXFP8LinearConverter, whose Config has no such field (components/quantization/mx.py)."""
    _need("torchtitan")
    cases = plans("torchtitan")

    def with_args(case, edit):
        return dict(case, framework=dict(case["framework"], args=[edit(a) for a in case["framework"]["args"]]))

    async_tp = next(c for c in cases if "--compile.enable_async_tensor_parallel" in c["framework"]["args"])
    no_compile = dict(async_tp, framework=dict(async_tp["framework"], args=[
        a for a in async_tp["framework"]["args"] if a != "--compile.enable"]))
    batch = with_args(cases[0], lambda a: "--training.global_batch_size=7"
                      if a.startswith("--training.global_batch_size=") else a)
    moe = next(c for c in cases if c["plan"]["ep"] > 1)
    p = moe["plan"]
    assert (p["dp"] * p["cp"] * p["tp"]) % 3
    ep = with_args(moe, lambda a: "--parallelism.expert_parallel_degree=3"
                   if a.startswith("--parallelism.expert_parallel_degree=") else a)
    fp8 = next(c for c in cases if c["framework"]["files"])
    ((name, text),) = fp8["framework"]["files"].items()
    assert 'recipe_name="rowwise"' in text
    recipe = dict(fp8, framework=dict(fp8["framework"], files={name: text.replace('"rowwise"', '"rowwize"')}))
    mx = next(c for c in cases if "--module=jobctl_torchtitan_mxfp8" in c["framework"]["args"])
    ((name, text),) = mx["framework"]["files"].items()
    assert "MXFP8LinearConverter.Config(model_compile_enabled=True)" in text
    mx_recipe = dict(mx, framework=dict(mx["framework"], files={name: text.replace(
        "MXFP8LinearConverter.Config(", 'MXFP8LinearConverter.Config(recipe_name="mxfp8", ')}))
    r_compile, r_batch, r_ep, r_recipe, r_mx = run_checker("torchtitan", [no_compile, batch, ep, recipe, mx_recipe])
    assert not r_recipe["ok"] and "rowwize" in r_recipe["error"], r_recipe
    assert not r_mx["ok"] and "recipe_name" in r_mx["error"], r_mx
    assert not r_compile["ok"] and "Async TP requires" in r_compile["error"]
    assert not r_batch["ok"]
    assert not r_ep["ok"] and "mesh_sizes" in r_ep["error"], r_ep  # build_mesh cannot unflatten the ranks


def test_deepspeed_accepts_what_jobctl_renders():
    _need("deepspeed")
    cases = plans("deepspeed")
    results = run_checker("deepspeed", cases)
    stage = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}
    for case, r in zip(cases, results):
        p = case["plan"]
        assert r["ok"], (case["case"], r)
        assert (r["train_batch_size"], r["micro"], r["accum"]) == (
            p["global_batch_size"], p["micro_batch_size"], p["grad_accum_steps"])
        assert r["stage"] == stage[p["sharding"]]
        assert (r["offload_optimizer"] is not None) == (p["offload"] != "none")
        assert (r["offload_param"] is not None) == (p["offload"] == "optimizer+params")
        if p["pp"] > 1:  # the pipeline engine refuses ZeRO-2/3
            assert r["stage"] <= 1
        # the gradient reduction under the backward wherever ZeRO has a data-parallel group to
        # reduce over (DeepSpeed turns it on by itself only at stage 3)
        assert r["overlap_comm"] == (p["sharding"] != "none" and p["dp"] > 1), case["case"]
        if r["overlap_comm"]:
            assert any("overlap_comm" in x for x in case["framework"].get("overlaps", [])), case["case"]
    assert any(c["plan"]["sharding"] in ("zero1", "zero2") and c["plan"]["dp"] > 1 for c in cases)


def test_deepspeed_checker_refuses_an_inconsistent_batch():
    _need("deepspeed")
    base = plans("deepspeed")[0]
    cfg = json.loads(base["framework"]["files"]["ds_config.json"])
    cfg["train_batch_size"] += 1
    bad = dict(base, framework=dict(base["framework"], files={"ds_config.json": json.dumps(cfg)}))
    r = run_checker("deepspeed", [bad])[0]
    assert not r["ok"] and "train_batch_size" in r["error"]


def test_accelerate_accepts_what_jobctl_renders():
    _need("fsdp")
    cases = plans("fsdp")
    results = run_checker("fsdp", cases)
    for case, r in zip(cases, results):
        p = case["plan"]
        assert r["ok"], (case["case"], r)
        assert r["num_processes"] == p["world_size"]
        if "train.precision=fp8" in case["case"][2]:
            # accelerate's AO recipe as its own classes build it: tensor-wise scaling of inputs,
            # weights and gradients (AORecipeKwargs' default Float8LinearConfig), the Trainer
            # handing accelerate fp8, and every Linear of a 2-layer Llama converted but the model's
            # first and last (utils/ao.py convert_model_to_fp8_ao: 7 per layer, 2 x 7 - 1)
            assert (r["fp8_backend"], r["trainer_mixed_precision"]) == ("AO", "fp8")
            assert r["scaling"] == ["tensorwise"] * 3 and r["pad_inner_dim"]
            # FP8 all-gather under FSDP2 only (under DDP nothing is gathered, and torchao's
            # all-gather weight wrapper breaks the Trainer's safetensors checkpoint)
            assert r["fp8_all_gather"] == (p["sharding"] != "none")
            assert r["other_linears"] == ["lm_head", "model.layers.0.self_attn.q_proj"]
            assert len(r["float8_linears"]) == 2 * 7 - 1
        # the plan lists what runs under the compute (DDP's buckets, FSDP2's prefetch), as the
        # step model counts it
        listed = " ".join(case["framework"].get("overlaps", []))
        if p["dp"] > 1:
            assert ("DDP" if p["sharding"] == "none" else "FSDP prefetch") in listed, case["case"]
        if p["sharding"] == "none":
            assert "MULTI_GPU" in r["distributed_type"]
            continue
        assert (r["fsdp_version"], r["reshard_after_forward"]) == (2, True)
        assert r["activation_checkpointing"] == (p["recompute"] == "full")
        assert r["offload"] == ("CPUOffloadPolicy" if p["offload"] != "none" else "OffloadPolicy")
        if p["sharding"] == "hsdp":
            assert r["dp_replicate"] * r["dp_shard"] == p["dp"] and r["dp_shard"] == p["hsdp_shard"]


def test_accelerate_checker_refuses_fp8_that_would_not_run():
    """The fp8 case broken two ways jobctl must not render: --bf16 beside it (the Trainer then
    hands accelerate bf16: transformers training_args.py), and FSDP2's cpu_ram_efficient_loading
    left on (accelerate refuses it with torchao: accelerator.py)."""
    _need("fsdp")
    (fp8,) = [c for c in plans("fsdp") if "train.precision=fp8" in c["case"][2] and c["plan"]["sharding"] != "none"]
    fw = fp8["framework"]
    bf16 = dict(fp8, framework=dict(fw, args=[*fw["args"], "--bf16"]))
    ram = dict(fp8, framework=dict(fw, env=dict(fw["env"], FSDP_CPU_RAM_EFFICIENT_LOADING="true")))
    r_bf16, r_ram = run_checker("fsdp", [bf16, ram])
    assert not r_bf16["ok"] and "mixed_precision=bf16" in r_bf16["error"], r_bf16
    assert not r_ram["ok"] and "cpu_ram_efficient_loading" in r_ram["error"], r_ram


def test_accelerate_checker_refuses_an_unknown_key():
    _need("fsdp")
    base = plans("fsdp")[0]
    files = {"accelerate_config.yaml": base["framework"]["files"]["accelerate_config.yaml"] + "fsdp_version: 2\n"}
    r = run_checker("fsdp", [dict(base, framework=dict(base["framework"], files=files))])[0]
    assert not r["ok"] and "unknown keys" in r["error"]


def test_hf_trainer_accepts_the_deepspeed_flags_jobctl_renders():
    """${framework.hf_args} and ds_config.json agree in HF's own checks (batch, accumulation, bf16, lr,
    Adam, clipping, schedule): a mismatch makes trainer_config_finalize raise. DeepSpeed's pipeline
    engine is not the Trainer's, so a pp>1 plan renders no hf_args."""
    _need("deepspeed")
    cases = [c for c in plans("deepspeed") if c["plan"]["pp"] == 1]
    assert not [c for c in plans("deepspeed") if c["plan"]["pp"] > 1 and c["framework"].get("hf_args")]
    results = run_checker("hf_deepspeed", cases)
    for case, r in zip(cases, results):
        p = case["plan"]
        assert r["ok"], (case["case"], r)
        assert (r["micro"], r["accum"], r["bf16"]) == (p["micro_batch_size"], p["grad_accum_steps"], True)
        assert r["gradient_checkpointing"] == (p["recompute"] == "full")


def test_hf_trainer_check_refuses_a_learning_rate_that_disagrees():
    _need("deepspeed")
    base = plans("deepspeed")[0]
    hf = list(base["framework"]["hf_args"])
    hf[hf.index("--learning_rate") + 1] = "0.5"
    r = run_checker("hf_deepspeed", [dict(base, framework=dict(base["framework"], hf_args=hf))])[0]
    assert not r["ok"] and "learning_rate" in r["error"]


# What Megatron-LM (core_v0.16.1) has no usable default for, so a command without them fails
# before the first step: --lr (training.py:1391, float() of None in the LR scheduler), a
# tokenizer (megatron/training/tokenizer build_tokenizer; the null tokenizer needs --vocab-size
# for mock data) and a length (--train-iters or --train-samples, validate_args).
MEGATRON_NEEDS = ("--lr", "--tokenizer-type", "--train-iters")


@pytest.mark.parametrize("recipe", ["llama70b", "llama405b", "gpt-oss-120b"])
def test_shipped_megatron_recipes_need_only_their_data(recipe, tmp_path):
    """The whole command a shipped Megatron recipe runs (jobctl submit --dry-run, node 0, after the
    script name) goes through Megatron's option table and megatron-core's checks, and carries
    everything Megatron needs: the recipe's command adds only --mock-data."""
    _need("megatron")
    from jobctl_run import jobctl

    r = jobctl("submit", f"recipes/{recipe}.yaml", "--cluster", "h100", "--dry-run", "--json",
               env={"JOBCTL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    argv = dry["nodes"][0]["argv"]
    args = argv[argv.index("pretrain_gpt.py") + 1:]
    for flag in MEGATRON_NEEDS:
        assert flag in args, flag
    if args[args.index("--tokenizer-type") + 1] == "NullTokenizer":
        assert "--vocab-size" in args
    data = plan_on(load_recipe(f"recipes/{recipe}.yaml", []), load_inventory("h100", []), alternatives=0).to_dict()
    (result,) = run_checker("megatron", [{"plan": data["plan"], "framework": dict(data["framework"], args=args),
                                           "case": [recipe]}])
    assert result["ok"], result
    # the chain's checkpoint folder is filled in for the job (the dry run shows where it will be)
    rendered = [a.replace(CHECKPOINT_DIR_TOKEN, dry["checkpoint_dir"]) for a in data["framework"]["args"]]
    assert args[:len(rendered)] == rendered and args[len(rendered):] == ["--mock-data"]
    assert args[args.index("--save") + 1] == args[args.index("--load") + 1] == dry["checkpoint_dir"]
    assert dry["checkpoint_dir"] == dry["job_folder"] + "/checkpoints"
