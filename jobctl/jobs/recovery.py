"""What follows a failed run, decided from its job folder, without anyone watching.

`recover` is the recovery the runner's first node calls (by name: jobs.submission.RECOVERY)
once every node wrote its outcome: after a failure the retry policy sends up the OOM ladder,
it submits the next plan as a new job with the same global batch and the parent recorded, up
to the attempt limit. The folder keeps the lineage (successor.json, final.json) for the history
to sync. `next_submission` builds that next attempt from the folder; `jobctl requeue` uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jobctl.backends.launch import LaunchError
from jobctl.config import loader as config
from jobctl.errors import InfeasibleError
from jobctl.jobs.submission import Submission, prepare, submit_all
from jobctl.model import Failure, FailureKind, OOMFigures, Outcome, RetryAction, RetryPolicy
from jobctl.planner.plan import Plan
from jobctl.planning.oom import after_host_oom, after_oom
from jobctl.runtime.outcome import job_failure, measured_peaks
from jobctl.store import folder as layout
from jobctl.store.folder import JobFolder
from jobctl.store.history import History


def recover(folder: JobFolder, outcomes: list[Outcome]) -> dict | None:
    """After a run: record its failure, and when the policy says so, submit the next attempt
    (a smaller GPU plan after a CUDA OOM, less offload after a host OOM). Returns what was
    done (also written to successor.json or final.json). A CUDA OOM's calibration (what the
    model predicted, what the failure showed, the factor the ladder used) is recorded with the
    attempt whether or not a next one follows."""
    job = folder.job()
    failure = job_failure(outcomes)
    _record(job, failure, outcomes)
    if failure is None:
        return None
    policy = RetryPolicy.from_dict(job.get("policy"))
    why = stop_before_looking(failure, policy)
    if why is not None:
        return _final(folder, why, failure)
    figures = failure_figures(outcomes)
    action = policy.action(failure.kind)
    step, bottom = None, None
    try:
        if action is RetryAction.RESUBMIT:
            nodes = suspects(failure, outcomes)
            step = next_submission(folder, job, smaller=False, exclude=nodes)
            step.rung = "same plan"
            step.reason = f"after {failure.kind}, " + (f"without {', '.join(nodes)}" if nodes else "on any nodes")
        else:
            step = next_submission(folder, job, figures, smaller=True, host=action is RetryAction.HOST)
    except (InfeasibleError, LaunchError) as e:
        bottom = e.message
    calibration = step.calibration if step is not None else None
    if calibration is None and failure.kind is FailureKind.CUDA_OOM:
        calibration = _calibration_only(folder, job, figures)
    _record_calibration(job, calibration)
    extra = {"calibration": calibration} if calibration else {}
    why = stop_after_looking(failure, int(job.get("attempt", 1)), policy.max_attempts,
                             None if step is None else step.rung or "the next plan", bottom)
    if why is not None:
        return _final(folder, why, failure, extra)
    with History.open(job.get("history_path")) as history:
        (res,) = submit_all([step.submission], history)
    out = step.summary(res) | {"failure": failure.to_dict()}
    folder.write_json(layout.SUCCESSOR, out)
    return out


# -- the decisions (pure: tests/test_recovery_decisions.py) ------------------------------------

def stop_before_looking(failure: Failure, policy: RetryPolicy) -> str | None:
    """Why the chain stops without looking for a next plan (None: look for one). The ladder
    (CUDA OOM), the host step (host OOM) and a resubmission (a hang, a hardware fault) submit a
    new job from here; a requeue is the scheduler's (submitit's checkpointable runner), anything
    else waits for a person."""
    action = policy.action(failure.kind)
    if action is RetryAction.REQUEUE:
        return f"{failure.kind}: the scheduler requeues the same plan (submitit)"
    if action not in (RetryAction.LADDER, RetryAction.HOST, RetryAction.RESUBMIT):
        return f"{failure.kind}: not retried ({failure.summary})"
    return None


def stop_after_looking(failure: Failure, attempt: int, max_attempts: int, rung: str | None,
                       bottom: str | None) -> str | None:
    """Why the chain stops once the next plan was looked for (None: submit it): the ladder's
    bottom (`bottom`, no next plan), or `attempt` already the `max_attempts`-th."""
    if bottom is not None or rung is None:
        return f"{failure.kind}: {bottom or 'no next plan'}"
    if attempt >= max_attempts:
        return (f"{failure.kind} on attempt {attempt} of {max_attempts}: giving up before the next step "
                f"({rung}) -- raise --max-attempts to allow more")
    return None


# The failures the job's own runner decides (the OOM's message, the watchdog, the driver's
# report): recorded as the job's ending at once. Other endings (a cancel kills the command
# too) are left to the scheduler's word.
OWN_VERDICTS = (FailureKind.CUDA_OOM, FailureKind.HANG, FailureKind.HARDWARE)


def _record(job: dict, failure: Failure | None, outcomes: list[Outcome]) -> None:
    """Tell the history what the job folder knows: the measured peak, the progress (last step,
    newest checkpoint), a failure the runner decided (OWN_VERDICTS; so `jobctl plan` can warn
    about layouts that ran out of memory) and the nodes it was pinned to (suspects). Best
    effort: the folder stays the source of truth when the history is out of reach."""
    from pathlib import Path

    peaks = measured_peaks(outcomes)
    path = job.get("history_path")
    if not path or not Path(path).exists():
        return
    try:
        with History.open(path) as history:
            jid = int(job["jobctl_id"])
            if peaks:
                history.set_measured_peak(jid, max(peaks))
            seen = progress_of(outcomes)
            if seen:
                history.set_extra(jid, {**history.get(jid).extra, "progress": seen})
            if failure is not None and failure.kind in OWN_VERDICTS:
                history.transition(jid, "FAILED", failure.summary, failure_kind=failure.kind, detail=failure.summary)
            if failure is not None:
                for node in suspects(failure, outcomes):
                    history.add_suspect_node(job.get("cluster") or "", node, failure.kind,
                                             f"{failure.summary} ({failure.evidence})", jid)
    except Exception:  # noqa: BLE001 - the history is a mirror: never let it cost the recovery
        pass


def progress_of(outcomes: list[Outcome]) -> dict:
    """How far the run got: the last step any node saw, the newest checkpoint's step."""
    out = {}
    for key in ("last_step", "checkpoint_step"):
        values = [getattr(o, key) for o in outcomes if getattr(o, key) is not None]
        if values:
            out[key] = max(values)
    return out


def suspects(failure: Failure, outcomes: list[Outcome]) -> list[str]:
    """The nodes a failure is pinned to, for the next attempt to leave out: a hardware fault's
    node; a hang's node when the other nodes got further (a node that stopped first holds the
    rest in a collective); none for a hang every node shares (nothing tells which one caused it)."""
    by_rank = {o.node_rank: o for o in outcomes}
    if failure.kind is FailureKind.HARDWARE:
        o = by_rank.get(failure.node_rank)
        return [o.host] if o is not None and o.host else []
    if failure.kind is FailureKind.HANG and len(outcomes) > 1:
        steps = {o.host: o.last_step for o in outcomes if o.host}
        if len(steps) == len(outcomes) and None not in steps.values():
            low = min(steps.values())
            behind = [h for h, s in steps.items() if s == low]
            if len(behind) < len(steps):
                return sorted(behind)
    return []


def failure_figures(outcomes: list[Outcome]) -> OOMFigures:
    """What the ladder learns from a run's outcome records: the OOM message's figures (when
    the failure was a CUDA OOM) and the highest GPU memory peak measured on any node."""
    failure = job_failure(outcomes)
    peaks = measured_peaks(outcomes)
    oom = failure.oom if failure is not None and failure.oom is not None else OOMFigures()
    return replace(oom, measured_peak_bytes=max(peaks) if peaks else None)


def _final(folder: JobFolder, reason: str, failure: Failure, extra: dict | None = None) -> dict:
    out = {"stopped": reason, "failure": failure.to_dict(), **(extra or {})}
    folder.write_json(layout.FINAL, out)
    return out


def _calibration_only(folder: JobFolder, job: dict, figures: OOMFigures) -> dict | None:
    """The calibration of a CUDA OOM when no next attempt was computed (the ladder's bottom)."""
    from jobctl.planning.oom import oom_calibration

    try:
        rec, inv = loaded_inputs(folder, job)
        report = folder.plan_report()
        return oom_calibration(rec, inv, report["plan"], figures, job.get("partition"),
                               prior=prior_calibration(report))
    except Exception:  # noqa: BLE001 - a record only: never let it cost the verdict
        return None


def _record_calibration(job: dict, calibration: dict | None) -> None:
    """Keep the calibration with the failed attempt in the history (`plan` learns from it)."""
    from pathlib import Path

    path = job.get("history_path")
    if not calibration or not path or not Path(path).exists():
        return
    try:
        with History.open(path) as history:
            rec = history.get(int(job["jobctl_id"]))
            history.set_extra(rec.id, {**rec.extra, "calibration": calibration})
    except Exception:  # noqa: BLE001 - the history is a mirror
        pass


@dataclass
class NextAttempt:
    """The job that continues a finished or failed one: its submission and, when it stepped
    down the OOM ladder, which rung and why."""

    submission: Submission  # parent and attempt set
    rung: str | None = None
    reason: str | None = None
    calibration: dict | None = None  # what the failure taught the ladder (a CUDA OOM)

    def summary(self, res: dict) -> dict:
        """What was submitted (a submit_all result), as successor.json and `requeue --json` show it."""
        from jobctl.runtime.progress import latest_checkpoint

        sub = self.submission
        saved = latest_checkpoint(sub.checkpoint_dir) if sub.checkpoint_dir else None
        return {"jobctl_id": res["id"], "scheduler_job_id": res["scheduler_job_id"], "job_folder": res["job_folder"],
                "parent_id": sub.parent_id, "attempt": sub.attempt, "rung": self.rung, "reason": self.reason,
                "calibration": self.calibration, "plan": sub.plan.to_dict(),
                "resumes_from_step": saved[0] if saved else None, "checkpoint_dir": sub.checkpoint_dir}


def prior_calibration(report: dict) -> dict | None:
    """What the attempts before a job taught the ladder: its plan's ladder block (an earlier
    attempt of this chain), else what the plan learned from another job's OOM."""
    return (report.get("ladder") or {}).get("calibration") or (report.get("learned") or {}).get("calibration")


def loaded_inputs(folder: JobFolder, job: dict):
    """The recipe and inventory a job was planned from, as its folder keeps them, validated again."""
    rec = config.from_data(folder.read_json(layout.RECIPE_JSON, required=True), "Recipe",
                           job.get("recipe_path") or str(folder.file(layout.RECIPE_YAML)))
    inv = config.from_data(folder.read_json(layout.INVENTORY_JSON, required=True), "Inventory",
                           str(folder.file(layout.INVENTORY_YAML)))
    return rec, inv


def next_submission(folder: JobFolder, job: dict, figures: OOMFigures | None = None, *, smaller: bool = True,
                    host: bool = False, exclude: list[str] | None = None) -> NextAttempt:
    """The next attempt of the job in `folder` (job.json read into `job`), not yet submitted:
    its recipe, inventory and plan come from the folder; with `smaller`, the plan is the OOM
    ladder's next one (global batch kept) given the failure's `figures` (with `host`: the
    host side's step, less offload), else the same plan. The parent and attempt + 1 are set.
    InfeasibleError at the ladder's bottom.

    Shared by the in-job recovery (`recover`) and `jobctl requeue`."""

    rec, inv = loaded_inputs(folder, job)
    if exclude:
        rec = excluding(rec, exclude)
    report = folder.plan_report()
    Plan.from_dict(report.get("plan"), str(folder.file(layout.PLAN)))  # refuse a damaged plan here, by name
    rung = reason = calibration = None
    if smaller:
        if host:
            result = after_host_oom(rec, inv, report["plan"], job.get("partition"))
        else:
            result = after_oom(rec, inv, report["plan"], figures, job.get("partition"),
                               prior=prior_calibration(report))
        if not result.feasible:
            raise InfeasibleError(result.reasons[0],
                                  hint="give the job more GPUs (resources.max_nodes, a larger partition) "
                                       "or a shorter sequence, then submit it again")
        report = result.to_dict()
        lad = report.get("ladder") or {}
        rung, reason, calibration = lad.get("rung"), lad.get("reason"), lad.get("calibration")
    sub = prepare(rec, inv, report, job.get("overrides") or [])
    sub.parent_id = int(job["jobctl_id"])
    sub.policy = RetryPolicy.from_dict(job.get("policy"))
    sub.attempt = int(job.get("attempt", 1)) + 1
    sub.cwd = job.get("cwd")  # the same directory as the first attempt (a synced working tree)
    sub.checkpoint_dir = job.get("checkpoint_dir")  # the chain's: the next attempt resumes from it
    return NextAttempt(sub, rung, reason, calibration)


def excluding(rec, nodes: list[str]):
    """The recipe with `nodes` added to resources.exclude (validated again)."""
    data = dict(rec.data)
    resources = dict(data.get("resources") or {})
    resources["exclude"] = sorted(set(resources.get("exclude") or []) | set(nodes))
    data["resources"] = resources
    return config.from_data(data, "Recipe", rec.path)
