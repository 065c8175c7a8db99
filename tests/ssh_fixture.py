"""The dev Slurm cluster reached over SSH on loopback (session-scoped pytest fixture).

``ssh_cluster`` builds on ``slurm_cluster`` (tests/slurm_fixture.py: the real Slurm, started
once per run, stopped at the end only if that fixture started it) and runs
``scripts/dev-cluster.sh up --ssh``: a local user ``jobctl-remote`` (key login only), an sshd
of its own on ``127.0.0.1:$JOBCTL_DEV_SSH_PORT`` (default 2222) with a known host key, a venv
made with the system ``/usr/bin/python3`` and the generated inventory
``$JOBCTL_DEV_CLUSTER_DIR/clusters/dev-ssh.yaml``. It yields an :class:`SSHCluster`. At the
end of the session it stops the sshd (``down --ssh-only``) -- but only if this fixture started
it; an sshd that was already running is left running.

Skips when this cannot run here (not root, or neither sshd nor apt-get to install it), unless
``JOBCTL_REQUIRE_SLURM`` is set (to anything but ``0``/``false``/``no``), in which case it
fails instead. A failing ``up --ssh`` always fails.

Use it from a conftest or a test module with::

    from ssh_fixture import ssh_cluster  # noqa: F401  (pytest fixture)

(``slurm_cluster`` must be visible too; tests/conftest.py provides it.)
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from slurm_fixture import (
    DOWN_TIMEOUT_S,
    SCRIPT,
    STATUS_TIMEOUT_S,
    UP_TIMEOUT_S,
    _run_script,
    slurm_required,
    unavailable_reason,
)

_INVENTORY_PREFIX = "export JOBCTL_DEV_SSH_INVENTORY="
_SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class SSHCluster:
    """Where the loopback sshd of the dev cluster is and how to log in (from the inventory)."""

    inventory: Path  # the generated dev-ssh.yaml
    host: str
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    remote_python: str
    workdir: str
    slurm_conf: str  # SLURM_CONF on this machine (the same file the sshd sets for sessions)

    def ssh_argv(self, *command: str, known_hosts: Path | None = None) -> list[str]:
        """argv for running COMMAND as the remote user: key login, strict host key checking,
        no prompts, no user/system ssh config. COMMAND is an argv: it is quoted for the
        remote shell (ssh itself would join the words with spaces)."""
        return [
            "ssh",
            *self.ssh_options(known_hosts),
            "-p",
            str(self.port),
            f"{self.user}@{self.host}",
            *([shlex.join(command)] if command else []),
        ]

    def ssh_options(self, known_hosts: Path | None = None) -> list[str]:
        """Options shared by ssh and sftp (without the port: ``-p`` vs ``-P``)."""
        return [
            "-F",
            "/dev/null",
            "-i",
            str(self.key_file),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ConnectTimeout=10",
        ]


def ssh_unavailable_reason() -> str | None:
    """Why `up --ssh` cannot run on this machine, or None if it can."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    have = _SSHD.exists() and all(shutil.which(b) for b in ("ssh", "sftp", "ssh-keygen"))
    if not have and shutil.which("apt-get") is None:
        return "OpenSSH is not installed and apt-get is not available to install it"
    if shutil.which("useradd") is None:
        return "useradd is not available (the dev cluster creates a local user jobctl-remote)"
    return None


def _sshd_running() -> bool:
    """Whether `status` reports the dev cluster's sshd as running."""
    try:
        res = _run_script("status", STATUS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return any(
        line.startswith("sshd ") and " running (pid " in line for line in res.stdout.splitlines()
    )


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    # _run_script takes one subcommand; `up --ssh` / `down --ssh-only` need two words
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=os.environ.copy(),
    )


def _stop_sshd() -> None:
    try:
        down = _run(["down", "--ssh-only"], DOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        warnings.warn("scripts/dev-cluster.sh down --ssh-only timed out", stacklevel=1)
        return
    if down.returncode != 0:
        warnings.warn(
            f"scripts/dev-cluster.sh down --ssh-only failed (exit {down.returncode}):\n"
            f"{down.stderr[-4000:]}",
            stacklevel=1,
        )


def _load(inventory: Path, slurm_conf: str) -> SSHCluster:
    data = yaml.safe_load(inventory.read_text())
    login = data["login"]
    return SSHCluster(
        inventory=inventory,
        host=str(login["host"]),
        port=int(login["port"]),
        user=str(login["user"]),
        key_file=Path(login["key_file"]),
        known_hosts=Path(login["known_hosts"]),
        remote_python=str(login["remote_python"]),
        workdir=str(login["workdir"]),
        slurm_conf=slurm_conf,
    )


@pytest.fixture(scope="session")
def ssh_cluster(slurm_cluster: str) -> Iterator[SSHCluster]:
    """Start (or reuse) the dev cluster's loopback sshd; yields how to reach it."""
    reason = ssh_unavailable_reason()
    if reason is not None:
        if slurm_required():
            pytest.fail(f"JOBCTL_REQUIRE_SLURM is set but {reason}", pytrace=False)
        pytest.skip(f"{reason} (set JOBCTL_REQUIRE_SLURM=1 to fail instead of skipping)")

    # Only stop at the end what this fixture started: an sshd that already runs belongs to
    # someone else (a developer's shell, an outer fixture) -- leave it. Slurm itself is
    # slurm_cluster's business.
    started_here = not _sshd_running()

    try:
        up = _run(["up", "--ssh"], UP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        if started_here:
            _stop_sshd()
        pytest.fail(f"scripts/dev-cluster.sh up --ssh timed out after {exc.timeout}s", pytrace=False)
    inventory = None
    for line in up.stdout.splitlines():
        if line.startswith(_INVENTORY_PREFIX):
            inventory = Path(line[len(_INVENTORY_PREFIX):].strip())
    if up.returncode != 0 or inventory is None or not inventory.is_file():
        if started_here:
            _stop_sshd()  # leave no half-started sshd behind
        pytest.fail(
            f"scripts/dev-cluster.sh up --ssh failed (exit {up.returncode}):\n"
            f"--- stderr ---\n{up.stderr[-6000:]}\n--- stdout ---\n{up.stdout[-2000:]}",
            pytrace=False,
        )
    try:
        yield _load(inventory, slurm_cluster)
    finally:
        if started_here:
            _stop_sshd()
