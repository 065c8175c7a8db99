"""Where to connect: a `login:` block resolved through ~/.ssh/config, as `ssh` resolves a host.

~/.ssh/config (login.ssh_config) is honoured for HostName, User, Port, IdentityFile, ProxyJump,
ProxyCommand and UserKnownHostsFile; values in the inventory's `login:` block win over it, as
options on the ssh command line do. ProxyJump hosts are resolved through the same config, when
the connection is made.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko

from jobctl.errors import UsageError

if TYPE_CHECKING:  # the pydantic model, for annotations only (remote/ does not read YAML)
    from jobctl.config.schema import Login


@dataclass(frozen=True)
class Hop:
    """One resolved SSH endpoint (the login node or a ProxyJump host)."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]


@dataclass(frozen=True)
class Route:
    """A login node resolved: the node itself (`target`), what to reach it through (a ProxyJump
    list or a ProxyCommand, "" for none) and the user's known_hosts file."""

    target: Hop
    proxy_jump: str
    proxy_command: str
    known_hosts: str
    config: paramiko.SSHConfig = field(repr=False, compare=False)
    config_name: str  # login.ssh_config as written: names the file in errors about jump hosts

    def jump_hops(self) -> list[Hop]:
        """The ProxyJump hosts, in the order the connection goes through them."""
        return [self._jump_hop(spec.strip()) for spec in self.proxy_jump.split(",") if spec.strip()]

    def _jump_hop(self, spec: str) -> Hop:
        """A ProxyJump entry, `[user@]host[:port]` or `ssh://[user@]host[:port]`, resolved by the ssh config."""
        m = re.fullmatch(r"(?:ssh://)?(?:(?P<user>[^@]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>\d+))?",
                         spec)
        if not m:
            raise UsageError(f"cannot parse ProxyJump {spec!r}", hint="use [user@]host[:port]")
        alias = m["v6"] or m["host"]
        entry = _lookup(self.config, alias, self.config_name)
        port = _port(m["port"] or entry.get("port", 22), f"ProxyJump {spec}")
        keys = _identity_files(entry) or self.target.key_files
        return Hop(alias, entry.get("hostname", alias), port, m["user"] or entry.get("user") or getpass.getuser(), keys)


def resolve(login: Login) -> Route:
    """The Route to `login.host`: the login block's values, else the ssh config's, else ssh's defaults."""
    cfg_path = str(Path(login.ssh_config).expanduser())
    cfg = _read_ssh_config(cfg_path)
    entry = _lookup(cfg, login.host, cfg_path)
    if login.key_file:
        key_file = os.path.expanduser(login.key_file)
        if not os.path.isfile(key_file):
            raise UsageError(f"login.key_file {login.key_file!r} does not exist",
                             hint="point it at your private key, or leave it out to use ~/.ssh/config and the agent")
        keys: tuple[str, ...] = (key_file,)
    else:
        keys = _identity_files(entry)
    target = Hop(login.host, entry.get("hostname", login.host),
                 login.port or _port(entry.get("port", 22), f"{cfg_path}: Host {login.host}"),
                 login.user or entry.get("user") or getpass.getuser(), keys)
    jump = entry.get("proxyjump", "")
    command = entry.get("proxycommand", "")
    user_file = login.known_hosts
    if "known_hosts" not in login.model_fields_set and entry.get("userknownhostsfile"):
        user_file = entry["userknownhostsfile"].split()[0]
    return Route(target, proxy_jump="" if jump.lower() == "none" else jump,
                 proxy_command="" if command.lower() == "none" else command,
                 known_hosts=os.path.expanduser(user_file), config=cfg, config_name=login.ssh_config)


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
