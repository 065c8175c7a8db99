"""End-to-end checks of the dev cluster's loopback sshd (scripts/dev-cluster.sh up --ssh).

A real sshd on 127.0.0.1, a real local user ``jobctl-remote`` and the real Slurm behind it:
key login with strict host key checking, no password login, Slurm commands and a job through
SSH, SFTP, and refusal of unknown and changed host keys. Uses the OpenSSH client with argv
lists (no shell). Skipped where it cannot run unless JOBCTL_REQUIRE_SLURM=1 (see
tests/ssh_fixture.py).
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from slurm_fixture import REPO_ROOT, SCRIPT, TERMINAL_STATES, slurm_cluster  # noqa: F401  (pytest fixture)
from ssh_fixture import SSHCluster, ssh_cluster  # noqa: F401  (pytest fixture)

SSH_TIMEOUT_S = 60


def _run(
    args: list[str], timeout: float = SSH_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def _ssh(c: SSHCluster, *command: str, known_hosts: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run(c.ssh_argv(*command, known_hosts=known_hosts))


def _ssh_ok(c: SSHCluster, *command: str) -> str:
    res = _ssh(c, *command)
    assert res.returncode == 0, f"ssh {' '.join(command)} failed ({res.returncode}): {res.stderr}"
    return res.stdout


def _host_key_line(c: SSHCluster) -> str:
    """`[127.0.0.1]:PORT` as known_hosts spells a host on a non-default port."""
    return c.host if c.port == 22 else f"[{c.host}]:{c.port}"


# ---------------------------------------------------------------------------- the generated files


def test_inventory(ssh_cluster: SSHCluster) -> None:
    c = ssh_cluster
    # generated into the state dir, never into the repository
    assert not c.inventory.resolve().is_relative_to(REPO_ROOT), c.inventory
    assert not (REPO_ROOT / "clusters" / "dev-ssh.yaml").exists()
    assert c.inventory.name == "dev-ssh.yaml" and c.inventory.parent.name == "clusters"

    data = yaml.safe_load(c.inventory.read_text())
    assert data["name"] == "dev-ssh"
    assert data["scheduler"] == "slurm"
    login = data["login"]
    assert (login["host"], login["user"]) == ("127.0.0.1", "jobctl-remote")
    assert login["port"] == int(os.environ.get("JOBCTL_DEV_SSH_PORT", "2222"))
    assert login["remote_python"] == "/home/jobctl-remote/venv/bin/python"
    assert login["workdir"] == "/home/jobctl-remote/jobctl"
    for key in ("key_file", "known_hosts"):
        assert Path(login[key]).is_absolute() and Path(login[key]).is_file(), login[key]
    assert data["partitions"] == [
        {"name": "gpu", "gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": 2,
         "cpus_per_node": 16, "mem_gib": 62}
    ]


def test_inventory_found_through_jobctl_clusters(
    ssh_cluster: SSHCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobctl.config.workspace import find_cluster

    monkeypatch.setenv("JOBCTL_CLUSTERS", str(ssh_cluster.inventory.parent))
    found = find_cluster("dev-ssh")
    assert found is not None and found.resolve() == ssh_cluster.inventory.resolve()


def test_modes_and_owners(ssh_cluster: SSHCluster) -> None:
    c = ssh_cluster
    user = pwd.getpwnam(c.user)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(c.key_file) == 0o600 and c.key_file.stat().st_uid == 0
    # the host key line is the host key file's, not a trust-on-first-use scan
    ssh_dir = c.key_file.parent
    host_pub = (ssh_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert c.known_hosts.read_text().split() == [_host_key_line(c), *host_pub]
    assert mode(ssh_dir / "ssh_host_ed25519_key") == 0o600

    home = Path(user.pw_dir)
    assert home == Path("/home/jobctl-remote")
    assert home.stat().st_uid == user.pw_uid
    assert mode(home) & 0o022 == 0, oct(mode(home))  # StrictModes
    ak = home / ".ssh" / "authorized_keys"
    assert mode(home / ".ssh") == 0o700 and (home / ".ssh").stat().st_uid == user.pw_uid
    assert mode(ak) == 0o600 and ak.stat().st_uid == user.pw_uid
    client_pub = (ssh_dir / "id_ed25519.pub").read_text().split()[:2]
    assert any(line.split()[:2] == client_pub for line in ak.read_text().splitlines() if line)

    # password field '*' (no password, not locked)
    shadow = {line.split(":")[0]: line.split(":")[1] for line in Path("/etc/shadow").read_text().splitlines() if line}
    assert shadow[c.user] == "*"

    # the Slurm config: slurm.conf readable by everyone, slurmdbd.conf root-only
    conf = Path(c.slurm_conf)
    assert mode(conf) & 0o004
    dbd = conf.parent / "slurmdbd.conf"
    assert mode(dbd) == 0o600 and dbd.stat().st_uid == 0


def test_sshd_effective_config(ssh_cluster: SSHCluster) -> None:
    config = ssh_cluster.key_file.parent / "sshd_config"
    res = _run(["/usr/sbin/sshd", "-T", "-f", str(config)])
    assert res.returncode == 0, res.stderr
    eff: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        key, _, value = line.partition(" ")
        eff.setdefault(key, []).append(value)
    assert eff["port"] == [str(ssh_cluster.port)]
    assert eff["listenaddress"] == [f"127.0.0.1:{ssh_cluster.port}"]
    for key in ("passwordauthentication", "kbdinteractiveauthentication", "usepam", "permitrootlogin"):
        assert eff[key] == ["no"], (key, eff[key])
    assert eff["pubkeyauthentication"] == ["yes"]
    assert eff["strictmodes"] == ["yes"]
    assert eff["allowusers"] == ["jobctl-remote"]
    assert "acceptenv" not in eff
    assert eff["setenv"] == [f"SLURM_CONF={ssh_cluster.slurm_conf}"]
    assert eff["subsystem"] == ["sftp internal-sftp"]


# ---------------------------------------------------------------------------- logging in


def test_key_login_with_strict_host_key(ssh_cluster: SSHCluster) -> None:
    out = _ssh_ok(ssh_cluster, "id", "-un")
    assert out.strip() == "jobctl-remote"


def test_password_login_refused(ssh_cluster: SSHCluster, tmp_path: Path) -> None:
    # A real password attempt: no key, and an askpass program that would answer a password
    # prompt. The server offers no password method at all, so askpass is never asked.
    called = tmp_path / "askpass-called"
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(f"#!/bin/sh\ntouch '{called}'\necho not-the-password\n")
    askpass.chmod(0o755)
    env = {**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"}
    argv = [
        "ssh", "-F", "/dev/null",
        "-o", f"UserKnownHostsFile={ssh_cluster.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "PubkeyAuthentication=no",
        "-o", "PreferredAuthentications=password,keyboard-interactive",
        "-o", "NumberOfPasswordPrompts=1",
        "-o", "ConnectTimeout=10",
        "-p", str(ssh_cluster.port),
        f"{ssh_cluster.user}@{ssh_cluster.host}", "echo", "logged-in",
    ]  # fmt: skip
    res = _run(argv, env=env)
    assert res.returncode == 255, (res.stdout, res.stderr)
    assert "logged-in" not in res.stdout
    # the methods the server still allows: publickey only
    assert "Permission denied (publickey)." in res.stderr, res.stderr
    assert not called.exists(), "ssh was offered a password prompt"


def test_unknown_host_refused(ssh_cluster: SSHCluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    res = _ssh(ssh_cluster, "echo", "logged-in", known_hosts=empty)
    assert res.returncode == 255, (res.stdout, res.stderr)
    assert "logged-in" not in res.stdout
    assert "Host key verification failed." in res.stderr, res.stderr
    assert "host key is known" in res.stderr, res.stderr
    assert empty.read_text() == ""  # nothing learnt on first use


def test_changed_host_key_refused(ssh_cluster: SSHCluster, tmp_path: Path) -> None:
    other = tmp_path / "other_host_key"
    gen = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)])
    assert gen.returncode == 0, gen.stderr
    fake = tmp_path / "known_hosts"
    key_type, key = Path(f"{other}.pub").read_text().split()[:2]
    fake.write_text(f"{_host_key_line(ssh_cluster)} {key_type} {key}\n")
    res = _ssh(ssh_cluster, "echo", "logged-in", known_hosts=fake)
    assert res.returncode == 255, (res.stdout, res.stderr)
    assert "logged-in" not in res.stdout
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr, res.stderr
    assert "Host key verification failed." in res.stderr, res.stderr


def test_client_environment_not_passed(ssh_cluster: SSHCluster) -> None:
    # the sshd sets SLURM_CONF itself and accepts nothing from the client
    argv = ssh_cluster.ssh_argv("printenv", "SLURM_CONF", "JOBCTL_DEV_SSH_PROBE")
    argv[1:1] = ["-o", "SendEnv=SLURM_CONF JOBCTL_DEV_SSH_PROBE"]
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf", "JOBCTL_DEV_SSH_PROBE": "1"}
    res = _run(argv, env=env)
    # printenv exits 1 because JOBCTL_DEV_SSH_PROBE is not set remotely
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stdout.splitlines() == [ssh_cluster.slurm_conf]


def test_remote_python_is_a_system_venv(ssh_cluster: SSHCluster) -> None:
    out = _ssh_ok(
        ssh_cluster,
        ssh_cluster.remote_python,
        "-c",
        "import sys; print(sys.prefix); print(sys.base_prefix)",
    )
    assert out.split() == ["/home/jobctl-remote/venv", "/usr"]


# ---------------------------------------------------------------------------- Slurm and SFTP


def _remote_job_state(c: SSHCluster, job_id: str) -> tuple[str, str] | None:
    out = _ssh_ok(c, "sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,User")
    rows = [line.strip() for line in out.splitlines() if line.strip()]
    if not rows:
        return None
    state, user = rows[0].split("|")
    return state.split()[0], user


def test_slurm_through_ssh(ssh_cluster: SSHCluster) -> None:
    c = ssh_cluster
    out = _ssh_ok(c, "sinfo", "-h", "-o", "%P|%D|%t")
    assert out.split("|")[0] == "gpu*", out
    assert out.split("|")[1] == "2", out

    out = _ssh_ok(c, "sbatch", "--parsable", "--job-name=jobctl-dev-ssh", "--output=/dev/null",
                  "--time=2", "--wrap", "true")  # fmt: skip
    job_id = out.strip().split(";")[0]
    assert job_id.isdigit(), out

    # Wait (bounded) until the job has left the queue and sacct shows it finished. For a second
    # or two after a job reaches the accounting database, sacct here reports it with UID 0
    # (User=root) before the real user appears: wait for the owner too.
    deadline = time.monotonic() + 120
    row = None
    while time.monotonic() < deadline:
        row = _remote_job_state(c, job_id)
        if row is not None and row[0] in TERMINAL_STATES and row[1] == c.user:
            queued = _ssh_ok(c, "squeue", "-h", "-j", job_id, "-o", "%i").strip()
            if not queued:
                break
        time.sleep(1)
    else:
        pytest.fail(f"job {job_id} not finished (as {c.user}) after 120s (sacct: {row})")
    assert row == ("COMPLETED", "jobctl-remote"), row


def test_sftp_upload(ssh_cluster: SSHCluster, tmp_path: Path) -> None:
    c = ssh_cluster
    payload = f"jobctl sftp {uuid.uuid4()}\n"
    local = tmp_path / "upload.txt"
    local.write_text(payload)
    remote_name = f"jobctl-sftp-test-{uuid.uuid4().hex}.txt"
    remote_path = Path("/home/jobctl-remote") / remote_name
    batch = tmp_path / "batch"
    batch.write_text(f'put "{local}" "{remote_name}"\n')
    try:
        res = _run(["sftp", *c.ssh_options(), "-P", str(c.port), "-b", str(batch),
                    f"{c.user}@{c.host}"])  # fmt: skip
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert _ssh_ok(c, "cat", remote_name) == payload
        st = remote_path.stat()
        assert st.st_uid == pwd.getpwnam(c.user).pw_uid
    finally:
        remote_path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- the script


def test_up_again_is_quick(ssh_cluster: SSHCluster) -> None:
    t0 = time.monotonic()
    res = _run(["bash", str(SCRIPT), "up", "--ssh"], timeout=120)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-2:] == [
        f"export JOBCTL_DEV_SSH_INVENTORY={ssh_cluster.inventory}",
        f"export SLURM_CONF={ssh_cluster.slurm_conf}",
    ]
    assert "already up" in res.stderr
    assert elapsed < 30, f"up --ssh took {elapsed:.1f}s when everything was up"  # a rebuild takes minutes

    status = _run(["bash", str(SCRIPT), "status", "--ssh"])
    assert status.returncode == 0, status.stdout + status.stderr
    assert any(line.startswith("sshd ") and "running" in line for line in status.stdout.splitlines())
