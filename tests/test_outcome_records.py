"""One class carries a CUDA OOM's figures (model.OOMFigures) and one an outcome record
(model.Outcome): both validated when read back from a job folder, which sits on a shared file
system (docs/security.md): a damaged record is refused by name, never half-read."""

from __future__ import annotations

import json

import pytest

from jobctl.errors import UsageError
from jobctl.model import Failure, FailureKind, OOMFigures, Outcome, RetryAction
from jobctl.runtime.outcome import job_failure, measured_peaks, read_outcomes
from jobctl.store.folder import JobFolder

GIB = 1 << 30
# PyTorch 2.x's message for the figures below (tests/data/failures has the whole logs):
# "Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.14 GiB of which 1.20 GiB is free."
OOM = OOMFigures(tried_to_allocate_bytes=4198330532, total_capacity_bytes=84975474524, free_bytes=1288490189,
                 gpu_index=0)


def record(rank: int, kind: str = "CUDA_OOM", **extra) -> dict:
    return {"node_rank": rank, "exit_code": 1, "signal": None, "duration_s": 12.5, "job_id": "4242",
            "argv": ["python", "train.py"], "peak_memory_bytes_by_gpu": {"0": 70 * GIB, "1": 71 * GIB},
            "failure": {"kind": kind, "summary": f"{kind}: x", "evidence": "line", "retry": "ladder",
                        "oom": OOM.to_dict() if kind == "CUDA_OOM" else None}} | extra


def test_figures_round_trip_and_leave_unknown_ones_out():
    assert OOM.to_dict() == {"tried_to_allocate_bytes": 4198330532, "total_capacity_bytes": 84975474524,
                             "free_bytes": 1288490189, "gpu_index": 0}
    assert OOMFigures.from_dict(OOM.to_dict(), "x") == OOM
    assert OOMFigures.from_dict(None, "x") == OOMFigures()
    assert OOMFigures.from_dict({"tried_to_allocate_bytes": 2.0 * GIB, "note": "ignored"}, "x") == OOMFigures(2 * GIB)


@pytest.mark.parametrize("bad", [-1, True, "3.91 GiB", 1.5, 1 << 60, [1]])
def test_a_figure_that_is_not_a_byte_count_is_refused_by_name(bad):
    with pytest.raises(UsageError) as e:
        OOMFigures.from_dict({"free_bytes": bad}, "outcome-node0.json")
    assert "outcome-node0.json: free_bytes" in e.value.message


def test_an_outcome_round_trips_and_the_job_failure_names_its_node():
    o = Outcome.from_dict(record(1), "f")
    assert Outcome.from_dict(o.to_dict(), "f") == o
    assert o.failure.oom == OOM and o.failed
    nccl = Outcome.from_dict(record(0, "NCCL"), "f")
    f = job_failure([nccl, o])  # the OOM on node 1 is the cause, NCCL on node 0 its echo
    assert (f.kind, f.node_rank, f.oom) == (FailureKind.CUDA_OOM, 1, OOM)
    assert sorted(measured_peaks([nccl, o])) == [70 * GIB, 70 * GIB, 71 * GIB, 71 * GIB]


@pytest.mark.parametrize("damage", [
    {"node_rank": "0"}, {"node_rank": -2}, {"exit_code": "1"}, {"duration_s": "long"},
    {"argv": "python train.py"}, {"peak_memory_bytes_by_gpu": {"0": -5}},
    {"failure": {"kind": "EXPLODED", "summary": "?"}}, {"failure": "CUDA_OOM"},
    {"failure": {"kind": "CUDA_OOM", "oom": {"tried_to_allocate_bytes": "lots"}}},
])
def test_damaged_records_are_refused_and_skipped_when_read_back(tmp_path, damage):
    with pytest.raises(UsageError):
        Outcome.from_dict(record(0) | damage, "outcome-node0.json")
    folder = tmp_path / "job"
    (folder / "logs").mkdir(parents=True)
    (folder / "outcome-node0.json").write_text(json.dumps(record(0) | damage))
    (folder / "outcome-node1.json").write_text(json.dumps(record(1, "NCCL")))
    read = read_outcomes(JobFolder(folder))
    assert [o.node_rank for o in read] == [1]  # node 0's damaged record is as good as none


def test_a_failure_reads_back_with_its_table_action_when_the_record_has_none():
    f = Failure.from_dict({"kind": "HOST_OOM", "summary": "s", "evidence": "e"}, "x")
    assert f.retry is RetryAction.HOST and f.oom is None and f.node_rank is None
