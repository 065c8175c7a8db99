"""Slurm: the only code that runs sbatch, sacct, scancel, scontrol and sinfo.

Jobs are submitted through submitit's SlurmExecutor (one task per node; several jobs of equal
resources as one job array, so one sbatch call). States come from one batched sacct query,
bounded by the earliest submit time (Slurm reuses job ids). The sbatch script jobctl keeps
and shows is the one submitit itself writes: after a submission its own file, for a dry run
the file submitit writes when its sbatch is a stand-in that only prints a job id
(`render`), since submitit has no public renderer.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from jobctl.backends import discover as d
from jobctl.backends.base import JobRef, SubmissionUncertain, SubmitRequest, Submitted
from jobctl.errors import SchedulerError, UsageError
from jobctl.model import JobStatus, Scheduler
from jobctl.store.folder import ARRAY_DIR
from jobctl.store.private import owner_only

TIMEOUT_S = 60.0
# Seconds before the time limit at which Slurm signals the job (submitit's USR2: checkpoint
# and requeue); the same for the dry run's script, so it equals the submitted one.
SIGNAL_DELAY_S = 30
MAX_NUM_TIMEOUT = 3  # submitit requeues a timed-out or preempted job at most this often
SACCT_FIELDS = "JobID,State,ExitCode,Start,End,NodeList,Reason"
SACCT_SLACK_S = 60.0  # clock skew between this machine and slurmctld, for sacct's -S bound

# What `describe` and `cluster_name` ask (backends/discover.py parses the answers).
SINFO_ARGV = ["sinfo", "-h", "-o", "%P|%a|%l|%D|%c|%m|%G|%N"]
PARTITION_ARGV = ["scontrol", "show", "partition", "-o"]
NODE_ARGV = ["scontrol", "show", "node", "-o"]
CONFIG_ARGV = ["scontrol", "show", "config"]
TOPOLOGY_ARGV = ["scontrol", "show", "topology"]

Run = Callable[[list[str], bool], str]  # (argv, required) -> stdout; SchedulerError on failure


# The most a Slurm command's answer may hold (a sacct of every job of a busy week is a few MiB).
MAX_ANSWER_BYTES = 32 << 20


def run_here(argv: list[str], required: bool = True, timeout_s: float = TIMEOUT_S) -> str:
    """Run a Slurm command on this machine (an argv list, never a shell); its stdout, read as
    UTF-8 with undecodable bytes replaced and at most MAX_ANSWER_BYTES of it (scheduler output
    is input). SchedulerError when it is missing, hangs, fails or answers more than that (or ""
    for a command not `required`)."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        if not required:
            return ""
        raise SchedulerError(f"`{argv[0]}` is not installed on this machine",
                             hint="run jobctl where Slurm's client commands work (a login node), or use "
                                  "--cluster local") from None
    try:
        out, err = _bounded(p, timeout_s)
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"`{' '.join(argv[:3])}` did not answer within {timeout_s:g} s",
                             hint="check `scontrol ping`, then try again") from None
    if out is None:
        raise SchedulerError(f"`{' '.join(argv[:3])}` answered more than {MAX_ANSWER_BYTES >> 20} MiB",
                             hint="this is not what Slurm answers: check the `sacct`/`squeue` first on PATH")
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if p.returncode != 0:
        if not required:
            return ""
        tail = (stderr.strip() or stdout.strip() or f"exit code {p.returncode}").splitlines()[-1]
        raise SchedulerError(f"{argv[0]} failed (exit {p.returncode}): {tail[:300]}",
                             hint="is slurmctld up? (`scontrol ping`); is SLURM_CONF set?")
    return stdout


def _bounded(p: subprocess.Popen, timeout_s: float) -> tuple[bytes | None, bytes]:
    """(stdout, stderr) of a running command, or (None, ...) once stdout passes MAX_ANSWER_BYTES
    (the command is then killed); TimeoutExpired after `timeout_s`."""
    import selectors
    import time

    deadline = time.monotonic() + timeout_s
    chunks: dict = {p.stdout: [], p.stderr: []}
    sizes = {p.stdout: 0, p.stderr: 0}
    with selectors.DefaultSelector() as sel:
        for stream in chunks:
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                p.kill()
                p.wait()
                raise subprocess.TimeoutExpired(p.args, timeout_s)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                sizes[key.fileobj] += len(data)
                if sizes[key.fileobj] > MAX_ANSWER_BYTES:
                    p.kill()
                    p.wait()
                    return None, b""
                chunks[key.fileobj].append(data)
    p.wait()
    return b"".join(chunks[p.stdout]), b"".join(chunks[p.stderr])


class SlurmBackend:
    """A Slurm cluster this machine can reach with Slurm's client commands (or, for the
    read-only `describe`, through `run`: the same commands over SSH)."""

    scheduler = Scheduler.SLURM

    def __init__(self, run: Run | None = None):
        self._run = run or (lambda argv, required=True: run_here(argv, required))

    # -- reachability --------------------------------------------------------------------

    def check(self) -> None:
        if shutil.which("sbatch") is None:
            raise SchedulerError("cannot submit: sbatch is not installed on this machine",
                                 hint="run jobctl where Slurm's client commands work (a login node), or "
                                      "use --cluster local")
        try:
            p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=TIMEOUT_S)
        except (FileNotFoundError, subprocess.TimeoutExpired) as e:
            raise SchedulerError(f"cannot reach the Slurm controller: {e}") from None
        if p.returncode != 0 or "UP" not in p.stdout:
            detail = (p.stdout + p.stderr).strip().splitlines()
            raise SchedulerError("cannot submit: the Slurm controller is not answering"
                                 + (f" ({detail[-1]})" if detail else ""),
                                 hint="check `scontrol ping` and SLURM_CONF, then submit again")

    # -- submission ---------------------------------------------------------------------------

    @staticmethod
    def _executor(folder: Path, parameters: dict):
        import submitit

        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_NUM_TIMEOUT)
        ex.update_parameters(**parameters, signal_delay_s=SIGNAL_DELAY_S)
        return ex

    @staticmethod
    def _plan(requests: Sequence[SubmitRequest], cwd: str | None) -> tuple[Path, dict]:
        """Where submitit keeps its files (a job array's own folder beside the jobs') and its
        parameters, the same for a submission and for its dry run."""
        exec_folder = exec_folder_for([r.folder.path for r in requests])
        if not SAFE_PATH.fullmatch(str(exec_folder)):
            # submitit writes the folder into the script's srun line unquoted
            bad = sorted({c for c in str(exec_folder) if not SAFE_PATH.fullmatch(c)})
            raise UsageError(f"the job folder {str(exec_folder)!r} holds characters the sbatch script's shell would "
                             f"act on ({', '.join(map(repr, bad))}): submitit writes it there unquoted",
                             hint="choose a workdir (inventory `workdir:`, or JOBCTL_HOME) whose path has only letters, "
                                  "digits and / . _ + , @ = -")
        params = dict(requests[0].parameters)
        # what finds the job at Slurm when sbatch's answer was lost (a timeout, a kill):
        # its folder, unique to this history and job (reconcile)
        params["comment"] = comment_for(exec_folder)
        if cwd:
            params["additional_parameters"] = {**params.get("additional_parameters", {}), "chdir": cwd}
        return exec_folder, params

    def _submit(self, exec_folder: Path, params: dict, runners: list) -> list:
        with owner_only():  # submitit's pickles hold the job's environment
            if len(runners) > 1:
                os.mkdir(exec_folder, 0o700)  # made here, in the first job's owner-only folder
            ex = self._executor(exec_folder, params)
            if len(runners) == 1:
                return [ex.submit(runners[0])]
            with ex.batch():
                return [ex.submit(r) for r in runners]

    def submit(self, requests: Sequence[SubmitRequest], cwd: str | None = None) -> list[Submitted]:
        """One sbatch call: a single job, or a job array for several with equal parameters.
        Jobs run in `cwd` (sbatch --chdir), else where jobctl runs."""
        import submitit

        exec_folder, params = self._plan(requests, cwd)
        try:
            jobs = self._submit(exec_folder, params, [r.runner for r in requests])
        except (submitit.core.utils.FailedSubmissionError, UnicodeDecodeError) as e:
            # sbatch exited 0 with an answer that names no job id (or is not text): the job may
            # exist; its comment finds it (`jobctl status`)
            said = str(e).split("\n")[0][:200] if isinstance(e, submitit.core.utils.FailedSubmissionError) else \
                "bytes that are not UTF-8"
            raise SubmissionUncertain(f"sbatch's answer names no job id ({said})",
                                      hint="`jobctl status` looks for it at Slurm (by its comment) and records what it "
                                           "finds; do not submit again before that") from None
        except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError, OSError) as e:
            message = _sbatch_message(e)
            if any(word in message for word in UNCERTAIN):
                raise SubmissionUncertain(
                    f"sbatch did not answer clearly ({message}): Slurm may have made the job",
                    hint="`jobctl status` looks for it at Slurm (by its comment) and records what it finds; "
                         "do not submit again before that") from None
            raise SchedulerError(f"the scheduler refused the job: {message}",
                                 hint="check the partition, GPU count and time limit against `sinfo`, or run "
                                      "with --dry-run --check") from None
        out = []
        for job in jobs:
            try:
                script = job.paths.submission_file.read_text(encoding="utf-8")
            except OSError:
                script = None
            out.append(Submitted(str(job.job_id), exec_folder, {"sbatch": script}))
        return out

    def render(self, requests: Sequence[SubmitRequest], cwd: str | None = None) -> str:
        """The sbatch script submitit would write for `requests` (one job, or an array), made
        by submitit itself: its executor submits to a stand-in `sbatch` (first on PATH for this
        call) that only prints a job id, in a scratch folder that holds the real path below it
        (so submitit quotes every path as it will quote the real one); the scratch prefix is then
        taken out, inside quotes as outside: the script shown is the script submitted."""
        with tempfile.TemporaryDirectory(prefix="jobctl-render-") as tmp:
            stand_in = Path(tmp) / "bin" / "sbatch"
            stand_in.parent.mkdir()
            stand_in.write_text("#!/bin/sh\necho 'Submitted batch job 1'\n")
            stand_in.chmod(0o700)
            prefix = Path(tmp) / "real"
            scratch = [replace(r, folder=type(r.folder)(prefix / Path(os.path.abspath(r.folder.path)).relative_to("/")))
                       for r in requests]
            os.makedirs(scratch[0].folder.path, mode=0o700)
            exec_folder, params = self._plan(scratch, cwd)
            with _path_first(stand_in.parent):
                job = self._submit(exec_folder, params, [_nothing] * len(scratch))[0]
            text = job.paths.submission_file.read_text(encoding="utf-8")
        return text.replace(str(prefix), "")

    def test_only(self, script: str) -> tuple[bool, str]:
        """`sbatch --test-only` of the very script: does Slurm accept it now (no job made)?"""
        with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="jobctl-test-only-", delete=False) as f:
            f.write(script)
        try:
            p = subprocess.run(["sbatch", "--test-only", f.name], capture_output=True, text=True, timeout=TIMEOUT_S)
        except FileNotFoundError:
            raise SchedulerError("sbatch is not installed here", hint="run jobctl on a machine where Slurm's "
                                 "client commands work, or use --cluster local") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"sbatch --test-only did not answer within {TIMEOUT_S:g} s") from None
        finally:
            os.unlink(f.name)
        return p.returncode == 0, (p.stdout + p.stderr).strip()

    # -- asking about jobs -------------------------------------------------------------------

    def refresh(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]:
        """States of many jobs with ONE sacct call, bounded by the earliest submit time (Slurm
        reuses job ids, so an unbounded query can return an older job's row). A job sacct has
        no row for yet is PENDING."""
        ids = sorted({j.scheduler_job_id for j in jobs if j.scheduler_job_id})
        odd = {i: JobStatus("UNKNOWN", reason="not a Slurm job id") for i in ids if not valid_job_id(i)}
        ids = [i for i in ids if i not in odd]
        if not ids:
            return odd
        # created_at is written before sbatch is called: never after the job's own submit time
        since = min(j.created_at for j in jobs if j.scheduler_job_id)
        # -D: every run of a requeued job (a node failure, a preemption), not only the last
        argv = ["sacct", "-n", "-P", "-X", "-D", "-o", SACCT_FIELDS, "-j", ",".join(ids), "-S", sacct_time(since)]
        found = parse_sacct(self._run(argv, True))
        # just after sbatch, sacct has no row for up to a second (slurmdbd lags slurmctld)
        return {**odd, **{i: found.get(i) or JobStatus("PENDING", reason="not yet in accounting") for i in ids}}

    def find(self, calls: Sequence[Sequence[str]]) -> dict[tuple, list[str]]:
        """The Slurm job ids (array tasks in index order) of sbatch calls whose answer was lost,
        by the comment jobctl gives each (comment_for): {tuple(the call's job folders): [ids]}.
        squeue knows queued and running jobs; sacct the ones that ended (when slurmdbd stores
        comments: AccountingStoreFlags=job_comment)."""
        wanted = {comment_for(exec_folder_for([Path(f) for f in call])): tuple(call) for call in calls}
        found: dict[tuple, list[str]] = {}
        lines = self._run(["squeue", "--me", "-h", "-r", "-o", "%i|%k"], True).splitlines()
        lines += self._run(["sacct", "-n", "-P", "-X", "-o", "JobID,Comment", "-S", "now-7days"], False).splitlines()
        seen: dict[tuple, set[str]] = {}
        for line in lines:
            job_id, _, comment = line.strip().partition("|")
            if comment in wanted and valid_job_id(job_id) and job_id not in seen.setdefault(wanted[comment], set()):
                seen[wanted[comment]].add(job_id)
                found.setdefault(wanted[comment], []).append(job_id)
        return {f: sorted(ids, key=_array_index) for f, ids in found.items()}

    def cancel(self, jobs: Sequence[JobRef]) -> None:
        ids = [j.scheduler_job_id for j in jobs if j.scheduler_job_id]
        bad = [i for i in ids if not valid_job_id(i)]
        if bad:  # never an argument scancel could read as an option (`--me` cancels them all)
            raise SchedulerError(f"not a Slurm job id: {bad[0]!r}; nothing was cancelled",
                                 hint="the history holds an id no Slurm made: `jobctl history` shows the job")
        if ids:
            self._run(["scancel", "--", *ids], True)

    def keep_off(self, job_id: str, nodes: Sequence[str]) -> bool:
        """Ask Slurm to keep a pending job off `nodes` (scontrol update ExcNodeList, which a
        requeued job keeps); False when Slurm refused (the job started meanwhile) or the id or a
        name is not one Slurm makes."""
        from jobctl.model import NODE_NAME

        if not valid_job_id(job_id) or not nodes or not all(NODE_NAME.fullmatch(n) for n in nodes):
            return False
        try:
            self._run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"], True)
            return True
        except SchedulerError:
            return False

    def output_files(self, submitit_folder: Path, job_id: str, node: int) -> tuple[Path, Path]:
        from submitit.core.utils import JobPaths

        paths = JobPaths(submitit_folder, job_id=job_id, task_id=node)
        return paths.stdout, paths.stderr

    # -- the cluster -------------------------------------------------------------------------

    def node_address(self, host: str) -> str | None:
        """Slurm's NodeAddr for a node (nodes named in slurm.conf but not in DNS), or None."""
        for word in self._run(["scontrol", "show", "node", host], False).split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
        return None

    def version(self) -> str:
        """`sbatch --version`: the Slurm release the client commands are (e.g. "slurm 22.05.8")."""
        return self._run(["sbatch", "--version"], True).strip()

    def cluster_name(self) -> str | None:
        """Slurm's ClusterName (scontrol show config), or None when it does not say."""

        return d.parse_cluster_name(self._run(CONFIG_ARGV, False))

    def describe(self) -> list:
        """The cluster's partitions as they are now (sinfo and scontrol): discover.PartitionFacts."""

        sinfo = self._run(SINFO_ARGV, True)
        parts = self._run(PARTITION_ARGV, True)
        nodes = self._run(NODE_ARGV, True)
        topology = self._run(TOPOLOGY_ARGV, False)  # blocks only under topology/block (Slurm >= 23.11)
        try:
            return d.cluster_facts(sinfo, parts, nodes, topology)
        except ValueError as e:
            raise SchedulerError(f"cannot read Slurm's answer: {e}") from e


def _nothing() -> None:
    """What the dry run's stand-in submission runs: it never runs."""


@contextlib.contextmanager
def _path_first(folder: Path):
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{folder}{os.pathsep}{old}"
    try:
        yield
    finally:
        os.environ["PATH"] = old


def parse_sacct(text: str) -> dict[str, JobStatus]:
    """sacct -n -P -X -o JobID,State,ExitCode,Start,End,NodeList,Reason -> {job id: JobStatus}.
    Lines whose job id is not one Slurm makes (valid_job_id) are skipped; a state jobctl does not
    know is UNKNOWN (model.scheduler_state); linear in the rows, however many repeat."""
    runs: dict[str, list[JobStatus]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 7:
            continue
        jid, state, code, start, end, nodes, reason = parts[:7]
        if not valid_job_id(jid):
            continue
        known = lambda v: v if v not in ("", "Unknown", "None") else None  # noqa: E731
        runs.setdefault(jid, []).append(JobStatus(state or "UNKNOWN", code or None,
                                                  reason if reason not in ("", "None") else None, known(start),
                                                  known(end), nodes or None))
    # sacct -D lists a requeued job's runs oldest first: the last is the job now
    return {jid: replace(rs[-1], earlier=tuple(rs[:-1])) for jid, rs in runs.items()}


# A job id as Slurm makes them: 123, an array task 123_4, a heterogeneous component 123+0.
_JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,4})?")


def valid_job_id(text: str) -> bool:
    """Whether `text` is a Slurm job id (and so safe as an argument: never an option)."""
    return bool(_JOB_ID.fullmatch(text))


def sacct_time(iso: str, slack_s: float = SACCT_SLACK_S) -> str:
    """A history timestamp (UTC ISO) as sacct's -S reads it: naive local wall-clock time,
    `slack_s` earlier for clock skew between this machine and slurmctld."""
    dt = datetime.fromisoformat(iso)
    if dt.tzinfo is not None:
        dt = dt.astimezone().replace(tzinfo=None)
    return (dt - timedelta(seconds=slack_s)).strftime("%Y-%m-%dT%H:%M:%S")


# sbatch's words for an answer lost on the way (the job may exist): slurm's
# slurm_strerror texts for timeouts and a controller that went away mid-call
UNCERTAIN = ("timed out", "Timed out", "Socket timed out", "Zero Bytes were transmitted",
             "Unable to contact slurm controller", "Connection reset")


# what a folder path may hold to be written into a shell line unquoted
SAFE_PATH = re.compile(r"[A-Za-z0-9/._+,@=-]+")


def exec_folder_for(folders: Sequence[Path]) -> Path:
    """Where submitit keeps the files of one sbatch call: the job's folder, or for a job array
    `array/` inside the first job's folder (owner-only, so no other user can have made it)."""
    return folders[0] if len(folders) == 1 else folders[0] / ARRAY_DIR


def comment_for(exec_folder: Path) -> str:
    """`jobctl:<the call's folder>`, unique per history and job; characters an #SBATCH line
    might split on are %-encoded (the folder path may hold spaces)."""
    from urllib.parse import quote

    return "jobctl:" + quote(str(exec_folder), safe="/._-+@,=")


def _array_index(job_id: str) -> int:
    return int(job_id.rpartition("_")[2]) if "_" in job_id and job_id.rpartition("_")[2].isdigit() else -1


def _sbatch_message(e: Exception) -> str:
    text = str(e)
    for marker in ("sbatch: error:", "error:"):
        if marker in text:
            return text[text.index(marker):].strip().splitlines()[0]
    return text.strip().splitlines()[-1] if text.strip() else type(e).__name__
