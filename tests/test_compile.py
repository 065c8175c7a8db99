"""train.compile (issue 29): torch.compile of the model where jobctl renders and models it
(torchtitan's --compile.enable, with its async TP when tp > 1), refused by name elsewhere."""

from __future__ import annotations

from jobctl.planning import load_inventory, load_recipe, plan_on


def plan(recipe, *overrides, cluster="h100"):
    return plan_on(load_recipe(f"recipes/{recipe}.yaml", list(overrides)), load_inventory(cluster, []),
                   alternatives=0).to_dict()


def test_auto_compiles_torchtitan_and_false_does_not():
    on = plan("llama8b", "framework=torchtitan", "parallelism.tp=1", "parallelism.dp=8", "resources.nodes=1")
    off = plan("llama8b", "framework=torchtitan", "parallelism.tp=1", "parallelism.dp=8", "resources.nodes=1",
               "train.compile=false")
    assert "--compile.enable" in on["framework"]["args"]
    assert "--compile.enable" not in off["framework"]["args"]
    # the same layout, its memory-bound kernels fused: faster, never slower
    assert on["plan"] == off["plan"]
    assert on["estimate"]["step_time_s"] < off["estimate"]["step_time_s"]


def test_async_tp_comes_with_compile_and_tensor_parallelism():
    d = plan("llama70b", "framework=torchtitan", "parallelism.tp=8")
    assert "--compile.enable_async_tensor_parallel" in d["framework"]["args"]
    assert any("async" in o for o in d["framework"]["overlaps"])
    d = plan("llama70b", "framework=torchtitan", "parallelism.tp=8", "train.compile=false")
    assert "--compile.enable_async_tensor_parallel" not in d["framework"]["args"]


def test_compile_where_jobctl_does_not_model_it_is_refused_by_name():
    d = plan("llama8b", "framework=megatron", "train.compile=true")
    assert not d["feasible"]
    assert any("train.compile=true" in r and "not megatron" in r for r in d["reasons"]), d["reasons"]
    assert plan("llama8b", "framework=megatron")["feasible"]  # auto: off, no refusal
