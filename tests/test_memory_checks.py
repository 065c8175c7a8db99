"""`plan --explain` says, per memory term, what checks it (issue 14): exact byte counts, the
trace of torchtitan's own code (docs/memory-accuracy.md, "Trace mode": torchtitan Llama 3
8B/70B/405B, FSDP2 with and without TP and 1F1B PP), small CPU models, or nothing yet (a named constant)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checks(*args) -> dict:
    r = subprocess.run([sys.executable, "-m", "jobctl", "plan", *args, "--explain", "--json"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    return d["plan"], {c["term"]: c for c in d["explain"]["memory_checks"]}


def test_a_layout_the_trace_covers_is_labelled_traced():
    # recipes/llama8b.yaml is torchtitan's Llama 3.1 8B; on the h100 inventory the plan is FSDP
    # only (tp = pp = cp = 1), the layout benchmarks/trace_memory.py traced.
    # The trace ran the eager program: train.compile=false.
    plan, c = checks("recipes/llama8b.yaml", "--cluster", "h100", "train.compile=false")
    assert (plan["tp"], plan["pp"], plan["cp"]) == (1, 1, 1)
    assert c["weights"]["check"] == c["gradients"]["check"] == c["optimizer states"]["check"] == "exact"
    assert c["layer activations"]["check"] == "traced"
    assert c["cuda context"]["check"] == c["nccl buffers"]["check"] == "modelled"


def test_a_compiled_block_is_labelled_measured_not_traced():
    # compiled (torchtitan on GPUs by default) the block keeps another set than the traced eager
    # program: measured on torchtitan's compiled block (tests/test_compiled_activations.py)
    _, c = checks("recipes/llama8b.yaml", "--cluster", "h100")
    assert c["layer activations"]["check"] == "measured"
    assert "compiled" in c["layer activations"]["by"]
    # the MoE blocks were measured on one rank: with experts spread over ranks (ep > 1) they are not
    plan, c = checks("recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                     "parallelism.ep=1", "parallelism.tp=1")
    assert (plan["tp"], plan["ep"]) == (1, 1) and c["layer activations"]["check"] == "measured"
    plan, c = checks("recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                     "parallelism.ep=8")
    assert plan["ep"] == 8 and c["layer activations"]["check"] == "modelled"
    # eager, Qwen3's and DeepSeek-V3's blocks were measured too (one rank)
    _, c = checks("recipes/qwen3-30b-a3b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                  "parallelism.ep=1", "parallelism.tp=1", "train.compile=false")
    assert c["layer activations"]["check"] == "measured" and "eager" in c["layer activations"]["by"]
    # Float8 compiled under TP was measured too (8B's block at TP 2 and 4), and with selective AC
    # at TP 2; an MXFP8 block compiled was not (16-bit's set is assumed for it)
    plan, c = checks("recipes/llama70b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                     "train.precision=fp8", "parallelism.recompute=none")
    assert plan["tp"] > 1 and plan["sequence_parallel"]
    assert c["layer activations"]["check"] == "measured"
    plan, c = checks("recipes/llama70b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                     "train.precision=fp8", "parallelism.recompute=selective")
    assert plan["tp"] > 1 and plan["recompute"] == "selective" and c["layer activations"]["check"] == "measured"
    plan, c = checks("recipes/llama8b.yaml", "--cluster", "b200", "train.precision=mxfp8")
    assert c["layer activations"]["check"] == "modelled"
    assert "16-bit's compiled set assumed" in c["layer activations"]["by"]
    plan, c = checks("recipes/llama8b.yaml", "--cluster", "h100", "train.precision=fp8")
    assert plan["tp"] == 1 and c["layer activations"]["check"] == "measured"
    # DeepSeek-V3 on h100 spreads its experts (ep > 1) and heads (tp > 1): not measured there
    plan, c = checks("recipes/deepseek-v3.yaml", "--cluster", "h100", "--framework", "torchtitan")
    assert plan["ep"] > 1 and c["layer activations"]["check"] == "modelled"


def test_a_layout_the_trace_does_not_cover_is_not_called_traced():
    # Megatron with tensor parallelism: the trace runs torchtitan's code only; the per-layer terms
    # were only compared with small CPU models.
    plan, c = checks("recipes/llama70b.yaml", "--cluster", "h100")
    assert plan["tp"] > 1
    assert c["layer activations"]["check"] == "measured"
    assert all(x["check"] != "traced" for x in c.values())


def test_torchtitan_with_tensor_and_pipeline_parallelism_is_traced():
    # The trace covers torchtitan's TP plan (70B, TP 8 x FSDP 32) and its pipeline stages
    # (pipeline_llm: 1F1B, the first stage at TP 8, the last one without TP; Interleaved1F1B with
    # two chunks per rank).
    _, c = checks("recipes/llama70b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                  "parallelism.tp=8", "parallelism.pp=1", "parallelism.cp=1", "train.compile=false")
    assert c["layer activations"]["check"] == "traced"
    plan, c = checks("recipes/llama70b.yaml", "--cluster", "h100", "--framework", "torchtitan",
                     "parallelism.tp=8", "parallelism.pp=4", "parallelism.cp=1", "parallelism.virtual_stages=1",
                     "parallelism.recompute=full", "train.compile=false")
    assert (plan["pp"], plan["virtual_stages"]) == (4, 1)
    assert c["layer activations"]["check"] == "traced"
    assert c["unsharded stage (FSDP under PP)"]["check"] == "traced"
    assert c["recompute working set"]["check"] == "traced"  # the trace's third correction
    # torchtitan's interleaved schedule was traced with its default two chunks per rank, not more
    from dataclasses import replace

    from jobctl.planner.explain import memory_checks
    from jobctl.planner.memory import Workload
    from jobctl.planner.models import PRESETS
    from jobctl.planner.plan import Plan
    w = Workload(PRESETS["llama3.1-70b"], 8192, 1024, framework="torchtitan")
    p = Plan(nodes=16, gpus_per_node=8, tp=8, pp=4, dp=4, cp=1, sharding="zero3", micro_batch_size=1,
             grad_accum_steps=256, global_batch_size=1024, recompute="full", offload="none", sequence_parallel=True)
    terms = [{"name": "layer activations"}, {"name": "unsharded stage (FSDP under PP)"}]
    assert [c["check"] for c in memory_checks(w, p, terms)] == ["traced", "traced"]
    assert [c["check"] for c in memory_checks(w, replace(p, virtual_stages=2), terms)] == ["traced", "traced"]
    assert [c["check"] for c in memory_checks(w, replace(p, virtual_stages=4), terms)] == ["measured", "modelled"]


def test_hf_llama_under_accelerate_fsdp_is_traced():
    # benchmarks/trace_memory.py --impl hf traces transformers' Llama under accelerate's FSDP2:
    # the `fsdp` framework's FSDP layouts are covered by it
    plan, c = checks("recipes/llama8b.yaml", "--cluster", "h100", "--framework", "fsdp")
    assert (plan["tp"], plan["pp"], plan["cp"]) == (1, 1, 1)
    assert c["layer activations"]["check"] == "traced"
    assert c["logits and loss"]["check"] == "traced"
