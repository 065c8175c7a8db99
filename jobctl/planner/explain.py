"""Why the chosen plan won: for each dimension a user might expect to differ, the best plan
with another value and what made it lose (pure)."""

from __future__ import annotations

from dataclasses import replace

from jobctl.planner.catalog import GIB
from jobctl.planner.perf import INTRA_NODE_EFFICIENCY, NETWORK_EFFICIENCY
from jobctl.planner.search import Candidate, Constraints, SearchResult, Target, search

PARTS = {
    "compute_s": "compute",
    "tp_comm_s": "tensor-parallel collectives",
    "pp_bubble_s": "pipeline bubble",
    "pp_p2p_s": "pipeline sends",
    "dp_comm_s": "exposed data-parallel communication",
    "cp_comm_s": "exposed context-parallel exchange",
    "offload_s": "offload transfers over PCIe",
    "optimizer_s": "optimizer step",
}
DIMENSIONS = ("tp", "pp", "cp", "sharding", "recompute", "offload", "micro_batch_size", "virtual_stages")


def _metric(c: Candidate, objective: str) -> float:
    return c.tokens_per_s_per_gpu if objective == "throughput" else c.tokens_per_s


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
    if grew == "pp_bubble_s":
        return (f"{PARTS[grew]} {share_a:.0%} of the step at {alt.plan.grad_accum_steps} micro-batches "
                f"(winner {share_w:.0%})")
    if grew == "compute_s":
        why = "recomputation" if alt.plan.recompute != win.plan.recompute else "smaller, less efficient matmuls"
        return f"{extra:+.0%} GPU-time in compute ({why})"
    return f"{PARTS[grew]} {share_a:.0%} of the step (winner {share_w:.0%})"


def why_lost(w, t: Target, c: Constraints, result: SearchResult, objective: str, limit: int = 6) -> list[str]:
    """One line per dimension: the best alternative value and why it lost (or cannot fit)."""
    win = result.best
    if win is None or win.estimate is None:
        return []
    lines: list[str] = []
    others = [x for x in result.ranked if x.estimate is not None]
    for dim in DIMENSIONS:
        if getattr(c, dim, None) is not None:
            continue  # pinned by the recipe: nothing to explain
        mine = getattr(win.plan, dim)
        alts = [x for x in others if getattr(x.plan, dim) != mine]
        if not alts and dim in ("tp", "pp", "cp"):
            alts = _pinned_neighbours(w, t, c, dim, mine, objective)
        if not alts:
            continue
        alt = max(alts, key=lambda x: _metric(x, objective))
        worse = 1 - _metric(alt, objective) / _metric(win, objective)
        if worse <= 0:
            continue
        unit = "tokens/s per GPU" if objective == "throughput" else "tokens/s"
        lines.append(f"{dim}={getattr(alt.plan, dim)}: {worse:.1%} lower {unit} — {_loss_reason(win, alt)}")
    # (on a partition of one node, a larger tp is not slower but impossible: nothing to explain)
    if t.links is not None and t.nodes > 1 and win.plan.tp == t.gpus_per_node and w.model.heads % (2 * win.plan.tp) == 0:
        ratio = (t.links.intra_node_gbs * INTRA_NODE_EFFICIENCY) / (t.links.inter_node_gbs * NETWORK_EFFICIENCY)
        lines.append(f"tp={2 * win.plan.tp} crosses the node boundary: {ratio:.1f}x slower all-reduce "
                     f"({t.links.inter_node_gbs:g} GB/s network vs {t.links.intra_node_gbs:g} GB/s inside a node)")
    for dim in ("tp", "pp"):
        if getattr(c, dim, None) is None and getattr(win.plan, dim) > 1:
            lower = 1
            if not any(getattr(x.plan, dim) == lower for x in others):
                smallest = result.smallest.get((dim, lower))
                if smallest is not None:
                    lines.append(f"{dim}={lower} never fits: its smallest layout needs {smallest / GIB:.1f} GiB per GPU "
                                 f"({t.gpu_memory_bytes / GIB:.1f} GiB on a {t.gpu.key})")
    return lines[:limit]


def _pinned_neighbours(w, t, c, dim, mine, objective) -> list[Candidate]:
    """Best plans with `dim` pinned to half and twice the winner's value (when valid)."""
    out = []
    for value in {max(1, mine // 2), mine * 2}:
        if value == mine:
            continue
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
