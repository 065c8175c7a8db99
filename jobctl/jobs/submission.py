"""Submission through submitit: the only module that imports submitit.

`prepare` turns a planned recipe into a `Submission` (job folder contents, Slurm
parameters, environment, command); `render` shows it for --dry-run; `submit_all` records
each job in the history, submits (one job array per group of equal resources) and records
the scheduler id. `NodeRunner` is the callable submitit runs once per node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobctl.errors import SchedulerError, UsageError

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# Seconds before the time limit at which Slurm signals the job (submitit's USR2: checkpoint
# and requeue). Also used to render the dry-run script, so it equals the submitted one.
SIGNAL_DELAY_S = 30
# What happens after a failure, by classification (runtime/classify.py): the OOM ladder for
# CUDA OOM; timeouts and preemption use submitit's requeue (the runner is checkpointable);
# host OOM, NCCL and user errors are not retried unless configured.
DEFAULT_POLICY = {
    "max_attempts": 3,
    "retry": {"CUDA_OOM": "ladder", "HOST_OOM": "none", "NCCL": "none", "USER_ERROR": "none"},
    "memory_snapshot": False,
    "sample_interval_s": 5.0,
}


@dataclass
class Submission:
    """One job, fully resolved: what goes in its folder and what the scheduler is asked."""

    recipe_name: str
    recipe_path: str
    recipe_text: str  # the resolved recipe as YAML
    plan: object  # planner Plan
    plan_report: dict  # the `plan --json` object
    cluster: str
    partition: str
    scheduler: str  # slurm | local
    inventory_text: str
    slurm: dict  # submitit SlurmExecutor parameters (slurm) or the local subset
    env: dict[str, str]
    command: list[str]
    launcher: str
    workdir: Path
    overrides: list[str] = field(default_factory=list)
    sweep_id: str | None = None
    parent_id: int | None = None
    attempt: int = 1
    recipe_source: dict = field(default_factory=dict)  # the recipe as loaded, launch unresolved (re-planning)
    inventory_source: dict = field(default_factory=dict)
    policy: dict = field(default_factory=lambda: dict(DEFAULT_POLICY))
    token: str | None = None  # idempotency: a second submit_all with the same token submits nothing
    cwd: str | None = None  # where the job runs (Slurm starts it in sbatch's directory); None: here

    def resource_key(self) -> str:
        """Jobs with equal keys can share one job array (one sbatch call)."""
        return json.dumps({"cluster": self.cluster, "slurm": self.slurm}, sort_keys=True, default=str)


def prepare(recipe_loaded, inv_loaded, report: dict, overrides: list[str] | None = None) -> Submission:
    """A Submission from a loaded recipe, inventory and the plan `jobctl plan` chose."""
    from jobctl.config import loader as config
    from jobctl.backends import launch
    from jobctl.planner.plan import Plan

    recipe, inv = recipe_loaded.value, inv_loaded.value
    plan = Plan.from_dict(report["plan"])
    part = next(p for p in inv.partitions if p.name == report["partition"])
    launch_block = config.resolve_launch(recipe_loaded.data, report["plan"], recipe_loaded.path)
    raw = launch_block.get("command")
    if isinstance(raw, list):  # "${plan.tp}" alone resolves to an int: an argument is its text
        raw = [str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in raw]
    command = launch.command_argv(raw)
    env = launch.job_environment(plan, recipe, inv)
    env.update({str(k): str(v) for k, v in (launch_block.get("env") or {}).items()})
    scheduler = inv.scheduler
    slurm = launch.slurm_parameters(plan, recipe, inv, part) if scheduler == "slurm" else \
        {"timeout_min": launch.parse_slurm_time(recipe.resources.time, "resources.time") or launch.DEFAULT_TIME_MIN,
         "job_name": recipe.name}
    data = dict(recipe_loaded.data)
    data["launch"] = launch_block
    policy = dict(DEFAULT_POLICY, hooks=bool(launch_block.get("hooks", False)))
    return Submission(
        recipe_name=recipe.name, recipe_path=recipe_loaded.path, recipe_text=config.dump_yaml(data),
        plan=plan, plan_report=report, cluster=inv.name, partition=part.name, scheduler=scheduler,
        inventory_text=config.dump_yaml(inv_loaded.data), slurm=slurm, env=env, command=command,
        launcher=launch_block.get("launcher") or recipe.launch.launcher, workdir=jobs_root(inv),
        overrides=list(overrides or []), recipe_source=dict(recipe_loaded.data),
        inventory_source=dict(inv_loaded.data), policy=policy,
    )


def jobs_root(inv) -> Path:
    from jobctl.store.history import default_path

    if inv.workdir:
        return Path(os.path.expandvars(os.path.expanduser(inv.workdir)))
    return default_path().parent / "jobs"


# --- dry run ----------------------------------------------------------------------------------

def render(sub: Submission, folder: Path | None = None) -> dict:
    """Everything a submission would do, without doing it: sbatch script, environment, the
    command each node runs (the first node's address as the scheduler will give it)."""
    from jobctl.backends import launch

    folder = folder or (sub.workdir / f"<id>-{sub.recipe_name}")
    nodes = []
    for rank in range(sub.plan.nodes):
        argv = launch.launcher_argv(sub.plan, sub.command, rank, "<first node>", 29500, sub.launcher,
                                    rdzv_id="<job id>") if sub.launcher == "torchrun" else list(sub.command)
        nodes.append({"node_rank": rank, "argv": argv})
    out = {
        "recipe": sub.recipe_path, "cluster": sub.cluster, "partition": sub.partition, "scheduler": sub.scheduler,
        "job_folder": str(folder), "plan": sub.plan.to_dict(), "parameters": sub.slurm, "env": sub.env, "nodes": nodes,
    }
    if sub.scheduler == "slurm":
        out["sbatch"] = sbatch_script(sub, folder)
    return out


def dry_run(subs: list[Submission], check: bool = False) -> list[dict]:
    """`render` of each submission; with `check`, Slurm's answer to `sbatch --test-only` too."""
    out = [render(s) for s in subs]
    if check:
        for o, s in zip(out, subs):
            if s.scheduler == "slurm":
                ok, text = test_only(s)
                o["check"] = {"ok": ok, "sbatch": text}
    return out


def sbatch_script(sub: Submission, folder: Path) -> str:
    """The sbatch script submitit would write (its own renderer, so it is the same text)."""
    from submitit.slurm.slurm import _make_sbatch_string

    import shlex

    params = dict(sub.slurm)
    # the command submitit's SlurmExecutor itself renders (slurm.py: python -u -m submitit.core._submit)
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, signal_delay_s=SIGNAL_DELAY_S, **params)


def test_only(sub: Submission) -> tuple[bool, str]:
    """Ask Slurm whether the request could be satisfied (sbatch --test-only), no job created."""
    params = sub.slurm
    argv = ["sbatch", "--test-only", f"--nodes={params.get('nodes', 1)}",
            f"--ntasks-per-node={params.get('ntasks_per_node', 1)}", f"--time={params.get('time', 60)}"]
    for key, flag in (("partition", "--partition"), ("cpus_per_task", "--cpus-per-task"), ("mem", "--mem"),
                      ("gpus_per_node", "--gpus-per-node"), ("gres", "--gres"), ("account", "--account"),
                      ("qos", "--qos"), ("constraint", "--constraint")):
        if params.get(key) not in (None, ""):
            argv.append(f"{flag}={params[key]}")
    argv += ["--wrap", "true"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SchedulerError("sbatch is not installed here", hint="run jobctl on a machine where Slurm's "
                             "client commands work, or use --cluster local") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError("sbatch --test-only did not answer within 60 s") from None
    text = (p.stdout + p.stderr).strip()
    return p.returncode == 0, text


# --- submission -------------------------------------------------------------------------------

def check_scheduler(scheduler: str) -> None:
    """Refuse early, before anything is recorded, when the scheduler cannot be reached."""
    if scheduler != "slurm":
        return
    if shutil.which("sbatch") is None:
        raise SchedulerError("cannot submit: sbatch is not installed on this machine",
                             hint="run jobctl where Slurm's client commands work (a login node), or "
                                  "use --cluster local")
    try:
        p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise SchedulerError(f"cannot reach the Slurm controller: {e}") from None
    if p.returncode != 0 or "UP" not in p.stdout:
        detail = (p.stdout + p.stderr).strip().splitlines()
        raise SchedulerError("cannot submit: the Slurm controller is not answering"
                             + (f" ({detail[-1]})" if detail else ""),
                             hint="check `scontrol ping` and SLURM_CONF, then submit again")


def _executor(sub: Submission, folder: Path):
    import submitit

    if sub.scheduler == "slurm":
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=3)
        ex.update_parameters(**sub.slurm, signal_delay_s=SIGNAL_DELAY_S)
    else:
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=3)
        ex.update_parameters(timeout_min=sub.slurm["timeout_min"], tasks_per_node=1, nodes=1)
    return ex


def _write_folder(sub: Submission, folder: Path, job_id: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "logs").mkdir(exist_ok=True)
    (folder / "recipe.yaml").write_text(sub.recipe_text, encoding="utf-8")
    (folder / "inventory.yaml").write_text(sub.inventory_text, encoding="utf-8")
    (folder / "plan.json").write_text(json.dumps(sub.plan_report, indent=2, default=str) + "\n", encoding="utf-8")
    (folder / "recipe.json").write_text(json.dumps(sub.recipe_source, indent=2, default=str) + "\n", encoding="utf-8")
    (folder / "inventory.json").write_text(json.dumps(sub.inventory_source, indent=2, default=str) + "\n",
                                           encoding="utf-8")
    from jobctl.store.history import default_path

    (folder / "job.json").write_text(json.dumps({
        "jobctl_id": job_id, "cluster": sub.cluster, "partition": sub.partition, "scheduler": sub.scheduler,
        "parameters": sub.slurm, "env": sub.env, "command": sub.command, "launcher": sub.launcher,
        "overrides": sub.overrides, "recipe_path": sub.recipe_path, "attempt": sub.attempt,
        "parent_id": sub.parent_id, "policy": sub.policy, "history_path": str(default_path()),
        "cwd": sub.cwd or os.getcwd(),
    }, indent=2, default=str) + "\n", encoding="utf-8")
    if sub.scheduler == "slurm":
        (folder / "sbatch.sh").write_text(sbatch_script(sub, folder), encoding="utf-8")


def submit_all(subs: list[Submission], history, progress=None) -> list[dict]:
    """Record, submit and record again each submission. Equal resources share one job array.

    Ctrl-C: each job's PREPARED row is committed before submitit is called and the scheduler
    id right after, so an interruption leaves either a submitted and recorded job or a
    PREPARED row that was never submitted (shown as such by `jobctl history`).
    """
    with _token_locks([s.token for s in subs if s.token], history.path.parent):
        return _submit_all(subs, history, progress)


@contextlib.contextmanager
def _token_locks(tokens: list[str], home: Path):
    """One submission per token at a time, across processes: a second `submit --token T` started
    while the first is still talking to the scheduler waits for it, then finds its job by token
    instead of submitting another. One lock file per token (named by its digest), taken in a
    fixed order so two sweeps sharing tokens cannot deadlock."""
    import fcntl
    import hashlib

    if not tokens:
        yield
        return
    folder = home / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for digest in sorted({hashlib.sha256(t.encode()).hexdigest()[:24] for t in tokens}):
            f = stack.enter_context(open(folder / f"token-{digest}.lock", "a"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            except OSError:  # a filesystem without locks (Lustre mounted noflock): the token
                break        # check alone still makes a sequential retry safe
        yield


def _submit_all(subs: list[Submission], history, progress=None) -> list[dict]:
    import submitit

    results = []
    todo = []
    for s in subs:
        done = _submitted_before(s, history)
        if done is not None:
            results.append(done)
            if progress:
                progress(f"#{done['id']} was already submitted with this token as {s.scheduler} job "
                         f"{done['scheduler_job_id']}: not submitted again")
        else:
            todo.append(s)
    groups: dict[str, list[Submission]] = {}
    for s in todo:
        groups.setdefault(s.resource_key(), []).append(s)
    if todo:
        check_scheduler(todo[0].scheduler)
    for s in todo:
        if s.cwd and not os.path.isdir(s.cwd):
            raise UsageError(f"the job's directory {s.cwd} does not exist (any more)",
                             hint="the job runs where it was first submitted; recreate it or submit the recipe again")
    for group in groups.values():
        ids, folders = [], []
        for s in group:
            jid = history.prepare(recipe_name=s.recipe_name, recipe_text=s.recipe_text, plan=s.plan,
                                  cluster=s.cluster, scheduler=s.scheduler, partition=s.partition,
                                  recipe_path=s.recipe_path, parent_id=s.parent_id, sweep_id=s.sweep_id,
                                  attempt=s.attempt if s.parent_id else None, token=s.token,
                                  predicted_peak_bytes=s.plan_report["memory"]["total_bytes"],
                                  extra={"overrides": s.overrides})
            folder = s.workdir / f"{jid}-{s.recipe_name}"
            _write_folder(s, folder, jid)
            ids.append(jid)
            folders.append(folder)
        exec_folder = folders[0] if len(group) == 1 else folders[0].parent / f"array-{ids[0]}-{ids[-1]}"
        ex = _executor(group[0], exec_folder)
        runners = [NodeRunner.from_submission(s, f, jid) for s, f, jid in zip(group, folders, ids)]
        try:
            with _job_stdio(group[0].scheduler), _in_dir(group[0].cwd):
                if len(group) == 1:
                    jobs = [ex.submit(runners[0])]
                else:
                    with ex.batch():
                        jobs = [ex.submit(r) for r in runners]
        except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError, OSError) as e:
            reason = _sbatch_message(e)
            for jid in ids:
                history.mark_submit_failed(jid, reason)
            raise SchedulerError(f"the scheduler refused the job: {reason}",
                                 hint="check the partition, GPU count and time limit against "
                                      "`sinfo`, or run with --dry-run --check") from None
        for job, jid, folder in zip(jobs, ids, folders):
            history.mark_submitted(jid, str(job.job_id), str(folder))
            history.transition(jid, "SUBMITTED", detail=f"{group[0].scheduler} job {job.job_id}")
            (folder / "submitit.json").write_text(json.dumps({"job_id": str(job.job_id),
                                                              "submitit_folder": str(exec_folder)}) + "\n")
            results.append({"id": jid, "scheduler_job_id": str(job.job_id), "job_folder": str(folder),
                            "recipe": group[0].recipe_name, "job": job})
            if progress:
                progress(f"submitted #{jid} as {group[0].scheduler} job {job.job_id} ({folder})")
    return results


def _submitted_before(sub: Submission, history) -> dict | None:
    """The result of an earlier submission with `sub.token` (an idempotent retry), or None.

    A token whose job never reached the scheduler's answer is refused: whether sbatch ran
    cannot be known from here, and guessing could run the job twice."""
    from jobctl.store.history import State

    rec = history.find_by_token(sub.token) if sub.token else None
    if rec is None:
        return None
    if rec.scheduler_job_id:
        return {"id": rec.id, "scheduler_job_id": rec.scheduler_job_id, "job_folder": rec.job_folder,
                "recipe": rec.recipe_name, "job": None, "existing": True}
    if rec.state is State.SUBMIT_FAILED:
        raise UsageError(f"submission token {sub.token!r} belongs to job #{rec.id}, which the scheduler refused "
                         f"({rec.exit_reason or 'no reason recorded'})", hint="submit again without --token "
                         "(or with a new one)")
    raise SchedulerError(f"submission token {sub.token!r} belongs to job #{rec.id}, recorded PREPARED: an earlier "
                         "submission with it was interrupted before the scheduler's answer was recorded",
                         hint=f"check `squeue --me` for a job named {rec.recipe_name!r}; if there is none, submit "
                              "again with a new token")


@contextlib.contextmanager
def _in_dir(path: str | None):
    """Submit from `path`: the job starts (and its command runs) in sbatch's directory."""
    if not path or os.path.abspath(path) == os.getcwd():
        yield
        return
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _job_stdio(scheduler: str):
    """submitit's LocalExecutor starts the job's controller with our stdin/stdout/stderr, so
    `$(jobctl submit ... -c local)` or a pipe would wait for the job to end, and the job's
    stray output lands in the terminal. The job logs to its folder: give it /dev/null."""
    if scheduler != "local":
        yield
        return
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


def _sbatch_message(e: Exception) -> str:
    text = str(e)
    for marker in ("sbatch: error:", "error:"):
        if marker in text:
            return text[text.index(marker):].strip().splitlines()[0]
    return text.strip().splitlines()[-1] if text.strip() else type(e).__name__


# --- the job runner -----------------------------------------------------------------------------

class NodeRunner:
    """Runs once per node inside the job: sets the environment explicitly, then runs the
    recipe's command (under torchrun, or bare) with an argv list — never through a shell —
    and copies its output to logs/node-<rank>.log in the job folder.

    Checkpointable: on preemption or timeout submitit calls `checkpoint` and requeues it.
    """

    def __init__(self, folder: str, jobctl_id: int, plan: dict, env: dict[str, str], command: list[str],
                 launcher: str, policy: dict | None = None):
        self.folder = folder
        self.jobctl_id = jobctl_id
        self.plan = plan
        self.env = env
        self.command = command
        self.launcher = launcher
        self.policy = dict(policy or DEFAULT_POLICY)

    @classmethod
    def from_submission(cls, sub: Submission, folder: Path, jobctl_id: int) -> "NodeRunner":
        return cls(str(folder), jobctl_id, sub.plan.to_dict(), dict(sub.env), list(sub.command), sub.launcher,
                   sub.policy)

    def argv(self, node_rank: int, master: str, job_id: str) -> list[str]:
        from jobctl.backends import launch
        from jobctl.planner.plan import Plan

        command = list(self.command)
        if self.launcher == "none" and command and command[0] in ("python", "python3"):
            command[0] = sys.executable  # "python" means the job's interpreter
        return launch.launcher_argv(Plan.from_dict(self.plan), command, node_rank, master,
                                    launch.rdzv_port(job_id), self.launcher, rdzv_id=f"jobctl-{job_id}")

    def __call__(self) -> dict:
        import submitit

        jenv = submitit.JobEnvironment()
        rank = jenv.node if jenv.num_nodes > 1 else 0
        master = first_node_address(jenv.hostnames)
        job_id = str(jenv.job_id)
        folder = Path(self.folder)
        env = dict(os.environ)
        env.update(self.env)
        env["JOBCTL_JOB_ID"] = str(self.jobctl_id)
        env["JOBCTL_JOB_FOLDER"] = self.folder
        env["JOBCTL_NODE_RANK"] = str(rank)
        if self.policy.get("memory_snapshot"):
            env["JOBCTL_MEMORY_SNAPSHOT"] = "1"
        if self.policy.get("hooks") or self.policy.get("memory_snapshot"):
            from jobctl.runtime.hooks import site_env

            env.update(site_env(env))  # every training process logs its peaks (jobctl.hooks)
        argv = self.argv(rank, master, job_id)
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for stale in (folder / f"outcome-node{rank}.json",):  # a requeued run starts afresh
            stale.unlink(missing_ok=True)
        sampler, csv = _start_sampler(folder, rank, float(self.policy.get("sample_interval_s", 5.0)))
        started = time.time()
        print(f"jobctl: node {rank}/{self.plan['nodes']} running: {json.dumps(argv)}", flush=True)
        code: int | None = None
        try:
            with open(logs / f"node-{rank}.log", "ab", buffering=0) as log:
                try:
                    proc = subprocess.Popen(argv, env=env, cwd=os.getcwd(), stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT)
                except FileNotFoundError as e:
                    log.write(f"jobctl: cannot start {argv[0]!r}: {e}\n".encode())
                    code = 127
                else:
                    for line in proc.stdout:
                        log.write(line)
                        sys.stdout.buffer.write(line)
                        sys.stdout.flush()
                    code = proc.wait()
        finally:
            if sampler is not None:
                sampler.stop()
        signal = -code if code is not None and code < 0 else None
        outcome = _outcome(folder, rank, code, signal, time.time() - started, argv, job_id, csv)
        if rank == 0:
            _recover(folder, int(self.plan["nodes"]))
        if code != 0:
            raise RuntimeError(f"the command exited with code {code} on node {rank} "
                               f"({outcome.get('failure', {}).get('kind', 'failed')}; see {logs}/node-{rank}.log)")
        return outcome

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def _start_sampler(folder: Path, rank: int, interval_s: float):
    """The GPU sampler for this node; it can never stop the run (errors are swallowed)."""
    csv = folder / "gpu" / f"node-{rank}.csv"
    try:
        from jobctl.runtime.sampler import GPUSampler

        csv.parent.mkdir(parents=True, exist_ok=True)
        sampler = GPUSampler(csv, interval_s=interval_s, node_rank=rank)
        sampler.start()
        return sampler, csv
    except Exception as e:  # monitoring is best effort
        print(f"jobctl: GPU sampler not started: {e}", flush=True)
        return None, None


def _outcome(folder: Path, rank: int, code, signal, duration_s: float, argv, job_id: str, csv) -> dict:
    try:
        from jobctl.jobs.recovery import write_outcome

        return write_outcome(folder, rank, code, signal, duration_s, argv, job_id, csv)
    except Exception as e:  # the record is best effort; the exit code still decides the job's state
        record = {"node_rank": rank, "exit_code": code, "signal": signal, "duration_s": round(duration_s, 3),
                  "job_id": job_id, "argv": argv, "error": f"outcome classification failed: {e}"}
        (folder / f"outcome-node{rank}.json").write_text(json.dumps(record) + "\n")
        return record


def _recover(folder: Path, nodes: int) -> None:
    """First node, after the others have written their outcome: step down after a CUDA OOM."""
    try:
        from jobctl.jobs.recovery import recover, wait_for_outcomes

        done = recover(folder, wait_for_outcomes(folder, nodes))
        if done:
            print(f"jobctl: {json.dumps({k: v for k, v in done.items() if k != 'failure'})}", flush=True)
    except Exception as e:  # recovery must never hide the original failure
        import traceback

        (folder / "recovery-error.txt").write_text(traceback.format_exc())
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
        out = subprocess.run(["scontrol", "show", "node", host], capture_output=True, text=True, timeout=30).stdout
        for word in out.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
    except (OSError, subprocess.TimeoutExpired):
        pass
    raise UsageError(f"cannot find an address for the first node {host!r}")
