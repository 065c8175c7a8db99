"""End-to-end checks of the dev Slurm cluster started by scripts/dev-cluster.sh.

Real jobs on a real Slurm: a 2-node job with 8 (fake) GPUs per node, and accounting
through slurmdbd (sacct). Skipped where the cluster cannot run unless
JOBCTL_REQUIRE_SLURM=1 (see tests/slurm_fixture.py).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from slurm_fixture import TERMINAL_STATES, slurm_cluster  # noqa: F401  (pytest fixture)

ALL_GPUS = ",".join(str(i) for i in range(8))


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def _sbatch(args: list[str]) -> str:
    res = _run(["sbatch", "--parsable", *args])
    assert res.returncode == 0, f"sbatch failed: {res.stderr}"
    job_id = res.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"unexpected sbatch output: {res.stdout!r}"
    return job_id


def _job_state(job_id: str) -> str | None:
    """State of the job's allocation line in sacct, or None while sacct has no row."""
    res = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"])
    assert res.returncode == 0, f"sacct failed: {res.stderr}"
    rows = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    if not rows:
        return None
    return rows[0].split()[0]  # "CANCELLED by 0" -> "CANCELLED"


def _in_queue(job_id: str) -> bool:
    res = _run(["squeue", "-h", "-j", job_id, "-o", "%i"])
    return res.returncode == 0 and bool(res.stdout.strip())


def _wait_for_job(job_id: str, timeout: float = 180) -> str:
    """Wait (bounded) until the job has left the queue and sacct shows a final state."""
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = _job_state(job_id)
        if state in TERMINAL_STATES and not _in_queue(job_id):
            return state
        time.sleep(1)
    diag = _run(["scontrol", "show", "job", job_id]).stdout
    raise AssertionError(f"job {job_id} not finished after {timeout}s (state {state}):\n{diag}")


def test_two_node_gpu_job(slurm_cluster: str, tmp_path: Path) -> None:
    job_id = _sbatch(
        [
            "--job-name=jobctl-dev-2node",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--gres=gpu:8",
            "--time=5",
            f"--chdir={tmp_path}",
            f"--output={tmp_path}/job-%j.out",
            "--wrap",
            "srun bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
        ]
    )
    state = _wait_for_job(job_id)
    out_file = tmp_path / f"job-{job_id}.out"
    output = out_file.read_text() if out_file.exists() else "<no output file>"
    assert state == "COMPLETED", f"job {job_id} ended {state}; output:\n{output}"

    lines = sorted(line.split() for line in output.splitlines() if line.strip())
    assert lines == [["node1", ALL_GPUS], ["node2", ALL_GPUS]], output


def test_accounting(slurm_cluster: str) -> None:
    # slurmdbd is up and the cluster registered itself
    res = _run(["sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster"])
    assert res.returncode == 0, res.stderr
    assert "jobctl-dev" in res.stdout.split(), res.stdout

    res = _run(["sacct", "-a", "-X", "-n", "-P", "-S", "now-1days", "-o", "JobID,State"])
    assert res.returncode == 0, res.stderr
    assert "disabled" not in res.stderr.lower(), res.stderr

    # a finished job is in the accounting database, GPUs tracked as a TRES
    job_id = _sbatch(
        ["--job-name=jobctl-dev-acct", "--gres=gpu:1", "--output=/dev/null", "--wrap", "true"]
    )
    assert _wait_for_job(job_id, timeout=120) == "COMPLETED"
    res = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,AllocTRES"])
    assert res.returncode == 0, res.stderr
    job_id_col, state, tres = res.stdout.strip().splitlines()[0].split("|")
    assert (job_id_col, state) == (job_id, "COMPLETED")
    assert "gres/gpu=1" in tres.split(","), tres
