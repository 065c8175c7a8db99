"""What each job command asks of the history, one function per command: it opens the history,
does the work with the other jobs/ modules and returns plain data (the CLI prints it). The
CLI itself opens no database."""

from __future__ import annotations

from collections.abc import Callable

from jobctl.errors import EXIT_OK
from jobctl.store.history import History, check_file, reset_file


def status_rows(refs: list[str], recent: int) -> list[dict]:
    """`status`: the jobs named (or the active ones and the `recent` newest), asked of their
    scheduler in one query each, every change recorded; one row each (jobs.status.job_row)."""
    from jobctl.jobs.status import job_row, refresh_live, select

    with History.open() as history:
        records = select(history, refs, recent)
        current = refresh_live(history, records)
        records = [history.get(r.id) for r in records]  # the states just recorded
        return [job_row(history, r, current.get(r.id)) for r in records]


def history_rows(recipe: str | None, states: list | None, cluster: str | None,
                 limit: int | None) -> tuple[list[dict], bool]:
    """`history`: the recorded jobs, newest first, and whether there are more than `limit`."""
    from jobctl.jobs.status import job_row

    with History.open() as history:
        records = history.list(recipe=recipe, state=states, cluster=cluster,
                               limit=None if limit is None else limit + 1)
        more = limit is not None and len(records) > limit
        return [job_row(history, r) for r in records[:limit]], more


def forget_learned(ref: str) -> tuple[int, dict | None]:
    """`history --forget-learned JOB`: drop the memory calibration job JOB's CUDA OOM recorded, so
    that no plan applies it again; (the job's id, the calibration dropped or None)."""
    from jobctl.jobs.status import resolve

    with History.open() as history:
        (record,) = resolve(history, [ref])
        extra = dict(record.extra)
        dropped = extra.pop("calibration", None)
        if dropped is not None:
            history.set_extra(record.id, extra)
        return record.id, dropped


def cancel_jobs(refs: list[str], say: Callable[[str], None]) -> list[dict]:
    """`cancel`: every job named (all must be known, or nothing is cancelled), in that order."""
    from jobctl.jobs.cancel import cancel_records
    from jobctl.jobs.status import resolve

    with History.open() as history:
        records = resolve(history, refs)
        results = cancel_records(history, records, say=say)
    return [results[r.id] for r in records]


def show_logs(ref: str, node: int, follow: bool, write: Callable[[str], object], say: Callable[[str], None]) -> None:
    """`logs`: a job's log on `node` (a remote job's folder copied first); with `follow`, until
    the job ends. UsageError when it has none yet."""
    from jobctl.jobs import logs
    from jobctl.jobs.status import resolve, sync_copies

    with History.open() as history:
        rec = resolve(history, [ref])[0]
        sync_copies(history, [rec])  # a remote job: copy what changed in its folder
        rec = history.get(rec.id)
        paths = logs.log_paths(rec, node)
        if follow and not rec.terminal:
            rec = logs.follow(history, rec, paths, node, write, say)
            say(f"#{rec.id}: {rec.state.value}" + (f" ({rec.ending})" if rec.ending else ""))
            return
        tails = logs.open_tails(paths, say)
        if not tails:
            raise logs.no_log(rec, node, paths)
        for t in tails:
            t.pump(write)


def job_report(ref: str) -> tuple[dict, list]:
    """`report`: memory measured against the plan, the attempt chain; and the GPU samples."""
    from jobctl.jobs.report import build
    from jobctl.jobs.status import resolve

    with History.open() as history:
        (record,) = resolve(history, [ref])
        return build(history, record)


def requeue_job(ref: str, *, smaller: bool, tried_to_allocate_bytes: int | None, wait: bool,
                say: Callable[[str], None] | None) -> tuple[dict, int]:
    """`requeue`: the job again (the same plan, or the ladder's next with `smaller`) as a new
    attempt; (what was submitted, the exit code: with `wait`, how it ended)."""
    from jobctl.jobs.requeue import requeue
    from jobctl.jobs.status import resolve
    from jobctl.jobs.watch import wait_for

    quiet = say or (lambda text: None)
    with History.open() as history:
        (record,) = resolve(history, [ref])
        out, res = requeue(history, record, smaller=smaller, tried_to_allocate_bytes=tried_to_allocate_bytes,
                           say=quiet)
        quiet(f"#{out['jobctl_id']}: attempt {out['attempt']}, parent #{record.id}"
              + (f"; {out['rung']}: {out['reason']}" if out["rung"] else "; the same plan"))
        code = wait_for([res], history, say=say) if wait else EXIT_OK
    return out, code


def watch_snapshot(ref: str | None) -> dict | None:
    """`watch --once`: the job's state, memory and chain now (None: no job to watch)."""
    from jobctl.jobs.watch import Watcher, pick

    with History.open() as history:
        record = pick(history, ref)
        return None if record is None else Watcher(history, record).poll()


def watch_live(ref: str | None, interval_s: float, live) -> int | None:
    """`watch`: follow the job every `interval_s` in `live()` (a context giving the view's
    `show`), until it ends; its exit code, or None when there is no job to watch."""
    from jobctl.jobs.watch import follow, pick

    with History.open() as history:
        record = pick(history, ref)
        if record is None:
            return None
        with live() as show:
            return follow(history, record, interval_s, show)


def submit_jobs(subs: list, inv_loaded, *, token: str, sync_dir: str | None, wait: bool,
                say: Callable[[str], None] | None) -> tuple[list[dict], int]:
    """`submit`: the prepared jobs submitted on the inventory's cluster, each recorded; with
    `wait`, followed to their end (OOM retries included). (results, exit code)."""
    from jobctl.jobs.submission import submit
    from jobctl.jobs.watch import wait_for

    with History.open() as history:
        results = submit(subs, inv_loaded, history, token=token, sync_dir=sync_dir, progress=say)
        code = wait_for(results, history, say=say) if wait else EXIT_OK
    return results, code


def check_history(reset: bool) -> dict:
    """`doctor`: whether the history file is usable (and, with `reset`, moved aside)."""
    report = check_file()
    if reset:
        moved = reset_file()
        report["reset_to"] = str(moved) if moved else None
    return report
