"""Megatron-Core's own cross-entropy losses, measured on the CPU (benchmarks/megatron_cross_entropy.py),
against jobctl's bytes per logit for Megatron (issue 14: "Megatron's fused cross-entropy").

The expected values are the measurement's: Megatron-Core's vocab_parallel_cross_entropy and its
fused_vocab_parallel_cross_entropy (compiled by torch.compile, as megatron.core.jit does on
torch >= 2.2) run on bf16 logits, with every CPU allocation recorded by torch.profiler."""

import json

import pytest
from jobctl_run import benchmark, need_compiler, need_package


def test_megatron_losses_hold_what_the_model_counts():
    need_package("megatron")
    need_compiler("Megatron's fused loss")
    out = json.loads(benchmark("megatron_cross_entropy.py", "--json", timeout=900))
    rows = {r["fused"]: r for r in out["rows"]}
    assert out["jit_fuser"] == "compile"  # the fused steps ran compiled, as on a GPU with torch >= 2.2
    # the default loss works in place on one fp32 copy: 2 B logits + 4 B in forward, the kept 4 B
    # softmax + the 2 B gradient in backward
    assert rows[False]["peak"] == pytest.approx(rows[False]["modelled"], abs=0.1)
    # the fused loss, compiled, makes the gradient out of place: an fp32 buffer next to the kept
    # softmax, then its bf16 cast
    assert rows[True]["peak"] == pytest.approx(rows[True]["modelled"], abs=0.1)
    assert rows[True]["peak"] > rows[False]["peak"] + 3
