"""The job folder: the only code that knows its layout (docs/job-folder.md).

One folder per job, named by its jobctl id and a safe slug of the recipe's name, on a file
system the nodes share. It is the source of truth for what happened in the job; the history
syncs from it. Every path handed out is inside the folder (names are data, never paths), and
what jobctl writes there is written atomically (a temporary file, then a rename) and private
to its owner.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobctl.errors import UsageError
from jobctl.model import slug  # noqa: F401 (part of the folder layout: <id>-<slug>)
from jobctl.store.private import DIR_MODE, FILE_MODE, new_dir, private_root, write_new

# The files jobctl writes, by role.
RECIPE_YAML = "recipe.yaml"  # the resolved recipe, for people
RECIPE_JSON = "recipe.json"  # the recipe as loaded (launch unresolved), for re-planning
INVENTORY_YAML = "inventory.yaml"
INVENTORY_JSON = "inventory.json"
PLAN = "plan.json"  # the `plan --json` report the job runs
JOB = "job.json"  # how it was submitted: id, attempt, parent, policy, env, command, cwd
CHECKPOINTS = "checkpoints"  # the chain's checkpoint folder, in its first attempt's folder (issue 30)
SBATCH = "sbatch.sh"  # the script submitit gave sbatch, byte for byte
SCHEDULER = "submitit.json"  # the scheduler's id and submitit's folder (an array's is shared)
SUCCESSOR = "successor.json"  # the attempt the first node submitted after a failure
FINAL = "final.json"  # why the chain stopped here
RECOVERY_ERROR = "recovery-error.txt"  # the traceback of a recovery that broke
FRAMEWORK_DIR = "framework"  # the plan rendered as the framework's own files (ds_config.json, ...)
LOGS, GPU, MEMORY = "logs", "gpu", "memory"
ARRAY_DIR = "array"  # in the first job's folder: submitit's files for a job array's sbatch call
MIRROR_STATE = ".remote-files.json"  # what a mirror of a remote folder has copied

_OUTCOME = re.compile(r"outcome-node(\d+)\.json")
_SAMPLER = re.compile(r"node-(\d+)\.csv")
_HOOKS = re.compile(r"rank-(\d+)\.jsonl")


class FolderError(UsageError):
    """A job folder lacks a file jobctl needs, or holds one it cannot read."""




@dataclass(frozen=True)
class FolderFile:
    """A file of a job folder as a mirror sees it: its name inside the folder, where it is, size and time."""

    name: str
    path: Path
    size: int
    mtime: float


class JobFolder:
    """A job's folder. Paths come from `file()`, which refuses names that leave it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"JobFolder({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, JobFolder) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    @classmethod
    def create(cls, root: str | os.PathLike, job_id: int, name: str) -> JobFolder:
        """A new, empty, owner-only folder `<root>/<id>-<slug>`, made here and now: when that name
        is taken (another history sharing the root, or a folder or link another user planted
        there), `<id>-<slug>-<random>` (store/private.py). The root is made if missing, and
        refused when another user could replace what is made in it."""
        root = private_root(Path(root))
        folder = cls(new_dir(root, f"{int(job_id)}-{slug(name)}"))
        os.mkdir(folder.path / LOGS, DIR_MODE)
        return folder

    # -- paths ---------------------------------------------------------------------------

    def file(self, *parts: str) -> Path:
        """The path of a file in the folder; FolderError for a name that would leave it."""
        rel = Path(*parts)
        if rel.is_absolute() or any(p in ("", ".", "..") for p in rel.parts):
            raise FolderError(f"{'/'.join(parts)!r} is not a name inside the job folder {self.path}")
        return self.path / rel

    def log(self, node: int) -> Path:
        return self.file(LOGS, f"node-{int(node)}.log")

    def sampler_csv(self, node: int) -> Path:
        return self.file(GPU, f"node-{int(node)}.csv")

    @property
    def memory_dir(self) -> Path:
        """Where the memory hooks of every rank write (memory/rank-<N>.jsonl, oom-rank-<N>.pickle)."""
        return self.file(MEMORY)

    def outcome_path(self, node: int) -> Path:
        return self.file(f"outcome-node{int(node)}.json")

    def _numbered(self, sub: str | None, pattern: re.Pattern) -> list[tuple[int, Path]]:
        d = self.path / sub if sub else self.path
        if not d.is_dir():
            return []
        found = [(int(m[1]), p) for p in d.iterdir() if (m := pattern.fullmatch(p.name)) and p.is_file()]
        return sorted(found)

    def sampler_files(self) -> list[tuple[int, Path]]:
        """(node rank, path) of the GPU sampler's CSVs, by node."""
        return self._numbered(GPU, _SAMPLER)

    def sampler_notes(self) -> list[str]:
        """What the samplers said instead of sampling (no GPU, no NVML), one line each."""
        d = self.path / GPU
        lines = []
        for p in sorted(d.glob("node-*.csv.note")) if d.is_dir() else []:
            try:
                lines += [f"{p.name.split('.')[0]}: {line.strip()}" for line in p.read_text(errors="replace").splitlines()
                          if line.strip()]
            except OSError:
                pass
        return lines

    def hook_files(self) -> list[tuple[int, Path]]:
        """(rank, path) of the memory hooks' records, by rank."""
        return self._numbered(MEMORY, _HOOKS)

    # -- reading and writing -------------------------------------------------------------

    def exists(self, name: str) -> bool:
        return self.file(name).exists()

    def read_json(self, name: str, *, required: bool = False) -> Any:
        """A JSON file of the folder; None when it is missing or unreadable, or FolderError
        naming the file when `required`."""
        path = self.file(name)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if required:
                raise FolderError(f"the job folder {self.path} lacks {name}",
                                  hint="the folder must be readable from here (a shared file system) "
                                       "and not cleaned up") from None
        except (OSError, ValueError) as e:
            if required:
                raise FolderError(f"{path}: cannot read it as JSON: {e}") from None
        return None

    def write_text(self, name: str, text: str, mode: int = FILE_MODE) -> Path:
        """Write a file atomically (readers see the old or the new text, never half of one),
        through a new temporary file that is never a link (store/private.write_new)."""
        path = self.file(name)
        path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        write_new(path, text.encode("utf-8"), mode)
        return path

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(data, indent=2, default=str) + "\n")

    # -- the named records ------------------------------------------------------------------

    def job(self) -> dict:
        """job.json: how the job was submitted (FolderError if missing)."""
        return self.read_json(JOB, required=True)

    def plan_report(self) -> dict:
        """plan.json: the plan report the job runs (FolderError if missing)."""
        return self.read_json(PLAN, required=True)

    def scheduler_meta(self) -> dict:
        """submitit.json: {job_id, submitit_folder, ...} once submitted; {} before."""
        return self.read_json(SCHEDULER) or {}

    def outcomes(self) -> list[dict]:
        """The nodes' outcome records (unreadable ones skipped), by node."""
        out = []
        for _, path in self._numbered(None, _OUTCOME):
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def outcome_count(self) -> int:
        return len(self._numbered(None, _OUTCOME))

    def successor(self) -> dict | None:
        return self.read_json(SUCCESSOR)

    def final(self) -> dict | None:
        return self.read_json(FINAL)

    def recovery_decided(self) -> bool:
        """Whether the first node has said what follows a failure (or failed to)."""
        return any(self.file(n).exists() for n in (SUCCESSOR, FINAL, RECOVERY_ERROR))

    def files(self, skip_suffixes: tuple[str, ...] = (), max_bytes: int | None = None) -> Iterator[FolderFile]:
        """Every regular file below the folder (hidden ones skipped), for a mirror; the chain's
        checkpoints stay where the job runs (terabytes of shards are no mirror's business)."""
        if not self.path.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(self.path):
            top = dirpath == str(self.path)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (top and d == CHECKPOINTS))
            for name in sorted(filenames):
                if name.startswith(".") or name.endswith(skip_suffixes):
                    continue
                path = Path(dirpath) / name
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if not path.is_file() or path.is_symlink() or (max_bytes is not None and st.st_size > max_bytes):
                    continue
                yield FolderFile(path.relative_to(self.path).as_posix(), path, st.st_size, st.st_mtime)
