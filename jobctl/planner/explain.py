"""Why the chosen plan won: for each dimension a user might expect to differ, the best plan
with another value and what made it lose (pure)."""

from __future__ import annotations

from dataclasses import replace

from jobctl.planner.catalog import GIB
from jobctl.planner.memory import FSDP2_ALLOCATOR_TERMS
from jobctl.planner.memory.activations import compiled_set
from jobctl.planner.memory.workload import LOW_PRECISION_SAVED_BYTES
from jobctl.planner.perf import INTRA_NODE_EFFICIENCY, NETWORK_EFFICIENCY
from jobctl.planner.search import (
    OBJECTIVES,
    SCALING_EFFICIENCY,
    THROUGHPUT_TOLERANCE,
    Candidate,
    Constraints,
    SearchResult,
    Target,
    _gpus,
    search,
)

PARTS = {
    "compute_s": "compute",
    "tp_comm_s": "tensor-parallel collectives",
    "pp_bubble_s": "pipeline bubble",
    "pp_p2p_s": "pipeline sends",
    "dp_comm_s": "exposed data-parallel communication",
    "cp_comm_s": "exposed context-parallel exchange",
    "ep_comm_s": "exposed expert-parallel all-to-alls",
    "moe_host_s": "the host launching the experts' work",
    "offload_s": "offload transfers over PCIe",
    "optimizer_s": "optimizer step",
}
DIMENSIONS = ("tp", "pp", "cp", "ep", "sharding", "recompute", "offload", "micro_batch_size", "virtual_stages")


def _metric(c: Candidate, objective: str) -> float:
    return c.tokens_per_s_per_gpu if objective == "throughput" else c.tokens_per_s


RULES = {
    "balanced": f"the fastest plan within {SCALING_EFFICIENCY:.0%} of the best tokens/s per GPU (a whole node "
                "when that is faster)",
    "throughput": f"the best tokens/s per GPU (cheapest GPU-hours), then the fewest nodes within "
                  f"{THROUGHPUT_TOLERANCE:.0%} of it",
    "time": "the fastest plan, whatever it costs in GPUs",
    "gpus": "the fewest GPUs that fit, then the fastest",
}


def _brief(c: Candidate, ref: float) -> dict:
    e = c.estimate
    return {"layout": c.plan.summary(), "gpus": c.plan.world_size, "nodes": c.plan.nodes,
            "step_time_s": e.step_time_s if e else None,
            "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu if e else None,
            "efficiency": (e.tokens_per_s_per_gpu / ref) if e and ref else None}


# Which other objectives' picks a summary shows without --explain: those its notes read, and for
# "balanced" all three (its evaluations leave them almost free). The rest, and the best tokens/s
# per GPU on the partition (which takes the "throughput" search), come with --explain.
NOTED = {"balanced": ("throughput", "time", "gpus"), "throughput": ("time", "gpus"), "time": ("gpus",),
         "gpus": ("time",)}


def objective_summary(w, t: Target, c: Constraints, result: SearchResult, steps: int | None = None,
                      every: bool = False) -> dict:
    """Which objective chose, by which rule, what it traded, and what the others would pick on
    the same partition: those NOTED for it, or with `every` all of them. The searches share the
    first one's evaluations."""
    objective = result.objective
    win = result.best
    picks = {objective: win}
    for other in OBJECTIVES:
        if other != objective and (every or other in NOTED[objective]):
            r = search(w, t, c, objective=other, steps=steps, evaluations=result.evaluations)
            picks[other] = r.best
    known = [x for x in list(picks.values()) + result.ranked if x is not None and x.estimate is not None]
    # the best tokens/s per GPU on the partition: among the plans of a "throughput" search (its
    # pick, or its ranked plans when it is the main one); unknown without one
    ref = max((x.tokens_per_s_per_gpu for x in known), default=0.0) if "throughput" in picks else None
    out = {"name": objective, "rule": RULES[objective], "scaling_efficiency": SCALING_EFFICIENCY,
           "best_tokens_per_s_per_gpu": ref, "chosen": _brief(win, ref) if win else None,
           "others": {k: _brief(v, ref) for k, v in picks.items() if k != objective and v is not None},
           "notes": []}
    if win is None or win.estimate is None:
        return out
    notes = out["notes"]
    fastest = picks.get("time")
    partition_gpus = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
    if objective == "balanced":
        if fastest is not None and fastest.estimate and fastest.plan.world_size > win.plan.world_size \
                and fastest.tokens_per_s > win.tokens_per_s * 1.005 \
                and fastest.tokens_per_s_per_gpu < ref * SCALING_EFFICIENCY:
            notes.append(f"more GPUs would not pay: the fastest plan ({_gpus(fastest.plan.world_size)}) is "
                         f"{fastest.tokens_per_s / win.tokens_per_s - 1:.0%} faster but keeps "
                         f"{fastest.tokens_per_s_per_gpu / ref:.0%} of the best tokens/s per GPU (below "
                         f"{SCALING_EFFICIENCY:.0%}); --objective time takes it")
        elif win.plan.world_size < partition_gpus:
            why = (f"the global batch ({win.plan.global_batch_size} sequences) is already split {win.plan.dp} ways"
                   if win.plan.dp * win.plan.micro_batch_size == win.plan.global_batch_size and win.plan.micro_batch_size == 1
                   else "the global batch, layers and heads leave no larger layout that pays")
            notes.append(f"uses {win.plan.world_size} of {partition_gpus} GPUs: no plan on more of them is faster ({why})")
        else:
            notes.append(f"uses all {_gpus(partition_gpus)} at {win.tokens_per_s_per_gpu / ref:.0%} of the best "
                         "tokens/s per GPU")
        if win.whole_nodes and win.tokens_per_s_per_gpu < ref * SCALING_EFFICIENCY * (1 - 1e-9):
            part = max((x for x in known if not x.whole_nodes and x.tokens_per_s_per_gpu >= ref * SCALING_EFFICIENCY
                        * (1 - 1e-9)), key=lambda x: x.tokens_per_s, default=None)
            if part is not None:
                notes.append(f"fills the node: {_gpus(part.plan.world_size)} of it would keep more tokens/s per GPU "
                             f"but leave the rest idle; the whole node is {win.tokens_per_s / part.tokens_per_s:.1f}x "
                             "as fast")
        if not win.whole_nodes:
            notes.append(f"takes {_gpus(win.plan.world_size)} of a node ({t.gpus_per_node} GPUs): filling it "
                         "would not pay; Slurm leaves the other GPUs to other jobs")
    elif objective in ("throughput", "gpus") and fastest is not None and fastest.estimate \
            and fastest.tokens_per_s > win.tokens_per_s * 1.005:
        notes.append(f"--objective time would take {_gpus(fastest.plan.world_size)} for a "
                     f"{win.estimate.step_time_s / fastest.estimate.step_time_s:.1f}x shorter step")
    fewest = picks.get("gpus")
    if objective != "gpus" and fewest is not None and fewest.plan.world_size < win.plan.world_size:
        notes.append(f"--objective gpus fits on {_gpus(fewest.plan.world_size)} "
                     f"({fewest.estimate.step_time_s / win.estimate.step_time_s:.1f}x the step)"
                     if fewest.estimate else f"--objective gpus fits on {_gpus(fewest.plan.world_size)}")
    return out


def _loss_reason(win: Candidate, alt: Candidate) -> str:
    """The part of the step whose GPU-time (seconds x GPUs) grew most, with both shares."""
    we, ae = win.estimate, alt.estimate
    ww, aw = win.plan.world_size, alt.plan.world_size

    def gpu_time(e, world, k):
        return getattr(e, k) * world

    grew = max(PARTS, key=lambda k: gpu_time(ae, aw, k) - gpu_time(we, ww, k))
    share_a = getattr(ae, grew) / ae.step_time_s
    share_w = getattr(we, grew) / we.step_time_s
    extra = (gpu_time(ae, aw, grew) - gpu_time(we, ww, grew)) / (we.step_time_s * ww)
    if aw != ww and extra < 0.01:
        # no part of the step costs more GPU-time: it is slower because it has fewer GPUs (its
        # larger layouts did not fit or were slower still)
        return (f"as fast per GPU ({alt.tokens_per_s_per_gpu:,.0f} vs {win.tokens_per_s_per_gpu:,.0f} tokens/s), "
                f"on fewer GPUs ({aw} vs {ww})")
    if grew == "pp_bubble_s":
        return (f"{PARTS[grew]} {share_a:.0%} of the step at {alt.plan.grad_accum_steps} micro-batches "
                f"(winner {share_w:.0%})")
    if grew == "compute_s":
        why = "recomputation" if alt.plan.recompute != win.plan.recompute else "smaller, less efficient matmuls"
        return f"{extra:+.0%} GPU-time in compute ({why})"
    return f"{PARTS[grew]} {share_a:.0%} of the step (winner {share_w:.0%})"


def why_lost(w, t: Target, c: Constraints, result: SearchResult, objective: str, limit: int = 6) -> list[dict]:
    """One entry per dimension: the best alternative value and why it lost (or cannot fit).

    Each is {"change", "gpus", "per_gpu", "total", "reason", "text"}: the alternative's GPU count
    and its tokens/s per GPU and in total relative to the winner's (-0.16: 16% lower), both
    always, since alternatives may run on other GPU counts; "text" says all of it in a line.
    Entries that compare nothing (a size that never fits, tp across the node boundary) have
    gpus/per_gpu/total None."""
    win = result.best
    if win is None or win.estimate is None:
        return []
    out: list[dict] = []
    others = [x for x in result.ranked if x.estimate is not None]
    n_win = win.plan.world_size
    # a knob (sharding, recompute, offload, micro-batch) on the winner's own layout: the ranked
    # plans hold each layout's fastest only, so "offload=optimizer" would otherwise be answered
    # by another layout that happens to offload, not by this one with its optimizer offloaded
    for dim in DIMENSIONS:
        if getattr(c, dim, None) is not None:
            continue  # pinned by the recipe: nothing to explain
        mine = getattr(win.plan, dim)
        alts = [x for x in others if getattr(x.plan, dim) != mine]
        if dim in KNOBS:
            alts += _same_layout(w, t, c, win, dim, objective)
        if not alts and (dim in ("tp", "pp", "cp") or (dim == "ep" and w.model.moe is not None)):
            alts = _pinned_neighbours(w, t, c, dim, mine, objective, result.evaluations)
        if not alts:
            continue
        alt = max(alts, key=lambda x: _metric(x, objective))
        if _metric(alt, objective) >= _metric(win, objective):
            continue
        per = alt.tokens_per_s_per_gpu / win.tokens_per_s_per_gpu - 1
        total = alt.estimate.tokens_per_s / win.estimate.tokens_per_s - 1
        n = alt.plan.world_size
        change = f"{dim}={getattr(alt.plan, dim)}"
        reason = _loss_reason(win, alt)
        on = f"on {_gpus(n)}" + (" (this plan: the same)" if n == n_win else f" (this plan: {n_win})")
        out.append({"change": change, "gpus": n, "per_gpu": round(per, 4), "total": round(total, 4),
                    "reason": reason,
                    "text": f"{change} {on}: tokens/s per GPU {per:+.1%}, in total {total:+.1%} — {reason}"})

    def note(change: str, reason: str) -> None:
        out.append({"change": change, "gpus": None, "per_gpu": None, "total": None, "reason": reason,
                    "text": f"{change} {reason}"})

    # (on a partition of one node, a larger tp is not slower but impossible: nothing to explain)
    if t.links is not None and t.nodes > 1 and win.plan.tp == t.gpus_per_node and w.model.heads % (2 * win.plan.tp) == 0:
        ratio = (t.links.intra_node_gbs * INTRA_NODE_EFFICIENCY) / (t.links.inter_node_gbs * NETWORK_EFFICIENCY)
        note(f"tp={2 * win.plan.tp}", f"crosses the node boundary: {ratio:.1f}x slower all-reduce "
             f"({t.links.inter_node_gbs:g} GB/s network vs {t.links.intra_node_gbs:g} GB/s inside a node)")
    for dim in ("tp", "pp"):
        if getattr(c, dim, None) is None and getattr(win.plan, dim) > 1:
            lower = 1
            if not any(getattr(x.plan, dim) == lower for x in others):
                smallest = result.smallest.get((dim, lower))
                usable = t.gpu_memory_bytes - w.overheads.safety_margin_gib * GIB
                if smallest is not None and smallest > usable:
                    note(f"{dim}={lower}", f"never fits: its smallest layout needs {smallest / GIB:.1f} GiB per GPU "
                         f"({t.gpu_memory_bytes / GIB:.1f} GiB on a {t.gpu.key})")
                elif smallest is not None:  # what fits the GPU offloads more than the host holds
                    note(f"{dim}={lower}", f"never fits: its layouts small enough for the GPU (from "
                         f"{smallest / GIB:.1f} GiB) need more host RAM than a {t.cluster}/{t.partition} "
                         f"node's {t.host_mem_bytes / GIB:.0f} GiB, or the framework refuses them")
    return out[:limit]


KNOBS = ("sharding", "recompute", "offload", "micro_batch_size")


def _same_layout(w, t, c, win: Candidate, dim: str, objective: str) -> list[Candidate]:
    """The best plan of the winner's own layout (tp, pp, cp, dp, ep, virtual stages) with the
    knob `dim` pinned to each other value the framework offers (micro-batch: half and twice):
    one layout's evaluation each. The search itself tries offload or recompute on a layout only
    where they are needed, so these are not among its ranked plans."""
    p = win.plan
    mine = getattr(p, dim)
    if dim == "sharding" and p.dp * p.cp == 1:
        return []  # nothing to shard states over
    if dim == "micro_batch_size":
        values = {max(1, mine // 2), mine * 2} - {mine}
    else:
        values = set({"sharding": w.caps.shardings, "recompute": w.caps.recompute,
                      "offload": w.caps.offload}[dim]) - {mine}
    pins = dict(tp=p.tp, pp=p.pp, cp=p.cp, dp=p.dp, virtual_stages=p.virtual_stages,
                ep=p.ep if w.model.moe is not None else c.ep)
    out = []
    for value in sorted(values, key=str):
        r = search(w, t, replace(c, **pins, **{dim: value}), objective=objective)
        if r.best is not None and r.best.estimate is not None:
            out.append(r.best)
    return out


def _pinned_neighbours(w, t, c, dim, mine, objective, evaluations=None) -> list[Candidate]:
    """Best plans with `dim` pinned to half and twice the winner's value (when valid), sharing
    the main search's evaluations (a layout's outcome does not depend on the pin)."""
    out = []
    for value in {max(1, mine // 2), mine * 2}:
        if value == mine:
            continue
        if evaluations is not None:
            ev = evaluations.pinned(**{dim: value})
            r = search(w, t, ev.c, objective=objective, steps=ev.steps, evaluations=ev)
        else:
            r = search(w, t, replace(c, **{dim: value}), objective=objective)
        if r.best is not None and r.best.estimate is not None:
            out.append(r.best)
    return out


def explain(result: SearchResult, top: int = 5) -> dict:
    """The whole decision as data: counts, rejections by constraint, the winners."""
    return {
        "objective": result.objective,
        "layouts_evaluated": result.considered,
        "feasible": result.feasible_count,
        "rejected": dict(result.rejected),
        "winners": [
            {"plan": x.plan.summary(), "world_size": x.plan.world_size,
             "memory_gib": round(x.memory.total_bytes / GIB, 2),
             "step_time_s": x.estimate.step_time_s if x.estimate else None,
             "tokens_per_s_per_gpu": x.tokens_per_s_per_gpu if x.estimate else None}
            for x in result.ranked[:top]
        ],
    }


# What each memory term has been checked against (issue 14). "exact": byte counts by
# construction, measured equal on CPU models; "traced": compared with torchtitan's own code at
# full size on fake tensors (benchmarks/trace_memory.py; the relative difference of the last run,
# recorded in docs/memory-accuracy.md, "Trace mode"), or, for the allocator's terms, with those
# traced steps replayed through a model of the caching allocator ("Reserved memory"); "measured": compared with PyTorch on small
# CPU models only (benchmarks/memory_accuracy.py); "modelled": a named constant or formula that
# nothing has checked yet.
# The evidence names below are keyed in MEMORY_EVIDENCE (printed once under the list).
MEMORY_EVIDENCE = {
    "CPU": "small Llama/GPT models in PyTorch on CPU (jobctl_measure.torch_reference, installed with jobctl; "
           "jobctl repository: benchmarks/memory_accuracy.py, docs/memory-accuracy.md)",
    "DeepSpeed on CPU": "DeepSpeed's own ZeRO engine on its CPU accelerator, live tensor storages measured "
                        "(jobctl repository: benchmarks/deepspeed_memory.py, docs/memory-accuracy.md)",
    "Megatron-LM CI": "peak allocated bytes of Megatron-LM's functional tests (jobctl_measure.megatron_functional, "
                      "installed with jobctl; jobctl repository: benchmarks/megatron_memory.py, "
                      "docs/memory-accuracy.md)",
    "trace": "torchtitan's own Llama 3 8B/70B/405B, FSDP2 (x TP, x PP), and HF transformers' Llama under "
             "accelerate's FSDP2, on fake tensors (jobctl repository: benchmarks/trace_memory.py, "
             "docs/memory-accuracy.md, Trace mode)",
    "allocator replay": "every allocation of those traced steps replayed through a model of PyTorch's caching "
                        "allocator; 8B's published 82.4 GiB max reserved within 6% (jobctl_measure.caching_allocator, "
                        "installed with jobctl; jobctl repository: benchmarks/trace_memory.py --allocator, "
                        "docs/memory-accuracy.md, Reserved memory)",
}


# Terms that came from the trace: (label where the trace covers the layout, label elsewhere).
TRACED_TERMS = {
    "unsharded stage (FSDP under PP)": ("0.0% vs trace (8B, 70B, 405B stages)",
                                        "from torchtitan's and torch's code; not traced"),
    "recompute working set": ("the block rematerialised in its backward; full-AC activations exact",
                              "one layer's activations, as traced for torchtitan; not traced here"),
    "pipeline receive buffers": ("one per micro-batch and received tensor (405B last stage: 31 x 32 MiB)",
                                 "from torch's PipelineStage code; not traced here"),
    "gradient before accumulation": ("stands in for the block's backward temporaries: 0.41 vs 0.96 GiB (8B)",
                                     "as traced for torchtitan; not traced here"),
}
# the caching allocator's terms under FSDP2: the trace's allocations replayed through a model of
# PyTorch's caching allocator (jobctl_measure/caching_allocator.py); 8B's published 82.4 GiB: -5.4%
_REPLAYED = ("allocator replay: reserved totals within 5% (14 layouts, 8B-405B)",
             "FSDP2's stream caches as replayed for torchtitan; not replayed here")
TRACED_TERMS.update(dict.fromkeys(FSDP2_ALLOCATOR_TERMS, _REPLAYED))


def memory_checks(w, plan, terms: list[dict]) -> list[dict]:
    """Per memory term: how it is checked (exact, traced, measured, modelled) and by what."""
    # the layouts benchmarks/trace_memory.py traces: torchtitan's Llama, FSDP2 with or without
    # TP (torchtitan always adds SP) and 1F1B or 2-chunk interleaved pipelining (first, middle and
    # last stages), and HF's Llama under accelerate's FSDP2; no context parallelism, no offload
    pp_traced = plan.pp > 1 and plan.virtual_stages <= 2 and w.caps.name == "torchtitan"
    traced = w.model.family == "llama" and plan.cp == 1 and plan.offload == "none" and (plan.pp == 1 or pp_traced) and (
        w.caps.name == "torchtitan" or (w.caps.name == "fsdp" and plan.tp == 1))
    compiled = compiled_set(w, plan)  # the set the memory model took: None where eager's terms stand
    out = []
    for term in terms:
        name = term["name"]
        moe = w.model.moe is not None or w.model.mla is not None
        if name in ("weights", "gradients", "optimizer states"):
            kind, by = "exact", "byte counts; = CPU" + (", = trace" if traced else "")
        elif name.startswith("expert ") and name.split(" ", 1)[1] in ("weights", "gradients", "optimizer states"):
            kind, by = "exact", "byte counts of the routed experts over EP and expert DP (Megatron-Core's folding)"
        elif name == "layer activations" and compiled is not None:
            # compiled, the block keeps another set than the traced (eager) program's
            if compiled == "16-bit" and w.precision in LOW_PRECISION_SAVED_BYTES:  # 16-bit's set assumed
                kind, by = "modelled", f"compiled {w.precision}: 16-bit's compiled set assumed, not measured"
            elif compiled == "moe" and (plan.tp > 1 or plan.ep > 1):
                kind, by = "modelled", (f"compiled MoE block at tp {plan.tp}, ep {plan.ep}: measured on one rank only "
                                        "(benchmarks/compiled_activations.py)")
            else:
                kind, by = "measured", ("torchtitan's block compiled on CPU (16-bit, Float8, Qwen3 MoE, DeepSeek-V3 "
                                        "MLA; dense 16-bit and Float8 at TP 2 and 4, and with selective AC at TP 2): "
                                        "within 0.6% (benchmarks/compiled_activations.py)")
        elif moe and name == "layer activations" and w.caps.moe_fp32_copies and plan.tp == 1 and plan.ep == 1:
            kind, by = "measured", ("torchtitan's Qwen3 MoE and DeepSeek-V3 MLA blocks, eager on CPU: within 0.1% "
                                    "(benchmarks/compiled_activations.py)")
        elif moe and name == "layer activations":
            kind, by = "modelled", "routed tokens, router and MLA terms: not traced or measured yet"
        elif name in ("layer activations", "logits and loss", "final norm and output input"):
            if traced:
                kind, by = "traced", ("0.0% vs trace" if plan.pp == 1 or name == "layer activations"
                                      else "within 2% vs trace (last stage)")
            elif name == "logits and loss" and w.fused_cross_entropy == "te" and w.caps.te_cross_entropy:
                kind, by = "modelled", "Transformer Engine's kernel read: gradient in place in the logits; not measured"
            elif name == "logits and loss" and w.fused_cross_entropy and w.caps.fused_cross_entropy_logit_bytes:
                kind, by = "measured", "Megatron-Core's fused loss, compiled on CPU: 10 B/logit; its CI rows -6%/-3%"
            elif w.caps.name == "megatron":
                kind, by = "measured", "Megatron-LM CI: 30 of 31 within 10%"
            elif name == "layer activations":
                kind, by = "measured", "within 10% of CPU; not traced here"
            else:
                kind, by = "measured", "= CPU; not traced here"
        elif name == "gathered weights":
            if traced and plan.sharding in ("zero3", "hsdp"):
                kind, by = "traced", ("+13% (8B) / -4.9% (70B) vs trace" if w.caps.name == "fsdp"
                                      else "+17% vs trace (1.22 vs 1.04 GiB, 70B TP 8)" if plan.tp > 1
                                      else "+25% vs trace (4.89 vs 3.91 GiB, 8B)")
            else:
                kind, by = "modelled", "unsharded-layer rule; not traced"
        elif name == "never held together":
            if traced:
                kind, by = "traced", ("totals within 1.5% of the trace" if plan.pp == 1
                                      else "totals within 3% of the trace (pipeline stages)")
            else:
                kind, by = "modelled", "FSDP2's phases as traced for torchtitan; not traced here"
        elif name in TRACED_TERMS:
            kind, by = ("traced", TRACED_TERMS[name][0]) if traced else ("modelled", TRACED_TERMS[name][1])
        elif name == "reduce bucket" and w.caps.name == "deepspeed" and plan.sharding != "none":
            kind, by = "measured", "DeepSpeed on CPU: 5e8 x 2 B, any model"
        elif name.startswith("learned"):
            kind, by = "measured", "this workload's own CUDA OOM here"
        elif name == "hybridep buffers":
            kind, by = "modelled", "DeepEP's Hybrid-EP_Implementation.md §4.2 sizes; not measured (HybridEP needs a GPU)"
        elif name in ("mtp inputs", "mtp logits and loss"):
            kind, by = "modelled", ("from Megatron-Core's multi_token_prediction.py and gpt_model.py _postprocess; the "
                                    "module's layer as the model's average; not measured")
        elif name == "deepep buffers":
            kind, by = "modelled", ("DeepEP's own size hints (csrc/legacy/config.hpp) for its recommended configs; not "
                                    "measured (DeepEP needs a GPU)")
        else:
            kind, by = "modelled", "named constant; needs a GPU"
        out.append({"term": name, "check": kind, "by": by})
    return out
