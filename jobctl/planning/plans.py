"""Plan a recipe on one inventory: search each partition, keep the best plan by the objective,
and report it (planning.report.PlanReport: the JSON contract, with the search that chose it).

This is the edge between files and the pure planner; `cli.plan` renders its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from jobctl import frameworks
from jobctl.frameworks.base import LOW_PRECISIONS
from jobctl.model import duration
from jobctl.planner import inputs
from jobctl.planner.advice import suggestions
from jobctl.planner.catalog import GIB
from jobctl.planner.explain import MEMORY_EVIDENCE, memory_checks, objective_summary, why_lost
from jobctl.planner.explain import explain as explain_search
from jobctl.planner.memory import estimate, model_state_elements, stage_layers, state_bytes
from jobctl.planner.memory.workload import low_precision_format
from jobctl.planner.perf import dispatch_copies, dp_ring, estimate_step
from jobctl.planner.resilience import checkpoint_bytes, hang_thresholds, plan_for_failures
from jobctl.planner.search import DEFAULT_OBJECTIVE, rank, search
from jobctl.planning.learn import learned_calibration
from jobctl.planning.load import train_steps
from jobctl.planning.report import PlanReport


def plan_on(recipe_loaded, inv_loaded, objective: str = DEFAULT_OBJECTIVE, explain: bool = False,
            alternatives: int = 5, learn: bool = True, summary: bool = True) -> PlanReport:
    """Search every partition of one inventory (or the pinned resources.partition) and keep
    the best plan by `objective`. With `learn`, the memory model of a partition where this
    workload (model, sequence length) ran out of GPU memory before is calibrated by what that
    failure showed (planning.learn; the report's "learned" block says from which job)."""

    recipe = recipe_loaded.value
    inv = inv_loaded.value
    best = _best_on(recipe, inv, objective, learn)
    if best.missing_partition:
        return no_fit(recipe_loaded, inv, None, [best.missing_partition], [])
    cons, steps = inputs.constraints(recipe), train_steps(recipe)
    w, tgt, res = best.workload, best.target, best.result
    if best.found:
        report = fit_report(recipe_loaded, w, res, cons, objective, explain, alternatives)
        if summary:
            report.objective_choice = objective_summary(w, tgt, cons, res, steps, every=explain)
        if best.learned:  # the evidence itself, so a chain that OOMs again builds on it
            report.learned["calibration"] = {k: v for k, v in best.learned.items() if k != "from"}
        report.warnings = (report.warnings or []) + best.advice or None
        return report
    tips = suggestions(w, tgt, cons, res) if not res.reasons or res.considered else []
    report = no_fit(recipe_loaded, inv, res, res.reasons, tips, w)
    report.warnings = (report.warnings or []) + best.advice or None
    return report


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
    advice: list = field(default_factory=list)  # calibrations of the history not applied, and why


def _best_on(recipe, inv, objective: str, learn: bool, framework: str | None = None) -> _Best:
    """Search each partition (or the pinned resources.partition) and keep the best plan by
    `objective`; `framework`: plan with this framework instead of the recipe's."""
    parts = _partitions(recipe, inv)
    if isinstance(parts, str):
        return _Best(missing_partition=parts)
    cons = inputs.constraints(recipe)
    steps = train_steps(recipe)
    found, first = [], None
    for w, tgt, learned, advice in _workloads(recipe, inv, parts, learn, framework):
        res = search(w, tgt, cons, objective=objective, steps=steps)
        if res.best is not None:
            found.append((res.best, w, tgt, res, learned, advice))
        elif first is None:
            first = (w, tgt, res, None, advice)
    if found:
        order = rank([f[0] for f in found], objective)
        _, w, tgt, res, learned, advice = next(f for f in found if f[0] is order[0])
        return _Best(True, w, tgt, res, learned, advice=advice)
    w, tgt, res, _, advice = first
    return _Best(False, w, tgt, res, advice=advice)


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
    fw = frameworks.get(framework) if framework is not None else None
    for part in parts:
        gpu = inputs.lookup_gpu(part.gpu)
        domain = inputs.nvlink_domain(part, gpu) or 0
        w = inputs.workload(recipe, inv, cpu=gpu.is_cpu, formats=gpu.formats, under=fw, nvlink_gpus=domain)
        tgt = inputs.target(inv, part, w.precision, w.fp8_recipe, w.caps.fp8_backend)
        learned, advice = None, []
        if learn:
            identity = identity or (w.model.name, w.model.params())
            learned = learned_calibration(inv.name, part.name, identity, w.seq_len, recipe_name=recipe.name,
                                          gpu_bytes=tgt.gpu_memory_bytes)
            advice = (learned or {}).pop("advice", [])
            if learned:
                w = inputs.workload(recipe, inv, cpu=tgt.gpu.is_cpu, learned=learned,
                                    formats=tgt.gpu.formats, under=fw, nvlink_gpus=domain)
        yield w, tgt, learned, advice


def _model_info(w) -> dict:
    return {"name": w.model.name, "params": w.model.params(), "active_params": w.model.active_params()}


def _candidate(c, w, t) -> dict:

    mem = estimate(w, t.gpu_memory_bytes, c.plan, t.host_mem_bytes)
    return {"plan": c.plan.to_dict(), "memory": mem.to_dict(), "estimate": c.estimate.to_dict() if c.estimate else None}


def fit_report(recipe_loaded, w, res, cons, objective, explain, alternatives, why_not: bool = True) -> PlanReport:
    """The plan report of a search's best plan (`why_not`: with the lines saying why the other
    values of each dimension lost, which take more searches)."""
    best = res.best
    t = res.target
    memory = best.memory.to_dict()
    if best.plan.pp > 1:  # the layers each stage holds (the most loaded one's are the memory's)
        first, middle, last = stage_layers(w.model.layers, best.plan.pp, w.caps.pp_split_counts_ends)
        memory["stage_layers"] = {"first": first, "middle": middle, "last": last, "mtp_on_last": w.mtp_layers}
    report = PlanReport(
        recipe=recipe_loaded.path, cluster=t.cluster, partition=t.partition, gpu=t.gpu.key, feasible=True,
        objective=objective, model=_model_info(w),
        train={"seq_len": w.seq_len, "global_batch_size": w.global_batch_size, "optimizer": w.optimizer,
               "precision": w.precision, "method": w.method, "framework": w.framework.name, "attention": w.attention,
               "grad_reduce": w.grad_reduce_dtype,
               **({"moe_dispatcher": w.moe_dispatcher} if w.model.moe is not None else {}),
               # what "selective" recomputes where the framework names modules (Megatron's --recompute-modules)
               **({"recompute_modules": list(frameworks.recompute_modules(w))}
                  if best.plan.recompute == "selective" and w.caps.recompute_modules else {})},
        plan=best.plan.to_dict(), framework=None, memory=memory,
        estimate=best.estimate.to_dict() if best.estimate else None,
        alternatives=[_candidate(c, w, t) for c in res.ranked[1:1 + alternatives]],
        why_not=why_lost(w, t, cons, res, objective) if why_not else [],
        search={"considered": res.considered, "feasible": res.feasible_count, "rejected": dict(res.rejected)},
        result=res, workload=w)
    if report.estimate is not None and t.links is not None:
        report.estimate["data_parallel_ring"] = dp_ring(best.plan, t.links, t.nvlink_gpus)
    if w.overheads.learned_from:
        report.learned = learned_block(w)
    report.resilience = resilience_block(w, best.plan, best.estimate, t, recipe_loaded.value)
    report.framework = framework_block(w, best.plan, report.resilience.get("interval_steps"))
    report.warnings = (plan_warnings(recipe_loaded.value, w, t.links) + dispatcher_advice(w, best, t)) or None
    if explain:
        report.explain = explain_search(res)
        report.explain["memory_checks"] = memory_checks(w, best.plan, memory["terms"])
        report.explain["memory_evidence"] = MEMORY_EVIDENCE
    return report


def resilience_block(w, plan, est, t, recipe=None) -> dict:
    """Checkpoints and interruptions for a full training run (planner/resilience.py; not for
    LoRA, whose adapters are a small checkpoint, nor without a step estimate), and the hang
    thresholds of the runner's watchdog (always)."""
    out: dict = {}
    write_s = None
    if w.method == "full" and est is not None and est.step_time_s:
        sb = state_bytes(w.framework, w.precision, w.optimizer, w.grad_reduce_dtype)
        size = checkpoint_bytes(w.model.params(), sb.weight, sb.master, model_state_elements(w), sb.state_elem)
        out = plan_for_failures(size, plan.nodes, est.step_time_s, est.time_to_train_s,
                                t.checkpoint_write_gbs_per_node, t.interruptions_per_node_day).to_dict()
        write_s = out["write_s"]
    hang_after = getattr(getattr(recipe, "resources", None), "hang_after", None)
    first, after = hang_thresholds(est.step_time_s if est is not None else None, write_s, hang_after)
    return out | {"hang_first_step_s": round(first, 1), "hang_after_s": round(after, 1)}


def plan_warnings(recipe, w, links=None) -> list[str]:
    """What the user should know before trusting the numbers: a low precision whose speed is not
    fitted yet, and the release of the framework the recipe declares (framework.version) when
    jobctl renders it for another."""
    out = []
    caps = w.caps
    fmt = low_precision_format(w.precision, w.fp8_recipe, caps.fp8_backend)
    rowwise = fmt == "fp8-rowwise"
    if w.precision in LOW_PRECISIONS and not (links and links.low_tflops):
        if rowwise:
            copies = "row-wise Float8 keeps no weight copies (its memory is BF16's)"
        elif caps.fp8_backend == "torchao":
            name = {"fp8": "Float8", "mxfp8": "MXFP8"}.get(w.precision, w.precision)
            copies = f"torchao's {name} keeps no weight copies" + (
                "; under FSDP2 the layers' weights are all-gathered in FP8" if caps.fsdp_float8_all_gather else
                " (its memory is BF16's)")
        else:
            copies = f"the memory includes Transformer Engine's {w.precision} weight copies"
        out.append(f"{w.precision}: the step time counts the GEMMs at the BF16 rate on this GPU until the "
                   f"{w.precision} efficiency is fitted on published runs of it (no speed-up is promised yet); "
                   f"{copies}")
    elif rowwise:
        out.append("fp8 row-wise (torchao): torchtitan measured it no faster than BF16 under TP 8 (0.81x-1.00x of "
                   "BF16's tokens/s; docs/step-time-accuracy.md), and the step time counts its casts; plan bf16-mixed "
                   "too before choosing it")
    if w.precision == "fp8" and caps.fp8_loads_model_per_rank:
        per_rank = w.model.params() * 4 / GIB
        out.append(f"fp8 under FSDP2 ({caps.name}): every rank loads the whole model into host RAM and upcasts it "
                   f"to fp32 before sharding it ({per_rank:,.0f} GiB per rank: accelerate refuses "
                   "cpu_ram_efficient_loading with torchao), counted in host RAM per node, which can cap the GPUs "
                   "used per node; bf16-mixed loads it on one rank")
    if w.model.mtp_layers and not w.mtp_layers:
        has = ", ".join(n for n, f in frameworks.REGISTRY.items() if f.caps.mtp)
        out.append(f"{w.model.name} has {w.model.mtp_layers} multi-token-prediction module(s), which {caps.name} does "
                   f"not build: the plan trains the main model only (its memory and step leave them out; {has} "
                   "trains them)")
    declared = None if isinstance(recipe.framework, str) else recipe.framework.version
    if not declared or not caps.versions:
        return out
    if any(declared == v or v.startswith(declared + ".") or declared.startswith(v + ".") for v in caps.versions):
        return out
    return out + [f"the recipe's framework.version is {caps.package} {declared}; jobctl renders {caps.name} for "
                  f"{', '.join(caps.versions)} (README: Frameworks): check the rendered flags against {declared}"]


def dispatcher_advice(w, best, t) -> list[str]:
    """Where the plan's expert parallelism crosses NVLink domains with NCCL's all-to-alls and its
    framework offers HybridEP (train.moe_dispatcher), what HybridEP would do to this layout: the
    network copies per token and the step (perf._routed_experts), if it still fits."""
    plan, caps = best.plan, w.caps
    if (w.model.moe is None or w.moe_dispatcher != "alltoall" or "hybridep" not in caps.moe_dispatchers
            or plan.ep <= t.nvlink_gpus or best.estimate is None or t.links is None):
        return []
    hybrid = replace(w, moe_dispatcher="hybridep")
    if not estimate(hybrid, t.gpu_memory_bytes, plan, t.host_mem_bytes, detail=False).fits:
        return []
    step = estimate_step(hybrid, plan, t.links, t.nvlink_gpus).step_time_s
    x, local = w.model.moe, min(plan.ep, t.nvlink_gpus)
    copies, crossings = (dispatch_copies(x.experts, x.top_k, plan.ep, local, h)[1] for h in (False, True))
    return [f"expert parallelism {plan.ep} spans {plan.ep // local} NVLink domains: with train.moe_dispatcher: "
            f"hybridep (Megatron's flex dispatcher on DeepEP's HybridEP kernels, which the container must have) a "
            f"token would cross the network {crossings:.2f} times instead of {copies:.2f}, and this layout's step "
            f"would take {duration(step)} instead of {duration(best.estimate.step_time_s)}"]


def framework_block(w, plan, checkpoint_every: int | None = None) -> dict:
    """The plan in its framework's own names: {name, args, files, env, notes} (jobctl.frameworks),
    saving a checkpoint every `checkpoint_every` steps unless the recipe says how often."""
    if checkpoint_every and not w.training.checkpoint_every:
        w = replace(w, training=replace(w.training, checkpoint_every=checkpoint_every))
    return w.framework.render(plan, w).to_dict()


def learned_block(w) -> dict:
    """The report's "learned" block: the calibration an earlier OOM taught, and from which job."""
    o = w.overheads
    return {"from": o.learned_from, "fixed_gap_bytes": o.learned_gap_bytes, "per_scaling": o.learned_per_scaling}


def no_fit(recipe_loaded, inv, res, reasons, tips, w=None, partition: str | None = None) -> PlanReport:
    """The report of a recipe that does not fit (`res`: the search that says why, with the
    layout that came closest; `partition`: where, when there was no search)."""
    closest = res.closest if res is not None else None
    return PlanReport(
        recipe=recipe_loaded.path, cluster=inv.name, partition=res.target.partition if res is not None else partition,
        gpu=res.target.gpu.key if res is not None else None, feasible=False,
        model=_model_info(w) if w is not None else None,
        closest={"plan": closest.plan.to_dict(), "memory": closest.memory.to_dict()} if closest else None,
        search={"considered": res.considered, "feasible": 0, "rejected": dict(res.rejected)} if res else None,
        reasons=list(reasons), suggestions=list(tips), result=res, workload=w)


def gib(x: float) -> float:
    return x / GIB
