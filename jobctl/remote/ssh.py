"""Reach a cluster's login node over SSH (paramiko): the transport that jobctl's remote commands share.

One `Remote` holds one SSH connection for the whole jobctl command; commands (`run`,
`json_command`), its `files` (SFTP, jobctl.remote.files), tree sync (jobctl.remote.sync) and the
version checks (jobctl.remote.client) all go over it. paramiko is imported only by this module and
its helpers in jobctl.remote (keys, sshconfig, files, sync): docs/architecture.md, decision 1.

Host keys are checked strictly, as `ssh -o StrictHostKeyChecking=yes` would (jobctl.remote.keys):
an unknown or a changed key is refused (SchedulerError, exit 5) with the fingerprint and the way to
fix it; a key is never added behind the user's back. ~/.ssh/config is honoured for HostName, User,
Port, IdentityFile, ProxyJump, ProxyCommand and UserKnownHostsFile (jobctl.remote.sshconfig);
values in the inventory's `login:` block win over it, as options on the ssh command line do.

Dropped connections: work that is safe to repeat (`idempotent=True`, all SFTP operations) is
retried after a reconnect with exponential backoff (RETRY_DELAYS_S). A command that is not safe to
repeat is retried only when it certainly was not sent; once sent, a drop raises OutcomeUnknownError
(a SchedulerError) saying it may or may not have run (submissions carry their own idempotency token
for that case).

Errors from a remote jobctl reach `json_command` as a JSON object on stdout (or as the last line
of stderr) with a non-zero exit code:
    {"error": {"type": "SchedulerError", "exit_code": 4, "message": "...", "hint": "..."}}
(ConfigError may add "issues": [{"file", "line", "key", "problem"}]); they are raised here as the
same JobctlError class, so the local exit code is the remote one.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import paramiko

from jobctl.errors import SchedulerError, UsageError
from jobctl.remote import keys
from jobctl.remote.files import RemoteFiles
from jobctl.remote.protocol import error_from_payload
from jobctl.remote.sshconfig import Hop, resolve

if TYPE_CHECKING:  # the pydantic models, for annotations only (remote/ does not read YAML)
    from jobctl.config.schema import Inventory, Login

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
KEEPALIVE_S = 30
# Waits before each reconnect after a drop: 4 retries, at most 7.5 s of waiting in all.
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
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
    ...     client.check_version(r)
    ...     r.json_command([*client.python_argv(r), "-m", "jobctl", "status", "--json"], idempotent=True)
    ...     r.files.put_text("hello", "~/jobctl/hello.txt")
    """

    def __init__(self, login: Login, *, cluster: str | None = None,
                 retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S, sleep: Callable[[float], None] = time.sleep):
        self._login = login
        self.cluster = cluster or login.host
        self._retry_delays_s = tuple(retry_delays_s)
        self._sleep = sleep
        self._route = resolve(login)
        self._hop = self._route.target
        self.known_hosts = self._route.known_hosts
        self.files = RemoteFiles(self)  # the login node's files, over this connection
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None
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

    login = property(lambda self: self._login, doc="The inventory's `login:` block this connection was made from.")
    host = property(lambda self: self._hop.hostname)
    user = property(lambda self: self._hop.user)
    port = property(lambda self: self._hop.port)

    @property
    def workdir(self) -> str:
        """login.workdir as an absolute remote path (asks the remote side for the home directory)."""
        return self.files.remote_path(self._login.workdir)

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
        if not self._checked_keys:
            keys.check_key_files(self._hop.key_files)
            self._checked_keys = True

    def _open_sock(self):
        """What to talk SSH over when the login node is not reached directly (ProxyCommand, ProxyJump)."""
        if self._route.proxy_command:
            return paramiko.ProxyCommand(self._route.proxy_command)
        if not self._route.proxy_jump:
            return None
        hops = self._route.jump_hops()
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

    def _connect_hop(self, hop: Hop, sock) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        known = [f for f in (keys.GLOBAL_KNOWN_HOSTS, self.known_hosts) if os.path.isfile(f)]
        # host keys only ever come from these files; nothing is saved
        revoked = keys.load_known_hosts(client.get_host_keys(), known)
        client.set_missing_host_key_policy(keys.StrictPolicy())
        timeout = self._login.connect_timeout_s
        log.debug("ssh connect %s@%s:%s%s", hop.user, hop.hostname, hop.port, " (via jump)" if sock else "")
        try:
            client.connect(hop.hostname, hop.port, username=hop.user, key_filename=list(hop.key_files) or None,
                           allow_agent=True, look_for_keys=not hop.key_files, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout, sock=sock)
        except keys.UnknownHostKey as e:
            client.close()
            raise keys.unknown_key_error(e, hop.hostname, hop.port, revoked, self.known_hosts) from None
        except paramiko.BadHostKeyException as e:
            client.close()
            raise keys.changed_key_error(e, hop.hostname, hop.port, known, self.known_hosts) from None
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

    # -- SFTP over the same connection (self.files; every operation is safe to repeat) -----------------

    def sftp_op(self, what: str, op: Callable[[paramiko.SFTPClient], T]) -> T:
        """op(the SFTP client), retried after a reconnect if the connection drops (it must be safe to
        repeat); an SFTP error is raised as SchedulerError("cannot {what} on ...")."""

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
