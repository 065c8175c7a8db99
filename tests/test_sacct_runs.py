"""sacct -D lists every run of a requeued job; the backend keeps the earlier ones (what the
history needs to record a node failure it never saw). The text is what Slurm 22.05 on the dev
cluster printed for a job whose node was set DOWN while it ran (2026-11-25)."""

from jobctl.backends.slurm import parse_sacct
from jobctl.model import JobState

REQUEUED = """439|NODE_FAIL|0:0|2026-11-25T19:52:25|2026-11-25T19:52:33|node1|None
439|PENDING|0:0|Unknown|Unknown|None assigned|BeginTime
440|COMPLETED|0:0|2026-11-25T19:53:00|2026-11-25T19:53:05|node2|None
"""


def test_the_latest_run_is_the_state_and_the_earlier_ones_are_kept():
    out = parse_sacct(REQUEUED)
    assert out["439"].state is JobState.PENDING and out["439"].reason == "BeginTime"
    (run,) = out["439"].earlier
    assert (run.state, run.start, run.end, run.nodes) == (JobState.NODE_FAIL, "2026-11-25T19:52:25",
                                                          "2026-11-25T19:52:33", "node1")
    assert out["440"].state is JobState.COMPLETED and out["440"].earlier == ()
