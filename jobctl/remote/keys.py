"""SSH keys, judged as OpenSSH judges them: which host keys are trusted, which private keys are usable.

Host keys are checked strictly, as `ssh -o StrictHostKeyChecking=yes` would: they come only from
/etc/ssh/ssh_known_hosts and the user's known_hosts file, an unknown or a changed key is refused
(SchedulerError, exit 5) with its fingerprint and the way to fix it, and a key is never added
behind the user's back. A private key file that others can read is refused, as OpenSSH refuses it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import stat
from pathlib import Path

import paramiko

from jobctl.errors import SchedulerError, UsageError

log = logging.getLogger(__name__)

GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_KEYSCAN_TYPES = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ecdsa-sha2-nistp256": "ecdsa",
                  "ecdsa-sha2-nistp384": "ecdsa", "ecdsa-sha2-nistp521": "ecdsa"}


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey):
        super().__init__(f"unknown host key for {name}")
        self.name, self.key = name, key


class StrictPolicy(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key, so the error can show its fingerprint."""

    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key (as `ssh-keygen -l` prints it)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def key_name(host: str, port: int) -> str:
    """How known_hosts names an endpoint."""
    return host if port == 22 else f"[{host}]:{port}"


# -- the user's private keys ---------------------------------------------------------------------------

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


def check_key_files(paths: tuple[str, ...]) -> None:
    """UsageError for a private key file that cannot be used (readable by others, not a key),
    said clearly here instead of as an obscure authentication failure later."""
    for path in paths:
        _check_key_mode(path)
        try:
            paramiko.PKey.from_path(path)
        except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's way of saying so
            pass  # passphrase-protected: the agent may hold it (we never ask for passphrases)
        except (OSError, ValueError, paramiko.SSHException) as e:
            raise UsageError(f"cannot use ssh key {path}: {type(e).__name__}: {e}",
                             hint="point login.key_file (or IdentityFile) at an OpenSSH private key") from e


# -- known_hosts -----------------------------------------------------------------------------------------

def load_known_hosts(keys: paramiko.HostKeys, files: list[str]) -> dict[tuple[str, str], str]:
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


def _keyscan(hostname: str, port: int, key: paramiko.PKey, known_hosts: str) -> str:
    port_flag = f"-p {port} " if port != 22 else ""
    kind = _KEYSCAN_TYPES.get(key.get_name())
    kind = f"-t {kind} " if kind else ""
    return f"ssh-keyscan {port_flag}{kind}{shlex.quote(hostname)} >> {shlex.quote(known_hosts)}"


# -- refusals ---------------------------------------------------------------------------------------------

def unknown_key_error(e: UnknownHostKey, hostname: str, port: int, revoked: dict[tuple[str, str], str],
                      known_hosts: str) -> SchedulerError:
    """The refusal of a host key that no known_hosts line vouches for (or that one revokes)."""
    name = key_name(hostname, port)
    if (e.key.get_name(), e.key.get_base64()) in revoked:
        where = revoked[(e.key.get_name(), e.key.get_base64())]
        return SchedulerError(
            f"the host key of {name} ({e.key.get_name()} {fingerprint(e.key)}) is REVOKED ({where}); "
            "refusing to connect", hint="ask the cluster admins for the login node's current key")
    return SchedulerError(
        f"the host key of {name} is not in {known_hosts}: it offers {e.key.get_name()} "
        f"{fingerprint(e.key)}; refusing to connect (strict host-key checking)",
        hint=f"check that {fingerprint(e.key)} is the login node's key (out of band: the cluster's "
        f"documentation or admins), then add it: {_keyscan(hostname, port, e.key, known_hosts)}")


def changed_key_error(e: paramiko.BadHostKeyException, hostname: str, port: int, known: list[str],
                      known_hosts: str) -> SchedulerError:
    """The refusal of a host key other than the one the known_hosts files (`known`) hold."""
    name = key_name(hostname, port)
    lines = [f"{f}:{n}" for f in known for n in _known_hosts_lines(f, name)] or known
    return SchedulerError(
        f"the host key of {name} has CHANGED and is refused: it offers {e.key.get_name()} "
        f"{fingerprint(e.key)}, but {', '.join(lines)} holds {e.expected_key.get_name()} "
        f"{fingerprint(e.expected_key)}. Someone may be intercepting the connection (man-in-the-middle), "
        "or the node was reinstalled",
        hint=f"ask the cluster admins whether the key changed; only if they confirm {fingerprint(e.key)}, "
        f"delete the old entry ({', '.join(lines)}) with `ssh-keygen -R {shlex.quote(name)} -f "
        f"{shlex.quote(known_hosts)}` and add the new one: {_keyscan(hostname, port, e.key, known_hosts)}",
    )
