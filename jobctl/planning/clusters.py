"""Inventories from what Slurm says: `discover` writes one from sinfo/scontrol, `check`
compares one with the cluster as it is now. Slurm is asked here (its commands run in the Slurm
backend) or, for a cluster with a `login:` block, on its login node over SSH."""

from __future__ import annotations

import contextlib

from jobctl.backends import discover as d
from jobctl.backends.slurm import SlurmBackend
from jobctl.config.loader import inventory_from_text
from jobctl.errors import SchedulerError, UsageError
from jobctl.planner.catalog import gpu_names
from jobctl.remote import bootstrap

TIMEOUT_S = 60.0


@contextlib.contextmanager
def slurm_at(login=None, cluster: str | None = None):
    """(SlurmBackend, where) for this machine, or for the login node `login` (a schema.Login)
    over SSH with strict host keys, for read-only questions."""
    if login is None:
        yield SlurmBackend(), "this machine"
        return
    from jobctl.remote.ssh import Remote

    with Remote(login, cluster=cluster) as remote:
        yield slurm_over(remote), str(remote)


def slurm_over(remote) -> SlurmBackend:
    """A SlurmBackend whose read-only commands run on a login node (an open remote.ssh.Remote)."""
    def run(argv: list[str], required: bool = True) -> str:
        res = remote.run(argv, idempotent=True, timeout_s=TIMEOUT_S)
        if res.rc != 0:
            if not required:
                return ""
            tail = (res.stderr.strip() or res.stdout.strip() or f"exit code {res.rc}").splitlines()[-1][:300]
            hint = f"is {argv[0]} on the PATH there?" if res.rc == 127 else "is slurmctld up? (`scontrol ping`)"
            raise SchedulerError(f"`{' '.join(argv)}` failed on {remote}: {tail}", hint=hint)
        return res.stdout

    return SlurmBackend(run)


def snapshot(login=None, cluster: str | None = None) -> tuple[list, str | None, str]:
    """(partition facts, Slurm's ClusterName or None, where it was asked)."""
    with slurm_at(login, cluster) as (slurm, where):
        try:
            facts = slurm.describe()
        except SchedulerError as e:
            raise SchedulerError(f"{e.message} (on {where})", hint=e.hint) from None
        name = slurm.cluster_name()
    return facts, name, where


def discover(login, login_block: dict | None, name: str | None, gpu_map: dict[str, str], ask=None) -> str:
    """An inventory's YAML text for the cluster, with comments saying where each value came
    from. Ambiguous GRES types are resolved by `gpu_map`, else by `ask(AmbiguousGPU)` (which
    returns a completed map), else they are a UsageError naming the --gpu-map to pass."""
    facts, slurm_name, where = snapshot(login, name)
    name = name or slurm_name or "discovered"
    if not any(f.nodes for f in facts):
        raise SchedulerError(f"Slurm on {where} reports no partitions with nodes")
    keys = gpu_names()
    try:
        gpus = d.resolve_gpus(facts, gpu_map, keys)
    except d.AmbiguousGPU as e:
        if ask is None:
            raise UsageError(e.message(), hint="pass --gpu-map GRESTYPE=KEY for each (see `jobctl clusters --help`)")
        gpus = d.resolve_gpus(facts, ask(e, gpu_map), keys)
    text = d.inventory_yaml(name, facts, gpus, source=where, login=login_block)
    inventory_from_text(text, "<discovered inventory>")  # what it writes must be a valid inventory
    return text


def check(loaded) -> tuple[list, bool]:
    """(drift rows, whether anything drifted) for a loaded inventory against its cluster now."""
    inv = loaded.value
    if inv.scheduler != "slurm":
        raise UsageError(f"cluster {inv.name!r} is not a Slurm cluster (scheduler: {inv.scheduler})")
    facts, _, where = snapshot(inv.login, inv.name)
    rows = d.compare(inv, facts, gpu_names())
    if inv.login is not None:
        rows.insert(0, d.Drift("-", "login", inv.login.host, f"ok ({where})", "ok"))
    return rows, d.has_drift(rows)


def remote_setup(inv, *, install: bool, say) -> dict:
    """`jobctl remote bootstrap|check`: (install this jobctl on the cluster's login node, then)
    check that the node runs sbatch and this very build of jobctl."""
    from jobctl.remote.ssh import Remote

    with Remote.for_inventory(inv) as remote:
        out = bootstrap.install(remote, say) if install else {}
        try:
            sbatch = slurm_over(remote).version()
        except SchedulerError as e:
            raise SchedulerError(f"{e.message} (on {remote})",
                                 hint="jobctl submits with sbatch on the login node: check PATH and SLURM_CONF in "
                                      "the login shell there") from None
        out.update(bootstrap.check(remote, sbatch, say))
        return {"cluster": inv.name, "login": str(remote), **out}


def suspect_nodes(cluster: str) -> list[dict]:
    """The nodes of `cluster` a hardware fault or a hang was pinned to (not expired), from the
    history; none when there is no history yet."""
    from jobctl.store.history import History
    from jobctl.store.paths import history_path

    if not history_path().exists():
        return []
    with History.open() as history:
        return history.suspect_nodes(cluster)
