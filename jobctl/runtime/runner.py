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
from jobctl.model import CHECKPOINT_DIR_TOKEN, FRAMEWORK_ON_PYTHONPATH, JOB_FOLDER_TOKEN, NODE_NAME, RETRY_TABLE, \
    Failure, FailureKind, RetryPolicy, per_node
from jobctl.runtime import progress as prog
from jobctl.runtime.outcome import (
    OUTCOME_WAIT_S,
    Outcome,
    read_outcomes,
    save_outcome,
    wait_for_outcomes,
    write_outcome,
)
from jobctl.store.folder import CHECKPOINTS, FINAL, RECOVERY_ERROR, JobFolder

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
    # the chain's checkpoint folder (the first attempt's <job folder>/checkpoints; None: this
    # job's), and the hang thresholds in seconds (planner/resilience.py hang_thresholds; 0: off)
    checkpoint_dir: str | None = None
    hang_after_s: float = 0.0
    hang_first_s: float = 0.0

    def checkpoints(self) -> str:
        return self.checkpoint_dir or os.path.join(self.folder, CHECKPOINTS)

    def _fill(self, text: str) -> str:
        return text.replace(JOB_FOLDER_TOKEN, self.folder).replace(CHECKPOINT_DIR_TOKEN, self.checkpoints())

    def argv(self, node_rank: int, master: str, job_id: str) -> list[str]:
        # a rendered framework file's path is written with the job-folder token (jobctl.frameworks)
        port = launch.rdzv_port(job_id)
        command = [per_node(self._fill(a), node_rank, master, port) for a in self.command]
        if self.launcher == "none" and command and command[0] in ("python", "python3"):
            command[0] = sys.executable  # "python" means the job's interpreter
        return launch.launcher_argv(self.nodes, self.gpus_per_node, command, node_rank, master,
                                    port, self.launcher, rdzv_id=f"jobctl-{job_id}")

    def environment(self, rank: int, resume: tuple[int, str] | None = None) -> dict[str, str]:
        """The command's environment: the job's variables, where it is, its checkpoint folder and
        whether to resume (`resume`: the newest checkpoint's step and path), and the
        sitecustomize that registers the stack-dump signal (and the hooks, when on)."""
        from jobctl.runtime.hooks import site_env, sitecustomize_dir

        env = dict(os.environ)
        env.update({k: self._fill(v) for k, v in self.env.items()})
        env["JOBCTL_JOB_ID"] = str(self.jobctl_id)
        env["JOBCTL_JOB_FOLDER"] = self.folder
        env["JOBCTL_NODE_RANK"] = str(rank)
        env["JOBCTL_CHECKPOINT_DIR"] = self.checkpoints()
        env["JOBCTL_RESUME"] = "1" if resume else "0"
        for key in ("JOBCTL_RESUME_STEP", "JOBCTL_RESUME_FROM"):
            env.pop(key, None)
        if resume:
            env["JOBCTL_RESUME_STEP"], env["JOBCTL_RESUME_FROM"] = str(resume[0]), resume[1]
        env["JOBCTL_STACK_SIGNAL"] = str(int(prog.STACK_SIGNAL))
        if env.get(FRAMEWORK_ON_PYTHONPATH) == "1":  # a rendered module the command imports
            path = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = os.path.join(self.folder, "framework") + (os.pathsep + path if path else "")
        if self.policy.memory_snapshot:
            env["JOBCTL_MEMORY_SNAPSHOT"] = "1"
        if self.policy.hooks or self.policy.memory_snapshot:
            env.update(site_env(env))  # every training process logs its peaks (jobctl.hooks)
        else:
            path = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = sitecustomize_dir() + (os.pathsep + path if path else "")
        return env

    def __call__(self) -> dict:
        import submitit

        jenv = submitit.JobEnvironment()
        rank = jenv.node if jenv.num_nodes > 1 else 0
        job_id = str(jenv.job_id)
        folder = JobFolder(self.folder)
        host = _node_name(jenv.hostnames, rank)
        argv = self.argv(rank, first_node_address(jenv.hostnames), job_id)
        resume = _checkpoint_folder(self.checkpoints())
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
        beats = folder.file(prog.HEARTBEAT_DIR)
        beats.mkdir(mode=0o700, exist_ok=True)
        progress = prog.Progress(self.hang_after_s, self.hang_first_s, beats, publish=beats / f"runner-node{rank}")
        hang = None
        try:
            with open(log_path, "ab", buffering=0) as log:
                if resume:
                    note = f"jobctl: resuming from the chain's checkpoint of step {resume[0]} ({resume[1]})\n"
                    log.write(note.encode())
                    print(note, end="", flush=True)
                try:
                    proc = subprocess.Popen(argv, env=self.environment(rank, resume), cwd=self.cwd or os.getcwd(),
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            umask=-1 if self.umask is None else self.umask)
                except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
                    log.write(f"jobctl: cannot start {argv[0]!r}: {e}\n".encode())
                    code = 127
                else:
                    watcher = _PeerWatcher(folder, rank, job_id, proc, log) if self.nodes > 1 else None
                    hang = _HangWatch(folder, rank, proc, log, progress) if self.hang_after_s or self.hang_first_s \
                        else None
                    for line in proc.stdout:
                        log.write(line)
                        sys.stdout.buffer.write(line)
                        sys.stdout.flush()
                        progress.line(line.decode("utf-8", "replace"))
                        if hang is not None:
                            hang.copy(line)
                    code = proc.wait()
                    if watcher is not None:
                        watcher.stop()
                    if hang is not None:
                        hang.stop()
        finally:
            if sampler is not None:
                sampler.stop()
        signal = -code if code is not None and code < 0 else None
        saved = _checkpoint_folder(self.checkpoints())
        outcome = _outcome(folder, rank, code, signal, time.time() - started, argv, job_id,
                           hang=hang.verdict if hang is not None else None, host=host,
                           last_step=progress.last_step, checkpoint_step=saved[0] if saved else None)
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
            _say(self.log, f"jobctl: node {peer.node_rank} failed ({kind}); stopping node {self.rank}'s command\n")
            _stop(self.proc, self._done)
            return


def _say(log, text: str) -> None:
    """A line of jobctl's own into the node's log and the job's output."""
    try:
        log.write(text.encode())
    except (OSError, ValueError):
        pass
    print(text, end="", flush=True)


def _stop(proc, done) -> None:
    """Stop a node's command: SIGTERM, then SIGKILL after STOP_GRACE_S unless it ended
    (`done`: set when the runner saw it end)."""
    proc.terminate()
    if not done.wait(STOP_GRACE_S) and proc.poll() is None:
        proc.kill()


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


def _outcome(folder: JobFolder, rank: int, code, signal, duration_s: float, argv, job_id: str,
             hang: str | None = None, **more) -> Outcome:
    """The node's outcome record; a hang the watchdog stopped is HANG, whatever the log says
    (the stop itself makes the command fail)."""
    verdict = None if hang is None else Failure(FailureKind.HANG, f"hang: {hang}", hang, RETRY_TABLE[FailureKind.HANG])
    try:
        return write_outcome(folder, rank, code, signal, duration_s, argv, job_id, verdict, **more)
    except Exception as e:  # the record is best effort; the exit code still decides the job's state
        record = Outcome(rank, code, signal, round(duration_s, 3), job_id, tuple(argv),
                         error=f"outcome classification failed: {e}")
        save_outcome(folder, record)
        return record


def _node_name(hostnames: list[str], rank: int) -> str | None:
    """This node's name as the scheduler knows it (SLURMD_NODENAME), else as submitit lists it."""
    name = os.environ.get("SLURMD_NODENAME") or (hostnames[rank] if rank < len(hostnames) else None) \
        or socket.gethostname()
    return name if name and NODE_NAME.fullmatch(name) else None


def _checkpoint_folder(path: str) -> tuple[int, str] | None:
    """The chain's checkpoint folder made (owner-only, its path checked: it may be on a shared
    file system) and its newest checkpoint, or None."""
    from pathlib import Path

    from jobctl.store.private import private_root

    try:
        private_root(Path(path), "the chain's checkpoint folder")
    except Exception as e:  # noqa: BLE001 - the job runs without resuming rather than not at all
        print(f"jobctl: warning: {e}", flush=True)
        return None
    return prog.latest_checkpoint(path)


class _HangWatch:
    """The watchdog of a node's command: when `progress` stalls past its threshold, the stacks
    of every Python process under the command go to stacks/node<R>.txt, then the command is
    stopped (SIGTERM, then SIGKILL) and `verdict` says why."""

    POLL_S = float(os.environ.get("JOBCTL_HANG_POLL_S", "2"))

    def __init__(self, folder: JobFolder, rank: int, proc, log, progress: prog.Progress):
        import threading

        self.folder, self.rank, self.proc, self.log, self.progress = folder, rank, proc, log, progress
        self.verdict: str | None = None
        self._copy_to = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobctl-hang", daemon=True)
        self._thread.start()

    def copy(self, line: bytes) -> None:
        """A line of output while the stacks are being printed: into the stacks file too."""
        f = self._copy_to
        if f is not None:
            try:
                f.write(line)
            except (OSError, ValueError):
                pass

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._done.wait(self.POLL_S):
            idle = self.progress.stalled()
            if idle is None:
                continue
            self.verdict = self.progress.verdict(idle)
            _say(self.log, f"jobctl: hang on node {self.rank}: {self.verdict}; dumping stacks, then stopping\n")
            stacks = self.folder.file(prog.STACKS_DIR, f"node{self.rank}.txt")
            stacks.parent.mkdir(mode=0o700, exist_ok=True)
            with open(stacks, "ab") as f:
                f.write(f"jobctl: {self.verdict}\n".encode())
                self._copy_to = f
                try:
                    how = prog.dump_stacks(self.proc.pid, stacks)
                except Exception as e:  # noqa: BLE001 - stacks are evidence, the stop is what matters
                    how = f"failed: {e}"
                self._done.wait(prog.STACK_WAIT_S)
                self._copy_to = None
            _say(self.log, f"jobctl: stacks of node {self.rank} ({how}) in {stacks}\n")
            _stop(self.proc, self._done)
            return


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
