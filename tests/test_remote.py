"""jobctl.remote.ssh, with its files, tree sync and the version check, against a real OpenSSH sshd
on 127.0.0.1 (a free port), started by this module.

The session fixture `sshd` (root only; skips otherwise unless JOBCTL_REQUIRE_SLURM is set)
installs openssh-server if needed, creates the user `jobctl-rtest`, makes host and client
ed25519 keys in a temporary directory, starts `/usr/sbin/sshd -f <its own config>` and stops it
at the end. Nothing here uses the dev-cluster script or other fixtures.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobctl.config.schema import Inventory, Login
from jobctl.errors import ConfigError, InfeasibleError, SchedulerError, UsageError
from jobctl.remote.client import check_version, remote_version
from jobctl.remote.protocol import error_from_payload
from jobctl.remote.ssh import Remote
from jobctl.remote.sync import MANIFEST, sync_tree

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick), for this module's own sshd."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _free_port()
USER = "jobctl-rtest"
POLICY_RC = "/usr/sbin/policy-rc.d"


def _required() -> bool:
    return os.environ.get("JOBCTL_REQUIRE_SLURM", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _required():
        pytest.fail(f"JOBCTL_REQUIRE_SLURM is set but {reason}", pytrace=False)
    pytest.skip(f"{reason} (set JOBCTL_REQUIRE_SLURM=1 to fail instead of skipping)")


def _sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)


def _install_openssh_server() -> None:
    if os.path.exists(SSHD):
        return
    made_policy = not os.path.exists(POLICY_RC)
    if made_policy:  # keep dpkg from starting the system sshd on port 22
        Path(POLICY_RC).write_text("#!/bin/sh\nexit 101\n")
        os.chmod(POLICY_RC, 0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ("apt-get", "install", "-y", "-q", "--no-install-recommends", "openssh-server")
        res = _sh(*install, env=env, timeout=900)
        if res.returncode != 0:
            _sh("apt-get", "update", "-q", env=env, timeout=900)
            res = _sh(*install, env=env, timeout=900)
        if res.returncode != 0 or not os.path.exists(SSHD):
            pytest.fail(f"could not install openssh-server:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    finally:
        if made_policy:
            os.remove(POLICY_RC)


def _keygen(path: Path, passphrase: str = "") -> Path:
    res = _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", path.name, "-f", str(path))
    assert res.returncode == 0, res.stderr
    return path


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(2)
            return s.recv(64).startswith(b"SSH-2.0")
    except OSError:
        return False


def _running(pid: int) -> bool:
    """Alive and not a zombie (PID 1 of a container may never reap the daemon)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True)
class Sshd:
    dir: Path
    client_key: Path
    host_pub: str  # "ssh-ed25519 AAAA..."
    other_pub: str  # a different host key, for the changed-key test
    known_hosts: Path  # holds the real host key
    home: Path
    log: Path

    def login(self, **kw) -> Login:
        values = {"host": "127.0.0.1", "port": PORT, "user": USER, "key_file": str(self.client_key),
                  "known_hosts": str(self.known_hosts), "ssh_config": str(self.dir / "no-ssh-config")}
        return Login(**{**values, **kw})

    def accepted(self) -> int:
        """Connections sshd has authenticated so far (its own log)."""
        return self.log.read_text(errors="replace").count("Accepted publickey for " + USER)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> Sshd:
    if os.geteuid() != 0:
        _unavailable("the test sshd needs root (it creates a user and runs /usr/sbin/sshd)")
    if not os.path.exists(SSHD) and shutil.which("apt-get") is None:
        _unavailable("openssh-server is not installed and apt-get is not available to install it")
    if shutil.which("ssh-keygen") is None:
        _unavailable("ssh-keygen (openssh-client) is not installed")
    _install_openssh_server()
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        res = _sh("useradd", "--create-home", "--shell", "/bin/bash", "--password", "*", USER)
        assert res.returncode == 0, res.stderr
        pw = pwd.getpwnam(USER)
    home = Path(pw.pw_dir)
    d = tmp_path_factory.mktemp("sshd")
    host_key, client_key, other_key = _keygen(d / "host_ed25519"), _keygen(d / "client_ed25519"), _keygen(
        d / "other_ed25519")
    host_pub = " ".join(Path(f"{host_key}.pub").read_text().split()[:2])
    other_pub = " ".join(Path(f"{other_key}.pub").read_text().split()[:2])
    known_hosts = d / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{PORT} {host_pub}\n")
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    for p, mode in ((ssh_dir, 0o700), (authorized, 0o600)):
        os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(p, mode)
    shutil.rmtree(home / "rtest", ignore_errors=True)
    log = d / "sshd.log"
    cfg = d / "sshd_config"
    cfg.write_text(f"""\
Port {PORT}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {d}/sshd.pid
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
AllowUsers {USER}
AllowTcpForwarding yes
Subsystem sftp internal-sftp
LogLevel VERBOSE
""")
    deadline = time.monotonic() + 10  # a previous run's sshd may still be on its way out
    while _port_open(PORT):
        if time.monotonic() > deadline:
            who = _sh("ss", "-ltnp").stdout if shutil.which("ss") else ""
            pytest.fail(f"port {PORT} is already taken on 127.0.0.1; stop whatever listens there\n{who}",
                        pytrace=False)
        time.sleep(0.2)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    res = _sh(SSHD, "-t", "-f", str(cfg))
    assert res.returncode == 0, f"sshd -t: {res.stderr}"
    res = _sh(SSHD, "-f", str(cfg), "-E", str(log))
    assert res.returncode == 0, f"sshd: {res.stderr}"
    try:
        deadline = time.monotonic() + 15
        while not _port_open(PORT):
            if time.monotonic() > deadline:
                pytest.fail(f"sshd did not accept connections on {PORT}:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield Sshd(d, client_key, host_pub, other_pub, known_hosts, home, log)
    finally:
        pid_file = d / "sshd.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
            for _ in range(100):  # wait until it is gone, so the next run finds the port free
                if not _running(pid):
                    break
                time.sleep(0.05)
        authorized.unlink(missing_ok=True)
        shutil.rmtree(home / "rtest", ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # keys come from the test's files only


def _fingerprint(pub_file: Path) -> str:
    return _sh("ssh-keygen", "-l", "-E", "sha256", "-f", str(pub_file)).stdout.split()[1]


HOSTILE = ["it's", 'say "hi"', "$(touch /tmp/jobctl-rtest-pwned)", "`touch /tmp/jobctl-rtest-pwned`", "a; rm -rf ~",
           "line1\nline2", "  two  spaces ", "", "*", "~", "\\", "$HOME", "|&><!#", "-n", "--help", "tab\there", "ünï😀"]
ECHO_ARGV = ["python3", "-c", "import sys,json;print(json.dumps(sys.argv[1:]))"]


def test_hostile_argv_comes_back_byte_exact(sshd):
    with Remote(sshd.login()) as r:
        res = r.run([*ECHO_ARGV, *HOSTILE], idempotent=True)
        assert (res.rc, res.stderr) == (0, "")
        assert json.loads(res.stdout) == HOSTILE
        assert not os.path.exists("/tmp/jobctl-rtest-pwned")
        cat = r.run(["python3", "-c", "import sys;sys.stdout.write(sys.stdin.read())"], idempotent=True,
                    input_text="\n".join(HOSTILE) * 2000)
        assert cat.stdout == "\n".join(HOSTILE) * 2000
        unread = r.run(["sh", "-c", "head -c 5; exit 7"], idempotent=True, input_text="x" * 20_000_000)
        assert (unread.rc, unread.stdout) == (7, "xxxxx")  # stopped reading early: not an error
        err = r.run(["sh", "-c", "echo out; echo 'to stderr' >&2; exit 3"], idempotent=True)
        assert (err.rc, err.stdout, err.stderr) == (3, "out\n", "to stderr\n")


def test_unknown_host_key_is_refused_with_fingerprint_and_fix(sshd):
    kh = sshd.dir / "empty_known_hosts"
    kh.write_text("")
    with pytest.raises(SchedulerError) as ei:
        Remote(sshd.login(known_hosts=str(kh))).connect()
    e = ei.value
    assert e.exit_code == 5
    fp = _fingerprint(sshd.dir / "host_ed25519.pub")
    assert fp.startswith("SHA256:") and fp in e.message and fp in e.hint
    assert f"[127.0.0.1]:{PORT}" in e.message and "not in" in e.message
    assert "out of band" in e.hint
    fix = re.search(rf"ssh-keyscan -p {PORT} (-t ed25519 )?127\.0\.0\.1 >> \S+", e.hint)
    assert fix and str(kh) in fix.group(0)
    assert kh.read_text() == ""  # never added behind the user's back
    # The fix the message gives works.
    assert _sh("sh", "-c", fix.group(0)).returncode == 0
    with Remote(sshd.login(known_hosts=str(kh))) as r:
        assert r.run(["true"], idempotent=True).rc == 0


@pytest.mark.parametrize("hashed", [False, True])
def test_changed_host_key_is_refused_naming_the_line(sshd, hashed):
    kh = sshd.dir / f"changed_known_hosts_{hashed}"
    kh.write_text(f"# my hosts\nother.example {sshd.host_pub}\n[127.0.0.1]:{PORT} {sshd.other_pub}\n")
    if hashed:
        assert _sh("ssh-keygen", "-H", "-f", str(kh)).returncode == 0
        assert "127.0.0.1" not in kh.read_text()
    before = kh.read_text()
    with pytest.raises(SchedulerError) as ei:
        Remote(sshd.login(known_hosts=str(kh))).connect()
    e = ei.value
    assert e.exit_code == 5
    assert "CHANGED" in e.message and "refused" in e.message and "man-in-the-middle" in e.message
    assert f"{kh}:3" in e.message and f"{kh}:3" in e.hint
    assert _fingerprint(sshd.dir / "host_ed25519.pub") in e.message
    assert _fingerprint(sshd.dir / "other_ed25519.pub") in e.message
    assert f"ssh-keygen -R '[127.0.0.1]:{PORT}' -f {kh}" in e.hint
    assert kh.read_text() == before


def test_a_private_key_others_can_read_is_refused_as_openssh_does(sshd, tmp_path):
    key = tmp_path / "key"
    key.write_bytes(Path(sshd.client_key).read_bytes())
    key.chmod(0o644)
    with pytest.raises(UsageError, match=r"readable by others \(mode 0644\)") as ei:
        Remote(sshd.login(key_file=str(key))).connect()
    assert ei.value.hint == f"chmod 600 {key}"
    key.chmod(0o600)  # the fix it gives
    with Remote(sshd.login(key_file=str(key))) as r:
        assert r.run(["true"], idempotent=True).rc == 0


def test_known_hosts_markers_and_bad_lines_are_read_as_openssh_does(sshd):
    """One @cert-authority line, an unknown marker or a line that does not parse used to make
    paramiko reject the whole file; OpenSSH skips them. An @revoked key is never accepted,
    even when another line lists it for the host."""
    kh = sshd.dir / "marked_known_hosts"
    kh.write_text(f"@cert-authority *.example {sshd.other_pub}\n@future-marker x {sshd.other_pub}\n"
                  f"broken.example ssh-ed25519 not-base64!!\n[127.0.0.1]:{PORT} {sshd.host_pub}\n")
    with Remote(sshd.login(known_hosts=str(kh))) as r:
        assert r.run(["true"], idempotent=True).rc == 0
    kh.write_text(f"[127.0.0.1]:{PORT} {sshd.host_pub}\n@revoked * {sshd.host_pub}\n")
    with pytest.raises(SchedulerError, match="REVOKED") as ei:
        Remote(sshd.login(known_hosts=str(kh))).connect()
    assert f"{kh}:2" in ei.value.message and ei.value.exit_code == 5


def test_one_connection_serves_many_commands(sshd):
    before = sshd.accepted()
    with Remote(sshd.login()) as r:
        transport = r._client.get_transport()
        for i in range(15):
            assert r.run(["echo", str(i)], idempotent=True).stdout == f"{i}\n"
        r.files.put_text("x", "rtest/reuse.txt")
        assert r.files.get_text("rtest/reuse.txt") == "x"
        assert r.json_command(["python3", "-c", "print(42)"], idempotent=True) == 42
        assert r.connect_count == 1 and r._client.get_transport() is transport
    for _ in range(50):  # sshd's log is written by another process
        if sshd.accepted() - before >= 1:
            break
        time.sleep(0.05)
    assert sshd.accepted() - before == 1


def test_connection_closed_between_commands_is_reopened(sshd):
    with Remote(sshd.login()) as r:
        r._client.get_transport().close()
        assert r.run(["echo", "back"], idempotent=True).stdout == "back\n"
        assert r.connect_count == 2
        # Nothing was sent on the dead connection, so even a non-idempotent command is safe to send.
        r._client.get_transport().close()
        assert r.run(["echo", "again"], idempotent=False).stdout == "again\n"
        assert r.connect_count == 3


def _drop_soon(r: Remote, after_s: float = 0.5) -> threading.Timer:
    timer = threading.Timer(after_s, r._client.get_transport().close)
    timer.start()
    return timer


def test_drop_during_idempotent_command_is_retried(sshd):
    slept = []
    with Remote(sshd.login(), sleep=lambda s: (slept.append(s), time.sleep(s))) as r:
        _drop_soon(r)
        res = r.run(["sh", "-c", "sleep 1.5; echo done"], idempotent=True)
        assert (res.rc, res.stdout) == (0, "done\n")
        assert slept == [0.5] and r.connect_count == 2


def test_drop_during_non_idempotent_command_is_not_retried(sshd):
    with Remote(sshd.login()) as r:
        r.files.makedirs("rtest")
        r.files.put_text("", "rtest/count")
        _drop_soon(r)
        with pytest.raises(SchedulerError) as ei:
            r.run(["sh", "-c", "echo ran >> ~/rtest/count; sleep 1.5"], idempotent=False)
        assert ei.value.exit_code == 5 and "may or may not have run" in ei.value.message
        assert r.files.get_text("rtest/count") == "ran\n"  # it did run, once: a blind retry would have doubled it


def test_unreachable_host_and_bounded_retries(sshd):
    with pytest.raises(SchedulerError, match="cannot reach"):
        Remote(sshd.login(port=1)).connect()
    slept = []
    r = Remote(sshd.login(port=1), retry_delays_s=(0.01, 0.02), sleep=slept.append)
    with pytest.raises(SchedulerError, match="after 3 attempts") as ei:
        r.run(["true"], idempotent=True)
    assert ei.value.exit_code == 5 and slept == [0.01, 0.02]


def test_timeout_and_killed_command_keep_the_connection(sshd):
    with Remote(sshd.login()) as r:
        with pytest.raises(SchedulerError, match=r"did not finish within 0.5 s"):
            r.run(["sleep", "5"], idempotent=True, timeout_s=0.5)
        assert r.run(["sh", "-c", "kill -9 $$"], idempotent=False).rc == -1  # killed by a signal: not a drop
        assert r.run(["echo", "ok"], idempotent=True).stdout == "ok\n"
        assert r.connect_count == 1


def test_json_command_maps_remote_errors(sshd):
    def py(code: str) -> list[str]:
        return ["python3", "-c", "import json,sys\n" + code]

    with Remote(sshd.login()) as r:
        assert r.json_command(py("print(json.dumps({'a': [1, 'x']}))"), idempotent=True) == {"a": [1, "x"]}
        err = {"error": {"type": "InfeasibleError", "exit_code": 3, "message": "nothing fits", "hint": "more GPUs"}}
        with pytest.raises(InfeasibleError) as ei:
            r.json_command(py(f"print(json.dumps({err!r})); sys.exit(3)"), idempotent=True)
        assert (ei.value.exit_code, ei.value.message, ei.value.hint) == (3, "nothing fits", "more GPUs")
        cfg = {"error": {"type": "ConfigError", "exit_code": 2, "message": "m",
                         "issues": [{"file": "r.yaml", "line": 3, "key": "train.seq_len", "problem": "too big"}]}}
        with pytest.raises(ConfigError) as ei:
            r.json_command(py(f"sys.stderr.write('chatter\\n' + json.dumps({cfg!r}) + '\\n'); sys.exit(2)"),
                           idempotent=True)
        assert ei.value.exit_code == 2 and ei.value.message == "r.yaml:3: train.seq_len: too big"
        with pytest.raises(SchedulerError, match="not JSON"):
            r.json_command(["echo", "hello"], idempotent=True)
        with pytest.raises(SchedulerError, match="exit code 5: boom"):
            r.json_command(["sh", "-c", "echo boom >&2; exit 5"], idempotent=True)
        with pytest.raises(SchedulerError) as ei:
            r.json_command(["no-such-python-here"], idempotent=True)
        assert "remote_python" in ei.value.hint


def test_error_from_payload_by_exit_code():
    e = error_from_payload({"error": {"type": "SomethingNew", "exit_code": 5, "message": "slurm down"}})
    assert isinstance(e, SchedulerError) and e.message == "slurm down"
    assert error_from_payload({"jobs": []}) is None and error_from_payload([1]) is None


def test_sftp_round_trip(sshd, tmp_path):
    with Remote(sshd.login()) as r:
        assert r.workdir == str(sshd.home / "jobctl")
        path = r.files.put_text("héllo\n$(x)\n", "rtest/a/b/c.txt")
        assert path == str(sshd.home / "rtest/a/b/c.txt")
        assert r.files.get_text("~/rtest/a/b/c.txt") == "héllo\n$(x)\n"
        st = os.stat(path)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == pwd.getpwnam(USER).pw_uid
        r.files.put_text("v2", path, mode=0o640)  # absolute path, overwrite
        assert r.files.get_text(path) == "v2" and os.stat(path).st_mode & 0o777 == 0o640
        blob = tmp_path / "run.sh"
        blob.write_bytes(bytes(range(256)) * 1000)
        blob.chmod(0o755)
        dest = r.files.put_file(blob, "rtest/bin/run.sh")
        assert Path(dest).read_bytes() == blob.read_bytes() and os.stat(dest).st_mode & 0o777 == 0o755
        assert r.files.makedirs("rtest/x/y/z") == str(sshd.home / "rtest/x/y/z")
        assert Path(sshd.home / "rtest/x/y/z").is_dir()
        assert r.files.get_text("rtest/missing", missing_ok=True) is None
        with pytest.raises(SchedulerError, match="cannot read"):
            r.files.get_text("rtest/missing")
        assert not list((sshd.home / "rtest").rglob("*.jobctl-tmp"))


def _git(cwd: Path, *args: str) -> None:
    res = _sh("git", *args, cwd=cwd)
    assert res.returncode == 0, res.stderr


def test_sync_tree_sends_only_changes_and_respects_gitignore(sshd, tmp_path):
    tree = tmp_path / "tree"
    files = {".gitignore": "*.log\nbuild/\n", "a.py": "print('a')\n", "pkg/__init__.py": "", "pkg/mod.py": "x = 1\n",
             "new.txt": "untracked but not ignored\n", "run.sh": "#!/bin/sh\necho hi\n",
             "run.log": "ignored\n", "build/out.o": "ignored\n"}
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / "data").mkdir()
    (tree / "data/big.bin").write_bytes(os.urandom(300_000))
    (tree / "run.sh").chmod(0o755)
    _git(tree, "init", "-q")
    _git(tree, "add", "a.py", "pkg", ".gitignore")
    remote_root = sshd.home / "rtest/tree"
    with Remote(sshd.login()) as r:
        r.files.put_text("mine\n", "rtest/tree/outputs/keep.txt")  # not sent by sync: never touched
        first = sync_tree(r, tree, "rtest/tree")
        assert (first.uploaded, first.unchanged, first.deleted, first.skipped) == (7, 0, 0, 0)
        assert first.bytes_uploaded > 300_000
        assert not (remote_root / "run.log").exists() and not (remote_root / "build").exists()
        assert (remote_root / "data/big.bin").read_bytes() == (tree / "data/big.bin").read_bytes()
        assert os.stat(remote_root / "run.sh").st_mode & 0o777 == 0o755
        assert (remote_root / MANIFEST).is_file()

        second = sync_tree(r, tree, "rtest/tree")
        assert (second.uploaded, second.unchanged, second.deleted) == (0, 7, 0)

        (tree / "a.py").write_text("print('changed')\n")
        later = time.time() + 5
        os.utime(tree / "pkg/mod.py", (later, later))  # touched, same content: not sent
        (tree / "pkg/extra.py").write_text("y = 2\n")
        (tree / "new.txt").unlink()
        third = sync_tree(r, tree, "rtest/tree")
        assert (third.uploaded, third.unchanged, third.deleted) == (2, 5, 1)
        assert (remote_root / "a.py").read_text() == "print('changed')\n"
        assert not (remote_root / "new.txt").exists()

        (remote_root / "pkg/mod.py").unlink()  # removed behind jobctl's back: sent again
        fourth = sync_tree(r, tree, "rtest/tree")
        assert (fourth.uploaded, fourth.unchanged) == (1, 6)
        assert (remote_root / "outputs/keep.txt").read_text() == "mine\n"
        assert r.connect_count == 1

        plain = tmp_path / "plain"  # not a git checkout: every file, .gitignore or not
        (plain / "sub").mkdir(parents=True)
        for rel in (".gitignore", "x.log", "sub/y.txt"):
            (plain / rel).write_text("*.log\n")
        res = sync_tree(r, plain, "rtest/plain")
        assert res.uploaded == 3 and (sshd.home / "rtest/plain/x.log").exists()


def test_ssh_config_alias_and_proxyjump(sshd):
    cfg = sshd.dir / "ssh_config"
    cfg.write_text(f"""\
Host devalias viajump jumpbox
    HostName 127.0.0.1
    Port {PORT}
    User {USER}
    IdentityFile {sshd.client_key}

Host viajump
    ProxyJump jumpbox

Host inlinejump
    HostName 127.0.0.1
    Port {PORT}
    ProxyJump {USER}@127.0.0.1:{PORT}
""")
    login = Login(host="devalias", known_hosts=str(sshd.known_hosts), ssh_config=str(cfg))
    with Remote(login) as r:
        assert repr(r) == f"Remote(host='127.0.0.1', user='{USER}', port={PORT})"
        assert "devalias" in str(r)
        assert r.run(["whoami"], idempotent=True).stdout == f"{USER}\n"
        assert r._jumps == []
    with Remote(Login(host="viajump", known_hosts=str(sshd.known_hosts), ssh_config=str(cfg))) as r:
        assert len(r._jumps) == 1
        assert type(r._client.get_transport().sock).__name__ == "Channel"  # SSH over the jump's direct-tcpip
        jump_port = r._jumps[0].get_transport().sock.getsockname()[1]
        seen = r.run(["sh", "-c", "echo $SSH_CONNECTION"], idempotent=True).stdout.split()
        assert seen[0] == "127.0.0.1" and int(seen[1]) != jump_port  # the target's client is the jump host's sshd
        assert r.run(["whoami"], idempotent=True).stdout == f"{USER}\n"
        assert r.files.get_text("rtest/none", missing_ok=True) is None  # SFTP through the jump too
    # Inline ProxyJump; the jump host uses the login's key; explicit login values win over the config.
    login = Login(host="inlinejump", user=USER, key_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                  ssh_config=str(cfg))
    with Remote(login) as r:
        assert len(r._jumps) == 1 and r.run(["echo", "ok"], idempotent=True).stdout == "ok\n"


def test_version_check(sshd):
    script = '#!/bin/sh\n[ "$*" = "-m jobctl --version" ] && echo "jobctl 0.0.9" && exit 0\nexit 2\n'
    with Remote(sshd.login(remote_python="~/rtest/bin/fakepy"), cluster="rtest") as r:
        r.files.put_text(script, "rtest/bin/fakepy", mode=0o700)
        assert remote_version(r) == "0.0.9"
        assert check_version(r, "0.0.9") == "0.0.9"
        with pytest.raises(UsageError) as ei:
            check_version(r, "0.1.0")
        assert "remote jobctl 0.0.9 != local 0.1.0" in ei.value.message
        assert "`jobctl remote bootstrap rtest`" in ei.value.hint
    with Remote(sshd.login(remote_python="python3"), cluster="rtest") as r:  # no jobctl for that user
        with pytest.raises(UsageError, match="jobctl is not usable") as ei:
            remote_version(r)
        assert "jobctl remote bootstrap rtest" in ei.value.hint


def test_auth_failures_and_bad_key_file(sshd, tmp_path):
    stranger = _keygen(tmp_path / "stranger")
    with pytest.raises(SchedulerError, match=f"authentication as jobctl-rtest@127.0.0.1:{PORT} failed") as ei:
        Remote(sshd.login(key_file=str(stranger))).connect()
    assert ei.value.exit_code == 5
    locked = _keygen(tmp_path / "locked", passphrase="s3cret-pass")
    with pytest.raises(SchedulerError, match="passphrase-protected") as ei:
        Remote(sshd.login(key_file=str(locked))).connect()
    assert "ssh-add" in ei.value.hint
    junk = tmp_path / "junk"
    junk.write_text("not a key\n")
    junk.chmod(0o600)
    with pytest.raises(UsageError, match="cannot use ssh key"):
        Remote(sshd.login(key_file=str(junk))).connect()
    with pytest.raises(UsageError, match="does not exist"):
        Remote(sshd.login(key_file=str(tmp_path / "nope")))


def test_no_key_material_in_logs_or_repr(sshd, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    texts = []
    with Remote(sshd.login()) as r:
        r.run(["true"], idempotent=True)
        r.files.put_text("t", "rtest/secretless")
        texts += [repr(r), str(r)]
    locked = _keygen(tmp_path / "locked", passphrase="s3cret-pass")
    empty = tmp_path / "kh"
    empty.write_text("")
    for login in (sshd.login(key_file=str(locked)), sshd.login(known_hosts=str(empty))):
        with pytest.raises(SchedulerError) as ei:
            Remote(login).connect()
        texts += [ei.value.message, ei.value.hint or ""]
    assert "paramiko" in caplog.text  # paramiko's debug log was captured, so the check below means something
    everything = caplog.text + "\n".join(texts)
    for key in (sshd.client_key, locked, sshd.dir / "host_ed25519"):
        body = [ln for ln in key.read_text().splitlines() if ln and not ln.startswith("-----")]
        assert body and not any(ln in everything for ln in body)
    assert "s3cret-pass" not in everything
    assert str(sshd.client_key) not in repr(Remote(sshd.login()))


def test_login_block_in_inventory():
    part = {"name": "p", "gpu": "h100", "gpus_per_node": 8, "nodes": 2, "mem_gib": 512}
    inv = Inventory(name="c1", partitions=[part], login={"host": "login.example.org", "port": 2200})
    assert inv.login.known_hosts == "~/.ssh/known_hosts" and inv.login.remote_python == "python3"
    assert (inv.login.workdir, inv.login.connect_timeout_s, inv.login.ssh_config) == ("~/jobctl", 10, "~/.ssh/config")
    with pytest.raises(ValidationError):
        Inventory(name="c1", partitions=[part], login={"host": "h", "hostname": "typo"})
    with pytest.raises(ValidationError, match="bare host name"):
        Login(host="me@login.example.org")
    with pytest.raises(UsageError, match="no `login:` block"):
        Remote.for_inventory(Inventory(name="c2", partitions=[part]))
    r = Remote.for_inventory(inv)
    assert (r.cluster, r.port) == ("c1", 2200)
