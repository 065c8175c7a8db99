"""precision fp8 / mxfp8 / nvfp4 (issue 29, first part): which GPUs and frameworks run them, what
Megatron is told, and the memory Transformer Engine's weight copies take. Expected values come
from the datasheets, Megatron-LM's option names and hand derivations written here."""

import json

import pytest
from jobctl_run import jobctl

from jobctl.errors import ConfigError
from jobctl.planning import load_inventory, load_recipe, plan_on


def plan(recipe, cluster, *overrides):
    return plan_on(load_recipe(f"recipes/{recipe}.yaml", list(overrides)), load_inventory(cluster, []),
                   alternatives=0).to_dict()


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_with_the_reason():
    d = plan("llama70b", "a100-40", "train.precision=fp8")
    assert not d["feasible"]
    (reason,) = d["reasons"]
    assert "needs Hopper, Ada or Blackwell tensor cores" in reason and "a100-sxm-40gb has no FP8" in reason


def test_block_scaled_formats_need_blackwell():
    d = plan("llama70b", "h100", "train.precision=nvfp4")
    assert not d["feasible"]
    assert "Blackwell" in d["reasons"][0] and "use fp8 or bf16-mixed" in d["reasons"][0]
    assert plan("llama70b", "b200", "train.precision=nvfp4")["feasible"]


def test_frameworks_without_a_renderable_fp8_recipe_say_why():
    # torchtitan: fp8 and mxfp8 are rendered (tests/test_torchtitan_float8.py); its NVFP4 converter is not
    d = plan("llama8b", "b200", "train.precision=nvfp4")
    assert not d["feasible"]
    assert "_nvfp4" in d["reasons"][0] and "not rendered yet" in d["reasons"][0]
    d = plan("llama3.2-1b-a10g", "h100", "train.precision=fp8")  # deepspeed
    assert "no FP8 training recipe" in d["reasons"][0]


@pytest.mark.parametrize("precision, recipe, expected", [
    # Megatron-LM arguments.py (core_v0.16.1): --fp8-format {e4m3,hybrid}, --fp8-recipe
    # {tensorwise,delayed,mxfp8,blockwise}, --fp4-format e2m1, --fp4-recipe nvfp4
    ("fp8", None, ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]),
    ("fp8", "delayed", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len",
                        "1024", "--fp8-amax-compute-algo", "max"]),
    ("fp8", "blockwise", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"]),
    ("mxfp8", None, ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]),
    ("nvfp4", None, ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]),
])
def test_megatron_is_told_the_recipe(precision, recipe, expected):
    over = [f"train.precision={precision}"] + ([f"train.fp8_recipe={recipe}"] if recipe else [])
    args = plan("llama70b", "b200", *over)["framework"]["args"]
    i = args.index("--bf16")
    assert args[i:i + len(expected)] == expected
    assert "--fp16" not in args


def test_fp8_recipe_without_fp8_is_a_recipe_error():
    with pytest.raises(ConfigError) as e:
        load_recipe("recipes/llama70b.yaml", ["train.fp8_recipe=delayed"])
    assert "fp8_recipe" in str(e.value) and "precision: fp8" in str(e.value)


# Llama 3.1 70B (its config.json: hidden 8192, 64 heads of 128, 8 KV heads, FFN 28672, 80 layers)
# at tp=4 pp=4: 20 layers per stage, each layer's matrices split 4 ways.
H, KV, FFN = 8192, 8 * 128, 28672
LAYER_PER_RANK = 20 * ((H * H + 2 * H * KV + H * H + 3 * H * FFN) / 4 + 2 * H / 4)


@pytest.mark.parametrize("precision, per_weight", [
    # Blackwell's FP8 GEMMs take every layout, so per-tensor FP8 needs no transposed copy
    # (Transformer Engine pytorch/utils.py is_non_tn_fp8_gemm_supported: compute capability 10.x)
    ("fp8", 1),
    ("mxfp8", 2 * (1 + 1 / 32)),  # row-wise and column-wise blocks: one E8M0 scale byte per 32 values
    ("nvfp4", 2 * (0.5 + 1 / 16)),  # half a byte plus one E4M3 scale byte per 16 values, both copies
])
def test_without_the_distributed_optimizer_the_low_precision_copies_come_beside_the_16_bit_weights(
        precision, per_weight):
    d = plan("llama70b", "b200", f"train.precision={precision}", "parallelism.tp=4", "parallelism.pp=4",
             "parallelism.sharding=none")
    assert d["feasible"], d["reasons"]
    (term,) = [t for t in d["memory"]["terms"] if t["name"] == f"{precision} weight copies"]
    assert term["group"] == "weights"
    assert term["bytes"] == pytest.approx(LAYER_PER_RANK * per_weight, rel=1e-3)
    (weights,) = [t for t in d["memory"]["terms"] if t["name"] == "weights"]
    assert weights["bytes"] >= LAYER_PER_RANK * 2  # the 16-bit weights stay
    bf16 = plan("llama70b", "b200", "parallelism.tp=4", "parallelism.pp=4", "parallelism.sharding=none")
    assert [t for t in bf16["memory"]["terms"] if "copies" in t["name"]] == []


@pytest.mark.parametrize("cluster, precision, per_weight, flags", [
    ("h100", "fp8", 1 + 1, ["--fp8-param-gather"]),  # Hopper: row-wise and transposed bytes
    ("b200", "fp8", 1, ["--fp8-param-gather"]),
    ("b200", "mxfp8", 2 * (1 + 1 / 32), ["--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag"]),
])
def test_with_the_distributed_optimizer_the_layers_weights_are_fp8_only(cluster, precision, per_weight, flags):
    """Megatron-Bridge's FP8-CS and MXFP8 perf recipes gather FP8 weights (fp8_param_gather=True):
    the 16-bit copy of the layers' weights goes, the embedding and output layer keep theirs."""
    d = plan("llama70b", cluster, f"train.precision={precision}", "parallelism.tp=4", "parallelism.pp=4",
             "parallelism.sharding=zero1")
    assert d["feasible"], d["reasons"]
    terms = {t["name"]: t["bytes"] for t in d["memory"]["terms"]}
    assert terms[f"{precision} weights"] == pytest.approx(LAYER_PER_RANK * per_weight, rel=1e-3)
    # one stage's embedding or output matrix at most: the vocabulary padded to 128·tp, split 4 ways
    assert terms["weights"] <= 128512 * H / 4 * 2 * 1.001
    args = d["framework"]["args"]
    assert all(f in args for f in flags)
    blockwise = plan("llama70b", cluster, "train.precision=fp8", "train.fp8_recipe=blockwise", "parallelism.tp=4",
                     "parallelism.pp=4", "parallelism.sharding=zero1")
    assert "--fp8-param-gather" not in blockwise["framework"]["args"]  # blockwise scaling keeps 16-bit weights


def test_custom_code_gets_the_precision_in_its_environment(tmp_path):
    r = jobctl("submit", "recipes/tiny.yaml", "train.precision=fp8", "train.fp8_recipe=delayed", "--cluster",
               "tests/data/clusters/dev-2x1.yaml", "--dry-run", "--json", env={"JOBCTL_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["env"]
    assert (env["JOBCTL_PRECISION"], env["JOBCTL_FP8_RECIPE"]) == ("fp8", "delayed")


# --- NVLink domains that span nodes (GB200 NVL72) ----------------------------------------------

def gb200(*overrides, inv=()):
    rec = load_recipe("recipes/llama405b.yaml", list(overrides))
    return plan_on(rec, load_inventory("gb200", list(inv)), alternatives=0).to_dict()


def test_tensor_parallelism_may_span_the_trays_of_one_nvlink_domain():
    """A GB200 NVL72 rack: 4 GPUs per node (compute tray), one NVLink domain of 72 (NVIDIA's
    GB200 NVL72 datasheet). tp=8 spans two trays and stays on NVLink; with the domain cut to one
    tray it crosses the node boundary and is refused."""
    assert gb200("parallelism.tp=8")["feasible"]
    cut = gb200("parallelism.tp=8", inv=["partitions.0.nvlink_domain_gpus=4"])
    assert not cut["feasible"] and "crosses the node boundary" in cut["reasons"][0]


def test_data_parallel_traffic_inside_the_domain_goes_over_nvlink():
    """The same layout with the domain cut to one tray: its data-parallel group (4 ranks, 9
    pipeline stages apart, spanning trays) now reduces over the network, so its exposed
    communication can only grow, and the step with it."""
    rec = ["model=llama3.1-70b", "train.global_batch_size=1024", "parallelism.tp=2", "parallelism.pp=9",
           "parallelism.dp=4", "parallelism.cp=1"]
    a, b = gb200(*rec), gb200(*rec, inv=["partitions.0.nvlink_domain_gpus=4"])
    assert a["feasible"] and b["feasible"]
    assert a["estimate"]["parts"]["dp_comm_s"] < b["estimate"]["parts"]["dp_comm_s"]
    assert a["estimate"]["step_time_s"] < b["estimate"]["step_time_s"]


def test_a_domain_must_be_whole_nodes():
    with pytest.raises(ConfigError) as e:
        load_inventory("gb200", ["partitions.0.nvlink_domain_gpus=70"])
    assert "whole number of nodes of 4 GPUs" in str(e.value)
