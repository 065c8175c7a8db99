"""Print a job's log (one node's), or follow it until the job ends."""

from __future__ import annotations

import codecs
import json
import sys
import time
from pathlib import Path

from jobctl.errors import UsageError

HELP = "print a job's log (logs/node-N.log in its folder); -f follows it until the job ends"
EPILOG = """examples:
  jobctl logs 12                  # node 0's log
  jobctl logs 12 --node 1         # another node of a multi-node job
  jobctl logs slurm:4242 -f       # follow until the job ends (Ctrl-C stops following)

The log is <job folder>/logs/node-N.log, written by the job; before it exists (or when the job
failed before starting the command) submitit's own stdout/stderr files are shown instead.
exit codes: 0 ok, 2 unknown job, no such node or no log yet, 4 the scheduler cannot be reached,
            130 interrupted (Ctrl-C while following)."""

POLL_S = 0.5  # how often a followed file is read
REFRESH_S = 2.0  # how often the scheduler is asked whether the job has ended


def add_arguments(p) -> None:
    p.add_argument("job", metavar="JOB", help="jobctl id (12, #12) or scheduler id (slurm:4242)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows, until the job ends")
    p.add_argument("--node", "-N", type=int, default=0, metavar="N", help="which node's log (default 0)")


def run(args) -> int:
    from jobctl.cli.history import resolve
    from jobctl.store.history import History

    try:
        with History.open() as history:
            rec = resolve(history, [args.job])[0]
            from jobctl.remote import client as remote_jobs

            if remote_jobs.cluster_of(rec) and rec.scheduler_job_id:  # copy what changed in its folder
                remote_jobs.sync(history, [rec])
                rec = history.get(rec.id)
            nodes = int(rec.plan.get("nodes") or 1)
            if not 0 <= args.node < nodes:
                raise UsageError(f"job #{rec.id} has {nodes} node(s), so no node {args.node}",
                                 hint="use --node 0" + (f" to --node {nodes - 1}" if nodes > 1 else ""))
            if not rec.job_folder:
                raise UsageError(f"job #{rec.id} has no job folder and no log: it was never submitted "
                                 f"(state {rec.state.value})", hint=f"see `jobctl status {rec.id}`")
            paths = log_paths(rec, args.node)
            if args.follow and not rec.terminal:
                return follow(history, rec, paths, args.node)
            tails = _open_tails(paths)
            if not tails:
                raise _no_log(rec, args.node, paths)
            for t in tails:
                t.pump(sys.stdout)
            return 0
    except KeyboardInterrupt:
        sys.stdout.flush()
        return 130  # Ctrl-C while following: the usual way out, nothing to report


def log_paths(rec, node: int) -> dict:
    """Where a node's output can be: jobctl's copy, then submitit's stdout and stderr files."""
    folder = Path(rec.job_folder)
    job_id, sub_folder = rec.scheduler_job_id, folder
    meta = folder / "submitit.json"
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
        job_id, sub_folder = data.get("job_id") or job_id, Path(data.get("submitit_folder") or folder)
    except (OSError, ValueError):
        pass
    # submitit names its files <job id>_<task>_log.out; one task per node, so task = node rank.
    return {"node": folder / "logs" / f"node-{node}.log",
            "stdout": sub_folder / f"{job_id}_{node}_log.out",
            "stderr": sub_folder / f"{job_id}_{node}_log.err"}


class _Tail:
    """A file read from where the last read stopped (bytes; UTF-8 decoded across chunk edges)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def pump(self, out) -> None:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self.offset)
            while chunk := f.read(1 << 16):
                self.offset += len(chunk)
                out.write(self._decoder.decode(chunk))
        out.flush()


def _open_tails(paths: dict) -> list[_Tail]:
    """jobctl's node log if it exists, else whichever of submitit's files exist."""
    from jobctl import ui

    if paths["node"].exists():
        return [_Tail(paths["node"])]
    found = [paths[k] for k in ("stdout", "stderr") if paths[k].exists()]
    if found:
        ui.info(f"no {paths['node']} yet; showing submitit's " + " and ".join(str(p) for p in found))
    return [_Tail(p) for p in found]


def _no_log(rec, node: int, paths: dict) -> UsageError:
    where = ", ".join(str(p) for p in paths.values())
    if rec.terminal:
        hint = f"the job ended ({rec.state.value}) without writing one; see `jobctl status {rec.id}`"
    else:
        hint = f"the job has not started writing yet; `jobctl logs {rec.id} -f` waits for it"
    return UsageError(f"no log yet for job #{rec.id} node {node} (looked for {where})", hint=hint)


def follow(history, rec, paths: dict, node: int, poll_s: float = POLL_S, refresh_s: float = REFRESH_S) -> int:
    """Print the log as it grows; ask the scheduler every `refresh_s` whether the job has
    ended (recording what changed) and stop, after a last read, when it has."""
    from jobctl import ui
    from jobctl.jobs.watch import refresh

    tails: list[_Tail] = []
    asked = 0.0
    while True:
        if not tails:
            tails = _open_tails(paths)
        for t in tails:
            t.pump(sys.stdout)
        if time.monotonic() - asked >= refresh_s:
            refresh(history, [rec])
            rec = history.get(rec.id)
            asked = time.monotonic()
            if rec.terminal:
                tails = tails or _open_tails(paths)
                if not tails:
                    raise _no_log(rec, node, paths)
                for t in tails:
                    t.pump(sys.stdout)
                ui.info(f"#{rec.id}: {rec.state.value}" + (f" ({rec.exit_reason})" if rec.exit_reason else ""))
                return 0
        time.sleep(poll_s)
