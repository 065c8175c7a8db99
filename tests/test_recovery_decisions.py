"""Recovery's decision tree without Slurm, a history or a framework (jobs/recovery.py
`stop_before_looking`, `stop_after_looking`): which failures look for a next plan, and when a
chain stops. The expected actions are docs/recovery.md's table, written out here:

| CUDA_OOM | the OOM ladder | HOST_OOM | less offload | TIMEOUT, PREEMPTED, NODE_FAIL | requeued by
the scheduler | NCCL, USER_ERROR, CANCELLED | nothing |

and `--max-attempts N` (README, "Monitoring and recovery"): at most N attempts in a chain, the
first included."""

from __future__ import annotations

import pytest

from jobctl.jobs.recovery import stop_after_looking, stop_before_looking
from jobctl.model import Failure, FailureKind, RetryAction, RetryPolicy

K = FailureKind


def failure(kind: FailureKind) -> Failure:
    return Failure(kind, f"{kind.value}: what happened", "the log line", RetryAction.NONE)


@pytest.mark.parametrize("kind", [K.CUDA_OOM, K.HOST_OOM])
def test_the_two_oom_kinds_look_for_a_next_plan(kind):
    assert stop_before_looking(failure(kind), RetryPolicy()) is None


@pytest.mark.parametrize("kind", [K.TIMEOUT, K.PREEMPTED, K.NODE_FAIL])
def test_endings_from_outside_are_left_to_the_schedulers_requeue(kind):
    why = stop_before_looking(failure(kind), RetryPolicy())
    assert why is not None and "requeues the same plan" in why and why.startswith(kind.value)


@pytest.mark.parametrize("kind", [K.NCCL, K.USER_ERROR, K.CANCELLED])
def test_the_rest_waits_for_a_person(kind):
    why = stop_before_looking(failure(kind), RetryPolicy())
    assert why == f"{kind.value}: not retried ({kind.value}: what happened)"


def test_a_users_override_turns_the_ladder_off_or_on():
    off = RetryPolicy(overrides={K.CUDA_OOM: RetryAction.NONE})
    assert "not retried" in stop_before_looking(failure(K.CUDA_OOM), off)
    on = RetryPolicy(overrides={K.NCCL: RetryAction.LADDER})
    assert stop_before_looking(failure(K.NCCL), on) is None


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
def test_a_chain_has_at_most_max_attempts_jobs(max_attempts):
    # attempt k failed; a next job would be attempt k + 1: allowed while k + 1 <= max_attempts
    for attempt in range(1, max_attempts + 3):
        why = stop_after_looking(failure(K.CUDA_OOM), attempt, max_attempts, "micro-batch", None)
        if attempt + 1 <= max_attempts:
            assert why is None, (attempt, max_attempts)
        else:
            assert why == (f"CUDA_OOM on attempt {attempt} of {max_attempts}: giving up before the next step "
                           "(micro-batch) -- raise --max-attempts to allow more"), (attempt, max_attempts)


def test_the_ladders_bottom_stops_the_chain_whatever_the_attempts_left():
    why = stop_after_looking(failure(K.CUDA_OOM), 1, 10, None, "the ladder is at its bottom")
    assert why == "CUDA_OOM: the ladder is at its bottom"


def test_a_hang_or_a_hardware_fault_is_resubmitted_unless_the_job_says_not():
    """Issue 30: HANG and HARDWARE look for the next attempt (the same plan, resuming, without
    the node); `--retry HANG=none` keeps a person in charge."""
    from jobctl.model import RETRY_TABLE

    for kind in (FailureKind.HANG, FailureKind.HARDWARE):
        failure = Failure(kind, f"{kind}: x", "x", RETRY_TABLE[kind])
        assert stop_before_looking(failure, RetryPolicy()) is None
        stopped = stop_before_looking(failure, RetryPolicy.with_overrides([f"{kind.value}=none"]))
        assert stopped == f"{kind}: not retried ({kind}: x)"
