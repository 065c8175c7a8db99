"""GPU and node hardware faults named from the log (issue 30): the driver's fatal Xid events
(NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors: 48 double-bit ECC, 74 NVLink, 79 fallen
off the bus, 94/95 contained/uncontained ECC, ...), CUDA's cudaErrorECCUncorrectable as
cudaGetErrorString words it ("uncorrectable ECC error encountered", which PyTorch prints after
"CUDA error: "), and a GPU "fallen off the bus" / nvidia-smi's "GPU is lost". The log lines
below follow those formats ("NVRM: Xid (PCI:<bus id>): <xid>, ..." is the driver's kernel
message)."""

import pytest

from jobctl.model import FailureKind, RetryAction
from jobctl.runtime.classify import classify
from jobctl.runtime.outcome import PRECEDENCE

NCCL_ECHO = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
             "remote process exited or there was a network error")


@pytest.mark.parametrize("line, what", [
    ("[Fri Nov 27 10:00:01 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
     "fatal Xid"),
    ("NVRM: Xid (PCI:0000:9a:00): 95, pid=7, Uncontained: FBHUB. RST: Yes, D-RST: No", "fatal Xid"),
    ("NVRM: Xid (PCI:0000:1b:00): 74, pid=9, NVLink: fatal error detected on link 3", "fatal Xid"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "uncorrectable ECC"),
    ("Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system", "fell off"),
])
def test_a_hardware_fault_is_named_even_when_nccl_echoes_it(line, what):
    f = classify(1, log_text=f"step 10 loss 2.1\n{line}\n{NCCL_ECHO}\n{NCCL_ECHO}\n")
    assert f.kind is FailureKind.HARDWARE and what in f.summary
    assert f.evidence.startswith(line[:40])
    assert f.retry is RetryAction.RESUBMIT  # the same node would fail the same way: resubmitted without it


def test_an_application_xid_is_not_hardware():
    # Xid 13 (graphics engine exception) and 31 (MMU fault) are usually the program's own fault
    f = classify(1, log_text="NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics SM Warp Exception\n")
    assert f.kind is FailureKind.USER_ERROR


def test_an_oom_still_beats_a_lost_gpu_and_hardware_beats_nccl_across_nodes():
    f = classify(1, log_text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nGPU is lost\n")
    assert f.kind is FailureKind.CUDA_OOM
    assert PRECEDENCE.index(FailureKind.HARDWARE) < PRECEDENCE.index(FailureKind.NCCL)
