"""The shared vocabulary (jobctl.model): the one retry table and the policy built on it."""

import pytest

from jobctl.errors import UsageError
from jobctl.model import (
    RETRY_TABLE,
    TERMINAL_STATES,
    FailureKind,
    JobState,
    RetryAction,
    RetryPolicy,
    parse_state,
)


def test_the_retry_table_is_the_architecture_decision():
    """docs/architecture.md, decision 4: only a CUDA OOM walks the GPU ladder; a host OOM steps
    the host side down; preemption, timeouts and lost nodes use submitit's requeue of the same
    plan; a hang or a hardware fault is resubmitted; everything else waits for a person. Written out here by hand, kind by kind, so that a
    change to the table is a visible decision."""
    expected = {
        "COMPLETED": "none", "CUDA_OOM": "ladder", "HOST_OOM": "host", "TIMEOUT": "requeue",
        "PREEMPTED": "requeue", "NODE_FAIL": "requeue", "NCCL": "none", "CANCELLED": "none", "USER_ERROR": "none",
        # issue 30: the same plan again as a new attempt, resuming from the chain's checkpoint; a
        # hardware fault's node (and a hang's, when it is pinned to one) left out
        "HARDWARE": "resubmit", "HANG": "resubmit",
    }
    assert {k.value: a.value for k, a in RETRY_TABLE.items()} == expected
    assert set(RETRY_TABLE) == set(FailureKind)  # every kind has an answer


def test_policy_overrides_only_what_the_user_said():
    policy = RetryPolicy.with_overrides(["host_oom=ladder", "CUDA_OOM=none"], max_attempts=5)
    assert policy.action("HOST_OOM") is RetryAction.LADDER
    assert policy.action(FailureKind.CUDA_OOM) is RetryAction.NONE
    assert policy.action("TIMEOUT") is RetryAction.REQUEUE  # untouched
    again = RetryPolicy.from_dict(policy.to_dict())
    assert again == policy and again.max_attempts == 5


@pytest.mark.parametrize("item", ["TIMEOUT=ladder", "CUDA_OOM=requeue", "OOM=ladder", "CUDA_OOM", "=none"])
def test_policy_refuses_what_cannot_be_overridden(item):
    with pytest.raises(UsageError, match="expected KIND=ACTION with KIND one of CUDA_OOM, HOST_OOM, NCCL, "
                                         "HARDWARE, HANG, USER_ERROR and ACTION one of ladder, host, resubmit, none"):
        RetryPolicy.with_overrides([item])


def test_a_policy_written_by_an_older_jobctl_reads_back():
    """job.json of jobctl 0.1.0 spelled the whole table out, with 'none' for kinds it did not retry."""
    old = {"max_attempts": 2, "retry": {"CUDA_OOM": "ladder", "HOST_OOM": "none", "NCCL": "none", "USER_ERROR": "none"},
           "memory_snapshot": False, "sample_interval_s": 5.0, "hooks": True}
    policy = RetryPolicy.from_dict(old)
    # its HOST_OOM "none" was the table then; read back it is an override of today's table
    assert policy.overrides == {FailureKind.HOST_OOM: RetryAction.NONE}
    assert policy.max_attempts == 2 and policy.hooks


def test_states():
    assert parse_state("CANCELLED by 0") is JobState.CANCELLED and parse_state("RUNNING+") is JobState.RUNNING
    assert JobState.COMPLETED.terminal and not JobState.PENDING.terminal
    assert JobState.COMPLETED == "COMPLETED" and str(JobState.FAILED) == "FAILED"
    assert JobState.SUBMIT_FAILED in TERMINAL_STATES and JobState.PREPARED not in TERMINAL_STATES
    with pytest.raises(UsageError, match="unknown job state 'DONE'; allowed: PREPARED, SUBMITTED"):
        parse_state("DONE")
