"""train.grad_reduce: bf16 -- Megatron's --grad-reduce-in-bf16 (issue 29, memory that does not
refuse what runs). Megatron-Bridge's performance recipes all run it: perf_recipes/_common.py
_benchmark_common sets ddp.grad_reduce_in_fp32 = False (NVIDIA-NeMo/Megatron-Bridge, commit
067f987). In megatron-core the main-grad buffer then has the parameters' dtype
(distributed/distributed_data_parallel.py: grad_dtype = torch.float if grad_reduce_in_fp32 else
param.dtype): 2 bytes per parameter instead of 4."""

from __future__ import annotations

import pytest

from jobctl.planning import load_inventory, load_recipe, plan_on

# Issue 29's refused layout: Llama 3.1 405B, TP8 PP8 CP2 VP8 on 512 H100s, micro-batch 1, 8K tokens
LAYOUT = ["framework=megatron", "train.seq_len=8192", "train.global_batch_size=512", "parallelism.tp=8",
          "parallelism.pp=8", "parallelism.cp=2", "parallelism.virtual_stages=8", "parallelism.micro_batch_size=1",
          "parallelism.recompute=none", "parallelism.offload=none", "parallelism.sharding=zero1",
          "resources.nodes=64"]
CLUSTER = """name: h100-64
scheduler: slurm
partitions:
  - {name: gpu, gpu: h100-sxm-80gb, gpus_per_node: 8, nodes: 64, cpus_per_node: 192, mem_gib: 2000}
"""


def planned(tmp_path, *extra):
    inv = tmp_path / "h100-64.yaml"
    inv.write_text(CLUSTER)
    return plan_on(load_recipe("recipes/llama405b.yaml", LAYOUT + list(extra)), load_inventory(str(inv), []),
                   alternatives=0).to_dict()


def term(report, name):
    return next(t["bytes"] for t in report["memory"]["terms"] if t["name"] == name)


def test_the_main_grad_buffer_is_bf16_and_the_deep_interleaved_405b_layout_fits(tmp_path):
    fp32 = planned(tmp_path, "train.grad_reduce=fp32")
    assert not fp32["feasible"]  # 82.0 GiB with fp32 main grads (issue 29)
    bf16 = planned(tmp_path, "train.grad_reduce=bf16")
    assert bf16["feasible"], bf16.get("reasons")
    # 2 B per parameter, like the bf16 weights on the same rank (405.85B / (tp 8 x pp 8) each)
    assert term(bf16, "gradients") == pytest.approx(term(bf16, "weights"), rel=1e-9)
    assert "--grad-reduce-in-bf16" in bf16["framework"]["args"]


def test_auto_is_what_megatron_bridge_runs_under_megatron_and_fp32_elsewhere(tmp_path):
    auto = planned(tmp_path)  # the recipe's default, train.grad_reduce: auto
    assert auto["feasible"], auto.get("reasons")
    assert "--grad-reduce-in-bf16" in auto["framework"]["args"]
    assert any("Megatron-Bridge" in n for n in auto["framework"]["notes"])
    assert term(auto, "gradients") == pytest.approx(term(auto, "weights"), rel=1e-9)
    # torchtitan reduces in fp32 (FSDP2's reduce_dtype): auto is not a refusal there
    tt = plan_on(load_recipe("recipes/llama8b.yaml", ["framework=torchtitan"]), load_inventory("h100", []),
                 alternatives=0).to_dict()
    assert tt["feasible"], tt.get("reasons")


def test_another_framework_refuses_it_by_name(tmp_path):
    r = plan_on(load_recipe("recipes/llama8b.yaml", ["framework=torchtitan", "train.grad_reduce=bf16"]),
                load_inventory("h100", []), alternatives=0).to_dict()
    assert not r["feasible"]
    assert any("--grad-reduce-in-bf16" in why and "megatron only, not torchtitan" in why for why in r["reasons"]), \
        r["reasons"]
