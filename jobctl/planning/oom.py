"""After a job ran out of memory: the next plan down the OOM ladder (planner.ladder), as a plan
report with its `ladder` block, and the calibration the failure taught."""

from __future__ import annotations

from jobctl.errors import UsageError
from jobctl.model import OOMFigures
from jobctl.planner import inputs
from jobctl.planner.ladder import (
    Calibration,
    CalibrationPoint,
    next_host_plan,
    next_plan,
    observed_demand,
    scaling_bytes,
)
from jobctl.planner.memory import estimate
from jobctl.planner.perf import estimate_step
from jobctl.planner.plan import Plan
from jobctl.planner.search import DEFAULT_OBJECTIVE, Candidate, SearchResult
from jobctl.planning.load import train_steps
from jobctl.planning.plans import fit_report, no_fit
from jobctl.planning.report import PlanReport


def _failed_on(recipe, inv, failed_plan: dict, partition: str | None):
    """The failed plan, the target it ran on (its partition, else the inventory's first) and the
    workload."""
    failed = Plan.from_dict(failed_plan, "the failed plan")
    part = next((p for p in inv.partitions if p.name == partition), None) or inv.partitions[0]
    gpu = inputs.lookup_gpu(part.gpu)
    w = inputs.workload(recipe, inv, cpu=gpu.is_cpu, formats=gpu.formats,
                        nvlink_gpus=inputs.nvlink_domain(part, gpu) or 0)
    return failed, inputs.target(inv, part, w.precision, w.fp8_recipe, w.caps.fp8_backend), w


def oom_calibration(recipe_loaded, inv_loaded, failed_plan: dict, figures: OOMFigures | None = None,
                    partition: str | None = None, prior: dict | None = None) -> dict:
    """The calibration a CUDA OOM of `failed_plan` teaches (with the attempts before it,
    `prior`), without stepping down: what a job records when its chain stops."""
    failed, t, w = _failed_on(recipe_loaded.value, inv_loaded.value, failed_plan, partition)
    mem = estimate(w, t.gpu_memory_bytes, failed, t.host_mem_bytes, detail=False)
    demand, source = observed_demand(t, mem.total_bytes, figures)
    points = Calibration.from_dict(prior).points + (CalibrationPoint(mem.total_bytes, scaling_bytes(mem), demand, source),)
    return Calibration.fit(points).to_dict()


def after_oom(recipe_loaded, inv_loaded, failed_plan: dict, figures: OOMFigures | None = None,
              partition: str | None = None, history_plans: list[dict] | None = None,
              prior: dict | None = None) -> PlanReport:
    """The next plan after `failed_plan` ran out of memory on `partition` (the OOM ladder), as a
    plan report with a `ladder` block: which rung, why, and the calibration the failure taught
    (added to `prior`, the calibration of the attempts before it: the failed report's own
    ladder block)."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    failed, t, w = _failed_on(recipe, inv, failed_plan, partition)
    if failed.global_batch_size != w.global_batch_size:
        raise UsageError(f"the failed plan's global batch ({failed.global_batch_size}) differs from the recipe's "
                         f"({w.global_batch_size}): the ladder keeps the global batch fixed")
    seen = tuple(Plan.from_dict(p) for p in (history_plans or []))
    try:
        step = next_plan(w, t, inputs.constraints(recipe), failed, figures, seen, Calibration.from_dict(prior))
    except ValueError as e:
        raise UsageError(f"cannot step down from this plan: {e}") from None
    if step is None:
        return no_fit(recipe_loaded, inv, None, ["the ladder is at its bottom: no plan on this partition that the "
                                                 "framework runs predicts less memory than the failed one while "
                                                 "keeping the global batch"], [], w, t.partition)

    return _ladder_report(recipe_loaded, w, t, step, failed)


def _ladder_report(recipe_loaded, w, t, step, failed: Plan) -> PlanReport:
    """A ladder step as a plan report with its `ladder` block."""
    recipe = recipe_loaded.value
    est = estimate_step(w, step.plan, t.links, t.nvlink_gpus, train_steps(recipe)) if t.links else None

    # the step as a search's result (one plan, nothing else considered), for the plan report
    res = SearchResult(target=t, best=Candidate(step.plan, step.memory, est), feasible_count=1)
    report = fit_report(recipe_loaded, w, res, inputs.constraints(recipe), DEFAULT_OBJECTIVE, False, 0, why_not=False)
    report.ladder = {"rung": step.rung, "reason": step.reason, "usable_bytes": step.usable_bytes,
                     "calibrated_bytes": step.calibrated_bytes, "expected_to_fit": step.expected_to_fit,
                     "calibration": step.calibration.to_dict() if step.calibration.points else None,
                     "failed_plan": failed.to_dict()}
    return report


def after_host_oom(recipe_loaded, inv_loaded, failed_plan: dict, partition: str | None = None) -> PlanReport:
    """The next plan after `failed_plan` ran out of host memory on `partition`: less CPU
    offload (the GPU plan is not what ran out). Not feasible, with the reason, when nothing is
    offloaded."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    failed, t, w = _failed_on(recipe, inv, failed_plan, partition)
    step = next_host_plan(w, t, inputs.constraints(recipe), failed)
    if step is None:
        why = ("the host ran out of memory with nothing offloaded to it: the training script's own host memory "
               "(data loader workers, prefetching, pinned buffers) is what to reduce, or ask for a partition with "
               "more RAM per node" if failed.offload == "none" else
               "the host ran out of memory, and bringing the offloaded states back does not fit the GPUs")
        return no_fit(recipe_loaded, inv, None, [why], [], w, t.partition)
    return _ladder_report(recipe_loaded, w, t, step, failed)
