"""Megatron-LM's own functional tests' GPU memory as jobctl Workloads and Plans (issue 14).

The data (benchmarks/data/megatron_functional_memory.yaml in the jobctl repository) was read from
NVIDIA/Megatron-LM tests/functional_tests/test_cases/gpt/<case>/ (model_config.yaml: the run's
arguments; golden_values_*.json: "mem-allocated-bytes" and "mem-max-allocated-bytes"), with the
file header saying how each number was read. Megatron writes them from the last global rank (the
last pipeline stage) after the optimizer step: torch.cuda.memory_stats' allocated bytes now
(resident: weights, gradient buffer, optimizer states) and at their peak since start. These are
*allocated* bytes, so jobctl's tensor terms are compared (its total minus the CUDA context, NCCL
buffers and allocator reserve, which the allocator's allocated count never holds). The last
logged step is used (step 1's peak comes before the optimizer states exist).

Each run becomes a jobctl Workload (framework megatron, GPT family: Megatron's defaults are
LayerNorm, GELU MLP of 4h, learned positions, biases, dropout 0.1, tied embeddings) and a Plan on
8 GPUs (dp = 8 / (tp·pp·cp)); the model's last pipeline stage is the one compared.
benchmarks/megatron_memory.py prints the table; tests/test_published_peaks.py holds each row to 10%.
"""

from __future__ import annotations

import yaml

from jobctl import frameworks
from jobctl.planner.memory import Workload, estimate_stage
from jobctl.planner.models import ModelSpec
from jobctl.planner.plan import Plan

GIB = 1 << 30
GPUS = 8


class Unsupported(Exception):
    """A run whose arguments the conversion does not model (it says which)."""


def load(path) -> list[dict]:
    """The entries of a megatron_functional_memory.yaml (benchmarks/data/ in the jobctl repository)."""
    with open(path) as f:
        return yaml.safe_load(f)


def last_logged(series: dict) -> float:
    """The value at the last logged step of a golden file's {step: value} series (step 1's peak
    comes before the optimizer states exist)."""
    return float(series[max(series, key=int)])


def workload_and_plan(entry: dict):
    """jobctl's Workload and Plan for one functional-test run, from its arguments."""
    a = entry["args"]

    def arg(name, default=None):
        return a.get("--" + name, default)

    for flag in ("fp8-format", "fp16", "num-experts", "moe-router-topk"):
        if arg(flag):
            raise Unsupported(f"--{flag}")
    if arg("cross-entropy-loss-fusion") and arg("cross-entropy-fusion-impl", "native") != "native":
        raise Unsupported("--cross-entropy-fusion-impl te (Transformer Engine's loss)")
    h = int(arg("hidden-size"))
    heads = int(arg("num-attention-heads"))
    kv = int(arg("num-query-groups", heads)) if arg("group-query-attention") else heads
    swiglu = bool(arg("swiglu"))
    # Megatron: ffn_hidden_size defaults to 4h, and to int(4h·2/3) rounded up to 64 with
    # --swiglu (megatron/training/arguments.py)
    ffn = int(arg("ffn-hidden-size", 0)) or (((int(4 * h * 2 / 3) + 63) // 64) * 64 if swiglu else 4 * h)
    rope = arg("position-embedding-type", "learned_absolute") == "rope"
    rms = arg("normalization", "LayerNorm") == "RMSNorm"
    # Llama family only when all three Llama choices are made; mixed runs count as GPT
    family = "llama" if (swiglu and rms and rope) else "gpt"
    vocab = arg("vocab-size")
    if vocab is None:
        vocab = 50257  # GPT-2 BPE (the vocab file the tests name; pretrain_gpt.py's default tokenizer)
    dropout = float(arg("hidden-dropout", 0.1))
    spec = ModelSpec(
        name=entry["case"], family=family, layers=int(arg("num-layers")), hidden=h, ffn_hidden=ffn,
        heads=heads, kv_heads=kv, vocab=int(vocab),
        tied_embeddings=not arg("untie-embeddings-and-output-weights", False),
        max_seq_len=0 if rope or family == "llama" else int(arg("max-position-embeddings", arg("seq-length"))),
        dropout=dropout if family == "gpt" else 0.0)
    tp = int(arg("tensor-model-parallel-size", 1))
    pp = int(arg("pipeline-model-parallel-size", 1))
    cp = int(arg("context-parallel-size", 1))
    dp = GPUS // (tp * pp * cp)
    mb, gbs = int(arg("micro-batch-size")), int(arg("global-batch-size"))
    layers = spec.layers
    virtual = 1
    if arg("num-layers-per-virtual-pipeline-stage"):
        virtual = layers // pp // int(arg("num-layers-per-virtual-pipeline-stage"))
    recompute = "none"
    if arg("recompute-granularity") == "full":
        if arg("recompute-method", "uniform") != "uniform" or int(arg("recompute-num-layers", 1)) != 1:
            raise Unsupported("full recompute other than uniform, 1 layer per checkpoint")
        recompute = "full"
    elif arg("recompute-granularity") == "selective":
        recompute = "selective"
    # The attention kernel, from the arguments: Megatron's local implementation and TE's
    # "unfused" backend materialise the a·s² scores; TE's flash/fused backends (and "auto",
    # which picks one of them) keep O(s). The small runs set --attention-backend unfused.
    backend = arg("attention-backend", "auto")
    eager = arg("transformer-impl", "transformer_engine") == "local" or backend == "unfused"
    attention = "eager" if eager else "flash"
    w = Workload(spec, int(arg("seq-length")), gbs, optimizer="adamw", precision="bf16-mixed",
                 attention=attention,
                 fused_cross_entropy=bool(arg("cross-entropy-loss-fusion")),
                 framework=frameworks.get("megatron").with_caps(tp_comm_overlap=bool(arg("tp-comm-overlap"))))
    plan = Plan(nodes=1, gpus_per_node=GPUS, tp=tp, pp=pp, dp=dp, cp=cp,
                sharding="zero1" if arg("use-distributed-optimizer") else "none",
                micro_batch_size=mb, grad_accum_steps=gbs // (mb * dp), global_batch_size=gbs,
                recompute=recompute, offload="none", sequence_parallel=bool(arg("sequence-parallel")),
                virtual_stages=virtual)
    return w, plan


def compare(entry: dict) -> dict:
    """One run's published peak and resident allocated bytes beside jobctl's tensor terms for the
    last pipeline stage (Megatron logs from the last global rank), or why it was skipped."""
    row = {"case": entry["case"], "gpu": entry["gpu"], "golden": entry["golden_path"].rsplit("/", 1)[1],
           "peak_published": last_logged(entry["mem_max_allocated_bytes"]),
           "resident_published": last_logged(entry["mem_allocated_bytes"])}
    try:
        w, plan = workload_and_plan(entry)
    except Unsupported as e:
        row["skipped"] = f"not modelled: {e}"
        return row
    stage = "only" if plan.pp == 1 else "last"  # Megatron logs from the last global rank
    bd = estimate_stage(w, 80 * GIB, plan, stage)
    tensors = bd.tensor_bytes
    resident = bd.weights_bytes + bd.grads_bytes + bd.optimizer_bytes
    row.update({
        "layout": f"tp{plan.tp} pp{plan.pp}" + (f" v{plan.virtual_stages}" if plan.virtual_stages > 1 else "")
                  + (f" cp{plan.cp}" if plan.cp > 1 else "") + f" dp{plan.dp} mb{plan.micro_batch_size}"
                  + (" sp" if plan.sequence_parallel else "") + (" do" if plan.sharding == "zero1" else "")
                  + (f" rc={plan.recompute}" if plan.recompute != "none" else ""),
        "peak_modelled": tensors, "resident_modelled": resident,
        "peak_diff": (tensors - row["peak_published"]) / row["peak_published"],
        "resident_diff": (resident - row["resident_published"]) / row["resident_published"],
        "terms": {t.name: t.bytes for t in bd.terms},
    })
    return row
