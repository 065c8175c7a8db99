"""Find the parallelism and memory settings that fit a recipe, and explain every number."""

from __future__ import annotations

from jobctl import ui
from jobctl.config.workspace import all_cluster_names
from jobctl.errors import EXIT_NO_FIT, EXIT_OK, UsageError
from jobctl.planning import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    compare_frameworks,
    framework_advice,
    framework_advice_for,
    framework_names,
    load_request,
    plan_on,
)
from jobctl.planning.learn import history_for

HELP = "plan a recipe: which layout fits, its memory term by term, or why nothing fits"
EPILOG = """examples:
  jobctl plan recipes/llama70b.yaml --cluster h100
  jobctl plan recipes/llama70b.yaml --cluster h100 train.seq_len=4096 parallelism.tp=4 --json
  jobctl plan recipes/llama8b.yaml              # every inventory in clusters/, one row each
  jobctl plan recipes/llama8b.yaml --cluster h100 --emit   # torchtitan's command-line overrides
  jobctl plan recipes/llama70b.yaml --cluster h100 --framework all   # frameworks side by side
  jobctl plan recipes/llama70b.yaml --cluster h100 --objective time  # fastest, whatever it costs

exit codes: 0 fits, 3 does not fit (or a pinned layout is impossible), 2 bad input."""


def add_arguments(p) -> None:
    p.add_argument("recipe", help="recipe file (or a name from recipes/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, e.g. train.seq_len=4096")
    p.add_argument("--cluster", "-c", help="inventory name from clusters/ or a path to one (default: all)")
    p.add_argument("--objective", choices=OBJECTIVES, default=DEFAULT_OBJECTIVE,
                   help="balanced (default): the fastest plan on the partition (or resources.max_nodes/nodes) "
                        "whose tokens/s per GPU stays within 90%% of the best, filling a node whenever the whole node "
                        "is faster; time: the fastest, whatever it costs; throughput: the best tokens/s per GPU "
                        "(cheapest GPU-hours); gpus: fewest GPUs")
    p.add_argument("--framework", metavar="NAME|all",
                   help="plan with this framework instead of the recipe's (" + ", ".join(framework_names())
                        + "); all: every framework side by side on the same GPUs (needs --cluster)")
    p.add_argument("--explain", action="store_true", help="print the whole decision: layouts considered, rejections, winners")
    p.add_argument("--after-oom", metavar="PLAN.json", help="the next plan to try after this plan ran out of memory")
    p.add_argument("--tried-to-allocate", metavar="GIB", type=float,
                   help="with --after-oom: the failed allocation from PyTorch's message (GiB)")
    p.add_argument("--no-learn", action="store_true",
                   help="leave out what earlier CUDA OOMs of this workload on the cluster taught the memory model")
    p.add_argument("--emit", action="store_true",
                   help="print the plan as its framework's configuration (flags, environment, files) and nothing else")
    p.add_argument("--wide", action="store_true", help="without --cluster: full layouts and reasons in the table")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON (bytes) on stdout")


def run(args) -> int:

    if args.after_oom:
        return _after_oom(args)
    if args.emit and not args.cluster:
        raise UsageError("--emit needs --cluster (a configuration is for one cluster)",
                         hint="jobctl plan RECIPE --cluster C --emit")
    overrides = list(args.overrides)
    if args.framework == "all":
        return _all_frameworks(args)
    if args.framework:
        if args.framework not in framework_names() + ["generic"]:
            raise UsageError(f"--framework: unknown framework {args.framework!r}",
                             hint="one of: " + ", ".join(framework_names()) + ", or all")
        overrides.append(f"framework={args.framework}")
    rec, invs = load_request(args.recipe, overrides, [args.cluster] if args.cluster else all_cluster_names())
    ui.notes(rec, *invs)
    if args.cluster:
        with ui.progress(f"planning {rec.path} on {invs[0].value.name}"):
            result, past = _plan_one(args, rec, invs[0])
        if args.as_json:
            ui.print_json(result.data)
        elif args.emit and result.feasible:
            ui.render_framework(result.data["framework"])
        else:
            ui.render_plan(result.data)
            ui.render_history(past)
        return EXIT_OK if result.feasible else EXIT_NO_FIT
    reports = []
    with ui.progress(f"planning {rec.path}") as shown:
        for i, inv in enumerate(invs, 1):
            shown.update(f"planning {rec.path} on {inv.value.name} ({i} of {len(invs)} clusters)")
            reports.append(plan_on(rec, inv, objective=args.objective, alternatives=0, learn=not args.no_learn,
                                   summary=False).data)
    reports.sort(key=lambda r: (not r["feasible"], _overview_key(r, args.objective)))
    if args.as_json:
        ui.print_json({"recipe": rec.path, "objective": args.objective, "clusters": reports})
    else:
        ui.render_plan_overview(reports, rec.path, wide=args.wide)
    return EXIT_OK if any(r["feasible"] for r in reports) else EXIT_NO_FIT


def _plan_one(args, rec, inv):
    """The plan on one cluster, what the history says of it, and (not for --emit) the advice on
    the other frameworks."""
    result = plan_on(rec, inv, objective=args.objective, explain=args.explain, learn=not args.no_learn)
    past = history_for(result.data)  # reads nothing when there is no history file
    if past:
        result.data["history"] = past
    if not args.emit:
        current = result.data["train"]["framework"] if result.feasible else (
            args.framework or _recipe_framework(rec))
        if args.explain:  # every framework planned: the rows (--framework all's table) and the advice
            est = result.data.get("estimate") or {}
            rows = compare_frameworks(rec, inv, args.objective, not args.no_learn, known={current: result.data})
            result.data["frameworks"] = rows
            advice = framework_advice(current, rows, result.feasible, est.get("step_time_s"))
        else:  # only the frameworks that could change the advice
            advice = framework_advice_for(rec, inv, current, result.data, args.objective, not args.no_learn)
        result.data["framework_advice"] = advice
    return result, past


def _recipe_framework(rec) -> str:
    f = rec.value.framework
    return f if isinstance(f, str) else f.name


def _all_frameworks(args) -> int:
    """--framework all: the recipe planned with every framework on one cluster's GPUs."""
    if not args.cluster:
        raise UsageError("--framework all needs --cluster (it compares frameworks on the same GPUs)",
                         hint="jobctl plan RECIPE --cluster C --framework all")
    rec, invs = load_request(args.recipe, list(args.overrides), [args.cluster])
    ui.notes(rec, *invs)
    with ui.progress(f"planning {rec.path} on {invs[0].value.name} with every framework"):
        rows = compare_frameworks(rec, invs[0], args.objective, not args.no_learn)
    current = _recipe_framework(rec)
    if args.as_json:
        ui.print_json({"recipe": rec.path, "cluster": invs[0].value.name, "objective": args.objective,
                       "recipe_framework": current, "frameworks": rows})
    else:
        ui.render_framework_table(rows, rec.path, invs[0].value.name, current, args.objective)
    return EXIT_OK if any(r["feasible"] for r in rows) else EXIT_NO_FIT


def _overview_key(report: dict, objective: str):
    """Clusters side by side, best first: by time to train (or step time), then GPUs."""
    est = report.get("estimate") or {}
    if not report["feasible"] or not est:
        return (float("inf"),)
    if objective == "gpus":
        return (report["plan"]["world_size"], est["step_time_s"])
    if objective == "throughput":
        return (-est["tokens_per_s_per_gpu"],)  # balanced and time: the fastest first
    return (est.get("time_to_train_s") or est["step_time_s"],)


def _after_oom(args) -> int:
    """--after-oom PLAN.json: the next plan down the OOM ladder, as `plan` would print it."""
    import json
    from dataclasses import replace

    from jobctl.model import OOMFigures
    from jobctl.planning.oom import after_oom  # the ladder, for this flag only: `plan` runs in loops

    if not args.cluster:
        raise UsageError("--after-oom needs --cluster", hint="jobctl plan RECIPE --cluster C --after-oom PLAN.json")
    try:
        with open(args.after_oom, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--after-oom: file not found: {args.after_oom}") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"--after-oom: {args.after_oom} is not a JSON plan: {e}",
                         hint="save one with `jobctl plan RECIPE --cluster C --json > plan.json`") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--after-oom: {args.after_oom} holds {type(doc).__name__}, expected a JSON object")
    plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else doc
    failure = doc.get("failure") if isinstance(doc.get("failure"), dict) else {}
    figures = OOMFigures.from_dict(failure, f"--after-oom {args.after_oom}: failure")
    if args.tried_to_allocate is not None:
        if not 0 < args.tried_to_allocate < 1 << 20:
            raise UsageError(f"--tried-to-allocate: expected a positive size in GiB, got {args.tried_to_allocate}")
        figures = replace(figures, tried_to_allocate_bytes=int(args.tried_to_allocate * (1 << 30)))
    partition = doc.get("partition") or failure.get("partition")
    rec, invs = load_request(args.recipe, list(args.overrides), [args.cluster])
    ui.notes(rec, *invs)
    prior = (doc.get("ladder") or {}).get("calibration") or (doc.get("learned") or {}).get("calibration")
    result = after_oom(rec, invs[0], plan, figures, partition if isinstance(partition, str) else None, prior=prior)
    if args.as_json:
        ui.print_json(result.data)
    else:
        lad = result.data.get("ladder")
        if lad:
            ui.info(f"after the OOM: {lad['rung']} — {lad['reason']}")
        ui.render_plan(result.data)
    return EXIT_OK if result.feasible else EXIT_NO_FIT
