"""Cancel jobs: one scancel for all the Slurm ones, a signal to the controller of local ones,
and CANCELLED recorded in the history."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jobctl.errors import SchedulerError

HELP = "cancel jobs (scancel for Slurm, a signal for local jobs) and record it"
EPILOG = """examples:
  jobctl cancel 12
  jobctl cancel 12 13 slurm:4242          # one scancel call for all the Slurm jobs

JOB is a jobctl id (12, #12) or a scheduler id (4242, slurm:4242). Every JOB is looked up in
the history first (scancel says nothing about ids it does not know); jobs that already ended
are left as they are.
exit codes: 0 cancelled (or already ended), 2 unknown job, 4 scancel failed or cannot be reached."""

LOCAL_GRACE_S = 5.0  # a local controller stops its task within ~1 s of SIGINT (submitit kill_tasks)


def add_arguments(p) -> None:
    p.add_argument("jobs", nargs="+", metavar="JOB", help="jobs to cancel")
    p.add_argument("--json", action="store_true", dest="as_json", help="print what happened to each job as JSON")


def run(args) -> int:
    from jobctl import ui
    from jobctl.cli.history import resolve
    from jobctl.store.history import History

    with History.open() as history:
        records = resolve(history, args.jobs)  # all known, or nothing is cancelled
        results = cancel_records(history, records, say=ui.info)
    ordered = [results[r.id] for r in records]  # in the order asked
    if args.as_json:
        ui.print_json(ordered)
    else:
        for res in ordered:
            sys.stdout.write(f"#{res['id']}\t{res['state']}\t{res['action']}\n")
    return 0


def cancel_records(history, records, say=lambda text: None) -> dict[int, dict]:
    """Cancel the history's `records` that have not ended; {id: result}. Jobs on a remote
    cluster are cancelled there (jobctl.remote.client), Slurm ones with one scancel call."""
    from jobctl.remote import client as remote_jobs
    from jobctl.jobs.watch import refresh

    results = {}
    live = [r for r in records if r.scheduler_job_id and not r.terminal]
    if live:  # a job the history thinks is running may have ended meanwhile
        refresh(history, live)
    todo = []
    for r in records:
        cur = history.get(r.id)
        if cur.terminal:
            results[cur.id] = _result(cur, "already ended")
            say(f"#{cur.id} already ended ({cur.state.value}): nothing to cancel")
        elif not cur.scheduler_job_id:
            results[cur.id] = _result(cur, "never submitted")
            say(f"#{cur.id} was never submitted ({cur.state.value}): nothing to cancel")
        else:
            todo.append(cur)
    remote, here = remote_jobs.split(todo)
    if remote:
        remote_jobs.cancel(history, remote)
    slurm = [r for r in here if r.scheduler == "slurm"]
    if slurm:
        scancel([r.scheduler_job_id for r in slurm])
    for r in here:
        if r.scheduler == "local":
            stop_local(r)
    if slurm:  # record what Slurm says now; the job may also have ended on its own just before
        refresh(history, slurm)
    for r in todo:
        cur = history.get(r.id)
        if not cur.terminal:
            history.transition(r.id, "CANCELLED", detail="cancelled with jobctl cancel")
            cur = history.get(r.id)
        results[cur.id] = _result(cur, "cancelled" if cur.state.value == "CANCELLED" else "ended")
        say(f"#{cur.id} ({cur.scheduler} job {cur.scheduler_job_id}): {cur.state.value}")
    return results


def _result(rec, action: str) -> dict:
    return {"id": rec.id, "scheduler": rec.scheduler, "scheduler_job_id": rec.scheduler_job_id,
            "state": rec.state.value, "action": action}


def scancel(job_ids: list[str]) -> None:
    """Cancel Slurm jobs with one scancel call (an argv list, no shell)."""
    try:
        p = subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SchedulerError("scancel is not installed here: cannot cancel Slurm jobs",
                             hint="run jobctl where Slurm's client commands work (a login node)") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError("scancel did not answer within 60 s",
                             hint="check `scontrol ping`, then run jobctl cancel again") from None
    if p.returncode != 0:
        raise SchedulerError(f"scancel failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()}",
                             hint="check `scontrol ping` and SLURM_CONF, then run jobctl cancel again")


def stop_local(rec, grace_s: float = LOCAL_GRACE_S) -> bool:
    """Stop a local job and every process under it; False if it was already gone.

    The scheduler id is the pid of submitit's controller. SIGINT to it is submitit's own
    cancel (it interrupts, then kills, its task). What is still there after `grace_s` -- the
    controller when it was started with SIGINT ignored (a background job of a script), the
    training processes its task left behind -- gets SIGTERM, then SIGKILL."""
    pid = int(rec.scheduler_job_id)
    if not _is_controller(pid):
        return False
    tree = [(pid, _start_time(pid))] + [(p, _start_time(p)) for p in _descendants(pid)]
    steps = [(signal.SIGTERM, grace_s / 2), (signal.SIGKILL, grace_s / 2)]
    if not _ignores_sigint(pid):
        steps.insert(0, (signal.SIGINT, grace_s))
    for sig, wait_s in steps:
        targets = [pid] if sig is signal.SIGINT else [p for p, t in reversed(tree) if _same(p, t)]
        for p in targets:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                raise SchedulerError(f"cannot signal local job #{rec.id} (pid {p}): permission denied",
                                     hint="cancel it as the user who submitted it") from None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not any(_same(p, t) for p, t in tree):
                return True
            time.sleep(0.1)
    return True


def _ignores_sigint(pid: int) -> bool:
    """Whether the process ignores SIGINT (SigIgn in /proc/PID/status; False where unknown)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False


def _descendants(pid: int) -> list[int]:
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


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, names one process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _same(pid: int, start_time: str | None) -> bool:
    """Still alive, and not a new process that reuses the pid."""
    return _alive(pid) and _start_time(pid) == start_time


def _alive(pid: int) -> bool:
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
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_controller(pid: int) -> bool:
    """The pid still belongs to a submitit process (pids are reused once the job is gone)."""
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc at all (macOS): trust the history
    except OSError:
        return True
    return b"submitit" in cmdline
