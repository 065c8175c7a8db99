"""A cache of validated recipes and inventories, so that `jobctl plan` run in a loop on
unchanged files skips YAML parsing and pydantic (most of its start-up time).

Keyed by the file's text, the kind of document and the source of the modules that define
what "valid" means; a hit returns `Values`, a read-only attribute view with the same fields
as the pydantic model. Anything unexpected (no cache dir, a corrupt entry) is a miss.
Set JOBCTL_NO_CACHE=1 to turn it off.

An entry is data to check, never to trust (issue 26): anyone with the same jobctl can compute
an entry's name. So the cache is used only in a folder the user owns and no one else can write
to (else it is neither read nor written), and every entry carries an HMAC-SHA256 of its contents
under a key only the user can read (`key` in that folder, made owner-only): an entry that does
not verify (edited, planted, copied from another user) is a miss.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import hmac
import json
import os
import stat
from pathlib import Path

from jobctl.store.private import NEW_FILE, write_new

KEY_BYTES = 32

MARK = "__jobctl_model__"
SET = "__jobctl_fields_set__"  # the fields the document gave (pydantic's model_fields_set)
_DEFINITIONS = ("config/schema.py", "config/loader.py", "config/limits.py", "config/validation.py", "planner/catalog.py",
                "planner/models.py",
                "config/cache.py")


class Values:
    """Read-only attribute access to validated data (a cache hit's stand-in for the model)."""

    __slots__ = ("_data",)

    def __init__(self, data: dict):
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        if name.startswith("__jobctl"):
            raise AttributeError(name)
        try:
            return _view(self._data[name])
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("validated values are read-only")

    def model_dump(self, **_) -> dict:
        return _plain(self._data)

    @property
    def model_fields_set(self) -> set[str]:
        return set(self._data.get(SET, ()))

    def __repr__(self) -> str:
        return f"Values({_plain(self._data)!r})"


def _view(value):
    if isinstance(value, dict):
        return Values(value) if value.get(MARK) else value
    if isinstance(value, list):
        return [_view(v) for v in value]
    return value


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in (MARK, SET)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return copy.copy(value)


def _marked(model) -> dict:
    """A pydantic model as plain data, with the dicts that were models marked."""
    from pydantic import BaseModel

    def walk(v):
        if isinstance(v, BaseModel):
            out = {name: walk(getattr(v, name)) for name in type(v).model_fields}
            out[MARK] = 1
            out[SET] = sorted(v.model_fields_set)
            return out
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(model)


def _cache_dir() -> Path | None:
    """$JOBCTL_CACHE, else $XDG_CACHE_HOME/jobctl, else ~/.cache/jobctl (a cache, not state:
    deleting it only costs time)."""
    env = os.environ
    if env.get("JOBCTL_NO_CACHE"):
        return None
    if env.get("JOBCTL_CACHE"):
        return Path(env["JOBCTL_CACHE"]).expanduser() / "validated"
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "jobctl" / "validated"


@functools.lru_cache(maxsize=1)
def _definitions_digest() -> bytes:
    """The code that validates, read once per process (at its first lookup, right after the
    modules were imported): keying by the files as they are later would let a process that
    runs old code write entries under the new code's key while the files are being edited."""
    here = Path(__file__).resolve().parents[1]  # the jobctl package
    h = hashlib.sha256()
    for name in _DEFINITIONS:
        try:
            h.update((here / name).read_bytes())
        except OSError:
            h.update(name.encode())
    return h.digest()


def key(kind: str, text: str) -> str:
    h = hashlib.sha256(kind.encode() + b"\0" + text.encode("utf-8", "surrogateescape"))
    h.update(_definitions_digest())
    return h.hexdigest()


def _usable_dir(d: Path, make: bool) -> bool:
    """Whether `d` is a folder of the user's that no one else can write to (made owner-only
    when missing and `make`); a cache anywhere else is neither read nor written."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        if not make:
            return False
        try:
            d.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.mkdir(d, 0o700)
        except OSError:
            return False
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _key(d: Path, make: bool) -> bytes | None:
    """The folder's HMAC key: an owner-only regular file of the user's (made when missing and
    `make`), or None."""
    path = d / "key"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        if not make:
            return None
        key = os.urandom(KEY_BYTES)
        try:
            fd = os.open(path, NEW_FILE, 0o600)
        except OSError:
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        key = f.read(KEY_BYTES + 1)
    return key if len(key) == KEY_BYTES else None


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def get(kind: str, text: str):
    """(value, data) from the cache, or None (no usable cache, no entry, or one that does not
    verify under the user's key)."""
    d = _cache_dir()
    if d is None or not _usable_dir(d, make=False):
        return None
    secret = _key(d, make=False)
    if secret is None:
        return None
    try:
        with open(d / f"{key(kind, text)}.json", "rb") as f:
            mac, _, body = f.read().partition(b"\n")
        if not hmac.compare_digest(mac.decode("ascii"), _mac(secret, body)):
            return None
        entry = json.loads(body)
        return Values(entry["value"]), entry["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def put(kind: str, text: str, value, data: dict) -> None:
    d = _cache_dir()
    if d is None or not _usable_dir(d, make=True):
        return
    secret = _key(d, make=True)
    if secret is None:
        return
    try:
        body = json.dumps({"value": _marked(value), "data": data}).encode()
        # owner-only: a recipe's launch.env may hold tokens
        write_new(d / f"{key(kind, text)}.json", _mac(secret, body).encode() + b"\n" + body, 0o600)
    except (OSError, TypeError, ValueError):
        pass  # a cache that cannot be written is only a slower plan
