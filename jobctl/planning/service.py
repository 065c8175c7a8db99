"""What each `plan` request asks of the planning service, one function each: the plan on one
cluster with what the history says and the advice on other frameworks (`plan_cluster`), every
cluster side by side (`plan_clusters`), every framework on one cluster (`plan_frameworks`), the
next plan after an OOM given a saved plan file (`plan_after_oom_file`). The CLI parses, calls
one of these and prints."""

from __future__ import annotations

from collections.abc import Callable

from jobctl.errors import UsageError
from jobctl.planning.compare import compare_frameworks, framework_advice, framework_advice_for
from jobctl.planning.learn import history_for
from jobctl.planning.plans import DEFAULT_OBJECTIVE, plan_on
from jobctl.planning.report import PlanReport


def recipe_framework(recipe_loaded) -> str:
    f = recipe_loaded.value.framework
    return f if isinstance(f, str) else f.name


def plan_cluster(recipe_loaded, inv_loaded, *, objective: str = DEFAULT_OBJECTIVE, explain: bool = False,
                 learn: bool = True, advise: bool = True) -> PlanReport:
    """The plan on one cluster, what the history says of it (its "history" block; nothing is
    read without a history file) and, with `advise`, whether another framework would fit or
    be much faster (with `explain`: every framework's row too)."""
    report = plan_on(recipe_loaded, inv_loaded, objective=objective, explain=explain, learn=learn)
    past = history_for(report.to_dict())
    if past:
        report.history = past
    if advise:
        current = report.train["framework"] if report.feasible else recipe_framework(recipe_loaded)
        if explain:  # every framework planned: the rows (--framework all's table) and the advice
            rows = compare_frameworks(recipe_loaded, inv_loaded, objective, learn, known={current: report})
            report.frameworks = rows
            est = report.estimate or {}
            report.framework_advice = framework_advice(current, rows, report.feasible, est.get("step_time_s"),
                                                       est.get("tokens_per_s_per_gpu"),
                                                       report.plan["world_size"] if report.feasible else None)
        else:  # only the frameworks that could change the advice
            report.framework_advice = framework_advice_for(recipe_loaded, inv_loaded, current, report, objective,
                                                           learn)
    return report


def plan_clusters(recipe_loaded, invs_loaded: list, *, objective: str = DEFAULT_OBJECTIVE, learn: bool = True,
                  progress: Callable[[str], None] = lambda text: None) -> list[PlanReport]:
    """The recipe on every inventory, best first (by time to train, or step time; GPUs first
    for the `gpus` objective, tokens/s per GPU for `throughput`); the ones that do not fit last."""
    reports = []
    for i, inv in enumerate(invs_loaded, 1):
        progress(f"planning {recipe_loaded.path} on {inv.value.name} ({i} of {len(invs_loaded)} clusters)")
        reports.append(plan_on(recipe_loaded, inv, objective=objective, alternatives=0, learn=learn, summary=False))
    return sorted(reports, key=lambda r: (not r.feasible, _overview_key(r, objective)))


def _overview_key(report: PlanReport, objective: str):
    est = report.estimate or {}
    if not report.feasible or not est:
        return (float("inf"),)
    if objective == "gpus":
        return (report.plan["world_size"], est["step_time_s"])
    if objective == "throughput":
        return (-est["tokens_per_s_per_gpu"],)  # balanced and time: the fastest first
    return (est.get("time_to_train_s") or est["step_time_s"],)


def plan_frameworks(recipe_loaded, inv_loaded, *, objective: str = DEFAULT_OBJECTIVE, learn: bool = True) -> dict:
    """Every framework's plan for the recipe on one cluster's GPUs (`--framework all`)."""
    return {"recipe": recipe_loaded.path, "cluster": inv_loaded.value.name, "objective": objective,
            "recipe_framework": recipe_framework(recipe_loaded),
            "frameworks": compare_frameworks(recipe_loaded, inv_loaded, objective, learn)}


def plan_after_oom_file(recipe_loaded, inv_loaded, path: str, tried_to_allocate_gib: float | None = None) -> PlanReport:
    """The next plan down the OOM ladder after the plan saved in `path` (`plan --json` output,
    or a job folder's plan.json) ran out of memory; its "failure" block's figures, and
    `tried_to_allocate_gib` from PyTorch's message, tell the ladder how far it missed."""
    import json
    from dataclasses import replace

    from jobctl.model import OOMFigures
    from jobctl.planning.oom import after_oom  # the ladder, for this request only: `plan` runs in loops

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--after-oom: file not found: {path}") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"--after-oom: {path} is not a JSON plan: {e}",
                         hint="save one with `jobctl plan RECIPE --cluster C --json > plan.json`") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--after-oom: {path} holds {type(doc).__name__}, expected a JSON object")
    plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else doc
    failure = doc.get("failure") if isinstance(doc.get("failure"), dict) else {}
    figures = OOMFigures.from_dict(failure, f"--after-oom {path}: failure")
    if tried_to_allocate_gib is not None:
        if not 0 < tried_to_allocate_gib < 1 << 20:
            raise UsageError(f"--tried-to-allocate: expected a positive size in GiB, got {tried_to_allocate_gib}")
        figures = replace(figures, tried_to_allocate_bytes=int(tried_to_allocate_gib * (1 << 30)))
    partition = doc.get("partition") or failure.get("partition")
    prior = (doc.get("ladder") or {}).get("calibration") or (doc.get("learned") or {}).get("calibration")
    return after_oom(recipe_loaded, inv_loaded, plan, figures, partition if isinstance(partition, str) else None,
                     prior=prior)
