"""Why a training job ended, from its exit status, Slurm state and log text (pure).

`classify` reads only what the caller passes. The first rule that fires wins:

1. The scheduler's verdict, when the Slurm state is TIMEOUT, PREEMPTED/REQUEUED,
   NODE_FAIL/BOOT_FAIL, DEADLINE or CANCELLED (or the reason TimeLimit, NodeDown,
   DeadLine). Slurm gives these only to a job it stopped from outside while it was still
   running, so no line the job printed before can be the cause: an OOM the job survived
   (an auto-batch-size loop) must not turn a time limit into an OOM. A CANCELLED state is
   refined by a "DUE TO ..." line (the batch step of a timed-out job reads CANCELLED). A
   user's cancel is never retried automatically, whatever the log shows.
2. State COMPLETED, as sacct reports it.
3. slurmstepd's "*** JOB|STEP ... CANCELLED AT ... DUE TO TIME LIMIT|PREEMPTION|NODE
   FAILURE|JOB REQUEUE ***" and "... UNCORRECTABLE MEMORY ERROR AT ..." lines, then the
   plain "*** JOB ... CANCELLED AT ... ***" of an scancel. They beat exit code 0: a job
   that traps the time-limit signal to checkpoint exits 0. The plain *STEP* line is not
   used: srun prints it when it kills the other tasks after one failed
   (--kill-on-bad-exit), so it follows real failures.
4. Exit code 0 (no signal, state not FAILED/OUT_OF_MEMORY): COMPLETED, whatever the log
   says; an OOM in the log was caught and recovered from.
5. Evidence, strongest kind first: CUDA_OOM > HOST_OOM > HARDWARE > NCCL.
   - CUDA_OOM first, because its message is the failing process's own report, with the
     figures the OOM ladder needs, while host-OOM kills often come during the teardown
     after it. A Slurm OUT_OF_MEMORY state (reason OutOfMemory) comes from the cgroup's
     oom_kill counter, i.e. host memory, which GPU memory never touches: it means
     HOST_OOM, but only after the log showed no CUDA OOM.
   - Either OOM beats NCCL. In data/tensor parallel training every rank waits for every
     other in each collective: when one rank dies of an OOM (CUDA's exception, or the
     kernel's SIGKILL), its peers are left in a collective with a dead process and report
     ncclRemoteError / "remote process exited", ncclUnhandledCudaError, or the watchdog's
     "Watchdog caught collective operation timeout" ten minutes later. Those lines, often
     hundreds of them, come AFTER the OOM and are its symptom, not its cause.
   - The whole scanned log is searched, not just its last lines, so torchrun's
     ChildFailedError summary ("exitcode : 1 ... error_file: <N/A>") at the end does not
     hide an OOM raised further up. The evidence is the earliest matching line: the first
     rank to fail, not the echoes.
   - HARDWARE: the GPU driver's fatal Xid events, CUDA's "uncorrectable ECC error
     encountered", a GPU "fallen off the bus" / "GPU is lost". It beats NCCL for the same
     reason as an OOM: the peers of a rank whose GPU failed report NCCL errors after it.
   - Weak host-OOM evidence ("oom-kill", "oom_kill" anywhere) counts only when the job was
     killed by SIGKILL (signal 9, exit 137, or torchrun's "Signal 9 (SIGKILL)").
6. Anything else: USER_ERROR (a bug, a bad config, a missing file), with the last Python
   exception line as evidence when there is one (launchers' wrappers such as torchrun's
   ChildFailedError excepted).

Only the last SCAN_TAIL_CHARS characters of the log are scanned (see there).
Message texts are quoted, with their sources, in tests/data/failures/*.txt.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass
from decimal import Decimal

from jobctl.model import RETRY_TABLE, Failure, FailureKind, OOMFigures

# 8 MiB of log tail (characters; the same as bytes for ASCII logs). The lines that decide
# the class sit near the end: the traceback, torchrun's summary, slurmstepd's epilogue.
# What can push them up is the teardown of a large job: each surviving rank of a
# watchdog timeout prints ~6 lines plus a ~20-frame C++ stack (~4 KB), so 512 ranks write
# ~2 MB after the OOM that caused it; 8 MiB keeps 4x that. A scan of 8 MiB takes ~0.1 s
# (under a second even when every line holds a near-miss for some rule).
SCAN_TAIL_CHARS = 8 * 1024 * 1024
EVIDENCE_MAX_CHARS = 500
# An OOM message lists every process on the GPU ("Process N has X memory in use. "), so it
# can be long; its figures are read from up to this much of the line.
_OOM_LINE_MAX_CHARS = 8192



# -- sizes ---------------------------------------------------------------------------

# PyTorch's format_size prints bytes/KiB/MiB/GiB (c10/cuda/CUDACachingAllocator.cpp); its
# MPS twin prints KB/MB/GB but also divides by 1024 (aten/src/ATen/mps/MPSAllocator.h),
# so both spellings are binary here.
_UNIT_BYTES = {"b": 1, "byte": 1, "bytes": 1, "kib": 2**10, "kb": 2**10, "mib": 2**20, "mb": 2**20,
               "gib": 2**30, "gb": 2**30, "tib": 2**40, "tb": 2**40}
_SIZE = r"\d+(?:\.\d+)?\s*(?:bytes|byte|[KMGT]i?B|B)\b"
_SIZE_PARTS = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)")


def parse_size(text: str) -> int:
    """Bytes in a printed size such as "3.91 GiB", "20.00 MiB", "0 bytes" or "1.5 GB"."""
    m = _SIZE_PARTS.fullmatch(text.strip())
    if not m or m.group(2).lower() not in _UNIT_BYTES:
        raise ValueError(f"not a size: {text!r} (expected a number and one of B, KiB, MiB, GiB, TiB, KB, MB, GB)")
    # Decimal, not float: 3.91 GiB is exactly 4198330531.84 bytes, rounded once.
    return int((Decimal(m.group(1)) * _UNIT_BYTES[m.group(2).lower()]).to_integral_value())


def _size(pattern: str) -> re.Pattern:
    return re.compile(pattern.replace("SIZE", f"({_SIZE})"))


# One message, one line; each figure has its >= 2.1 spelling and its 1.x/2.0 spelling
# (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc, across releases).
_TRIED = _size(r"Tried to allocate SIZE")
_GPU = re.compile(r"(?:GPU|Device) (\d+) has a total|\((?:GPU|NPU) (\d+);")
_TOTAL = _size(r"has a total capac(?:i|)ty of SIZE|SIZE total capacity")  # 2.1.0 printed "capacty"
_FREE = _size(r"of which SIZE is free|SIZE free[;)]")
_ALLOCATED = _size(r"Of the allocated memory SIZE is allocated by PyTorch|SIZE already allocated")
_UNALLOCATED = _size(r"and SIZE is reserved by PyTorch but unallocated|SIZE cached[;)]")
_RESERVED = _size(r"SIZE reserved in total by PyTorch")


def _first_size(pattern: re.Pattern, line: str) -> int | None:
    m = pattern.search(line)
    if not m:
        return None
    return parse_size(next(g for g in m.groups() if g is not None))


def parse_oom(line: str) -> OOMFigures | None:
    """The figures of one PyTorch OOM message (any release since 1.0), or None if it is not one."""
    if not _TRIED.search(line):
        return None
    gpu = _GPU.search(line)
    allocated = _first_size(_ALLOCATED, line)
    unallocated = _first_size(_UNALLOCATED, line)
    reserved = _first_size(_RESERVED, line)
    if unallocated is None and reserved is not None and allocated is not None:
        unallocated = max(0, reserved - allocated)  # 1.4-2.0 print the sum, not the part
    return OOMFigures(
        tried_to_allocate_bytes=_first_size(_TRIED, line),
        total_capacity_bytes=_first_size(_TOTAL, line),
        free_bytes=_first_size(_FREE, line),
        allocated_by_pytorch_bytes=allocated,
        reserved_unallocated_bytes=unallocated,
        gpu_index=int(next(g for g in gpu.groups() if g is not None)) if gpu else None,
    )


# -- what the log can say --------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    """A kind of evidence: plain strings to find, and a regex that confirms the line they are on.

    str.find runs at memchr speed; a regex without a literal prefix crawls through 8 MiB at
    ~0.3 s, so regexes only ever see the lines a needle points at.
    """

    kind: FailureKind
    needles: tuple[str, ...]
    pattern: re.Pattern  # searched in the needle's line
    what: str  # completes "<kind>: ..." in the summary


def _rule(kind: FailureKind, needles: str | tuple[str, ...], pattern: str | None, what: str) -> _Rule:
    needles = (needles,) if isinstance(needles, str) else needles
    return _Rule(kind, needles, re.compile(pattern or "|".join(map(re.escape, needles))), what)


_K = FailureKind
_CUDA_OOM = (
    # PyTorch's caching allocator: CUDA, ROCm (HIP), XPU, and the device-generic "Out of memory."
    _rule(_K.CUDA_OOM, "ut of memory. Tried to allocate", r"[Oo]ut of memory\. Tried to allocate",
          "the PyTorch caching allocator could not allocate"),
    _rule(_K.CUDA_OOM, "OutOfMemoryError", r"torch\.(?:cuda\.)?OutOfMemoryError\b",
          "torch raised OutOfMemoryError"),
    # c10/cuda/CUDAException.cpp ("CUDA error: " + cudaGetErrorString), AT_CUDA_DRIVER_CHECK, their hipified forms
    _rule(_K.CUDA_OOM, "error: out of memory", r"(?:CUDA|HIP|CUDA driver) error: out of memory",
          "a CUDA call returned out of memory"),
    _rule(_K.CUDA_OOM, ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY", "hipErrorOutOfMemory"), None,
          "a CUDA call returned out of memory"),
    # TORCH_CUDABLAS_CHECK etc. (aten/src/ATen/cuda/Exceptions.h) with the libraries' status names
    _rule(_K.CUDA_OOM, "_ALLOC_FAILED", r"CU(?:BLAS|DNN|SPARSE|SOLVER)_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED",
          "a CUDA library (cuBLAS/cuDNN/...) could not allocate its workspace"),
    # NCCL's CUDACHECK (src/include/checks.h) and ncclCudaCallocAsync (src/include/alloc.h)
    _rule(_K.CUDA_OOM, "'out of memory'", r"Cuda failure (?:\d+ )?'out of memory'",
          "NCCL could not allocate GPU memory"),
    _rule(_K.CUDA_OOM, "Failed to CUDA calloc", r"Failed to CUDA calloc(?: async)? \d+ bytes",
          "NCCL could not allocate GPU memory"),
)
_HOST_OOM = (
    # mm/oom_kill.c: "<Out of memory|Memory cgroup out of memory>: Killed process N (comm) ...";
    # older kernels printed "<message>: Kill process N (comm) score S or sacrifice child" first
    _rule(_K.HOST_OOM, ("Killed process", "Kill process"),
          r"(?:Out of memory|Memory cgroup out of memory)(?: \(oom_kill_allocating_task\))?: "
          r"Kill(?:ed)? process \d+",
          "the kernel OOM killer killed a process"),
    # task/cgroup: "Detected N oom-kill event(s) in ..." (<= 22.05), "Detected N oom_kill event(s) in ..." (23.02+)
    _rule(_K.HOST_OOM, ("oom-kill event", "oom_kill event"), r"Detected \d+ oom[-_]kill event",
          "Slurm's cgroup saw an OOM kill"),
    # jobacct_gather_handle_mem_limit (src/common/slurm_jobacct_gather.c)
    _rule(_K.HOST_OOM, "memory limit (", r"exceeded (?:virtual )?memory limit \(\d+ > \d+\), being killed",
          "Slurm killed the step for exceeding its memory"),
    _rule(_K.HOST_OOM, ": Out Of Memory", r"tasks? [\d,\-]+: Out Of Memory",
          "srun reports a task ran out of memory"),
    _rule(_K.HOST_OOM, "DefaultCPUAllocator: can't allocate memory", None,
          "PyTorch could not allocate host memory"),
    _rule(_K.HOST_OOM, "MemoryError", r"^\s*(?:\[rank\d+\]:\s*|\d+:\s*)?MemoryError\b",
          "Python raised MemoryError"),
)
_HOST_OOM_WEAK = (
    _rule(_K.HOST_OOM, tuple(f"{oom}{sep}{kill}" for oom in ("oom", "OOM") for sep in "-_"
                             for kill in ("kill", "Kill", "KILL")),
          None, "the OOM killer acted and the job was SIGKILLed"),
)
# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): the events that mean the GPU, its
# memory or its links failed, as opposed to an application's fault (Xid 13, 31, 43)
FATAL_XIDS = {48: "double-bit ECC error", 74: "NVLink error", 79: "GPU has fallen off the bus",
              92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
              119: "GSP RPC timeout", 120: "GSP error"}
_HARDWARE = (
    # the driver's kernel message "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
    _rule(_K.HARDWARE, "NVRM: Xid", r"NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): (?:" +
          "|".join(map(str, FATAL_XIDS)) + r")\b", "the GPU driver reported a fatal Xid event"),
    # cudaGetErrorString(cudaErrorECCUncorrectable), as PyTorch prints it ("CUDA error: ...")
    _rule(_K.HARDWARE, "uncorrectable ECC error encountered", None, "CUDA reported an uncorrectable ECC error"),
    # Xid 79's text, and nvidia-smi's "Unable to determine the device handle for GPU...: GPU is lost"
    _rule(_K.HARDWARE, ("fallen off the bus", "GPU is lost"), None, "a GPU fell off the bus"),
)
_NCCL = (
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp and NCCLUtils.hpp; NCCL's ncclGetErrorString (src/init.cc)
    _rule(_K.NCCL, "Watchdog caught collective operation timeout", None,
          "a collective ran past the process-group timeout"),
    _rule(_K.NCCL, ("Timeout at NCCL work", "Some NCCL operations have failed or timed out"), None,
          "a collective failed or timed out"),
    _rule(_K.NCCL, tuple(f"nccl{e}" for e in ("UnhandledCudaError", "SystemError", "InternalError",
                                             "InvalidArgument", "InvalidUsage", "RemoteError")),
          None, "NCCL returned an error"),
    _rule(_K.NCCL, "NCCL error", r"NCCL error\b", "NCCL returned an error"),
    _rule(_K.NCCL, "remote process exited or there was a network error", None,
          "a peer rank exited or the network failed"),
    _rule(_K.NCCL, "NCCL communicator was aborted", None, "the NCCL communicator was aborted"),
    _rule(_K.NCCL, "DistBackendError", None, "the distributed backend raised DistBackendError"),
)
# slurmstepd's _handle_signal_container (src/slurmd/slurmstepd/req.c); srun prints the STEP form.
_STEPD_DUE_TO = (
    _rule(_K.NODE_FAIL, "DUE TO NODE FAILURE", r"\*\*\* .*CANCELLED AT .*DUE TO NODE FAILURE",
          "Slurm lost a node"),
    _rule(_K.NODE_FAIL, "UNCORRECTABLE MEMORY ERROR AT", r"\*\*\* .* UNCORRECTABLE MEMORY ERROR AT",
          "a node reported an uncorrectable memory error"),
    _rule(_K.PREEMPTED, "DUE TO PREEMPTION", r"\*\*\* .*CANCELLED AT .*DUE TO PREEMPTION", "preempted by Slurm"),
    _rule(_K.PREEMPTED, "DUE TO JOB REQUEUE", r"\*\*\* .*CANCELLED AT .*DUE TO JOB REQUEUE", "requeued by Slurm"),
    _rule(_K.TIMEOUT, "DUE TO TIME LIMIT", r"\*\*\* .*CANCELLED AT .*DUE TO TIME LIMIT",
          "hit its Slurm time limit"),
)
# The plain form, without "DUE TO"; only the JOB (batch script) one, see rule 3 above.
_JOB_CANCELLED = (
    _rule(_K.CANCELLED, "*** JOB ", r"\*\*\* JOB \d+ (?:ON \S+ )?CANCELLED AT (?:(?!DUE TO)[^*])*\*\*\*",
          "cancelled by a user or an administrator (scancel)"),
)
# A child SIGKILLed, in torchrun's ChildFailedError block (torch/distributed/elastic/multiprocessing/
# errors/__init__.py); only whether it is there counts.
_SIGKILL_IN_LOG = (_rule(_K.HOST_OOM, ("Signal 9 (SIGKILL)", "exitcode"),
                         r"Signal 9 \(SIGKILL\) received by PID|exitcode\s*:\s*-9\b", "killed by SIGKILL"),)
# A Python exception line, possibly behind torchrun's "[rankN]: " or srun --label's "N: ".
_PY_EXCEPTION = re.compile(
    r"(?m)^(?:\[rank\d+\]:\s*|\d+:\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)\b(?::[^\r\n]*)?)\r?$")
# Launchers' wrappers around the real exception: never the cause.
_WRAPPER_EXCEPTIONS = ("ChildFailedError", "CalledProcessError")
# Colour codes (CSI sequences) that loggers put around words, and that would split them.
_ANSI_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# sacct states (first word: "CANCELLED by 1000" -> CANCELLED) and job reasons
# (src/common/slurm_protocol_defs.c, job_state_reason_string) that settle the class alone.
_STATE_VERDICT = {
    "TIMEOUT": (FailureKind.TIMEOUT, "hit its Slurm time limit"),
    "PREEMPTED": (FailureKind.PREEMPTED, "preempted by Slurm"),
    "REQUEUED": (FailureKind.PREEMPTED, "requeued by Slurm"),
    "NODE_FAIL": (FailureKind.NODE_FAIL, "Slurm lost a node"),
    "BOOT_FAIL": (FailureKind.NODE_FAIL, "a node failed to boot"),
    "DEADLINE": (FailureKind.CANCELLED, "terminated at its --deadline"),
    "CANCELLED": (FailureKind.CANCELLED, "cancelled by a user or an administrator"),
}
_REASON_VERDICT = {
    "TIMELIMIT": (FailureKind.TIMEOUT, "hit its Slurm time limit"),
    "NODEDOWN": (FailureKind.NODE_FAIL, "Slurm lost a node"),
    "DEADLINE": (FailureKind.CANCELLED, "terminated at its --deadline"),
}


def _word(text: str | None) -> str | None:
    if not text:
        return None
    return re.split(r"[\s+]", str(text).strip().upper(), maxsplit=1)[0] or None


# A "line" of binary junk can be megabytes long: look at most this far either side of a hit.
_LINE_WINDOW_CHARS = 16384


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    lo, hi = max(0, pos - _LINE_WINDOW_CHARS), min(len(text), pos + _LINE_WINDOW_CHARS)
    start = max(text.rfind("\n", lo, pos), text.rfind("\r", lo, pos), lo - 1) + 1
    ends = [i for i in (text.find("\n", pos, hi), text.find("\r", pos, hi)) if i != -1]
    return start, min(ends) if ends else hi


def _line_at(text: str, pos: int, limit: int = EVIDENCE_MAX_CHARS) -> str:
    """The log line around text[pos], printable and at most `limit` characters long."""
    start, end = _line_bounds(text, pos)
    line = "".join(c if c.isprintable() else "\ufffd" for c in text[start:end].strip())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _first_hit(text: str, rule: _Rule) -> int | None:
    """Where the first line confirming `rule` starts, or None."""
    best = None
    for needle in rule.needles:
        pos = text.find(needle, 0, best)
        while pos != -1:
            start, end = _line_bounds(text, pos)
            if rule.pattern.search(text[start:end]):
                best = start if best is None else min(best, start)
                break
            pos = text.find(needle, max(end, pos + 1), best)
    return best


def _earliest(text: str, rules: tuple[_Rule, ...]) -> tuple[_Rule, int] | None:
    """The rule whose first confirmed line comes first (the root cause precedes its echoes)."""
    best = None
    for rule in rules:
        pos = _first_hit(text, rule)
        if pos is not None and (best is None or pos < best[1]):
            best = (rule, pos)
    return best


def _failure(kind: FailureKind, summary: str, evidence: str, oom: OOMFigures | None = None) -> Failure:
    return Failure(kind, summary, evidence, RETRY_TABLE[kind], oom)


def _from_log(text: str, rule: _Rule, pos: int) -> Failure:
    line = _line_at(text, pos)
    return _failure(rule.kind, f"{rule.kind.value}: {rule.what}", line)


def _human(n: int) -> str:
    """A size the way PyTorch's format_size prints it (c10/cuda/CUDACachingAllocator.cpp)."""
    if n <= 2**10:
        return f"{n} bytes"
    unit, scale = ("KiB", 2**10) if n <= 2**20 else ("MiB", 2**20) if n <= 2**30 else ("GiB", 2**30)
    return f"{n / scale:.2f} {unit}"


def _cuda_oom(text: str, rule: _Rule, pos: int) -> Failure:
    """The earliest OOM line is the evidence; the figures come from the first message that has them."""
    figures = None
    first = _first_hit(text, _CUDA_OOM[0])
    if first is not None:
        figures = parse_oom(_line_at(text, first, limit=_OOM_LINE_MAX_CHARS))
    summary = f"CUDA_OOM: {rule.what}"
    if figures and figures.tried_to_allocate_bytes is not None:
        gpu = f" on GPU {figures.gpu_index}" if figures.gpu_index is not None else ""
        summary = f"CUDA_OOM{gpu}: tried to allocate {_human(figures.tried_to_allocate_bytes)}"
        if figures.free_bytes is not None and figures.total_capacity_bytes is not None:
            summary += f" with {_human(figures.free_bytes)} free of {_human(figures.total_capacity_bytes)}"
    return _failure(FailureKind.CUDA_OOM, summary, _line_at(text, pos), figures)


def _exit_status(exit_code: int | None, sig: int | None) -> str:
    if sig:
        try:
            name = _signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}" + (f" (exit code {exit_code})" if exit_code not in (None, 0) else "")
    return "exit status unknown" if exit_code is None else f"exit code {exit_code}"


def classify(exit_code: int | None, signal: int | None = None, slurm_state: str | None = None,
             log_text: str | bytes = "", slurm_reason: str | None = None) -> Failure:
    """Classify how a job ended (see the module docstring for the precedence of the rules).

    exit_code: the job's exit code (sacct's ExitCode before the colon; 128+N or -N for a
    process killed by signal N); signal: the signal after the colon, if any; slurm_state:
    sacct's State ("CANCELLED by 1000" is fine); log_text: the job's output (only its last
    SCAN_TAIL_CHARS are read; bytes are decoded as UTF-8 with replacement); slurm_reason:
    the job's Reason ("TimeLimit", "NodeDown", "OutOfMemory", ...).
    """
    if isinstance(log_text, (bytes, bytearray)):
        log_text = bytes(log_text[-SCAN_TAIL_CHARS:]).decode("utf-8", errors="replace")
    text = (log_text or "")[-SCAN_TAIL_CHARS:]
    if "\x1b" in text:
        text = _ANSI_CSI.sub("", text)
    state = _word(slurm_state)
    reason = (slurm_reason or "").replace(" ", "").upper()
    sig = signal or None
    if sig is None and exit_code is not None and 128 < exit_code < 160:
        sig = exit_code - 128  # the shell's convention for a child killed by a signal
    elif sig is None and exit_code is not None and exit_code < 0:
        sig = -exit_code  # Python's (subprocess, torchrun)
    status = _exit_status(exit_code, sig)
    host_oom_state = state == "OUT_OF_MEMORY" or reason == "OUTOFMEMORY"

    # 1. the scheduler stopped it
    verdict = _STATE_VERDICT.get(state or "") or _REASON_VERDICT.get(reason)
    if verdict:
        kind, what = verdict
        found = _earliest(text, _STEPD_DUE_TO) if state == "CANCELLED" else None
        if found:
            return _from_log(text, *found)
        evidence = f"slurm state {slurm_state}" if state in _STATE_VERDICT else f"slurm reason {slurm_reason}"
        return _failure(kind, f"{kind.value}: {what}", evidence)
    # 2. sacct says it completed
    if state == "COMPLETED":
        return _failure(FailureKind.COMPLETED, "COMPLETED: finished successfully", f"slurm state {slurm_state}")
    # 3. slurmstepd says the scheduler stopped it
    found = _earliest(text, _STEPD_DUE_TO) or _earliest(text, _JOB_CANCELLED)
    if found:
        return _from_log(text, *found)
    # 4. exit 0
    if exit_code == 0 and not sig and state != "FAILED" and not host_oom_state:
        return _failure(FailureKind.COMPLETED, "COMPLETED: exited with code 0", status)
    # 5. evidence in the log: CUDA_OOM > HOST_OOM > NCCL
    found = _earliest(text, _CUDA_OOM)
    if found:
        return _cuda_oom(text, *found)
    found = _earliest(text, _HOST_OOM)
    if found:
        return _from_log(text, *found)
    if host_oom_state:
        evidence = f"slurm state {slurm_state}" if state == "OUT_OF_MEMORY" else f"slurm reason {slurm_reason}"
        return _failure(FailureKind.HOST_OOM, "HOST_OOM: Slurm's cgroup saw an OOM kill", evidence)
    killed = sig == _signal.SIGKILL or _earliest(text, _SIGKILL_IN_LOG) is not None
    found = _earliest(text, _HOST_OOM_WEAK) if killed else None
    if found:
        return _from_log(text, *found)
    found = _earliest(text, _HARDWARE)
    if found:
        return _from_log(text, *found)
    found = _earliest(text, _NCCL)
    if found:
        return _from_log(text, *found)
    # 6. the job's own failure
    causes = [e.strip() for e in _PY_EXCEPTION.findall(text)
              if e.split(":", 1)[0].rsplit(".", 1)[-1] not in _WRAPPER_EXCEPTIONS]
    if causes:
        cause = _line_at(causes[-1], 0)
        return _failure(FailureKind.USER_ERROR, _line_at(f"USER_ERROR: {status}: {cause}", 0), cause)
    if exit_code is None and not sig:
        return _failure(FailureKind.USER_ERROR, "USER_ERROR: exit status unknown, no recognised failure", status)
    return _failure(FailureKind.USER_ERROR, f"USER_ERROR: {status}, no recognised failure in the log", status)
