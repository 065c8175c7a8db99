"""Watch a job and its attempt chain live: state, nodes, elapsed time and GPU memory against
the plan, following OOM retries to the end of the chain."""

from __future__ import annotations

import sys
import time

from jobctl.errors import EXIT_INTERNAL, EXIT_OK

HELP = "watch a job live: state, GPU memory vs the plan, its OOM retries"
EPILOG = """examples:
  jobctl watch                  # the most recent active job
  jobctl watch 12               # job #12, then the attempts that continue it
  jobctl watch 12 --once        # one snapshot, no live view (also when stdout is not a terminal)
  jobctl watch 12 --json | jq .chain_text

The live view asks the scheduler once every --interval-s seconds (one batched query) and reads
the GPU sampler's CSVs in the job folder (gpu/node-<R>.csv). When a job fails and its first
node submits a smaller plan (the OOM ladder), the view moves on to that attempt.
exit codes: 0 the chain ended COMPLETED (--once: it has not ended in a failure), 1 it ended
otherwise, 2 unknown job, 4 the scheduler cannot be reached, 130 Ctrl-C."""

DEFAULT_INTERVAL_S = 2.0
# After an attempt fails, its first node waits for the other nodes' outcome records
# (recover.OUTCOME_WAIT_S), plans the next attempt and submits it: wait that long, and a minute more.
RECOVERY_WAIT_S = 180.0
EXIT_INTERRUPTED = 130


def add_arguments(p) -> None:
    p.add_argument("job", nargs="?", metavar="JOB", help="the job (default: the most recent active one)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit (no live view)")
    p.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                   help=f"seconds between refreshes of the live view (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--json", action="store_true", dest="as_json", help="print one snapshot as JSON on stdout")


def run(args) -> int:
    from jobctl import ui
    from jobctl.errors import UsageError
    from jobctl.store.history import History

    if not args.interval_s > 0:
        raise UsageError(f"--interval-s {args.interval_s}: expected a positive number of seconds")
    with History.open() as history:
        record = pick(history, args.job)
        if record is None:
            if args.as_json:
                ui.print_json(None)
            ui.info("no active job to watch (name one: jobctl watch JOB; `jobctl history` lists them)")
            return EXIT_OK
        if args.as_json or args.once or not sys.stdout.isatty():
            watcher = Watcher(history, record)
            snap = watcher.poll()
            if args.as_json:
                ui.print_json(snap)
            else:
                ui.render_watch(snap)
            return EXIT_INTERNAL if snap["ended"] and not snap["completed"] else EXIT_OK
        with ui.live_watch() as show:
            return follow(history, record, args.interval_s, show)


def pick(history, ref: str | None):
    """The named job; without a name the newest job still active after asking the scheduler."""
    from jobctl.cli.history import resolve
    from jobctl.cli.status import refresh_live

    if ref is not None:
        return resolve(history, [ref])[0]
    active = history.active()
    refresh_live(history, active)
    still = [r for r in (history.get(r.id) for r in active) if not r.terminal]
    return max(still, key=lambda r: r.id) if still else None


def follow(history, record, interval_s: float, show, sleep=time.sleep, clock=time.monotonic) -> int:
    """Show a snapshot every `interval_s` until the chain ends: 0 if it ended COMPLETED, 1 if
    not, 130 on Ctrl-C (quietly: the last view stays on the screen)."""
    watcher = Watcher(history, record, clock=clock, tolerate_scheduler_errors=True)
    try:
        while True:
            snap = watcher.poll()
            show(snap)
            if snap["ended"]:
                return EXIT_OK if snap["completed"] else EXIT_INTERNAL
            sleep(interval_s)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


class Watcher:
    """One job's view, refreshed by `poll`: follows the chain to its newest attempt and keeps
    the sampler CSVs' read offsets of the attempt it shows."""

    def __init__(self, history, record, clock=time.monotonic, tolerate_scheduler_errors: bool = False):
        self.history = history
        self.tolerate = tolerate_scheduler_errors  # live: a slow sacct must not end the view
        self.start_id = record.id
        self.tip = record
        self._clock = clock
        self._tail = None
        self._failed_at: float | None = None  # when the tip was first seen failed with no successor

    def poll(self) -> dict:
        """Ask the scheduler about the chain's unfinished attempts (one query), move to the
        newest attempt, and return the snapshot (the object `--json` prints)."""
        from jobctl.cli.history import job_row
        from jobctl.cli.status import refresh_live
        from jobctl.errors import SchedulerError
        from jobctl.jobs.report import attempts, chain_text, lineage

        tip = self._newest(self.history.get(self.tip.id))
        scheduler_error = None
        try:
            current = refresh_live(self.history, lineage(self.history, tip))
        except SchedulerError as e:
            if not self.tolerate:
                raise
            current, scheduler_error = {}, f"{e.message}; showing the recorded states, asking again"
        # A failure seen just now may already have a successor: show it at once (the
        # scheduler is asked about it on the next poll; until then its recorded state).
        tip = self._newest(self.history.get(tip.id))
        if tip.id != self.tip.id:
            self._tail, self._failed_at = None, None
        self.tip = tip
        chain = attempts(lineage(self.history, tip))
        recovering = self._recovering(tip)
        ended = (tip.terminal and not recovering) or (tip.state.value == "PREPARED" and not tip.scheduler_job_id)
        return {
            "watching": self.start_id,
            "job": job_row(self.history, tip, current.get(tip.id)),
            "chain": chain,
            "chain_text": chain_text(chain),
            "memory": self._memory(tip),
            "recovering": recovering,
            "ended": ended,
            "completed": tip.state.value == "COMPLETED",
            "scheduler_error": scheduler_error,
        }

    def _newest(self, record):
        """Follow failed attempts to the attempt their first node submitted (watch.successor)."""
        from jobctl.store.history import UnknownJobError
        from jobctl.jobs.watch import successor

        seen = {record.id}
        while record.terminal and record.state.value != "COMPLETED":
            nxt = successor(self.history, record, grace_s=0)
            if nxt is None or nxt in seen:
                break
            try:
                record = self.history.get(nxt)
            except UnknownJobError:  # submitted into another history (JOBCTL_HOME differs)
                break
            seen.add(record.id)
        return record

    def _recovering(self, tip) -> bool:
        """Whether a failed attempt's first node may still submit the next one: its outcome
        says the ladder applies and neither successor.json nor final.json exists yet (bounded
        by RECOVERY_WAIT_S from when the failure was first seen)."""
        if not tip.terminal or tip.state.value in ("COMPLETED", "CANCELLED") or not pending_recovery(tip):
            return False
        now = self._clock()
        if self._failed_at is None:
            # Counted from the recorded end when there is one: an attempt that failed long
            # ago and left neither file never will.
            ended = _age_s(tip.ended_at)
            self._failed_at = now - (ended or 0.0)
        return now - self._failed_at < RECOVERY_WAIT_S

    def _memory(self, tip) -> dict:
        from jobctl.jobs.report import SamplerTail, folder_of, plan_memory, sampler_notes

        if self._tail is None:
            self._tail = SamplerTail(folder_of(tip))
        gpus = self._tail.update()
        mem = plan_memory(folder_of(tip))
        predicted = tip.predicted_peak_bytes or mem.get("predicted_peak_bytes")
        nodes = []
        for node in sorted({g["node"] for g in gpus}):
            mine = [g for g in gpus if g["node"] == node]
            latest = [g["latest_bytes"] for g in mine if g["latest_bytes"] is not None]
            peak = max((g for g in mine if g["peak_bytes"] is not None), key=lambda g: g["peak_bytes"], default=None)
            nodes.append({"node": node, "gpus": mine, "gpu_count": len(mine),
                          "latest_max_bytes": max(latest) if latest else None,
                          "latest_at": max((g["latest_at"] for g in mine if g["latest_at"]), default=None),
                          "peak_bytes": peak["peak_bytes"] if peak else None,
                          "peak_gpu": peak["gpu"] if peak else None})
        why = None
        if not gpus:
            notes = sampler_notes(folder_of(tip))
            why = "no GPU samples" + (f" ({'; '.join(notes)})" if notes else
                                      " yet" if not tip.terminal else "")
        return {"predicted_peak_bytes": predicted, "gpu_usable_bytes": mem.get("gpu_usable_bytes"),
                "nodes": nodes, "no_samples": why}


def pending_recovery(record) -> bool:
    """Whether the first node of a failed job is, by its folder, about to submit a successor."""
    from jobctl.jobs.recovery import job_failure
    from jobctl.jobs.report import folder_of, outcomes, read_json

    folder = folder_of(record)
    if folder is None or not (folder / "job.json").exists():
        return False
    if any((folder / name).exists() for name in ("successor.json", "final.json", "recovery-error.txt")):
        return False
    records = [o for o in outcomes(folder) if isinstance(o.get("failure"), dict)]
    if not any(o["node_rank"] == 0 for o in records):  # the first node recovers, after its record
        return False
    failure = job_failure(records)
    if failure is None:
        return False
    policy = (read_json(folder / "job.json") or {}).get("policy") or {}
    return (policy.get("retry") or {}).get(failure["kind"], failure.get("retry", "none")) == "ladder"


def _age_s(iso: str | None) -> float | None:
    """Seconds since a history timestamp (UTC ISO); None when there is none."""
    from datetime import datetime, timezone

    if not iso:
        return None
    try:
        return max(0.0, (datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds())
    except ValueError:
        return None
