"""Plan a recipe and submit it: to Slurm through submitit, or locally (the embedded default)."""

from __future__ import annotations

import json

import itertools
import re

from jobctl import ui
from jobctl.errors import EXIT_BACKEND, EXIT_NO_FIT, EXIT_OK, UsageError
from jobctl.jobs.commands import submit_jobs
from jobctl.jobs.requests import prepare_request, render_request, submission_token
from jobctl.jobs.submission import sweep_notes
from jobctl.model import RetryPolicy
from jobctl.planning import DEFAULT_OBJECTIVE, OBJECTIVES, load_inventory

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
    p.add_argument("--exclude", metavar="NODES", action="append", default=[],
                   help="keep the job off these nodes (names or Slurm ranges, comma-separated; repeatable): "
                        "sets the recipe's resources.exclude")
    p.add_argument("--hang-after", metavar="SECONDS", type=int,
                   help="call the job hung after this long without a new training step (the first step gets "
                        "3x as long): stacks are dumped, the job stopped and resubmitted; 0 turns the watchdog "
                        "off; sets the recipe's resources.hang_after (default: from the plan's step time)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON on stdout")


def run(args) -> int:
    if args.check and not args.dry_run:
        raise UsageError("--check goes with --dry-run", hint="jobctl submit RECIPE -c CLUSTER --dry-run --check")
    if not 1 <= args.max_attempts <= 100:
        raise UsageError(f"--max-attempts: expected 1 to 100, got {args.max_attempts}")
    policy = RetryPolicy.with_overrides(args.retry, max_attempts=args.max_attempts,
                                        memory_snapshot=args.memory_snapshot)
    inv = load_inventory(args.cluster)
    ui.notes(inv)
    if args.sync and inv.value.login is None:
        raise UsageError(f"--sync is for clusters reached over SSH; {inv.value.name!r} has no `login:` block",
                         hint="run the job from this directory instead (its command runs where jobctl is started)")
    token = submission_token(args.token)
    with ui.progress(f"planning {args.recipe} on {inv.value.name}") as shown:
        extra = _exclude_overrides(args.exclude) + ([] if args.hang_after is None else
                                                    [f"resources.hang_after={args.hang_after}"])
        req = prepare_request(args.recipe, args.overrides + extra, args.sweep, inv, policy,
                              args.objective,
                              loaded=ui.notes, planning=shown.update)
    if req.no_fit is not None:
        ui.print_json(req.no_fit.to_dict()) if args.as_json else ui.render_plan(req.no_fit.to_dict())
        return EXIT_NO_FIT
    for note in sweep_notes(req.submissions, args.sweep) if args.sweep else ():
        ui.info(note)
    if args.dry_run:
        where = " on the login node" if inv.value.login is not None else ""
        with ui.progress(f"rendering {len(req.submissions)} job(s){where}"):
            out = render_request(req.submissions, inv, token=token, sync_dir=args.sync, check=args.check,
                                 show_secrets=args.show_secrets)
        if args.as_json:
            ui.print_json(out if len(out) > 1 else out[0])
        else:
            ui.render_dry_run(out)
        if args.check and any(not o.get("check", {"ok": True})["ok"] for o in out):
            return EXIT_BACKEND
        return EXIT_OK
    say = None if args.as_json else ui.info
    results, code = submit_jobs(req.submissions, inv, token=token, sync_dir=args.sync, wait=args.wait, say=say)
    if args.as_json:
        ui.print_json(results)
    elif not args.wait:
        for r in results:  # a remote job's folder: where it is on the login node
            ui.line(f"#{r['id']}\t{r['scheduler_job_id']}\t{r.get('remote_folder') or r['job_folder']}")
    return code


def _exclude_overrides(values: list[str]) -> list[str]:
    """`--exclude a,b[1-3]` as an override of resources.exclude (it replaces the recipe's list);
    each name is then checked by the recipe schema like one written in the file."""
    from jobctl.backends.discover import DiscoveryError, split_hostlist

    try:
        names = [n for value in values for n in split_hostlist(value)]  # commas inside a range belong to it
    except DiscoveryError as e:
        raise UsageError(f"--exclude: {e.message}", hint="e.g. --exclude gpu07 or --exclude 'gpu[03-05],gpu09'") from None
    return [f"resources.exclude=[{','.join(json.dumps(n) for n in names)}]"] if names else []
