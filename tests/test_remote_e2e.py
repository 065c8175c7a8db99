"""jobctl driving the dev Slurm cluster through its login node over SSH, end to end.

Real components only: the sshd of `scripts/dev-cluster.sh up --ssh` on 127.0.0.1:2222 (a
separate user `jobctl-remote`, key login, its own known_hosts), the real Slurm behind it, a
jobctl installed into that user's venv by `jobctl remote bootstrap` from a wheel built here,
and the `jobctl` command run as a subprocess with its own history. A TCP forwarder in front of
the sshd cuts connections for the drop test. What the login node holds is checked over the
OpenSSH client, not through jobctl.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
import yaml
from jobctl_run import history_rows as _rows  # noqa: E402
from jobctl_run import jobctl  # noqa: E402
from slurm_fixture import slurm_cluster  # noqa: E402,F401  (pytest fixture)
from ssh_fixture import SSHCluster, ssh_cluster  # noqa: E402,F401  (pytest fixture)
from tcp_proxy import TcpProxy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "tests" / "payloads" / "oom_payload.py"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


@pytest.fixture(scope="module")
def bootstrapped(ssh_cluster: SSHCluster, tmp_path_factory) -> SSHCluster:
    """This jobctl installed on the login node, as a user would: `jobctl remote bootstrap`."""
    home = tmp_path_factory.mktemp("bootstrap-home")
    res = jobctl("remote", "bootstrap", "dev-ssh", "--json", env=_env(ssh_cluster, home), timeout=900)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["remote_version"] == out["local_version"]
    assert out["sbatch"].startswith("slurm")
    return ssh_cluster


def _env(c: SSHCluster, home: Path, clusters: Path | None = None) -> dict:
    return {"JOBCTL_HOME": str(home), "JOBCTL_CLUSTERS": str(clusters or c.inventory.parent),
            "JOBCTL_NO_CACHE": "1"}


def _remote(c: SSHCluster, *argv: str, known_hosts: Path | None = None):
    import subprocess

    return subprocess.run(c.ssh_argv(*argv, known_hosts=known_hosts), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _sacct(c: SSHCluster, *args: str) -> list[list[str]]:
    res = _remote(c, "sacct", "-n", "-P", "-X", "-o", "JobID,JobName,State", *args)
    assert res.returncode == 0, res.stderr
    return [line.split("|") for line in res.stdout.splitlines() if line.strip()]


def _sacct_settled(c: SSHCluster, expect, *args: str, timeout_s: float = 60) -> list[list[str]]:
    """sacct's rows once `expect(rows)` holds (slurmdbd fills in a job's record in steps: for a
    moment after the end its name can read `allocation`), or the last rows after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = _sacct(c, *args)
        if expect(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def _wait_state(env: dict, job: str, states: set[str], timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        res = jobctl("status", job, "--json", env=env)
        assert res.returncode == 0, res.stderr
        row = json.loads(res.stdout)[0]
        if row["state"] in states or time.monotonic() > deadline:
            assert row["state"] in states, row
            return row
        time.sleep(1)


def _sleep_recipe(tmp_path: Path, name: str, seconds: int = 120) -> Path:
    text = (ROOT / "recipes" / "tiny.yaml").read_text()
    doc = yaml.safe_load(text)
    doc["name"] = name
    doc["launch"]["command"] = ["sleep", str(seconds)]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_bootstrap_installed_this_version(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    here = jobctl("--version")
    there = _remote(bootstrapped, bootstrapped.remote_python, "-m", "jobctl", "--version")
    assert there.returncode == 0, there.stderr
    assert there.stdout.strip() == here.stdout.strip()
    # the wheel came over SFTP into the workdir, and `remote check` agrees
    wheels = _remote(bootstrapped, "ls", f"{bootstrapped.workdir}/wheels")
    assert "jobctl-" in wheels.stdout and ".whl" in wheels.stdout
    res = jobctl("remote", "check", "dev-ssh", "--json", env=_env(bootstrapped, tmp_path))
    assert res.returncode == 0, res.stderr
    assert "created_venv" not in json.loads(res.stdout)


def _see_these_dependencies(venv: Path) -> None:
    """Let `venv`'s python import jobctl's dependencies from where the interpreter running this
    test has them: a user's venv (the README's `pip install -e '.[test]'` inside one), the
    system's site-packages or the user site. (`--system-site-packages` would not do: a venv made
    from a venv's python sees the base interpreter's site-packages, not that venv's, and a
    newcomer's dependencies live in theirs.) The directories go into a .pth file as plain paths:
    they come after the venv's own site-packages, and the .pth files inside them -- the editable
    jobctl of the checkout among them -- are not run, so `import jobctl` still finds the venv's.
    Added after the wheel is installed, so that pip did not see this interpreter's jobctl."""
    import site
    import subprocess

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                             check=True).stdout.strip()
    (Path(purelib) / "_test_dependencies.pth").write_text("".join(f"{d}\n" for d in dirs if Path(d).is_dir()))


def test_bootstrap_from_an_installed_wheel(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    """A user who installed jobctl from a wheel (no checkout anywhere) can bootstrap a cluster:
    the wheel jobctl uploads is made from its installed files. Here jobctl runs from a venv that
    has only that wheel installed (its dependencies are the ones this test runs with, see
    `_see_these_dependencies`), in a directory that is not the repository."""
    import subprocess
    import sys

    from jobctl.remote.bootstrap import build_wheel

    wheel = build_wheel(str(tmp_path))
    # no PYTHONPATH anywhere below: a checkout on it would be the jobctl pip finds installed
    # (and skips the wheel for) and the one the venv's python imports
    env = {**{k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"},
           **_env(bootstrapped, tmp_path / "home"), "COLUMNS": "4000"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], env=env, check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", wheel],
                         env=env, capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    _see_these_dependencies(venv)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import jobctl; print(jobctl.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed wheel, not the checkout
    res = subprocess.run([str(venv / "bin" / "jobctl"), "remote", "bootstrap", "dev-ssh", "--json"], cwd=elsewhere,
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["remote_version"] == out["local_version"]  # and check_same_jobctl compared the source digests


def test_submit_status_logs_through_ssh(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    env = _env(bootstrapped, tmp_path)
    name = f"tiny-{uuid.uuid4().hex[:8]}"
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", f"name={name}", "--json", env=env)
    assert res.returncode == 0, res.stderr
    (job,) = json.loads(res.stdout)
    row = _wait_state(env, str(job["id"]), ENDED)
    assert row["state"] == "COMPLETED"
    # the scheduler on the other side of SSH has that job, under that id, completed
    want = [[job["scheduler_job_id"], name, "COMPLETED"]]
    assert _sacct_settled(bootstrapped, lambda rows: rows == want, "-j", job["scheduler_job_id"]) == want
    # its folder is on the login node; the history here records it like a local job
    assert _remote(bootstrapped, "test", "-f", f"{job['remote_folder']}/job.json").returncode == 0
    (rec,) = _rows(tmp_path)
    assert (rec["cluster"], rec["scheduler"], rec["state"]) == ("dev-ssh", "slurm", "COMPLETED")
    assert rec["remote_folder"] == job["remote_folder"]
    logs = jobctl("logs", str(job["id"]), env=env)
    assert logs.returncode == 0, logs.stderr
    remote_log = _remote(bootstrapped, "cat", f"{job['remote_folder']}/logs/node-0.log")
    assert logs.stdout == remote_log.stdout
    assert "tiny_train: done" in logs.stdout


def test_cancel_and_watch_through_ssh(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    env = _env(bootstrapped, tmp_path)
    name = f"sleep-{uuid.uuid4().hex[:8]}"
    res = jobctl("submit", str(_sleep_recipe(tmp_path, name)), "-c", "dev-ssh", "--json", env=env)
    assert res.returncode == 0, res.stderr
    (job,) = json.loads(res.stdout)
    _wait_state(env, str(job["id"]), {"RUNNING"})
    snap = jobctl("watch", str(job["id"]), "--json", env=env)
    assert snap.returncode == 0, snap.stderr
    assert json.loads(snap.stdout)["job"]["state"] == "RUNNING"
    res = jobctl("cancel", str(job["id"]), "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["state"] == "CANCELLED"
    deadline = time.monotonic() + 60
    while _sacct(bootstrapped, "-j", job["scheduler_job_id"])[0][2].split()[0] != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(1)
    assert _sacct(bootstrapped, "-j", job["scheduler_job_id"])[0][2].split()[0] == "CANCELLED"


def test_oom_chain_through_ssh_with_synced_tree(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    """The payload fails like PyTorch's CUDA OOM above micro-batch 2; the job's first node walks
    the ladder on the cluster (8 -> 4 -> 2, global batch 16 kept) and the laptop follows it."""
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(PAYLOAD, tree / "oom_payload.py")
    (tree / "scratch.tmp").write_text("not for the cluster\n")
    (tree / ".gitignore").write_text("*.tmp\n")
    import subprocess

    subprocess.run(["git", "init", "-q", str(tree)], check=True)  # a working tree, as a user's would be
    name = f"oom-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / "oom.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": name, "model": "llama3.2-1b",
        "train": {"seq_len": 2048, "global_batch_size": 16, "precision": "bf16-mixed", "attention": "sdpa"},
        "framework": "generic",
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "dp": 1, "recompute": "none", "offload": "none"},
        "resources": {"time": "00:05:00"},
        "launch": {"launcher": "none", "command": ["python", "oom_payload.py"], "env": {"OOM_MAX_MICRO_BATCH": "2"}},
    }))
    env = _env(bootstrapped, tmp_path / "home")
    res = jobctl("submit", str(recipe), "-c", "dev-ssh", "--sync", str(tree), "--wait", env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = _rows(tmp_path / "home")
    assert [r["state"] for r in rows] == ["FAILED", "FAILED", "COMPLETED"]
    assert [r["parent_id"] for r in rows] == [None, rows[0]["id"], rows[1]["id"]]
    assert [r["attempt"] for r in rows] == [1, 2, 3]
    plans = [json.loads(r["plan_json"]) for r in rows]
    assert [p["micro_batch_size"] for p in plans] == [8, 4, 2]
    assert {p["micro_batch_size"] * p["grad_accum_steps"] * p["dp"] for p in plans} == {16}
    assert [r["failure_kind"] for r in rows[:2]] == ["CUDA_OOM", "CUDA_OOM"]
    assert "step 3" in res.stderr  # the last attempt's log, followed from here
    # all three ran on the cluster, in the synced tree; what .gitignore excludes was not sent
    ids = [r["scheduler_job_id"] for r in rows]
    ran = _sacct_settled(bootstrapped, lambda found: len(found) >= 3, "--name", name)
    assert sorted(s[0] for s in ran) == sorted(ids)
    remote_tree = json.loads((tmp_path / "home" / "remote" / "dev-ssh" / f"{rows[0]['id']}-{name}" / "job.json")
                             .read_text())["cwd"]
    listing = _remote(bootstrapped, "ls", "-a", remote_tree).stdout.split()
    assert "oom_payload.py" in listing and "scratch.tmp" not in listing


def test_retried_submission_does_not_create_a_second_job(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    env = _env(bootstrapped, tmp_path)
    name = f"retry-{uuid.uuid4().hex[:8]}"
    token = uuid.uuid4().hex
    first = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", f"name={name}", "--token", token, "--json", env=env)
    assert first.returncode == 0, first.stderr
    again = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", f"name={name}", "--token", token, "--json", env=env)
    assert again.returncode == 0, again.stderr
    (a,), (b,) = json.loads(first.stdout), json.loads(again.stdout)
    assert (b["id"], b["scheduler_job_id"]) == (a["id"], a["scheduler_job_id"])
    assert (a["existing"], b["existing"]) == (False, True)
    # from a second laptop (another history) too: the login node knows the token
    other = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", f"name={name}", "--token", token, "--json",
                   env=_env(bootstrapped, tmp_path / "other"))
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)[0]["scheduler_job_id"] == a["scheduler_job_id"]
    # slurmctld knows every job the moment sbatch returns (accounting can lag): exactly one by that name
    res = _remote(bootstrapped, "squeue", "-h", "-t", "all", "--name", name, "-o", "%i")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [a["scheduler_job_id"]]
    assert len(_rows(tmp_path)) == 1


def _proxied_inventory(c: SSHCluster, proxy_port: int, where: Path) -> Path:
    """dev-ssh reached through the forwarder: the same host key, under the forwarder's port."""
    where.mkdir(parents=True, exist_ok=True)
    key_line = next(line for line in c.known_hosts.read_text().splitlines() if line.strip())
    host_key = key_line.split(None, 1)[1]
    known = where / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy_port} {host_key}\n")
    doc = yaml.safe_load(c.inventory.read_text())
    doc["login"].update(port=proxy_port, known_hosts=str(known))
    (where / "dev-ssh.yaml").write_text(yaml.safe_dump(doc))
    return where


def test_dropped_connection_during_status_recovers(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    env = _env(bootstrapped, tmp_path)
    res = jobctl("submit", str(_sleep_recipe(tmp_path, f"drop-{uuid.uuid4().hex[:8]}", 90)), "-c", "dev-ssh",
                 "--json", env=env)
    assert res.returncode == 0, res.stderr
    (job,) = json.loads(res.stdout)
    _wait_state(env, str(job["id"]), {"RUNNING"})
    with TcpProxy(bootstrapped.port) as proxy:
        penv = _env(bootstrapped, tmp_path, _proxied_inventory(bootstrapped, proxy.port, tmp_path / "proxied"))
        # once without a cut, to learn how many bytes a status is; then cut the connection halfway
        ok = jobctl("status", str(job["id"]), "--json", env=penv)
        assert ok.returncode == 0, ok.stderr
        assert proxy.connections == 1
        total = proxy.server_bytes[0]
        proxy.cut_first(total // 2)
        res = jobctl("status", str(job["id"]), "--json", env=penv)
        assert res.returncode == 0, res.stderr
        assert proxy.cuts == 1 and proxy.connections >= 3  # the cut one, then a new one
        assert json.loads(res.stdout)[0]["state"] == "RUNNING"
    assert jobctl("cancel", str(job["id"]), env=env).returncode == 0


def test_unknown_and_changed_host_keys_are_refused(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    doc = yaml.safe_load(bootstrapped.inventory.read_text())
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "known_hosts").write_text("")
    doc["login"]["known_hosts"] = str(unknown / "known_hosts")
    (unknown / "dev-ssh.yaml").write_text(yaml.safe_dump(doc))
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", env=_env(bootstrapped, tmp_path / "h1", unknown))
    assert res.returncode == 5
    assert "is not in" in res.stderr and "SHA256:" in res.stderr and "ssh-keyscan" in res.stderr
    assert (unknown / "known_hosts").read_text() == ""  # never added behind the user's back
    assert not (tmp_path / "h1" / "history.sqlite").exists() or _rows(tmp_path / "h1") == []

    changed = tmp_path / "changed"
    changed.mkdir()
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(changed / "other")], check=True)
    other = (changed / "other.pub").read_text().split()
    (changed / "known_hosts").write_text(f"[127.0.0.1]:{bootstrapped.port} {other[0]} {other[1]}\n")
    doc["login"]["known_hosts"] = str(changed / "known_hosts")
    (changed / "dev-ssh.yaml").write_text(yaml.safe_dump(doc))
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", env=_env(bootstrapped, tmp_path / "h2", changed))
    assert res.returncode == 5
    assert "CHANGED" in res.stderr and "ssh-keygen -R" in res.stderr


def test_remote_without_jobctl_is_refused_clearly(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    """A remote python without jobctl: exit 2 and the bootstrap command, nothing submitted."""
    doc = yaml.safe_load(bootstrapped.inventory.read_text())
    doc["login"]["remote_python"] = "/usr/bin/python3"
    where = tmp_path / "clusters"
    where.mkdir()
    (where / "dev-ssh.yaml").write_text(yaml.safe_dump(doc))
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", env=_env(bootstrapped, tmp_path, where))
    assert res.returncode == 2, res.stderr
    assert "jobctl remote bootstrap dev-ssh" in res.stderr
    assert not (tmp_path / "history.sqlite").exists() or _rows(tmp_path) == []


def test_agent_answers_errors_as_json(bootstrapped: SSHCluster) -> None:
    """What a remote caller reads: one JSON object on stdout, the error's exit code."""
    res = _remote(bootstrapped, bootstrapped.remote_python, "-m", "jobctl", "remote", "agent", "status")
    # no request on stdin: an empty object, so `tokens` is missing
    assert res.returncode == 2
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "UsageError" and err["exit_code"] == 2 and "tokens" in err["message"]
    res = _remote(bootstrapped, bootstrapped.remote_python, "-m", "jobctl", "remote", "agent", "frobnicate")
    assert res.returncode == 2 and "unknown agent action" in json.loads(res.stdout)["error"]["message"]


def test_a_different_build_of_the_same_version_is_refused(bootstrapped: SSHCluster, tmp_path: Path) -> None:
    """The version number alone would not tell an old build from this one: the remote jobctl's
    sources are compared too. (Runs last: it changes the remote install, then bootstraps again.)"""
    env = _env(bootstrapped, tmp_path)
    where = _remote(bootstrapped, bootstrapped.remote_python, "-c",
                    "import jobctl.examples.tiny_train as m; print(m.__file__)").stdout.strip()
    assert where.endswith("tiny_train.py")
    assert _remote(bootstrapped, "sh", "-c", f"echo '# changed' >> {where}").returncode == 0
    res = jobctl("submit", "recipes/tiny.yaml", "-c", "dev-ssh", env=env)
    assert res.returncode == 2
    assert "built from other sources" in res.stderr and "jobctl remote bootstrap dev-ssh" in res.stderr
    assert not (tmp_path / "history.sqlite").exists() or _rows(tmp_path) == []
    fixed = jobctl("remote", "bootstrap", "dev-ssh", env=env, timeout=900)
    assert fixed.returncode == 0, fixed.stderr
    assert jobctl("remote", "check", "dev-ssh", env=env).returncode == 0
