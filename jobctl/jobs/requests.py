"""A `submit` request as jobs: one submission per combination of --sweep values, each planned
on the cluster and prepared with the retry policy; rendered without submitting (--dry-run), or
submitted (jobs.commands.submit_jobs)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from jobctl.errors import UsageError
from jobctl.jobs import placement
from jobctl.jobs.submission import Submission, dry_run, prepare, redact, secrets
from jobctl.model import RetryPolicy
from jobctl.planning import load_recipe, plan_on
from jobctl.planning.report import PlanReport
from jobctl.remote.client import new_token

TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


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


def submission_token(token: str | None) -> str:
    """The request's idempotency token: the user's (checked), else a new one."""
    if token is not None and not TOKEN.fullmatch(token):
        raise UsageError(f"--token {token!r}: expected 1 to 128 letters, digits, '.', '_' or '-'")
    return token or new_token()


@dataclass
class Prepared:
    """The jobs of a request, ready to submit, or the plan report saying why one does not fit."""

    submissions: list[Submission]
    no_fit: PlanReport | None = None


def prepare_request(recipe: str, overrides: list[str], sweeps: list[str], inv_loaded, policy: RetryPolicy,
                    objective: str, *, loaded: Callable = lambda rec: None,
                    planning: Callable = lambda text: None) -> Prepared:
    """Each combination of `sweeps` planned on the inventory and prepared (the recipe's own
    launch.hooks joined to `policy`); a sweep shares one id. `loaded(rec)` sees each recipe
    as loaded (its notes), `planning(text)` what is being planned."""
    combos = sweep_combinations(sweeps)
    sweep_id = new_token()[:12] if len(combos) > 1 else None
    subs = []
    for combo in combos:
        rec = load_recipe(recipe, list(overrides) + combo)
        loaded(rec)
        planning(f"planning {rec.path} on {inv_loaded.value.name}")
        report = plan_on(rec, inv_loaded, objective=objective, alternatives=0, summary=False)
        if not report.feasible:
            return Prepared([], report)
        sub = prepare(rec, inv_loaded, report.to_dict(), list(overrides) + combo)
        sub.sweep_id = sweep_id
        sub.policy = replace(policy, hooks=sub.policy.hooks)  # hooks: the recipe's launch.hooks
        subs.append(sub)
    return Prepared(subs)


def render_request(subs: list[Submission], inv_loaded, *, token: str, sync_dir: str | None, check: bool,
                   show_secrets: bool) -> list[dict]:
    """--dry-run: what each job would be (on the login node for a remote cluster: its python,
    paths and sbatch), secrets hidden unless `show_secrets`."""
    remote = placement.remote_for_inventory(inv_loaded)
    if remote is not None:
        for i, sub in enumerate(subs):
            sub.token = token if len(subs) == 1 else f"{token}.{i}"
        out = remote.dry_run(subs, token=token, sync_dir=sync_dir, check=check)
    else:
        out = dry_run(subs, check=check)
    if not show_secrets:
        hidden = {k: v for sub in subs for k, v in secrets(sub).items()}
        out = [redact(o, hidden) for o in out]
    return out
