"""The quick memory calculator behind `jobctl memory`: states per GPU from a parameter count.

It answers the question the memory guides answer by hand, with the same model as the
planner (planner/memory.py), and says which rules of thumb hold for the chosen recipe.
"""

from __future__ import annotations

from jobctl.errors import UsageError
from jobctl.planner.catalog import GIB, unknown_message
from jobctl.planner.memory import (
    FSDP2_ALLOCATOR_TERMS,
    Overheads,
    Workload,
    estimate,
    model_state_terms,
    optimizer_state_elements,
    state_bytes,
)
from jobctl.planner.models import PRESETS, ModelSpec
from jobctl.planner.plan import Plan

OPTIMIZERS = ("adamw", "adam8bit", "adafactor", "lion", "adam-mini", "sgd", "sgd-momentum")
PRECISIONS = ("bf16-mixed", "bf16-pure", "fp16-mixed", "fp32")
FRAMEWORKS = ("custom", "generic", "megatron", "torchtitan", "deepspeed", "fsdp")
OFFLOADS = ("none", "optimizer", "optimizer+params")
RECOMPUTES = ("none", "selective", "full")


def _choice(flag: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise UsageError(f"{flag}: " + unknown_message("value", value, list(allowed)))


def calculate(*, params=None, model_size_gb=None, model=None, gpu_memory_gb=80.0, num_gpus=1, optimizer="adamw",
              precision="bf16-mixed", zero_stage=0, framework="custom", offload="none", seq_len=None,
              micro_batch_size=1, recompute="none", suggest: bool = True) -> dict:
    """`jobctl memory`: the model states (and, with --model and --seq-len, the activations) per
    GPU, whether they fit, and what the usual rules of thumb get right or wrong here (`suggest`:
    with what would fit when it does not; the search for it asks without)."""
    asked = {"params": params, "model_size_gb": model_size_gb, "model": model, "gpu_memory_gb": gpu_memory_gb,
             "num_gpus": num_gpus, "optimizer": optimizer, "precision": precision, "zero_stage": zero_stage,
             "framework": framework, "offload": offload, "seq_len": seq_len,
             "micro_batch_size": micro_batch_size, "recompute": recompute}
    _check_choices(asked)
    notes: list[str] = []
    spec, n = _model(params, model_size_gb, model, optimizer, notes)
    sharding = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}[zero_stage]
    if offload != "none" and zero_stage == 0:
        notes.append("offload is a ZeRO feature: states are offloaded unsharded")
    plan = Plan(1, num_gpus, 1, 1, num_gpus, 1, sharding, micro_batch_size, 1, micro_batch_size * num_gpus,
                recompute, offload, False)
    w = Workload(spec, seq_len or 1, micro_batch_size * num_gpus, optimizer, precision, framework=framework,
                 overheads=Overheads())
    mem = estimate(w, int(gpu_memory_gb * GIB), plan).to_dict()
    sb = state_bytes(framework, precision, optimizer)
    if spec is _GENERIC:
        # Only the model states of n parameters: replace the fake 1-parameter model's states.
        mem = _states_only(mem, n, sb, optimizer, sharding, num_gpus, offload, precision)
    if seq_len is None:
        mem = _drop_groups(mem, ("activations", "logits"))
        notes.append("activations are not included: give --model and --seq-len (or use `jobctl plan` with a recipe)")
    per_param_opt = sb.master + (2 if optimizer in ("adamw", "adam8bit") else 1 if optimizer in ("lion", "sgd-momentum", "adam-mini") else 0) * sb.state_elem
    if optimizer in ("adamw", "adam8bit"):
        notes.append(f"{optimizer} under {precision} ({framework}) keeps {per_param_opt:g} B/parameter of optimizer state "
                     f"= {per_param_opt / 2:g}x the 16-bit model size; 'Adam needs 2x the model' holds only when "
                     "the states are kept in 16-bit with no fp32 master copy (bf16-pure)")
    total, usable = mem["total_bytes"], mem["gpu_usable_bytes"]
    fits = total <= usable
    left = usable - total
    verdict = (f"fits: {total / GIB:.2f} GiB of {usable / GIB:.2f} GiB usable, {left / GIB:.2f} GiB left for activations"
               if fits else f"does not fit: needs {total / GIB:.2f} GiB, {usable / GIB:.2f} GiB usable "
               f"({-left / GIB:.2f} GiB short)" + (f"; {_what_fits(asked)}" if suggest else ""))
    headline = (f"{n / 1e9:.2f}B parameters, {precision}, {optimizer}, ZeRO stage {zero_stage} over {num_gpus} GPU(s), "
                f"{framework}")
    return {"fits": fits, "params": n, "memory": mem, "notes": notes, "verdict": verdict, "headline": headline,
            "assumptions": {"gpu_memory_gib": gpu_memory_gb, "num_gpus": num_gpus, "optimizer": optimizer,
                            "precision": precision, "zero_stage": zero_stage, "framework": framework, "offload": offload}}


def _check_choices(a: dict) -> None:
    """Each option within its range; exactly one way of giving the model."""
    _choice("--optimizer", a["optimizer"], OPTIMIZERS)
    _choice("--precision", a["precision"], PRECISIONS)
    _choice("--framework", a["framework"], FRAMEWORKS)
    _choice("--offload", a["offload"], OFFLOADS)
    _choice("--recompute", a["recompute"], RECOMPUTES)
    if a["zero_stage"] not in (0, 1, 2, 3):
        raise UsageError(f"--zero-stage: expected 0, 1, 2 or 3, got {a['zero_stage']}")
    if a["num_gpus"] < 1 or a["num_gpus"] > 1 << 20:
        raise UsageError(f"--num-gpus: expected a positive number of GPUs, got {a['num_gpus']}")
    if not 0 < a["gpu_memory_gb"] <= 4096:
        raise UsageError(f"--gpu-memory-gb: expected a size in GB between 0 and 4096, got {a['gpu_memory_gb']}")
    if len([x for x in (a["params"], a["model_size_gb"], a["model"]) if x is not None]) != 1:
        raise UsageError("give exactly one of --params, --model-size-gb or --model",
                         hint="e.g. jobctl memory --model-size-gb 14 --gpu-memory-gb 80")
    seq_len, mbs = a["seq_len"], a["micro_batch_size"]
    if seq_len is not None and not 0 < seq_len <= 16 * 2**20:
        raise UsageError(f"--seq-len: expected a positive sequence length up to {16 * 2**20}, got {seq_len}")
    if not 0 < mbs <= 2**20:
        raise UsageError(f"--micro-batch-size: expected a positive number of sequences up to {2**20}, got {mbs}")
    if seq_len is not None and a["model"] is None:
        raise UsageError("--seq-len needs --model (activations depend on the architecture)")
    if seq_len is not None and a["model"] in PRESETS and PRESETS[a["model"]].moe is not None:
        raise UsageError(f"--seq-len: {a['model']}'s routed tokens depend on how its experts are split (expert "
                         "parallelism), which this calculator does not take",
                         hint=f"jobctl memory --model {a['model']} (its model states), or plan it: "
                              f"jobctl plan recipes/qwen3-30b-a3b.yaml model={a['model']} --cluster h100")


# n parameters as one layer of vectors: their states per parameter do not depend on shapes
_GENERIC = ModelSpec("params", "llama", 1, 1, 1, 1, 1, 1)


def _model(params, model_size_gb, model, optimizer: str, notes: list[str]) -> tuple[ModelSpec, int]:
    """The model asked for and its parameter count: a preset, or n parameters as one layer of
    vectors (their states per parameter do not depend on shapes)."""
    if model is not None:
        if model not in PRESETS:
            raise UsageError("--model: " + unknown_message("model preset", model, sorted(PRESETS)))
        spec = PRESETS[model]
        n = spec.params()
        notes.append(f"{model} has {n:,} parameters: {n * 2 / 1e9:.2f} GB in 16-bit ({n * 2 / GIB:.2f} GiB)")
        if spec.moe is not None or spec.mla is not None:
            # its states are per parameter; its activations (routed tokens) are not modelled yet
            if optimizer == "adafactor":
                raise UsageError(f"--optimizer adafactor: its state depends on the matrix shapes, which jobctl does "
                                 f"not list for {model}'s experts yet", hint=f"jobctl memory --model {model}")
            notes.append(f"{model} is a mixture of experts: {spec.active_params():,} parameters active per token; "
                         "model states only, every expert on every GPU (no expert parallelism)")
            return _GENERIC, n
        return spec, n
    if params is not None:
        if not 0 < params < 1e14:
            raise UsageError(f"--params: expected a parameter count such as 7.5e9, got {params:g}")
        n = int(params)
    else:
        if not 0 < model_size_gb < 1e6:
            raise UsageError(f"--model-size-gb: expected a positive size in GB, got {model_size_gb:g}")
        n = int(model_size_gb * 1e9 / 2)
        notes.append(f"--model-size-gb {model_size_gb:g} read as 16-bit weights: {n / 1e9:.2f}e9 parameters "
                     "(an 8B Llama is 16 GB in bf16, not 14)")
    if optimizer == "adafactor":
        raise UsageError("--optimizer adafactor: its state depends on the matrix shapes",
                         hint="give --model PRESET instead of a parameter count")
    return _GENERIC, n


def _what_fits(asked: dict) -> str:
    """The least change to what was asked that fits, found by asking again: a higher ZeRO stage
    on the same GPUs (the lowest that fits: ZeRO-1 before ZeRO-3, which also gathers weights),
    then optimizer offload, then ZeRO-3 over more GPUs (the fewest, by doubling)."""
    def fits(**change) -> float | None:
        r = calculate(**{**asked, **change}, suggest=False)  # one level: each answer is a plain verdict
        m = r["memory"]
        return m["total_bytes"] / GIB if r["fits"] else None

    for stage in range(asked["zero_stage"] + 1, 4):
        if (need := fits(zero_stage=stage)) is not None:
            return f"--zero-stage {stage} fits on the same {asked['num_gpus']} GPU(s) ({need:.2f} GiB each)"
    if asked["offload"] == "none" and (need := fits(zero_stage=max(1, asked["zero_stage"]), offload="optimizer")):
        return (f"--zero-stage {max(1, asked['zero_stage'])} --offload optimizer fits ({need:.2f} GiB per GPU, "
                "the optimizer in host memory)")
    gpus = asked["num_gpus"] * 2
    while gpus <= 1 << 14:
        if (need := fits(zero_stage=3, num_gpus=gpus)) is not None:
            return f"--zero-stage 3 over {gpus} GPUs fits ({need:.2f} GiB each); or LoRA"
        gpus *= 2
    return "no ZeRO stage, offload or GPU count fits this; use LoRA/QLoRA or GPUs with more memory"


def _states_only(mem: dict, n: int, sb, optimizer: str, sharding: str, num_gpus: int, offload: str, precision: str) -> dict:
    """Replace the placeholder model's states with those of n parameters (same rules as the planner)."""

    state_elems = optimizer_state_elements(optimizer, [(n, 1, 1)])
    compute_b = 4 if precision == "fp32" else 2
    new = model_state_terms(n, state_elems, sb, optimizer, sharding, num_gpus, offload, compute_b)
    host = sum(t.bytes for t in new if t.group == "host")
    # the placeholder's FSDP2 allocator terms follow its shapes and phases: without activations the
    # peak is the end of backward (the gradients in use); the all-gather buffers need the layers
    keep = [t for t in mem["terms"] if t["group"] not in ("weights", "grads", "optimizer", "buffers")
            and t["name"] not in FSDP2_ALLOCATOR_TERMS]
    terms = [{"name": t.name, "group": t.group, "bytes": int(t.bytes), "formula": t.formula} for t in new if t.group != "host"]
    if sharding == "zero3":
        terms.append({"name": "gathered weights", "group": "buffers", "bytes": 0,
                      "formula": "unknown without the architecture (give --model)"})
    if any(t["name"] in FSDP2_ALLOCATOR_TERMS for t in mem["terms"]):
        terms.append({"name": "cached all-gather buffers", "group": "overhead", "bytes": 0,
                      "formula": "unknown without the architecture (give --model)"})
    out = dict(mem)
    out["terms"] = terms + keep
    out["host_bytes_per_node"] = int(host * num_gpus)
    return _retotal(out)


# FSDP2's allocator terms that follow from the activation phase (planner/memory.py
# _fsdp2_allocator_terms): without activations the peak is the end of backward, where the
# gradients are in use; only the all-gather buffers' cache is left
_FOLLOW_ACTIVATIONS = tuple(n for n in FSDP2_ALLOCATOR_TERMS if n != "cached all-gather buffers")


def _drop_groups(mem: dict, groups: tuple) -> dict:
    out = dict(mem)
    dropped = set(groups)
    out["terms"] = [t for t in mem["terms"] if t["group"] not in dropped
                    and not ({"activations", "logits"} & dropped and t["name"] in _FOLLOW_ACTIVATIONS)]
    for g in groups:
        out[f"{g}_bytes"] = 0
    return _retotal(out)


def _retotal(mem: dict) -> dict:
    groups = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "overlap", "overhead")
    trans = sum(t["bytes"] for t in mem["terms"] if t["group"] in ("activations", "logits", "buffers"))

    for t in mem["terms"]:
        if t["name"] == "allocator reserve":  # a share of the transient tensors, which changed
            t["bytes"] = int(trans * Overheads().reserve_fraction)
    for g in groups:
        mem[f"{g}_bytes"] = int(sum(t["bytes"] for t in mem["terms"] if t["group"] == g))
    mem["total_bytes"] = int(sum(mem[f"{g}_bytes"] for g in groups))
    return mem
