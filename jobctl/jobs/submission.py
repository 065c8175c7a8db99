"""Submitting planned recipes: `prepare` turns a plan into a `Submission` (the job folder's
contents, the scheduler's parameters, the environment, the command); `dry_run` shows it;
`submit_all` records each job in the history, writes its folder, submits through the
scheduler's backend (one job array per group of equal resources) and records the scheduler id.
`submit` is the entry point for any cluster: one reached over SSH is submitted on its login node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from jobctl.backends import launch
from jobctl.jobs import environment
from jobctl.backends.base import SubmissionUncertain, SubmitRequest
from jobctl.config import loader as config
from jobctl.errors import ConfigError, ConfigIssue, SchedulerError, UsageError
from jobctl.jobs import placement
from jobctl.model import CHECKPOINT_DIR_TOKEN, JOB_FOLDER_TOKEN, JobState, RetryPolicy, Scheduler, per_node
from jobctl.planner import inputs as planner_inputs
from jobctl.planner.plan import Plan
from jobctl.planning import framework_block
from jobctl.runtime.runner import NodeRunner
from jobctl.store import folder as layout
from jobctl.store.folder import JobFolder
from jobctl.store.paths import history_path, jobs_root
from jobctl.store.private import private_root

# The recovery a job's first node runs after a failure, named (not imported): recovery
# submits through this module, so the runner gets it as a name it resolves in the job.
RECOVERY = "jobctl.jobs.recovery:recover"


@dataclass
class Submission:
    """One job, fully resolved: what goes in its folder and what the scheduler is asked."""

    recipe_name: str
    recipe_path: str
    recipe_text: str  # the resolved recipe as YAML
    plan: Plan
    plan_report: dict  # the `plan --json` object
    cluster: str
    partition: str
    scheduler: Scheduler
    inventory_text: str
    parameters: dict  # submitit's executor parameters (Slurm's, or the local subset)
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
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    token: str | None = None  # idempotency: a second submit_all with the same token submits nothing
    cwd: str | None = None  # where the job's command runs; None: where jobctl runs
    framework_files: dict[str, str] = field(default_factory=dict)  # rendered configuration files by name
    # the framework's package and the releases its rendering is for (the runner checks the job's own)
    expects: dict = field(default_factory=dict)
    # the chain's checkpoint folder (None: this job's own <job folder>/checkpoints, a chain's first)
    checkpoint_dir: str | None = None
    hang_first_s: float = 0.0  # the runner's hang watchdog (planner/resilience.py hang_thresholds)
    hang_after_s: float = 0.0

    def checkpoints(self, folder: JobFolder) -> str:
        return self.checkpoint_dir or str(folder.file(layout.CHECKPOINTS))

    def resource_key(self) -> str:
        """Jobs with equal keys can share one job array (one sbatch call)."""
        return json.dumps({"cluster": self.cluster, "parameters": self.parameters, "cwd": self.cwd},
                          sort_keys=True, default=str)

    def runner(self, folder: JobFolder, jobctl_id: int) -> NodeRunner:
        return NodeRunner(str(folder.path), jobctl_id, self.plan.nodes, self.plan.gpus_per_node, dict(self.env),
                          list(self.command), self.launcher, cwd=self.cwd or os.getcwd(), policy=self.policy,
                          recovery=RECOVERY, umask=current_umask(), expects=dict(self.expects),
                          checkpoint_dir=self.checkpoints(folder), hang_after_s=self.hang_after_s,
                          hang_first_s=self.hang_first_s)

    def request(self, folder: JobFolder, jobctl_id: int) -> SubmitRequest:
        return SubmitRequest(self.runner(folder, jobctl_id), folder, self.parameters, self.recipe_name)


def current_umask() -> int:
    """This process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def prepare(recipe_loaded, inv_loaded, report: dict, overrides: list[str] | None = None) -> Submission:
    """A Submission from a loaded recipe, inventory and the plan `jobctl plan` chose."""
    recipe, inv = recipe_loaded.value, inv_loaded.value
    plan = Plan.from_dict(report["plan"], "the plan report")
    part = next(p for p in inv.partitions if p.name == report["partition"])
    fw = report.get("framework") or framework_block(planner_inputs.workload(recipe, inv), plan)
    launch_block = config.resolve_launch(recipe_loaded.data, report["plan"], recipe_loaded.path, fw)
    raw = launch_block.get("command")
    if isinstance(raw, list):  # "${plan.tp}" alone resolves to an int: an argument is its text
        raw = [str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in raw]
    command = launch.command_argv(raw)
    env = environment.job_environment(plan, recipe, inv, framework_env=fw.get("env") or {})
    env.update({str(k): str(v) for k, v in (launch_block.get("env") or {}).items()})
    _no_nul(recipe_loaded.path, command, env)
    scheduler = Scheduler(inv.scheduler)
    if scheduler is Scheduler.SLURM:
        parameters = environment.slurm_parameters(plan, recipe, inv, part)
    else:
        minutes = launch.parse_slurm_time(recipe.resources.time, "resources.time") or environment.DEFAULT_TIME_MIN
        parameters = {"timeout_min": minutes, "job_name": layout.slug(recipe.name)}
    data = dict(recipe_loaded.data)
    data["launch"] = launch_block
    first, after = _hang(report, recipe)
    return Submission(
        recipe_name=recipe.name, recipe_path=recipe_loaded.path, recipe_text=config.dump_yaml(data),
        plan=plan, plan_report=report, cluster=inv.name, partition=part.name, scheduler=scheduler,
        inventory_text=config.dump_yaml(inv_loaded.data), parameters=parameters, env=env, command=command,
        launcher=launch_block.get("launcher") or recipe.launch.launcher,
        workdir=jobs_root(inv.workdir), overrides=list(overrides or []), recipe_source=dict(recipe_loaded.data),
        inventory_source=dict(inv_loaded.data), policy=RetryPolicy(hooks=bool(launch_block.get("hooks", False))),
        framework_files=_framework_files(fw), expects=_expects(fw.get("name") or ""),
        hang_first_s=first, hang_after_s=after,
    )


def _hang(report: dict, recipe) -> tuple[float, float]:
    """The hang watchdog's thresholds: the plan's (its resilience block), else from the recipe."""
    from jobctl.planner.resilience import hang_thresholds

    r = report.get("resilience") or {}
    if "hang_after_s" in r:
        return float(r.get("hang_first_step_s") or 0.0), float(r["hang_after_s"] or 0.0)
    return hang_thresholds(None, None, recipe.resources.hang_after)


def _expects(name: str) -> dict:
    """What the runner checks in the job's environment: the framework's package, the releases
    jobctl renders for, and known breakages with other packages' releases."""
    from jobctl import frameworks

    try:
        caps = frameworks.get(name).caps
    except Exception:  # noqa: BLE001 - an unknown name renders nothing to check
        return {}
    if not caps.package:
        return {}
    return {"framework": caps.name, "package": caps.package, "versions": list(caps.versions),
            "skews": [list(s) for s in caps.skews]}


def _no_nul(path: str, command: list[str], env: dict[str, str]) -> None:
    """A NUL cannot be in an argument or an environment variable (the job's exec would fail on
    the node): checked once `${...}` are resolved, where it may first appear."""
    for where, text in [*((f"launch.command[{i}]", a) for i, a in enumerate(command)),
                        *((f"the environment ({k})", f"{k}={v}") for k, v in env.items())]:
        if "\x00" in text:
            raise ConfigError([ConfigIssue(path, None, where, "holds a NUL character once its ${...} are resolved; "
                                                              "an argument or environment value cannot")])


FILE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _framework_files(fw: dict) -> dict[str, str]:
    """The rendered framework files by name (written to <job folder>/framework/<name>)."""
    files = dict(fw.get("files") or {})
    for key in files:
        if not FILE_KEY.match(key):
            raise UsageError(f"framework file name {key!r} is not a plain file name")
    return files


# --- dry run ----------------------------------------------------------------------------------

FIRST_NODE = "<first-node>"  # what the dry run shows for the address Slurm gives the first node


def render(sub: Submission, script: str | None = None) -> dict:
    """Everything a submission would do, without doing it: the environment, the command each
    node runs (the first node's address as the scheduler will give it) and `script`, the sbatch
    script submitit writes for it (see dry_run)."""
    nodes = []
    where = str(_placeholder(sub).path)
    checkpoints = sub.checkpoints(_placeholder(sub))
    command = [a.replace(JOB_FOLDER_TOKEN, where).replace(CHECKPOINT_DIR_TOKEN, checkpoints) for a in sub.command]
    for rank in range(sub.plan.nodes):
        node_command = [per_node(a, rank, FIRST_NODE, 29500) for a in command]
        argv = launch.launcher_argv(sub.plan.nodes, sub.plan.gpus_per_node, node_command, rank, FIRST_NODE,
                                    29500, sub.launcher, rdzv_id="<job-id>") if sub.launcher == "torchrun" \
            else node_command
        nodes.append({"node_rank": rank, "argv": argv})
    out = {
        "recipe": sub.recipe_path, "cluster": sub.cluster, "partition": sub.partition,
        "scheduler": sub.scheduler.value, "job_folder": where, "plan": sub.plan.to_dict(),
        "parameters": sub.parameters, "env": {k: v.replace(JOB_FOLDER_TOKEN, where) for k, v in sub.env.items()},
        "nodes": nodes, "framework_files": {k: f"{where}/{layout.FRAMEWORK_DIR}/{k}" for k in sub.framework_files},
        "checkpoint_dir": checkpoints, "hang": {"first_step_s": sub.hang_first_s, "after_s": sub.hang_after_s},
    }
    if script is not None:
        out["sbatch"] = script
    return out


def sweep_notes(subs: list[Submission], sweeps: list[str]) -> list[str]:
    """What a user should hear about a sweep before it runs: jobs that would see exactly the
    same command, environment and framework files (the swept key reaches nothing), and keys
    that reach the job only through a JOBCTL_* variable its command does not mention."""
    notes = []
    seen = {json.dumps([s.command, s.env, s.framework_files], sort_keys=True, default=str) for s in subs}
    keys = [item.partition("=")[0].strip() for item in sweeps]
    if len(subs) > 1 and len(seen) < len(subs):
        notes.append(f"--sweep {', '.join(keys)}: some of the {len(subs)} jobs would see exactly the same command, "
                     "environment and files; use the key in launch.command (e.g. ${" + keys[0] + "}) or in the plan")
    exported = {"train.lr": "JOBCTL_LR", "train.steps": "JOBCTL_TRAIN_STEPS", "train.seq_len": "JOBCTL_SEQ_LEN"}
    for key in keys:
        if key in exported and subs and not any(f"${{{key}}}" in json.dumps(s.recipe_source.get("launch") or {})
                                                for s in subs):
            notes.append(f"--sweep {key}: the job sees it only as ${exported[key]} (its command does not use "
                         f"${{{key}}}); make sure the training script reads it")
    return notes


SECRET_SHOWN = "***"
SECRET_MIN_CHARS = 6  # shorter values are also hidden under their own name, but not searched for elsewhere


_ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")


def secrets(sub: Submission) -> dict[str, str]:
    """What a user's recipe brings that is theirs alone: `launch.env` (tokens, keys), and the
    value of every environment variable it reads (`${oc.env:HF_TOKEN}` in a command line), by
    name; the dry run hides them wherever they appear."""
    source = sub.recipe_source or {}
    env = (source.get("launch") or {}).get("env") or {}
    out = {str(k): str(v) for k, v in env.items() if v is not None}
    for name in _ENV_REF.findall(json.dumps(source)):
        if os.environ.get(name):
            out.setdefault(f"oc.env:{name}", os.environ[name])
    return out


def redact(item, hidden: dict[str, str]):
    """A dry run's rendering with the values of `hidden` shown as ***: under their own names in
    `env`, and wherever else they appear (a command line, the sbatch script)."""
    values = sorted({v for v in hidden.values() if len(v) >= SECRET_MIN_CHARS}, key=len, reverse=True)

    def walk(x):
        if isinstance(x, str):
            for v in values:
                x = x.replace(v, SECRET_SHOWN)
            return x
        if isinstance(x, dict):
            return {k: (SECRET_SHOWN if k in hidden and isinstance(v, str) and path_is_env(x) else walk(v))
                    for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    def path_is_env(d: dict) -> bool:
        return d is item.get("env")

    return walk(item)


PLACEHOLDER_ID = "ID"  # the jobctl id a dry run cannot know (letters only: paths need no quoting)


def _placeholder(sub: Submission, index: int | None = None) -> JobFolder:
    """The job folder a submission will get, its jobctl id not known yet (ID, ID0, ID1, ...)."""
    return JobFolder(sub.workdir / f"{PLACEHOLDER_ID}{'' if index is None else index}-{layout.slug(sub.recipe_name)}")


def dry_run(subs: list[Submission], check: bool = False) -> list[dict]:
    """`render` of each submission with the script its scheduler would be given: one per group
    of equal resources, as submit_all submits them (a job array for several); with `check`, the
    scheduler's answer to that very script (Slurm: `sbatch --test-only`)."""
    out = []
    for group in _groups(subs).values():
        backend = placement.backend(group[0].scheduler)
        folders = [_placeholder(s, i if len(group) > 1 else None) for i, s in enumerate(group)]
        script = backend.render([s.request(f, 0) for s, f in zip(group, folders)], cwd=group[0].cwd)
        rendered = [render(s, script) for s in group]
        if check and script is not None:
            ok, text = backend.test_only(script)
            for r in rendered:
                r["check"] = {"ok": ok, "sbatch": text}
        out += rendered
    return out


def _groups(subs: list[Submission]) -> dict[str, list[Submission]]:
    """Submissions that share one scheduler call (a job array): equal resources."""
    groups: dict[str, list[Submission]] = {}
    for s in subs:
        groups.setdefault(s.resource_key(), []).append(s)
    return groups


# --- submission -------------------------------------------------------------------------------

def submit(subs: list[Submission], inv_loaded, history, *, token: str, sync_dir: str | None = None,
           progress=None) -> list[dict]:
    """Submit on the cluster `inv_loaded` describes: here through its backend, or on its login
    node when it has one (remote.backend). The result of each job as `submit_all` gives it."""
    for i, sub in enumerate(subs):
        sub.token = token if len(subs) == 1 else f"{token}.{i}"
    remote = placement.remote_for_inventory(inv_loaded)
    if remote is not None:
        from jobctl.jobs import mirror

        return mirror.submit(history, remote, subs, token=token, sync_dir=sync_dir, progress=progress)
    return submit_all(subs, history, progress)


def submit_all(subs: list[Submission], history, progress=None) -> list[dict]:
    """Record, submit and record again each submission. Equal resources share one job array.

    Ctrl-C: each job's PREPARED row is committed before the scheduler is called and its id
    right after, so an interruption leaves either a submitted and recorded job or a PREPARED
    row that was never submitted (shown as such by `jobctl history`).
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
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.ExitStack() as stack:
        for digest in sorted({hashlib.sha256(t.encode()).hexdigest()[:24] for t in tokens}):
            f = stack.enter_context(open(folder / f"token-{digest}.lock", "a"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            except OSError:  # a filesystem without locks (Lustre mounted noflock): the token
                break        # check alone still makes a sequential retry safe
        yield


def _submit_all(subs: list[Submission], history, progress=None) -> list[dict]:
    results, todo = [], []
    for s in subs:
        done = _submitted_before(s, history)
        if done is not None:
            results.append(done)
            if progress:
                progress(f"#{done['id']} was already submitted with this token as {s.scheduler} job "
                         f"{done['scheduler_job_id']}: not submitted again")
        else:
            todo.append(s)
    groups = _groups(todo)
    if todo:
        placement.backend(todo[0].scheduler).check()
    for root in sorted({s.workdir for s in todo}):
        private_root(root)  # before any row is prepared: a root others can change is refused
    for s in todo:
        if s.cwd and not os.path.isdir(s.cwd):
            raise UsageError(f"the job's directory {s.cwd} does not exist (any more)",
                             hint="the job runs where it was first submitted; recreate it or submit the recipe again")
    for group in groups.values():
        backend = placement.backend(group[0].scheduler)
        ids, folders = [], []
        for s in group:
            jid = history.prepare(recipe_name=s.recipe_name, recipe_text=s.recipe_text, plan=s.plan,
                                  cluster=s.cluster, scheduler=s.scheduler, partition=s.partition,
                                  recipe_path=s.recipe_path, parent_id=s.parent_id, sweep_id=s.sweep_id,
                                  attempt=s.attempt if s.parent_id else None, token=s.token,
                                  predicted_peak_bytes=s.plan_report["memory"]["total_bytes"],
                                  extra={"overrides": s.overrides})
            folder = JobFolder.create(s.workdir, jid, s.recipe_name)
            write_folder(s, folder, jid)
            ids.append(jid)
            folders.append(folder)
        # what `jobctl status` needs to find the jobs at the scheduler if its answer is lost
        call = [str(f.path) for f in folders]
        for i, (s, jid) in enumerate(zip(group, ids)):
            history.set_extra(jid, {"overrides": s.overrides, "sbatch_call": call, "sbatch_index": i})
        with _interrupts_deferred(block_children=group[0].scheduler is Scheduler.SLURM):
            results += _submit_group(backend, group, ids, folders, history, progress)
    return results


def _submit_group(backend, group, ids, folders, history, progress) -> list[dict]:
    """Ask the scheduler and record its answer: the one stretch an interruption must not split."""
    results = []
    try:
        answers = backend.submit([s.request(f, jid) for s, f, jid in zip(group, folders, ids)], cwd=group[0].cwd)
    except SubmissionUncertain:
        raise  # the rows stay PREPARED: `jobctl status` finds the jobs at the scheduler, or says they were never made
    except SchedulerError as e:
        for jid in ids:
            history.mark_submit_failed(jid, e.message.removeprefix("the scheduler refused the job: "))
        raise
    for answer, jid, folder, s in zip(answers, ids, folders, group):
        history.mark_submitted(jid, answer.job_id, str(folder.path))
        history.transition(jid, JobState.SUBMITTED, f"{s.scheduler} job {answer.job_id}")
        meta = {"job_id": answer.job_id, "submitit_folder": str(answer.submitit_folder)}
        meta.update({k: v for k, v in answer.meta.items() if k != "sbatch"})
        folder.write_json(layout.SCHEDULER, meta)
        if answer.meta.get("sbatch"):
            folder.write_text(layout.SBATCH, answer.meta["sbatch"])
        results.append({"id": jid, "scheduler_job_id": answer.job_id, "job_folder": str(folder.path),
                        "recipe": s.recipe_name})
        if progress:
            progress(f"submitted #{jid} as {s.scheduler} job {answer.job_id} ({folder.path})")
    return results


@contextlib.contextmanager
def _interrupts_deferred(block_children: bool):
    """Ctrl-C (SIGINT) and SIGTERM wait until the scheduler's answer is recorded, then
    interrupt as usual: a job the scheduler made is never left unrecorded by them (a kill -9
    still can: `jobctl status` reconciles such rows by name). With `block_children` the signals
    are blocked in the C sense too, which the scheduler's short-lived client (sbatch) inherits:
    a Ctrl-C at the terminal reaches the whole process group. Not for local jobs, whose
    controller lives on and must keep the default signals."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    # a signal ignored on entry (SIGINT in a background job of a script) stays ignored
    signals = tuple(s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN)
    old = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signals}
    if block_children and signals:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        if block_children and signals:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)  # a pending one now runs the handler above
        for s, handler in old.items():
            signal.signal(s, handler)
    if caught:
        if caught[0] == signal.SIGINT:
            raise KeyboardInterrupt
        signal.raise_signal(caught[0])


def write_folder(sub: Submission, folder: JobFolder, job_id: int) -> None:
    """What a job folder holds before the scheduler is asked (docs/job-folder.md)."""
    for key, text in sub.framework_files.items():
        folder.write_text(f"{layout.FRAMEWORK_DIR}/{key}", text)
    folder.write_text(layout.RECIPE_YAML, sub.recipe_text)
    folder.write_text(layout.INVENTORY_YAML, sub.inventory_text)
    folder.write_json(layout.PLAN, sub.plan_report)
    folder.write_json(layout.RECIPE_JSON, sub.recipe_source)
    folder.write_json(layout.INVENTORY_JSON, sub.inventory_source)
    folder.write_json(layout.JOB, {
        "jobctl_id": job_id, "cluster": sub.cluster, "partition": sub.partition, "scheduler": sub.scheduler.value,
        "parameters": sub.parameters, "env": sub.env, "command": sub.command, "launcher": sub.launcher,
        "overrides": sub.overrides, "recipe_path": sub.recipe_path, "attempt": sub.attempt,
        "parent_id": sub.parent_id, "policy": sub.policy.to_dict(), "history_path": str(history_path()),
        "cwd": sub.cwd or os.getcwd(), "checkpoint_dir": sub.checkpoints(folder),
    })


def _submitted_before(sub: Submission, history) -> dict | None:
    """The result of an earlier submission with `sub.token` (an idempotent retry), or None.

    A token whose job never reached the scheduler's answer is refused: whether sbatch ran
    cannot be known from here, and guessing could run the job twice."""
    rec = history.find_by_token(sub.token) if sub.token else None
    if rec is None:
        return None
    if rec.scheduler_job_id:
        return {"id": rec.id, "scheduler_job_id": rec.scheduler_job_id, "job_folder": rec.job_folder,
                "recipe": rec.recipe_name, "existing": True}
    if rec.state is JobState.SUBMIT_FAILED:
        raise UsageError(f"submission token {sub.token!r} belongs to job #{rec.id}, which the scheduler refused "
                         f"({rec.detail or 'no reason recorded'})", hint="submit again without --token "
                         "(or with a new one)")
    raise SchedulerError(f"submission token {sub.token!r} belongs to job #{rec.id}, recorded PREPARED: an earlier "
                         "submission with it was interrupted before the scheduler's answer was recorded",
                         hint=f"check `squeue --me` for a job named {rec.recipe_name!r}; if there is none, submit "
                              "again with a new token")
