"""Enumerate layouts (TP x PP x CP x DP x sharding x micro-batch x recompute x offload), keep
those that fit, and pick one by a simple documented rule.

The rule (until the performance model ranks plans): fewest GPUs, then least model
parallelism (tp·pp·cp), then the cheapest memory knobs (sharding, recompute, offload, in
the order of `KNOB_COST`), then the largest micro-batch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from jobctl.catalog import GIB, GPUSpec
from jobctl.planner.memory import SHARDINGS, MemoryBreakdown, Workload, estimate
from jobctl.planner.plan import Plan

AUTO = "auto"
CP_FRAMEWORKS = frozenset({"megatron", "torchtitan"})
SP_FRAMEWORKS = frozenset({"megatron", "torchtitan"})
MAX_CP = 32

# Relative cost of the memory knobs, used to prefer the cheapest that fits. ZeRO-1/2 move
# the same bytes as DDP's all-reduce (reduce-scatter + all-gather), so they are nearly free;
# ZeRO-3 adds a parameter all-gather per pass (1.5x the traffic, ZeRO paper §7); selective
# recompute costs a few percent, full recompute one extra forward (~33%); offload moves the
# optimizer step to the CPU and the states over PCIe.
KNOB_COST = {
    ("sharding", "none"): 0.0, ("sharding", "zero1"): 0.1, ("sharding", "zero2"): 0.2,
    ("sharding", "hsdp"): 1.0, ("sharding", "zero3"): 1.5,
    ("recompute", "none"): 0.0, ("recompute", "selective"): 0.5, ("recompute", "full"): 3.0,
    ("offload", "none"): 0.0, ("offload", "optimizer"): 10.0, ("offload", "optimizer+params"): 20.0,
}


@dataclass(frozen=True)
class Target:
    """Where a plan runs: one partition of an inventory."""

    cluster: str
    partition: str
    gpu: GPUSpec
    gpus_per_node: int
    nodes: int
    host_mem_bytes: int
    gpu_memory_bytes: int

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Constraints:
    """The recipe's `parallelism` block: a value pins a dimension, None leaves it to search."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    sharding: str | None = None
    micro_batch_size: int | None = None
    recompute: str | None = None
    offload: str | None = None
    sequence_parallel: bool | None = None
    virtual_stages: int = 1
    max_nodes: int | None = None


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    memory: MemoryBreakdown


@dataclass
class SearchResult:
    target: Target
    best: Candidate | None
    feasible: list[Candidate] = field(default_factory=list)
    considered: int = 0
    rejected: Counter = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)  # why nothing fits / why a pin is impossible
    closest: Candidate | None = None  # the smallest-memory layout that did not fit

    @property
    def feasible_ok(self) -> bool:
        return self.best is not None


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def pinned_problems(w: Workload, t: Target, c: Constraints) -> list[str]:
    """Pins that can never work, with the arithmetic (exit 3)."""
    m = w.model
    out = []
    if c.tp is not None:
        if m.heads % c.tp:
            out.append(f"tp={c.tp} does not divide the attention heads: {m.heads} % {c.tp} = {m.heads % c.tp}")
        if m.kv_heads % c.tp:
            out.append(f"tp={c.tp} does not divide the KV heads: {m.kv_heads} % {c.tp} = {m.kv_heads % c.tp}")
        if c.tp > t.gpus_per_node:
            out.append(f"tp={c.tp} crosses the node boundary: a node of {t.partition} has {t.gpus_per_node} GPUs; "
                       "tensor parallelism must stay inside a node")
    if c.pp is not None and m.layers % c.pp:
        out.append(f"pp={c.pp} does not divide the layers: {m.layers} % {c.pp} = {m.layers % c.pp}")
    if c.cp is not None and c.cp > 1:
        if w.framework not in CP_FRAMEWORKS:
            out.append(f"cp={c.cp}: context parallelism needs framework megatron or torchtitan, not {w.framework}")
        if w.seq_len % (2 * c.cp):
            out.append(f"cp={c.cp} needs seq_len divisible by 2·cp: {w.seq_len} % {2 * c.cp} = {w.seq_len % (2 * c.cp)}")
    if c.dp is not None and w.global_batch_size % c.dp:
        out.append(f"dp={c.dp} does not divide global_batch_size: {w.global_batch_size} % {c.dp} = {w.global_batch_size % c.dp}")
    if c.micro_batch_size is not None:
        per = c.micro_batch_size * (c.dp or 1)
        if w.global_batch_size % per:
            out.append(f"micro_batch_size({c.micro_batch_size}) * dp({c.dp or 1}) = {per} does not divide "
                       f"global_batch_size({w.global_batch_size})")
    if c.sharding is not None and c.sharding not in SHARDINGS[w.framework]:
        out.append(f"sharding={c.sharding} is not available in framework {w.framework} "
                   f"(it offers {', '.join(SHARDINGS[w.framework])})")
    if c.sequence_parallel and w.framework not in SP_FRAMEWORKS:
        out.append(f"sequence_parallel needs framework megatron or torchtitan, not {w.framework}")
    dims = [c.tp, c.pp, c.dp, c.cp]
    if all(d is not None for d in dims):
        world = c.tp * c.pp * c.dp * c.cp
        limit = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
        if world > limit:
            out.append(f"tp({c.tp}) * pp({c.pp}) * dp({c.dp}) * cp({c.cp}) = {world} GPUs > {limit} available "
                       f"({t.cluster}/{t.partition}: {t.nodes} nodes x {t.gpus_per_node} GPUs"
                       + (f", max_nodes {c.max_nodes}" if c.max_nodes else "") + ")")
        elif world > t.gpus_per_node and world % t.gpus_per_node:
            out.append(f"world size {world} is not a whole number of {t.gpus_per_node}-GPU nodes")
    return out


def layouts(w: Workload, t: Target, c: Constraints):
    """Yield (tp, pp, cp, dp, nodes, gpus_per_node) for every valid parallel layout."""
    m = w.model
    tps = [c.tp] if c.tp else [d for d in divisors(t.gpus_per_node) if m.heads % d == 0 and m.kv_heads % d == 0]
    pps = [c.pp] if c.pp else divisors(m.layers)
    if c.cp:
        cps = [c.cp]
    elif w.framework in CP_FRAMEWORKS:
        cps = [x for x in (1, 2, 4, 8, 16, 32) if x == 1 or w.seq_len % (2 * x) == 0]
    else:
        cps = [1]
    dps = [c.dp] if c.dp else divisors(w.global_batch_size)
    max_gpus = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
    for tp in tps:
        for pp in pps:
            for cp in cps:
                for dp in dps:
                    world = tp * pp * cp * dp
                    if world > max_gpus:
                        continue
                    if world <= t.gpus_per_node:
                        if t.gpus_per_node % world and world != 1:
                            continue  # a partial node: use a divisor of the node's GPUs
                        yield tp, pp, cp, dp, 1, world
                    elif world % t.gpus_per_node == 0:
                        yield tp, pp, cp, dp, world // t.gpus_per_node, t.gpus_per_node


def knob_options(w: Workload, c: Constraints, shard_group: int, nodes: int, gpn: int, tp: int) -> list[tuple]:
    """(sharding, recompute, offload, hsdp_shard) choices, cheapest first."""
    shardings = [c.sharding] if c.sharding else list(SHARDINGS[w.framework])
    if not c.sharding:
        if shard_group == 1:
            shardings = ["none"]  # nothing to shard over
        if nodes == 1 or "hsdp" not in shardings:
            shardings = [s for s in shardings if s != "hsdp"]
    recomputes = [c.recompute] if c.recompute else ["none", "selective", "full"]
    if not c.recompute and w.attention != "eager":
        recomputes = ["none", "full"]  # selective recompute only saves the a·s² scores
    offloads = [c.offload] if c.offload else ["none", "optimizer", "optimizer+params"]
    if not c.offload and w.framework == "megatron":
        offloads = ["none"]
    out = []
    for sh in shardings:
        hs = 0
        if sh == "hsdp":
            hs = max(1, min(shard_group, gpn // tp))  # shard inside a node, replicate across
            if shard_group % hs:
                continue
        for rc in recomputes:
            for of in offloads:
                if of == "optimizer+params" and sh not in ("zero3", "hsdp") and not c.offload:
                    continue  # parameter offload is a ZeRO-3 feature
                cost = KNOB_COST[("sharding", sh)] + KNOB_COST[("recompute", rc)] + KNOB_COST[("offload", of)]
                out.append((cost, sh, rc, of, hs))
    out.sort(key=lambda x: x[0])
    return [x[1:] for x in out]


def search(w: Workload, t: Target, c: Constraints, keep_all: bool = False) -> SearchResult:
    """Find the plans that fit on `t`, and pick one by the documented rule."""
    result = SearchResult(target=t, best=None)
    problems = pinned_problems(w, t, c)
    if problems:
        result.reasons = problems
        return result
    gbs = w.global_batch_size
    ordered = sorted(layouts(w, t, c), key=lambda x: (x[0] * x[1] * x[2] * x[3], x[0] * x[1] * x[2], x[1], x[2]))
    closest: Candidate | None = None
    best_world = None
    for tp, pp, cp, dp, nodes, gpn in ordered:
        world = tp * pp * cp * dp
        if best_world is not None and world > best_world and not keep_all:
            break
        per_dp = gbs // dp
        mbss = [c.micro_batch_size] if c.micro_batch_size else sorted(divisors(per_dp), reverse=True)
        if per_dp % mbss[-1]:
            continue
        sp = (tp > 1 and w.framework in SP_FRAMEWORKS) if c.sequence_parallel is None else c.sequence_parallel
        knobs = knob_options(w, c, dp * cp, nodes, gpn, tp)

        def make(mbs, sh, rc, of, hs):
            return Plan(nodes, gpn, tp, pp, dp, cp, sh, mbs, per_dp // mbs, gbs, rc, of, sp, c.virtual_stages, hs)

        def check(plan):
            nonlocal closest
            result.considered += 1
            mem = estimate(w, t.gpu_memory_bytes, plan, t.host_mem_bytes, detail=False)
            if not mem.fits:
                result.rejected["host memory" if mem.fits_gpu else "GPU memory"] += 1
                if closest is None or mem.total_bytes < closest.memory.total_bytes:
                    closest = Candidate(plan, mem)
            return mem

        # Memory grows with the micro-batch (with 1F1B, b·min(m, p) grows too), so the
        # smallest micro-batch decides whether a knob setting can fit at all, and a binary
        # search finds the largest that does.
        for sh, rc, of, hs in knobs:
            mem = check(make(mbss[-1], sh, rc, of, hs))
            if not mem.fits:
                continue
            lo, hi = len(mbss) - 1, 0  # indices: mbss is descending; lo fits
            best = Candidate(make(mbss[lo], sh, rc, of, hs), mem)
            while hi < lo:
                mid = (lo + hi) // 2
                plan = make(mbss[mid], sh, rc, of, hs)
                mem_mid = check(plan)
                if mem_mid.fits:
                    best, lo = Candidate(plan, mem_mid), mid
                else:
                    hi = mid + 1
            result.feasible.append(best)
            if not keep_all:
                break  # the cheapest knobs that fit for this layout
        if result.feasible and best_world is None:
            best_world = world
    if closest is not None:
        closest = Candidate(closest.plan, estimate(w, t.gpu_memory_bytes, closest.plan, t.host_mem_bytes))
    result.closest = closest
    if result.feasible:
        best = min(result.feasible, key=lambda x: rule_key(x))
        result.best = Candidate(best.plan, estimate(w, t.gpu_memory_bytes, best.plan, t.host_mem_bytes))
    else:
        result.reasons = no_fit_reasons(w, t, c, closest, result)
    return result


def rule_key(cand: Candidate) -> tuple:
    p = cand.plan
    cost = KNOB_COST[("sharding", p.sharding)] + KNOB_COST[("recompute", p.recompute)] + KNOB_COST[("offload", p.offload)]
    return (p.world_size, p.tp * p.pp * p.cp, cost, -p.micro_batch_size)


def no_fit_reasons(w: Workload, t: Target, c: Constraints, closest: Candidate | None, r: SearchResult) -> list[str]:
    if r.considered == 0:
        return [f"no valid layout: the divisibility rules leave nothing to try on {t.total_gpus} GPUs "
                f"(heads {w.model.heads}, kv_heads {w.model.kv_heads}, layers {w.model.layers}, "
                f"global_batch_size {w.global_batch_size})"]
    out = [f"none of {r.considered} layouts fits on {t.cluster}/{t.partition} "
           f"({t.nodes} x {t.gpus_per_node} {t.gpu.key}, {t.gpu_memory_bytes / GIB:.1f} GiB each)"]
    if closest is not None:
        m = closest.memory
        if not m.fits_gpu:
            out.append(f"the smallest needs {m.total_bytes / GIB:.1f} GiB per GPU, {m.gpu_usable_bytes / GIB:.1f} GiB usable "
                       f"({closest.plan.summary()})")
        else:
            out.append(f"the smallest needs {m.host_bytes_per_node / GIB:.1f} GiB host RAM per node, "
                       f"{m.host_usable_bytes / GIB:.1f} GiB usable ({closest.plan.summary()})")
    return out


def with_partition(t: Target, **kw) -> Target:
    return replace(t, **kw)
