"""The trace as a test oracle (issue 14): torchtitan's own Llama 3 code, parallelised by its own
functions on a fake process group, traced on fake tensors (benchmarks/trace_memory.py), against
jobctl's memory model for the same layout.

Shortened to two blocks so that it runs in seconds; the sequence stays at 8192 so that the
logits and activations dominate as they do at full size (the full-size tables are in
docs/memory-accuracy.md). The expected values are the trace's own measurements: nothing here
is copied from the model."""

import json

import pytest
from jobctl_run import benchmark, need_package


def trace(*args) -> list[dict]:
    need_package("torchtitan")
    return json.loads(benchmark("trace_memory.py", "--layers", "2", "--json", *args, timeout=600))["layouts"]


_TRACED: dict[tuple, dict] = {}


def traced(layout: str, *args: str, siblings: tuple[str, ...]) -> dict:
    """One layout's trace. A test's parametrized layouts (`siblings`) are traced together, in one
    run of the benchmark (its --layouts takes several, each built and traced afresh), so that
    torch and torchtitan start once for them; each test still checks only its own."""
    key = (args, siblings)
    if key not in _TRACED:
        _TRACED[key] = {out["name"]: out for out in trace(*args, "--layouts", *siblings)}
    return _TRACED[key][layout]


def rows(layout: dict) -> dict:
    return {r["group"].split(",")[0]: r for r in layout["rows"]}


def check(layout: dict, upper: float = 1.07):
    r = rows(layout)
    # torchtitan without PP: traced with the registry configs' chunked loss, as jobctl models it
    chunked = any(t["name"] == "chunked loss copies" for t in layout["modelled"]["terms"])
    for g in ("weights", "grads", "optimizer"):  # byte counts of the sharded states
        assert r[g]["modelled"] == pytest.approx(r[g]["traced_max"], rel=1e-3), g
    # what backward keeps, each block and all of it with the logits
    assert r["per block"]["modelled"] == pytest.approx(r["per block"]["traced_max"], rel=0.01)
    # the peak: FSDP2's gradients and the activations are never held together (the model takes
    # the larger phase); RoPE buffers (a few MiB here) are the only tensors it does not count
    total = r["total (tensors)"]
    if chunked:
        # torchtitan's chunked loss makes the logits small, so the end of backward (gradients and
        # FSDP's gathered buffers) can be the peak, where the buffers term is an upper bound (two
        # units in 16-bit and the largest's gradient in 16 and 32 bits: +25% of that term in these
        # traces): the total may be that much high, not more than 2% low. The tracker files the
        # output layer's fp32 gradient sum and the chunk's logit gradients as temporaries of the
        # backward ("activations"), the model with the loss's peak: only the total is compared.
        assert 0.98 * total["traced"] <= total["modelled"] <= upper * total["traced"]
        return
    assert total["modelled"] == pytest.approx(total["traced"], rel=0.02)
    assert r["activations+logits"]["modelled"] == pytest.approx(r["activations+logits"]["traced_max"], rel=0.01)
    # gathered FSDP buffers: the model keeps two layers and the unsharded gradient of the largest
    # unit, an upper bound of what FSDP2 allocates (+17% to +25% in the full-size tables)
    b = r["buffers"]
    assert b["traced_max"] <= b["modelled"] <= 1.3 * b["traced_max"]


FSDP_8B = ("b1-none", "b1-sac", "b1-full")


@pytest.mark.parametrize("layout", FSDP_8B)
def test_torchtitan_8b_fsdp(layout):
    out = traced(layout, siblings=FSDP_8B)
    check(out)


B1 = ("b1-none", "b1-full")
B4 = ("b4-none", "b4-full")


@pytest.mark.parametrize("layout", B1)
def test_torchtitan_70b_tp8_fsdp4(layout):
    # torchtitan's TP plan: sequence-parallel norms whose gathered outputs the matmuls keep, and
    # the loss-parallel cross-entropy
    out = traced(layout, "--model", "70B", "--tp", "8", "--ranks", "32", siblings=B1)
    check(out)


@pytest.mark.parametrize("ranks", [8, 256])
def test_torchtitan_qwen3_moe_fsdp(ranks):
    """torchtitan's own Qwen3 30B-A3B MoE blocks (128 experts, top 8), FSDP2 over 8 ranks (experts
    sharded on their first dim) and over 256 (more ranks than experts: sharded on the second),
    expert parallelism 1 (the local dispatcher; the all-to-all's sizes come from the routing,
    which fake tensors do not have). Each MoE term of one block against what that block's router,
    dispatcher and grouped experts saved for backward (the issue's bar: 5% per term)."""
    # both recompute settings at 8 ranks; at 256 (the experts' second-dim sharding) one layout
    layouts = trace("--model", "30B-A3B", "--seq-len", "4096", "--ranks", str(ranks), "--layouts", "b2-none",
                    *(["b1-full"] if ranks == 8 else []))
    for out in layouts:
        # two blocks: their activations are small beside one MoE block's FSDP buffers, which the
        # model bounds from above, so the total reads high here (+18% at 8 ranks, +22% at 256;
        # +10% with 8 blocks); at full depth (48 blocks, docs/memory-accuracy.md) within 2%
        check(out, upper=1.25)
    r = {row["group"].strip(): row for row in layouts[0]["rows"]}  # without recompute: all a block keeps
    for term in ("router", "routed tokens", "expert intermediates", "attention", "norms"):
        assert r[term]["traced_max"] > 0, term
        assert r[term]["modelled"] == pytest.approx(r[term]["traced_max"], rel=0.05), term


def test_torchtitan_deepseek_v3_mla_and_shared_expert():
    """torchtitan's own DeepSeek-V3 671B, its first 8 blocks (3 dense, 5 MoE) at full width: MLA
    (FlexAttention's saved set stood in for, as CUDA keeps it), a shared expert, a sigmoid
    router over 8 expert groups, 256 experts of 2048; FSDP2 over 8 ranks, expert parallelism 1.
    Each term of the last (MoE) block within 5%, the mean block within 1%. At ep 1 one MoE block
    is 11.5B parameters, whose 16-bit gradients the tracker files as temporaries of the backward
    ("activations") and jobctl as FSDP buffers: the two groups are compared through the total."""
    (out,) = trace("--model", "671B", "--layers", "8", "--seq-len", "4096", "--layouts", "b1-none")
    r = {row["group"].strip().split(",")[0]: row for row in out["rows"]}
    for g in ("weights", "grads", "optimizer"):
        assert r[g]["modelled"] == pytest.approx(r[g]["traced_max"], rel=1e-3), g
    assert r["per block"]["modelled"] == pytest.approx(r["per block"]["traced_max"], rel=0.01)
    for term in ("router", "routed tokens", "expert intermediates", "shared expert intermediates", "mlp input",
                 "attention", "norms"):
        assert r[term]["traced_max"] > 0, term
        assert r[term]["modelled"] == pytest.approx(r[term]["traced_max"], rel=0.05), term
    # 8 of 61 blocks: the activations are small beside one MoE block's FSDP buffers, which the
    # model bounds from above (+12% here); at full depth it is within 2% (docs/memory-accuracy.md)
    total = r["total (tensors)"]
    assert total["traced"] <= total["modelled"] <= 1.2 * total["traced"]


@pytest.mark.parametrize("layout", B1)
def test_hf_llama_8b_accelerate_fsdp2(layout):
    # transformers' LlamaForCausalLM wrapped as accelerate's FSDP2 plugin wraps it, against the
    # `fsdp` framework's model (eager HF layers, SDPA with grouped K/V, root unit with both
    # embedding matrices)
    need_package("transformers")
    out = traced(layout, "--impl", "hf", siblings=B1)
    # "per block" is what a block holds right after its forward, its output included; HF's next
    # block does not keep that output (its RMSNorm saves an fp32 copy instead, counted there), so
    # the saved bytes are the traced figure less one 2·s·b·h output (b = 1, s = 8192, h = 4096)
    if layout == "b1-none":
        for r in out["rows"]:
            if r["group"].startswith("per block"):
                r["traced_max"] -= 2 * 8192 * 4096
    check(out)


# four blocks over two stages: torchtitan's split counts the embedding and the output layer as
# one layer each, so each stage holds two blocks, as jobctl's split does (then the stage's name)
PP_TRACE = ("--layers", "4", "--pp", "2", "--ranks", "4", "--stage")


def check_states_and_blocks(layout: dict):
    r = rows(layout)
    for g in ("weights", "grads", "optimizer"):
        assert r[g]["modelled"] == pytest.approx(r[g]["traced_max"], rel=1e-3), g
    assert r["per block"]["modelled"] == pytest.approx(r["per block"]["traced_max"], rel=0.01)


def check_stage(layout: dict, groups=(), rel=0.01):
    """States and blocks, the named groups' own maxima within `rel` and the total within 2%."""
    check_states_and_blocks(layout)
    r = rows(layout)
    for g in groups:
        assert r[g]["modelled"] == pytest.approx(r[g]["traced_max"], rel=rel), g
    assert r["total (tensors)"]["modelled"] == pytest.approx(r["total (tensors)"]["traced"], rel=0.02)


@pytest.mark.parametrize("layout", B4)
def test_torchtitan_8b_pp2_last_stage(layout):
    # torchtitan's pipeline_llm, 1F1B over 4 micro-batches, FSDP2 x2 under PP (the stage kept
    # unsharded, gradients accumulated unsharded in fp32). The last stage peaks at the loss: the
    # PipelineStage keeps the 16-bit logits for its backward (no `del pred` as without PP), and
    # the sharded gradients do not exist yet (they are made after the last backward)
    out = traced(layout, *PP_TRACE, "last", siblings=B4)
    check_stage(out, groups=("activations+logits",))


@pytest.mark.parametrize("layout", B4)
def test_torchtitan_8b_pp2_first_stage(layout):
    # The first stage holds two micro-batches in flight (1F1B, p = 2) and a receive buffer for
    # each micro-batch's incoming gradient, and peaks in a block's backward (its backward working
    # set is stood in for by one layer's 16-bit gradient: 0.41 of ~0.96 GiB at s = 8192)
    out = traced(layout, *PP_TRACE, "first", siblings=B4)
    check_stage(out)


def test_torchtitan_8b_pp2_first_stage_gradient_reduction():
    # At s = 2048 the first stage peaks after the schedule, when FSDP2 reduces the accumulated
    # gradients unit by unit: the root unit (the embedding) frees its 16-bit weights, copies its
    # fp32 gradient into the reduce-scatter input and receives its shard
    (out,) = trace(*PP_TRACE, "first", "--seq-len", "2048", "--layouts", "b4-full")
    check_stage(out)
    assert "Reduce Scatter" in out["traced"]["peak"] and out["traced"]["peak"]["Reduce Scatter"] > 0


@pytest.mark.parametrize("layout", B4)
def test_torchtitan_8b_pp2_interleaved_first_stage(layout):
    # torch's Interleaved1F1B with torchtitan's default two model chunks per rank (eight blocks
    # over four chunks): the first rank holds ((p - 1)·2 + (v - 1)·p + 1)/v stages' worth of
    # micro-batches, the formula pipeline_in_flight takes from Megatron's schedule
    out = traced(layout, "--layers", "8", "--pp", "2", "--ranks", "4", "--schedule", "Interleaved1F1B", siblings=B4)
    r = rows(out)
    for g in ("weights", "grads", "optimizer"):
        assert r[g]["modelled"] == pytest.approx(r[g]["traced_max"], rel=1e-3), g
    assert r["total (tensors)"]["modelled"] == pytest.approx(r["total (tensors)"]["traced"], rel=0.02)


@pytest.mark.parametrize("layout", B4)
def test_torchtitan_8b_pp3_middle_stage(layout):
    # six blocks over three stages: torchtitan's split gives the middle stage three (the
    # embedding and the output layer count as one each), which holds p - 1 = 2 micro-batches
    out = traced(layout, "--layers", "6", "--pp", "3", "--ranks", "6", "--stage", "middle", siblings=B4)
    check_stage(out)
    assert len(out["traced"]["per_block_activation"]) == 3


def test_torchtitan_70b_tp8_pp2_last_stage():
    # under TP the stages exchange sequence-sharded DTensors, and the loss is torchtitan's loss
    # parallel (16 B per local logit) on logits the pipeline stage keeps (+2 B): 131M local logits
    # at s = 8192, V / 8 = 16032, so without the +2 B the model would be 0.25 GiB (~10%) short here
    (out,) = trace("--model", "70B", "--layers", "4", "--tp", "8", "--pp", "2", "--ranks", "32",
                   "--stage", "last", "--layouts", "b4-full")
    check_stage(out, groups=("activations+logits",), rel=0.03)
