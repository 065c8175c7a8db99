"""Folders and files only the user controls, on file systems other users share.

A cluster's disks are shared: another user may have made the folder jobctl is about to use,
planted a link where it will write, or be able to rename what it made and put their own in its
place (any directory they can write to, unless its sticky bit is set). So jobctl:
- creates a job's folder exclusively (`os.mkdir` of a name that does not exist: never one that
  does, never through a link), owner-only, and checks what it made;
- writes a file as a new, exclusively created temporary file that is never a link, then renames
  it into place;
- uses a folder only when no directory on its path can be changed by anyone but the user or
  root: each is owned by the user or root and writable by no one else, or has the sticky bit
  (like /tmp: others cannot rename or remove what is not theirs).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from jobctl.errors import UsageError

DIR_MODE, FILE_MODE = 0o700, 0o600
# the flags of a file that must be new and must not be a link (O_NOFOLLOW is 0 where absent)
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeFolder(UsageError):
    """A folder jobctl would use can be changed by another user (exit 2, with how to fix it)."""


def _who(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def unsafe_reason(directory: Path, uid: int | None = None) -> str | None:
    """Why another user could rename or replace entries of `directory` (a real directory), or
    None when only the user and root can."""
    uid = os.geteuid() if uid is None else uid
    st = os.stat(directory)
    if st.st_mode & stat.S_ISVTX:
        return None  # sticky: only an entry's owner (and the directory's) may rename or remove it
    if st.st_uid not in (uid, 0):
        return f"it belongs to {_who(st.st_uid)}"
    if st.st_mode & stat.S_IWOTH:
        return "everyone can write to it"
    if st.st_mode & stat.S_IWGRP:
        return "its group can write to it"
    return None


def check_path(path: Path, purpose: str) -> None:
    """Refuse `path` (UnsafeFolder) when a directory on the way to it, links followed, could be
    changed by another user: they could replace what jobctl makes there with their own."""
    path = Path(os.path.abspath(path))
    seen: set[str] = set()
    prefix = Path(path.anchor)
    for part in path.parts[1:]:
        prefix = prefix / part
        if not os.path.lexists(prefix):
            break
        real = Path(os.path.realpath(prefix))
        # every directory that holds a name on the way to it (a link's target's too)
        for d in [*reversed(real.parents), real] if real.is_dir() else reversed(real.parents):
            if str(d) in seen:
                continue
            seen.add(str(d))
            why = unsafe_reason(d)
            if why:
                raise UnsafeFolder(
                    f"{purpose} {path} is not safe: {d} can be changed by other users ({why}), who could "
                    "replace the folders jobctl makes there with their own",
                    hint=f"use a folder only you can write to (e.g. one of your own under it), or ask for the "
                         f"sticky bit on {d} (chmod +t), which stops others renaming what is not theirs")


def private_root(path: Path, purpose: str = "the job folder root") -> Path:
    """`path` as a folder to make job folders in: created owner-only if missing, and every
    directory on its path checked (check_path)."""
    path = Path(os.path.abspath(path))
    if not path.exists():
        missing = []
        p = path
        while not os.path.lexists(p):
            missing.append(p)
            p = p.parent
        check_path(p, purpose)  # what exists must be safe before anything is made in it
        for d in reversed(missing):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                pass  # made meanwhile (by us, or not: checked below)
    if not path.is_dir():
        raise UnsafeFolder(f"{purpose} {path} is not a folder")
    check_path(path, purpose)
    return path


def new_dir(parent: Path, name: str) -> Path:
    """A new owner-only folder `parent/name`, or `parent/name-<random>` when that name is taken
    (by a folder, a file or a link: nothing that exists is ever reused). Checks what it made."""
    for i in range(16):
        candidate = parent / (name if i == 0 else f"{name}-{secrets.token_hex(3)}")
        try:
            os.mkdir(candidate, DIR_MODE)
        except FileExistsError:
            continue
        st = os.lstat(candidate)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UnsafeFolder(f"{candidate} changed as it was made (it is not an owner-only folder of yours)",
                               hint=f"another user can write to {parent}: use a folder only you can write to")
        return candidate
    raise UnsafeFolder(f"cannot make a new folder for {name!r} in {parent}: 16 names taken",
                       hint=f"something keeps making folders in {parent}; use a folder only you can write to")


@contextlib.contextmanager
def owner_only():
    """While it lasts, what this process (and a library it calls: submitit's pickles and
    scripts) creates is owner-only (umask 077)."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def write_new(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Write `path` atomically: a new temporary file beside it (created exclusively, never
    through a link), then renamed over `path` (a rename replaces a link; it does not follow it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, NEW_FILE, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
