"""The training process's own view of GPU memory: per-rank peaks every N steps, and a record
(and optionally an allocator snapshot) when a CUDA out-of-memory error ends the process.

A training script opts in with a few lines (docs/hooks.md)::

    from jobctl.runtime import hooks
    hooks.install()            # settings from JOBCTL_* (or install(interval_steps=50))
    for step in range(steps):
        ...
        hooks.step(step)

or, without touching the script, the runner puts `sitecustomize_dir()` first on PYTHONPATH
and sets JOBCTL_HOOKS=1 (`site_env`). Records go to ``<job folder>/memory/rank-<RANK>.jsonl``.
Without CUDA every call is a no-op that says so once. Nothing here may change how the
training process fails: the OOM record is written from a chained `sys.excepthook`, which
then hands the exception to the previous hook, so the traceback and exit code 1 are Python's.

This module imports only the standard library at import time (torch inside functions), so
the sitecustomize can load it even where jobctl's own dependencies are not installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

DEFAULT_INTERVAL_STEPS = 50
# Each recorded allocator event costs "several KB" of host memory and snapshot size
# (torch.cuda.memory._record_memory_history docstring): 100k events is a few hundred MB at most.
DEFAULT_SNAPSHOT_MAX_ENTRIES = 100_000
OOM_TEXT = "CUDA out of memory"  # what PyTorch's allocator puts in the message of a CUDA OOM
ERROR_TEXT_MAX_CHARS = 4000

ENV_FOLDER = "JOBCTL_JOB_FOLDER"
ENV_SNAPSHOT = "JOBCTL_MEMORY_SNAPSHOT"
ENV_SNAPSHOT_MAX_ENTRIES = "JOBCTL_MEMORY_SNAPSHOT_MAX_ENTRIES"
ENV_INTERVAL_STEPS = "JOBCTL_HOOKS_INTERVAL_STEPS"
ENV_HOOKS = "JOBCTL_HOOKS"

_MEMORY_FIELDS = ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved")


@dataclass(frozen=True)
class HookSettings:
    """What `install` will do, worked out from its arguments and the environment."""

    folder: str | None
    rank: int
    local_rank: int | None
    interval_steps: int
    memory_snapshot: bool
    snapshot_max_entries: int
    problems: tuple[str, ...] = ()  # environment values that were ignored, and why

    @property
    def memory_dir(self) -> Path | None:
        return None if self.folder is None else Path(self.folder) / "memory"

    @property
    def rank_file(self) -> Path | None:
        return None if self.folder is None else Path(self.folder) / "memory" / f"rank-{self.rank}.jsonl"

    @property
    def snapshot_file(self) -> Path | None:
        return None if self.folder is None else Path(self.folder) / "memory" / f"oom-rank-{self.rank}.pickle"


def settings_from_env(env: Mapping[str, str], interval_steps: int | None = None,
                      memory_snapshot: bool | None = None, folder: str | os.PathLike | None = None) -> HookSettings:
    """The settings for `install`: explicit arguments win over JOBCTL_* variables.

    A bad explicit argument raises ValueError; a bad environment value is ignored (the
    default is used) and named in `problems`, because it must not stop a training run.
    """
    problems: list[str] = []

    def env_int(name: str, default: int | None, minimum: int) -> int | None:
        text = env.get(name, "").strip()
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            problems.append(f"{name}={text!r} is not an integer >= {minimum}; using {default}")
            return default
        return value

    if interval_steps is not None and (not isinstance(interval_steps, int) or interval_steps < 1):
        raise ValueError(f"interval_steps must be an integer >= 1, got {interval_steps!r}")
    if interval_steps is None:
        interval_steps = env_int(ENV_INTERVAL_STEPS, DEFAULT_INTERVAL_STEPS, 1)
    if memory_snapshot is None:
        memory_snapshot = env.get(ENV_SNAPSHOT, "").strip() == "1"
    if folder is None:
        folder = env.get(ENV_FOLDER) or None
    local_rank = env_int("LOCAL_RANK", None, 0)
    rank = env_int("RANK", None, 0)
    return HookSettings(
        folder=None if folder is None else os.fspath(folder),
        rank=rank if rank is not None else (local_rank or 0),
        local_rank=local_rank,
        interval_steps=interval_steps,
        memory_snapshot=bool(memory_snapshot),
        snapshot_max_entries=env_int(ENV_SNAPSHOT_MAX_ENTRIES, DEFAULT_SNAPSHOT_MAX_ENTRIES, 1),
        problems=tuple(problems),
    )


def is_oom(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or during, is a CUDA out-of-memory error."""
    return _find_oom(exc) is not None


def _find_oom(exc: BaseException | None) -> BaseException | None:
    torch = sys.modules.get("torch")  # no torch imported: no torch OOM class to match
    oom_class = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # frameworks re-raise OOMs wrapped
        seen.add(id(exc))
        if oom_class is not None and isinstance(exc, oom_class):
            return exc
        if isinstance(exc, RuntimeError) and OOM_TEXT in str(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


# --- the process-wide state ---------------------------------------------------------------------

@dataclass
class _Hooks:
    settings: HookSettings
    active: bool  # False: no CUDA or no folder; every call is a no-op
    off_reason: str | None = None
    last_step: int | None = None
    write_failed: bool = False


_hooks: _Hooks | None = None
_previous_excepthook = None


def install(interval_steps: int | None = None, memory_snapshot: bool | None = None,
            folder: str | os.PathLike | None = None) -> bool:
    """Turn the hooks on in this process; True when they record, False when they are a no-op.

    Reads JOBCTL_JOB_FOLDER (the job folder; `folder` overrides), JOBCTL_HOOKS_INTERVAL_STEPS
    (default 50), JOBCTL_MEMORY_SNAPSHOT=1 (record allocator history for an OOM snapshot; it
    costs host memory and a little time per allocation, see docs/hooks.md),
    JOBCTL_MEMORY_SNAPSHOT_MAX_ENTRIES, RANK and LOCAL_RANK. Without CUDA, or without a job
    folder, it says so once and every later call does nothing. Calling it again (the
    sitecustomize, then the script) keeps one installation; explicit arguments update it.
    """
    global _hooks
    settings = settings_from_env(os.environ, interval_steps, memory_snapshot, folder)
    try:
        if _hooks is not None and _hooks.active:
            return _reinstall(_hooks, interval_steps, memory_snapshot)
        if _hooks is not None and not (_hooks.settings.folder is None and settings.folder is not None):
            return False  # already said why it is off; a folder given now is the one case worth a retry
        _hooks = _install(settings)
        return _hooks.active
    except Exception as e:  # a hook must never stop training
        _say(f"jobctl.hooks: not installed: {type(e).__name__}: {e}", settings.rank)
        return False


def _install(settings: HookSettings) -> _Hooks:
    for problem in settings.problems:
        _say(f"jobctl.hooks: {problem}", settings.rank)
    if settings.folder is None:
        reason = f"{ENV_FOLDER} is not set and install() got no folder"
        _say(f"jobctl.hooks: {reason}: memory hooks are off", settings.rank)
        return _Hooks(settings, active=False, off_reason=reason)
    reason = _no_cuda_reason()
    hooks = _Hooks(settings, active=reason is None, off_reason=reason)
    if reason is not None:
        _say(f"jobctl.hooks: no CUDA ({reason}): memory hooks are off", settings.rank)
        _write(hooks, {"event": "off", "reason": f"no CUDA ({reason})"})
        return hooks
    if settings.memory_snapshot:
        _start_recording(hooks)
    _chain_excepthook()
    _write(hooks, {"event": "installed", "interval_steps": settings.interval_steps,
                   "memory_snapshot": settings.memory_snapshot,
                   "snapshot_max_entries": settings.snapshot_max_entries if settings.memory_snapshot else None})
    return hooks


def _reinstall(hooks: _Hooks, interval_steps, memory_snapshot) -> bool:
    changed = {}
    if interval_steps is not None and interval_steps != hooks.settings.interval_steps:
        changed["interval_steps"] = interval_steps
    if memory_snapshot and not hooks.settings.memory_snapshot:
        changed["memory_snapshot"] = True
    if changed:
        hooks.settings = replace(hooks.settings, **changed)
        if changed.get("memory_snapshot"):
            _start_recording(hooks)
        _write(hooks, {"event": "installed", "interval_steps": hooks.settings.interval_steps,
                       "memory_snapshot": hooks.settings.memory_snapshot,
                       "snapshot_max_entries": hooks.settings.snapshot_max_entries
                       if hooks.settings.memory_snapshot else None})
    return True


HEARTBEAT_EVERY_S = 5.0  # at most one heartbeat write per process in this long
_last_beat = [0.0]


def step(step: int) -> None:
    """Record this rank's memory figures every `interval_steps` steps (when step % N == 0),
    and its heartbeat (the step, in <job folder>/progress/, at most every HEARTBEAT_EVERY_S):
    the runner's hang watchdog reads it (jobctl/runtime/progress.py), with or without CUDA.

    Cheap: a no-op on other steps, and the allocator's counters are read without a device
    synchronisation. Does nothing before `install`; only the heartbeat without CUDA. Never raises."""
    hooks = _hooks
    if hooks is None:
        return
    _heartbeat(hooks, step)
    if not hooks.active:
        return
    try:
        hooks.last_step = step
        if step % hooks.settings.interval_steps == 0:
            _write(hooks, {"event": "step", **_memory_figures(hooks)})
    except Exception as e:
        _write_failed(hooks, e)


def _heartbeat(hooks: _Hooks, step: int) -> None:
    now = time.monotonic()
    if hooks.settings.folder is None or now - _last_beat[0] < HEARTBEAT_EVERY_S:
        return
    _last_beat[0] = now
    try:
        folder = Path(hooks.settings.folder) / "progress"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"node{os.environ.get('JOBCTL_NODE_RANK', '0')}-rank{hooks.settings.rank}"
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(int(step)))
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - a heartbeat must never stop training
        pass


def on_oom(exc: BaseException) -> bool:
    """Record a CUDA OOM: the allocator snapshot (when recording is on) and a final JSON line
    with the peak figures and the error. For a script's own ``except``; the installed
    excepthook calls it for OOMs that escape. True if `exc` was an OOM and got recorded
    (once per exception). Never raises."""
    try:
        hooks = _hooks
        oom = _find_oom(exc)
        if hooks is None or not hooks.active or oom is None:
            return False
        if _already_recorded(oom):
            return True
        record: dict[str, Any] = {"event": "oom", "error": _error_text(oom), "snapshot": None}
        try:  # before the snapshot, which can take a while and must not change them
            record.update(_memory_figures(hooks))
        except Exception as e:
            record["figures_error"] = f"{type(e).__name__}: {e}"
        if hooks.settings.memory_snapshot:
            record["snapshot"] = _dump_snapshot(hooks)
        _write(hooks, record)
        return True
    except Exception:
        return False


# --- sitecustomize ------------------------------------------------------------------------------

def sitecustomize_dir() -> str:
    """The folder holding jobctl's sitecustomize.py: put it first on PYTHONPATH, with
    JOBCTL_HOOKS=1, and every training process installs the hooks at start-up."""
    return str(Path(__file__).resolve().parent / "_site")


def site_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to a job's environment `env` to turn the hooks on through the sitecustomize."""
    path = env.get("PYTHONPATH", "")
    return {ENV_HOOKS: "1", "PYTHONPATH": sitecustomize_dir() + (os.pathsep + path if path else "")}


def site_install(argv: list[str] | None = None) -> bool:
    """What the sitecustomize runs when JOBCTL_HOOKS=1: `install` in the first Python process
    that trains, and nowhere below it.

    torchrun's own agent process is skipped (its workers are the training processes). The
    process that installs removes JOBCTL_HOOKS from its environment, so its children
    (DataLoader workers, compile workers) start without hooks and without touching CUDA.
    """
    argv = list(sys.orig_argv if argv is None else argv)
    if _is_torch_launcher(argv):
        return False
    os.environ.pop(ENV_HOOKS, None)
    return install()


def _is_torch_launcher(argv: list[str]) -> bool:
    # `torchrun ...` runs as [python, .../bin/torchrun, ...]; `python -m torch.distributed.run ...` as is
    head = argv[:3]
    return (any(os.path.basename(a) == "torchrun" for a in head)
            or "torch.distributed.run" in head or "torch.distributed.launch" in head)


# --- helpers ------------------------------------------------------------------------------------

def _no_cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    # device_count() asks NVML when it can, so unlike is_available() it neither initialises
    # CUDA nor fixes CUDA_VISIBLE_DEVICES before the script has set it (torch.cuda.device_count).
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} is built without CUDA"
    if torch.cuda.device_count() == 0:
        return "torch.cuda.device_count() is 0"
    return None


def _device(hooks_settings: HookSettings):
    import torch

    # torchrun's convention: rank LOCAL_RANK uses GPU LOCAL_RANK. When each rank sees one GPU
    # (CUDA_VISIBLE_DEVICES per rank) LOCAL_RANK is out of range: use the current device.
    lr = hooks_settings.local_rank
    if lr is not None and lr < torch.cuda.device_count():
        return lr
    return torch.cuda.current_device()


def _memory_figures(hooks: _Hooks) -> dict[str, Any]:
    import torch

    device = _device(hooks.settings)
    out: dict[str, Any] = {"step": hooks.last_step, "device": device}
    for name in _MEMORY_FIELDS:
        out[f"{name}_bytes"] = int(getattr(torch.cuda, name)(device))
    return out


def _start_recording(hooks: _Hooks) -> None:
    import torch

    try:
        torch.cuda.memory._record_memory_history(max_entries=hooks.settings.snapshot_max_entries)
    except Exception as e:
        hooks.settings = replace(hooks.settings, memory_snapshot=False)
        _say(f"jobctl.hooks: memory snapshot recording could not start: {type(e).__name__}: {e}",
             hooks.settings.rank)


def _dump_snapshot(hooks: _Hooks) -> str | None:
    import torch

    path = hooks.settings.snapshot_file
    partial = path.with_name(path.name + ".partial")  # a dump cut short never has the final name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(partial))  # a pickle of torch.cuda.memory._snapshot()
        os.replace(partial, path)
        return path.name
    except Exception as e:
        _say(f"jobctl.hooks: could not write the OOM snapshot {path}: {type(e).__name__}: {e}",
             hooks.settings.rank, every_rank=True)
        return None


def _chain_excepthook() -> None:
    global _previous_excepthook
    if _previous_excepthook is not None:
        return
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook


def _excepthook(exc_type, exc, tb):
    try:
        on_oom(exc)
    except BaseException:
        pass
    # Python's own report and exit code follow, as if the hook were not there.
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _write(hooks: _Hooks, record: dict[str, Any]) -> None:
    s = hooks.settings
    line = {"event": record.pop("event"), "time_s": round(time.time(), 3), "rank": s.rank,
            "local_rank": s.local_rank, "pid": os.getpid(), **record}
    try:
        s.memory_dir.mkdir(parents=True, exist_ok=True)
        with open(s.rank_file, "a") as f:  # one line per write: a crash loses at most the line in flight
            f.write(json.dumps(line) + "\n")
    except Exception as e:
        _write_failed(hooks, e)


def _write_failed(hooks: _Hooks, e: Exception) -> None:
    if not hooks.write_failed:
        hooks.write_failed = True
        _say(f"jobctl.hooks: cannot record memory figures ({type(e).__name__}: {e}); "
             "training goes on", hooks.settings.rank, every_rank=True)


def _already_recorded(oom: BaseException) -> bool:
    # Marked on the exception itself: holding a reference to it would keep its traceback's
    # frames, and their GPU tensors, alive in a script that catches the OOM and goes on.
    if getattr(oom, "_jobctl_recorded", False):
        return True
    try:
        oom._jobctl_recorded = True
    except Exception:
        pass
    return False


def _error_text(exc: BaseException) -> str:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = f"{name}: {exc}"
    return text if len(text) <= ERROR_TEXT_MAX_CHARS else text[:ERROR_TEXT_MAX_CHARS] + " ..."


def _say(line: str, rank: int, every_rank: bool = False) -> None:
    # One voice per job for what is the same on every rank; every rank for its own trouble.
    if rank != 0 and not every_rank:
        return
    try:
        print(f"{line} [rank {rank}]", file=sys.stderr, flush=True)
    except Exception:
        pass


