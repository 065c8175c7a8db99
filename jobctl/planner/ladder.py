"""The OOM ladder: after a CUDA out-of-memory, the next smaller plan to try (pure).

A plan that ran out of memory says two things: this layout is too big, and the memory
model under-predicted what this cluster can hold (the plan fitted the model, or it would
not have been submitted). So the next plan must predict strictly less than the failed
one, keep the global batch, and fit under a *learned* limit that is lower than the one
the model used (see `learned_usable_bytes`).

Rungs, in order (docs/architecture.md, decision 3); a step changes one rung:

1. micro-batch: a smaller micro_batch_size with more gradient accumulation, same dp:
   the largest one that fits among those at most half the current one.
2. recompute: none -> selective (eager attention only: it drops the a·s² scores) ->
   full recompute of a quarter, half, three quarters of a stage's layers (block
   recompute, Plan.recompute_layers) -> all of them (recompute_layers 0); the least
   that fits.
3. sharding, then parallelism: none -> zero1 -> zero2 -> hsdp -> zero3, those the
   framework offers (memory.SHARDINGS), the next one that fits; then tp (inside a node),
   pp or cp (Megatron-LM, torchtitan) larger by a whole factor, on the same GPUs (dp
   shrinks, grad_accum_steps grows), then on more GPUs of the same partition (dp and
   grad_accum_steps kept), fewest GPUs first. A pinned tp, pp, cp or dp stays.
4. offload: optimizer states, then parameters too (ZeRO-3/HSDP only; not Megatron).

When no single rung fits the learned limit, rungs are combined (the fewest, the lowest,
each as weak as the limit allows) and the step's `rung` names all of them, e.g.
"micro-batch+recompute". Pins on micro_batch_size, recompute, sharding and offload are
what the ladder exists to override.

Bounded: every step predicts at least 2% less than the one before (the minimum margin),
and no knob ever moves back: the micro-batch at least halves, recompute climbs a
quarter of the layers or more, sharding only grows, tp·pp·cp at least doubles, offload
only grows. So a ladder from micro-batch b on a model with L layers and g GPUs per node
has at most log2(b) + 5 + 4 + log2(g) + log2(L) + log2(MAX_CP) + 2 steps (no cp term
where the framework has no context parallelism).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace

from jobctl.planner.catalog import GIB
from jobctl.planner.memory import SHARDINGS, MemoryBreakdown, Workload, estimate, stage_layers
from jobctl.planner.plan import Plan
from jobctl.planner.search import CP_FRAMEWORKS, MAX_CP, SP_FRAMEWORKS, Constraints, Target, divisors

# An OOM of a plan predicted at P teaches that less than P is usable: aim at least this
# fraction of P lower, or lower by the failed allocation when that is larger.
MIN_MARGIN_FRACTION = 0.02

# Sharding from least to most sharded; hsdp shards weights too but only inside a node.
SHARDING_ORDER = ("none", "zero1", "zero2", "hsdp", "zero3")
RUNGS = ("micro-batch", "recompute", "sharding", "parallelism", "offload")


@dataclass(frozen=True)
class OOMInfo:
    """Figures from PyTorch's OOM message and the job's monitor; any may be unknown.

    "Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.14 GiB of which
    1.2 GiB is free" gives tried_to_allocate_bytes, total_capacity_bytes and free_bytes;
    measured_peak_bytes is the highest use the monitor saw before the failure.
    """

    tried_to_allocate_bytes: int | None = None
    total_capacity_bytes: int | None = None
    free_bytes: int | None = None
    measured_peak_bytes: int | None = None


@dataclass(frozen=True)
class LadderStep:
    """The next plan, its predicted memory, which rung produced it and why."""

    plan: Plan
    memory: MemoryBreakdown
    rung: str  # one of RUNGS, or several joined by "+" when no single rung fits
    reason: str
    usable_bytes: int  # the learned limit the plan's predicted peak stays under


def learned_usable_bytes(w: Workload, t: Target, failed_peak_bytes: int, failure: OOMInfo | None = None) -> int:
    """Predicted bytes a plan may reach on this cluster after a plan predicted at P OOMed.

    The minimum of:
    1. the model's own limit, gpu_memory_bytes − safety margin (what `fits` uses), and
       total_capacity − safety margin when the driver reported a smaller total;
    2. P − margin, margin = max(tried_to_allocate, 2% of P): the failed plan did not fit,
       so the usable memory, in the model's units, is below P; at the failure at least
       `tried` more bytes were wanted than were there;
    3. capacity − safety margin − u, where u = max(0, D − P) is how much the model
       under-predicted: the real demand at the failure was at least
       D = max(total_capacity − free + tried, measured_peak) (each term when known).
       The error is assumed to carry over additively to the next plan of the same
       workload: a plan predicted at Q needs about Q + u, which must stay under the
       capacity. (This binds over rule 2 only when free < safety margin.)
    """
    p = failed_peak_bytes
    f = failure or OOMInfo()
    safety = int(w.overheads.safety_margin_gib * GIB)
    capacity = t.gpu_memory_bytes
    if f.total_capacity_bytes:
        capacity = min(capacity, f.total_capacity_bytes)
    limit = capacity - safety
    margin = max(f.tried_to_allocate_bytes or 0, math.ceil(MIN_MARGIN_FRACTION * p))
    limit = min(limit, p - margin)
    demand = 0
    if f.total_capacity_bytes is not None and f.free_bytes is not None and f.tried_to_allocate_bytes is not None:
        demand = f.total_capacity_bytes - f.free_bytes + f.tried_to_allocate_bytes
    if f.measured_peak_bytes is not None:
        demand = max(demand, f.measured_peak_bytes)
    under = max(0, demand - p)
    if under:
        limit = min(limit, capacity - safety - under)
    return int(limit)


def next_plan(w: Workload, t: Target, c: Constraints, failed: Plan, failure: OOMInfo | None = None,
              history: tuple[Plan, ...] = ()) -> LadderStep | None:
    """The next plan to try after `failed` ran out of GPU memory, or None: nothing smaller fits.

    The plan predicts strictly less than `failed`, keeps its global_batch_size, fits under
    `learned_usable_bytes` (and the host RAM), is none of `history` and passes Plan.check().
    A tp, pp, dp or cp pinned in `c` keeps the failed plan's value. ValueError if `failed`
    itself does not add up.
    """
    problems = failed.check()
    if not stage_layers(w.model.layers, failed.pp):
        problems.append(f"pp={failed.pp} cannot split {w.model.layers} layers")
    if failed.global_batch_size != w.global_batch_size:
        problems.append(f"plan global_batch_size({failed.global_batch_size}) != workload "
                        f"global_batch_size({w.global_batch_size})")
    if problems:
        raise ValueError("cannot step down from an invalid plan: " + "; ".join(problems))
    peak = _memory(w, t, failed).total_bytes
    limit = learned_usable_bytes(w, t, peak, failure)
    seen = set(history) | {failed}

    def fitting(plan: Plan) -> MemoryBreakdown | None:
        if plan in seen or not _valid(w, t, c, failed, plan):
            return None
        mem = _memory(w, t, plan)
        if mem.total_bytes < peak and mem.total_bytes <= limit and mem.fits_host:
            return mem
        return None

    def step(plan: Plan, mem: MemoryBreakdown, rungs: list[str]) -> LadderStep:
        changes = ", ".join(f"{k} {a} -> {b}" for k, a, b in _diff(failed, plan))
        why = (f"{changes}: predicted {mem.total_bytes / GIB:.2f} GiB <= learned usable {limit / GIB:.2f} GiB "
               f"(the failed plan predicted {peak / GIB:.2f} GiB; global batch {plan.global_batch_size} kept)")
        if len(rungs) > 1:
            why += "; no single rung fits, so rungs are combined"
        return LadderStep(plan, mem, "+".join(rungs), why, limit)

    # One rung: the first rung with a plan that fits, its smallest change.
    for name, options in _RUNG_OPTIONS:
        for plan in options(w, t, c, failed):
            mem = fitting(plan)
            if mem is not None:
                return step(plan, mem, [name])

    # Combined: every subset of rungs, each at a few of its settings (_combinations), the
    # fewest rungs first, then the lowest last rung, then the weakest settings, later rungs first.
    best = None
    for plan, choices in _combinations(w, t, c, failed):
        if len(choices) > 1 and (mem := fitting(plan)) is not None:
            key = (len(choices), [r for r, _ in reversed(choices)], [i for _, i in reversed(choices)])
            if best is None or key < best[0]:
                best = (key, plan, mem, [_RUNG_OPTIONS[r][0] for r, _ in choices])
    if best is not None:
        return step(best[1], best[2], best[3])
    return None


def ladder(w: Workload, t: Target, c: Constraints, start: Plan, failure: OOMInfo | None = None,
           max_steps: int = 50) -> list[LadderStep]:
    """Every step of the ladder from `start` (which OOMed with `failure`), each later step as
    if its predecessor had OOMed too (no figures), until nothing smaller fits or max_steps."""
    steps: list[LadderStep] = []
    plan, fail, history = start, failure, ()
    for _ in range(max_steps):
        s = next_plan(w, t, c, plan, fail, history)
        if s is None:
            break
        steps.append(s)
        history += (plan,)
        plan, fail = s.plan, None
    return steps


# --- the rungs: candidate plans, smallest change first ------------------------------------------

def _microbatch_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    """At most half the micro-batch (so a ladder halves it at least each time), largest first."""
    per_dp = p.global_batch_size // p.dp
    for mbs in sorted(divisors(per_dp), reverse=True):
        if 2 * mbs <= p.micro_batch_size:
            yield replace(p, micro_batch_size=mbs, grad_accum_steps=per_dp // mbs)


def _recompute_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    """Selective (eager attention), then full recompute of a quarter, half, three quarters and
    all of a stage's layers. Quarters rather than every layer count: each step lowers the
    activations by a useful amount, and a ladder crosses the range in at most four steps."""
    layers = stage_layers(w.model.layers, p.pp)[1]  # the most layers a stage holds
    if p.recompute == "none" and w.attention == "eager":
        yield replace(p, recompute="selective", recompute_layers=0)
    if p.recompute == "full" and not p.recompute_layers:
        return
    done = p.recompute_layers if p.recompute == "full" else 0
    for n in sorted({math.ceil(k * layers / 4) for k in (1, 2, 3)}):
        if done < n < layers:
            yield replace(p, recompute="full", recompute_layers=n)
    yield replace(p, recompute="full", recompute_layers=0)


def _hsdp_shard(tp: int, dp: int, cp: int, gpn: int) -> int | None:
    """Ranks an HSDP group shards over (inside a node, as the search chooses), or None."""
    group = dp * cp
    hs = max(1, min(group, gpn // tp))
    return hs if group % hs == 0 else None


def _sharding_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    if p.dp * p.cp == 1 or p.sharding not in SHARDING_ORDER:
        return  # nothing to shard over
    offered = SHARDINGS[w.framework]
    for sh in SHARDING_ORDER[SHARDING_ORDER.index(p.sharding) + 1:]:
        if sh not in offered:
            continue
        if sh == "hsdp":
            hs = _hsdp_shard(p.tp, p.dp, p.cp, p.gpus_per_node)
            if p.nodes == 1 or hs is None or hs >= p.dp * p.cp:
                continue  # one node, or the same as zero3
            yield replace(p, sharding=sh, hsdp_shard=hs)
        else:
            yield replace(p, sharding=sh, hsdp_shard=0)


def _parallel_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    """Larger tp, pp or cp: first on the same GPUs (dp shrinks), then on more of the
    partition (dp kept), fewest GPUs first."""
    m = w.model
    # One dimension at a time, by a whole factor of at least 2 (so tp·pp·cp at least doubles
    # each step): a larger tp (inside a node) first, then pp, then cp (Megatron-LM, torchtitan).
    moves = []
    if c.tp is None:
        moves += [(x, p.pp, p.cp) for x in divisors(t.gpus_per_node)
                  if x > p.tp and x % p.tp == 0 and m.heads % x == 0 and m.kv_heads % x == 0]
    if c.pp is None:
        moves += [(p.tp, x, p.cp) for x in range(2 * p.pp, m.layers + 1, p.pp) if stage_layers(m.layers, x)]
    if c.cp is None and w.framework in CP_FRAMEWORKS:
        moves += [(p.tp, p.pp, x) for x in range(2 * p.cp, MAX_CP + 1, p.cp) if w.seq_len % (2 * x) == 0]
    # same GPUs: tp·pp·cp grows by k, dp shrinks by k
    if c.dp is None:
        for tp, pp, cp in moves:
            k, rest = divmod(tp * pp * cp, p.tp * p.pp * p.cp)
            if rest == 0 and p.dp % k == 0:
                q = _relayout(w, c, p, tp, pp, cp, p.dp // k, p.nodes, p.gpus_per_node)
                if q is not None:
                    yield q
    # more GPUs of the same partition: dp and grad_accum_steps stay; fewest GPUs first
    max_gpus = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
    grown = []
    for i, (tp, pp, cp) in enumerate(moves):
        world = tp * pp * cp * p.dp
        if world <= p.world_size or world > max_gpus:
            continue
        if world <= t.gpus_per_node:
            if t.gpus_per_node % world:
                continue  # a partial node: a divisor of the node's GPUs, as the search uses
            nodes, gpn = 1, world
        elif world % t.gpus_per_node == 0:
            nodes, gpn = world // t.gpus_per_node, t.gpus_per_node
        else:
            continue
        grown.append((world, i, tp, pp, cp, nodes, gpn))
    for world, _, tp, pp, cp, nodes, gpn in sorted(grown):
        q = _relayout(w, c, p, tp, pp, cp, p.dp, nodes, gpn)
        if q is not None:
            yield q


def _relayout(w: Workload, c: Constraints, p: Plan, tp: int, pp: int, cp: int, dp: int, nodes: int,
              gpn: int) -> Plan | None:
    """`p` with a new tp·pp·cp·dp layout and the same global batch and micro-batch."""
    if tp > gpn:
        return None  # tensor parallelism stays inside a node
    per_dp = p.global_batch_size // dp
    sp = p.sequence_parallel
    if tp != p.tp and c.sequence_parallel is None:
        sp = tp > 1 and w.framework in SP_FRAMEWORKS
    v = p.virtual_stages if pp == p.pp else (c.virtual_stages if c.virtual_stages > 1 and pp > 1 else 1)
    n_rc = p.recompute_layers
    if n_rc and n_rc >= stage_layers(w.model.layers, pp)[1]:
        n_rc = 0  # block recompute of at least a whole stage: all of it
    hs = p.hsdp_shard
    if p.sharding == "hsdp":
        hs = _hsdp_shard(tp, dp, cp, gpn)
        if hs is None:
            return None
    return replace(p, nodes=nodes, gpus_per_node=gpn, tp=tp, pp=pp, cp=cp, dp=dp, sequence_parallel=sp,
                   virtual_stages=v, hsdp_shard=hs, recompute_layers=n_rc,
                   grad_accum_steps=per_dp // p.micro_batch_size)


def _offload_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    if w.framework == "megatron" and c.offload in (None, "none"):
        return  # as in the search: Megatron-LM is offered offload only when the recipe asks for it
    params_ok = p.sharding in ("zero3", "hsdp")
    if p.offload == "none":
        yield replace(p, offload="optimizer")
    if p.offload in ("none", "optimizer") and params_ok:
        yield replace(p, offload="optimizer+params")


_RUNG_OPTIONS: tuple[tuple[str, Callable[..., Iterator[Plan]]], ...] = (
    ("micro-batch", _microbatch_options),
    ("recompute", _recompute_options),
    ("sharding", _sharding_options),
    ("parallelism", _parallel_options),
    ("offload", _offload_options),
)


# In combinations, at most this many settings of a rung (its weakest first).
COMBINED_OPTIONS = 6


def _combinations(w: Workload, t: Target, c: Constraints, failed: Plan) -> list[tuple[Plan, tuple]]:
    """The failed plan with any subset of the rungs applied in rung order, each at one of its
    first COMBINED_OPTIONS settings (the micro-batch: halving steps only), with the
    (rung index, setting index) choices that made it. A few thousand plans at most."""
    combos: list[tuple[Plan, tuple]] = [(failed, ())]
    for r, (name, options) in enumerate(_RUNG_OPTIONS):
        grown = []
        for base, choices in combos:
            opts = [p for p in options(w, t, c, base) if _valid(w, t, c, failed, p)]
            if name == "micro-batch":  # the largest micro-batch at most 1/2, 1/4, 1/8 ... of it
                opts = [p for k, p in enumerate(opts) if k == 0
                        or _halvings(p.micro_batch_size, base) != _halvings(opts[k - 1].micro_batch_size, base)]
            grown += [(p, choices + ((r, i),)) for i, p in enumerate(opts[:COMBINED_OPTIONS])]
        combos += grown
    return combos


def _halvings(mbs: int, base: Plan) -> int:
    return int(math.log2(base.micro_batch_size / mbs))


def _valid(w: Workload, t: Target, c: Constraints, failed: Plan, p: Plan) -> bool:
    """Arithmetic, divisibility, the partition, the framework and the pins of tp/pp/dp/cp."""
    m = w.model
    if p.check() or p.global_batch_size != failed.global_batch_size:
        return False
    if m.heads % p.tp or m.kv_heads % p.tp or p.tp > p.gpus_per_node or not stage_layers(m.layers, p.pp):
        return False
    if p.sharding not in SHARDINGS[w.framework] and p.sharding != failed.sharding:
        return False
    if p.nodes > t.nodes or p.gpus_per_node > t.gpus_per_node:
        return False
    if c.max_nodes is not None and p.nodes > max(c.max_nodes, failed.nodes):
        return False
    for dim in ("tp", "pp", "dp", "cp"):
        if getattr(c, dim) is not None and getattr(p, dim) != getattr(failed, dim):
            return False
    if p.virtual_stages > 1:
        layers = stage_layers(m.layers, p.pp)[1]
        if p.pp == 1 or layers % p.virtual_stages or p.grad_accum_steps % p.pp:
            return False
    return True


def _memory(w: Workload, t: Target, p: Plan) -> MemoryBreakdown:
    return estimate(w, t.gpu_memory_bytes, p, t.host_mem_bytes, detail=False)


def _diff(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    return [(f.name, getattr(a, f.name), getattr(b, f.name)) for f in fields(Plan)
            if getattr(a, f.name) != getattr(b, f.name)]
