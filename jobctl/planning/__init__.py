"""Plan a recipe on one inventory or on all of them: load, search, report as plain data.

This is the edge between files and the pure planner; `cli.plan` renders its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from jobctl.config import loader as config
from jobctl.config.workspace import EMBEDDED_LOCAL, find_cluster, find_recipe
from jobctl.errors import ConfigError, ConfigIssue, UsageError
from jobctl import frameworks
from jobctl.frameworks import NAMES
from jobctl.planner import inputs
from jobctl.planner.advice import suggestions
from jobctl.planner.catalog import GIB, gpu_names, unknown_message
from jobctl.planner.explain import explain as explain_search
from jobctl.planner.explain import MEMORY_EVIDENCE, memory_checks, objective_summary, why_lost
from jobctl.planner.ladder import (
    Calibration,
    CalibrationPoint,
    OOMInfo,
    next_host_plan,
    next_plan,
    observed_demand,
    scaling_bytes,
)
from jobctl.planner.memory import estimate
from jobctl.planner.models import PRESETS
from jobctl.planner.perf import estimate_step
from jobctl.planner.plan import Plan
from jobctl.planner.search import DEFAULT_OBJECTIVE, Candidate, rank, search
from jobctl.planner.search import OBJECTIVES as OBJECTIVES  # re-exported: the CLI's --objective choices
from jobctl.planning.learn import learned_calibration


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


def plan_on(recipe_loaded, inv_loaded, objective: str = DEFAULT_OBJECTIVE, explain: bool = False,
            alternatives: int = 5, learn: bool = True, summary: bool = True) -> ClusterPlan:
    """Search every partition of one inventory (or the pinned resources.partition) and keep
    the best plan by `objective`. With `learn`, the memory model of a partition where this
    workload (model, sequence length) ran out of GPU memory before is calibrated by what that
    failure showed (planning.learn; the report's "learned" block says from which job)."""

    recipe = recipe_loaded.value
    inv = inv_loaded.value
    best = _best_on(recipe, inv, objective, learn)
    if best.missing_partition:
        return ClusterPlan(_no_fit(recipe_loaded, inv, None, [best.missing_partition], []))
    cons, steps = inputs.constraints(recipe), train_steps(recipe)
    if best.found:
        w, tgt, res = best.workload, best.target, best.result
        data = _report(recipe_loaded, w, res, cons, objective, explain, alternatives)
        if summary:
            data["objective_choice"] = objective_summary(w, tgt, cons, res, steps, every=explain)
        if best.learned:  # the evidence itself, so a chain that OOMs again builds on it
            data["learned"]["calibration"] = {k: v for k, v in best.learned.items() if k != "from"}
        return ClusterPlan(data, res, w, True)
    w, tgt, res = best.workload, best.target, best.result
    tips = suggestions(w, tgt, cons, res) if not res.reasons or res.considered else []
    return ClusterPlan(_no_fit(recipe_loaded, inv, res, res.reasons, tips, w), res, w, False)


@dataclass
class _Best:
    """The best plan over an inventory's partitions (or the first partition's search when
    none fits), with the workload and target it was planned for."""

    found: bool = False
    workload: object = None
    target: object = None
    result: object = None  # the SearchResult on that partition
    learned: dict | None = None  # the calibration applied on that partition
    missing_partition: str | None = None  # resources.partition is not in the inventory: why


def _best_on(recipe, inv, objective: str, learn: bool, framework: str | None = None) -> _Best:
    """Search each partition (or the pinned resources.partition) and keep the best plan by
    `objective`; `framework`: plan with this framework instead of the recipe's."""
    parts = _partitions(recipe, inv)
    if isinstance(parts, str):
        return _Best(missing_partition=parts)
    cons = inputs.constraints(recipe)
    steps = train_steps(recipe)
    found, first = [], None
    for w, tgt, learned in _workloads(recipe, inv, parts, learn, framework):
        res = search(w, tgt, cons, objective=objective, steps=steps)
        if res.best is not None:
            found.append((res.best, w, tgt, res, learned))
        elif first is None:
            first = (w, tgt, res)
    if found:
        order = rank([f[0] for f in found], objective)
        _, w, tgt, res, learned = next(f for f in found if f[0] is order[0])
        return _Best(True, w, tgt, res, learned)
    return _Best(False, *first)


def _partitions(recipe, inv) -> list | str:
    """The partitions to plan on: all, or the pinned resources.partition; a str says why none."""
    parts = list(inv.partitions)
    if recipe.resources.partition:
        parts = [p for p in parts if p.name == recipe.resources.partition]
        if not parts:
            names = ", ".join(p.name for p in inv.partitions)
            return f"partition {recipe.resources.partition!r} is not in cluster {inv.name} (it has: {names})"
    return parts


def _workloads(recipe, inv, parts: list, learn: bool, framework: str | None = None):
    """(workload, target, calibration applied) per partition: the recipe as the planner sees it
    there, calibrated by what an earlier CUDA OOM of it there showed (`learn`), with `framework`
    instead of the recipe's when given."""
    identity = None
    for part in parts:
        tgt = inputs.target(inv, part, recipe.train.precision)
        w = inputs.workload(recipe, inv, cpu=tgt.gpu.is_cpu)
        learned = None
        if learn:
            identity = identity or (w.model.name, w.model.params())
            learned = learned_calibration(inv.name, part.name, identity, w.seq_len)
            if learned:
                w = inputs.workload(recipe, inv, cpu=tgt.gpu.is_cpu, learned=learned)
        if framework is not None:
            w = replace(w, framework=frameworks.get(framework))
        yield w, tgt, learned


# A recipe's framework is "far slower" than another on the same GPUs beyond this step-time ratio.
FRAMEWORK_GAP = 1.2


def framework_names() -> list[str]:
    """The frameworks `--framework all` compares (`generic` is custom's old name)."""
    return [n for n in NAMES if n != "generic"]


def compare_frameworks(recipe_loaded, inv_loaded, objective: str = DEFAULT_OBJECTIVE, learn: bool = True,
                       known: dict | None = None) -> list[dict]:
    """The recipe planned with each framework on one inventory, as rows: {framework, feasible,
    gpus, layout, plan, step_time_s, tokens_per_s_per_gpu, memory_bytes, reason}. Each framework
    is the recipe's workload with that framework's capability table (the recipe is not read
    again). `known`: {framework: plan report} already computed (not planned again)."""
    rows = []
    for name in framework_names():
        data = (known or {}).get(name)
        if data is None:
            rows.append(_framework_row(name, _best_on(recipe_loaded.value, inv_loaded.value, objective, learn, name)))
            continue
        row = _framework_row(name, None)
        if data["feasible"]:
            _fill_row(row, data["plan"], data.get("estimate") or {}, data["memory"])
        else:
            row["reason"] = (data.get("reasons") or ["does not fit"])[0]
        rows.append(row)
    return rows


def _framework_row(name: str, best: _Best | None) -> dict:
    """One row of the framework comparison from that framework's best plan (None: empty)."""
    row = {"framework": name, "feasible": False, "gpus": None, "layout": None, "plan": None, "step_time_s": None,
           "tokens_per_s_per_gpu": None, "memory_bytes": None, "reason": None}
    if best is None:
        return row
    if best.found:
        top = best.result.best
        _fill_row(row, top.plan.to_dict(), top.estimate.to_dict() if top.estimate else {}, top.memory.to_dict())
    else:
        row["reason"] = best.missing_partition or (best.result.reasons or ["does not fit"])[0]
    return row


def _fill_row(row: dict, plan: dict, est: dict, mem: dict) -> None:
    row.update(feasible=True, gpus=plan["world_size"], layout=Plan.from_dict(plan).summary(), plan=plan,
               step_time_s=est.get("step_time_s"), tokens_per_s_per_gpu=est.get("tokens_per_s_per_gpu"),
               memory_bytes=mem["total_bytes"])


def framework_advice_for(recipe_loaded, inv_loaded, current: str, report: dict, objective: str = DEFAULT_OBJECTIVE,
                         learn: bool = True) -> list[str]:
    """framework_advice without planning every framework. When the recipe's framework fits,
    another is planned only if a search for its fastest plan, from a floor of FRAMEWORK_GAP x
    this plan's tokens/s, finds one above it: a framework whose fastest plan is not that much
    faster has no plan (for any objective) that the advice would name. When it does not fit,
    every framework is planned (the advice names the fastest that fits)."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    if not report["feasible"]:  # the fastest that fits: planned where anything fits at all
        rows = [_framework_row(name, _best_on(recipe, inv, objective, learn, name)) for name in framework_names()
                if name != current and _fits_at_all(recipe, inv, learn, name)]
        return framework_advice(current, rows, False, None)
    est = report.get("estimate") or {}
    if not est.get("tokens_per_s"):
        return []
    floor = FRAMEWORK_GAP * est["tokens_per_s"]
    rows = [_framework_row(name, _best_on(recipe, inv, objective, learn, name)) for name in framework_names()
            if name != current and _could_be_faster(recipe, inv, learn, name, floor)]
    return framework_advice(current, rows, True, est.get("step_time_s"))


def _fits_at_all(recipe, inv, learn: bool, framework: str) -> bool:
    """Whether any plan of `framework` fits some partition of `inv`: the fewest-GPUs search, which
    needs no speed bounds and stops at the smallest plan that fits."""
    parts = _partitions(recipe, inv)
    if isinstance(parts, str):
        return False
    cons, steps = inputs.constraints(recipe), train_steps(recipe)
    return any(search(w, tgt, cons, objective="gpus", steps=steps).best is not None
               for w, tgt, _ in _workloads(recipe, inv, parts, learn, framework))


def _could_be_faster(recipe, inv, learn: bool, framework: str, tokens_per_s: float) -> bool:
    """Whether `framework` has a plan faster than `tokens_per_s` on some partition of `inv`."""
    parts = _partitions(recipe, inv)
    if isinstance(parts, str):
        return False
    cons, steps = inputs.constraints(recipe), train_steps(recipe)
    for w, tgt, _ in _workloads(recipe, inv, parts, learn, framework):
        res = search(w, tgt, cons, objective="time", steps=steps, faster_than=tokens_per_s)
        if any(c.tokens_per_s > tokens_per_s for c in res.ranked):
            return True
    return False


def framework_advice(current: str, rows: list[dict], feasible: bool, step_time_s: float | None) -> list[str]:
    """What to say when the recipe's framework does not fit, or is far slower than another here."""
    others = [r for r in rows if r["framework"] != current and r["feasible"] and r["step_time_s"]]
    if not others:
        return []
    best = min(others, key=lambda r: r["step_time_s"])
    how = (f"plan it with `--framework {best['framework']}` (or `framework: {best['framework']}` in the recipe, "
           "with a launch command for it); `--framework all` compares them")
    if not feasible:
        return [f"framework {current} does not fit here; {best['framework']} does ({best['gpus']} GPUs, step "
                f"{best['step_time_s']:.3g} s): {how}"]
    if step_time_s and step_time_s > FRAMEWORK_GAP * best["step_time_s"]:
        return [f"framework {best['framework']} is {step_time_s / best['step_time_s']:.1f}x faster here "
                f"({best['gpus']} GPUs, step {best['step_time_s']:.3g} s vs {step_time_s:.3g} s with {current}): {how}"]
    return []


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
                  "precision": w.precision, "method": w.method, "framework": w.framework.name, "attention": w.attention},
        "plan": best.plan.to_dict(),
        "framework": framework_block(w, best.plan),
        "memory": best.memory.to_dict(),
        "estimate": best.estimate.to_dict() if best.estimate else None,
        "alternatives": [_candidate(c, w, t) for c in res.ranked[1:1 + alternatives]],
        "why_not": why_lost(w, t, cons, res, objective),
        "search": {"considered": res.considered, "feasible": res.feasible_count, "rejected": dict(res.rejected)},
        "reasons": [],
        "suggestions": [],
    }
    if w.overheads.learned_from:
        out["learned"] = learned_block(w)
    if explain:
        out["explain"] = explain_search(res)
        out["explain"]["memory_checks"] = memory_checks(w, best.plan, out["memory"]["terms"])
        out["explain"]["memory_evidence"] = MEMORY_EVIDENCE
    return out


def framework_block(w, plan) -> dict:
    """The plan in its framework's own names: {name, args, files, env, notes} (jobctl.frameworks)."""
    return w.framework.render(plan, w).to_dict()


def learned_block(w) -> dict:
    """The report's "learned" block: the calibration an earlier OOM taught, and from which job."""
    o = w.overheads
    return {"from": o.learned_from, "fixed_gap_bytes": o.learned_gap_bytes, "per_scaling": o.learned_per_scaling}


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


def oom_calibration(recipe_loaded, inv_loaded, failed_plan: dict, failure: dict | None = None,
                    prior: dict | None = None) -> dict:
    """The calibration a CUDA OOM of `failed_plan` teaches (with the attempts before it,
    `prior`), without stepping down: what a job records when its chain stops."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    failed = Plan.from_dict(failed_plan, "the failed plan")
    part = next((p for p in inv.partitions if p.name == (failure or {}).get("partition")), None) or inv.partitions[0]
    t = inputs.target(inv, part, recipe.train.precision)
    w = inputs.workload(recipe, inv, cpu=t.gpu.is_cpu)
    mem = estimate(w, t.gpu_memory_bytes, failed, t.host_mem_bytes, detail=False)
    demand, source = observed_demand(t, mem.total_bytes, _oom_info(failure))
    points = Calibration.from_dict(prior).points + (CalibrationPoint(mem.total_bytes, scaling_bytes(mem), demand, source),)
    return Calibration.fit(points).to_dict()


def _oom_info(failure: dict | None) -> OOMInfo:
    return OOMInfo(**{k: int(v) for k, v in (failure or {}).items()
                      if k in ("tried_to_allocate_bytes", "total_capacity_bytes", "free_bytes", "measured_peak_bytes")
                      and v is not None})


def after_oom(recipe_loaded, inv_loaded, failed_plan: dict, failure: dict | None = None,
              history_plans: list[dict] | None = None, prior: dict | None = None) -> ClusterPlan:
    """The next plan after `failed_plan` ran out of memory (the OOM ladder), as a plan report
    with a `ladder` block: which rung, why, and the calibration the failure taught (added to
    `prior`, the calibration of the attempts before it: the failed report's own ladder block)."""

    recipe, inv = recipe_loaded.value, inv_loaded.value
    failed = Plan.from_dict(failed_plan, "the failed plan")
    part = next((p for p in inv.partitions if p.name == (failure or {}).get("partition")), None) or inv.partitions[0]
    t = inputs.target(inv, part, recipe.train.precision)
    w = inputs.workload(recipe, inv, cpu=t.gpu.is_cpu)
    if failed.global_batch_size != w.global_batch_size:
        raise UsageError(f"the failed plan's global batch ({failed.global_batch_size}) differs from the recipe's "
                         f"({w.global_batch_size}): the ladder keeps the global batch fixed")
    info = _oom_info(failure)
    seen = tuple(Plan.from_dict(p) for p in (history_plans or []))
    try:
        step = next_plan(w, t, inputs.constraints(recipe), failed, info, seen, Calibration.from_dict(prior))
    except ValueError as e:
        raise UsageError(f"cannot step down from this plan: {e}") from None
    if step is None:
        data = _no_fit(recipe_loaded, inv, None, ["the ladder is at its bottom: no plan on this partition that the "
                                                  "framework runs predicts less memory than the failed one while "
                                                  "keeping the global batch"], [], w)
        data["partition"] = t.partition
        return ClusterPlan(data, None, w, False)

    return _ladder_report(recipe_loaded, w, t, step, failed)


def _ladder_report(recipe_loaded, w, t, step, failed: Plan) -> ClusterPlan:
    """A ladder step as a plan report with its `ladder` block."""
    recipe = recipe_loaded.value
    est = estimate_step(w, step.plan, t.links, t.gpus_per_node, train_steps(recipe)) if t.links else None

    class _Res:  # the shape _report reads
        pass

    res = _Res()
    res.best = Candidate(step.plan, step.memory, est)
    res.target, res.ranked, res.considered, res.feasible_count, res.rejected = t, [], 0, 1, {}
    res.smallest = {}
    data = _report(recipe_loaded, w, res, inputs.constraints(recipe), DEFAULT_OBJECTIVE, False, 0)
    data["why_not"] = []
    data["ladder"] = {"rung": step.rung, "reason": step.reason, "usable_bytes": step.usable_bytes,
                      "calibrated_bytes": step.calibrated_bytes, "expected_to_fit": step.expected_to_fit,
                      "calibration": step.calibration.to_dict() if step.calibration.points else None,
                      "failed_plan": failed.to_dict()}
    return ClusterPlan(data, res, w, True)


def after_host_oom(recipe_loaded, inv_loaded, failed_plan: dict, failure: dict | None = None) -> ClusterPlan:
    """The next plan after `failed_plan` ran out of host memory: less CPU offload (the GPU
    plan is not what ran out). Not feasible, with the reason, when nothing is offloaded."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    failed = Plan.from_dict(failed_plan, "the failed plan")
    part = next((p for p in inv.partitions if p.name == (failure or {}).get("partition")), None) or inv.partitions[0]
    t = inputs.target(inv, part, recipe.train.precision)
    w = inputs.workload(recipe, inv, cpu=t.gpu.is_cpu)
    step = next_host_plan(w, t, inputs.constraints(recipe), failed)
    if step is None:
        why = ("the host ran out of memory with nothing offloaded to it: the training script's own host memory "
               "(data loader workers, prefetching, pinned buffers) is what to reduce, or ask for a partition with "
               "more RAM per node" if failed.offload == "none" else
               "the host ran out of memory, and bringing the offloaded states back does not fit the GPUs")
        data = _no_fit(recipe_loaded, inv, None, [why], [], w)
        data["partition"] = t.partition
        return ClusterPlan(data, None, w, False)
    return _ladder_report(recipe_loaded, w, t, step, failed)
