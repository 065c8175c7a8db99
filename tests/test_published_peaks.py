"""Published peak memory of real runs against the memory model (issue 14).

Source: torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (commit of December 2024):
Llama 3.1 on H100s with 96 GB HBM2e, sequence length 8192 (torchtitan's llama3 train configs),
"Memory" = max reserved GiB:
- Table 1, 8B, 8 GPUs, FSDP, local batch 2, selective AC, bf16, no compile: 82.4 GiB
- Table 4, 70B, 256 GPUs, FSDP 32 x TP 8, local batch 16, full AC:           71.9 GiB
- Table 5, 405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, 1F1B, local batch 32, full AC: 82.5 GiB
The 70B and 405B tables only have runs with torch.compile and Float8 (and async TP for 405B):
not comparable until those are modelled (the issue says so of such rows), which is why those
two stay expected failures whatever their error. jobctl models torchtitan 0.3.0's Float8, which
is row-wise and holds what BF16 holds (tests/test_torchtitan_float8.py); December 2024's
Float8, whose scaling the tables do not print, is not it. Reserved memory is the caching allocator's
view: jobctl's total minus the CUDA context and the NCCL buffers (which the allocator does not
see: both are cudaMalloc'd outside it). Within 10% each is the issue's target."""

from pathlib import Path

import pytest

from jobctl.planning import load_inventory, load_recipe, plan_on
from jobctl_measure import megatron_functional as mf

GIB = 1 << 30
INVENTORY = ["partitions.0.nodes=64", "partitions.0.gpu_memory_gib=96"]


def predicted_reserved_gib(model: str, overrides: list[str]) -> float:
    rec = load_recipe("recipes/llama8b.yaml", [f"model={model}", "framework=torchtitan", "train.seq_len=8192",
                                               "parallelism.cp=1", "parallelism.sharding=zero3", *overrides])
    inv = load_inventory("h100", INVENTORY)
    d = plan_on(rec, inv, alternatives=0, summary=False, learn=False).to_dict()
    assert d["feasible"], d["reasons"]
    outside = sum(t["bytes"] for t in d["memory"]["terms"] if t["name"] in ("cuda context", "nccl buffers"))
    return (d["memory"]["total_bytes"] - outside) / GIB


# (model, published GiB, overrides: the run's layout), each from the table named in the docstring
XFAIL_70B = ("measured 2026-11-29: predicted 41.3 GiB for torchtitan 0.3.0, whose registry configs compute the "
             "loss in 8 chunks; jobctl's model of the December 2024 trainer of the published run (the whole "
             "logits' loss: trace_memory.modelled(loss='ce')) gives 62.3 GiB (-13%), compiled or not (full AC "
             "keeps the block inputs only). The run used Float8 (tensor-wise then, with FP8 all-gathers), which "
             "torchtitan 0.3.0 cannot run and jobctl does not model; the traced tensors of this layout without it "
             "are 57.2 GiB, and the caching-allocator model replaying them reserves 63.7")
XFAIL_405B = ("measured 2026-11-29: predicted 57.4 GiB for the published 1F1B schedule (-30%; 56.0 on 2026-11-26, "
              "54.5 before the allocator's caches were modelled, 21.6 before FSDP under PP was modelled). "
              "torchtitan's own code for this layout, traced without compile, Float8 and "
              "async TP (benchmarks/trace_memory.py --model 405B --tp 8 --pp 8, first stage), holds 50.2 GiB of "
              "tensors and the model 50.1 (-0.3%); replayed through the caching-allocator model they reserve 56.8 "
              "GiB (trace_memory.py --allocator): the 26 GiB above that in the published max reserved come from "
              "torch.compile, Float8 and async TP, not modelled")
XFAIL_8B = ("measured 2026-11-29: predicted 56.5 GiB (-31%; 60.4 on 2026-11-28, 77.6 before jobctl modelled "
            "torchtitan 0.3.0's chunked loss): jobctl plans torchtitan 0.3.0, whose registry configs compute the loss in 8 sequence chunks "
            "(ChunkedLossWrapper), while the December 2024 trainer of the published run took the whole logits "
            "(2 x 8192 x 128,256 logits x 12 B = 23.5 GiB at the loss); that program, traced (--loss ce "
            "--cuda-graphs off) and replayed, reserves within 10% of the published figure and jobctl's model of "
            "it within 5% (tests/test_allocator_replay.py)")
PUBLISHED = [
    # torchtitan's trainer of December 2024 captured no CUDA graph and freed the gradients each step
    # (its train_step's optimizers.zero_grad()): train.cuda_graphs=false, as 0.3.0 then runs; its
    # loss took the whole logits, which 0.3.0's registry configs chunk (jobctl models 0.3.0); the
    # table's runs are the "no compile" ones: train.compile=false
    pytest.param("llama3.1-8b", 82.4, ["train.cuda_graphs=false", "train.compile=false", "train.global_batch_size=16",
                                       "parallelism.dp=8",
                                       "parallelism.tp=1",
                                       "parallelism.pp=1", "parallelism.micro_batch_size=2",
                                       "parallelism.recompute=selective"], id="8b-fsdp-sac",
                 marks=pytest.mark.xfail(strict=True, reason=XFAIL_8B)),
    # 77.6 GiB since the allocator's caches are modelled (-5.8%; 71.3 with the 5% reserve): the
    # trace of torchtitan's code for this layout replayed through the caching-allocator model
    # reserves 78.0 GiB (tests/test_allocator_replay.py)
    pytest.param("llama3.1-70b", 71.9, ["train.cuda_graphs=false", "train.global_batch_size=512", "parallelism.dp=32",
                                        "parallelism.tp=8",
                                        "parallelism.pp=1", "parallelism.micro_batch_size=16",
                                        "parallelism.recompute=full"], id="70b-fsdp-tp-full",
                 marks=pytest.mark.xfail(strict=True, reason=XFAIL_70B)),
    pytest.param("llama3.1-405b", 82.5, ["train.global_batch_size=256", "parallelism.dp=8", "parallelism.tp=8",
                                         "parallelism.pp=8", "parallelism.micro_batch_size=1",
                                         "parallelism.recompute=full", "parallelism.virtual_stages=1"],  # 1F1B
                 id="405b-fsdp-tp-pp-full",
                 marks=pytest.mark.xfail(strict=True, reason=XFAIL_405B)),
]


@pytest.mark.parametrize(("model", "published_gib", "layout"), PUBLISHED)
def test_published_peak_within_10_percent(model, published_gib, layout):
    assert predicted_reserved_gib(model, layout) == pytest.approx(published_gib, rel=0.10)


def test_the_december_2024_trainer_compiled():
    """Table 1's compiled run: "FSDP + torch.compile | 6,667 | 77.0" (the same layout as the 8B
    row above: 8 GPUs, local batch 2, selective AC, bf16). jobctl's model of that program, the
    trainer of December 2024 (the whole logits' loss at once, no CUDA graph: the program the
    allocator replay checks, tests/test_allocator_replay.py), with its blocks compiled: the
    compiled set measured on torchtitan's own block (tests/test_compiled_activations.py)."""
    import sys
    bench = str(Path(__file__).resolve().parent.parent / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import trace_memory
    eager = trace_memory.modelled("8B", 2, "sac", 8192, 32, 8, loss="ce")["reserved"] / GIB
    compiled = trace_memory.modelled("8B", 2, "sac", 8192, 32, 8, loss="ce", compile=True)["reserved"] / GIB
    assert compiled == pytest.approx(77.0, rel=0.10)
    # compiling keeps less (published: 82.4 -> 77.0 GiB); what jobctl takes off is w2's output
    # under op-level selective AC, 2·s·b·h = 2 x 8192 x 2 x 4096 B per block, 32 blocks = 4 GiB
    assert eager - compiled == pytest.approx(2 * 8192 * 2 * 4096 * 32 / GIB, rel=0.01)


# --- Megatron-LM's functional tests (issue 14: "Megatron-LM's functional-test memory figures") ---
# Source: benchmarks/data/megatron_functional_memory.yaml, read from NVIDIA/Megatron-LM
# tests/functional_tests/test_cases/gpt/<case>/ (model_config.yaml and golden_values_*.json; each
# entry names the file and the commit it was read at). "mem-max-allocated-bytes" is
# torch.cuda.memory_stats' peak allocated bytes on the last global rank; the comparison is with
# jobctl's tensor terms on the last pipeline stage (jobctl_measure/megatron_functional.py builds
# both; benchmarks/megatron_memory.py prints them).
MEGATRON_DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "megatron_functional_memory.yaml"
MEGATRON_XFAIL = {
    ("gpt3_mcore_te_tp2_pp2_cp2", "h100"):
        "measured 2026-11-26: -13%; the A100 golden file of the same configuration is 9% lower than this "
        "H100 one and is predicted within 5%: the two goldens disagree by nearly the tolerance",
}
# The two cross_entropy_loss_fusion rows (-29% / -26% while Megatron's fused loss was counted as the
# in-place one) pass since its bytes per logit were measured on Megatron-Core's own compiled
# functions (benchmarks/megatron_cross_entropy.py): -6% / -3%.


def _megatron_rows():
    rows = []
    for e in mf.load(MEGATRON_DATA):
        key = (e["case"], e["gpu"])
        marks = [pytest.mark.xfail(strict=True, reason=MEGATRON_XFAIL[key])] if key in MEGATRON_XFAIL else []
        rows.append(pytest.param(e, id=f"{e['case'].replace('gpt3_mcore_', '').replace('gpt3_', '')}-{e['gpu']}",
                                 marks=marks))
    return rows


@pytest.mark.parametrize("entry", _megatron_rows())
def test_megatron_functional_test_peak_within_10_percent(entry):
    row = mf.compare(entry)
    assert "skipped" not in row, row.get("skipped")
    published = mf.last_logged(entry["mem_max_allocated_bytes"])  # the golden file's last logged step
    assert row["peak_modelled"] == pytest.approx(published, rel=0.10), row["layout"]
