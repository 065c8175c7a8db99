"""A node's log: where it is (jobctl's copy in the job folder, else the scheduler's own stdout
and stderr files), read from where the last read stopped, and followed until the job ends."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from pathlib import Path

from jobctl.errors import UsageError
from jobctl.jobs import placement
from jobctl.jobs.status import refresh
from jobctl.store.folder import JobFolder

POLL_S = 0.5  # how often a followed file is read
REFRESH_S = 2.0  # how often the scheduler is asked whether the job has ended


def log_paths(record, node: int) -> dict[str, Path]:
    """Where a node's output can be: jobctl's copy, then the scheduler's stdout and stderr files."""
    if not record.job_folder:
        raise UsageError(f"job #{record.id} has no job folder and no log: it was never submitted "
                         f"(state {record.state.value})", hint=f"see `jobctl status {record.id}`")
    nodes = int(record.plan.get("nodes") or 1)
    if not 0 <= node < nodes:
        raise UsageError(f"job #{record.id} has {nodes} node(s), so no node {node}",
                         hint="use --node 0" + (f" to --node {nodes - 1}" if nodes > 1 else ""))
    folder = JobFolder(record.job_folder)
    meta = folder.scheduler_meta()
    job_id = meta.get("job_id") or record.scheduler_job_id or ""
    stdout, stderr = placement.backend(record.scheduler).output_files(
        Path(meta.get("submitit_folder") or folder.path), job_id, node)  # one task per node: task = node rank
    return {"node": folder.log(node), "stdout": stdout, "stderr": stderr}


class Tail:
    """A file read from where the last read stopped (bytes; UTF-8 decoded across chunk edges)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def pump(self, write: Callable[[str], object]) -> None:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self.offset)
            while chunk := f.read(1 << 16):
                self.offset += len(chunk)
                write(self._decoder.decode(chunk))


def open_tails(paths: dict[str, Path], note: Callable[[str], None]) -> list[Tail]:
    """jobctl's node log if it exists, else whichever of the scheduler's files exist."""
    if paths["node"].exists():
        return [Tail(paths["node"])]
    found = [paths[k] for k in ("stdout", "stderr") if paths[k].exists()]
    if found:
        note(f"no {paths['node']} yet; showing submitit's " + " and ".join(str(p) for p in found))
    return [Tail(p) for p in found]


def no_log(record, node: int, paths: dict[str, Path]) -> UsageError:
    where = ", ".join(str(p) for p in paths.values())
    if record.terminal:
        hint = f"the job ended ({record.state.value}) without writing one; see `jobctl status {record.id}`"
    else:
        hint = f"the job has not started writing yet; `jobctl logs {record.id} -f` waits for it"
    return UsageError(f"no log yet for job #{record.id} node {node} (looked for {where})", hint=hint)


def follow(history, record, paths: dict[str, Path], node: int, write: Callable[[str], object],
           note: Callable[[str], None], poll_s: float = POLL_S, refresh_s: float = REFRESH_S):
    """Write the log as it grows; ask the scheduler every `refresh_s` whether the job has ended
    (recording what changed) and stop, after a last read, when it has. Returns the record."""
    tails: list[Tail] = []
    asked = 0.0
    while True:
        if not tails:
            tails = open_tails(paths, note)
        for t in tails:
            t.pump(write)
        if time.monotonic() - asked >= refresh_s:
            refresh(history, [record])
            record = history.get(record.id)
            asked = time.monotonic()
            if record.terminal:
                tails = tails or open_tails(paths, note)
                if not tails:
                    raise no_log(record, node, paths)
                for t in tails:
                    t.pump(write)
                return record
        time.sleep(poll_s)
