"""Enumerate layouts (TP x PP x CP x DP x interleaving x sharding x micro-batch x recompute x
offload), keep those that fit, estimate each one's step time, and rank them by an objective.

Objectives (see `rank`):
- "balanced" (the default): the fastest plan on the GPUs the user has, as long as more GPUs still
  pay: the shortest step among the plans whose tokens/s per GPU is at least SCALING_EFFICIENCY of
  the best per-GPU throughput. Layouts span whole nodes or divide one node; a plan takes part of
  a node only when no whole-node plan is faster (a toy model), never to save per-GPU throughput;
- "throughput": the best tokens/s per GPU (the cheapest GPU-hours), then the fewest nodes within
  THROUGHPUT_TOLERANCE of it;
- "time": the fastest wall time, whatever it costs;
- "gpus": the fewest GPUs that fit, then the fastest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from jobctl import frameworks
from jobctl.frameworks import Selective
from jobctl.planner.catalog import GIB, GPUSpec
from jobctl.planner.memory import (
    MemoryBreakdown,
    Workload,
    estimate,
    stage_layers,
)
from jobctl.planner.perf import Links, StepEstimate, estimate_step
from jobctl.planner.plan import Plan

OBJECTIVES = ("balanced", "throughput", "time", "gpus")
DEFAULT_OBJECTIVE = "balanced"
# "balanced": more GPUs pay while each still delivers this share of the best tokens/s per GPU.
SCALING_EFFICIENCY = 0.90
# "throughput": among plans within this fraction of the best tokens/s per GPU, the fewest nodes.
THROUGHPUT_TOLERANCE = 0.03
MAX_VIRTUAL_STAGES = 8

AUTO = "auto"
MAX_CP = 32
MIN_CP_TOKENS = 1024
SMALL_BUBBLE = 0.02

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
    links: Links | None = None

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
    virtual_stages: int | None = None  # None: the search chooses; 1: plain 1F1B
    max_nodes: int | None = None
    nodes: int | None = None  # resources.nodes: exactly this many whole nodes


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    memory: MemoryBreakdown
    estimate: StepEstimate | None = None
    whole_nodes: bool = True  # False: the plan takes part of a node and leaves its other GPUs idle

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s if self.estimate else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.estimate.tokens_per_s_per_gpu if self.estimate else 0.0


@dataclass
class SearchResult:
    target: Target
    best: Candidate | None
    feasible: list[Candidate] = field(default_factory=list)
    considered: int = 0
    feasible_count: int = 0
    rejected: Counter = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)  # why nothing fits / why a pin is impossible
    closest: Candidate | None = None  # the smallest-memory layout that did not fit
    objective: str = DEFAULT_OBJECTIVE
    ranked: list[Candidate] = field(default_factory=list)  # best first, one per layout
    smallest: dict = field(default_factory=dict)  # (dimension, value) -> least memory seen (bytes)

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
            out.append(f"tp={c.tp} crosses the node boundary: a node of {t.partition} has {_gpus(t.gpus_per_node)}; "
                       "tensor parallelism must stay inside a node")
    if c.pp is not None and not stage_layers(m.layers, c.pp):
        out.append(f"pp={c.pp} cannot split {m.layers} layers: {m.layers} % {c.pp} = {m.layers % c.pp}, and "
                   "shortening the first and last stage by one layer does not make it even either")
    caps = w.caps
    for what, value, offered in (("optimizer", w.optimizer, caps.optimizers), ("method", w.method, caps.methods),
                                 ("precision", w.precision, caps.precisions)):
        if value not in offered:
            out.append(f"train.{what}={value}: framework {caps.name} does not run it (it offers {', '.join(offered)})")
    for dim, offered in (("tp", caps.tp), ("pp", caps.pp)):
        value = getattr(c, dim)
        if value is not None and value > 1 and not offered:
            out.append(f"{dim}={value}: framework {caps.name} has no {'tensor' if dim == 'tp' else 'pipeline'} "
                       f"parallelism ({_with(dim)})")
    for knob, offered in (("recompute", caps.recompute), ("offload", caps.offload)):
        value = getattr(c, knob)
        if value is not None and value not in offered:
            out.append(f"{knob}={value} is not available in framework {caps.name} (it offers {', '.join(offered)})")
    if c.virtual_stages and c.virtual_stages > 1 and not caps.interleaved:
        out.append(f"virtual_stages={c.virtual_stages}: framework {caps.name} has no interleaved pipeline schedule")
    if c.cp is not None and c.cp > 1:
        if not caps.cp:
            out.append(f"cp={c.cp}: framework {caps.name} has no context parallelism ({_with('cp')})")
        if w.seq_len % (2 * c.cp):
            out.append(f"cp={c.cp} needs seq_len divisible by 2·cp: {w.seq_len} % {2 * c.cp} = {w.seq_len % (2 * c.cp)}")
    if c.dp is not None and w.global_batch_size % c.dp:
        out.append(f"dp={c.dp} does not divide global_batch_size: {w.global_batch_size} % {c.dp} = {w.global_batch_size % c.dp}")
    if c.micro_batch_size is not None:
        per = c.micro_batch_size * (c.dp or 1)
        if w.global_batch_size % per:
            out.append(f"micro_batch_size({c.micro_batch_size}) * dp({c.dp or 1}) = {per} does not divide "
                       f"global_batch_size({w.global_batch_size})")
    if c.sharding is not None and c.sharding not in caps.shardings:
        out.append(f"sharding={c.sharding} is not available in framework {caps.name} "
                   f"(it offers {', '.join(caps.shardings)})")
    if c.sequence_parallel and caps.sequence_parallel == "no":
        out.append(f"sequence_parallel: framework {caps.name} has no sequence parallelism ({_with('sp')})")
    if c.nodes is not None and c.nodes > t.nodes:
        out.append(f"resources.nodes={c.nodes}: {t.cluster}/{t.partition} has {t.nodes} node{'s' if t.nodes != 1 else ''}")
    dims = [c.tp, c.pp, c.dp, c.cp]
    if all(d is not None for d in dims):
        world = c.tp * c.pp * c.dp * c.cp
        limit = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
        if world > limit:
            out.append(f"tp({c.tp}) * pp({c.pp}) * dp({c.dp}) * cp({c.cp}) = {world} GPUs > {limit} available "
                       f"({t.cluster}/{t.partition}: {t.nodes} node{'s' if t.nodes != 1 else ''} x {_gpus(t.gpus_per_node)}"
                       + (f", max_nodes {c.max_nodes}" if c.max_nodes else "") + ")")
        elif world > t.gpus_per_node and world % t.gpus_per_node:
            out.append(f"world size {world} is not a whole number of {t.gpus_per_node}-GPU nodes")
    return out


def _with(what: str) -> str:
    """Which frameworks offer `what` (tp, pp, cp, sp), for a message."""
    has = [n for n, f in frameworks.REGISTRY.items()
           if {"tp": f.caps.tp, "pp": f.caps.pp, "cp": f.caps.cp, "sp": f.caps.sequence_parallel != "no"}[what]]
    return "frameworks with it: " + ", ".join(has) + "; custom code declares it under framework.supports"


def layouts(w: Workload, t: Target, c: Constraints):
    """Yield (tp, pp, cp, dp, nodes, gpus_per_node) for every valid parallel layout."""
    m = w.model
    caps = w.caps
    tps = [c.tp] if c.tp else [d for d in divisors(t.gpus_per_node)
                               if m.heads % d == 0 and m.kv_heads % d == 0 and (d == 1 or caps.tp)]
    pps = [c.pp] if c.pp else [p for p in range(1, m.layers + 1) if stage_layers(m.layers, p) and (p == 1 or caps.pp)]
    if c.cp:
        cps = [c.cp]
    elif caps.cp:
        # Context parallelism is for long sequences: each rank keeps at least MIN_CP_TOKENS
        # (shorter chunks leave attention kernels and the K/V ring mostly idle).
        cps = [x for x in (1, 2, 4, 8, 16, 32)
               if x == 1 or (w.seq_len % (2 * x) == 0 and w.seq_len // x >= MIN_CP_TOKENS)]
    else:
        cps = [1]
    dps = [c.dp] if c.dp else [d for d in divisors(w.global_batch_size)
                               if (w.global_batch_size // d) % (c.micro_batch_size or 1) == 0]
    max_gpus = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
    for tp in tps:
        for pp in pps:
            for cp in cps:
                for dp in dps:
                    world = tp * pp * cp * dp
                    if world > max_gpus or (c.nodes is not None and world != c.nodes * t.gpus_per_node):
                        continue
                    if world <= t.gpus_per_node:
                        if t.gpus_per_node % world and world != 1:
                            continue  # a partial node: use a divisor of the node's GPUs
                        yield tp, pp, cp, dp, 1, world
                    elif world % t.gpus_per_node == 0:
                        yield tp, pp, cp, dp, world // t.gpus_per_node, t.gpus_per_node


def knob_options(w: Workload, c: Constraints, shard_group: int, nodes: int, gpn: int, tp: int) -> list[tuple]:
    """(sharding, recompute, offload, hsdp_shard) choices, cheapest first."""
    caps = w.caps
    shardings = [c.sharding] if c.sharding else list(caps.shardings)
    if not c.sharding:
        if shard_group == 1:
            # nothing to shard over; a ZeRO stage stays on offer where the framework offloads
            # only through it (DeepSpeed's ZeRO-Offload on one GPU)
            shardings = ["none"] + [x for x in ("zero2", "zero1") if x in shardings][:1]
        else:
            # ZeRO-1/2 move the same bytes as DDP's all-reduce (a reduce-scatter plus an
            # all-gather) and hold less: of none/zero1/zero2 only the most sharded is worth trying.
            plain = [x for x in ("zero2", "zero1", "none") if x in shardings]
            shardings = plain[:1] + [x for x in shardings if x in ("hsdp", "zero3")]
        if nodes == 1 or "hsdp" not in shardings:
            shardings = [s for s in shardings if s != "hsdp"]
    recomputes = [c.recompute] if c.recompute else list(caps.recompute)
    if not c.recompute and w.attention != "eager" and caps.selective is not Selective.OP_SAC:
        # Megatron's selective recompute only saves the a·s² scores, which flash attention never keeps
        recomputes = [r for r in recomputes if r != "selective"]
    offloads = [c.offload] if c.offload else list(caps.offload)
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


def search(w: Workload, t: Target, c: Constraints, objective: str = DEFAULT_OBJECTIVE, steps: int | None = None,
           keep_all: bool = False) -> SearchResult:
    """Find the plans that fit on `t`, estimate their step time, rank them by `objective`."""
    result = SearchResult(target=t, best=None, objective=objective)
    problems = pinned_problems(w, t, c)
    if problems:
        result.reasons = problems
        return result
    links = t.links
    gbs = w.global_batch_size
    closest: Candidate | None = None
    per_layout: list[Candidate] = []
    smallest: dict = {}

    def note_smallest(plan: Plan, total: int):
        for dim in ("tp", "pp", "cp", "dp", "sharding", "recompute", "offload"):
            key = (dim, getattr(plan, dim))
            if key not in smallest or total < smallest[key]:
                smallest[key] = total

    def check(plan: Plan) -> MemoryBreakdown:
        nonlocal closest
        result.considered += 1
        mem = estimate(w, t.gpu_memory_bytes, plan, t.host_mem_bytes, detail=False)
        note_smallest(plan, mem.total_bytes)
        if not mem.fits:
            result.rejected["host memory" if mem.fits_gpu else "GPU memory"] += 1
            if closest is None or mem.total_bytes < closest.memory.total_bytes:
                closest = Candidate(plan, mem)
        return mem

    def timed(plan: Plan, mem: MemoryBreakdown) -> Candidate:
        est = estimate_step(w, plan, links, t.gpus_per_node, steps) if links else None
        return Candidate(plan, mem, est, plan.gpus_per_node == t.gpus_per_node)

    # Each layout gets an optimistic bound first: its step time with no recomputation and no
    # offload (they only add work), for each sharding on offer (the model can overlap ZeRO-3's
    # traffic better than DDP's all-reduce) and a few micro-batch sizes. Layouts are visited
    # best bound first, and a layout whose bound cannot come within the objective's tolerance
    # of the best plan found so far (for "balanced": cannot win either race, see _Race) is
    # skipped without a memory check. tests/test_search_properties.py checks the pruned
    # search against an unpruned one.
    prepared = []
    for tp, pp, cp, dp, nodes, gpn in layouts(w, t, c):
        per_dp = gbs // dp
        mbss = [c.micro_batch_size] if c.micro_batch_size else sorted(divisors(per_dp), reverse=True)
        sp = (tp > 1 and w.caps.sequence_parallel != "no") if c.sequence_parallel is None else c.sequence_parallel
        layers_max = stage_layers(w.model.layers, pp)[1]
        vs = [c.virtual_stages] if c.virtual_stages else virtual_stage_options(w, pp)
        if len(vs) > 1 and (pp - 1) / (per_dp + pp - 1) < SMALL_BUBBLE:
            vs = [1]  # with this many micro-batches the bubble is negligible: interleaving cannot pay
        knobs = knob_options(w, c, dp * cp, nodes, gpn, tp)
        if not knobs:
            result.rejected["hsdp group does not divide dp·cp"] += 1
            continue
        bound = _bound(w, t, c, steps, objective, (tp, pp, cp, dp, nodes, gpn), mbss, vs, knobs, sp)
        prepared.append((bound, tp, pp, cp, dp, nodes, gpn, per_dp, mbss, sp, layers_max, vs, knobs))
    prepared.sort(key=lambda x: -x[0])
    best_metric = None
    tolerance = THROUGHPUT_TOLERANCE if objective == "throughput" else 0.0

    group_best: dict = {}  # (tp, pp, cp) -> (metric, nodes) of the best plan found for that group
    # "balanced" runs two races (see _rank_balanced): among all plans, and among whole-node plans
    races = (_Race(), _Race())
    for bound, tp, pp, cp, dp, nodes, gpn, per_dp, mbss, sp, layers_max, vs, knobs in prepared:
        if objective == "balanced":
            whole = gpn == t.gpus_per_node
            world = tp * pp * cp * dp
            if not keep_all and not races[0].can_win(bound, world) and not (whole and races[1].can_win(bound, world)):
                result.rejected["slower than the best (bound)"] += 1
                continue
        elif best_metric is not None and not keep_all and bound < best_metric * (1 - tolerance):
            result.rejected["slower than the best (bound)"] += 1
            continue
        seen = group_best.get((tp, pp, cp))
        if objective == "throughput" and seen and not keep_all and seen[1] <= nodes and bound <= seen[0]:
            # the same model-parallel layout already fits on fewer nodes at least as fast per GPU
            result.rejected["dominated by fewer nodes"] += 1
            continue

        def make(mbs, v, sh, rc, of, hs, n_rc=0):
            return Plan(nodes, gpn, tp, pp, dp, cp, sh, mbs, per_dp // mbs, gbs, rc, of, sp, v, hs, n_rc)

        # Cheapest test first: the least memory this layout can reach (the last knob setting,
        # micro-batch 1, no interleaving). If that does not fit, nothing here will.
        floor = knobs[-1]
        if not check(make(mbss[-1], vs[0], *floor)).fits:
            continue
        best: Candidate | None = None
        for v in vs:
            fits_without_offload = False
            roomy = set()  # (sharding, offload) settings where no recompute fits the largest micro-batch
            for sh, rc, of, hs in knobs:
                if of != "none" and fits_without_offload and not c.offload:
                    continue  # offload only when nothing else fits: it is always slower
                if rc != "none" and (sh, of) in roomy and not c.recompute:
                    continue  # recomputation only when the activations do not fit otherwise
                for mbs, n_rc, mem in _fitting_microbatches(w, check, make, mbss, v, sh, rc, of, hs, layers_max, c):
                    if of == "none":
                        fits_without_offload = True
                    if rc == "none" and mbs == mbss[0]:
                        roomy.add((sh, of))
                    plan = make(mbs, v, sh, rc, of, hs, n_rc)
                    if w.framework.problems(plan, w):
                        result.rejected["the framework refuses it"] += 1
                        continue  # e.g. an interleaved schedule whose micro-batches do not divide
                    cand = timed(plan, mem)
                    result.feasible_count += 1
                    if best is None or _faster(cand, best):
                        best = cand
                    if keep_all:
                        per_layout.append(cand)
        if best is not None and not keep_all:
            per_layout.append(best)
            if objective == "balanced" and best.estimate is not None:
                races[0].add(best)
                if best.whole_nodes:
                    races[1].add(best)
            metric = _metric(best, objective)
            if best_metric is None or metric > best_metric:
                best_metric = metric
            seen = group_best.get((tp, pp, cp))
            if seen is None or (metric, -nodes) > (seen[0], -seen[1]):
                group_best[(tp, pp, cp)] = (metric, nodes)

    if closest is not None:
        closest = Candidate(closest.plan, estimate(w, t.gpu_memory_bytes, closest.plan, t.host_mem_bytes))
    result.closest = closest
    result.smallest = smallest
    if per_layout:
        ranked = rank(per_layout, objective)
        result.ranked = ranked
        result.feasible = ranked
        top = ranked[0]
        result.best = Candidate(top.plan, estimate(w, t.gpu_memory_bytes, top.plan, t.host_mem_bytes), top.estimate,
                                top.whole_nodes)
    else:
        result.reasons = no_fit_reasons(w, t, c, closest, result)
    return result


def _metric(cand: Candidate, objective: str) -> float:
    """Bigger is better: tokens/s per GPU (throughput, and balanced's bound), tokens/s (time),
    −GPUs (gpus)."""
    if objective == "gpus":
        return -float(cand.plan.world_size)
    if cand.estimate is None:
        return 0.0
    return cand.tokens_per_s_per_gpu if objective in ("throughput", "balanced") else cand.tokens_per_s


def _bound(w, t, c, steps, objective, layout, mbss, vs, knobs, sp) -> float:
    """An optimistic estimate of a layout's metric (see search): no recompute, no offload, each
    sharding on offer (the model can overlap ZeRO-3's traffic better than DDP's all-reduce)."""
    tp, pp, cp, dp, nodes, gpn = layout
    if objective == "gpus" or t.links is None:
        return -float(tp * pp * cp * dp)
    best = 0.0
    per_dp = w.global_batch_size // dp
    for sh, hs in {(k[0], k[3]) for k in knobs}:
        for v in {vs[0], vs[-1]}:
            for mbs in {mbss[0], mbss[-1], mbss[len(mbss) // 2]}:
                plan = Plan(nodes, gpn, tp, pp, dp, cp, sh, mbs, per_dp // mbs, w.global_batch_size, "none", "none",
                            sp, v, hs)
                est = estimate_step(w, plan, t.links, t.gpus_per_node, steps)
                best = max(best, est.tokens_per_s if objective == "time" else est.tokens_per_s_per_gpu)
    return best


def virtual_stage_options(w: Workload, pp: int) -> list[int]:
    """Virtual pipeline stages per rank worth trying: 1, and when the framework interleaves, the
    counts that split the layers evenly (Megatron: a stage's layers; torchtitan: the layers plus
    embedding and output over pp·v stages)."""
    if pp == 1 or not w.caps.interleaved:
        return [1]
    layers_max = stage_layers(w.model.layers, pp)[1]
    # the framework's own rule (its `problems`) filters the plans later
    return [1] + [v for v in range(2, MAX_VIRTUAL_STAGES + 1)
                  if layers_max % v == 0 or (w.model.layers + 2) % (pp * v) == 0]


def _fitting_microbatches(w, check, make, mbss, v, sh, rc, of, hs, layers_max, c):
    """Yield (micro_batch_size, recompute_layers, memory) for the micro-batches that fit with
    these knobs, largest first, each with the fewest recomputed layers that fit.

    Memory grows with the micro-batch (with 1F1B, b·min(m, p) grows too) and with the number
    of layers that keep their activations, so both are found by bisection."""
    if not check(make(mbss[-1], v, sh, rc, of, hs)).fits:
        return
    lo, hi = len(mbss) - 1, 0  # mbss is descending; index lo fits
    while hi < lo:
        mid = (lo + hi) // 2
        if check(make(mbss[mid], v, sh, rc, of, hs)).fits:
            lo = mid
        else:
            hi = mid + 1
    # Without pipelining the largest micro-batch is fastest (bigger GEMMs, nothing else
    # changes); with it, smaller micro-batches mean more of them and a smaller bubble, until
    # the bubble is negligible.
    plan0 = make(mbss[lo], v, sh, rc, of, hs)
    picks = [lo]
    if plan0.pp > 1:
        for i in range(lo + 1, len(mbss)):
            m_prev = plan0.global_batch_size // (plan0.dp * mbss[i - 1])
            if (plan0.pp - 1) / (v * m_prev + plan0.pp - 1) < SMALL_BUBBLE:
                break
            picks.append(i)
    for i in picks:
        mbs = mbss[i]
        n_rc = 0
        if rc == "full" and layers_max > 1 and not c.recompute and w.caps.recompute_layers:
            n_rc = _fewest_recomputed_layers(check, make, mbs, v, sh, rc, of, hs, int(layers_max))
            if n_rc and v > 1:  # Megatron recomputes N layers of each model chunk: a multiple of v per stage
                n_rc = -(-n_rc // v) * v
                n_rc = 0 if n_rc >= layers_max else n_rc
        mem = check(make(mbs, v, sh, rc, of, hs, n_rc))
        if mem.fits:
            yield mbs, n_rc, mem


def _fewest_recomputed_layers(check, make, mbs, v, sh, rc, of, hs, layers: int) -> int:
    """Block recompute: the fewest layers per stage to recompute so that the plan fits
    (0 = all). Peak memory is linear in that number (each recomputed layer keeps 2·sbh
    instead of its activations), so two evaluations give the line and a third confirms."""
    one = check(make(mbs, v, sh, rc, of, hs, 1))
    if one.fits:
        return 1
    full = check(make(mbs, v, sh, rc, of, hs, 0))  # all layers
    if not full.fits or layers <= 2:
        return 0
    per_layer = (one.total_bytes - full.total_bytes) / (layers - 1)
    need = one.total_bytes - full.gpu_usable_bytes
    n = min(layers, 1 + int(-(-need // per_layer))) if per_layer > 0 else layers
    while n < layers and not check(make(mbs, v, sh, rc, of, hs, n)).fits:
        n += 1  # rounding of the integer byte counts: step up until it fits
    return 0 if n >= layers else n


def _faster(a: Candidate, b: Candidate) -> bool:
    """Higher tokens/s; ties (or no estimate) go to the cheaper memory knobs, then larger micro-batch."""
    if a.estimate and b.estimate and abs(a.tokens_per_s - b.tokens_per_s) > 1e-9 * b.tokens_per_s:
        return a.tokens_per_s > b.tokens_per_s
    return knob_cost(a.plan) < knob_cost(b.plan) or (
        knob_cost(a.plan) == knob_cost(b.plan) and a.plan.micro_batch_size > b.plan.micro_batch_size)


def knob_cost(p: Plan) -> float:
    return KNOB_COST[("sharding", p.sharding)] + KNOB_COST[("recompute", p.recompute)] + KNOB_COST[("offload", p.offload)]


def rank(cands: list[Candidate], objective: str) -> list[Candidate]:
    """Order candidates best first by the objective."""
    if not cands:
        return []
    if objective == "gpus":
        return sorted(cands, key=lambda x: (x.plan.world_size, -x.tokens_per_s, knob_cost(x.plan)))
    if objective == "time":
        return sorted(cands, key=lambda x: (-x.tokens_per_s, x.plan.world_size, knob_cost(x.plan)))
    if objective == "balanced":
        return _rank_balanced(cands)
    # throughput: the best tokens/s per GPU, then prefer fewer nodes among near-equals
    top = max(x.tokens_per_s_per_gpu for x in cands)
    near = [x for x in cands if x.tokens_per_s_per_gpu >= top * (1 - THROUGHPUT_TOLERANCE)]
    rest = [x for x in cands if x.tokens_per_s_per_gpu < top * (1 - THROUGHPUT_TOLERANCE)]
    near.sort(key=lambda x: (x.plan.nodes, -x.tokens_per_s_per_gpu, knob_cost(x.plan)))
    rest.sort(key=lambda x: -x.tokens_per_s_per_gpu)
    return near + rest


class _Race:
    """The best tokens/s per GPU seen (the reference) and the most tokens/s among the plans
    within SCALING_EFFICIENCY of it; which layouts can still win."""

    def __init__(self):
        self.plans: list[Candidate] = []
        self.ref: float | None = None
        self.best_tokens = 0.0

    def add(self, c: Candidate) -> None:
        self.plans.append(c)
        if self.ref is None or c.tokens_per_s_per_gpu > self.ref:
            self.ref = c.tokens_per_s_per_gpu
            self.best_tokens = max(x.tokens_per_s for x in self.plans
                                   if x.tokens_per_s_per_gpu >= self.ref * SCALING_EFFICIENCY)
        elif c.tokens_per_s_per_gpu >= self.ref * SCALING_EFFICIENCY:
            self.best_tokens = max(self.best_tokens, c.tokens_per_s)

    def can_win(self, bound: float, world: int) -> bool:
        # layouts come best bound first: once the bound is below the reference nothing left can
        # raise it, so a layout that cannot reach SCALING_EFFICIENCY of it, or cannot beat the
        # fastest plan that does, cannot win
        return self.ref is None or bound > self.ref or (
            bound >= self.ref * SCALING_EFFICIENCY and bound * world > self.best_tokens)


# "balanced" takes part of a node only when the best plan on the whole node is not faster by this.
WHOLE_NODE_GAIN = 0.01


def _fastest_efficient(cands: list[Candidate]) -> list[Candidate]:
    top = max(x.tokens_per_s_per_gpu for x in cands)
    good = [x for x in cands if x.tokens_per_s_per_gpu >= top * SCALING_EFFICIENCY * (1 - 1e-12)]
    return sorted(good, key=lambda x: (-x.tokens_per_s, x.plan.world_size, knob_cost(x.plan)))


def _rank_balanced(cands: list[Candidate]) -> list[Candidate]:
    """The fastest of the plans that keep SCALING_EFFICIENCY of the best tokens/s per GPU (ties:
    fewer GPUs, cheaper knobs). When that takes part of a node and the same rule among the
    whole-node plans gives a faster one, that one: a user who has the node gets all of it; part
    of a node only when filling it would not be faster at all. Then the others, fastest first."""
    good = _fastest_efficient(cands)
    if not good[0].whole_nodes:
        whole = [x for x in cands if x.whole_nodes]
        if whole:
            top_whole = _fastest_efficient(whole)[0]
            if top_whole.tokens_per_s > good[0].tokens_per_s * (1 + WHOLE_NODE_GAIN):
                good = [top_whole] + [x for x in good if x is not top_whole]
    chosen = {id(x) for x in good}
    rest = sorted((x for x in cands if id(x) not in chosen), key=lambda x: (-x.tokens_per_s, x.plan.world_size))
    return good + rest


def no_fit_reasons(w: Workload, t: Target, c: Constraints, closest: Candidate | None, r: SearchResult) -> list[str]:
    if r.considered == 0:
        return [f"no valid layout: the divisibility rules leave nothing to try on {_gpus(t.total_gpus)} "
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


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
