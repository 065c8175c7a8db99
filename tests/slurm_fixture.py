"""A real, small Slurm cluster for the test suite (session-scoped pytest fixture).

``slurm_cluster`` runs ``scripts/dev-cluster.sh up`` (cluster ``jobctl-dev``: munged,
MariaDB, slurmdbd, slurmctld and two slurmd nodes with 8 fake H100s each), sets
``SLURM_CONF`` in ``os.environ``, yields the path of that slurm.conf, and at the end of
the session runs ``scripts/dev-cluster.sh down`` -- but only if this fixture started the
cluster: a cluster that was already running (fully or in part) is left running.

Skips when the cluster cannot be started here (not root, or neither the Slurm binaries
nor apt-get to install them), unless ``JOBCTL_REQUIRE_SLURM`` is set (to anything but
``0``/``false``/``no``), in which case it fails instead. A failing ``up`` always fails.

Use it from a conftest or a test module with::

    from slurm_fixture import slurm_cluster  # noqa: F401  (pytest fixture)

(tests/ is on sys.path: pyproject.toml's pytest `pythonpath`.)

``JOBCTL_DEV_CLUSTER_DIR`` and the ``JOBCTL_DEV_*_PORT`` variables are passed through to
the script (see its header).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "dev-cluster.sh"
# The states in which Slurm says a job has ended (squeue(1), JOB STATE CODES), for tests that wait.
TERMINAL_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                             "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"})

# From a bare machine `up` takes ~20-60 s (apt install included); leave room for slow mirrors.
UP_TIMEOUT_S = 900
DOWN_TIMEOUT_S = 300
STATUS_TIMEOUT_S = 60

_BINARIES = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct")
_EXPORT_PREFIX = "export SLURM_CONF="


def slurm_required() -> bool:
    """True when JOBCTL_REQUIRE_SLURM asks for a hard failure instead of a skip."""
    value = os.environ.get("JOBCTL_REQUIRE_SLURM", "").strip().lower()
    return value not in ("", "0", "false", "no")


def unavailable_reason() -> str | None:
    """Why the dev cluster cannot be started on this machine, or None if it can."""
    if not hasattr(os, "geteuid"):
        return "the dev Slurm cluster needs a POSIX system"
    if shutil.which("bash") is None:
        return "the dev Slurm cluster needs bash"
    if os.geteuid() != 0:
        return "the dev Slurm cluster needs root (scripts/dev-cluster.sh runs daemons as root)"
    have_binaries = all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in _BINARIES)
    if not have_binaries and shutil.which("apt-get") is None:
        return "Slurm is not installed and apt-get is not available to install it"
    return None


def _run_script(subcommand: str, timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), subcommand],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=os.environ.copy(),
    )


def _running_daemons() -> int:
    """How many of the cluster's daemons `status` reports as running."""
    try:
        res = _run_script("status", STATUS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 0
    return sum(1 for line in res.stdout.splitlines() if " running (pid " in line)


def _conf_from_up_output(stdout: str) -> str | None:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if lines and lines[-1].startswith(_EXPORT_PREFIX):
        return lines[-1][len(_EXPORT_PREFIX):]
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[str]:
    """Start (or reuse) the dev Slurm cluster; yields the path to its slurm.conf."""
    reason = unavailable_reason()
    if reason is not None:
        if slurm_required():
            pytest.fail(f"JOBCTL_REQUIRE_SLURM is set but {reason}", pytrace=False)
        pytest.skip(f"{reason} (set JOBCTL_REQUIRE_SLURM=1 to fail instead of skipping)")

    # Only stop at the end what this fixture started: if any daemon already runs, the
    # cluster belongs to someone else (a developer's shell, an outer fixture) -- leave it.
    started_here = _running_daemons() == 0

    try:
        up = _run_script("up", UP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"scripts/dev-cluster.sh up timed out after {exc.timeout}s", pytrace=False)
    conf = _conf_from_up_output(up.stdout)
    if up.returncode != 0 or conf is None:
        if started_here:
            # leave no half-started daemons behind
            try:
                _run_script("down", DOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        pytest.fail(
            f"scripts/dev-cluster.sh up failed (exit {up.returncode}):\n"
            f"--- stderr ---\n{up.stderr[-6000:]}\n--- stdout ---\n{up.stdout[-2000:]}",
            pytrace=False,
        )

    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield conf
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if started_here:
            try:
                down = _run_script("down", DOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                warnings.warn("scripts/dev-cluster.sh down timed out", stacklevel=1)
            else:
                if down.returncode != 0:
                    warnings.warn(
                        f"scripts/dev-cluster.sh down failed (exit {down.returncode}):\n"
                        f"{down.stderr[-4000:]}",
                        stacklevel=1,
                    )
