"""When nothing fits: the smallest changes that would make it fit (pure, search-based)."""

from __future__ import annotations

from dataclasses import replace

from jobctl.planner.catalog import GIB, gpu_names, lookup_gpu
from jobctl.planner.memory import Workload
from jobctl.planner.search import Constraints, Evaluations, SearchResult, Target, search


def suggestions(w: Workload, t: Target, c: Constraints, result: SearchResult, limit: int = 4) -> list[str]:
    """Try, in order of how small a change each is: relaxing pinned knobs (recompute,
    offload, sharding, micro-batch), more nodes, LoRA/QLoRA, a bigger GPU. Each suggestion
    is verified by running the search with the change."""
    out: list[str] = []
    steps = result.evaluations.steps if result.evaluations is not None else None

    def fits(w2=w, t2=t, c2=c, ev=None):
        """The plan the default objective takes, or None. Whether any fits is asked first of the
        fewest-GPUs search (no speed bounds to compute; it stops at the smallest plan that fits):
        the default objective's search finds one exactly when it does (neither prunes before a
        plan is found), and then shares its evaluations."""
        ev = ev if ev is not None else Evaluations(w2, t2, c2, steps)
        if search(w2, t2, c2, objective="gpus", steps=steps, evaluations=ev).best is None:
            return None
        return search(w2, t2, c2, steps=steps, evaluations=ev).best

    relax = [
        ("recompute", "full", "recompute=full (store only each layer's input)"),
        ("offload", "optimizer", "offload=optimizer (optimizer states and gradients in host RAM)"),
        ("sharding", "zero3", "sharding=zero3 (shard weights, gradients and optimizer states)"),
        ("micro_batch_size", None, "micro_batch_size=auto"),
    ]
    for key, value, text in relax:
        if getattr(c, key) is not None and getattr(c, key) != value:
            best = fits(c2=replace(c, **{key: value}))
            if best:
                out.append(f"fits with parallelism.{text}: {best.plan.summary()} "
                           f"({best.memory.total_bytes / 2**30:.1f} GiB)")
    for pinned in ("tp", "pp", "cp", "dp"):
        if getattr(c, pinned) is not None:
            best = fits(c2=replace(c, **{pinned: None}))
            if best:
                out.append(f"fits with parallelism.{pinned}=auto: {best.plan.summary()}")
    # what the search could use: the partition's nodes, or fewer when resources.max_nodes says so
    max_nodes = min(c.max_nodes, t.nodes) if c.max_nodes else t.nodes
    offered = (f"{t.cluster}/{t.partition} offers {t.nodes}" + (f", resources.max_nodes allows {c.max_nodes}"
                                                                if c.max_nodes and c.max_nodes < t.nodes else ""))
    for factor in (2, 4, 8, 16, 32, 64):
        nodes = max_nodes * factor
        if result.evaluations is not None:  # the layouts of fewer nodes are evaluated once
            ev = result.evaluations.pinned(nodes=max(nodes, t.nodes), max_nodes=nodes)
            best = fits(t2=ev.t, c2=ev.c, ev=ev)
        else:
            best = fits(t2=replace(t, nodes=max(nodes, t.nodes)), c2=replace(c, max_nodes=nodes))
        if best:
            out.append(f"fits on {best.plan.nodes} nodes ({offered}): "
                       f"{best.plan.nodes} x {best.plan.gpus_per_node} {t.gpu.key} with {best.plan.summary()}")
            break
    if w.method == "full":
        for method in ("lora", "qlora"):
            best = fits(w2=replace(w, method=method))
            if best:
                out.append(f"fits with train.method={method}: {best.plan.summary()} "
                           f"({best.memory.total_bytes / 2**30:.1f} GiB)")
                break
    if not t.gpu.is_cpu:
        bigger = sorted((lookup_gpu(k) for k in gpu_names()), key=lambda g: g.memory_bytes)
        # The failed search checked every layout here (nothing fit, nothing was pruned), and a
        # plan's bytes do not depend on the GPU: a GPU whose usable memory is below the least
        # of them cannot fit any.
        least = min(result.smallest.values(), default=None) if result.best is None else None
        margin = w.overheads.safety_margin_gib * GIB
        sizes: dict = {}  # a plan's bytes, for every GPU tried (they differ in memory only)
        for g in bigger:
            if g.is_cpu or g.memory_bytes <= t.gpu_memory_bytes:
                continue
            if least is not None and least > g.memory_bytes - margin:
                continue
            t2 = replace(t, gpu=g, gpu_memory_bytes=g.memory_bytes)
            best = fits(t2=t2, ev=Evaluations(w, t2, c, steps, sizes=sizes))
            if best:
                out.append(f"fits on {g.key} ({g.memory_gib:.0f} GiB): {t.nodes} x {t.gpus_per_node} "
                           f"with {best.plan.summary()}")
                break
    return out[:limit]
