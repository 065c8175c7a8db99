"""The search space of one workload on one partition: the parallel layouts, the memory knobs each
can use, an optimistic bound on each layout's speed, and each layout's own evaluation (which
micro-batches and knobs fit, and the fastest of them).

A layout's evaluation does not depend on the objective, nor on which parallel dimensions a
search pins: the searches of one `plan` (the chosen objective, the other objectives it reports,
the "why not" searches that pin tp, pp or cp) share one `Evaluations`, and a layout is evaluated
once however many of them visit it (issue 25).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from jobctl.frameworks import selective_frees_memory
from jobctl.planner.catalog import GIB, GPUSpec
from jobctl.planner.memory import MemoryBreakdown, Workload, estimate, even_split, front_loaded, stage_layers
from jobctl.planner.perf import (
    Links,
    StepEstimate,
    StepShape,
    estimate_step,
    host_side_time,
    pipeline_time,
    stage_time,
    step_time,
)
from jobctl.planner.plan import Plan

MAX_VIRTUAL_STAGES = 8
MAX_TP = 64  # tensor parallelism wider than this splits layers too thin to be worth searching
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
    domain_gpus: int = 0  # GPUs of one NVLink domain when it spans nodes (0: one node)
    checkpoint_write_gbs_per_node: float | None = None  # planner/resilience.py (None: its default)
    interruptions_per_node_day: float | None = None

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def nvlink_gpus(self) -> int:
        """The GPUs that talk over NVLink: a node, or the multi-node domain (GB200 NVL72)."""
        return max(self.gpus_per_node, min(self.domain_gpus, self.total_gpus))


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
    ep: int | None = None  # expert parallelism (mixtures of experts)


# Constraints that only choose which layouts exist; a layout's own evaluation never reads them.
LAYOUT_PINS = ("tp", "pp", "cp", "dp", "max_nodes", "nodes", "ep")


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


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def layouts(w: Workload, t: Target, c: Constraints):
    """Yield (tp, pp, cp, dp, nodes, gpus_per_node, ep) for every valid parallel layout."""
    m = w.model
    caps = w.caps
    tps = [c.tp] if c.tp else [d for d in divisors(t.nvlink_gpus) if d <= MAX_TP
                               if m.heads % d == 0 and m.kv_heads % d == 0 and (d == 1 or caps.tp)]
    pps = [c.pp] if c.pp else [p for p in range(1, m.layers + 1) if p == 1 or caps.pp and offered_pp(m.layers, p, caps)]
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
                        nodes, gpn = 1, world
                    elif world % t.gpus_per_node == 0:
                        nodes, gpn = world // t.gpus_per_node, t.gpus_per_node
                    else:
                        continue
                    for ep in expert_parallel_options(w, c, tp * cp * dp, t.nvlink_gpus):
                        yield tp, pp, cp, dp, nodes, gpn, ep


def expert_parallel_options(w: Workload, c: Constraints, stage_ranks: int, nvlink_gpus: int) -> list[int]:
    """Expert-parallel sizes worth trying for a stage of `stage_ranks` ranks (tp·cp·dp): 1 for a
    dense model; for a mixture of experts the sizes that divide both the experts and the stage's
    ranks (Megatron-Core's parallel folding): of those inside the NVLink domain (which the
    token all-to-alls do not leave), the largest two, and the smallest two beyond it (fewer
    experts per rank: less memory and, where the host launches each local expert, less host
    time; slower all-to-alls: Megatron-Bridge runs Qwen3-235B-A22B on H100 at EP 32, four
    nodes); each is a layout of its own."""
    x = w.model.moe
    if x is None:
        return [1]
    if c.ep:
        return [c.ep] if stage_ranks % c.ep == 0 else []
    fits = [e for e in divisors(x.experts) if stage_ranks % e == 0]
    inside = [e for e in fits if e <= nvlink_gpus]
    beyond = [e for e in fits if e > nvlink_gpus]
    return sorted(set(inside[-2:] + beyond[:2]))


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
            # all-gather) and hold less: of none/zero1/zero2 only the most sharded is worth trying;
            # but DeepSpeed's ZeRO-2 reduces at every micro-batch (caps.dp_schedule), ZeRO-1 once
            # a step: with gradient accumulation both are.
            plain = [x for x in ("zero2", "zero1", "none") if x in shardings]
            keep = 2 if caps.dp_schedule == "zero-engine" else 1
            shardings = plain[:keep] + [x for x in shardings if x in ("hsdp", "zero3")]
        if nodes == 1 or "hsdp" not in shardings:
            shardings = [s for s in shardings if s != "hsdp"]
    recomputes = [c.recompute] if c.recompute else list(caps.recompute)
    if not c.recompute and not selective_frees_memory(w):
        # Megatron's selective recompute of the attention core only saves the a·s² scores, which
        # flash attention never keeps
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


def offered_pp(layers: int, pp: int, caps) -> bool:
    """Whether the search tries `pp` stages: an even split of the layers (stage_layers' first
    rules), or, where the framework can lay out any split (caps.pipeline_layout), a power of two
    with the last stage short (front_loaded: DeepSeek-V3's 61 layers over 4, 8, 16). Other
    uneven pipelines are for a recipe to pin (train.pp)."""
    return even_split(layers, pp) or (caps.pipeline_layout and pp & (pp - 1) == 0
                                      and front_loaded(layers, pp) is not None)


def virtual_stage_options(w: Workload, pp: int) -> list[int]:
    """Virtual pipeline stages per rank worth trying: 1, and when the framework interleaves, the
    counts that split the layers evenly (Megatron: a stage's layers, or with a layout every
    virtual stage but the last; torchtitan: the layers plus embedding and output over pp·v
    stages)."""
    if pp == 1 or not w.caps.interleaved:
        return [1]
    layers = w.model.layers
    layers_max = stage_layers(layers, pp)[1]
    if w.caps.pipeline_layout and not even_split(layers, pp):
        return [1] + [v for v in range(2, MAX_VIRTUAL_STAGES + 1) if front_loaded(layers, pp, v)]
    # the framework's own rule (its `problems`) filters the plans later
    return [1] + [v for v in range(2, MAX_VIRTUAL_STAGES + 1)
                  if layers_max % v == 0 or (layers + 2) % (pp * v) == 0]


def knob_cost(p: Plan) -> float:
    return KNOB_COST[("sharding", p.sharding)] + KNOB_COST[("recompute", p.recompute)] + KNOB_COST[("offload", p.offload)]


def faster(a: Candidate, b: Candidate) -> bool:
    """Higher tokens/s; ties (or no estimate) go to the cheaper memory knobs, then larger micro-batch."""
    if a.estimate and b.estimate and abs(a.tokens_per_s - b.tokens_per_s) > 1e-9 * b.tokens_per_s:
        return a.tokens_per_s > b.tokens_per_s
    return knob_cost(a.plan) < knob_cost(b.plan) or (
        knob_cost(a.plan) == knob_cost(b.plan) and a.plan.micro_batch_size > b.plan.micro_batch_size)


@dataclass(frozen=True)
class Layout:
    """One parallel layout with what its evaluation tries: micro-batch sizes (largest first),
    virtual stages and (sharding, recompute, offload, hsdp_shard) knobs (cheapest first)."""

    tp: int
    pp: int
    cp: int
    dp: int
    nodes: int
    gpus_per_node: int
    per_dp: int  # sequences per data-parallel rank and step
    micro_batches: tuple[int, ...]
    sequence_parallel: bool
    layers_max: int
    virtual_stages: tuple[int, ...]
    knobs: tuple[tuple, ...]
    ep: int = 1

    @property
    def key(self) -> tuple[int, ...]:
        return self.tp, self.pp, self.cp, self.dp, self.nodes, self.gpus_per_node, self.ep

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


@dataclass
class Outcome:
    """A layout's evaluation: its fastest plan that fits, every plan that fits (in the order
    found), and what the search reports of it (memory checks, rejections, the least memory)."""

    best: Candidate | None = None
    every: list[Candidate] = field(default_factory=list)
    considered: int = 0
    feasible: int = 0
    rejected: Counter = field(default_factory=Counter)
    closest: Candidate | None = None  # the smallest-memory plan that did not fit (the first of equals)
    smallest: dict = field(default_factory=dict)  # (dimension, value) -> least memory seen (bytes)
    refused: Counter = field(default_factory=Counter)  # the framework's first reason -> plans it refused


class Evaluations:
    """The layouts of (workload, target, constraints, steps), their bounds and their outcomes,
    each computed once. `pinned` gives the space with more dimensions pinned, sharing what was
    already evaluated."""

    def __init__(self, w: Workload, t: Target, c: Constraints, steps: int | None = None, _shared: dict | None = None,
                 floor: float | None = None, sizes: dict | None = None, every: bool = False):
        """`floor` (tokens/s): only plans faster than it are wanted (a search for one that is:
        search's faster_than); a knob setting that cannot reach it is not searched, so the
        outcomes are of plans above it only and are not for other searches. `sizes`: plan ->
        memory, shared by spaces that differ only in the GPU's memory (a plan's bytes do not
        depend on it: only what is usable). `every`: a layout's outcome keeps every plan that
        fits (search's keep_all); otherwise a knob setting whose bound cannot beat the layout's
        fastest plan found so far is not searched (a search ranks each layout by its fastest)."""
        self.w, self.t, self.c, self.steps, self.floor, self.sizes = w, t, c, steps, floor, sizes
        # what a derived space (pinned) shares: outcomes and bounds by layout, memory by plan,
        # layouts by their dimensions
        self._shared = _shared if _shared is not None else {"outcomes": {}, "bounds": {}, "detailed": {}, "layouts": {},
                                                            "every": every}
        self.every = self._shared["every"]
        self._outcomes, self._bounds, self._detailed = (self._shared[k] for k in ("outcomes", "bounds", "detailed"))
        self._layouts: list[Layout] | None = None
        self.without_knobs = 0  # layouts left out: no HSDP group divides their dp·cp

    def matches(self, w: Workload, t: Target, c: Constraints, steps: int | None) -> bool:
        return (self.w, self.t, self.c, self.steps) == (w, t, c, steps)

    def pinned(self, nodes: int | None = None, **dims) -> Evaluations:
        """The same space with some of LAYOUT_PINS set, or on a partition of `nodes` nodes;
        evaluations are shared with this one (a layout's outcome reads neither)."""
        if self.floor is not None:
            raise ValueError("evaluations above a floor are for that one search")
        if set(dims) - set(LAYOUT_PINS):
            raise ValueError(f"only {', '.join(LAYOUT_PINS)} can be pinned on shared evaluations, not {sorted(dims)}")
        t = self.t if nodes is None else replace(self.t, nodes=nodes)
        return Evaluations(self.w, t, replace(self.c, **dims), self.steps, self._shared)

    @property
    def layouts(self) -> list[Layout]:
        """Every valid layout, in the order `layouts()` yields them."""
        if self._layouts is None:
            self._layouts = list(self._build())
        return self._layouts

    def _build(self):
        known = self._shared["layouts"]  # key -> Layout, or None when no knob setting is left
        for key in layouts(self.w, self.t, self.c):
            if key not in known:
                known[key] = self._layout(*key)
            layout = known[key]
            if layout is None:
                self.without_knobs += 1
                continue
            yield layout

    def _layout(self, tp: int, pp: int, cp: int, dp: int, nodes: int, gpn: int, ep: int = 1) -> Layout | None:
        w, c = self.w, self.c
        memo = self._shared.setdefault("parts", {})  # divisors, virtual stages and knobs repeat across layouts
        per_dp = w.global_batch_size // dp
        mbss = (c.micro_batch_size,) if c.micro_batch_size else memo.get(("mbs", per_dp))
        if mbss is None:
            mbss = memo[("mbs", per_dp)] = tuple(sorted(divisors(per_dp), reverse=True))
        sp = (tp > 1 and w.caps.sequence_parallel != "no") if c.sequence_parallel is None else c.sequence_parallel
        vs = [c.virtual_stages] if c.virtual_stages else memo.get(("v", pp))
        if vs is None:
            vs = memo[("v", pp)] = virtual_stage_options(w, pp)
        if len(vs) > 1 and (pp - 1) / (per_dp + pp - 1) < SMALL_BUBBLE:
            # with this many micro-batches the bubble is negligible: interleaving cannot pay, but
            # for what Megatron's combined 1F1B schedule needs under PP (frameworks.ep_overlap): the
            # fewest virtual stages, with which the experts' all-to-alls hide under the compute
            vs = [1, vs[1]] if ep > 1 and w.caps.ep_overlap and w.ep_overlap is not False else [1]
        knobs = memo.get(("knobs", dp * cp, nodes, gpn, tp))
        if knobs is None:
            knobs = memo[("knobs", dp * cp, nodes, gpn, tp)] = tuple(knob_options(w, c, dp * cp, nodes, gpn, tp))
        if not knobs:
            return None
        return Layout(tp, pp, cp, dp, nodes, gpn, per_dp, mbss, sp, stage_layers(w.model.layers, pp)[1], tuple(vs), knobs,
                      ep)

    def bound(self, layout: Layout, objective: str) -> float:
        """An optimistic estimate of the layout's metric for `objective` (bigger is better): its
        best tokens/s ("time") or tokens/s per GPU with no recompute and no offload, for each
        sharding on offer (the model can overlap ZeRO-3's traffic better than DDP's all-reduce),
        the fewest and most virtual stages and the largest, smallest and middle micro-batch; for
        "gpus", minus its GPUs."""
        if objective == "gpus" or self.t.links is None:
            return -float(layout.world)
        per_gpu, tokens = self._bounds.get(layout.key) or self._bound(layout)
        return tokens if objective == "time" else per_gpu

    def _bound(self, L: Layout) -> tuple[float, float]:
        w, t = self.w, self.t
        per_gpu = tokens = 0.0
        tps = w.global_batch_size * w.seq_len  # tokens per step
        mbss, vs = L.micro_batches, L.virtual_stages
        for sh, hs in {(k[0], k[3]) for k in L.knobs}:
            for v in {vs[0], vs[-1]}:
                for mbs in {mbss[0], mbss[-1], mbss[len(mbss) // 2]}:
                    shape = StepShape(L.tp, L.pp, L.cp, L.dp, L.gpus_per_node, L.world, sh, mbs, L.per_dp // mbs,
                                      L.sequence_parallel, v, hs, ep=L.ep)
                    # as StepEstimate computes them: tokens / step, and that / world
                    step = step_time(w, shape, t.links, t.nvlink_gpus)
                    tokens = max(tokens, tps / step)
                    per_gpu = max(per_gpu, tps / step / L.world)
        self._bounds[L.key] = per_gpu, tokens
        return per_gpu, tokens

    def memory(self, plan: Plan) -> MemoryBreakdown:
        """The plan's memory term by term (each search reports its winner so)."""
        got = self._detailed.get(plan)
        if got is None:
            got = self._detailed[plan] = estimate(self.w, self.t.gpu_memory_bytes, plan, self.t.host_mem_bytes)
        return got

    def time_bound_above(self, layout: Layout, floor: float) -> bool:
        """Whether the layout's "time" bound may reach `floor` tokens/s, decided where it can be
        from its pipeline alone (pipeline_time: no sharding or framework term, so shared by every
        framework's search of the same workload) before its bound is computed."""
        w, L = self.w, layout
        tps = w.global_batch_size * w.seq_len
        mbss, vs = L.micro_batches, L.virtual_stages
        for v in {vs[0], vs[-1]}:
            for mbs in {mbss[0], mbss[-1], mbss[len(mbss) // 2]}:
                shape = StepShape(L.tp, L.pp, L.cp, L.dp, L.gpus_per_node, L.world, "none", mbs, L.per_dp // mbs,
                                  L.sequence_parallel, v, ep=L.ep)
                if tps / pipeline_time(w, shape, self.t.links, self.t.nvlink_gpus) >= floor:
                    return self.bound(layout, "time") >= floor
        return False

    def outcome(self, layout: Layout) -> Outcome:
        got = self._outcomes.get(layout.key)
        if got is None:
            got = self._outcomes[layout.key] = _evaluate(self, layout)
        return got


def _evaluate(ev: Evaluations, L: Layout) -> Outcome:
    """Find the fastest plan of one layout that fits: for each virtual-stage count and knob
    setting (cheapest first), the micro-batches that fit (_fitting_microbatches). Offload is
    tried only when nothing fits without it, recomputation only when the largest micro-batch
    does not fit without it."""
    w, t, c = ev.w, ev.t, ev.c
    out = Outcome()
    gbs = w.global_batch_size

    seen: dict = {}  # the bisections ask for some plans twice

    def check(plan: Plan) -> MemoryBreakdown:
        out.considered += 1
        mem = seen.get(plan)
        if mem is None:
            mem = seen[plan] = _sized(ev, plan)
        for dim in ("tp", "pp", "cp", "dp", "sharding", "recompute", "offload"):
            key = (dim, getattr(plan, dim))
            if key not in out.smallest or mem.total_bytes < out.smallest[key]:
                out.smallest[key] = mem.total_bytes
        if not mem.fits:
            out.rejected["host memory" if mem.fits_gpu else "GPU memory"] += 1
            if out.closest is None or mem.total_bytes < out.closest.memory.total_bytes:
                out.closest = Candidate(plan, mem)
        return mem

    def make(mbs, v, sh, rc, of, hs, n_rc=0):
        return Plan(L.nodes, L.gpus_per_node, L.tp, L.pp, L.dp, L.cp, sh, mbs, L.per_dp // mbs, gbs, rc, of,
                    L.sequence_parallel, v, hs, n_rc, L.ep)

    mbss = L.micro_batches
    # Cheapest test first: the least GPU memory this layout can reach (the last knob setting,
    # micro-batch 1, no interleaving). If that does not fit the GPU, nothing here will. Its host
    # memory is no floor: offload is what fills the host, so a setting without it may still fit.
    if not check(make(mbss[-1], L.virtual_stages[0], *L.knobs[-1])).fits_gpu:
        return out
    # Settings whose smallest micro-batch does not fit the GPU without interleaving: with more
    # virtual stages more is in flight and more is received (memory.pipeline_in_flight and the
    # receive buffers grow with v, nothing shrinks), so it does not fit with them either.
    too_big: set = set()
    for v in L.virtual_stages:
        fits_without_offload = False
        roomy = set()  # (sharding, offload) settings where no recompute fits the largest micro-batch
        for knob in L.knobs:
            sh, rc, of, hs = knob
            if of != "none" and fits_without_offload and not c.offload:
                continue  # offload only when nothing else fits: it is always slower
            if rc != "none" and (sh, of) in roomy and not c.recompute:
                continue  # recomputation only when the activations do not fit otherwise
            if ev.floor is not None and _knob_bound(ev, L, v, sh, rc, of, hs) < ev.floor:
                continue  # no plan of this setting is as fast as wanted
            if not ev.every and out.best is not None and out.best.estimate is not None \
                    and _knob_bound(ev, L, v, sh, rc, of, hs) < out.best.tokens_per_s * (1 - 1e-9):
                out.considered += 1
                out.rejected["slower than the best (bound)"] += 1
                continue  # no plan of this setting beats the layout's fastest so far (faster())
            if knob in too_big:  # the check its smallest micro-batch would fail, as it would fail it
                out.considered += 1
                out.rejected["GPU memory"] += 1
                continue
            worth = None if ev.every or t.links is None else \
                (lambda mbs, v=v, sh=sh, rc=rc, of=of, hs=hs: _may_beat(ev, L, out, mbs, v, sh, rc, of, hs))
            for mbs, n_rc, mem in _fitting_microbatches(w, check, make, mbss, v, sh, rc, of, hs, L.layers_max, c,
                                                        worth):
                if of == "none":
                    fits_without_offload = True
                if rc == "none" and mbs == mbss[0]:
                    roomy.add((sh, of))
                plan = make(mbs, v, sh, rc, of, hs, n_rc)
                problems = w.framework.problems(plan, w)
                if problems:
                    out.rejected["the framework refuses it"] += 1
                    out.refused[problems[0]] += 1
                    continue  # e.g. an interleaved schedule whose micro-batches do not divide
                est = estimate_step(w, plan, t.links, t.nvlink_gpus, ev.steps) if t.links else None
                cand = Candidate(plan, mem, est, plan.gpus_per_node == t.gpus_per_node)
                out.feasible += 1
                out.every.append(cand)
                if out.best is None or faster(cand, out.best):
                    out.best = cand
            if v == L.virtual_stages[0]:
                floor = seen.get(make(mbss[-1], v, sh, rc, of, hs))  # its first check
                if floor is not None and not floor.fits_gpu:
                    too_big.add(knob)
    return out


def _sized(ev: Evaluations, plan: Plan) -> MemoryBreakdown:
    """The plan's memory (without formulas), from the spaces that share `sizes` when one of them
    has it: their GPUs differ in memory only, so only what is usable changes."""
    t = ev.t
    if ev.sizes is None:
        return estimate(ev.w, t.gpu_memory_bytes, plan, t.host_mem_bytes, detail=False)
    known = ev.sizes.get(plan)
    if known is None:
        known = ev.sizes[plan] = estimate(ev.w, t.gpu_memory_bytes, plan, t.host_mem_bytes, detail=False)
        return known
    usable = int(t.gpu_memory_bytes - ev.w.overheads.safety_margin_gib * GIB)  # as memory._breakdown
    return known._replace(gpu_usable_bytes=usable)


def _knob_bound(ev: Evaluations, L: Layout, v: int, sh: str, rc: str, of: str, hs: int) -> float:
    """At least the tokens/s of any plan of this layout with these knobs. Its step is at least
    its micro-batches through the slowest stage, with no bubble, no sends and no data-parallel
    communication, plus the optimizer step and offload; the stage's time per sequence only falls
    as micro-batches grow (larger GEMMs, as many kernels), and so does the offload's per step:
    the largest micro-batch gives the least. With the fewest recomputed layers block recompute
    allows (less recomputation is never slower)."""
    w, t = ev.w, ev.t
    n_rc = 1 if rc == "full" and L.layers_max > 1 and not ev.c.recompute and w.caps.recompute_layers else 0
    mbs = L.micro_batches[0]
    shape = StepShape(L.tp, L.pp, L.cp, L.dp, L.gpus_per_node, L.world, sh, mbs, L.per_dp // mbs,
                      L.sequence_parallel, v, hs, rc, n_rc, of, L.ep)
    least = shape.grad_accum_steps * stage_time(w, shape, t.links, t.nvlink_gpus) + host_side_time(w, shape, t.links)
    return w.global_batch_size * w.seq_len / least


def _may_beat(ev: Evaluations, L: Layout, out: Outcome, mbs: int, v: int, sh: str, rc: str, of: str, hs: int) -> bool:
    """Whether a plan of this layout, micro-batch and knobs may be faster than the layout's
    fastest so far (faster(): more tokens/s, ties to the cheaper knobs). Its step is at least
    its pipeline (the micro-batches through the slowest stage, their sends and the bubble:
    pipeline_time) plus the optimizer step and offload, all but the data-parallel term, with the
    fewest recomputed layers block recompute allows (less recomputation is never slower)."""
    best = out.best
    if best is None or best.estimate is None:
        return True
    w, t = ev.w, ev.t
    n_rc = 1 if rc == "full" and L.layers_max > 1 and not ev.c.recompute and w.caps.recompute_layers else 0
    shape = StepShape(L.tp, L.pp, L.cp, L.dp, L.gpus_per_node, L.world, sh, mbs, L.per_dp // mbs,
                      L.sequence_parallel, v, hs, rc, n_rc, of, L.ep)
    least = pipeline_time(w, shape, t.links, t.nvlink_gpus) + host_side_time(w, shape, t.links)
    return w.global_batch_size * w.seq_len / least >= best.tokens_per_s * (1 - 1e-9)


def _fitting_microbatches(w, check, make, mbss, v, sh, rc, of, hs, layers_max, c, worth=None):
    """Yield (micro_batch_size, recompute_layers, memory) for the micro-batches that fit with
    these knobs, largest first, each with the fewest recomputed layers that fit; with `worth`
    (micro-batch -> bool), only those it says may beat what was found so far.

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
    if plan0.pp == 1 and w.model.moe is not None and lo + 1 < len(mbss):
        # a mixture of experts: the host launches and the all-to-alls per micro-batch weigh
        # against the GEMMs' size, and the next smaller micro-batch can be faster (gpt-oss on 64
        # GB200s: 4 sequences, as Megatron-Bridge runs it, against 5)
        picks.append(lo + 1)
    if plan0.pp > 1:
        for i in range(lo + 1, len(mbss)):
            m_prev = plan0.global_batch_size // (plan0.dp * mbss[i - 1])
            if (plan0.pp - 1) / (v * m_prev + plan0.pp - 1) < SMALL_BUBBLE:
                break
            picks.append(i)
    for i in picks:
        mbs = mbss[i]
        if worth is not None and not worth(mbs):
            continue
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
