"""Plan a recipe on one inventory or on all of them: load, search, report as plain data.

This is the edge between files and the pure planner; `cli.plan` renders its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobctl.catalog import GIB
from jobctl.errors import ConfigError, ConfigIssue


@dataclass
class ClusterPlan:
    """The outcome on one inventory, as plain data (the JSON contract) plus rich objects."""

    data: dict
    search: object = None
    workload: object = None
    feasible: bool = False


@dataclass
class Loaded:
    recipe_path: str
    recipe: object
    recipe_loaded: object
    inventories: list = field(default_factory=list)  # (path or None, Loaded inventory)


def load_recipe(path: str, overrides: list[str]):
    from jobctl import config, schema
    from jobctl.catalog import unknown_message
    from jobctl.planner.models import PRESETS
    from jobctl.workspace import find_recipe

    p = find_recipe(path)
    loaded = config.load(p, schema.Recipe, overrides)
    model = loaded.value.model
    if isinstance(model, str) and model not in PRESETS:
        f, line = loaded.lines.get(("model",), (str(p), None))
        raise ConfigError([ConfigIssue(f, line, "model", unknown_message("model preset", model, sorted(PRESETS))
                                       + "; or give a mapping {family, layers, hidden, ffn_hidden, heads, kv_heads, vocab}")])
    return loaded


def load_inventory(name_or_path: str, overrides: list[str] | None = None):
    from jobctl import config, schema
    from jobctl.catalog import gpu_names, unknown_message
    from jobctl.workspace import EMBEDDED_LOCAL, find_cluster

    path = find_cluster(name_or_path)
    if path is None:
        inv = schema.Inventory.model_validate(EMBEDDED_LOCAL)
        return config.Loaded("<embedded local>", inv, dict(EMBEDDED_LOCAL), None, {})
    loaded = config.load(path, schema.Inventory, overrides)
    issues = []
    for i, part in enumerate(loaded.value.partitions):
        if part.gpu not in gpu_names():
            f, line = loaded.lines.get(("partitions", i, "gpu"), (str(path), None))
            issues.append(ConfigIssue(f, line, f"partitions.{i}.gpu", unknown_message("GPU", part.gpu, gpu_names())))
    if issues:
        raise ConfigError(issues)
    return loaded


def plan_on(recipe_loaded, inv_loaded) -> ClusterPlan:
    """Search every partition of one inventory (or the pinned resources.partition)."""
    from jobctl.planner import inputs
    from jobctl.planner.advice import suggestions
    from jobctl.planner.search import search

    recipe = recipe_loaded.value
    inv = inv_loaded.value
    parts = list(inv.partitions)
    if recipe.resources.partition:
        parts = [p for p in parts if p.name == recipe.resources.partition]
        if not parts:
            names = ", ".join(p.name for p in inv.partitions)
            return ClusterPlan(_no_fit(recipe_loaded, inv, None, [f"partition {recipe.resources.partition!r} "
                                                                   f"is not in cluster {inv.name} (it has: {names})"], []))
    cons = inputs.constraints(recipe)
    first = None
    for part in parts:
        tgt = inputs.target(inv, part)
        w = inputs.workload(recipe, inv, cpu=tgt.gpu.is_cpu)
        res = search(w, tgt, cons)
        if res.best is not None:
            return ClusterPlan(_report(recipe_loaded, w, res), res, w, True)
        if first is None:
            first = (w, tgt, res)
    w, tgt, res = first
    tips = suggestions(w, tgt, cons, res) if not res.reasons or res.considered else []
    return ClusterPlan(_no_fit(recipe_loaded, inv, res, res.reasons, tips, w), res, w, False)


def _model_info(w) -> dict:
    return {"name": w.model.name, "params": w.model.params()}


def _report(recipe_loaded, w, res) -> dict:
    best = res.best
    t = res.target
    return {
        "recipe": recipe_loaded.path,
        "cluster": t.cluster,
        "partition": t.partition,
        "gpu": t.gpu.key,
        "feasible": True,
        "model": _model_info(w),
        "train": {"seq_len": w.seq_len, "global_batch_size": w.global_batch_size, "optimizer": w.optimizer,
                  "precision": w.precision, "method": w.method, "framework": w.framework, "attention": w.attention},
        "plan": best.plan.to_dict(),
        "memory": best.memory.to_dict(),
        "search": {"considered": res.considered, "feasible": len(res.feasible), "rejected": dict(res.rejected)},
        "reasons": [],
        "suggestions": [],
    }


def _no_fit(recipe_loaded, inv, res, reasons, tips, w=None) -> dict:
    closest = res.closest if res is not None else None
    out = {
        "recipe": recipe_loaded.path,
        "cluster": inv.name,
        "partition": res.target.partition if res is not None else None,
        "gpu": res.target.gpu.key if res is not None else None,
        "feasible": False,
        "model": _model_info(w) if w is not None else None,
        "plan": None,
        "memory": None,
        "closest": {"plan": closest.plan.to_dict(), "memory": closest.memory.to_dict()} if closest else None,
        "search": {"considered": res.considered, "feasible": 0, "rejected": dict(res.rejected)} if res else None,
        "reasons": list(reasons),
        "suggestions": list(tips),
    }
    return out


def gib(x: float) -> float:
    return x / GIB
