"""What the job history teaches `jobctl plan`: layouts like this one that already ran out of GPU
memory on the cluster, and how far the memory model's predicted peaks were from measured ones.

The rules are pure functions of `PastJob` values; `history_for` is the thin edge that reads the
history (read-only, and not at all when there is no history file: `plan` is run in loops).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from jobctl.config.loader import parse_yaml_text
from jobctl.model import FailureKind, JobState
from jobctl.planner.models import PRESETS, ModelSpec
from jobctl.planner.plan import layout_text
from jobctl.store.paths import history_path as path

if TYPE_CHECKING:  # annotations only: datetime is imported where a history is read
    from datetime import datetime

# `plan` reads only the newest jobs, so its cost stays flat however long the history grows:
# a rowid range (the primary key) bounds the scan, LIMIT bounds the rows kept.
RECENT_JOBS = 5000
MAX_OOM_JOBS = 50  # OOMed jobs looked at for warnings (their recipe text is parsed)
MAX_ERROR_JOBS = 200  # the newest finished jobs behind the model-error figures
MAX_WARNINGS = 3  # the newest ones; more would repeat each other
# A calibration is evidence about one recipe's job, and evidence ages: past this many days (the
# code, drivers and frameworks under it change) it is no longer applied.
CALIBRATION_TTL_DAYS = 30
# An OOM that "shows" the model missed more than ten times the activations, or more fixed
# bytes than this share of the GPU, says more about the job (another command, a leak, a payload
# that asked for the memory) than about the model: reported as suspect, never applied.
MAX_PLAUSIBLE_SCALING = 10.0
MAX_PLAUSIBLE_GAP_SHARE = 0.5

OOM_REASON = FailureKind.CUDA_OOM  # the failure kind the in-job recovery records (jobs/recovery.py)
# Runs whose measured peak is the steady state: they ran to the end or to the time limit.
# An OOMed run's peak stops short of its demand; a cancelled or failed one may never get there.
FINISHED_STATES = (JobState.COMPLETED, JobState.TIMEOUT)

# Plan fields that decide memory per GPU besides the micro-batch: equal values, same layout.
LAYOUT_KEYS = ("tp", "pp", "cp", "sharding", "recompute", "recompute_layers", "offload", "virtual_stages",
               "sequence_parallel")
ZERO_SHARDINGS = ("zero1", "zero2", "zero3")


@dataclass(frozen=True)
class PastJob:
    """A job of the history, as the rules need it."""

    id: int
    state: str
    failure_kind: str | None
    cluster: str
    partition: str | None
    plan: dict
    model: tuple[str, int] | None = None  # (name, parameter count); None: not known
    seq_len: int | None = None
    predicted_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    attempt: int = 1
    successor: tuple[int, str, dict] | None = None  # (id, state, plan) of the job that continued it
    calibration: dict | None = None  # what its CUDA OOM showed the model missed (planner.ladder.Calibration)
    recipe_name: str | None = None  # the recipe (command) whose job it was
    created_at: str | None = None  # ISO 8601, UTC


# --- the rules (pure) ------------------------------------------------------------------------------

def why_like(plan: dict, predicted_bytes: int | None, failed: PastJob) -> str | None:
    """Why `plan` needs at least the GPU memory `failed.plan` needed, or None.

    Either (1) the same layout: every LAYOUT_KEYS value equal, micro_batch_size >= the failed
    one's, optimizer states spread over no more ranks (ZeRO: dp·cp, HSDP: hsdp_shard, both
    <= the failed one's) and, with pipeline stages, at least as many micro-batches in flight
    (min(pp, grad_accum_steps), 1F1B); or (2) the memory model predicts at least the failed
    plan's peak. The caller checks the model, sequence length, cluster and partition."""
    f = failed.plan
    same_layout = all(plan.get(k) == f.get(k) for k in LAYOUT_KEYS) and plan.get("ep", 1) == f.get("ep", 1)
    if same_layout and plan.get("micro_batch_size", 0) >= f.get("micro_batch_size", 0):
        spread_ok = True
        if plan.get("sharding") in ZERO_SHARDINGS:
            spread_ok = plan.get("dp", 1) * plan.get("cp", 1) <= f.get("dp", 1) * f.get("cp", 1)
        elif plan.get("sharding") == "hsdp":
            spread_ok = plan.get("hsdp_shard", 0) <= f.get("hsdp_shard", 0)
        pp = plan.get("pp", 1)
        in_flight_ok = pp == 1 or min(pp, plan.get("grad_accum_steps", 1)) >= min(pp, f.get("grad_accum_steps", 1))
        if spread_ok and in_flight_ok:
            return f"the same layout with micro-batch {plan.get('micro_batch_size')} >= {f.get('micro_batch_size')}"
    if predicted_bytes and failed.predicted_peak_bytes and predicted_bytes >= failed.predicted_peak_bytes:
        return (f"predicted {_gib(predicted_bytes)} GiB per GPU >= the {_gib(failed.predicted_peak_bytes)} GiB "
                f"predicted for it")
    return None


def oom_warnings(report: dict, jobs: list[PastJob]) -> list[dict]:
    """Warnings for a feasible plan report: the newest jobs of the same model (name and
    parameter count), sequence length, cluster and partition that ran out of GPU memory with
    a plan needing no more memory than this one (`why_like`). Newest first."""
    plan, model = report.get("plan"), report.get("model") or {}
    if not plan:
        return []
    ident = (model.get("name"), model.get("params"))
    seq_len = (report.get("train") or {}).get("seq_len")
    predicted = (report.get("memory") or {}).get("total_bytes")
    out = []
    for job in sorted(jobs, key=lambda j: -j.id):
        if job.failure_kind != OOM_REASON or job.cluster != report.get("cluster") \
                or job.partition != report.get("partition") or job.model != ident or job.seq_len != seq_len:
            continue
        why = why_like(plan, predicted, job)
        if why is None:
            continue
        tried = _layout(job.plan)
        msg = (f"#{job.id} ran out of GPU memory on {job.cluster}/{job.partition} with {tried}"
               + (f" (predicted {_gib(job.predicted_peak_bytes)} GiB)" if job.predicted_peak_bytes else "")
               + f"; this plan is {why}")
        warning = {"job": job.id, "attempt": job.attempt, "tried": job.plan, "predicted_peak_bytes":
                   job.predicted_peak_bytes, "why": why, "continued_as": None, "message": msg}
        if job.successor is not None:
            sid, sstate, splan = job.successor
            warning["continued_as"] = {"job": sid, "state": sstate, "plan": splan}
            warning["message"] += f"; it was continued as #{sid} with {_layout(splan)} ({sstate})"
        out.append(warning)
        if len(out) == MAX_WARNINGS:
            break
    return out


def model_error(jobs: list[PastJob]) -> dict | None:
    """The memory model's error on measured peaks: (predicted - measured) / measured, in %,
    over finished jobs with both figures; the median, and the worst (largest in size, sign
    kept: negative means the model predicted less than was used). None without such jobs."""
    errors = sorted(100.0 * (j.predicted_peak_bytes - j.measured_peak_bytes) / j.measured_peak_bytes for j in jobs
                    if j.state in FINISHED_STATES and j.predicted_peak_bytes and j.measured_peak_bytes)
    if not errors:
        return None
    mid = len(errors) // 2  # the median (statistics.median's definition; the module costs plan 3 ms to import)
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    return {"jobs": len(errors), "median_pct": round(median, 1),
            "worst_pct": round(max(errors, key=abs), 1)}


def calibration_for(jobs: list[PastJob], partition: str, model: tuple[str, int], seq_len: int,
                    recipe_name: str | None = None, gpu_bytes: int | None = None,
                    now: datetime | None = None) -> dict | None:
    """The newest calibration a CUDA OOM of the same model and sequence length on this
    partition recorded, to apply (with the job it came from), or None; with "advice": the
    calibrations not applied and why. One applies only to the recipe whose job taught it (for
    another recipe of the model it is advice), while it is younger than CALIBRATION_TTL_DAYS,
    plausible (MAX_PLAUSIBLE_*), and not refuted: a later job of the model that completed on the
    partition with a predicted peak at least the OOMed one's shows the memory was there."""
    from datetime import datetime, timezone  # only with a history to read: not imported by every `plan`

    now = now or datetime.now(timezone.utc)
    same = [j for j in jobs if j.partition == partition and j.model == model and j.seq_len == seq_len]
    advice: list[str] = []
    for job in sorted((j for j in same if j.failure_kind == OOM_REASON and j.calibration), key=lambda j: -j.id):
        why = _not_applied(job, same, recipe_name, gpu_bytes, now)
        if why is None:
            return {**job.calibration, "from": f"job #{job.id}'s CUDA OOM", **({"advice": advice} if advice else {})}
        if len(advice) < MAX_WARNINGS:
            advice.append(f"job #{job.id}'s CUDA OOM ({_calibration_text(job.calibration)}) is not applied: {why}")
    return {"advice": advice} if advice else None


def _not_applied(job: PastJob, same: list[PastJob], recipe_name, gpu_bytes, now: datetime) -> str | None:
    c = job.calibration
    scaling, gap = float(c.get("per_scaling") or 0.0), int(c.get("fixed_gap_bytes") or 0)
    if scaling > MAX_PLAUSIBLE_SCALING or (gpu_bytes and gap > MAX_PLAUSIBLE_GAP_SHARE * gpu_bytes):
        return ("suspect evidence (more than the model could miss: check that job's command; "
                f"`jobctl history --forget-learned {job.id}` drops it)")
    age = _age_days(job.created_at, now)
    if age is not None and age > CALIBRATION_TTL_DAYS:
        return f"older than {CALIBRATION_TTL_DAYS} days"
    # fresh submissions only: a retry was planned with a calibration, so its footprint proves nothing
    later = [j for j in same if j.id > job.id and j.state == JobState.COMPLETED.value and j.attempt == 1
             and j.predicted_peak_bytes and job.predicted_peak_bytes
             and j.predicted_peak_bytes >= job.predicted_peak_bytes]
    if later:
        return (f"refuted by job #{later[0].id}, which completed with a predicted "
                f"{_gib(later[0].predicted_peak_bytes)} GiB >= its {_gib(job.predicted_peak_bytes)} GiB")
    if recipe_name is not None and job.recipe_name is not None and job.recipe_name != recipe_name:
        return f"it was recipe {job.recipe_name!r}'s job (advice for this one, not a term)"
    return None


def _calibration_text(c: dict) -> str:
    return f"+{_gib(int(c.get('fixed_gap_bytes') or 0))} GiB and {float(c.get('per_scaling') or 0):.3g} x activations"


def _age_days(created_at: str | None, now: datetime) -> float | None:
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(str(created_at).replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return (now - t).total_seconds() / 86400


def learned_calibration(cluster: str, partition: str, model: tuple[str, int], seq_len: int,
                        path: Path | None = None, recipe_name: str | None = None,
                        gpu_bytes: int | None = None) -> dict | None:
    """`calibration_for` from the history file (read-only; None without one or when it cannot
    be read: a plan never fails for it)."""
    path = history_path() if path is None else Path(path)
    if not path.is_file():
        return None
    from jobctl.store.history import HistoryError  # sqlite: only when there is a history to read

    try:
        return calibration_for(load(path, cluster), partition, model, seq_len, recipe_name, gpu_bytes)
    except (OSError, HistoryError):
        return None


def history_block(report: dict, jobs: list[PastJob]) -> dict:
    """The plan report's "history" block: {"warnings": [...], "model_error": {...}}, each
    part only when something is known; {} when nothing is."""
    out: dict = {}
    warnings = oom_warnings(report, jobs)
    if warnings:
        out["warnings"] = warnings
    err = model_error([j for j in jobs if j.cluster == report.get("cluster")])
    if err:
        out["model_error"] = err
    return out


def _gib(x: int) -> str:
    return f"{x / (1 << 30):.1f}"


def _layout(p: dict) -> str:

    try:
        return layout_text(p)
    except KeyError:
        return str(p)


# --- reading the history (the edge) ----------------------------------------------------------------

def history_path() -> Path:
    """The history file (jobctl.store.paths: light, so `plan` does not import the store)."""

    return path()


def history_for(report: dict, path: Path | None = None) -> dict:
    """The "history" block for a plan report on one cluster, from the history file; {} when
    there is no file (nothing opened) or it cannot be read (the plan never fails for it)."""
    path = history_path() if path is None else Path(path)
    cluster = report.get("cluster")
    if not cluster or not path.is_file():
        return {}
    from jobctl.store.history import HistoryError  # sqlite: only when there is a history to read

    try:
        return history_block(report, load(path, cluster))
    except (OSError, HistoryError):
        return {}


# What `load` read, by (file, cluster, the file's size and change time): one plan reads the
# history once per partition and once for its report; the same file unchanged reads the same.
_LOADED: dict[tuple, list] = {}


def load(path: Path, cluster: str) -> list[PastJob]:
    """The jobs on `cluster` the rules look at, read-only: CUDA-OOMed ones (with the job that
    continued each) and finished ones with predicted and measured peaks, among the newest
    RECENT_JOBS of the history (the store's query)."""
    st = Path(path).stat()
    key = (str(path), cluster, st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _LOADED:
        _LOADED.clear()  # one file's state at a time: a long-lived process sees the history change
        _LOADED[key] = _load(path, cluster)
    return list(_LOADED[key])


def _load(path: Path, cluster: str) -> list[PastJob]:
    from jobctl.store.history import recent_jobs

    rows = recent_jobs(path, cluster, recent=RECENT_JOBS, failure_kind=OOM_REASON, max_failed=MAX_OOM_JOBS,
                       finished_states=FINISHED_STATES, max_finished=MAX_ERROR_JOBS)
    children = {r.parent_id: (r.id, r.state.value, _json(r.plan_json)) for r in rows["children"]}  # the newest wins
    out = [PastJob(r.id, r.state.value, None, cluster, None, {}, predicted_peak_bytes=r.predicted_peak_bytes,
                   measured_peak_bytes=r.measured_peak_bytes) for r in rows["finished"]]
    identities: dict[str, tuple] = {}  # by recipe_hash: a recipe's jobs share its text
    for r in rows["failed"]:
        job = _oom_job(r, cluster, children.get(r.id), identities)
        if job is not None:
            out.append(job)
    # what refutes a calibration (calibration_for): completed jobs newer than a calibrated OOM, at
    # most MAX_OOM_JOBS of them (each distinct recipe text is parsed once), none without such an OOM
    calibrated = [j.id for j in out if j.calibration]
    newer = [r for r in rows.get("completed", []) if calibrated and r.id > min(calibrated)][:MAX_OOM_JOBS]
    for r in newer:
        if r.recipe_hash not in identities:
            identities[r.recipe_hash] = _recipe_identity(r.recipe_text)
        model, seq_len = identities[r.recipe_hash]
        out.append(PastJob(r.id, r.state.value, None, cluster, r.partition, {}, model, seq_len,
                           r.predicted_peak_bytes, None, r.attempt, recipe_name=r.recipe_name,
                           created_at=r.created_at))
    return out


def _json(text: str) -> dict:
    import json

    try:
        doc = json.loads(text)
    except (TypeError, ValueError):
        return {}
    if isinstance(doc, dict) and isinstance(doc.get("plan"), dict):  # a whole `plan --json` report
        return doc["plan"]
    return doc if isinstance(doc, dict) else {}


def _oom_job(row, cluster: str, successor, identities: dict) -> PastJob | None:
    """A PastJob from an OOMed row: the plan from plan_json (a plan, or a whole `plan --json`
    report), the model and sequence length from the resolved recipe text (or the report)."""
    import json

    try:
        doc = json.loads(row.plan_json)
    except (TypeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    report = doc if isinstance(doc.get("plan"), dict) else {}
    plan = report.get("plan", doc)
    model, seq_len = None, None
    if report.get("model") and report.get("train"):
        model = (report["model"].get("name"), report["model"].get("params"))
        seq_len = report["train"].get("seq_len")
    else:
        if row.recipe_hash not in identities:
            identities[row.recipe_hash] = _recipe_identity(row.recipe_text)
        model, seq_len = identities[row.recipe_hash]
    predicted = row.predicted_peak_bytes or (report.get("memory") or {}).get("total_bytes")
    return PastJob(row.id, row.state.value, row.failure_kind.value if row.failure_kind else None, cluster,
                   row.partition or report.get("partition"), plan, model, seq_len, predicted, None, row.attempt,
                   successor, row.extra.get("calibration"), row.recipe_name, row.created_at)


def _recipe_identity(text: str) -> tuple[tuple[str, int] | None, int | None]:
    """(model name, parameter count) and train.seq_len of a resolved recipe's YAML text."""

    doc = parse_yaml_text(text)
    if not isinstance(doc, dict):
        return None, None
    train = doc.get("train")
    seq_len = train.get("seq_len") if isinstance(train, dict) else None
    m = doc.get("model")
    spec = None
    try:
        if isinstance(m, str) and m in PRESETS:
            spec = PRESETS[m]
        elif isinstance(m, dict):  # the fields and defaults of schema.ModelArch, as inputs.model_spec builds it
            spec = ModelSpec(name=m.get("name", "custom"), family=m["family"], layers=m["layers"],
                             hidden=m["hidden"], ffn_hidden=m["ffn_hidden"], heads=m["heads"],
                             kv_heads=m.get("kv_heads") or m["heads"], vocab=m["vocab"],
                             tied_embeddings=bool(m.get("tied_embeddings", False)),
                             max_seq_len=m.get("max_seq_len", 0), dropout=m.get("dropout", 0.0))
    except (KeyError, TypeError, ZeroDivisionError):
        spec = None
    return ((spec.name, spec.params()) if spec is not None else None), seq_len
