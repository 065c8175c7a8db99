"""Plan a recipe on one inventory or on all of them: load, search, report as plain data.

This is the edge between files and the pure planner; `cli.plan` renders its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobctl.planner.catalog import GIB
from jobctl.errors import ConfigError, ConfigIssue
from jobctl.config import loader as config
from jobctl.config.workspace import EMBEDDED_LOCAL, find_cluster, find_recipe
from jobctl.errors import UsageError
from jobctl.planner import inputs
from jobctl.planner.advice import suggestions
from jobctl.planner.catalog import gpu_names, unknown_message
from jobctl.planner.explain import explain as explain_search, why_lost
from jobctl.planner.ladder import next_plan, OOMInfo
from jobctl.planner.memory import estimate
from jobctl.planner.models import PRESETS
from jobctl.planner.perf import estimate_step
from jobctl.planner.plan import Plan
from jobctl.planner.search import Candidate, rank, search


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


def _check_preset(data: dict, where) -> list[ConfigIssue]:
    """`model:` names a preset that exists (a mapping is checked by the schema)."""

    model = data.get("model")
    if not isinstance(model, str) or model in PRESETS:
        return []
    f, line = where(("model",))
    return [ConfigIssue(f, line, "model", unknown_message("model preset", model, sorted(PRESETS))
                        + "; or give a mapping {family, layers, hidden, ffn_hidden, heads, kv_heads, vocab}")]


def _check_gpus(data: dict, where) -> list[ConfigIssue]:
    """Every partition's `gpu:` is in the catalog."""

    parts = data.get("partitions")
    out = []
    for i, part in enumerate(parts if isinstance(parts, list) else []):
        gpu = part.get("gpu") if isinstance(part, dict) else None
        if isinstance(gpu, str) and gpu not in gpu_names():
            f, line = where(("partitions", i, "gpu"))
            out.append(ConfigIssue(f, line, f"partitions.{i}.gpu", unknown_message("GPU", gpu, gpu_names())))
    return out


def load_recipe(path: str, overrides: list[str]):
    """Load and validate a recipe (a path or a name from recipes/); ConfigError lists every problem."""

    return config.load(find_recipe(path), "Recipe", overrides, checks=(_check_preset,))


def load_inventory(name_or_path: str, overrides: list[str] | None = None):
    """Load and validate an inventory (a name from clusters/ or a path); None path = embedded local."""

    path = find_cluster(name_or_path)
    if path is None:
        from jobctl.config import schema

        inv = schema.Inventory.model_validate(EMBEDDED_LOCAL)
        return config.Loaded("<embedded local>", inv, dict(EMBEDDED_LOCAL), None, {})
    return config.load(path, "Inventory", overrides, checks=(_check_gpus,))


def load_request(recipe: str, overrides: list[str], clusters: list[str]):
    """The recipe and every named inventory, with the problems of all of them reported at
    once (one ConfigError) instead of stopping at the first bad file."""
    issues: list[ConfigIssue] = []
    rec = None
    invs = []
    try:
        rec = load_recipe(recipe, overrides)
    except ConfigError as e:
        issues += e.issues
    for name in clusters:
        try:
            invs.append(load_inventory(name))
        except ConfigError as e:
            issues += e.issues
    if issues:
        raise ConfigError(issues)
    return rec, invs


def train_steps(recipe) -> int | None:
    """Optimizer steps to train: train.steps, or train.tokens over tokens per step."""
    t = recipe.train
    if t.steps:
        return t.steps
    if t.tokens:
        per_step = t.global_batch_size * t.seq_len
        return -(-t.tokens // per_step)
    return None


def plan_on(recipe_loaded, inv_loaded, objective: str = "throughput", explain: bool = False,
            alternatives: int = 5) -> ClusterPlan:
    """Search every partition of one inventory (or the pinned resources.partition) and keep
    the best plan by `objective`."""

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
    steps = train_steps(recipe)
    found, first = [], None
    for part in parts:
        tgt = inputs.target(inv, part, recipe.train.precision)
        w = inputs.workload(recipe, inv, cpu=tgt.gpu.is_cpu)
        res = search(w, tgt, cons, objective=objective, steps=steps)
        if res.best is not None:
            found.append((res.best, w, tgt, res))
        elif first is None:
            first = (w, tgt, res)
    if found:
        order = rank([f[0] for f in found], objective)
        best, w, tgt, res = next(f for f in found if f[0] is order[0])
        return ClusterPlan(_report(recipe_loaded, w, res, cons, objective, explain, alternatives), res, w, True)
    w, tgt, res = first
    tips = suggestions(w, tgt, cons, res) if not res.reasons or res.considered else []
    return ClusterPlan(_no_fit(recipe_loaded, inv, res, res.reasons, tips, w), res, w, False)


def _model_info(w) -> dict:
    return {"name": w.model.name, "params": w.model.params()}


def _candidate(c, w, t) -> dict:

    mem = estimate(w, t.gpu_memory_bytes, c.plan, t.host_mem_bytes)
    return {"plan": c.plan.to_dict(), "memory": mem.to_dict(), "estimate": c.estimate.to_dict() if c.estimate else None}


def _report(recipe_loaded, w, res, cons, objective, explain, alternatives) -> dict:

    best = res.best
    t = res.target
    out = {
        "recipe": recipe_loaded.path,
        "cluster": t.cluster,
        "partition": t.partition,
        "gpu": t.gpu.key,
        "feasible": True,
        "objective": objective,
        "model": _model_info(w),
        "train": {"seq_len": w.seq_len, "global_batch_size": w.global_batch_size, "optimizer": w.optimizer,
                  "precision": w.precision, "method": w.method, "framework": w.framework, "attention": w.attention},
        "plan": best.plan.to_dict(),
        "memory": best.memory.to_dict(),
        "estimate": best.estimate.to_dict() if best.estimate else None,
        "alternatives": [_candidate(c, w, t) for c in res.ranked[1:1 + alternatives]],
        "why_not": why_lost(w, t, cons, res, objective),
        "search": {"considered": res.considered, "feasible": res.feasible_count, "rejected": dict(res.rejected)},
        "reasons": [],
        "suggestions": [],
    }
    if explain:
        out["explain"] = explain_search(res)
    return out


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


def after_oom(recipe_loaded, inv_loaded, failed_plan: dict, failure: dict | None = None,
              history_plans: list[dict] | None = None) -> ClusterPlan:
    """The next plan after `failed_plan` ran out of memory (the OOM ladder), as a plan report
    with a `ladder` block: which rung, why, and the learned usable memory."""

    recipe, inv = recipe_loaded.value, inv_loaded.value
    try:
        failed = Plan.from_dict(failed_plan)
    except TypeError as e:
        raise UsageError(f"the failed plan is not a jobctl plan: {e}",
                         hint="give the output of `jobctl plan ... --json` (or its \"plan\" object)") from None
    problems = failed.check()
    if problems:
        raise UsageError("the failed plan is inconsistent: " + "; ".join(problems))
    part = next((p for p in inv.partitions if p.name == (failure or {}).get("partition")), None) or inv.partitions[0]
    t = inputs.target(inv, part, recipe.train.precision)
    w = inputs.workload(recipe, inv, cpu=t.gpu.is_cpu)
    if failed.global_batch_size != w.global_batch_size:
        raise UsageError(f"the failed plan's global batch ({failed.global_batch_size}) differs from the recipe's "
                         f"({w.global_batch_size}): the ladder keeps the global batch fixed")
    info = OOMInfo(**{k: int(v) for k, v in (failure or {}).items()
                      if k in ("tried_to_allocate_bytes", "total_capacity_bytes", "free_bytes", "measured_peak_bytes")
                      and v is not None})
    seen = tuple(Plan.from_dict(p) for p in (history_plans or []))
    try:
        step = next_plan(w, t, inputs.constraints(recipe), failed, info, seen)
    except ValueError as e:
        raise UsageError(f"cannot step down from this plan: {e}") from None
    if step is None:
        data = _no_fit(recipe_loaded, inv, None, ["nothing smaller: no plan on this partition predicts less memory "
                                                  "than the failed one while keeping the global batch"], [], w)
        data["partition"] = t.partition
        return ClusterPlan(data, None, w, False)

    est = estimate_step(w, step.plan, t.links, t.gpus_per_node, train_steps(recipe)) if t.links else None

    class _Res:  # the shape _report reads
        pass

    res = _Res()
    res.best = Candidate(step.plan, step.memory, est)
    res.target, res.ranked, res.considered, res.feasible_count, res.rejected = t, [], 0, 1, {}
    res.smallest = {}
    data = _report(recipe_loaded, w, res, inputs.constraints(recipe), "throughput", False, 0)
    data["why_not"] = []
    data["ladder"] = {"rung": step.rung, "reason": step.reason, "usable_bytes": step.usable_bytes,
                      "failed_plan": failed.to_dict()}
    return ClusterPlan(data, res, w, True)
