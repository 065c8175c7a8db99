"""Find the parallelism and memory settings that fit a recipe, and explain every number."""

from __future__ import annotations

from jobctl.errors import EXIT_NO_FIT, EXIT_OK

HELP = "plan a recipe: which layout fits, its memory term by term, or why nothing fits"
EPILOG = """examples:
  jobctl plan recipes/llama70b.yaml --cluster h100
  jobctl plan recipes/llama70b.yaml --cluster h100 train.seq_len=4096 parallelism.tp=4 --json
  jobctl plan recipes/llama8b.yaml              # every inventory in clusters/, one row each

exit codes: 0 fits, 3 does not fit (or a pinned layout is impossible), 2 bad input."""


def add_arguments(p) -> None:
    p.add_argument("recipe", help="recipe file (or a name from recipes/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, e.g. train.seq_len=4096")
    p.add_argument("--cluster", "-c", help="inventory name from clusters/ or a path to one (default: all)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON (bytes) on stdout")


def run(args) -> int:
    from jobctl import ui
    from jobctl.planning import load_inventory, load_recipe, plan_on
    from jobctl.workspace import all_cluster_names

    rec = load_recipe(args.recipe, list(args.overrides))
    if args.cluster:
        result = plan_on(rec, load_inventory(args.cluster))
        if args.as_json:
            ui.print_json(result.data)
        else:
            ui.render_plan(result.data)
        return EXIT_OK if result.feasible else EXIT_NO_FIT
    reports = [plan_on(rec, load_inventory(name)).data for name in all_cluster_names()]
    if args.as_json:
        ui.print_json({"recipe": rec.path, "clusters": reports})
    else:
        ui.render_plan_overview(reports, rec.path)
    return EXIT_OK if any(r["feasible"] for r in reports) else EXIT_NO_FIT
