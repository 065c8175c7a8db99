"""Training progress as a node's runner sees it, and what it does when progress stops (issue 30).

Progress is the training step. The runner reads it from the command's output (a line that
names the step: `step 12`, `step: 12`, `step=12`, Megatron's `iteration 12/ 100`) and from the
hooks' heartbeat files (jobctl.hooks writes `<job folder>/progress/node<N>-<pid>` as steps go
by). A hang is no new step for longer than the job's threshold; before the first step any
output counts as life (loading, NCCL set-up) and the first-step threshold applies, which is
longer. A job that prints no step lines at all is therefore judged by its output alone.

On a hang the runner dumps every Python process's stacks into `<job folder>/stacks/` (py-spy
when it is installed; else the signal the job's sitecustomize registered with faulthandler,
STACK_SIGNAL, whose output the runner copies from the command's output), then stops the
command: the job is recorded HANG with its last step.

Checkpoints: the chain's folder is read for the newest checkpoint in the conventions of the
frameworks jobctl renders for (latest_checkpoint).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

# A line that names a training step. `\bstep` keeps out warmup_steps, global_step100 and
# "steps 100"; the number must follow the word (a colon, =, # or spaces between).
_STEP_LINE = re.compile(r"\bstep\b[\s:=#]{0,3}(\d{1,12})\b|\biteration\s+(\d{1,12})\s*/", re.IGNORECASE)
# the same signal number in the runner and in the job's sitecustomize (a real-time signal: the
# usual SIGUSR1/SIGUSR2 are Slurm's and submitit's to send, and their default action kills)
STACK_SIGNAL = signal.SIGRTMIN + 4
STACK_WAIT_S = 2.0  # how long the processes get to print their stacks (faulthandler writes at once)
HEARTBEAT_DIR = "progress"
STACKS_DIR = "stacks"
PUBLISH_ALIVE_S = 5.0  # before the first step, a node says it is alive at most this often
_MAX_SMALL_FILE = 256  # a checkpoint marker or heartbeat file is a number: read no more


def step_in(line: str) -> int | None:
    """The training step a line of output names, or None."""
    m = _STEP_LINE.search(line)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


# -- checkpoints ------------------------------------------------------------------------------

_STEP_DIR = re.compile(r"(?:step|iter|checkpoint|global_step)[-_]?(\d{1,12})")


def _small_match(path: Path, pattern: re.Pattern) -> re.Match | None:
    """The match of `pattern` with a small marker file's text (Megatron's
    latest_checkpointed_iteration.txt, DeepSpeed's `latest`, a heartbeat): None when the file
    is missing, large, a link or does not match."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with open(path, "rb") as f:
            text = f.read(_MAX_SMALL_FILE + 1)
    except OSError:
        return None
    if len(text) > _MAX_SMALL_FILE:
        return None
    return pattern.fullmatch(text.decode("ascii", "replace").strip())


def _small_int(path: Path, pattern: re.Pattern) -> int | None:
    m = _small_match(path, pattern)
    return int(m.group(1)) if m else None


def latest_checkpoint(folder: str | os.PathLike) -> tuple[int, str] | None:
    """(step, path) of the newest complete checkpoint in `folder`, or None. Read as data (the
    folder is on a shared file system): marker files are small numbers, links are not
    followed. Recognised, from the frameworks' own code:
    - Megatron-LM: latest_checkpointed_iteration.txt holding the iteration, beside iter_NNNNNNN
      (megatron/training/checkpointing.py, written after the checkpoint is complete);
    - DeepSpeed: `latest` holding the tag, conventionally global_stepN (runtime/engine.py
      save_checkpoint writes it last);
    - torchtitan: step-N folders (components/checkpoint.py), HF Trainer: checkpoint-N,
      and the generic step-N / step_N folders of a script of one's own."""
    root = Path(folder)
    if not root.is_dir() or root.is_symlink():
        return None
    it = _small_int(root / "latest_checkpointed_iteration.txt", re.compile(r"(\d{1,12})"))
    if it is not None:
        return it, str(root / f"iter_{it:07d}")
    tag = _small_match(root / "latest", re.compile(r"(?:global_step)?(\d{1,12})"))
    if tag is not None:
        return int(tag.group(1)), str(root / tag.group(0))
    best = None
    try:
        entries = list(os.scandir(root))[:100_000]
    except OSError:
        return None
    for e in entries:
        m = _STEP_DIR.fullmatch(e.name)
        if m and e.is_dir(follow_symlinks=False) and not e.name.endswith(".tmp"):
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, e.path)
    return best


# -- the watchdog -----------------------------------------------------------------------------

class Progress:
    """A node's view of its training: the last step seen, when anything last happened, and the
    hang thresholds (`first_s` before the first step, `after_s` between steps; 0: never).

    In a job of several nodes usually only the first prints steps (global rank 0 logs): each
    node's runner publishes the steps it reads to `publish` (a file in the shared heartbeat
    folder), and every node counts any heartbeat file's change as progress, so a quiet node is
    not called hung while the job trains."""

    def __init__(self, after_s: float, first_s: float, heartbeat_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic, publish: Path | None = None):
        self.after_s, self.first_s, self.heartbeat_dir, self.clock = after_s, first_s, heartbeat_dir, clock
        self.publish = publish
        self._published = -1e18
        self.last_step: int | None = None
        self.last_change = clock()
        self._beats: dict[str, float] = {}
        self._lock = threading.Lock()
        # what an earlier run of this job (a requeue) left there is no news of this run
        for e in self._entries():
            try:
                self._beats[e.name] = e.stat(follow_symlinks=False).st_mtime
            except OSError:
                pass

    def _entries(self) -> list:
        if self.heartbeat_dir is None:
            return []
        try:
            return list(os.scandir(self.heartbeat_dir))[:4096]
        except OSError:
            return []

    def line(self, text: str) -> None:
        """One line of the command's output."""
        step = step_in(text)
        new = alive = False
        with self._lock:
            if step is not None and step != self.last_step:
                self.last_step = step
                self.last_change = self.clock()
                new = True
            elif self.last_step is None:
                self.last_change = self.clock()  # before the first step, any output is life
                alive = self.clock() - self._published > PUBLISH_ALIVE_S
        if self.publish is not None and (new or alive):
            self._published = self.clock()
            _write_small(self.publish, str(step) if new else "alive")  # "alive": life, not a step

    def _heartbeats(self) -> None:
        """The hooks' heartbeat files: a changed file is a step (its content is the step)."""
        for e in self._entries():
            try:
                mtime = e.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if e.name.endswith(".tmp") or self._beats.get(e.name) == mtime or not e.is_file(follow_symlinks=False):
                continue
            self._beats[e.name] = mtime
            step = _small_int(Path(e.path), re.compile(r"(\d{1,12})"))
            with self._lock:
                if step is not None and (self.last_step is None or step > self.last_step):
                    self.last_step = step
                self.last_change = self.clock()

    def stalled(self) -> float | None:
        """Seconds without progress when that is past the threshold that applies, else None."""
        self._heartbeats()
        with self._lock:
            limit = self.first_s if self.last_step is None else self.after_s
            idle = self.clock() - self.last_change
        return idle if limit and idle > limit else None

    def verdict(self, idle: float) -> str:
        """The HANG failure's summary."""
        idle = math.ceil(idle)  # past the threshold, also when both are printed as whole seconds
        if self.last_step is None:
            return f"no output and no first step for {idle} s (first-step threshold {self.first_s:.0f} s)"
        return f"no progress for {idle} s after step {self.last_step} (threshold {self.after_s:.0f} s)"


def _write_small(path: Path, text: str) -> None:
    """A heartbeat file, replaced whole (never followed if someone planted a link)."""
    try:
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass  # a heartbeat is best effort


# -- stacks ------------------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc: Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/<pid>/status): only
    those are sent STACK_SIGNAL, whose default action would kill the others."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def dump_stacks(pid: int, out: Path) -> str:
    """Ask every Python process under `pid` for its stacks; returns how. With py-spy on PATH its
    dumps are written to `out` here; otherwise the processes that registered STACK_SIGNAL
    (the job's sitecustomize: faulthandler) print theirs to their stderr, which the caller
    copies to `out` while it reads the command's output."""
    pids = descendants(pid)
    spy = shutil.which("py-spy")
    if spy:
        with open(out, "a") as f:
            for p in pids:
                r = subprocess.run([spy, "dump", "--pid", str(p)], capture_output=True, text=True, timeout=30)
                if r.returncode == 0:
                    f.write(f"--- py-spy dump --pid {p}\n{r.stdout}\n")
        return "py-spy"
    sent = 0
    for p in pids:
        if catches(p, STACK_SIGNAL):
            try:
                os.kill(p, STACK_SIGNAL)
                sent += 1
            except OSError:
                pass
    return f"faulthandler ({sent} processes)"
