"""A history such as a user has after a week (tests of what `history` and `status` print): an
OOM chain of three attempts, a job on a remote cluster with a long recipe name that lost a
node, a sweep of three array tasks, a local job killed by a signal, one that never reached the
scheduler. Every time is fixed (this year, so tables show "MM-DD HH:MM"), every job has ended:
`status` asks no scheduler about them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

PLAN = {"nodes": 16, "gpus_per_node": 8, "world_size": 128, "tp": 8, "pp": 2, "dp": 8, "cp": 1}
LONG_RECIPE = "llama-3.1-405b-instruct-long-context-continued-pretraining"
REMOTE_CLUSTER = "eu-west-h100-remote-datacenter"


def start() -> datetime:
    return datetime(datetime.now(timezone.utc).year, 1, 2, 3, 4, tzinfo=timezone.utc)


def fill(history) -> dict[str, list[int]]:
    """Record the jobs in `history` (a fresh jobctl.store.history.History); their ids by kind."""
    t0 = start()
    h = history

    def job(recipe, cluster, scheduler, *, parent=None, sweep=None, sched_id=None, kind=None, state="COMPLETED",
            exit_code=None, nodes=16, minutes=197, at=0):
        when = t0 + timedelta(hours=at)
        jid = h.prepare(recipe_name=recipe, recipe_text=f"name: {recipe}\n", plan=dict(PLAN, nodes=nodes),
                        cluster=cluster, scheduler=scheduler, parent_id=parent, sweep_id=sweep)
        h.mark_submitted(jid, sched_id or str(40000 + jid), None, at=when)
        h.transition(jid, "RUNNING", at=when + timedelta(minutes=2))
        h.transition(jid, state, at=when + timedelta(minutes=2 + minutes), failure_kind=kind, exit_code=exit_code)
        return jid

    ids: dict[str, list[int]] = {}
    a = job("llama70b", "h100", "slurm", kind="CUDA_OOM", state="FAILED", exit_code="1:0", minutes=3)
    b = job("llama70b", "h100", "slurm", parent=a, kind="CUDA_OOM", state="FAILED", exit_code="1:0", minutes=4, at=1)
    c = job("llama70b", "h100", "slurm", parent=b, at=2)
    ids["chain"] = [a, b, c]
    ids["remote"] = [job(LONG_RECIPE, REMOTE_CLUSTER, "slurm", kind="NODE_FAIL", state="NODE_FAIL", nodes=1024,
                         sched_id="123456789_12", minutes=1500, at=3)]
    ids["sweep"] = [job("tiny-sweep", "dev", "slurm", sweep="a1b2c3d4e5f6", sched_id=f"555000_{i}", nodes=1,
                        minutes=1, at=4) for i in range(3)]
    ids["signal"] = [job("tiny", "local", "local", state="FAILED", exit_code="0:9", nodes=1, minutes=0, at=5)]
    never = h.prepare(recipe_name="llama8b", recipe_text="name: llama8b\n", plan=dict(PLAN, nodes=2), cluster="h100",
                      scheduler="slurm")
    h.mark_submit_failed(never, "sbatch: error: Batch job submission failed: Invalid account", at=t0 + timedelta(hours=6))
    ids["never"] = [never]
    return ids
