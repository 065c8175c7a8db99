"""This machine as a scheduler: submitit's LocalExecutor (the embedded default, no Slurm).

A local job's scheduler id is the pid of submitit's controller process. How it ended is
submitit's answer through its public Job API once the runner returned; before that, whether it
still runs is asked of that process, identified by its pid *and* its start time (a pid is
reused once its process is gone), a zombie counting as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jobctl.backends.base import JobRef, SubmitRequest, Submitted
from jobctl.errors import SchedulerError
from jobctl.model import JobStatus, Outcome, Scheduler
from jobctl.store.folder import JobFolder
from jobctl.store.private import owner_only

MAX_NUM_TIMEOUT = 3
CANCEL_GRACE_S = 5.0  # a local controller stops its task within ~1 s of SIGINT (submitit kill_tasks)


class LocalBackend:
    scheduler = Scheduler.LOCAL

    def check(self) -> None:
        """This machine is always there."""

    def submit(self, requests: Sequence[SubmitRequest], cwd: str | None = None) -> list[Submitted]:
        """Start each job's controller now (no arrays: the local executor runs jobs one by one)."""
        import submitit

        out = []
        for r in requests:
            ex = submitit.LocalExecutor(folder=r.folder.path, max_num_timeout=MAX_NUM_TIMEOUT)
            ex.update_parameters(timeout_min=r.parameters["timeout_min"], tasks_per_node=1, nodes=1)
            try:
                with _detached_stdio(), owner_only():  # submitit's pickles hold the job's environment
                    job = ex.submit(r.runner)
            except OSError as e:
                raise SchedulerError(f"cannot start the local job: {e}") from None
            out.append(Submitted(str(job.job_id), r.folder.path, {"controller_start": start_time(int(job.job_id))}))
        return out

    def render(self, requests: Sequence[SubmitRequest], cwd: str | None = None) -> None:
        return None  # no script: the controller is a process started directly

    def keep_off(self, job_id: str, nodes) -> bool:
        return False  # one machine: no node to keep a job off

    def test_only(self, script: str) -> tuple[bool, str]:
        return True, "this machine"

    def refresh(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]:
        return {j.scheduler_job_id: self._status(j) for j in jobs if j.scheduler_job_id}

    def _status(self, job: JobRef) -> JobStatus:
        import submitit

        folder = JobFolder(job.job_folder or "")
        meta = folder.scheduler_meta()
        sub = submitit.LocalJob(Path(meta.get("submitit_folder") or folder.path), job.scheduler_job_id)
        if sub.paths.result_pickle.exists():  # submitit's answer, once the runner returned (recovery included)
            error = sub.exception()
            return JobStatus("COMPLETED", "0:0") if error is None else JobStatus("FAILED", "1:0", _first_line(error))
        if running(int(job.scheduler_job_id), meta.get("controller_start")):
            return JobStatus("RUNNING")
        outcomes = Outcome.all_valid(folder.outcomes(), str(folder.path))
        if outcomes:  # the controller died after the command ended: the runner's own record of its exit
            code = outcomes[0].exit_code
            return JobStatus("COMPLETED", "0:0") if code == 0 else JobStatus("FAILED", f"{code}:0")
        return JobStatus("FAILED", reason="the local job's process is gone and left no result")

    def find(self, calls: Sequence[Sequence[str]]) -> dict[tuple, list[str]]:
        """The local jobs of submissions whose answer was lost (jobctl was killed between
        starting the controller and recording it), by their folder: {tuple(call): [job id]}.
        A controller still running is found among this user's processes by the folder submitit
        gives it (`python -m submitit.local._local FOLDER`); one that ended, by the files it left
        in the folder (`<job id>_submitted.pkl`)."""
        wanted = {os.path.abspath(call[0]): tuple(call) for call in calls if len(call) == 1}
        found = {wanted[folder]: [str(pid)] for pid, folder in _controllers() if folder in wanted}
        for folder, call in wanted.items():
            if call not in found:
                ids = sorted((p.name.split("_")[0] for p in Path(folder).glob("*_submitted.pkl")
                              if p.name.split("_")[0].isdigit()), key=int)
                if ids:
                    found[call] = ids[-1:]
        return found

    def cancel(self, jobs: Sequence[JobRef]) -> None:
        for j in jobs:
            if j.scheduler_job_id:
                stop(int(j.scheduler_job_id), JobFolder(j.job_folder or "").scheduler_meta().get("controller_start"))

    def output_files(self, submitit_folder: Path, job_id: str, node: int) -> tuple[Path, Path]:
        from submitit.core.utils import JobPaths

        paths = JobPaths(submitit_folder, job_id=job_id, task_id=node)
        return paths.stdout, paths.stderr


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]


@contextlib.contextmanager
def _detached_stdio():
    """submitit's LocalExecutor starts the job's controller with our stdin/stdout/stderr, so
    `$(jobctl submit ... -c local)` or a pipe would wait for the job to end, and the job's
    stray output lands in the terminal. The job logs to its folder: give it /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        yield
    finally:
        for fd, old in zip((0, 1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        os.close(null)


# --- processes (Linux /proc; elsewhere the pid alone) ---------------------------------------------

def _controllers():
    """(pid, job folder) of this user's running submitit local controllers (Linux /proc)."""
    uid = os.geteuid()
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if len(argv) >= 4 and argv[-3:-1] == [b"-m", b"submitit.local._local"] and alive(pid):
            yield pid, os.path.abspath(argv[-1].decode("utf-8", "surrogateescape"))


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not: it has exited and waits to be reaped)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child (an in-process submit): reap it
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def same(pid: int, started: str | None) -> bool:
    """Still alive, and not a new process that reuses the pid."""
    return alive(pid) and (started is None or start_time(pid) == started)


def running(pid: int, started: str | None) -> bool:
    """Whether the job's controller runs: the same process (pid and start time, recorded at
    submission) and a submitit one (jobs submitted before the start time was recorded)."""
    if not same(pid, started):
        return False
    if started is not None:
        return True
    try:
        return b"submitit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc at all (macOS): trust the pid
    except OSError:
        return True


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, parents before children (Linux /proc; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def _ignores_sigint(pid: int) -> bool:
    """Whether the process ignores SIGINT (SigIgn in /proc/PID/status; False where unknown)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False


def stop(pid: int, started: str | None = None, grace_s: float = CANCEL_GRACE_S) -> bool:
    """Stop a local job's controller and every process under it; False if it was already gone.

    SIGINT to the controller is submitit's own cancel (it interrupts, then kills, its task).
    What is still there after `grace_s` -- the controller when it was started with SIGINT
    ignored (a background job of a script), the training processes its task left behind --
    gets SIGTERM, then SIGKILL."""
    if not running(pid, started):
        return False
    tree = [(pid, start_time(pid))] + [(p, start_time(p)) for p in descendants(pid)]
    steps = [(signal.SIGTERM, grace_s / 2), (signal.SIGKILL, grace_s / 2)]
    if not _ignores_sigint(pid):
        steps.insert(0, (signal.SIGINT, grace_s))
    for sig, wait_s in steps:
        targets = [pid] if sig is signal.SIGINT else [p for p, t in reversed(tree) if same(p, t)]
        for p in targets:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                raise SchedulerError(f"cannot signal the local job's process {p}: permission denied",
                                     hint="cancel it as the user who submitted it") from None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not any(same(p, t) for p, t in tree):
                return True
            time.sleep(0.1)
    return True

