"""Which backend serves a job: the one place that answers "this machine, Slurm, or a login node?"."""

from __future__ import annotations

from jobctl.backends.base import JobBackend
from jobctl.backends.local import LocalBackend
from jobctl.backends.slurm import SlurmBackend
from jobctl.model import Scheduler
from jobctl.planning import load_inventory
from jobctl.remote.client import RemoteBackend, cluster_of


def backend(scheduler: Scheduler | str) -> JobBackend:
    """The backend that submits to `scheduler` from this machine."""
    return SlurmBackend() if Scheduler(scheduler) is Scheduler.SLURM else LocalBackend()


def remote_for_inventory(inv_loaded) -> RemoteBackend | None:
    """The login node's backend when the inventory has a `login:` block, else None."""
    inv = inv_loaded.value
    return RemoteBackend(inv.name, inv_loaded) if inv.login is not None else None


def remote_for(cluster: str) -> RemoteBackend:
    """The login node's backend of `cluster` (its inventory by name)."""
    return RemoteBackend(cluster, load_inventory(cluster))


def is_remote(record) -> bool:
    return cluster_of(record) is not None


def by_backend(records) -> list[tuple[object, list]]:
    """The records grouped by the backend that knows them, in the order first seen: each
    remote cluster's login node, Slurm here, this machine."""
    groups: dict[tuple, list] = {}
    for r in records:
        cluster = cluster_of(r)
        groups.setdefault(("remote", cluster) if cluster else ("here", r.scheduler), []).append(r)
    return [(remote_for(key) if where == "remote" else backend(key), group)
            for (where, key), group in groups.items()]
