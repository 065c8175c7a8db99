"""Discover a Slurm cluster's partitions as an inventory, or check an inventory against the cluster.

`discover` runs `sinfo -h -o '%P|%a|%l|%D|%c|%m|%G|%N'`, `scontrol show partition -o` and
`scontrol show node -o` (locally, or over SSH on a login node with strict host key checking) and
prints an inventory YAML on stdout, with comments saying where each value came from.
GRES types are mapped onto the GPU catalog (h100 -> h100-sxm-80gb, mi300x -> mi300x-192gb ...);
when a type is ambiguous (`a100`: 40 or 80 GB; untyped `gpu:8`) jobctl asks on a terminal, and
otherwise stops with exit code 2 naming the --gpu-map to pass.

`check` compares an inventory with what the cluster reports now: partitions missing or extra,
node counts, drained/down nodes, GPUs per node, CPUs, memory, time limit, and (with a `login:`
block) whether the login works.
"""

from __future__ import annotations

import sys

from jobctl import ui
from jobctl.config.loader import login_for_host, parse_yaml_text
from jobctl.errors import EXIT_OK, UsageError
from jobctl.planner.catalog import gpu_names, unknown_message
from jobctl.planning import load_inventory
from jobctl.planning.clusters import check, discover, suspect_nodes

EXIT_DRIFT = 3

HELP = "discover a Slurm cluster as an inventory, or check an inventory for drift"
EPILOG = """examples:
  jobctl clusters discover > clusters/mine.yaml          # this machine's Slurm
  jobctl clusters discover login.example.org --name big  # over SSH (~/.ssh/config aliases work)
  jobctl clusters discover --cluster big                 # over SSH, with big's `login:` block
  jobctl clusters discover --gpu-map a100=a100-sxm-40gb --gpu-map gpu=h100-sxm-80gb
  jobctl clusters check big

--gpu-map GRESTYPE=KEY: the catalog key for a GRES type; `gpu=KEY` is for untyped GRES (gpu:8).

exit codes: 0 ok / no drift, 2 bad input (or an ambiguous GPU type without a terminal to ask on),
            3 check: the inventory has drifted from the cluster (missing, changed or extra values),
            5 the cluster cannot be reached (sinfo/scontrol failed, SSH failed)."""

def add_arguments(p) -> None:
    p.add_argument("action", choices=("discover", "check"), help="discover: print an inventory; check: drift report")
    p.add_argument("target", nargs="?", metavar="HOST|NAME",
                   help="discover: login host or ssh alias (default: run locally); check: inventory name or path")
    p.add_argument("--cluster", "-c", help="discover: reach the cluster with this inventory's `login:` block")
    p.add_argument("--name", help="discover: the inventory's name (default: Slurm's ClusterName, or the host)")
    p.add_argument("--gpu-map", action="append", default=[], metavar="GRESTYPE=KEY",
                   help="discover: map a GRES type onto a GPU catalog key (repeatable; `gpu=KEY` for untyped GRES)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print JSON on stdout")


def run(args) -> int:
    if args.action == "discover":
        return _discover(args)
    if not args.target:
        raise UsageError("`jobctl clusters check` needs an inventory name or path",
                         hint="e.g. `jobctl clusters check dev`")
    if args.cluster or args.name or args.gpu_map:
        raise UsageError("--cluster, --name and --gpu-map are options of `clusters discover`, not `check`")
    return _check(args)


# --- discover -------------------------------------------------------------------------------------


def _gpu_map(items: list[str], keys: list[str]) -> dict[str, str]:

    out = {}
    for item in items:
        gres, sep, key = item.partition("=")
        if not sep or not gres or not key:
            raise UsageError(f"--gpu-map {item!r}: expected GRESTYPE=CATALOGKEY, e.g. a100=a100-sxm-80gb")
        if key not in keys:
            raise UsageError(f"--gpu-map {item!r}: " + unknown_message("GPU", key, keys))
        out[gres.lower()] = key
    return out


def _ask(err, gpu_map: dict[str, str]) -> dict[str, str]:
    """Ask on the terminal which catalog key each ambiguous GRES type is."""
    out = dict(gpu_map)
    for key, (choices, partitions) in err.questions.items():
        what = "untyped GRES gpu:N" if key == "gpu" else f"GRES type {key!r}"
        # the names are the cluster's: shown, never obeyed (control and format characters escaped)
        sys.stderr.write(ui.sanitize(f"{what} (partition {', '.join(partitions)}) could be several GPUs:") + "\n")
        for i, c in enumerate(choices, 1):
            sys.stderr.write(ui.sanitize(f"  {i}) {c}") + "\n")
        while True:
            sys.stderr.write(f"which one? [1-{len(choices)}] ")
            sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                raise UsageError(err.message())
            answer = line.strip()
            if answer.isdigit() and 1 <= int(answer) <= len(choices):
                out[key] = choices[int(answer) - 1]
                break
            if answer in choices:
                out[key] = answer
                break
    return out


def _discover(args) -> int:

    gpu_map = _gpu_map(args.gpu_map, gpu_names())
    if args.target and args.cluster:
        raise UsageError("give either HOST or --cluster NAME, not both")
    login, login_block, name = None, None, args.name
    if args.cluster:

        loaded = load_inventory(args.cluster)
        inv = loaded.value
        if inv.login is None:
            raise UsageError(f"cluster {inv.name!r} has no `login:` block to reach it with",
                             hint="pass the login host instead: `jobctl clusters discover HOST`")
        login = loaded.value.login
        login_block = {k: v for k, v in dict(loaded.data.get("login") or {}).items() if v is not None}
        name = name or inv.name
    elif args.target:

        login = login_for_host(args.target)
        login_block = {"host": args.target}
        name = name or args.target.split(".")[0]
    text = discover(login, login_block, name, gpu_map, ask=_ask if sys.stdin.isatty() else None)
    if args.as_json:

        ui.print_json(parse_yaml_text(text))
    else:
        ui.raw(text)
    return EXIT_OK


# --- check ----------------------------------------------------------------------------------------


def _check(args) -> int:

    loaded = load_inventory(args.target)
    rows, drift = check(loaded)
    suspects = suspect_nodes(loaded.value.name)
    if args.as_json:
        ui.print_json({"cluster": loaded.value.name, "drift": drift, "rows": [r.as_dict() for r in rows],
                       "suspect_nodes": suspects})
    else:
        ui.render_drift(loaded.value.name, [r.as_dict() for r in rows], drift)
        for s in suspects:
            ui.para(f"suspect node {s['node']}: {s['kind']} in job #{s['job_id']} ({s['reason']}); left out of "
                    f"that job's next attempts until {ui.local_time(s['expires_at'])}", style="yellow")
    return EXIT_DRIFT if drift else EXIT_OK

