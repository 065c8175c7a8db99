"""The runner's view of progress (jobctl/runtime/progress.py), the hang thresholds
(planner/resilience.py) and which node a failure is pinned to (jobs/recovery.py): pure parts,
with expected values from the frameworks' own output formats and hand derivations."""

from __future__ import annotations

import os
import signal

import pytest

from jobctl.errors import UsageError
from jobctl.jobs.recovery import suspects
from jobctl.model import RETRY_TABLE, Failure, FailureKind, Outcome
from jobctl.planner.resilience import hang_thresholds
from jobctl.runtime import progress as prog


@pytest.mark.parametrize("line, step", [
    ("step 12 loss 2.31", 12),
    ("[rank0]: step: 7  loss:  8.1234  memory: 12.3GiB", 7),  # torchtitan's metrics line
    ("Step=3 lr=1e-4", 3),
    # Megatron-LM's training log (training.py training_log: ' iteration {:8d}/{:8d} |')
    (" [2026-11-28 03:00:00] iteration       10/     100 | consumed samples: 640 |", 10),
    ("ds_train: step 20 loss 0.8369 lr 0.001", 20),
    ("warmup_steps 100", None),  # another word ending in step
    ("saved global_step100", None),
    ("steps 100 planned", None),
    ("no step here", None),
])
def test_a_step_is_read_from_the_lines_frameworks_print(line, step):
    assert prog.step_in(line) == step


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_before_the_first_step_any_output_is_life_after_it_only_a_new_step():
    clock = Clock()
    p = prog.Progress(after_s=10, first_s=30, clock=clock)
    clock.t = 25
    p.line("loading checkpoint shards")  # no step yet: output keeps it alive
    clock.t = 50
    assert p.stalled() is None  # 25 s since the last output, first-step threshold 30
    clock.t = 56
    assert p.stalled() == 31
    p.line("step 1 loss 9.0")
    clock.t = 60
    p.line("a warning, over and over")  # after a step, output alone is not progress
    clock.t = 66
    assert p.stalled() is None  # 10 s since step 1: at the threshold, not past it
    clock.t = 67
    assert p.stalled() == 11
    assert p.verdict(11) == "no progress for 11 s after step 1 (threshold 10 s)"
    p.line("step 1 again")  # the same step is not progress
    assert p.stalled() == 11
    p.line("step 2 loss 8")
    assert p.stalled() is None


def test_a_threshold_of_zero_never_stalls():
    clock = Clock()
    p = prog.Progress(after_s=0, first_s=0, clock=clock)
    clock.t = 1e9
    assert p.stalled() is None


def test_the_hooks_heartbeat_is_progress(tmp_path):
    clock = Clock()
    p = prog.Progress(after_s=10, first_s=30, heartbeat_dir=tmp_path, clock=clock)
    clock.t = 40
    (tmp_path / "node0-rank0").write_text("17")
    assert p.stalled() is None and p.last_step == 17
    clock.t = 51
    assert p.stalled() == 11  # the same file, unchanged: no news
    (tmp_path / "node0-rank0.tmp").write_text("99")  # a write in progress is not read
    assert p.last_step == 17


def test_the_newest_checkpoint_in_each_frameworks_convention(tmp_path):
    meg = tmp_path / "meg"
    meg.mkdir()
    (meg / "iter_0001000").mkdir()
    (meg / "latest_checkpointed_iteration.txt").write_text("1500\n")  # checkpointing.py writes it last
    assert prog.latest_checkpoint(meg) == (1500, str(meg / "iter_0001500"))
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "latest").write_text("global_step42")  # engine.py save_checkpoint's tag
    assert prog.latest_checkpoint(ds) == (42, str(ds / "global_step42"))
    tt = tmp_path / "tt"
    tt.mkdir()
    for name in ("step-10", "step-200", "step-30", "step-300.tmp"):
        (tt / name).mkdir()
    assert prog.latest_checkpoint(tt) == (200, str(tt / "step-200"))  # an unfinished save is not one
    assert prog.latest_checkpoint(tmp_path / "none") is None


def test_a_checkpoint_folder_is_data_to_check(tmp_path):
    # a planted link, a huge marker, a marker that is not a number: none is believed
    (tmp_path / "target.txt").write_text("999999")
    (tmp_path / "latest_checkpointed_iteration.txt").symlink_to(tmp_path / "target.txt")
    assert prog.latest_checkpoint(tmp_path) is None
    (tmp_path / "latest").write_text("9" * 10_000)
    assert prog.latest_checkpoint(tmp_path) is None
    (tmp_path / "latest").write_text("../../etc/passwd")
    assert prog.latest_checkpoint(tmp_path) is None
    (tmp_path / "step-5").symlink_to(tmp_path)
    assert prog.latest_checkpoint(tmp_path) is None


def test_hang_thresholds_by_hand():
    # a 200 s step, a 30 s checkpoint write: three steps and two writes
    first, after = hang_thresholds(200.0, 30.0)
    assert after == pytest.approx(3 * 200.0 + 2 * 30.0)  # 660 s
    assert first == pytest.approx(3 * 660.0)  # 1980 s, above the 1800 s floor
    # Llama 3.1 70B on 128 H100s, a 74 s step and 30.9 s writes: 283.8 s, under the floor
    assert hang_thresholds(74.0, 30.9) == (1800.0, 300.0)
    # a tiny model: the floors (half NCCL's 10-minute collective timeout; 30 min for the first step)
    assert hang_thresholds(0.5, 0.1) == (1800.0, 300.0)
    assert hang_thresholds(None) == (1800.0, 300.0)
    # a user's value replaces the steady one, and the first step gets three times as long
    assert hang_thresholds(74.0, 30.9, hang_after=6) == (18.0, 6.0)
    assert hang_thresholds(74.0, 30.9, hang_after=0) == (0.0, 0.0)


def failure(kind: FailureKind, rank: int | None = 0) -> Failure:
    return Failure(kind, kind.value, "", RETRY_TABLE[kind], node_rank=rank)


def node(rank, host, last_step=None) -> Outcome:
    return Outcome(rank, 1, None, 1.0, "7", host=host, last_step=last_step)


def test_a_hardware_fault_is_pinned_to_its_node():
    outs = [node(0, "gpu01"), node(1, "gpu02")]
    assert suspects(failure(FailureKind.HARDWARE, rank=1), outs) == ["gpu02"]


def test_a_hang_is_pinned_only_to_nodes_that_fell_behind():
    assert suspects(failure(FailureKind.HANG), [node(0, "a", 40), node(1, "b", 41), node(2, "c", 41)]) == ["a"]
    assert suspects(failure(FailureKind.HANG), [node(0, "a", 41), node(1, "b", 41)]) == []  # all stuck alike
    assert suspects(failure(FailureKind.HANG), [node(0, "a", None), node(1, "b", 41)]) == []  # nothing to compare
    assert suspects(failure(FailureKind.NCCL), [node(0, "a", 1), node(1, "b", 41)]) == []


def test_an_outcome_keeps_its_node_and_progress_and_refuses_a_strange_node_name():
    o = Outcome(0, 1, None, 2.0, "9", host="node-1.cluster", last_step=12, checkpoint_step=10)
    assert Outcome.from_dict(o.to_dict(), "x") == o
    with pytest.raises(UsageError, match="host"):
        Outcome.from_dict(o.to_dict() | {"host": "node1; rm -rf /"}, "x")
    with pytest.raises(UsageError):
        Outcome.from_dict(o.to_dict() | {"last_step": -1}, "x")


def test_only_processes_that_registered_the_stack_signal_are_sent_it():
    assert not prog.catches(os.getpid(), prog.STACK_SIGNAL)
    old = signal.signal(prog.STACK_SIGNAL, lambda *a: None)
    try:
        assert prog.catches(os.getpid(), prog.STACK_SIGNAL)
    finally:
        signal.signal(prog.STACK_SIGNAL, old)
    assert os.getpid() in prog.descendants(os.getpid())


class FakeSlurm:
    """Records what it was asked to keep the job off (the real one runs scontrol update:
    tests/test_scale_faults_e2e.py)."""

    def __init__(self):
        self.calls = []

    def keep_off(self, job_id, nodes):
        self.calls.append((job_id, list(nodes)))
        return True


def test_a_node_failed_run_makes_its_node_a_suspect_once_and_the_waiting_job_keeps_off_it(tmp_path):
    from jobctl.jobs.status import _keep_off_failed_nodes
    from jobctl.model import JobStatus
    from jobctl.store.history import History

    with History.open(tmp_path / "h.sqlite") as h:
        jid = h.prepare(recipe_name="r", recipe_text="", plan={}, cluster="dev", scheduler="slurm")
        h.mark_submitted(jid, "1011", str(tmp_path))
        failed = JobStatus("NODE_FAIL", nodes="node1")
        slurm = FakeSlurm()
        _keep_off_failed_nodes(h, h.get(jid), failed, slurm)  # seen failed: a suspect, nothing to update yet
        assert [(s["node"], s["kind"]) for s in h.suspect_nodes("dev")] == [("node1", "NODE_FAIL")]
        assert slurm.calls == []
        pending = JobStatus("PENDING", earlier=(failed,))
        for _ in range(2):  # looked at twice while it waits: asked once, recorded once
            _keep_off_failed_nodes(h, h.get(jid), pending, slurm)
        assert slurm.calls == [("1011", ["node1"])]
        assert len(h._db.execute("SELECT * FROM suspect_nodes").fetchall()) == 1
        # a run on several nodes does not say which one failed: nobody is blamed
        _keep_off_failed_nodes(h, h.get(jid), JobStatus("PENDING", earlier=(JobStatus("NODE_FAIL", nodes="node[1-2]"),)),
                               slurm)
        assert len(slurm.calls) == 1 and len(h.suspect_nodes("dev")) == 1


def test_the_watch_follows_a_node_failed_job_for_a_while_for_its_requeue(monkeypatch):
    from jobctl.jobs import watch
    from jobctl.model import JobStatus

    t = [100.0]
    monkeypatch.setattr(watch.time, "monotonic", lambda: t[0])
    seen = {}
    assert watch._requeue_pending(1, JobStatus("NODE_FAIL"), seen)  # just failed: look again
    t[0] += watch.REQUEUE_GRACE_S - 1
    assert watch._requeue_pending(1, JobStatus("NODE_FAIL"), seen)
    t[0] += 2
    assert not watch._requeue_pending(1, JobStatus("NODE_FAIL"), seen)  # no requeue came: it ended
    assert not watch._requeue_pending(2, JobStatus("FAILED"), seen)  # other endings end at once
    assert not watch._requeue_pending(1, JobStatus("RUNNING"), seen) and 1 not in seen  # back: forgotten


def test_how_far_an_attempt_got_is_shown_from_the_record():
    from jobctl.jobs.attempts import progress_text

    assert progress_text({"last_step": 12, "checkpoint_step": 10}) == "step 12, checkpoint of step 10"
    assert progress_text({"last_step": "12; rm -rf /"}) is None  # not a number: not shown
    assert progress_text(None) is None


def test_a_quiet_node_sees_the_first_nodes_steps_through_the_shared_folder(tmp_path):
    """Only global rank 0 prints steps: node 1's watchdog must see them (published by node 0's
    runner to the job folder's heartbeat folder) and not call its own silence a hang."""
    clock = Clock()
    node0 = prog.Progress(after_s=10, first_s=30, heartbeat_dir=tmp_path, clock=clock,
                          publish=tmp_path / "runner-node0")
    node1 = prog.Progress(after_s=10, first_s=30, heartbeat_dir=tmp_path, clock=clock)
    for step in range(1, 5):
        clock.t += 8
        node0.line(f"step {step} loss 2.0")
        os.utime(tmp_path / "runner-node0", (step, step))  # a new mtime for each write (coarse clocks)
        assert node1.stalled() is None
    assert node1.last_step == 4
    clock.t += 11
    assert node1.stalled() == 11  # node 0 stopped too: the whole job is stuck


def test_before_the_first_step_the_first_nodes_output_keeps_the_others_alive(tmp_path):
    clock = Clock()
    node0 = prog.Progress(after_s=10, first_s=30, heartbeat_dir=tmp_path, clock=clock,
                          publish=tmp_path / "runner-node0")
    node1 = prog.Progress(after_s=10, first_s=30, heartbeat_dir=tmp_path, clock=clock)
    for i in range(1, 5):  # 80 s of loading messages on node 0, none on node 1
        clock.t += 20
        node0.line("loading shard ...")
        os.utime(tmp_path / "runner-node0", (i, i))
        assert node1.stalled() is None
    assert node1.last_step is None  # life, not a step: still the first-step threshold


def test_a_mirror_of_the_job_folder_leaves_the_checkpoints_where_they_are(tmp_path):
    from jobctl.store.folder import JobFolder

    (tmp_path / "checkpoints" / "step-5").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-5" / "shard-0.distcp").write_text("x" * 10)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-0.log").write_text("step 5\n")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "node0.txt").write_text("Thread ...\n")
    assert sorted(f.name for f in JobFolder(tmp_path).files()) == ["logs/node-0.log", "stacks/node0.txt"]


def test_what_an_earlier_run_left_in_the_heartbeat_folder_is_no_progress(tmp_path):
    (tmp_path / "runner-node0").write_text("15")  # the run before a requeue got to step 15
    clock = Clock()
    p = prog.Progress(after_s=10, first_s=30, heartbeat_dir=tmp_path, clock=clock)
    clock.t = 20
    assert p.stalled() is None and p.last_step is None  # still waiting for this run's first step
    clock.t = 31
    assert p.stalled() == 31
