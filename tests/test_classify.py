"""The failure classifier against real message texts (tests/data/failures) and its precedence rules."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from jobctl.model import RETRY_TABLE, Failure, FailureKind, OOMFigures
from jobctl.model import RetryAction as Retry
from jobctl.runtime.classify import (
    EVIDENCE_MAX_CHARS,
    SCAN_TAIL_CHARS,
    classify,
    parse_oom,
    parse_size,
)

FIXTURES = Path(__file__).parent / "data" / "failures"
FIXTURE_FILES = sorted(FIXTURES.glob("*.txt"))
HEADER_END = "#---"
K = FailureKind

# The messages of the fixtures (their headers cite the sources), for the inline cases.
OOM_V21 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity "
           "of 79.14 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.93 GiB "
           "memory in use. Of the allocated memory 75.10 GiB is allocated by PyTorch, and 1.52 GiB is reserved "
           "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
WATCHDOG = ("[rank3]:[E502 03:24:09.401823431 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=18211, OpType=ALLREDUCE, NumelIn=65667072, NumelOut=65667072, "
            "Timeout(ms)=600000) ran for 600000 milliseconds before timing out.")
REMOTE = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
          "remote process exited or there was a network error, NCCL version 2.20.5\n"
          "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
          "prematurely.")
KERNEL_OOM = ("[Thu May  2 03:14:05 2024] Out of memory: Killed process 88121 (python3) total-vm:1033812448kB, "
              "anon-rss:1006211220kB, file-rss:1024kB, shmem-rss:8192kB, UID:1000 pgtables:1972044kB "
              "oom_score_adj:0")
TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 64, in main\n'
             '    cfg = load_config(args.config)\nValueError: unknown optimizer "adamw8"\n')


def load_fixture(path: Path) -> tuple[dict, str]:
    """The header's `key: value` lines and the log after the "#---" line, carriage returns kept."""
    raw = path.read_bytes().decode("utf-8")
    head, sep, log = raw.partition(HEADER_END + "\n")
    assert sep, f"{path.name}: no {HEADER_END} line ending the header"
    meta = {}
    for line in head.splitlines():
        assert line.startswith("#"), f"{path.name}: header line without '#': {line!r}"
        key, colon, value = line[1:].strip().partition(":")
        if colon and key in ("expect", "exit_code", "signal", "slurm_state", "slurm_reason"):
            meta[key] = value.strip()
    assert "source" in head, f"{path.name}: the header must cite its source"
    return meta, log


def classify_fixture(path: Path) -> tuple[dict, Failure, str]:
    meta, log = load_fixture(path)

    def number(key: str) -> int | None:
        return int(meta[key]) if meta.get(key) else None

    failure = classify(number("exit_code"), number("signal"), meta.get("slurm_state") or None, log,
                       meta.get("slurm_reason") or None)
    return meta, failure, log


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[p.stem for p in FIXTURE_FILES])
def test_fixture_is_classified_as_its_name_says(path):
    meta, failure, log = classify_fixture(path)
    expected = K[path.stem.split("--")[0].upper()]
    assert meta["expect"] == expected.value, "the file name and its header disagree"
    assert failure.kind == expected, failure
    assert failure.retry == RETRY_TABLE[expected]
    assert failure.summary and "\n" not in failure.summary and "\r" not in failure.summary
    assert failure.evidence and len(failure.evidence) <= EVIDENCE_MAX_CHARS
    if not failure.evidence.startswith(("slurm ", "exit code", "killed by")):
        assert failure.evidence.rstrip("…") in log, "evidence must be a line of the log"


def test_every_kind_has_a_fixture():
    # HANG is the runner's watchdog's verdict, not a log's (a hung job prints nothing to read):
    # tests/test_progress.py and tests/test_scale_faults_e2e.py show it
    kinds = {K[p.stem.split("--")[0].upper()] for p in FIXTURE_FILES}
    assert kinds == set(FailureKind) - {K.HANG}


# Figures read off each message by hand: x GiB = x * 2**30 bytes, x MiB = x * 2**20 bytes, rounded to the byte.
EXPECTED_OOM = {
    "cuda_oom--torch2x-h100-torchrun": OOMFigures(
        tried_to_allocate_bytes=4_198_330_532,  # 3.91 GiB = 4198330531.84
        total_capacity_bytes=84_975_927_951,  # 79.14 GiB = 84975927951.36
        free_bytes=1_288_490_189,  # 1.20 GiB = 1288490188.8
        allocated_by_pytorch_bytes=80_638_010_982,  # 75.10 GiB = 80638010982.4
        reserved_unallocated_bytes=1_632_087_572,  # 1.52 GiB = 1632087572.48
        gpu_index=0),
    "cuda_oom--oom-then-nccl-watchdog-2nodes": OOMFigures(
        tried_to_allocate_bytes=2_104_533_975,  # 1.96 GiB = 2104533975.04
        total_capacity_bytes=84_943_715_697,  # 79.11 GiB = 84943715696.64
        free_bytes=1_148_903_752,  # 1.07 GiB = 1148903751.68
        allocated_by_pytorch_bytes=79_693_118_177,  # 74.22 GiB = 79693118177.28
        reserved_unallocated_bytes=2_480_343_613,  # 2.31 GiB = 2480343613.44
        gpu_index=2),
    "cuda_oom--torch1x-runtimeerror": OOMFigures(
        tried_to_allocate_bytes=20_971_520,  # 20.00 MiB
        total_capacity_bytes=16_943_645_983,  # 15.78 GiB = 16943645982.72
        free_bytes=20_709_376,  # 19.75 MiB
        allocated_by_pytorch_bytes=15_515_569_357,  # 14.45 GiB = 15515569356.8
        reserved_unallocated_bytes=75_161_927,  # 14.52 GiB (15590731284) - 14.45 GiB (15515569357)
        gpu_index=0),
    "cuda_oom--torch20-srun-labels": OOMFigures(
        tried_to_allocate_bytes=268_435_456,  # 256.00 MiB
        total_capacity_bytes=42_294_690_447,  # 39.39 GiB = 42294690447.36
        free_bytes=136_514_109,  # 130.19 MiB = 136514109.44
        allocated_by_pytorch_bytes=40_319_005_491,  # 37.55 GiB = 40319005491.2
        reserved_unallocated_bytes=493_921_239,  # 38.01 GiB (40812926730) - 37.55 GiB (40319005491)
        gpu_index=0),
    "cuda_oom--torch21-capacty-typo": OOMFigures(
        tried_to_allocate_bytes=6_839_735_419,  # 6.37 GiB = 6839735418.88
        total_capacity_bytes=84_943_715_697,  # 79.11 GiB
        free_bytes=3_146_063_544,  # 2.93 GiB = 3146063544.32
        allocated_by_pytorch_bytes=73_669_426_545,  # 68.61 GiB = 73669426544.64
        reserved_unallocated_bytes=6_045_166_469,  # 5.63 GiB = 6045166469.12
        gpu_index=0),
    "cuda_oom--torch10-cached": OOMFigures(
        tried_to_allocate_bytes=13_107_200,  # 12.50 MiB
        total_capacity_bytes=11_725_260_718,  # 10.92 GiB = 11725260718.08
        free_bytes=9_964_324_127,  # 9.28 GiB = 9964324126.72
        allocated_by_pytorch_bytes=8_986_296,  # 8.57 MiB = 8986296.32
        reserved_unallocated_bytes=4_907_336,  # 4.68 MiB "cached" = 4907335.68
        gpu_index=0),
    "cuda_oom--rocm-hip-private-pools": OOMFigures(
        tried_to_allocate_bytes=2_097_152,  # 2.00 MiB
        total_capacity_bytes=309_216_170_476,  # 287.98 GiB = 309216170475.52
        free_bytes=296_202_419_569,  # 275.86 GiB = 296202419568.64
        allocated_by_pytorch_bytes=1_066_412_278,  # 1017.01 MiB = 1066412277.76 (private pools included)
        reserved_unallocated_bytes=57_661_194,  # 54.99 MiB = 57661194.24
        gpu_index=0),
    # No allocator message in these: the OOM is known, its figures are not.
    "cuda_oom--nccl-cuda-failure-out-of-memory": None,
    "cuda_oom--cublas-alloc-failed": None,
    "cuda_oom--cuda-error-out-of-memory": None,
}


@pytest.mark.parametrize("stem", sorted(EXPECTED_OOM))
def test_oom_figures_match_the_message(stem):
    _, failure, _ = classify_fixture(FIXTURES / f"{stem}.txt")
    assert failure.kind == K.CUDA_OOM
    assert failure.oom == EXPECTED_OOM[stem]


def test_every_cuda_oom_fixture_has_expected_figures():
    assert {p.stem for p in FIXTURE_FILES if p.stem.startswith("cuda_oom--")} == set(EXPECTED_OOM)


def test_summary_gives_the_figures():
    failure = classify(1, log_text=OOM_V21)
    assert failure.summary == "CUDA_OOM on GPU 0: tried to allocate 3.91 GiB with 1.20 GiB free of 79.14 GiB"
    assert failure.retry == Retry.LADDER == "ladder"


def test_summary_prints_sizes_as_pytorch_does():
    _, failure, _ = classify_fixture(FIXTURES / "cuda_oom--rocm-hip-private-pools.txt")
    assert failure.summary == "CUDA_OOM on GPU 0: tried to allocate 2.00 MiB with 275.86 GiB free of 287.98 GiB"


def test_figures_are_read_from_an_oom_line_longer_than_the_evidence():
    others = "".join(f"Process {1000 + i} has 1.00 GiB memory in use. " for i in range(40))
    line = OOM_V21.replace("Including non-PyTorch", others + "Including non-PyTorch")
    failure = classify(1, log_text=line)
    assert len(failure.evidence) == EVIDENCE_MAX_CHARS and failure.evidence.endswith("…")
    assert failure.oom.reserved_unallocated_bytes == 1_632_087_572


# -- precedence ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, kwargs, kind", [
    # an NCCL error on the other ranks follows the OOM on one: the OOM wins, in either order
    ("oom then nccl", dict(exit_code=1, log_text=OOM_V21 + "\n" + WATCHDOG + "\n" + REMOTE), K.CUDA_OOM),
    ("nccl then oom", dict(exit_code=1, log_text=WATCHDOG + "\n" + OOM_V21), K.CUDA_OOM),
    ("host oom then nccl", dict(exit_code=137, log_text=KERNEL_OOM + "\n" + REMOTE), K.HOST_OOM),
    ("cuda oom beats host oom", dict(exit_code=1, log_text=KERNEL_OOM + "\n" + OOM_V21), K.CUDA_OOM),
    ("cuda oom beats OUT_OF_MEMORY state", dict(exit_code=1, slurm_state="OUT_OF_MEMORY", log_text=OOM_V21),
     K.CUDA_OOM),
    ("oom beats a python traceback", dict(exit_code=1, log_text=TRACEBACK + OOM_V21), K.CUDA_OOM),
    # the scheduler's verdict
    ("TIMEOUT state, exit 0", dict(exit_code=0, slurm_state="TIMEOUT"), K.TIMEOUT),
    ("TIMEOUT state beats an oom the job survived", dict(exit_code=0, slurm_state="TIMEOUT", log_text=OOM_V21),
     K.TIMEOUT),
    ("PREEMPTED state", dict(exit_code=0, signal=15, slurm_state="PREEMPTED"), K.PREEMPTED),
    ("REQUEUED state", dict(exit_code=0, slurm_state="REQUEUED"), K.PREEMPTED),
    ("NODE_FAIL state beats nccl", dict(exit_code=1, slurm_state="NODE_FAIL", log_text=REMOTE), K.NODE_FAIL),
    ("BOOT_FAIL state", dict(exit_code=None, slurm_state="BOOT_FAIL"), K.NODE_FAIL),
    ("CANCELLED state", dict(exit_code=0, signal=15, slurm_state="CANCELLED by 1000"), K.CANCELLED),
    ("CANCELLED state beats an oom", dict(exit_code=1, slurm_state="CANCELLED", log_text=OOM_V21), K.CANCELLED),
    ("CANCELLED batch step of a timed-out job",
     dict(exit_code=0, signal=15, slurm_state="CANCELLED",
          log_text="slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-05-02T03:00:07 DUE TO TIME LIMIT ***"),
     K.TIMEOUT),
    ("DEADLINE state", dict(exit_code=0, slurm_state="DEADLINE"), K.CANCELLED),
    ("reason TimeLimit", dict(exit_code=1, slurm_reason="TimeLimit"), K.TIMEOUT),
    ("reason NodeDown", dict(exit_code=1, slurm_reason="NodeDown"), K.NODE_FAIL),
    ("reason OutOfMemory", dict(exit_code=1, slurm_reason="OutOfMemory"), K.HOST_OOM),
    ("OUT_OF_MEMORY state alone", dict(exit_code=0, signal=125, slurm_state="OUT_OF_MEMORY"), K.HOST_OOM),
    ("OUT_OF_MEMORY state, exit 0", dict(exit_code=0, slurm_state="OUT_OF_MEMORY"), K.HOST_OOM),
    # slurmstepd's lines
    ("time-limit line beats exit 0",
     dict(exit_code=0, log_text="slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT 2024-05-02T03:00:07 DUE TO "
                                "TIME LIMIT ***"), K.TIMEOUT),
    ("node-failure line beats nccl",
     dict(exit_code=1, log_text=REMOTE + "\nslurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-05-03T14:02:51 "
                                         "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"), K.NODE_FAIL),
    ("uncorrectable memory error",
     dict(exit_code=1, log_text="slurmstepd: error: *** JOB 7 ON n1 UNCORRECTABLE MEMORY ERROR AT "
                                "2024-05-03T14:02:51 ***"), K.NODE_FAIL),
    ("job requeue line", dict(exit_code=0, signal=15, log_text="slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT "
                                                                "2024-05-03T14:02:51 DUE TO JOB REQUEUE ***"),
     K.PREEMPTED),
    ("plain JOB cancel line", dict(exit_code=0, signal=15, log_text="slurmstepd: error: *** JOB 7 ON n1 CANCELLED "
                                                                     "AT 2024-05-04T09:12:13 ***"), K.CANCELLED),
    ("plain STEP cancel after a failure is not a cancel",
     dict(exit_code=1, log_text=TRACEBACK + "slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT "
                                            "2024-05-04T09:12:13 ***"), K.USER_ERROR),
    # host OOM: the kernel's line decides; a bare "oom-kill" needs a SIGKILL
    ("exit 137 with the kernel line", dict(exit_code=137, log_text=KERNEL_OOM), K.HOST_OOM),
    ("kernel line, exit 1", dict(exit_code=1, log_text=KERNEL_OOM), K.HOST_OOM),
    ("SIGKILL with an oom-kill line",
     dict(exit_code=0, signal=9,
          log_text="python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0"),
     K.HOST_OOM),
    ("exit 137 with oom_kill", dict(exit_code=137, log_text="memory.events: oom_kill 1"), K.HOST_OOM),
    ("torchrun SIGKILL with oom_kill",
     dict(exit_code=1, log_text="  exitcode  : -9 (pid: 208585)\n  traceback : Signal 9 (SIGKILL) received by PID "
                                "208585\nmemory.events: oom_kill 2"), K.HOST_OOM),
    ("oom_kill without a SIGKILL is not evidence",
     dict(exit_code=1, log_text="memory.events: oom_kill 1\n" + TRACEBACK), K.USER_ERROR),
    # the rest
    ("exit 1 with a ValueError", dict(exit_code=1, log_text=TRACEBACK), K.USER_ERROR),
    ("exit 137, no evidence", dict(exit_code=137, log_text="step 10 loss 2.1\n"), K.USER_ERROR),
    ("exit 0", dict(exit_code=0), K.COMPLETED),
    ("exit 0 after a caught oom", dict(exit_code=0, log_text=OOM_V21), K.COMPLETED),
    ("COMPLETED state", dict(exit_code=0, slurm_state="COMPLETED", log_text=OOM_V21), K.COMPLETED),
    ("COMPLETED state beats an old time-limit line", dict(
        exit_code=0, slurm_state="COMPLETED",
        log_text="slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-05-02T03:00:07 DUE TO TIME LIMIT ***"),
     K.COMPLETED),
    ("FAILED state with exit 0 is not a success", dict(exit_code=0, slurm_state="FAILED", log_text=TRACEBACK),
     K.USER_ERROR),
    ("nothing known", dict(exit_code=None), K.USER_ERROR),
])
def test_precedence(name, kwargs, kind):
    failure = classify(**kwargs)
    assert failure.kind == kind, failure
    assert failure.retry == RETRY_TABLE[kind]


def test_user_error_names_the_exception_not_the_launcher():
    log = TRACEBACK + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    failure = classify(1, log_text=log)
    assert failure.evidence == 'ValueError: unknown optimizer "adamw8"'
    assert failure.summary == 'USER_ERROR: exit code 1: ValueError: unknown optimizer "adamw8"'


def test_user_error_says_how_it_was_killed():
    failure = classify(137)
    assert failure.summary == "USER_ERROR: killed by SIGKILL (exit code 137), no recognised failure in the log"


def test_evidence_is_the_first_oom_of_several_ranks():
    log = OOM_V21.replace("GPU 0", "GPU 5") + "\n" + OOM_V21.replace("GPU 0", "GPU 6")
    failure = classify(1, log_text=log)
    assert "GPU 5" in failure.evidence and failure.oom.gpu_index == 5


def test_state_evidence_names_the_state():
    failure = classify(0, slurm_state="TIMEOUT")
    assert failure == Failure(K.TIMEOUT, "TIMEOUT: hit its Slurm time limit", "slurm state TIMEOUT", Retry.REQUEUE)


# -- one message each, from the sources the fixtures cite ----------------------------------


@pytest.mark.parametrize("line, kind", [
    # PyTorch: CUDA driver API check (aten/src/ATen/cuda/Exceptions.h AT_CUDA_DRIVER_CHECK)
    ("RuntimeError: CUDA driver error: out of memory", K.CUDA_OOM),
    # NCCL: CUDACHECK inside a path that reports ncclSystemError (src/include/checks.h)
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
     "Last error:\nCuda failure 'out of memory'", K.CUDA_OOM),
    ("gpu-c05:41822:42907 [3] NCCL WARN Cuda failure 2 'out of memory'", K.CUDA_OOM),
    # NCCL: ncclCudaCallocAsync (src/include/alloc.h) "Failed to CUDA calloc async %ld bytes"
    ("[rank0]: Last error:\n[rank0]: Failed to CUDA calloc async 4 bytes", K.CUDA_OOM),
    ("HIP out of memory. Tried to allocate 432.00 MiB. GPU 0 has a total capacity of 15.92 GiB of which "
     "7.12 GiB is free.", K.CUDA_OOM),
    ("RuntimeError: HIP error: out of memory", K.CUDA_OOM),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory.", K.CUDA_OOM),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", K.CUDA_OOM),
    ("Search for `cudaErrorMemoryAllocation' in "
     "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.", K.CUDA_OOM),
    # NCCL: the other error kinds (NCCLUtils.hpp getNcclErrorDetailStr, ncclGetErrorString)
    ("ncclInternalError: Internal check failed.", K.NCCL),
    ("ncclUnhandledCudaError: Call to CUDA function failed.", K.NCCL),
    ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", K.NCCL),
    ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.", K.NCCL),
    ("[rank4]:[E1016 03:31:38.929234295 ProcessGroupNCCL.cpp:1709] [PG 3 Rank 4] Timeout at NCCL work: 9141, last "
     "enqueued NCCL work: 9141, last completed NCCL work: 9140.", K.NCCL),
    # host memory: PyTorch's CPU allocator (c10/core/impl/alloc_cpu.cpp), Python, Slurm, older kernels
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you "
     "tried to allocate 2359296 bytes. Error code 12 (Cannot allocate memory)", K.HOST_OOM),
    ("[rank2]: MemoryError", K.HOST_OOM),
    ("slurmstepd: error: StepId=7.batch exceeded memory limit (734003200 > 52428800), being killed", K.HOST_OOM),
    ("slurmstepd: error: Job 123 exceeded virtual memory limit (9000000 > 8000000), being killed", K.HOST_OOM),
    ("slurmstepd: error: Detected 2 oom-kill event(s) in step 123.batch cgroup.", K.HOST_OOM),
    ("Memory cgroup out of memory: Killed process 4242 (python) total-vm:9000kB, anon-rss:8000kB, file-rss:0kB, "
     "shmem-rss:0kB", K.HOST_OOM),
    ("Out of memory: Kill process 1234 (python) score 987 or sacrifice child", K.HOST_OOM),
])
def test_message_variants(line, kind):
    assert classify(1, log_text="step 1 loss 2.0\n" + line + "\n").kind == kind


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, n", [
    ("0 bytes", 0), ("512 bytes", 512), ("7 B", 7),
    ("1.50 KiB", 1536), ("2.00 MiB", 2_097_152), ("3.91 GiB", 4_198_330_532), ("1.00 TiB", 2**40),
    # MPS's format_size says KB/MB/GB and divides by 1024
    ("1.00 KB", 1024), ("20.00 MB", 20_971_520), ("1.5 GB", 1_610_612_736), ("2 TB", 2 * 2**40),
    ("1024.00 MiB", 2**30),
])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "3.91", "3.91 parsecs", "-1 GiB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_parse_oom_of_a_line_that_is_not_one():
    assert parse_oom("step 1 loss 2.0") is None


# -- robustness ----------------------------------------------------------------------------


@pytest.mark.parametrize("log", ["", None, "\n\n\r\n", "   "])
def test_empty_log(log):
    failure = classify(1, log_text=log)
    assert failure.kind == K.USER_ERROR and failure.evidence == "exit code 1"


def test_binary_junk():
    junk = random.Random(7).randbytes(300_000)
    failure = classify(1, log_text=junk)
    assert failure.kind == K.USER_ERROR
    with_oom = junk + b"\n" + OOM_V21.encode() + b"\n" + junk
    failure = classify(1, log_text=with_oom)
    assert failure.kind == K.CUDA_OOM and failure.oom.tried_to_allocate_bytes == 4_198_330_532
    assert failure.evidence.isprintable()


def test_control_characters_do_not_reach_the_evidence():
    failure = classify(1, log_text="\x1b[31m" + OOM_V21 + "\x00\x07\x1b[0m")
    assert failure.kind == K.CUDA_OOM and failure.evidence.isprintable()


def test_crlf_log():
    failure = classify(1, log_text=TRACEBACK.replace("\n", "\r\n"))
    assert failure.evidence == 'ValueError: unknown optimizer "adamw8"'


def test_only_the_tail_is_scanned():
    filler = "step 1 | loss 2.0000 | lr 1.0e-04 | tokens/s 50000 | mem 40.1 GiB\n"
    body = filler * (SCAN_TAIL_CHARS // len(filler) + 1)
    # an OOM a whole window above the end is out of reach ...
    assert classify(1, log_text=OOM_V21 + "\n" + body).kind == K.USER_ERROR
    # ... one inside it is found, as bytes too
    found = classify(1, log_text=(body + OOM_V21 + "\n" + filler * 1000).encode())
    assert found.kind == K.CUDA_OOM


def test_failure_is_a_frozen_json_value():
    failure = classify(1, log_text=OOM_V21)
    with pytest.raises(dataclasses.FrozenInstanceError):
        failure.kind = K.NCCL
    doc = json.loads(json.dumps(dataclasses.asdict(failure)))
    assert doc["kind"] == "CUDA_OOM" and doc["retry"] == "ladder" and doc["oom"]["gpu_index"] == 0
    assert str(K.CUDA_OOM) == "CUDA_OOM" and K("NCCL") is K.NCCL
