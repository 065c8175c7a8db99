"""Files on the login node over SFTP: `RemoteFiles` (a Remote's `files`) resolves paths, makes
directories, writes files atomically and reads them back.

Every operation runs over the Remote's one connection (`Remote.sftp_op`) and is safe to repeat,
so a dropped connection is retried after a reconnect. Writes are atomic: the content goes to
`PATH.jobctl-tmp`, whose mode is set before any content is written, which is then renamed over
PATH (posix-rename where the server offers it).
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import TYPE_CHECKING

import paramiko

from jobctl.errors import UsageError

if TYPE_CHECKING:  # the transport, for annotations only (it imports this module)
    from jobctl.remote.ssh import Remote

TMP_SUFFIX = ".jobctl-tmp"


# -- SFTP steps (run inside Remote.sftp_op; sync builds on them too) ---------------------------------

def mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """mkdir -p over SFTP: a directory another writer makes at the same time is fine."""
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


def replace(sftp: paramiko.SFTPClient, tmp: str, path: str) -> None:
    """Rename `tmp` over `path`."""
    try:
        sftp.posix_rename(tmp, path)  # atomic, overwrites (OpenSSH extension)
    except OSError:
        try:
            sftp.remove(path)
        except FileNotFoundError:
            pass
        sftp.rename(tmp, path)


def put(sftp: paramiko.SFTPClient, local: str, path: str, mode: int) -> None:
    """Upload a local file to `path` atomically, with `mode`."""
    tmp = path + TMP_SUFFIX
    sftp.put(local, tmp, confirm=True)
    sftp.chmod(tmp, mode)
    replace(sftp, tmp, path)


def write_bytes(sftp: paramiko.SFTPClient, data: bytes, path: str, mode: int | None = None) -> None:
    """Write `data` to `path` atomically (`mode`, if given, set before any content is written)."""
    tmp = path + TMP_SUFFIX
    with sftp.open(tmp, "w") as f:
        if mode is not None:
            sftp.chmod(tmp, mode)
        f.write(data)
    replace(sftp, tmp, path)


# -- the files of one login node ------------------------------------------------------------------

class RemoteFiles:
    """The login node's files, over a Remote's connection; paths are remote paths (`remote_path`)."""

    def __init__(self, remote: Remote):
        self._remote = remote
        self._home: str | None = None

    def remote_path(self, path: str) -> str:
        """An absolute remote path: `~` and relative paths are taken from the remote home directory."""
        if path.startswith("~") and not (path == "~" or path.startswith("~/")):
            raise UsageError(f"remote path {path!r}: only ~ and ~/... are supported, not ~user")
        if path.startswith("/"):
            return posixpath.normpath(path)
        if self._home is None:
            self._home = self._remote.sftp_op("find the home directory", lambda sftp: sftp.normalize("."))
        rest = path[1:].lstrip("/") if path.startswith("~") else path
        return posixpath.normpath(posixpath.join(self._home, rest))

    def makedirs(self, remote: str) -> str:
        """mkdir -p on the login node; returns the absolute path."""
        path = self.remote_path(remote)
        self._remote.sftp_op(f"create directory {path}", lambda sftp: mkdirs(sftp, path))
        return path

    def put_text(self, text: str, remote: str, mode: int = 0o600) -> str:
        """Write text to a remote file atomically, with `mode` set before any content is written."""
        path = self.remote_path(remote)

        def op(sftp: paramiko.SFTPClient) -> None:
            mkdirs(sftp, posixpath.dirname(path))
            write_bytes(sftp, text.encode(), path, mode)

        self._remote.sftp_op(f"write {path}", op)
        return path

    def put_file(self, local: str | os.PathLike, remote: str, mode: int | None = None) -> str:
        """Upload a local file atomically (mode: the local file's permission bits unless given)."""
        path = self.remote_path(remote)
        mode = os.stat(local).st_mode & 0o777 if mode is None else mode

        def op(sftp: paramiko.SFTPClient) -> None:
            mkdirs(sftp, posixpath.dirname(path))
            put(sftp, str(local), path, mode)

        self._remote.sftp_op(f"upload {local} to {path}", op)
        return path

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

        return self._remote.sftp_op(f"read {path}", op)

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

        return self._remote.sftp_op(f"read {path}", op)
