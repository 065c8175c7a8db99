"""Frameworks side by side on one inventory, and the advice `plan` gives when the recipe's
framework does not fit or another is far faster."""

from __future__ import annotations

from jobctl.frameworks import NAMES
from jobctl.model import duration
from jobctl.planner import inputs
from jobctl.planner.plan import Plan
from jobctl.planner.search import DEFAULT_OBJECTIVE, search
from jobctl.planning.load import train_steps
from jobctl.planning.plans import _Best, _best_on, _partitions, _workloads
from jobctl.planning.report import PlanReport


# A recipe's framework is "far slower" than another on the same GPUs beyond this step-time ratio.
FRAMEWORK_GAP = 1.2


def framework_names() -> list[str]:
    """The frameworks `--framework all` compares (`generic` is custom's old name)."""
    return [n for n in NAMES if n != "generic"]


def compare_frameworks(recipe_loaded, inv_loaded, objective: str = DEFAULT_OBJECTIVE, learn: bool = True,
                       known: dict | None = None) -> list[dict]:
    """The recipe planned with each framework on one inventory, as rows: {framework, feasible,
    gpus, layout, plan, step_time_s, tokens_per_s_per_gpu, memory_bytes, reason, refused}. Each framework
    is the recipe's workload with that framework's capability table (the recipe is not read
    again). `known`: {framework: PlanReport} already computed (not planned again)."""
    rows = []
    for name in framework_names():
        report = (known or {}).get(name)
        if report is None:
            rows.append(_framework_row(name, _best_on(recipe_loaded.value, inv_loaded.value, objective, learn, name)))
            continue
        row = _framework_row(name, None)
        if report.feasible:
            _fill_row(row, report.plan, report.estimate or {}, report.memory)
        else:
            row["reason"] = (report.reasons or ["does not fit"])[0]
        rows.append(row)
    return rows


def _framework_row(name: str, best: _Best | None) -> dict:
    """One row of the framework comparison from that framework's best plan (None: empty)."""
    row = {"framework": name, "feasible": False, "gpus": None, "layout": None, "plan": None, "step_time_s": None,
           "tokens_per_s_per_gpu": None, "memory_bytes": None, "reason": None, "refused": False}
    if best is None:
        return row
    if best.found:
        top = best.result.best
        _fill_row(row, top.plan.to_dict(), top.estimate.to_dict() if top.estimate else {}, top.memory.to_dict())
    else:
        row["reason"] = best.missing_partition or (best.result.reasons or ["does not fit"])[0]
        # nothing was sized: the framework cannot run the recipe (or no layout exists), which is
        # not "does not fit"
        row["refused"] = best.result.considered == 0 and bool(best.result.reasons)
    return row


def _fill_row(row: dict, plan: dict, est: dict, mem: dict) -> None:
    row.update(feasible=True, gpus=plan["world_size"], layout=Plan.from_dict(plan).summary(), plan=plan,
               step_time_s=est.get("step_time_s"), tokens_per_s_per_gpu=est.get("tokens_per_s_per_gpu"),
               memory_bytes=mem["total_bytes"])


def framework_advice_for(recipe_loaded, inv_loaded, current: str, report: PlanReport, objective: str = DEFAULT_OBJECTIVE,
                         learn: bool = True) -> list[str]:
    """framework_advice without planning every framework. When the recipe's framework fits,
    another is planned only if a search for its fastest plan, from a floor of FRAMEWORK_GAP x
    this plan's tokens/s, finds one above it: a framework whose fastest plan is not that much
    faster has no plan (for any objective) that the advice would name. When it does not fit,
    every framework is planned (the advice names the fastest that fits)."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    if not report.feasible:  # the fastest that fits: planned where anything fits at all
        rows = [_framework_row(name, _best_on(recipe, inv, objective, learn, name)) for name in framework_names()
                if name != current and _fits_at_all(recipe, inv, learn, name)]
        return framework_advice(current, rows, False, None)
    est = report.estimate or {}
    if not est.get("tokens_per_s"):
        return []
    floor = FRAMEWORK_GAP * est["tokens_per_s"]
    per_gpu = est.get("tokens_per_s_per_gpu") or 0.0
    rows = [_framework_row(name, _best_on(recipe, inv, objective, learn, name)) for name in framework_names()
            if name != current and _could_be_faster(recipe, inv, learn, name, floor, per_gpu)]
    return framework_advice(current, rows, True, est.get("step_time_s"), est.get("tokens_per_s_per_gpu"),
                            report.plan["world_size"])


def _fits_at_all(recipe, inv, learn: bool, framework: str) -> bool:
    """Whether any plan of `framework` fits some partition of `inv`: the fewest-GPUs search, which
    needs no speed bounds and stops at the smallest plan that fits."""
    parts = _partitions(recipe, inv)
    if isinstance(parts, str):
        return False
    cons, steps = inputs.constraints(recipe), train_steps(recipe)
    return any(search(w, tgt, cons, objective="gpus", steps=steps).best is not None
               for w, tgt, _, _ in _workloads(recipe, inv, parts, learn, framework))


def _could_be_faster(recipe, inv, learn: bool, framework: str, tokens_per_s: float, per_gpu: float = 0.0) -> bool:
    """Whether `framework` has a plan faster than `tokens_per_s` on some partition of `inv`, at
    least `per_gpu` tokens/s per GPU (the advice names no framework faster only for taking more
    GPUs): layouts whose bounds reach neither are not evaluated; among the plans the search
    finds, those slower than a faster one that misses `per_gpu` are not looked for (the advice
    then stays silent)."""
    parts = _partitions(recipe, inv)
    if isinstance(parts, str):
        return False
    cons, steps = inputs.constraints(recipe), train_steps(recipe)
    for w, tgt, _, _ in _workloads(recipe, inv, parts, learn, framework):
        res = search(w, tgt, cons, objective="time", steps=steps, faster_than=tokens_per_s, per_gpu_floor=per_gpu)
        if any(c.tokens_per_s > tokens_per_s and c.tokens_per_s_per_gpu >= per_gpu for c in res.ranked):
            return True
    return False


def framework_advice(current: str, rows: list[dict], feasible: bool, step_time_s: float | None,
                     per_gpu: float | None = None, gpus: int | None = None) -> list[str]:
    """What to say when the recipe's framework does not fit, or is far slower than another here:
    a step FRAMEWORK_GAP times shorter, without fewer tokens/s per GPU than this plan's `per_gpu`
    on its `gpus` (a plan faster only for taking more GPUs is one the objective weighed)."""
    others = [r for r in rows if r["framework"] != current and r["feasible"] and r["step_time_s"]]
    if not others:
        return []
    best = min(others, key=lambda r: r["step_time_s"])
    how = (f"plan it with `--framework {best['framework']}` (or `framework: {best['framework']}` in the recipe, "
           "with a launch command for it); `--framework all` compares them")
    if not feasible:
        return [f"framework {current} does not fit here; {best['framework']} does ({_gpus(best['gpus'])}, step "
                f"{duration(best['step_time_s'])}): {how}"]
    if step_time_s and step_time_s > FRAMEWORK_GAP * best["step_time_s"]:
        if per_gpu and (best["tokens_per_s_per_gpu"] or 0) < per_gpu:
            return []
        on = f"{_gpus(gpus)}, " if gpus else ""
        return [f"framework {best['framework']} is {step_time_s / best['step_time_s']:.1f}x faster here "
                f"({_gpus(best['gpus'])}, step {duration(best['step_time_s'])} vs {on}{duration(step_time_s)} with "
                f"{current}): "
                f"{how}"]
    return []


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")
