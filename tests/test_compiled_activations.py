"""torch.compile's effect on what a torchtitan block keeps for backward (issue 29), measured on
torchtitan 0.3.0's own blocks (benchmarks/compiled_activations.py; its docstring says how).

Expected values are the measurement's: benchmarks/data/compiled_activations.json holds the saved
bytes of 20 runs (two block sizes; recompute none or torchtitan's op-level selective AC; 16-bit,
torchao's row-wise Float8, Qwen3's mixture-of-experts block or DeepSeek-V3's MLA block; eager or
compiled) and of Llama 3 8B's block on rank 0 of TP 2 (16-bit and Float8, eager and compiled,
and compiled with op-level selective AC) and TP 4 and TP 2 x FSDP 2 (Float8 compiled), as the
benchmark recorded them; one case is measured again here."""

import json
from pathlib import Path

import pytest
from jobctl_run import benchmark, need_compiler, need_package

ROOT = Path(__file__).resolve().parent.parent
DATA = json.loads((ROOT / "benchmarks" / "data" / "compiled_activations.json").read_text())


def _modelled(case: str, shape: str) -> float:
    import sys
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import compiled_activations
    if shape.startswith("8b-tp"):
        tp, precision, mode = case.split("-")[:3]  # FSDP (a fourth part) shards no activation
        return compiled_activations.modelled_tp(mode, int(tp[2:]), precision=precision,
                                                ac="sac" if case.endswith("-sac") else "none")
    return compiled_activations.modelled(case, compiled_activations.SHAPES[shape])[0]


@pytest.mark.parametrize("row", DATA["rows"], ids=[f"{r['shape']}-{r['case']}" for r in DATA["rows"]])
def test_the_model_holds_what_the_block_saved(row):
    assert _modelled(row["case"], row["shape"]) == pytest.approx(row["measured_bytes"], rel=0.01)


def test_compiling_saves_what_the_measurement_says():
    """The measured differences, in units the formulas use (shape a: h 512, f 1536 = 3h, a 8,
    g 2, s 384, b 2): compiled in 16-bit, one of SwiGLU's four sb·f tensors goes (2·sbf = 6·sbh);
    with Float8 two of them (SiLU, the product) and two sb·h ones (the norm outputs): 4·sbf + 4·sbh
    = 16·sbh;
    under selective AC, w2's output (2·sbh), which no backward reads."""
    got = {r["case"]: r["measured_bytes"] for r in DATA["rows"] if r["shape"] == "a"}
    sbh = 384 * 2 * 512
    assert got["none-bf16-eager"] - got["none-bf16-compiled"] == 6 * sbh
    assert got["none-fp8-eager"] == got["none-bf16-eager"]  # eager Float8Linear saves the 16-bit operands
    assert got["none-fp8-eager"] - got["none-fp8-compiled"] == 16 * sbh
    # eager selective AC (tests/test_memory_model.py, traced): block input, wqkv, attention output
    # and lse, w1, w2 = 2 + 3 + 2 + 4·a·s·b/(s·b·h) + 6 + 2 sbh; compiled, all but w2
    eager_sac = (2 + 3 + 2 + 6 + 2) * sbh + 4 * 8 * 384 * 2
    assert got["sac-bf16-compiled"] == eager_sac - 2 * sbh


def test_compiling_under_tensor_parallelism_saves_what_the_measurement_says():
    """8B's block on TP 2's rank 0 (s 256, b 1, f/t = 7,168): compiled, SiLU's output goes as
    without TP (256 x 7,168 x 2 B); both keep one whole-sequence copy of the gathered MLP input,
    which w1 and w3 share (the first measurement counted it twice: one AsyncCollectiveTensor
    wrapper per use, each with a storage object of its own)."""
    got = {r["case"]: r["measured_bytes"] for r in DATA["rows"] if r["shape"] == "8b-tp2"}
    assert got["tp2-bf16-eager"] - got["tp2-bf16-compiled"] == 256 * 7168 * 2


def test_compiled_selective_ac_under_tensor_parallelism_keeps_one_reduce_scatter_output():
    """8B's block on TP 2's rank 0 (s 256, b 1, h 4,096, f/t 7,168, 16 of 32 heads, 8 KV heads)
    under torchtitan's op-level SAC, compiled: the block input's sequence shard (128 x 4,096 x 2),
    wqkv's output (256 x (4,096 + 2 x 1,024)/2 x 2), the attention output (256 x 2,048 x 2) and
    its fp32 log-sum-exp (16 heads x 256 x 4), w1's output (256 x 7,168 x 2) and wo's
    reduce-scatter output (128 x 4,096 x 2), which recomputing the FFN norm's input reads. Eager
    SAC also keeps w2's partial sum and w2's reduce-scatter output (traced: tests/test_memory_model.py);
    compiled, nothing reads them. Under Float8 the weight casts are not kept (the policy
    recomputes them): 50,176 B more than BF16, three fp32 vectors of h and one of s by size."""
    got = {r["case"]: r["measured_bytes"] for r in DATA["rows"] if r["shape"] == "8b-tp2"}
    kept = 128 * 4096 * 2 + 256 * 3072 * 2 + 256 * 2048 * 2 + 16 * 256 * 4 + 256 * 7168 * 2 + 128 * 4096 * 2
    assert got["tp2-bf16-compiled-sac"] == kept
    assert got["tp2-fp8-compiled-sac"] - got["tp2-bf16-compiled-sac"] == 3 * 4096 * 4 + 256 * 4


def test_compiled_float8_under_tensor_parallelism_keeps_fp8_weights():
    """8B's block on TP 2's and TP 4's rank 0 with torchtitan's row-wise Float8 (s 256, b 1).
    Eager, Float8Linear saves the 16-bit operands: what BF16 keeps. Compiled, against compiled
    BF16 at TP 2: the two all-gathered norm outputs are kept as FP8 casts (256 x 4,096 x 1 B
    each instead of x 2 B), SwiGLU's product is recomputed (256 x 7,168 x 2 B), and the FP8
    casts of wo's, w1's, w2's and w3's shards are kept: 4,096 x 2,048 + 3 x 4,096 x 7,168 B at
    TP 2, half of it at TP 4, with their scales (3 fp32 and 2 bf16 vectors of 4,096, one bf16
    of f/t)."""
    got = {r["case"]: r["measured_bytes"] for r in DATA["rows"] if r["shape"].startswith("8b-tp")}
    assert got["tp2-fp8-eager"] == got["tp2-bf16-eager"]
    # torchtitan's own parallelize_llama over TP 2 x FSDP 2: FSDP2 shards parameters, and the
    # unsharded ones it gathers are not what the block saves: the same set
    assert got["tp2-fp8-compiled-fsdp2"] == got["tp2-fp8-compiled"]
    weights2 = 4096 * 2048 + 3 * 4096 * 7168
    scales2 = 3 * 4096 * 4 + 2 * 4096 * 2 + 7168 * 2
    assert got["tp2-fp8-compiled"] - got["tp2-bf16-compiled"] == \
        weights2 + scales2 - 2 * 256 * 4096 - 256 * 7168 * 2
    # TP 4: every per-rank tensor but the two gathered norm outputs and the scales of h halves
    weights4, scales4 = weights2 // 2, 3 * 4096 * 4 + 2 * 4096 * 2 + 3584 * 2
    rest2 = got["tp2-fp8-compiled"] - weights2 - scales2 - 2 * 256 * 4096
    assert got["tp4-fp8-compiled"] == weights4 + scales4 + 2 * 256 * 4096 + rest2 // 2


def test_compiling_a_mixture_of_experts_saves_what_the_measurement_says():
    """Shape a's Qwen3 MoE block: 8 experts of f/4 = 384, top 2, so 2·s·b = 1,536 routed copies;
    heads of 48 (a·d = 384, not h = 512). Compiled, one of each expert's four 16-bit intermediates
    goes (1,536 x 384 x 2 B), the combine keeps the 16-bit expert output instead of its fp32 cast
    (1,536 x 512 x 2 B less) and drops the sorted fp32 score (1,536 x 4 B) and the router's top-k
    scores (s·b x k x 2 B); the MoE's output is kept (s·b x h x 2 B more: h wide, not a·d)."""
    got = {r["case"]: r["measured_bytes"] for r in DATA["rows"] if r["shape"] == "a"}
    copies, sb = 2 * 384 * 2, 384 * 2
    less = copies * 384 * 2 + copies * 512 * 2 + copies * 4 + sb * 2 * 2
    assert got["none-moe-eager"] - got["none-moe-compiled"] == less - sb * 512 * 2


def test_compiling_deepseek_v3s_block_saves_what_the_measurement_says():
    """Shape a's DeepSeek-V3 block (MLA; 8 routed experts of 384 and one shared, top 2; sigmoid
    router over 4 groups keeping 2). Compiled, the MLA attention keeps what eager keeps; the MoE
    changes as Qwen3's (one of four 16-bit intermediates per routed copy, the fp32 combine copy
    becomes 16-bit, the sorted score goes, the MoE output is kept), the shared expert drops its
    SiLU output (s·b x 384 x 2 B) and the group-limited router what it computed per token: each
    group's top-2 indices (4 x 2 x 8 B), the group mask (4 B), the kept groups' ids (2 x 8 B) and
    one fp32 per token (4 B)."""
    got = {r["case"]: r["measured_bytes"] for r in DATA["rows"] if r["shape"] == "a"}
    copies, sb = 2 * 384 * 2, 384 * 2
    routed = copies * 384 * 2 + copies * 512 * 2 + copies * 4
    shared = sb * 384 * 2
    router = sb * (4 * 2 * 8 + 4 + 2 * 8 + 4)
    assert got["none-mla-eager"] - got["none-mla-compiled"] == routed + shared + router - sb * 512 * 2


def test_the_measurement_reproduces():
    """One case measured again, compiled from scratch as on a user's GPU node (10-30 s of CPU)."""
    need_package("torchtitan")
    need_compiler("torchtitan's block")
    out = json.loads(benchmark("compiled_activations.py", "--cases", "none-fp8-compiled", "--shapes", "a", "--json"))
    recorded = next(r for r in DATA["rows"] if r["case"] == "none-fp8-compiled" and r["shape"] == "a")
    assert out[0]["measured_bytes"] == recorded["measured_bytes"]
    assert out[0]["modelled_bytes"] == pytest.approx(out[0]["measured_bytes"], rel=0.01)
