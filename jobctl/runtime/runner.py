"""The callable submitit runs once per node inside the job.

It sets the environment explicitly, starts the GPU sampler, runs the recipe's command (under
torchrun, or bare) as an argv list -- never through a shell --, copies its output to
logs/node-<rank>.log, writes the node's outcome record, and on the first node hands the
outcomes to the recovery it was given (a callable chosen by the job services: the runtime
never imports them).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from jobctl.backends import launch
from jobctl.backends.slurm import SlurmBackend
from jobctl.errors import UsageError
from jobctl.model import JOB_FOLDER_TOKEN, RetryPolicy, per_node
from jobctl.runtime.outcome import (
    OUTCOME_WAIT_S,
    Outcome,
    read_outcomes,
    save_outcome,
    wait_for_outcomes,
    write_outcome,
)
from jobctl.store.folder import FINAL, RECOVERY_ERROR, JobFolder

# The recovery the first node runs after every node has written its outcome, named
# "module:function": called as function(JobFolder, outcomes), it decides and submits what
# follows and returns what it did (also written to successor.json/final.json).
Recovery = Callable[[JobFolder, list], "dict | None"]


def resolve(name: str) -> Recovery:
    """The function a "module:function" name refers to."""
    import importlib

    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


@dataclass
class NodeRunner:
    """Everything a node needs, picklable: submitit sends it to the nodes.

    Checkpointable: on preemption or timeout submitit calls `checkpoint` and requeues it."""

    folder: str
    jobctl_id: int
    nodes: int
    gpus_per_node: int
    env: dict[str, str]
    command: list[str]
    launcher: str
    cwd: str | None = None
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    recovery: str | None = None  # "module:function" (see Recovery)
    # the user's umask when submitting, for the command's own files: jobctl submits under umask 077
    # (submitit's pickles, the scheduler's and jobctl's files in the job folder stay owner-only)
    umask: int | None = None
    # {framework, package, versions, skews}: what the rendering is for (jobs.submission._expects)
    expects: dict = field(default_factory=dict)

    def argv(self, node_rank: int, master: str, job_id: str) -> list[str]:
        # a rendered framework file's path is written with the job-folder token (jobctl.frameworks)
        port = launch.rdzv_port(job_id)
        command = [per_node(a.replace(JOB_FOLDER_TOKEN, self.folder), node_rank, master, port) for a in self.command]
        if self.launcher == "none" and command and command[0] in ("python", "python3"):
            command[0] = sys.executable  # "python" means the job's interpreter
        return launch.launcher_argv(self.nodes, self.gpus_per_node, command, node_rank, master,
                                    port, self.launcher, rdzv_id=f"jobctl-{job_id}")

    def environment(self, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update({k: v.replace(JOB_FOLDER_TOKEN, self.folder) for k, v in self.env.items()})
        env["JOBCTL_JOB_ID"] = str(self.jobctl_id)
        env["JOBCTL_JOB_FOLDER"] = self.folder
        env["JOBCTL_NODE_RANK"] = str(rank)
        if self.policy.memory_snapshot:
            env["JOBCTL_MEMORY_SNAPSHOT"] = "1"
        if self.policy.hooks or self.policy.memory_snapshot:
            from jobctl.runtime.hooks import site_env

            env.update(site_env(env))  # every training process logs its peaks (jobctl.hooks)
        return env

    def __call__(self) -> dict:
        import submitit

        jenv = submitit.JobEnvironment()
        rank = jenv.node if jenv.num_nodes > 1 else 0
        job_id = str(jenv.job_id)
        folder = JobFolder(self.folder)
        argv = self.argv(rank, first_node_address(jenv.hostnames), job_id)
        log_path = folder.log(rank)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        folder.outcome_path(rank).unlink(missing_ok=True)  # a requeued run starts afresh
        if rank == 0:
            folder.file(FINAL).unlink(missing_ok=True)  # ... and a verdict on its last run no longer holds
        sampler = _start_sampler(folder, rank, self.policy.sample_interval_s)
        started = time.time()
        print(f"jobctl: node {rank}/{self.nodes} running: {json.dumps(argv)}", flush=True)
        for warning in version_warnings(self.expects):
            print(f"jobctl: warning: {warning}", flush=True)
        code: int | None = None
        try:
            with open(log_path, "ab", buffering=0) as log:
                try:
                    proc = subprocess.Popen(argv, env=self.environment(rank), cwd=self.cwd or os.getcwd(),
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            umask=-1 if self.umask is None else self.umask)
                except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
                    log.write(f"jobctl: cannot start {argv[0]!r}: {e}\n".encode())
                    code = 127
                else:
                    watcher = _PeerWatcher(folder, rank, job_id, proc, log) if self.nodes > 1 else None
                    for line in proc.stdout:
                        log.write(line)
                        sys.stdout.buffer.write(line)
                        sys.stdout.flush()
                    code = proc.wait()
                    if watcher is not None:
                        watcher.stop()
        finally:
            if sampler is not None:
                sampler.stop()
        signal = -code if code is not None and code < 0 else None
        outcome = _outcome(folder, rank, code, signal, time.time() - started, argv, job_id)
        if rank == 0 and self.recovery is not None:
            _recover(folder, self.nodes, self.recovery)
        elif code != 0 and self.recovery is not None:
            # A failed task can make Slurm stop the whole step (KillOnBadExit, srun -K): stay
            # until the first node has decided what follows, so that its recovery is not cut.
            deadline = time.monotonic() + OUTCOME_WAIT_S + 60
            while not folder.recovery_decided() and time.monotonic() < deadline:
                time.sleep(1.0)
        if code != 0:
            kind = outcome.failure.kind.value if outcome.failure else "failed"
            raise RuntimeError(f"the command exited with code {code} on node {rank} ({kind}; see {log_path})")
        return outcome.to_dict()  # submitit's pickled result: plain data

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self)


PEER_POLL_S = float(os.environ.get("JOBCTL_PEER_POLL_S", "5"))  # how often a node looks at the others
STOP_GRACE_S = 30.0  # SIGTERM, then this long, then SIGKILL


class _PeerWatcher:
    """Any node's failure is the job's: while this node's command runs, look at the other
    nodes' outcome records (this run's job id only); when one failed, stop this node's command
    (SIGTERM, then SIGKILL) instead of leaving it waiting in a collective until the time limit,
    so that the first node classifies the job (a CUDA OOM on node 1 is the job's OOM) and the
    ladder runs."""

    def __init__(self, folder: JobFolder, rank: int, job_id: str, proc, log):
        import threading

        self.folder, self.rank, self.job_id, self.proc, self.log = folder, rank, job_id, proc, log
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobctl-peers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _failed_peer(self) -> Outcome | None:
        try:
            outcomes = read_outcomes(self.folder)
        except Exception:  # a record being written: look again next time
            return None
        for o in outcomes:
            if o.node_rank != self.rank and o.job_id == self.job_id and o.failed:
                return o
        return None

    def _run(self) -> None:
        while not self._done.wait(PEER_POLL_S):
            peer = self._failed_peer()
            if peer is None:
                continue
            kind = peer.failure.kind.value if peer.failure else "failed"
            note = f"jobctl: node {peer.node_rank} failed ({kind}); stopping node {self.rank}'s command\n"
            try:
                self.log.write(note.encode())
            except (OSError, ValueError):
                pass
            print(note, end="", flush=True)
            self.proc.terminate()
            if self._done.wait(STOP_GRACE_S):
                return
            if self.proc.poll() is None:
                self.proc.kill()
            return


def version_warnings(expects: dict, version=None) -> list[str]:
    """What the job's environment has that its rendering was not made for: another release of the
    framework, or a release of another package known to break it (`version`: the installed
    release of a distribution, None when absent; importlib.metadata by default)."""
    if not expects.get("package"):
        return []
    if version is None:
        from importlib import metadata

        def version(dist):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                return None
    out = []
    have = version(expects["package"])
    wanted = expects.get("versions") or []
    if have is not None and wanted and not any(have == v or have.startswith(v + ".") for v in wanted):
        out.append(f"{expects['package']} {have} is installed; jobctl renders {expects.get('framework')} for "
                   f"{', '.join(wanted)}: check the rendered flags against that release")
    for dist, prefix, what in expects.get("skews") or []:
        other = version(dist)
        if have is not None and other is not None and (other == prefix or other.startswith(prefix + ".")
                                                       or other.startswith(prefix + "+")):
            out.append(f"{dist} {other} with {expects['package']} {have}: {what}")
    return out


def _start_sampler(folder: JobFolder, rank: int, interval_s: float):
    """The GPU sampler for this node; it can never stop the run (errors are swallowed)."""
    try:
        from jobctl.runtime.sampler import GPUSampler

        csv = folder.sampler_csv(rank)
        csv.parent.mkdir(parents=True, exist_ok=True)
        sampler = GPUSampler(csv, interval_s=interval_s, node_rank=rank)
        sampler.start()
        return sampler
    except Exception as e:  # monitoring is best effort
        print(f"jobctl: GPU sampler not started: {e}", flush=True)
        return None


def _outcome(folder: JobFolder, rank: int, code, signal, duration_s: float, argv, job_id: str) -> Outcome:
    try:
        return write_outcome(folder, rank, code, signal, duration_s, argv, job_id)
    except Exception as e:  # the record is best effort; the exit code still decides the job's state
        record = Outcome(rank, code, signal, round(duration_s, 3), job_id, tuple(argv),
                         error=f"outcome classification failed: {e}")
        save_outcome(folder, record)
        return record


def _recover(folder: JobFolder, nodes: int, recovery: str) -> None:
    """First node, after the others have written their outcome: what follows (the OOM ladder)."""
    try:
        done = resolve(recovery)(folder, wait_for_outcomes(folder, nodes))
        if done:
            print(f"jobctl: {json.dumps({k: v for k, v in done.items() if k != 'failure'}, default=str)}", flush=True)
    except Exception as e:  # recovery must never hide the original failure
        folder.write_text(RECOVERY_ERROR, traceback.format_exc())
        print(f"jobctl: recovery failed: {e}", flush=True)


def first_node_address(hostnames: list[str]) -> str:
    """An address the other nodes can reach the first node at: its name if it resolves,
    else Slurm's NodeAddr for it (nodes named in slurm.conf but not in DNS)."""
    host = hostnames[0] if hostnames else socket.gethostname()
    try:
        socket.gethostbyname(host)
        return host
    except OSError:
        pass

    try:
        addr = SlurmBackend().node_address(host)
    except Exception:  # noqa: BLE001 - no Slurm to ask: fall through to the error below
        addr = None
    if addr:
        return addr
    raise UsageError(f"cannot find an address for the first node {host!r}")
