"""Follow submitted jobs until they end, recording every state change in the history."""

from __future__ import annotations

import sys
import time

from jobctl.errors import EXIT_INTERNAL, EXIT_OK
from jobctl.backends.scheduler import JobState
from jobctl.store.history import TERMINAL_STATES as TERMINAL  # the history's one list of ended states


def refresh(history, records) -> dict:
    """Ask the scheduler once about `records` and record transitions; return {id: JobState}."""
    from jobctl.remote import client as remote_jobs
    from jobctl.backends.scheduler import states

    remote, records = remote_jobs.split(records)
    current = states(records)
    if remote:  # the login node asks its Slurm; the changes are mirrored here (remote_jobs.mirror)
        current.update(remote_jobs.refresh(history, remote))
    for r in records:
        st = current.get(r.id)
        if st is not None and st.state != r.state:
            # expect: only from the state this decision saw (the job may have recorded its own
            # verdict since `records` were read, and sacct can lag it)
            history.transition(r.id, st.state, detail=st.reason, exit_reason=st.exit_code
                               if st.state in TERMINAL and st.state != "COMPLETED" else None, expect=r.state)
    return current


def successor(history, record, grace_s: float = 5.0) -> int | None:
    """The job that continued `record` after a failure (the OOM ladder), if any: from the
    history, or from successor.json in its folder (the folder is the source of truth; the
    first node writes it after submitting). Waits briefly for the file right after the end."""
    import json
    from pathlib import Path

    from jobctl.remote import client as remote_jobs

    folder = Path(record.job_folder or "")
    remote = remote_jobs.cluster_of(record) is not None
    deadline = time.monotonic() + grace_s
    asked = False
    while True:
        meta = folder / "successor.json"
        if meta.exists():
            try:
                return int(json.loads(meta.read_text())["jobctl_id"])
            except (OSError, ValueError, KeyError):
                pass
        if (folder / "final.json").exists() or not (folder / "job.json").exists():
            break
        if remote and (not asked or time.monotonic() <= deadline):
            # the folder is a copy: the first node may have written its verdict since it was made
            remote_jobs.sync(history, [record])
            asked = True
            if (folder / "successor.json").exists() or (folder / "final.json").exists():
                continue
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    children = [r for r in history.chain(record.id) if r.parent_id == record.id]
    return children[-1].id if children else None


def wait_for(results, history, quiet: bool = False, poll_s: float = 1.0, max_poll_s: float = 10.0,
             follow_logs: bool = True) -> int:
    """Poll until every job ends; print the first node's log as it grows. 0 if all completed."""
    from pathlib import Path

    ids = [r["id"] for r in results]
    offsets: dict[int, int] = {}
    delay = poll_s
    while True:
        records = [history.get(i) for i in ids]
        live = [r for r in records if not r.terminal]
        current = refresh(history, live) if live else {}
        for r in records:  # ended in the history (recover records FAILED from inside the job)
            if r.terminal:
                current.setdefault(r.id, JobState(getattr(r.state, "value", r.state), r.exit_reason))
        if follow_logs and not quiet:
            for r in records:
                log = Path(r.job_folder or "") / "logs" / "node-0.log"
                if log.exists():
                    with open(log, "rb") as f:
                        f.seek(offsets.get(r.id, 0))
                        chunk = f.read()
                        offsets[r.id] = f.tell()
                    if chunk:
                        prefix = f"#{r.id} | " if len(ids) > 1 else ""
                        for line in chunk.decode("utf-8", "replace").splitlines():
                            sys.stderr.write(prefix + line + "\n")
        done = [i for i in ids if current.get(i) and current[i].state in TERMINAL]
        # follow attempt chains: a failed job whose first node submitted a successor
        moved = False
        for i in done:
            if current[i].state != "COMPLETED":
                nxt = successor(history, history.get(i))
                if nxt is not None:
                    if not quiet:
                        sys.stderr.write(f"#{i}: {current[i].state}, continued as #{nxt}\n")
                    ids[ids.index(i)] = nxt
                    moved = True
        if moved:
            continue
        if len(done) == len(ids):
            bad = [i for i in ids if current[i].state != "COMPLETED"]
            if not quiet:
                for i in ids:
                    sys.stderr.write(f"#{i}: {current[i].state}" + (f" ({current[i].reason})" if current[i].reason else "") + "\n")
            return EXIT_OK if not bad else EXIT_INTERNAL
        time.sleep(delay)
        delay = min(max_poll_s, delay * 1.5)
