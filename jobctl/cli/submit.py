"""Plan a recipe and submit it: to Slurm through submitit, or locally (the embedded default)."""

from __future__ import annotations

import itertools
import re

from jobctl import ui
from jobctl.errors import EXIT_BACKEND, EXIT_NO_FIT, EXIT_OK, UsageError
from jobctl.jobs import placement
from jobctl.jobs.submission import (
    dry_run,
    prepare,
    redact,
    secrets,
    submit,
    sweep_notes,
)
from jobctl.jobs.watch import wait_for
from jobctl.model import RetryPolicy
from jobctl.planning import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    load_inventory,
    load_recipe,
    plan_on,
)
from jobctl.remote.client import new_token
from jobctl.store.history import History

HELP = "plan and submit a recipe (Slurm through submitit, or this machine)"
EPILOG = """examples:
  jobctl submit recipes/tiny.yaml --cluster local --wait        # the embedded default, no Slurm
  jobctl submit recipes/llama70b.yaml --cluster h100             # plan + sbatch
  jobctl submit recipes/llama70b.yaml --cluster h100 --dry-run --check   # show it, ask sbatch --test-only
  jobctl submit recipes/tiny.yaml -c dev --sweep train.lr=1e-4,3e-4 --sweep train.seq_len=32,64
  jobctl submit recipes/llama8b.yaml -c big --sync . --token run-42   # over SSH (`login:` in big's inventory)

A cluster whose inventory has a `login:` block is reached over SSH: the plan is made here, the
recipe, plan and inventory go to the login node over SFTP and jobctl submits there (install it
with `jobctl remote bootstrap CLUSTER`). --sync DIR uploads a working tree (respecting
.gitignore, changed files only) and runs the job in it. A submission carries a token: run the
command again with the same --token after a failure and it returns the job it created instead
of submitting a second one.

exit codes: 0 submitted (with --wait: completed), 2 bad input, 3 nothing fits,
            4 with --wait: the job failed, 5 the scheduler refused or cannot be reached."""


def add_arguments(p) -> None:
    p.add_argument("recipe", help="recipe file (or a name from recipes/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, e.g. train.seq_len=4096")
    p.add_argument("--cluster", "-c", required=True, help="inventory name from clusters/ or a path to one")
    p.add_argument("--objective", choices=OBJECTIVES, default=DEFAULT_OBJECTIVE,
                   help="how to choose the plan (as in `jobctl plan`; default: balanced)")
    p.add_argument("--sweep", action="append", default=[], metavar="key=v1,v2",
                   help="submit one job per combination of values (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="render the sbatch script, environment and commands only")
    p.add_argument("--check", action="store_true", help="with --dry-run: ask Slurm (sbatch --test-only)")
    p.add_argument("--show-secrets", action="store_true",
                   help="with --dry-run: show launch.env values (hidden as *** by default)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the job(s) to end, following OOM retries; exit 0 only if all completed")
    p.add_argument("--max-attempts", type=int, default=3, metavar="N",
                   help="attempts in an OOM chain, the first included (default 3)")
    p.add_argument("--memory-snapshot", action="store_true",
                   help="record CUDA allocation history (costly) and dump a snapshot on OOM (jobctl.hooks)")
    p.add_argument("--retry", action="append", default=[], metavar="KIND=ACTION",
                   help="override the retry policy, e.g. --retry HOST_OOM=ladder or --retry CUDA_OOM=none")
    p.add_argument("--token", metavar="TOKEN",
                   help="idempotency token: a submission with a token already used returns that job (default: new)")
    p.add_argument("--sync", metavar="DIR", help="remote clusters: upload this working tree and run the job in it")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON on stdout")


def sweep_combinations(sweeps: list[str]) -> list[list[str]]:
    """--sweep a=1,2 --sweep b=x,y -> [[a=1, b=x], [a=1, b=y], [a=2, b=x], [a=2, b=y]]."""
    axes = []
    for item in sweeps:
        if "=" not in item or item.startswith("="):
            raise UsageError(f"--sweep {item!r}: expected key=value1,value2", hint="e.g. --sweep train.lr=1e-4,3e-4")
        key, values = item.split("=", 1)
        vals = [v for v in values.split(",") if v != ""]
        if not vals:
            raise UsageError(f"--sweep {item!r}: no values after '='")
        axes.append([f"{key}={v}" for v in vals])
    return [list(c) for c in itertools.product(*axes)] if axes else [[]]


def run(args) -> int:
    from dataclasses import replace

    if args.check and not args.dry_run:
        raise UsageError("--check goes with --dry-run", hint="jobctl submit RECIPE -c CLUSTER --dry-run --check")
    if not 1 <= args.max_attempts <= 100:
        raise UsageError(f"--max-attempts: expected 1 to 100, got {args.max_attempts}")
    policy = RetryPolicy.with_overrides(args.retry, max_attempts=args.max_attempts,
                                        memory_snapshot=args.memory_snapshot)
    inv = load_inventory(args.cluster)
    ui.notes(inv)
    remote = inv.value.login is not None
    if args.sync and not remote:
        raise UsageError(f"--sync is for clusters reached over SSH; {inv.value.name!r} has no `login:` block",
                         hint="run the job from this directory instead (its command runs where jobctl is started)")
    if args.token is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", args.token):
        raise UsageError(f"--token {args.token!r}: expected 1 to 128 letters, digits, '.', '_' or '-'")
    token = args.token or new_token()
    subs = []
    combos = sweep_combinations(args.sweep)
    sweep_id = new_token()[:12] if len(combos) > 1 else None
    for combo in combos:
        overrides = list(args.overrides) + combo
        rec = load_recipe(args.recipe, overrides)
        ui.notes(rec)
        with ui.progress(f"planning {rec.path} on {inv.value.name}"):
            report = plan_on(rec, inv, objective=args.objective, alternatives=0, summary=False)
        if not report.feasible:
            if args.as_json:
                ui.print_json(report.to_dict())
            else:
                ui.render_plan(report.to_dict())
            return EXIT_NO_FIT
        sub = prepare(rec, inv, report.to_dict(), overrides)
        sub.sweep_id = sweep_id
        sub.policy = replace(policy, hooks=sub.policy.hooks)  # hooks: the recipe's launch.hooks
        subs.append(sub)
    for note in sweep_notes(subs, args.sweep) if args.sweep else ():
        ui.info(note)
    if args.dry_run:
        with ui.progress(f"rendering {len(subs)} job(s)" + (" on the login node" if remote else "")):
            if remote:  # rendered on the login node: its python, paths and sbatch
                for i, sub in enumerate(subs):
                    sub.token = token if len(subs) == 1 else f"{token}.{i}"
                out = placement.remote_for_inventory(inv, None).submit(subs, token=token, sync_dir=args.sync,
                                                                        dry_run=True, check=args.check)
            else:
                out = dry_run(subs, check=args.check)
        if not args.show_secrets:
            hidden = {k: v for sub in subs for k, v in secrets(sub).items()}
            out = [redact(o, hidden) for o in out]
        if args.as_json:
            ui.print_json(out if len(out) > 1 else out[0])
        else:
            ui.render_dry_run(out)
        if args.check and any(not o.get("check", {"ok": True})["ok"] for o in out):
            return EXIT_BACKEND
        return EXIT_OK
    say = None if args.as_json else ui.info
    with History.open() as history:
        results = submit(subs, inv, history, token=token, sync_dir=args.sync, progress=say)
        code = wait_for(results, history, say=say) if args.wait else EXIT_OK
    if args.as_json:
        ui.print_json(results)
    elif not args.wait:
        for r in results:  # a remote job's folder: where it is on the login node
            ui.line(f"#{r['id']}\t{r['scheduler_job_id']}\t{r.get('remote_folder') or r['job_folder']}")
    return code
