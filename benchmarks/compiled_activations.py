#!/usr/bin/env python
"""What one torchtitan block keeps for its backward, eager and under torch.compile, measured
against jobctl's activation terms (issue 29: "torch.compile ... with its memory effect").

What it does, per case (recompute none or torchtitan's op-level selective AC; 16-bit,
torchao's row-wise Float8, or a mixture-of-experts block in 16-bit; eager or compiled):
  1. builds one block with torchtitan 0.3.0's own builder (models/llama3 _build_llama3_layers:
     fused wqkv, GQA, RMSNorm, SwiGLU; models/qwen3 _build_qwen3_moe_layers; or models/deepseek_v3
     _build_dsv3_layers: MLA and a shared expert; the attention core swapped for its SDPA) in
     bf16 on the CPU, with small, pairwise different sizes so a tensor's shape says what it is;
     the MoE router's gate as CUDA's fp32 autocast runs it;
  2. with --fp8 converts its Linears as torchtitan's Float8 converter does (torchao
     convert_to_float8_training, recipe "rowwise"); with --ac sac wraps it with torchtitan's
     SelectiveAC (activation_checkpoint.py), whose save list is CUDA's: the CPU's SDPA kernel is
     added to it, standing in for the flash kernel the list names;
  3. compiled: block.compile(backend="inductor", fullgraph=True), as torchtitan's
     apply_compile (distributed/compile.py) does per TransformerBlock;
  4. runs forward and backward once (the compile), then once more with autograd's
     saved_tensors_hooks counting each saved storage once, leaving out the block's parameters,
     buffers and its input (the caller keeps that: jobctl counts it in the block's terms, so it
     is added back, 2·sbh). Eager CPU RMSNorm keeps two fp32 copies of its input where CUDA's
     fused kernel keeps the 16-bit input and rstd: eager runs use CUDA's set
     (trace_memory._cuda_like_rms_norm); compiled runs decompose the norm as inductor does on
     either device.
Saved tensors under compile are what AOTAutograd's partitioner chose to keep: the same graph on
CPU and CUDA, so the same choice. Its result is compared with jobctl's layer_activation_terms for
the same sizes (framework torchtitan, train.compile on or off).

Run (from the repository root; each compiled case takes 10-30 s of CPU):
  python benchmarks/compiled_activations.py             # every case, a table
  python benchmarks/compiled_activations.py --write     # and record them in
                                                        #   benchmarks/data/compiled_activations.json
  python benchmarks/compiled_activations.py --cases none-bf16-compiled --json
  python benchmarks/compiled_activations.py --tp --write  # an 8B block under TP 2, TP 4, TP 2 x FSDP 2,
                                                        #   16-bit and Float8, SAC (~15 min)
Needs torch and torchtitan (the test extra); both are imported only here."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "compiled_activations.json"
# (dim, heads, kv heads, ffn, seq, batch): b·s differs from every width, f/h and g/a differ
SHAPES = {"a": (512, 8, 2, 1536, 384, 2), "b": (640, 10, 5, 1792, 320, 3)}
# Eager selective AC is not among them: its checkpoint packs the saved tensors through saved-tensor
# hooks of its own, which hide them from these (trace_memory.py traces it with torch's memory tracker)
CASES = ["none-bf16-eager", "none-bf16-compiled", "none-fp8-eager", "none-fp8-compiled", "sac-bf16-compiled",
         "sac-fp8-compiled", "none-moe-eager", "none-moe-compiled", "none-mla-eager", "none-mla-compiled"]
# "moe": torchtitan's Qwen3 MoE block (models/qwen3 _build_qwen3_moe_layers: RMSNorm on each head's
# query and key, a softmax router over 8 experts, top 2, the standard dispatcher) of the shape's
# width and heads, experts of a quarter of its ffn; heads of 3/4 of h/a, so that a tensor a·d wide
# is told from one h wide (Qwen3's heads are wider than h/a: 30B-A3B a·d = 4,096, h = 2,048)
EXPERTS, TOP_K = 8, 2
# (tp, precision, mode, fsdp, ac) of Llama 3 8B's block on rank 0; fsdp > 1: torchtitan's own
# parallelize_llama over tp·fsdp ranks; ac "sac": torchtitan's op-level selective AC around the
# sharded block, compiled after it (parallelize_llama's order: TP, AC, compile)
TP_CASES = [(2, "bf16", "eager", 1, "none"), (2, "bf16", "compiled", 1, "none"), (2, "fp8", "eager", 1, "none"),
            (2, "fp8", "compiled", 1, "none"), (4, "fp8", "compiled", 1, "none"), (2, "fp8", "compiled", 2, "none"),
            (2, "bf16", "compiled", 1, "sac"), (2, "fp8", "compiled", 1, "sac")]


def tp_case(tp: int, precision: str, mode: str, fsdp: int, ac: str = "none") -> tuple[str, str]:
    """(shape, case) names of a TP_CASES entry."""
    shape = f"8b-tp{tp}" + (f"-fsdp{fsdp}" if fsdp > 1 else "")
    return shape, f"tp{tp}-{precision}-{mode}" + (f"-fsdp{fsdp}" if fsdp > 1 else "") + ("-sac" if ac == "sac" else "")


def _cuda_save_list_sac():
    """torchtitan's SelectiveAC with CUDA's save list: the CPU's SDPA kernel stands in for the
    flash kernel the list names."""
    import torch
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    class CudaSaveList(SelectiveAC):
        def get_save_ops(self):
            return super().get_save_ops() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    return CudaSaveList(CudaSaveList.Config())


def moe_head_dim(dim: int, heads: int) -> int:
    return dim // heads * 3 // 4


# "mla": torchtitan's DeepSeek-V3 block (models/deepseek_v3 _build_dsv3_layers: MLA with a query
# latent, one shared expert beside 8 routed ones of a quarter of the ffn, top 2, DeepSeek-V3's
# sigmoid router over 4 groups of which 2 are kept, route scale 2.5, normalised). The value heads
# are as wide as the query/key heads (48 + 16 = 64), as the CPU's flash kernel needs; CUDA's
# kernels keep the same set (q, k, v, output, log-sum-exp) at any widths.
def mla_dims(dim: int) -> dict:
    return {"q_lora_rank": dim * 7 // 16, "kv_lora_rank": dim * 5 // 16, "qk_nope_head_dim": 48,
            "qk_rope_head_dim": 16, "v_head_dim": 64}


def measure(case: str, shape: tuple) -> int:
    """Bytes the block saves for backward (its input included), one case, on the CPU."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.llama3 import _build_llama3_layers

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import trace_memory

    ac, precision, mode = case.split("-")
    dim, heads, kv, ffn, seq, batch = shape
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager_norm = RMSNorm.forward
    if mode == "eager":
        RMSNorm.forward = trace_memory._cuda_like_rms_norm()
    try:
        if precision == "moe":
            from torchtitan.models.common.rope import CosSinRoPE
            from torchtitan.models.qwen3 import _build_qwen3_moe_layers
            hd = moe_head_dim(dim, heads)
            rope = CosSinRoPE.Config(dim=hd, max_seq_len=seq, theta=1e6)
            (cfg,) = _build_qwen3_moe_layers(n_layers=1, dim=dim, n_heads=heads, n_kv_heads=kv, head_dim=hd,
                                             moe_hidden_dim=ffn // 4, num_experts=EXPERTS, top_k=TOP_K,
                                             attn_backend="flex", moe_comm_backend="standard", rope=rope)
        elif precision == "mla":
            from torchtitan.models.deepseek_v3 import _build_dsv3_layers
            x = mla_dims(dim)
            rope = ComplexRoPE.Config(dim=x["qk_rope_head_dim"], max_seq_len=seq, theta=10000.0, scaling="yarn",
                                      rope_factor=40.0, beta_fast=32.0, beta_slow=1.0, original_seq_len=4096)
            (cfg,) = _build_dsv3_layers(n_layers=1, n_dense_layers=0, dim=dim, n_heads=heads, **x, mscale=1.0,
                                        dense_hidden_dim=ffn, moe_hidden_dim=ffn // 4, num_experts=EXPERTS,
                                        num_shared_experts=1, router_top_k=TOP_K, router_score_func="sigmoid",
                                        router_num_expert_groups=4, router_num_limited_groups=2,
                                        router_route_scale=2.5, router_route_norm=True, attn_backend="flex",
                                        moe_comm_backend="standard", non_blocking_capacity_factor=None, rope=rope)
        else:
            rope = ComplexRoPE.Config(dim=dim // heads, max_seq_len=seq, theta=500000, scaling="llama")
            (cfg,) = _build_llama3_layers(n_layers=1, dim=dim, n_heads=heads, n_kv_heads=kv, hidden_dim=ffn,
                                          rope=rope, attn_backend="flex")
        cfg.attention.inner_attention = ScaledDotProductAttention.Config()
        block = cfg.build().to(torch.bfloat16)
        for p in block.parameters():
            torch.nn.init.normal_(p, std=0.02)
        if precision in ("moe", "mla"):
            # the router's gate runs under autocast to fp32: on CUDA on fp32 copies of its input and
            # weight; CPU autocast has no fp32, so the gate does what CUDA's autocast does (as
            # trace_memory._patch_router_for_cuda_autocast, set once here so that compile sees it)
            gate = block.moe.router.gate
            gate.forward = lambda inp: torch.nn.functional.linear(inp.float(), gate.weight.float())
            torch._dynamo.config.capture_scalar_outputs = True  # as torchtitan's apply_compile
        if precision == "fp8":
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            convert_to_float8_training(block, config=Float8LinearConfig.from_recipe_name("rowwise"))
        if ac == "sac":
            block = _cuda_save_list_sac()._wrap_block(block, base_fqn="layers.0")
        if mode == "compiled":
            block.compile(backend="inductor", fullgraph=True)
        x = torch.randn(batch, seq, dim, dtype=torch.bfloat16, requires_grad=True)
        skip = {StorageWeakRef(t.untyped_storage()) for t in (*block.parameters(), *block.buffers(), x)}

        def step(count: bool) -> int:
            saved: dict = {}

            def pack(t):
                ref = StorageWeakRef(t.untyped_storage())
                if count and ref not in skip:
                    saved[ref] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = block(x, None)
            out.float().sum().backward()
            return sum(saved.values())

        step(False)
        return step(True) + x.numel() * x.element_size()
    finally:
        RMSNorm.forward = eager_norm


def measure_tp(mode: str, tp: int = 2, seq: int = 256, precision: str = "bf16", fsdp: int = 1,
               ac: str = "none") -> int:
    """Bytes one torchtitan Llama 3 8B block saves on rank 0 of tensor parallelism `tp` (its own
    TP plan: sequence-parallel norms, column/row-wise linears; the partial_dtensor backend, as
    trace_memory.py runs it), real tensors over torch's fake process group (collectives move no
    data; shapes and storages are real), batch 1. `precision` fp8: torchtitan's own
    Float8LinearConverter (row-wise; the output layer left out, as its registry configs do),
    applied before the sharding configs as its model registry applies it; its check for an
    SM89 GPU is stood in for (nothing here runs an FP8 GEMM kernel: the CPU emulates it).
    `fsdp` > 1: tp·fsdp ranks, the model parallelised and compiled by torchtitan's own
    parallelize_llama (TP, then per-block compile, then FSDP2 with its bf16 mixed precision), as
    its Trainer does. `ac` "sac": torchtitan's SelectiveAC around the sharded block (its save list
    with the CPU's SDPA kernel for the flash one, as `measure`), before compile. The block's input
    is counted (it is a sequence shard); parameters (FSDP's unsharded ones included) and buffers
    are not; DTensors are counted by their local shard, a collective's output by the tensor its
    AsyncCollectiveTensor wrappers share."""
    import torch
    import torch.nn as nn
    from torch.distributed.tensor import DTensor
    from torch.multiprocessing.reductions import StorageWeakRef

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import trace_memory

    torch._dynamo.reset()
    env = trace_memory._Env(ranks=tp * fsdp, backend="partial_dtensor", cuda_rmsnorm=mode == "eager", tp=tp)
    convert = None
    if precision == "fp8":
        import torchtitan.components.quantization.float8 as tt_float8
        tt_float8.has_cuda_capability = lambda *a: True
        convert = tt_float8.Float8LinearConverter(tt_float8.Float8LinearConverter.Config(
            recipe_name="rowwise", filter_fqns=["lm_head"])).convert
    parallelism, cfg, _ = trace_memory._torchtitan_config(env, "8B", "none", seq, 1, convert=convert)
    with torch.device("meta"):
        model = cfg.build()
    if fsdp > 1:
        from torchtitan.config import CompileConfig, TrainingConfig
        from torchtitan.models.llama3 import parallelize_llama
        model = parallelize_llama(model, parallel_dims=env.parallel_dims, training=TrainingConfig(),
                                  parallelism=parallelism, compile_config=CompileConfig(enable=mode == "compiled"),
                                  ac_config=None, dump_folder="/tmp")
        model.to_empty(device="cpu")  # fp32 shards; FSDP2 gathers them in bf16
        block = model.layers["0"]
    else:
        model.parallelize(env.parallel_dims)
        block = model.layers["0"]
        if ac == "sac":
            block = _cuda_save_list_sac()._wrap_block(block, base_fqn="layers.0")
        if mode == "compiled":
            block.compile(backend="inductor", fullgraph=True)
        model.to_empty(device="cpu")
        model.to(torch.bfloat16)
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    def local(t):
        # a DTensor's shard; a collective's output comes wrapped (AsyncCollectiveTensor), one
        # wrapper per use of the same gathered tensor: the storage is the wrapped one's
        t = t._local_tensor if isinstance(t, DTensor) else t
        return t.elem if isinstance(t, AsyncCollectiveTensor) else t

    with torch.no_grad():
        for p in model.parameters():
            local(p).normal_(0, 0.02)
    inside = [False]

    class Marked(nn.Module):  # the block's own calls, without hooks inside the compiled region
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kw):
            inside[0] = True
            try:
                return self.inner(*args, **kw)
            finally:
                inside[0] = False

    model.layers["0"] = Marked(block)
    tokens = torch.randint(0, 1000, (1, seq))

    def step(count: bool) -> int:
        saved: dict = {}

        def pack(t):
            if count and inside[0]:
                # the parameters as they are now: FSDP2 swaps in the unsharded ones for forward
                skip = {StorageWeakRef(local(p).untyped_storage()) for p in (*model.parameters(), *model.buffers())}
                ref = StorageWeakRef(local(t).untyped_storage())
                if ref not in skip:
                    saved[ref] = local(t).untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(tokens)
        (out.to_local() if isinstance(out, DTensor) else out).float().sum().backward()
        return sum(saved.values())

    step(False)
    return step(True)


def modelled_tp(mode: str, tp: int = 2, seq: int = 256, precision: str = "bf16", ac: str = "none") -> float:
    """jobctl's bytes for one 8B block on a TP rank (sequence parallel), as measure_tp runs it."""
    import dataclasses

    from jobctl import frameworks
    from jobctl.planner.memory import Workload, layer_activation_terms
    from jobctl.planner.models import PRESETS
    from jobctl.planner.plan import Plan

    spec = dataclasses.replace(PRESETS["llama3.1-8b"], layers=1)
    w = Workload(spec, seq, 1, framework=frameworks.get("torchtitan"), attention="flash", compile=mode == "compiled",
                 precision="fp8" if precision == "fp8" else "bf16-mixed", fp8_recipe="rowwise", formats=("fp8",))
    plan = Plan(1, tp, tp, 1, 1, 1, "none", 1, 1, 1, "selective" if ac == "sac" else "none", "none", True)
    return sum(v for _, v, _ in layer_activation_terms(w, plan, 1))


def modelled(case: str, shape: tuple) -> tuple[float, list]:
    """jobctl's bytes for the same block (layer_activation_terms), and its terms."""
    from jobctl import frameworks
    from jobctl.planner.memory import Workload, layer_activation_terms
    from jobctl.planner.models import ModelSpec
    from jobctl.planner.moe import MLA, MoE
    from jobctl.planner.plan import Plan

    ac, precision, mode = case.split("-")
    dim, heads, kv, ffn, seq, batch = shape
    if precision == "moe":
        spec = ModelSpec("block", "llama", 1, dim, ffn, heads, kv, 2048, moe=MoE(EXPERTS, TOP_K, ffn // 4),
                         qk_norm=True, explicit_head_dim=moe_head_dim(dim, heads))
    elif precision == "mla":
        x = mla_dims(dim)
        spec = ModelSpec("block", "llama", 1, dim, ffn, heads, heads, 2048,
                         moe=MoE(EXPERTS, TOP_K, ffn // 4, shared_experts=1, score_bias=True, groups=4, groups_kept=2),
                         mla=MLA(x["q_lora_rank"], x["kv_lora_rank"], x["qk_rope_head_dim"], x["qk_nope_head_dim"],
                                 x["v_head_dim"]))
    else:
        spec = ModelSpec("block", "llama", 1, dim, ffn, heads, kv, 2048)
    w = Workload(spec, seq, batch, framework=frameworks.get("torchtitan"), attention="flash",
                 precision="fp8" if precision == "fp8" else "bf16-mixed", fp8_recipe="rowwise",
                 compile=mode == "compiled", formats=("fp8",))
    plan = Plan(1, 1, 1, 1, 1, 1, "none", batch, 1, batch, "selective" if ac == "sac" else "none", "none", False)
    terms = layer_activation_terms(w, plan, batch)
    return sum(v for _, v, _ in terms), terms


def _children_cpu() -> float:
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=CASES, choices=CASES + [tp_case(*c)[1] for c in TP_CASES],
                    help="the cases to run (with --tp: the TP cases named, e.g. tp2-bf16-compiled-sac)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tp", action="store_true", help="instead: one 8B block on rank 0 of TP 2 (sequence "
                    "parallel), eager and compiled, 16-bit and row-wise Float8, and compiled with selective AC; "
                    "compiled Float8 at TP 4 and at TP 2 x FSDP 2 (~15 min)")
    ap.add_argument("--tp-case", help=argparse.SUPPRESS)  # TP-PRECISION-MODE-FSDP-AC: one --tp case, bytes out
    ap.add_argument("--json", action="store_true", help="raw numbers (bytes)")
    ap.add_argument("--write", action="store_true", help=f"record the measurements in {DATA.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    rows = []
    if a.tp_case:  # one --tp case, in a process of its own (its process group's world is tp·fsdp)
        tp, precision, mode, fsdp, ac = a.tp_case.split("-")
        print(json.dumps(measure_tp(mode, int(tp), precision=precision, fsdp=int(fsdp), ac=ac)))
        return 0
    if a.tp:
        for tp, precision, mode, fsdp, ac in TP_CASES:
            if a.cases != CASES and tp_case(tp, precision, mode, fsdp, ac)[1] not in a.cases:
                continue
            t0 = _children_cpu()
            r = subprocess.run([sys.executable, __file__, "--tp-case", f"{tp}-{precision}-{mode}-{fsdp}-{ac}"],
                               text=True, capture_output=True, cwd=ROOT)
            if r.returncode:
                sys.stderr.write(r.stderr[-4000:])
                return r.returncode
            shape, case = tp_case(tp, precision, mode, fsdp, ac)
            rows.append({"shape": shape, "case": case,
                         "measured_bytes": json.loads(r.stdout.strip().splitlines()[-1]),
                         "modelled_bytes": modelled_tp(mode, tp, precision=precision, ac=ac), "sbh": 256 * 4096,
                         "cpu_s": round(_children_cpu() - t0, 1)})
        a.shapes = []
    for name in a.shapes:
        shape = SHAPES[name]
        dim, heads, kv, ffn, seq, batch = shape
        for case in (c for c in a.cases if c in CASES):  # the TP cases run with --tp
            t0 = time.process_time()
            got = measure(case, shape)
            model, _ = modelled(case, shape)
            rows.append({"shape": name, "case": case, "measured_bytes": got, "modelled_bytes": model,
                         "sbh": seq * batch * dim, "cpu_s": round(time.process_time() - t0, 1)})
    if a.write:
        import torch
        import torchtitan
        # the rows measured now replace their namesakes; the others are kept
        new = [{k: r[k] for k in ("shape", "case", "measured_bytes")} for r in rows]
        fresh = {(r["shape"], r["case"]) for r in new}
        kept = [r for r in json.loads(DATA.read_text())["rows"] if (r["shape"], r["case"]) not in fresh] \
            if DATA.exists() else []
        doc = {"measured_with": {"torch": torch.__version__, "torchtitan": getattr(torchtitan, "__version__", "?")},
               "shapes": {k: dict(zip(("dim", "heads", "kv_heads", "ffn", "seq", "batch"), v)) for k, v in SHAPES.items()}
               | {f"8b-tp{tp}": f"Llama 3 8B's block (h 4096, f 14336, 32 heads, 8 KV heads), seq 256, batch 1, "
                  f"TP {tp} rank 0" for tp in (2, 4)}
               | {"8b-tp2-fsdp2": "the same block on rank 0 of TP 2 x FSDP 2, parallelised and compiled by "
                  "torchtitan's parallelize_llama"}
               | {
                  "moe": f"Qwen3 MoE block: {EXPERTS} experts of ffn/4, top {TOP_K}, head_dim 3/4 of dim/heads",
                  "mla": f"DeepSeek-V3 block: q_lora_rank 7/16 and kv_lora_rank 5/16 of dim, heads of 48 + 16 "
                         f"(RoPE) for q/k and 64 for v, {EXPERTS} experts of ffn/4 and one shared, top {TOP_K}, "
                         "sigmoid router over 4 groups keeping 2"},
               "rows": kept + new}
        DATA.write_text(json.dumps(doc, indent=1) + "\n")
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("One torchtitan block's saved tensors (input included), in units of s·b·h")
    print(f"{'shape':5} {'case':22} {'measured':>9} {'modelled':>9} {'diff':>7} {'cpu s':>6}")
    for r in rows:
        diff = (r["modelled_bytes"] - r["measured_bytes"]) / r["measured_bytes"]
        print(f"{r['shape']:5} {r['case']:22} {r['measured_bytes'] / r['sbh']:9.3f} {r['modelled_bytes'] / r['sbh']:9.3f} "
              f"{diff:+7.1%} {r['cpu_s']:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
