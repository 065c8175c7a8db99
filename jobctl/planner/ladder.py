"""The OOM ladder: after a CUDA out-of-memory, the next smaller plan to try (pure).

An OOM is evidence that the memory model was wrong for this job, and the evidence wins.
Each failure gives a point: the model predicted P bytes for the failed plan, the failure
showed a demand of at least D (PyTorch's message: memory in use + the allocation it tried;
else the sampler's peak; else the GPU's capacity). The gap D − P is attributed to the terms
that the rungs below change, not kept as a constant:

    calibrated(plan) = P(plan) + β + γ · S(plan)

where S is the model's activations and logits (they scale with the micro-batch and shrink
with recomputation and model parallelism). One point gives γ = (D − P)/S, β = 0; two or
more at different S separate an unmodelled part that does not scale (a leak, a fixed buffer:
β) from one that does (γ), and every point stays explained (calibrated >= D).

Rungs, in order (docs/architecture.md, decision 3); a step changes one rung:

1. micro-batch: a smaller micro_batch_size with more gradient accumulation, same dp:
   the largest one among those at most half the current one.
2. recompute: none -> selective (where it frees memory: the a·s² scores of eager attention,
   torchtitan's op-level SAC, Megatron's MLA up-projection or experts' SwiGLU) ->
   full recompute of a quarter, half, three quarters of a stage's layers (block
   recompute, Plan.recompute_layers) -> all of them (recompute_layers 0).
3. sharding, then parallelism: none -> zero1 -> zero2 -> hsdp -> zero3, those the
   framework offers, then a mixture of experts' ep larger by a whole factor (its experts over
   more of the same ranks), then tp (inside a node), pp or cp larger by a whole factor, on the same
   GPUs (dp shrinks, grad_accum_steps grows), then on more GPUs of the same partition (dp and
   grad_accum_steps kept), fewest GPUs first. A pinned tp, pp, cp or dp stays.
4. offload: optimizer states, then parameters too (ZeRO-3/HSDP only; not Megatron).

The step taken is the first rung option whose *calibrated* prediction fits the usable
memory; when no single rung fits, rungs are combined (the fewest, the lowest, each as weak
as it can be). When even the strongest combination is not predicted to fit, the ladder does
not stop: its own prediction has just been refuted, so it takes the step that needs the least
(by the calibrated model) and lets the next run be the evidence. It stops only at the real
bottom -- nothing left that predicts less -- or at the job's attempt limit (jobs/recovery.py).

Bounded: every step's plan predicts strictly less than the failed one (by the model and by
the calibration) and no knob ever moves back: the micro-batch at least halves, recompute
climbs, sharding only grows, tp·pp·cp at least doubles, offload only grows. So a ladder from
micro-batch b on a model with L layers and g GPUs per node has at most log2(b) + 5 + 4 +
log2(g) + log2(L) + log2(MAX_CP) + 2 steps. A mixture of experts' ep at least doubles on its
own step; a relayout that leaves it not dividing the stage's ranks lowers it to a divisor (the
one knob that may move back, and only when tp·pp·cp doubles): at most log2(E) ep steps between
two relayouts, for E experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace

from jobctl.frameworks import selective_frees_memory
from jobctl.model import OOMFigures
from jobctl.planner.catalog import GIB
from jobctl.planner.memory import (
    MemoryBreakdown,
    Workload,
    estimate,
    stage_layers,
)
from jobctl.planner.plan import Plan
from jobctl.planner.search import (
    MAX_CP,
    Constraints,
    Target,
    divisors,
)

# A failed plan's demand is at least this much above its prediction even when the failure
# gave no figures (the OOM says only "more than was there").
MIN_GAP_FRACTION = 0.02

# Sharding from least to most sharded; hsdp shards weights too but only inside a node.
SHARDING_ORDER = ("none", "zero1", "zero2", "hsdp", "zero3")
RUNGS = ("micro-batch", "recompute", "sharding", "parallelism", "offload")


def scaling_bytes(mem: MemoryBreakdown) -> int:
    """The terms the rungs shrink: activations and logits (micro-batch, recompute, tp/pp/cp)."""
    return int(mem.activations_bytes + mem.logits_bytes)


@dataclass(frozen=True)
class CalibrationPoint:
    """One failure: what the model predicted for the plan, and what the failure showed."""

    predicted_bytes: int  # P: the model's peak for the failed plan
    scaling_bytes: int  # S: its activations and logits
    observed_bytes: int  # D: the demand the failure showed, at least
    source: str  # where D comes from

    def to_dict(self) -> dict:
        return {"predicted_bytes": self.predicted_bytes, "scaling_bytes": self.scaling_bytes,
                "observed_bytes": self.observed_bytes, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> CalibrationPoint:
        return cls(int(d["predicted_bytes"]), int(d["scaling_bytes"]), int(d["observed_bytes"]), str(d["source"]))


@dataclass(frozen=True)
class Calibration:
    """The model corrected by failures: calibrated = predicted + fixed_gap + per_scaling · S."""

    points: tuple[CalibrationPoint, ...] = ()
    fixed_gap_bytes: int = 0  # β: unmodelled bytes that no rung changes
    per_scaling: float = 0.0  # γ: unmodelled bytes per byte of activations and logits

    @classmethod
    def fit(cls, points: tuple[CalibrationPoint, ...]) -> Calibration:
        """β and γ that explain every point (calibrated >= observed at each), from the newest
        two points with different S when there are two, else from the newest one."""
        if not points:
            return cls()
        gaps = [(p.scaling_bytes, max(0, p.observed_bytes - p.predicted_bytes)) for p in points]
        s2, g2 = gaps[-1]
        earlier = [(s, g) for s, g in gaps[:-1] if s != s2]
        if earlier:
            s1, g1 = earlier[-1]
            gamma = (g2 - g1) / (s2 - s1)
            beta = g2 - gamma * s2
            if gamma < 0 or beta < 0:  # the two points disagree with the shape: the safer reading
                gamma, beta = (0.0, float(max(g1, g2))) if gamma < 0 else (max(g1 / s1, g2 / s2), 0.0)
        elif s2 > 0:
            gamma, beta = g2 / s2, 0.0
        else:
            gamma, beta = 0.0, float(g2)
        # every failure must stay explained
        beta += max(0.0, max(g - (beta + gamma * s) for s, g in gaps))
        return cls(tuple(points), int(math.ceil(beta)), gamma)

    def extra_bytes(self, mem: MemoryBreakdown) -> int:
        return int(self.fixed_gap_bytes + self.per_scaling * scaling_bytes(mem))

    def predict(self, mem: MemoryBreakdown) -> int:
        """The calibrated peak of a plan whose model breakdown is `mem`."""
        return int(mem.total_bytes + self.extra_bytes(mem))

    def to_dict(self) -> dict:
        return {"points": [p.to_dict() for p in self.points], "fixed_gap_bytes": self.fixed_gap_bytes,
                "per_scaling": self.per_scaling,
                "attributed_to": "activations and logits (they scale with the micro-batch and shrink with "
                                 "recompute and model parallelism)" + (", and a part no rung changes"
                                                                       if self.fixed_gap_bytes else "")}

    @classmethod
    def from_dict(cls, d: dict | None) -> Calibration:
        if not d:
            return cls()
        return cls(tuple(CalibrationPoint.from_dict(p) for p in d.get("points") or ()),
                   int(d.get("fixed_gap_bytes") or 0), float(d.get("per_scaling") or 0.0))

    def summary(self) -> str:
        if not self.points:
            return "no failure to learn from"
        last = self.points[-1]
        return (f"the model predicted {last.predicted_bytes / GIB:.2f} GiB, the OOM showed at least "
                f"{last.observed_bytes / GIB:.2f} GiB ({last.source}): activations and logits x"
                f"{1 + self.per_scaling:.3g}" + (f", plus {self.fixed_gap_bytes / GIB:.2f} GiB no rung changes"
                                                  if self.fixed_gap_bytes else ""))


def observed_demand(t: Target, predicted: int, failure: OOMFigures | None) -> tuple[int, str]:
    """(D, where it comes from): the least the failed step needed. PyTorch's message gives
    what was in use (total − free) plus what it tried to allocate; the sampler's peak is a
    lower bound too; without figures, the GPU's capacity (it did not fit)."""
    f = failure or OOMFigures()
    capacity = f.total_capacity_bytes or t.gpu_memory_bytes
    floor = max(capacity, math.ceil(predicted * (1 + MIN_GAP_FRACTION)))
    candidates = [(floor, "no figures: more than the GPU's capacity")]
    if f.tried_to_allocate_bytes is not None:
        if f.free_bytes is not None and f.total_capacity_bytes is not None:
            candidates.append((f.total_capacity_bytes - f.free_bytes + f.tried_to_allocate_bytes,
                               "OOM message: in use + tried to allocate"))
        else:
            candidates.append((capacity + f.tried_to_allocate_bytes - (f.free_bytes or 0),
                               "OOM message: capacity + tried to allocate"))
    if f.measured_peak_bytes is not None:
        candidates.append((f.measured_peak_bytes, "measured peak"))
    return max(candidates, key=lambda c: c[0])


@dataclass(frozen=True)
class LadderStep:
    """The next plan, its predicted and calibrated memory, which rung produced it and why."""

    plan: Plan
    memory: MemoryBreakdown
    rung: str  # one of RUNGS, or several joined by "+" when no single rung fits
    reason: str
    usable_bytes: int  # what the GPU can hold (its capacity less the safety margin)
    calibration: Calibration = Calibration()
    calibrated_bytes: int = 0  # the calibrated prediction for `plan`
    expected_to_fit: bool = True  # False: the least-demanding step, though the evidence says it may not fit


def next_plan(w: Workload, t: Target, c: Constraints, failed: Plan, failure: OOMFigures | None = None,
              history: tuple[Plan, ...] = (), prior: Calibration | None = None) -> LadderStep | None:
    """The next plan to try after `failed` ran out of GPU memory, or None at the real bottom
    (no valid plan predicts less).

    `failure` is this failure's figures; `prior` the calibration of the attempts before it
    (same workload), to which this failure adds a point. The plan keeps the global batch,
    predicts strictly less than `failed` (model and calibration), fits the host RAM, is none
    of `history` and passes Plan.check(); a pinned tp, pp, dp or cp stays. ValueError if
    `failed` itself does not add up."""
    problems = failed.check()
    if not stage_layers(w.model.layers, failed.pp):
        problems.append(f"pp={failed.pp} cannot split {w.model.layers} layers")
    if failed.global_batch_size != w.global_batch_size:
        problems.append(f"plan global_batch_size({failed.global_batch_size}) != workload "
                        f"global_batch_size({w.global_batch_size})")
    if problems:
        raise ValueError("cannot step down from an invalid plan: " + "; ".join(problems))
    failed_mem = _memory(w, t, failed)
    peak = failed_mem.total_bytes
    demand, source = observed_demand(t, peak, failure)
    point = CalibrationPoint(peak, scaling_bytes(failed_mem), demand, source)
    cal = Calibration.fit(tuple((prior or Calibration()).points) + (point,))
    f = failure or OOMFigures()
    capacity = min(t.gpu_memory_bytes, f.total_capacity_bytes or t.gpu_memory_bytes)
    usable = capacity - int(w.overheads.safety_margin_gib * GIB)
    seen = set(history) | {failed}

    def candidate(plan: Plan) -> tuple[MemoryBreakdown, int] | None:
        if plan in seen or not _valid(w, t, c, failed, plan):
            return None
        mem = _memory(w, t, plan)
        if mem.total_bytes < peak and mem.fits_host:
            return mem, cal.predict(mem)
        return None

    def step(plan: Plan, mem: MemoryBreakdown, calibrated: int, rungs: list[str], fits: bool) -> LadderStep:
        changes = ", ".join(f"{k} {a} -> {b}" for k, a, b in _diff(failed, plan))
        why = (f"{changes}: calibrated {calibrated / GIB:.2f} GiB (model {mem.total_bytes / GIB:.2f} GiB) "
               f"{'<=' if fits else '>'} usable {usable / GIB:.2f} GiB; {cal.summary()}; global batch "
               f"{plan.global_batch_size} kept")
        if not fits:
            why += "; nothing is predicted to fit, so the step that needs the least: the next run is the evidence"
        elif len(rungs) > 1:
            why += "; no single rung fits, so rungs are combined"
        return LadderStep(plan, mem, "+".join(rungs), why, usable, cal, calibrated, fits)

    # One rung: the first rung with a plan the calibrated model says fits, its smallest change.
    least = None  # (calibrated, rungs, plan, mem): the least-demanding candidate seen
    for r, (name, options) in enumerate(_RUNG_OPTIONS):
        for plan in options(w, t, c, failed):
            found = candidate(plan)
            if found is None:
                continue
            mem, calibrated = found
            if calibrated <= usable:
                return step(plan, mem, calibrated, [name], True)
            if least is None or (calibrated, 1) < (least[0], len(least[1])):
                least = (calibrated, [name], plan, mem)

    # Combined: every subset of rungs, each at a few of its settings (_combinations), the
    # fewest rungs first, then the lowest last rung, then the weakest settings, later rungs first.
    best = None
    for plan, choices in _combinations(w, t, c, failed):
        if len(choices) < 2 or (found := candidate(plan)) is None:
            continue
        mem, calibrated = found
        names = [_RUNG_OPTIONS[r][0] for r, _ in choices]
        if calibrated <= usable:
            key = (len(choices), [r for r, _ in reversed(choices)], [i for _, i in reversed(choices)])
            if best is None or key < best[0]:
                best = (key, plan, mem, calibrated, names)
        elif least is None or (calibrated, len(names)) < (least[0], len(least[1])):
            least = (calibrated, names, plan, mem)
    if best is not None:
        return step(best[1], best[2], best[3], best[4], True)
    if least is not None:
        calibrated, names, plan, mem = least
        return step(plan, mem, calibrated, names, False)
    return None


HOST_STEPS = {"optimizer+params": ("optimizer", "none"), "optimizer": ("none",)}


def next_host_plan(w: Workload, t: Target, c: Constraints, failed: Plan) -> LadderStep | None:
    """After a host (CPU RAM) OOM: the same plan with less CPU offload, the global batch kept,
    when the GPUs can hold what comes back (by the model); None when nothing is offloaded or
    nothing less fits the GPUs: what is left of the host memory is the training script's own
    (data loader workers, prefetching), which jobctl cannot change."""
    failed_mem = _memory(w, t, failed)
    for offload in HOST_STEPS.get(failed.offload, ()):
        plan = replace(failed, offload=offload)
        mem = _memory(w, t, plan)
        if mem.fits_gpu and mem.host_bytes_per_node < failed_mem.host_bytes_per_node:
            why = (f"offload {failed.offload} -> {offload}: host RAM per node {mem.host_bytes_per_node / GIB:.1f} GiB "
                   f"(was {failed_mem.host_bytes_per_node / GIB:.1f} GiB); GPU {mem.total_bytes / GIB:.2f} GiB <= "
                   f"usable {mem.gpu_usable_bytes / GIB:.2f} GiB; global batch {plan.global_batch_size} kept")
            return LadderStep(plan, mem, "host offload", why, mem.gpu_usable_bytes, calibrated_bytes=mem.total_bytes)
    return None


def ladder(w: Workload, t: Target, c: Constraints, start: Plan, failure: OOMFigures | None = None,
           max_steps: int = 50) -> list[LadderStep]:
    """Every step of the ladder from `start` (which OOMed with `failure`), each later step as
    if its predecessor had OOMed too (no figures), until the bottom or max_steps."""
    steps: list[LadderStep] = []
    plan, fail, history, cal = start, failure, (), Calibration()
    for _ in range(max_steps):
        s = next_plan(w, t, c, plan, fail, history, cal)
        if s is None:
            break
        steps.append(s)
        history += (plan,)
        plan, fail, cal = s.plan, None, s.calibration
    return steps


# --- the rungs: candidate plans, smallest change first ------------------------------------------

def _microbatch_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    """At most half the micro-batch (so a ladder halves it at least each time), largest first."""
    per_dp = p.global_batch_size // p.dp
    for mbs in sorted(divisors(per_dp), reverse=True):
        if 2 * mbs <= p.micro_batch_size:
            yield replace(p, micro_batch_size=mbs, grad_accum_steps=per_dp // mbs)


def _recompute_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    """Selective (where it frees memory), then full recompute of a quarter, half, three quarters and
    all of a stage's layers. Quarters rather than every layer count: each step lowers the
    activations by a useful amount, and a ladder crosses the range in at most four steps."""
    layers = stage_layers(w.model.layers, p.pp)[1]  # the most layers a stage holds
    caps = w.caps
    if p.recompute == "none" and selective_frees_memory(w):
        yield replace(p, recompute="selective", recompute_layers=0)
    if "full" not in caps.recompute or (p.recompute == "full" and not p.recompute_layers):
        return
    if not caps.recompute_layers:  # all layers or none (torchtitan, FSDP, DeepSpeed)
        yield replace(p, recompute="full", recompute_layers=0)
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
    offered = w.caps.shardings
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
    """A mixture of experts' larger ep (its experts over more of the same ranks: nothing else
    moves); then larger tp, pp or cp: first on the same GPUs (dp shrinks), then on more of the
    partition (dp kept), fewest GPUs first."""
    m = w.model
    if m.moe is not None and c.ep is None:
        stage = p.tp * p.cp * p.dp
        for e in divisors(m.moe.experts):
            if e > p.ep and e % p.ep == 0 and stage % e == 0:
                yield replace(p, ep=e)
    # One dimension at a time, by a whole factor of at least 2 (so tp·pp·cp at least doubles
    # each step): a larger tp (inside a node) first, then pp, then cp (Megatron-LM, torchtitan).
    moves = []
    caps = w.caps
    if c.tp is None and caps.tp:
        moves += [(x, p.pp, p.cp) for x in divisors(t.nvlink_gpus)
                  if x > p.tp and x % p.tp == 0 and m.heads % x == 0 and m.kv_heads % x == 0]
    if c.pp is None and caps.pp:
        moves += [(p.tp, x, p.cp) for x in range(2 * p.pp, m.layers + 1, p.pp) if stage_layers(m.layers, x)]
    if c.cp is None and caps.cp:
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
        sp = tp > 1 and w.caps.sequence_parallel != "no"
    v = p.virtual_stages if pp == p.pp else (c.virtual_stages if c.virtual_stages and pp > 1 else 1)
    n_rc = p.recompute_layers
    if n_rc and n_rc >= stage_layers(w.model.layers, pp)[1]:
        n_rc = 0  # block recompute of at least a whole stage: all of it
    hs = p.hsdp_shard
    if p.sharding == "hsdp":
        hs = _hsdp_shard(tp, dp, cp, gpn)
        if hs is None:
            return None
    ep = p.ep
    if (tp * cp * dp) % ep:  # the experts must still fold onto the stage's ranks
        if c.ep is not None:
            return None
        ep = max(e for e in divisors(ep) if (tp * cp * dp) % e == 0)
    return replace(p, nodes=nodes, gpus_per_node=gpn, tp=tp, pp=pp, cp=cp, dp=dp, sequence_parallel=sp,
                   virtual_stages=v, hsdp_shard=hs, recompute_layers=n_rc, ep=ep,
                   grad_accum_steps=per_dp // p.micro_batch_size)


def _offload_options(w: Workload, t: Target, c: Constraints, p: Plan) -> Iterator[Plan]:
    offered = w.caps.offload
    params_ok = p.sharding in ("zero3", "hsdp")
    if p.offload == "none" and "optimizer" in offered:
        yield replace(p, offload="optimizer")
    if p.offload in ("none", "optimizer") and params_ok and "optimizer+params" in offered:
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
    if p.sharding not in w.caps.shardings and p.sharding != failed.sharding:
        return False
    if p.nodes > t.nodes or p.gpus_per_node > t.gpus_per_node:
        return False
    if c.max_nodes is not None and p.nodes > max(c.max_nodes, failed.nodes):
        return False
    if c.nodes is not None and p.world_size != failed.world_size:
        return False  # resources.nodes: the job keeps its nodes
    for dim in ("tp", "pp", "dp", "cp", "ep"):
        if getattr(c, dim) is not None and getattr(p, dim) != getattr(failed, dim):
            return False
    if p.virtual_stages > 1 and p.pp == 1:
        return False
    # every rung is a configuration the framework runs (its own rules, e.g. interleaving)
    return not [x for x in w.framework.problems(p, w) if not _same_refusal(x, w, failed)]


def _same_refusal(message: str, w: Workload, failed: Plan) -> bool:
    """A refusal the failed plan has too (a pinned setting the recipe asked for): not the rung's fault."""
    return message in w.framework.problems(failed, w)


def _memory(w: Workload, t: Target, p: Plan) -> MemoryBreakdown:
    return estimate(w, t.gpu_memory_bytes, p, t.host_mem_bytes, detail=False)


def _diff(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    return [(f.name, getattr(a, f.name), getattr(b, f.name)) for f in fields(Plan)
            if getattr(a, f.name) != getattr(b, f.name)]
