"""List past jobs from the history database alone (no scheduler call); also the job rows and
job references that `status`, `logs` and `cancel` share."""

from __future__ import annotations

from datetime import datetime, timezone

from jobctl.errors import UsageError

HELP = "list past jobs from the history (no scheduler call), newest first"
EPILOG = """examples:
  jobctl history                              # the 20 newest jobs
  jobctl history --state failed,timeout       # only those (repeatable, comma-separated)
  jobctl history --recipe tiny --cluster dev --limit 0    # all of them
  jobctl history --json | jq '.[].id'

States are the recorded ones: run `jobctl status` to ask the scheduler for fresh ones.
exit codes: 0 ok, 2 bad option (an unknown state, a negative limit)."""

DEFAULT_LIMIT = 20


def add_arguments(p) -> None:
    p.add_argument("--recipe", "-r", help="only jobs of this recipe (name, or the path it was submitted from)")
    p.add_argument("--state", "-s", action="append", default=[], metavar="STATE[,STATE]",
                   help="only jobs in these states, e.g. RUNNING or failed,timeout (repeatable)")
    p.add_argument("--cluster", "-c", help="only jobs on this cluster (inventory name)")
    p.add_argument("--limit", "-n", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"show the N newest matching jobs (default {DEFAULT_LIMIT}; 0: all)")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the rows as JSON on stdout")


def run(args) -> int:
    from jobctl import ui
    from jobctl.store.history import History, parse_state

    if args.limit < 0:
        raise UsageError(f"--limit {args.limit}: expected 0 (all) or a positive number")
    states = [parse_state(s) for item in args.state for s in item.split(",") if s.strip()] or None
    with History.open() as history:
        limit = None if args.limit == 0 else args.limit
        records = history.list(recipe=args.recipe, state=states, cluster=args.cluster,
                               limit=None if limit is None else limit + 1)
        more = limit is not None and len(records) > limit
        records = records[:limit]
        rows = [job_row(history, r) for r in records]
    if args.as_json:
        ui.print_json(rows)
        return 0
    if not rows:
        ui.info("no jobs match" if (args.recipe or states or args.cluster) else
                "no jobs in the history yet (submit one: jobctl submit RECIPE --cluster CLUSTER)")
        return 0
    ui.render_jobs(rows, title="Job history (recorded states), newest first")
    if more:
        ui.info(f"showing the {limit} newest; --limit N for more, --limit 0 for all")
    return 0


# --- shared by status, logs, cancel --------------------------------------------------------------

def resolve(history, refs: list[str]) -> list:
    """The history records the references name (12, #12, slurm:4242, ...), each once, in order.

    An unknown reference is a usage error naming the newest jobs the history does know."""
    from jobctl.store.history import UnknownJobError

    out, seen = [], set()
    for ref in refs:
        try:
            rec = history.get(ref)
        except UnknownJobError as e:
            newest = history.list(limit=5)
            known = ", ".join(f"#{r.id}" + (f" ({r.scheduler} {r.scheduler_job_id})" if r.scheduler_job_id else "")
                              for r in newest)
            hint = (f"the newest jobs are {known}; run `jobctl history` to see them all" if newest else
                    "the history is empty: submit a job first (jobctl submit RECIPE --cluster CLUSTER)")
            raise UsageError(e.message, hint=hint) from None
        if rec.id not in seen:
            seen.add(rec.id)
            out.append(rec)
    return out


def _aware(text: str | None) -> datetime | None:
    """A timezone-aware datetime from the history's UTC ISO text or sacct's naive local time."""
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt.astimezone() if dt.tzinfo is None else dt  # naive (sacct) means local time


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.astimezone(timezone.utc).isoformat(timespec="seconds")


def job_row(history, record, state=None, now: datetime | None = None) -> dict:
    """One job as the tables and --json show it: the history record, and, when given, what the
    scheduler said just now (a scheduler.JobState) for its start, end, node list and reason."""
    now = now or datetime.now(timezone.utc)
    plan = record.plan
    if record.scheduler == "local":
        start = _aware(record.submitted_at)  # the local executor starts the job at once
    else:
        start = _aware(state.start if state else None) or _aware(record.started_at)
    end = _aware(state.end if state else None) or _aware(record.ended_at)
    if not record.terminal:
        end = None
    elapsed_s = None
    if start is not None:
        elapsed_s = max(0.0, ((end or now) - start).total_seconds())
    chain = history.chain(record.id)
    node_list = state.nodes if state and state.nodes and state.nodes != "None assigned" else None
    reason = state.reason if state and not record.terminal else None
    return {
        "id": record.id,
        "scheduler": record.scheduler,
        "scheduler_job_id": record.scheduler_job_id,
        "recipe": record.recipe_name,
        "cluster": record.cluster,
        "partition": record.partition,
        "state": record.state.value,
        "nodes": plan.get("nodes"),
        "node_list": node_list,
        "submitted_at": record.submitted_at or record.created_at,
        "started_at": _iso(start),
        "ended_at": _iso(end),
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 1),
        "exit_reason": record.exit_reason,
        "reason": reason,
        "attempt": record.attempt,
        "parent_id": record.parent_id,
        "chain": [r.id for r in chain] if len(chain) > 1 else [],
        "sweep_id": record.sweep_id,
        "job_folder": record.job_folder,
    }
