"""Mirror a local working tree to the login node over SFTP, sending only the files that changed.

Which files: `git ls-files --cached --others --exclude-standard` in a git checkout (so .gitignore
holds), every file otherwise. What changed: a manifest kept remotely in
`remote_dir/.jobctl-manifest.json` records what was sent (sha256, size, mtime, mode); a file
whose size and mtime match it is not read again (rsync's quick check). Files the manifest lists
that are gone locally are removed remotely; files jobctl did not send are never touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from jobctl.errors import UsageError
from jobctl.remote.files import mkdirs, put, write_bytes

if TYPE_CHECKING:  # the transport, for annotations only
    from jobctl.remote.ssh import Remote

log = logging.getLogger(__name__)

MANIFEST = ".jobctl-manifest.json"


@dataclass(frozen=True)
class SyncResult:
    """Counts of one `sync_tree`: files sent, left alone, removed (sent before, now gone), skipped."""

    uploaded: int
    unchanged: int
    deleted: int
    skipped: int
    bytes_uploaded: int


def sync_tree(remote: Remote, local_dir: str | os.PathLike, remote_dir: str, *, force: bool = False) -> SyncResult:
    """Mirror a working tree to the login node, sending only files that changed.

    Files: `git ls-files --cached --others --exclude-standard` in a git checkout (so .gitignore
    holds), every file otherwise. Changes are found against a manifest kept remotely in
    `remote_dir/.jobctl-manifest.json` (sha256, size, mtime, mode); files the manifest lists that
    are gone locally are removed remotely. Files jobctl did not send are never touched."""
    root = Path(local_dir)
    if not root.is_dir():
        raise UsageError(f"{local_dir} is not a directory")
    files = _list_tree(root)
    rdir = remote.files.remote_path(remote_dir)
    return remote.sftp_op(f"sync {root} to {rdir}", lambda sftp: _sync(sftp, root, files, rdir, force))


def _sync(sftp: paramiko.SFTPClient, root: Path, files: list[str], rdir: str, force: bool) -> SyncResult:
    mkdirs(sftp, rdir)
    manifest_path = posixpath.join(rdir, MANIFEST)
    old = _read_manifest(sftp, manifest_path)
    new, send, skipped = _compare(root, files, old, force)
    _resend_missing(sftp, rdir, new, send)
    sent_bytes = _send(sftp, root, rdir, new, send)
    deleted = _delete_gone(sftp, rdir, old, new)
    write_bytes(sftp, json.dumps({"version": 1, "files": new}, sort_keys=True).encode(), manifest_path)
    log.debug("sync %s -> %s: %d sent, %d deleted", root, rdir, len(send), deleted)
    return SyncResult(len(send), len(new) - len(send), deleted, skipped, sent_bytes)


def _read_manifest(sftp: paramiko.SFTPClient, manifest_path: str) -> dict:
    """What the last sync sent ({relative path: entry}); {} if there is no manifest or it is damaged."""
    try:
        with sftp.open(manifest_path, "r") as f:
            old = json.loads(f.read()).get("files", {})
        return old if isinstance(old, dict) else {}
    except (FileNotFoundError, ValueError, AttributeError):
        return {}


def _compare(root: Path, files: list[str], old: dict, force: bool) -> tuple[dict[str, dict], dict[str, None], int]:
    """(the new manifest's entries, the files to send (an ordered set), how many were skipped)."""
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
    return new, send, skipped


def _resend_missing(sftp: paramiko.SFTPClient, rdir: str, new: dict[str, dict], send: dict[str, None]) -> None:
    """The manifest says what was sent; check the copies are still there (someone may have cleaned up)."""
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


def _send(sftp: paramiko.SFTPClient, root: Path, rdir: str, new: dict[str, dict], send: dict[str, None]) -> int:
    """Upload the files to send; the bytes sent."""
    made: set[str] = {rdir}
    sent_bytes = 0
    for rel in send:
        target = posixpath.join(rdir, rel)
        parent = posixpath.dirname(target)
        if parent not in made:
            mkdirs(sftp, parent)
            made.add(parent)
        put(sftp, str(root / rel), target, new[rel]["mode"])
        sent_bytes += new[rel]["size"]
    return sent_bytes


def _delete_gone(sftp: paramiko.SFTPClient, rdir: str, old: dict, new: dict[str, dict]) -> int:
    """Remove the copies of files sent before and gone now (only those: names that stay inside rdir)."""
    deleted = 0
    for rel in old:
        if rel not in new and not rel.startswith("/") and ".." not in rel.split("/"):
            try:
                sftp.remove(posixpath.join(rdir, rel))
                deleted += 1
            except FileNotFoundError:
                pass
    return deleted


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
