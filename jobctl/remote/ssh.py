"""Reach a cluster's login node over SSH (paramiko) and run jobctl there as short-lived JSON commands.

The only module that imports paramiko (docs/architecture.md, decision 1). One `Remote` holds one SSH
connection for the whole jobctl command; commands, SFTP and version checks share it.

Host keys are checked strictly, as `ssh -o StrictHostKeyChecking=yes` would: an unknown or a
changed key is refused (SchedulerError, exit 4) with the fingerprint and the way to fix it; a key
is never added behind the user's back. ~/.ssh/config is honoured for HostName, User, Port,
IdentityFile, ProxyJump, ProxyCommand and UserKnownHostsFile; values in the inventory's `login:`
block win over it, as options on the ssh command line do.

Dropped connections: work that is safe to repeat (`idempotent=True`, all SFTP operations) is
retried after a reconnect with exponential backoff (RETRY_DELAYS_S). A command that is not safe to
repeat is retried only when it certainly was not sent; once sent, a drop raises a SchedulerError
saying it may or may not have run (submissions carry their own idempotency token for that case).

Errors from a remote jobctl reach `json_command` as a JSON object on stdout (or as the last line
of stderr) with a non-zero exit code:
    {"error": {"type": "SchedulerError", "exit_code": 4, "message": "...", "hint": "..."}}
(ConfigError may add "issues": [{"file", "line", "key", "problem"}]); they are raised here as the
same JobctlError class, so the local exit code is the remote one.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import logging
import os
import posixpath
import re
import select
import shlex
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import paramiko

from jobctl.errors import SchedulerError, UsageError
from jobctl.remote.protocol import error_from_payload

if TYPE_CHECKING:  # the pydantic models, for annotations only (remote/ does not read YAML)
    from jobctl.config.schema import Inventory, Login

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
KEEPALIVE_S = 30
# Waits before each reconnect after a drop: 4 retries, at most 7.5 s of waiting in all.
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
MANIFEST = ".jobctl-manifest.json"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_KEYSCAN_TYPES = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ecdsa-sha2-nistp256": "ecdsa",
                  "ecdsa-sha2-nistp384": "ecdsa", "ecdsa-sha2-nistp521": "ecdsa"}
T = TypeVar("T")


class OutcomeUnknownError(SchedulerError):
    """The connection dropped (or the command timed out) after a command was sent: it may or
    may not have run. Callers with an idempotency token can say how to find out."""


@dataclass(frozen=True)
class RemoteResult:
    """What a remote command left: its exit code (-1: ended without one, e.g. killed by a signal)."""

    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class SyncResult:
    """Counts of one `sync_tree`: files sent, left alone, removed (sent before, now gone), skipped."""

    uploaded: int
    unchanged: int
    deleted: int
    skipped: int
    bytes_uploaded: int


@dataclass(frozen=True)
class _Hop:
    """One resolved SSH endpoint (the login node or a ProxyJump host)."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]


class _Dropped(Exception):
    """The connection went away; `sent`: the command may have reached the remote side."""

    def __init__(self, sent: bool, cause: BaseException):
        super().__init__(str(cause))
        self.sent, self.cause = sent, cause


class _Unreachable(_Dropped):
    def __init__(self, cause: BaseException):
        super().__init__(False, cause)


class _CommandTimeout(Exception):
    """The command outlived its timeout (the connection itself is fine)."""


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey):
        super().__init__(f"unknown host key for {name}")
        self.name, self.key = name, key


class _StrictPolicy(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key, so the error can show its fingerprint."""

    def missing_host_key(self, client, hostname, key):
        raise _UnknownHostKey(hostname, key)


def _check_key_mode(path: str) -> None:
    """Refuse a private key that others can read, as OpenSSH does ("UNPROTECTED PRIVATE KEY
    FILE": a key owned by the user with any group/other permission bit)."""
    try:
        st = os.stat(path)
    except OSError:
        return  # a missing key is reported by the loader below, with its own words
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        raise UsageError(f"ssh key {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                         "OpenSSH refuses such a key, and so does jobctl",
                         hint=f"chmod 600 {shlex.quote(path)}")


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key (as `ssh-keygen -l` prints it)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _key_name(host: str, port: int) -> str:
    """How known_hosts names an endpoint."""
    return host if port == 22 else f"[{host}]:{port}"


def _load_known_hosts(keys: paramiko.HostKeys, files: list[str]) -> dict[tuple[str, str], str]:
    """Read known_hosts files as OpenSSH does, into `keys`: a line it cannot parse is skipped
    (paramiko alone rejects the whole file for one), `@cert-authority` lines are skipped
    (host certificates are not checked here: such a host is unknown, and says so), and the keys
    of `@revoked` lines are returned ({(type, base64): "file:line"}) and never accepted, whatever
    host they are listed under (stricter than OpenSSH, which matches the line's hosts)."""
    revoked: dict[tuple[str, str], str] = {}
    entries = []
    for file in files:
        try:
            text = Path(file).read_text(errors="replace")
        except OSError as e:
            raise UsageError(f"cannot read known_hosts {file}: {e.strerror or e}") from e
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if fields[0] == "@revoked":
                if len(fields) >= 4:
                    revoked[(fields[2], fields[3])] = f"{file}:{number}"
                continue
            if fields[0].startswith("@"):  # @cert-authority, or a marker OpenSSH does not know either
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
            except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError, TypeError) as e:
                log.debug("known_hosts %s:%d skipped: %s", file, number, e)
                continue
            if entry is not None:
                entries.append(entry)
    for entry in entries:
        if (entry.key.get_name(), entry.key.get_base64()) in revoked:
            continue
        for host in entry.hostnames:
            keys.add(host, entry.key.get_name(), entry.key)
    return revoked


def _known_hosts_lines(path: str, name: str) -> list[int]:
    """Line numbers of `path` holding a key for `name` (hashed entries included)."""
    found = []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return found
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if fields and fields[0].startswith("@"):  # revoked or a CA: not a key the host is known by
            continue
        if not fields or fields[0].startswith("#"):
            continue
        for pattern in fields[0].split(","):
            if pattern == name or (pattern.startswith("|1|") and pattern.count("|") == 3
                                   and paramiko.HostKeys.hash_host(name, pattern.split("|")[2]) == pattern):
                found.append(number)
                break
    return found


def _keyscan(hop: _Hop, key: paramiko.PKey, known_hosts: str) -> str:
    port = f"-p {hop.port} " if hop.port != 22 else ""
    kind = _KEYSCAN_TYPES.get(key.get_name())
    kind = f"-t {kind} " if kind else ""
    return f"ssh-keyscan {port}{kind}{shlex.quote(hop.hostname)} >> {shlex.quote(known_hosts)}"


def _read_ssh_config(path: str) -> paramiko.SSHConfig:
    file = Path(path).expanduser()
    if not file.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(file))
    except Exception as e:  # paramiko raises several kinds for a bad file
        raise UsageError(f"cannot read ssh config {file}: {e}", hint="fix the file, or point `login.ssh_config` "
                         "at another one") from e


def _lookup(cfg: paramiko.SSHConfig, host: str, path: str) -> dict:
    try:
        return dict(cfg.lookup(host))
    except Exception as e:  # e.g. `Match exec` without the `invoke` package
        raise UsageError(f"cannot resolve {host!r} with ssh config {path}: {e}") from e


def _port(value: Any, where: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise UsageError(f"{where}: port must be 1..65535, got {value!r}")
    return port


def _identity_files(entry: dict) -> tuple[str, ...]:
    paths = (os.path.expanduser(p) for p in entry.get("identityfile", []))
    return tuple(p for p in paths if os.path.isfile(p))


def _is_drop(e: BaseException, transport: paramiko.Transport | None) -> bool:
    """Did `e` come from the connection going away (rather than a refusal on a live one)?"""
    if isinstance(e, (EOFError, ConnectionError, TimeoutError, socket.timeout)):
        return True
    if isinstance(e, OSError) and e.errno is not None and transport is not None and transport.is_active():
        return False  # an SFTP status (ENOENT, EACCES ...) on a live connection
    return _dead(transport)


def _dead(transport: paramiko.Transport | None) -> bool:
    if transport is None or not transport.is_active():
        return True
    # paramiko closes the channels of a dying transport before it marks itself inactive; its thread
    # ends within moments, a live one's doesn't.
    transport.join(0.5)
    return not transport.is_active()


class Remote:
    """One SSH connection to a cluster's login node; use as a context manager (not thread-safe).

    >>> with Remote.for_inventory(inv) as r:
    ...     r.check_version()
    ...     r.json_command([*r.python_argv(), "-m", "jobctl", "status", "--json"], idempotent=True)
    """

    def __init__(self, login: Login, *, cluster: str | None = None,
                 retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S, sleep: Callable[[float], None] = time.sleep):
        self._login = login
        self.cluster = cluster or login.host
        self._retry_delays_s = tuple(retry_delays_s)
        self._sleep = sleep
        cfg_path = str(Path(login.ssh_config).expanduser())
        self._cfg = _read_ssh_config(cfg_path)
        entry = _lookup(self._cfg, login.host, cfg_path)
        if login.key_file:
            key_file = os.path.expanduser(login.key_file)
            if not os.path.isfile(key_file):
                raise UsageError(f"login.key_file {login.key_file!r} does not exist",
                                 hint="point it at your private key, or leave it out to use ~/.ssh/config and the agent")
            keys: tuple[str, ...] = (key_file,)
        else:
            keys = _identity_files(entry)
        self._hop = _Hop(login.host, entry.get("hostname", login.host),
                         login.port or _port(entry.get("port", 22), f"{cfg_path}: Host {login.host}"),
                         login.user or entry.get("user") or getpass.getuser(), keys)
        jump = entry.get("proxyjump", "")
        self._proxy_jump = "" if jump.lower() == "none" else jump
        command = entry.get("proxycommand", "")
        self._proxy_command = "" if command.lower() == "none" else command
        user_file = login.known_hosts
        if "known_hosts" not in login.model_fields_set and entry.get("userknownhostsfile"):
            user_file = entry["userknownhostsfile"].split()[0]
        self.known_hosts = os.path.expanduser(user_file)
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None
        self._checked_keys = False
        self.connect_count = 0

    @classmethod
    def for_inventory(cls, inventory: Inventory, **kwargs) -> Remote:
        """The Remote of a cluster's `login:` block."""
        if inventory.login is None:
            raise UsageError(f"cluster {inventory.name!r} has no `login:` block, so jobctl cannot reach it over SSH",
                             hint="add `login: {host: LOGIN_NODE}` to its inventory (ssh config aliases work)")
        return cls(inventory.login, cluster=inventory.name, **kwargs)

    # -- identity (no secrets: never the key, only where it is) --------------------------------------

    host = property(lambda self: self._hop.hostname)
    user = property(lambda self: self._hop.user)
    port = property(lambda self: self._hop.port)

    @property
    def workdir(self) -> str:
        """login.workdir as an absolute remote path (asks the remote side for the home directory)."""
        return self.remote_path(self._login.workdir)

    def __repr__(self) -> str:
        return f"Remote(host={self.host!r}, user={self.user!r}, port={self.port})"

    def __str__(self) -> str:
        alias = f" (ssh alias {self._hop.alias})" if self._hop.alias != self.host else ""
        return f"{self.user}@{self.host}:{self.port}{alias}"

    # -- connection ---------------------------------------------------------------------------------------

    def __enter__(self) -> Remote:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection now (it is opened on first use otherwise); SchedulerError if impossible."""
        try:
            self._transport()
        except _Dropped as d:
            raise self._unreachable(d.cause) from d.cause

    def close(self) -> None:
        for closeable in [self._sftp, self._client, *reversed(self._jumps)]:
            if closeable is not None:
                try:
                    closeable.close()
                except Exception:  # noqa: BLE001, S110 -- closing a broken connection may fail; it is gone anyway
                    pass
        self._sftp, self._client, self._jumps = None, None, []

    def _unreachable(self, cause: BaseException) -> SchedulerError:
        return SchedulerError(f"cannot reach {self}: {type(cause).__name__}: {cause}",
                              hint=f"check the host name, the network or VPN, and that `ssh -p {self.port} "
                              f"{self.user}@{self.host}` works from here")

    def _transport(self) -> paramiko.Transport:
        """The live transport, connecting (again) if needed; _Dropped(sent=False) if unreachable."""
        transport = self._client.get_transport() if self._client else None
        if transport is not None and transport.is_active():
            return transport
        self.close()
        self._check_key_files()
        try:
            self._client = self._connect_hop(self._hop, self._open_sock())
        except BaseException:
            self.close()
            raise
        self.connect_count += 1
        return self._client.get_transport()

    def _check_key_files(self) -> None:
        # Fail on an unusable key file here, clearly, instead of as an obscure auth failure.
        if self._checked_keys:
            return
        for path in self._hop.key_files:
            _check_key_mode(path)
            try:
                paramiko.PKey.from_path(path)
            except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's way of saying so
                pass  # passphrase-protected: the agent may hold it (we never ask for passphrases)
            except (OSError, ValueError, paramiko.SSHException) as e:
                raise UsageError(f"cannot use ssh key {path}: {type(e).__name__}: {e}",
                                 hint="point login.key_file (or IdentityFile) at an OpenSSH private key") from e
        self._checked_keys = True

    def _open_sock(self):
        """What to talk SSH over when the login node is not reached directly (ProxyCommand, ProxyJump)."""
        if self._proxy_command:
            return paramiko.ProxyCommand(self._proxy_command)
        if not self._proxy_jump:
            return None
        hops = [self._jump_hop(spec.strip()) for spec in self._proxy_jump.split(",") if spec.strip()]
        sock = None
        for hop, nxt in zip(hops, [*hops[1:], self._hop]):
            client = self._connect_hop(hop, sock)
            self._jumps.append(client)
            try:
                sock = client.get_transport().open_channel(
                    "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0), timeout=self._login.connect_timeout_s)
            except paramiko.ChannelException as e:
                raise SchedulerError(f"jump host {hop.user}@{hop.hostname}:{hop.port} refused to forward to "
                                     f"{nxt.hostname}:{nxt.port}: {e}",
                                     hint="check ProxyJump in your ssh config and that the jump host allows "
                                     "TCP forwarding") from e
            except Exception as e:
                raise _Unreachable(e) from e
        return sock

    def _jump_hop(self, spec: str) -> _Hop:
        """A ProxyJump entry, `[user@]host[:port]` or `ssh://[user@]host[:port]`, resolved by the ssh config."""
        m = re.fullmatch(r"(?:ssh://)?(?:(?P<user>[^@]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>\d+))?",
                         spec)
        if not m:
            raise UsageError(f"cannot parse ProxyJump {spec!r}", hint="use [user@]host[:port]")
        alias = m["v6"] or m["host"]
        entry = _lookup(self._cfg, alias, self._login.ssh_config)
        port = _port(m["port"] or entry.get("port", 22), f"ProxyJump {spec}")
        keys = _identity_files(entry) or self._hop.key_files
        return _Hop(alias, entry.get("hostname", alias), port, m["user"] or entry.get("user") or getpass.getuser(), keys)

    def _connect_hop(self, hop: _Hop, sock) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        known = [f for f in (GLOBAL_KNOWN_HOSTS, self.known_hosts) if os.path.isfile(f)]
        # host keys only ever come from these files; nothing is saved
        revoked = _load_known_hosts(client.get_host_keys(), known)
        client.set_missing_host_key_policy(_StrictPolicy())
        timeout = self._login.connect_timeout_s
        name = _key_name(hop.hostname, hop.port)
        log.debug("ssh connect %s@%s:%s%s", hop.user, hop.hostname, hop.port, " (via jump)" if sock else "")
        try:
            client.connect(hop.hostname, hop.port, username=hop.user, key_filename=list(hop.key_files) or None,
                           allow_agent=True, look_for_keys=not hop.key_files, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout, sock=sock)
        except _UnknownHostKey as e:
            client.close()
            if (e.key.get_name(), e.key.get_base64()) in revoked:
                where = revoked[(e.key.get_name(), e.key.get_base64())]
                raise SchedulerError(
                    f"the host key of {name} ({e.key.get_name()} {fingerprint(e.key)}) is REVOKED ({where}); "
                    "refusing to connect", hint="ask the cluster admins for the login node's current key") from None
            raise SchedulerError(
                f"the host key of {name} is not in {self.known_hosts}: it offers {e.key.get_name()} "
                f"{fingerprint(e.key)}; refusing to connect (strict host-key checking)",
                hint=f"check that {fingerprint(e.key)} is the login node's key (out of band: the cluster's "
                f"documentation or admins), then add it: {_keyscan(hop, e.key, self.known_hosts)}") from None
        except paramiko.BadHostKeyException as e:
            client.close()
            lines = [f"{f}:{n}" for f in known for n in _known_hosts_lines(f, name)] or known
            raise SchedulerError(
                f"the host key of {name} has CHANGED and is refused: it offers {e.key.get_name()} "
                f"{fingerprint(e.key)}, but {', '.join(lines)} holds {e.expected_key.get_name()} "
                f"{fingerprint(e.expected_key)}. Someone may be intercepting the connection (man-in-the-middle), "
                "or the node was reinstalled",
                hint=f"ask the cluster admins whether the key changed; only if they confirm {fingerprint(e.key)}, "
                f"delete the old entry ({', '.join(lines)}) with `ssh-keygen -R {shlex.quote(name)} -f "
                f"{shlex.quote(self.known_hosts)}` and add the new one: {_keyscan(hop, e.key, self.known_hosts)}",
            ) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise SchedulerError(f"ssh authentication as {hop.user}@{hop.hostname}:{hop.port} failed: the key "
                                 f"{', '.join(hop.key_files)} is passphrase-protected and not in the ssh agent",
                                 hint=f"load it into your agent: ssh-add {' '.join(map(shlex.quote, hop.key_files))}"
                                 ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            tried = ", ".join([*hop.key_files, "the ssh agent"] if hop.key_files else ["~/.ssh/id_*", "the ssh agent"])
            raise SchedulerError(f"ssh authentication as {hop.user}@{hop.hostname}:{hop.port} failed ({e}; tried "
                                 f"{tried})", hint="set login.user / login.key_file in the inventory (or User / "
                                 "IdentityFile in ~/.ssh/config), or load your key with ssh-add") from None
        except (OSError, EOFError, paramiko.SSHException) as e:  # refused, timed out, reset, no SSH banner ...
            client.close()
            raise _Unreachable(e) from e
        client.get_transport().set_keepalive(KEEPALIVE_S)
        return client

    def _retrying(self, what: str, attempt: Callable[[], T], *, idempotent: bool) -> T:
        delays = list(self._retry_delays_s)
        tries = 1
        sent_before = False  # whether any attempt reached the server (then its outcome is unknown)
        while True:
            try:
                return attempt()
            except _Dropped as d:
                self.close()
                if d.sent and not idempotent:
                    raise OutcomeUnknownError(
                        f"the connection to {self} dropped while running {what}: the command may or may not have "
                        f"run ({type(d.cause).__name__}: {d.cause}); it was not retried because running it twice is "
                        "not safe", hint="check with `jobctl status` whether it took effect before trying again",
                    ) from d.cause
                sent_before = sent_before or d.sent
                if not delays:
                    raise (OutcomeUnknownError if sent_before else SchedulerError)(
                        f"lost the connection to {self} and could not get it back after {tries} attempts ({what}): "
                        f"{type(d.cause).__name__}: {d.cause}",
                        hint="check the network or VPN, then run the command again") from d.cause
                delay = delays.pop(0)
                log.info("connection to %s dropped (%s); reconnecting in %.1f s", self, type(d.cause).__name__, delay)
                self._sleep(delay)
                tries += 1

    # -- commands -----------------------------------------------------------------------------------------

    def run(self, argv: list[str], *, idempotent: bool, input_text: str | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> RemoteResult:
        """Run argv on the login node (through the login shell, every word quoted) and wait for it.

        `idempotent`: True if running it twice is harmless, so a dropped connection is retried."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"argv must be a non-empty list of str, got {argv!r}")
        command = shlex.join(argv)
        what = f"`{command if len(command) <= 120 else command[:117] + '...'}`"
        try:
            return self._retrying(what, lambda: self._run_once(command, input_text, timeout_s), idempotent=idempotent)
        except _CommandTimeout:
            still = "" if idempotent else "; it may still be running there"
            raise OutcomeUnknownError(f"{what} did not finish within {timeout_s:g} s on {self}{still}",
                                 hint="run it again with a longer timeout, or check the login node's load") from None

    def _run_once(self, command: str, input_text: str | None, timeout_s: float) -> RemoteResult:
        transport = self._transport()
        sent = False
        try:
            chan = transport.open_session(timeout=self._login.connect_timeout_s)
            try:
                log.debug("run on %s: %s", self, command)
                sent = True
                chan.exec_command(command)
                return self._collect(chan, transport, input_text, time.monotonic() + timeout_s)
            finally:
                chan.close()
        except (OSError, EOFError, paramiko.SSHException) as e:
            if _is_drop(e, transport):
                raise _Dropped(sent, e) from e
            raise SchedulerError(f"{self} refused to run the command: {type(e).__name__}: {e}") from e

    @staticmethod
    def _collect(chan: paramiko.Channel, transport: paramiko.Transport, input_text: str | None,
                 deadline: float) -> RemoteResult:
        pending = input_text.encode() if input_text else b""
        if not pending:
            chan.shutdown_write()
        out, err = [], []
        fd = chan.fileno()  # readable when stdout or stderr has data, or the channel closed
        while True:
            while chan.recv_ready():
                out.append(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            if pending and chan.send_ready():
                try:
                    pending = pending[chan.send(pending[:32768]):]
                except OSError:
                    if not chan.closed:
                        raise
                    pending = b""  # it ended without reading all its input: not an error
                if not pending and not chan.closed:
                    chan.shutdown_write()
            if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _CommandTimeout
            if chan.eof_received:  # output done, exit status and close are on their way
                time.sleep(min(remaining, 0.01))
            else:
                select.select([fd], [], [], min(remaining, 0.05 if pending else 1.0))
        # No exit status: killed by a signal (the server still sent EOF and closed), or the connection died.
        if chan.exit_status == -1 and (not chan.eof_received or _dead(transport)):
            raise EOFError("the connection closed before the command's exit status arrived")
        return RemoteResult(chan.exit_status, b"".join(out).decode(errors="replace"),
                            b"".join(err).decode(errors="replace"))

    def json_command(self, argv: list[str], *, idempotent: bool, input_text: str | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
        """Run argv and return its stdout parsed as JSON; a remote JobctlError is raised here as itself."""
        res = self.run(argv, idempotent=idempotent, input_text=input_text, timeout_s=timeout_s)
        try:
            payload = json.loads(res.stdout)
        except ValueError:
            payload = None
        if res.rc == 0:
            if payload is None and res.stdout.strip() != "null":
                raise SchedulerError(f"`{shlex.join(argv[:4])} ...` on {self} answered with something that is not "
                                     f"JSON: {res.stdout.strip()[:200]!r}",
                                     hint="check that login.remote_python runs the same jobctl version "
                                     f"(`jobctl remote bootstrap {self.cluster}`)")
            return payload
        last = res.stderr.strip().splitlines()[-1:] or [""]
        try:
            from_stderr = json.loads(last[0])
        except ValueError:
            from_stderr = None
        error = error_from_payload(payload) or error_from_payload(from_stderr)
        if error is not None:
            raise error
        tail = res.stderr.strip()[-500:] or res.stdout.strip()[-500:] or "no output"
        hint = (f"`{argv[0]}` was not found on the login node: set login.remote_python in the inventory"
                if res.rc == 127 else None)
        raise SchedulerError(f"`{shlex.join(argv[:4])} ...` failed on {self} with exit code {res.rc}: {tail}", hint)

    # -- jobctl on the login node --------------------------------------------------------------------

    def python_argv(self, remote_python: str | None = None) -> list[str]:
        """login.remote_python as argv (it may be several words, e.g. `conda run -n env python`), ~ expanded."""
        argv = shlex.split(remote_python or self._login.remote_python)
        if not argv:
            raise UsageError("login.remote_python is empty", hint="set it to the python that has jobctl installed")
        if argv[0] == "~" or argv[0].startswith("~/"):
            argv[0] = self.remote_path(argv[0])
        return argv

    def remote_version(self, remote_python: str | None = None) -> str:
        """The version of `remote_python -m jobctl --version` on the login node."""
        argv = [*self.python_argv(remote_python), "-m", "jobctl", "--version"]
        res = self.run(argv, idempotent=True, timeout_s=120)
        m = re.fullmatch(r"jobctl (\S+)", res.stdout.strip())
        if res.rc != 0 or not m:
            why = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or [f"exit code {res.rc}"])[-1]
            raise UsageError(f"jobctl is not usable with `{shlex.join(argv[:-3])}` on {self}: {why[:300]}",
                             hint=f"run `jobctl remote bootstrap {self.cluster}`, or set login.remote_python to a "
                             "python that has jobctl")
        return m.group(1)

    def check_version(self, local: str | None = None) -> str:
        """The remote jobctl version; UsageError unless it equals `local` (default: this jobctl's)."""
        if local is None:
            from jobctl import __version__ as local
        remote = self.remote_version()
        if remote != local:
            raise UsageError(f"remote jobctl {remote} != local {local} on {self}",
                             hint=f"run `jobctl remote bootstrap {self.cluster}` to install jobctl {local} there")
        return remote

    # -- files (SFTP over the same connection; every operation is safe to repeat) --------------------

    def _sftp_op(self, what: str, op: Callable[[paramiko.SFTPClient], T]) -> T:
        def attempt() -> T:
            transport = self._transport()
            try:
                if self._sftp is None:
                    self._sftp = self._client.open_sftp()
                return op(self._sftp)
            except (OSError, EOFError, paramiko.SSHException) as e:
                if _is_drop(e, transport):
                    raise _Dropped(True, e) from e
                raise

        try:
            return self._retrying(what, attempt, idempotent=True)
        except (OSError, paramiko.SSHException) as e:
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise SchedulerError(f"cannot {what} on {self}: {reason}") from e

    def remote_path(self, path: str) -> str:
        """An absolute remote path: `~` and relative paths are taken from the remote home directory."""
        if path.startswith("~") and not (path == "~" or path.startswith("~/")):
            raise UsageError(f"remote path {path!r}: only ~ and ~/... are supported, not ~user")
        if path.startswith("/"):
            return posixpath.normpath(path)
        if self._home is None:
            self._home = self._sftp_op("find the home directory", lambda sftp: sftp.normalize("."))
        rest = path[1:].lstrip("/") if path.startswith("~") else path
        return posixpath.normpath(posixpath.join(self._home, rest))

    @staticmethod
    def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
        missing = []
        while path not in ("", "/"):
            try:
                if stat.S_ISDIR(sftp.stat(path).st_mode):
                    break
                raise NotADirectoryError(20, f"{path} is not a directory")
            except FileNotFoundError:
                missing.append(path)
                path = posixpath.dirname(path)
        for p in reversed(missing):
            try:
                sftp.mkdir(p)
            except OSError:
                if not stat.S_ISDIR(sftp.stat(p).st_mode):  # another writer made it: fine
                    raise

    @staticmethod
    def _replace(sftp: paramiko.SFTPClient, tmp: str, path: str) -> None:
        try:
            sftp.posix_rename(tmp, path)  # atomic, overwrites (OpenSSH extension)
        except OSError:
            try:
                sftp.remove(path)
            except FileNotFoundError:
                pass
            sftp.rename(tmp, path)

    def makedirs(self, remote: str) -> str:
        """mkdir -p on the login node; returns the absolute path."""
        path = self.remote_path(remote)
        self._sftp_op(f"create directory {path}", lambda sftp: self._mkdirs(sftp, path))
        return path

    def put_text(self, text: str, remote: str, mode: int = 0o600) -> str:
        """Write text to a remote file atomically, with `mode` set before any content is written."""
        path = self.remote_path(remote)

        def op(sftp: paramiko.SFTPClient) -> None:
            self._mkdirs(sftp, posixpath.dirname(path))
            tmp = path + ".jobctl-tmp"
            with sftp.open(tmp, "w") as f:
                sftp.chmod(tmp, mode)
                f.write(text.encode())
            self._replace(sftp, tmp, path)

        self._sftp_op(f"write {path}", op)
        return path

    def put_file(self, local: str | os.PathLike, remote: str, mode: int | None = None) -> str:
        """Upload a local file atomically (mode: the local file's permission bits unless given)."""
        path = self.remote_path(remote)
        mode = os.stat(local).st_mode & 0o777 if mode is None else mode

        def op(sftp: paramiko.SFTPClient) -> None:
            self._mkdirs(sftp, posixpath.dirname(path))
            self._put(sftp, str(local), path, mode)

        self._sftp_op(f"upload {local} to {path}", op)
        return path

    @classmethod
    def _put(cls, sftp: paramiko.SFTPClient, local: str, path: str, mode: int) -> None:
        tmp = path + ".jobctl-tmp"
        sftp.put(local, tmp, confirm=True)
        sftp.chmod(tmp, mode)
        cls._replace(sftp, tmp, path)

    def get_text(self, remote: str, *, missing_ok: bool = False) -> str | None:
        """A remote file's text; None if it does not exist and missing_ok (SchedulerError otherwise)."""
        path = self.remote_path(remote)

        def op(sftp: paramiko.SFTPClient) -> str | None:
            try:
                with sftp.open(path, "r") as f:
                    return f.read().decode(errors="replace")
            except FileNotFoundError:
                if missing_ok:
                    return None
                raise

        return self._sftp_op(f"read {path}", op)

    def get_bytes(self, remote: str, *, offset: int = 0) -> bytes:
        """The bytes of a remote file from `offset` to its end (safe to repeat)."""
        path = self.remote_path(remote)

        def op(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as fh:
                if offset:
                    fh.seek(offset)
                else:
                    fh.prefetch()  # pipelined reads: a log of many MB in one round trip's time
                return fh.read()

        return self._sftp_op(f"read {path}", op)

    def sync_tree(self, local_dir: str | os.PathLike, remote_dir: str, *, force: bool = False) -> SyncResult:
        """Mirror a working tree to the login node, sending only files that changed.

        Files: `git ls-files --cached --others --exclude-standard` in a git checkout (so .gitignore
        holds), every file otherwise. Changes are found against a manifest kept remotely in
        `remote_dir/.jobctl-manifest.json` (sha256, size, mtime, mode); files the manifest lists that
        are gone locally are removed remotely. Files jobctl did not send are never touched."""
        root = Path(local_dir)
        if not root.is_dir():
            raise UsageError(f"{local_dir} is not a directory")
        files = _list_tree(root)
        rdir = self.remote_path(remote_dir)
        return self._sftp_op(f"sync {root} to {rdir}", lambda sftp: self._sync(sftp, root, files, rdir, force))

    def _sync(self, sftp: paramiko.SFTPClient, root: Path, files: list[str], rdir: str, force: bool) -> SyncResult:
        self._mkdirs(sftp, rdir)
        manifest_path = posixpath.join(rdir, MANIFEST)
        try:
            with sftp.open(manifest_path, "r") as f:
                old = json.loads(f.read()).get("files", {})
            old = old if isinstance(old, dict) else {}
        except (FileNotFoundError, ValueError, AttributeError):
            old = {}
        new: dict[str, dict] = {}
        send: dict[str, None] = {}  # ordered set
        skipped = 0
        for rel in files:
            try:
                st = (root / rel).stat()
            except OSError:  # listed by git but deleted, or a dangling link
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                skipped += 1
                continue
            prev = old.get(rel) if isinstance(old.get(rel), dict) else {}
            quick = (prev.get("size"), prev.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)  # rsync's quick check
            digest = prev.get("sha256") if quick else _sha256(root / rel)
            new[rel] = {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "mode": st.st_mode & 0o777}
            if force or (prev.get("sha256"), prev.get("mode")) != (digest, new[rel]["mode"]):
                send[rel] = None
        # The manifest says what was sent; check the copies are still there (someone may have cleaned up).
        by_dir: dict[str, list[str]] = {}
        for rel in new:
            if rel not in send:
                by_dir.setdefault(posixpath.dirname(rel), []).append(rel)
        for d, rels in by_dir.items():
            try:
                listing = {a.filename: a.st_size for a in sftp.listdir_attr(posixpath.join(rdir, d))}
            except FileNotFoundError:
                listing = {}
            for rel in rels:
                if listing.get(posixpath.basename(rel)) != new[rel]["size"]:
                    send[rel] = None
        made: set[str] = {rdir}
        sent_bytes = 0
        for rel in send:
            target = posixpath.join(rdir, rel)
            parent = posixpath.dirname(target)
            if parent not in made:
                self._mkdirs(sftp, parent)
                made.add(parent)
            self._put(sftp, str(root / rel), target, new[rel]["mode"])
            sent_bytes += new[rel]["size"]
        deleted = 0
        for rel in old:
            if rel not in new and not rel.startswith("/") and ".." not in rel.split("/"):
                try:
                    sftp.remove(posixpath.join(rdir, rel))
                    deleted += 1
                except FileNotFoundError:
                    pass
        tmp = manifest_path + ".jobctl-tmp"
        with sftp.open(tmp, "w") as f:
            f.write(json.dumps({"version": 1, "files": new}, sort_keys=True).encode())
        self._replace(sftp, tmp, manifest_path)
        log.debug("sync %s -> %s: %d sent, %d deleted", root, rdir, len(send), deleted)
        return SyncResult(len(send), len(new) - len(send), deleted, skipped, sent_bytes)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _list_tree(root: Path) -> list[str]:
    """Relative POSIX paths of the files to sync: git's view of a checkout, else every file."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, check=False)
        if inside.returncode == 0 and inside.stdout.strip() == "true":
            out = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard",
                                  "-z"], capture_output=True, check=True).stdout
            return sorted({p for p in out.decode(errors="surrogateescape").split("\0") if p and p != MANIFEST})
    except (OSError, subprocess.CalledProcessError):  # no git here: fall back to every file
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        files += [n if rel_dir == "." else f"{rel_dir}/{n}" for n in filenames]
    return sorted(f for f in files if f != MANIFEST)
