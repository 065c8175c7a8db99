"""Find the parallelism and memory settings that fit a recipe, and explain every number."""

from __future__ import annotations

from jobctl import ui
from jobctl.config.workspace import all_cluster_names
from jobctl.errors import EXIT_NO_FIT, EXIT_OK, UsageError
from jobctl.planning import DEFAULT_OBJECTIVE, OBJECTIVES, framework_names, load_request
from jobctl.planning.service import plan_after_oom_file, plan_cluster, plan_clusters, plan_frameworks

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
            report = plan_cluster(rec, invs[0], objective=args.objective, explain=args.explain,
                                  learn=not args.no_learn, advise=not args.emit)
        if args.as_json:
            ui.print_json(report.to_dict())
        elif args.emit and report.feasible:
            ui.render_framework(report.framework)
        else:
            ui.render_plan(report.to_dict())
            ui.render_history(report.history or {})
        return EXIT_OK if report.feasible else EXIT_NO_FIT
    with ui.progress(f"planning {rec.path}") as shown:
        reports = plan_clusters(rec, invs, objective=args.objective, learn=not args.no_learn, progress=shown.update)
    if args.as_json:
        ui.print_json({"recipe": rec.path, "objective": args.objective, "clusters": [r.to_dict() for r in reports]})
    else:
        ui.render_plan_overview([r.to_dict() for r in reports], rec.path, wide=args.wide)
    return EXIT_OK if any(r.feasible for r in reports) else EXIT_NO_FIT


def _all_frameworks(args) -> int:
    """--framework all: the recipe planned with every framework on one cluster's GPUs."""
    if not args.cluster:
        raise UsageError("--framework all needs --cluster (it compares frameworks on the same GPUs)",
                         hint="jobctl plan RECIPE --cluster C --framework all")
    rec, invs = load_request(args.recipe, list(args.overrides), [args.cluster])
    ui.notes(rec, *invs)
    with ui.progress(f"planning {rec.path} on {invs[0].value.name} with every framework"):
        out = plan_frameworks(rec, invs[0], objective=args.objective, learn=not args.no_learn)
    if args.as_json:
        ui.print_json(out)
    else:
        ui.render_framework_table(out["frameworks"], rec.path, out["cluster"], out["recipe_framework"], args.objective)
    return EXIT_OK if any(r["feasible"] for r in out["frameworks"]) else EXIT_NO_FIT


def _after_oom(args) -> int:
    """--after-oom PLAN.json: the next plan down the OOM ladder, as `plan` would print it."""
    if not args.cluster:
        raise UsageError("--after-oom needs --cluster", hint="jobctl plan RECIPE --cluster C --after-oom PLAN.json")
    rec, invs = load_request(args.recipe, list(args.overrides), [args.cluster])
    ui.notes(rec, *invs)
    report = plan_after_oom_file(rec, invs[0], args.after_oom, args.tried_to_allocate)
    if args.as_json:
        ui.print_json(report.to_dict())
    else:
        if report.ladder:
            ui.info(f"after the OOM: {report.ladder['rung']} — {report.ladder['reason']}")
        ui.render_plan(report.to_dict())
    return EXIT_OK if report.feasible else EXIT_NO_FIT
