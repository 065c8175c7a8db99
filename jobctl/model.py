"""The vocabulary every layer shares: job states, failure kinds, retry actions, and the one
retry table that recovery, requeue, watch and report all read.

It sits at the bottom of the house (docs/architecture.md): the history stores these values,
the runtime classifies failures into them, the services decide with them. Closed sets are
StrEnums: they compare equal to their names and serialise as plain strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from jobctl.errors import UsageError


# -- names are data ------------------------------------------------------------------------

_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
SLUG_MAX = 48


def duration(seconds) -> str:
    """Seconds as a person reads them: "42.0 s", "17 min", "5.3 h", "70.7 days" ("" for None)."""
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def slug(name: str) -> str:
    """The one form a user's name takes where it becomes a file name or a scheduler's job name:
    letters, digits, '.', '_' and '-' only (no '/', '%', spaces or control characters), no
    leading dot, at most SLUG_MAX characters ("job" when nothing is left)."""
    s = _SLUG.sub("-", str(name)).strip("-.")[:SLUG_MAX].strip("-.")
    return s or "job"


class StrEnum(str, Enum):
    """`enum.StrEnum` (Python 3.11) for 3.10 too: a str whose str() is its value."""

    def __str__(self) -> str:
        return self.value


class JobState(StrEnum):
    """Job states: Slurm's own names, plus PREPARED / SUBMITTED / SUBMIT_FAILED from jobctl."""

    PREPARED = "PREPARED"  # row written, scheduler not contacted yet (or the answer was lost)
    SUBMITTED = "SUBMITTED"  # the scheduler accepted it; not yet seen in the queue
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    SUBMIT_FAILED = "SUBMIT_FAILED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({
    JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY,
    JobState.NODE_FAIL, JobState.PREEMPTED, JobState.BOOT_FAIL, JobState.DEADLINE, JobState.SUBMIT_FAILED,
})


def parse_state(text: str | JobState) -> JobState:
    """A JobState from its name; sacct decorations such as ``CANCELLED by 0`` or ``RUNNING+`` are dropped."""
    if isinstance(text, JobState):
        return text
    word = re.split(r"[\s+]", str(text).strip().upper(), maxsplit=1)[0]
    try:
        return JobState(word)
    except ValueError:
        allowed = ", ".join(s.value for s in JobState)
        raise UsageError(f"unknown job state {text!r}; allowed: {allowed}") from None


# Slurm states jobctl has no name of its own for (sacct(1), JOB STATE CODES), read as the state a
# job in them is in for jobctl's purposes; any other word a scheduler answers is UNKNOWN.
SLURM_SYNONYMS = {
    "RESIZING": JobState.RUNNING, "SIGNALING": JobState.RUNNING, "STAGE_OUT": JobState.COMPLETING,
    "STOPPED": JobState.SUSPENDED, "REQUEUE_FED": JobState.REQUEUED, "REQUEUE_HOLD": JobState.REQUEUED,
    "SPECIAL_EXIT": JobState.REQUEUED, "RESV_DEL_HOLD": JobState.PENDING, "CONFIGURING": JobState.PENDING,
    "REVOKED": JobState.CANCELLED, "UPDATE_DB": JobState.RUNNING, "POWER_UP_NODE": JobState.PENDING,
}


def scheduler_state(text: str | JobState) -> JobState:
    """A JobState from a scheduler's answer (or a record of one): its name with sacct's
    decorations dropped (``CANCELLED by 0``, ``RUNNING+``), a synonym (SLURM_SYNONYMS), or
    UNKNOWN for any other word. Never an error: scheduler output is input, and a state jobctl
    does not know must not break `status`, `watch` or `cancel` for every other job."""
    if isinstance(text, JobState):
        return text
    word = re.split(r"[\s+]", str(text).strip().upper(), maxsplit=1)[0]
    try:
        return JobState(word)
    except ValueError:
        return SLURM_SYNONYMS.get(word, JobState.UNKNOWN)


@dataclass(frozen=True)
class JobStatus:
    """What a scheduler says about a job now (a backend's answer to a refresh)."""

    state: JobState
    exit_code: str | None = None  # "code:signal" as sacct prints it
    reason: str | None = None  # why it waits or ended, in the scheduler's words
    start: str | None = None
    end: str | None = None
    nodes: str | None = None
    failure_kind: FailureKind | None = None  # a verdict recorded where the job ran (a login node's)
    detail: str | None = None
    # earlier runs of the same job id that ended before the scheduler requeued it (a node
    # failure, a preemption), oldest first: what happened between two looks
    earlier: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "state", scheduler_state(self.state))
        if self.failure_kind is not None:
            object.__setattr__(self, "failure_kind", FailureKind(self.failure_kind))


MAX_FIGURE_BYTES = 1 << 50  # 1 PiB: no GPU's figure is larger; a bigger one is damage
MAX_GPU_INDEX = 1 << 16


@dataclass(frozen=True)
class OOMFigures:
    """One CUDA OOM's figures, in bytes, on their whole way: read from PyTorch's message by the
    classifier (runtime/classify.py), kept in the node's outcome record, joined by the monitor's
    measured peak in recovery, used by the OOM ladder (planner/ladder.py). None: unknown.

    "Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.14 GiB of which 1.2 GiB is
    free. Of the allocated memory 70.1 GiB is allocated by PyTorch, and 2.3 GiB is reserved by
    PyTorch but unallocated." Sizes are printed with two decimals, so they are exact only to
    0.005 of their unit. reserved_unallocated_bytes is printed by PyTorch >= 2.1 ("... reserved
    by PyTorch but unallocated") and 1.0-1.3 ("... cached"), and is reserved minus allocated in
    1.4-2.0. measured_peak_bytes is the highest use the job's GPU sampler saw before the failure.
    """

    tried_to_allocate_bytes: int | None = None
    total_capacity_bytes: int | None = None
    free_bytes: int | None = None
    allocated_by_pytorch_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    gpu_index: int | None = None
    measured_peak_bytes: int | None = None

    def to_dict(self) -> dict[str, int]:
        """The known figures (JSON: an outcome record, a plan's failure block)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, where: str) -> "OOMFigures":
        """Figures read back from a file (an outcome record, a plan's "failure" block): each a
        whole number of bytes (a GPU index) in range, or absent/null; other keys are ignored.
        UsageError naming `where` and the key otherwise."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise UsageError(f"{where}: the OOM figures are {type(data).__name__}, expected an object")
        values = {}
        for name in cls.__dataclass_fields__:
            v = data.get(name)
            if v is None:
                continue
            top = MAX_GPU_INDEX if name == "gpu_index" else MAX_FIGURE_BYTES
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not 0 <= v <= top:
                raise UsageError(f"{where}: {name} = {v!r}, expected a whole number from 0 to {top:,}")
            values[name] = int(v)
        return cls(**values)


class Scheduler(StrEnum):
    """Where a job runs: a Slurm cluster, or this machine (submitit's local executor)."""

    SLURM = "slurm"
    LOCAL = "local"


class FailureKind(StrEnum):
    """Why a job ended (runtime/classify.py decides it from exit status, state and log)."""

    COMPLETED = "COMPLETED"
    CUDA_OOM = "CUDA_OOM"
    HOST_OOM = "HOST_OOM"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    NCCL = "NCCL"
    HARDWARE = "HARDWARE"  # a GPU or node fault the driver or CUDA reported (Xid, uncorrectable ECC)
    HANG = "HANG"  # no training progress for longer than the job's threshold (the runner's watchdog)
    CANCELLED = "CANCELLED"
    USER_ERROR = "USER_ERROR"


class RetryAction(StrEnum):
    """What follows a failure: walk the OOM ladder (a new job with a smaller GPU plan), step
    the host side down (less CPU offload: a new job), resubmit the same plan as a new attempt
    (resuming from the chain's checkpoint, with the node the failure was pinned to excluded),
    requeue the same plan (submitit's checkpoint/requeue, for jobs stopped from outside), or
    nothing."""

    LADDER = "ladder"
    HOST = "host"
    RESUBMIT = "resubmit"
    REQUEUE = "requeue"
    NONE = "none"


# THE retry table: a smaller GPU plan after a CUDA OOM; less host memory after a host OOM (it
# is CPU offload or the data loader, never the GPU plan); the same plan again when the scheduler
# stopped the job from outside (submitit requeues the checkpointable runner); the same plan as
# a new attempt after a hang or a hardware fault, off the node it was pinned to and resuming
# from the last checkpoint (Llama 3, section 3.3.4: 78% of interruptions at scale were hardware,
# and a restart on healthy nodes is what their automation did); nothing for the rest, which need
# a person: NCCL errors are usually the fabric; a user error is a bug or a bad config.
RETRY_TABLE: Mapping[FailureKind, RetryAction] = {
    FailureKind.COMPLETED: RetryAction.NONE,
    FailureKind.CUDA_OOM: RetryAction.LADDER,
    FailureKind.HOST_OOM: RetryAction.HOST,
    FailureKind.TIMEOUT: RetryAction.REQUEUE,
    FailureKind.PREEMPTED: RetryAction.REQUEUE,
    FailureKind.NODE_FAIL: RetryAction.REQUEUE,
    FailureKind.NCCL: RetryAction.NONE,
    # the same plan on the same node would meet the same fault: the next attempt excludes it
    FailureKind.HARDWARE: RetryAction.RESUBMIT,
    FailureKind.HANG: RetryAction.RESUBMIT,
    FailureKind.CANCELLED: RetryAction.NONE,
    FailureKind.USER_ERROR: RetryAction.NONE,
}
# What `submit --retry KIND=ACTION` may change: the kinds whose failure happened inside the
# job. Requeues after TIMEOUT/PREEMPTED/NODE_FAIL are submitit's and a cancel is the user's.
OVERRIDABLE = (FailureKind.CUDA_OOM, FailureKind.HOST_OOM, FailureKind.NCCL, FailureKind.HARDWARE,
               FailureKind.HANG, FailureKind.USER_ERROR)
OVERRIDE_ACTIONS = (RetryAction.LADDER, RetryAction.HOST, RetryAction.RESUBMIT, RetryAction.NONE)
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_SAMPLE_INTERVAL_S = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    """How a job recovers on its own: the attempt limit of an OOM chain, the user's overrides
    of RETRY_TABLE, and what the runner records (GPU samples, memory hooks, snapshots)."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    overrides: Mapping[FailureKind, RetryAction] = field(default_factory=dict)
    memory_snapshot: bool = False
    hooks: bool = False
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S

    def action(self, kind: FailureKind | str) -> RetryAction:
        """What follows a failure of this kind (the user's override, else RETRY_TABLE)."""
        kind = FailureKind(kind)
        return self.overrides.get(kind, RETRY_TABLE[kind])

    def to_dict(self) -> dict:
        return {"max_attempts": self.max_attempts, "retry": {k.value: a.value for k, a in self.overrides.items()},
                "memory_snapshot": self.memory_snapshot, "hooks": self.hooks,
                "sample_interval_s": self.sample_interval_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> RetryPolicy:
        """The policy a job folder recorded (job.json "policy"); unknown keys are ignored, and
        an entry that restates the table is not an override."""
        d = d or {}
        overrides = {}
        for kind, action in (d.get("retry") or {}).items():
            k, a = FailureKind(kind), RetryAction(action)
            if a != RETRY_TABLE[k]:
                overrides[k] = a
        return cls(max_attempts=int(d.get("max_attempts", DEFAULT_MAX_ATTEMPTS)), overrides=overrides,
                   memory_snapshot=bool(d.get("memory_snapshot", False)), hooks=bool(d.get("hooks", False)),
                   sample_interval_s=float(d.get("sample_interval_s", DEFAULT_SAMPLE_INTERVAL_S)))

    @classmethod
    def with_overrides(cls, items: list[str], **kwargs) -> RetryPolicy:
        """A policy from `--retry KIND=ACTION` strings; UsageError naming what is allowed."""
        overrides = {}
        for item in items:
            kind, _, action = item.partition("=")
            try:
                k, a = FailureKind(kind.strip().upper()), RetryAction(action.strip().lower())
                if k not in OVERRIDABLE or a not in OVERRIDE_ACTIONS:
                    raise ValueError
            except ValueError:
                raise UsageError(f"--retry {item!r}: expected KIND=ACTION with KIND one of "
                                 f"{', '.join(OVERRIDABLE)} and ACTION one of {', '.join(OVERRIDE_ACTIONS)}") from None
            overrides[k] = a
        return cls(overrides=overrides, **kwargs)


# -- how a run ended ----------------------------------------------------------------------

MAX_NODE_RANK = 1 << 20
MAX_STEP = 10**12  # as train.steps
# a node's name as Slurm writes it (and as --exclude takes it): what a job folder's record may hold
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Failure:
    """The class of one job's ending, why we think so, and the default next step."""

    kind: FailureKind
    summary: str  # one line for humans
    evidence: str  # the log line or the state/exit status that decided it
    retry: RetryAction  # what RETRY_TABLE says follows (a job's policy may override it)
    oom: OOMFigures | None = None
    node_rank: int | None = None  # the node it happened on, once a job's nodes are compared

    def to_dict(self) -> dict:
        out = {"kind": self.kind.value, "summary": self.summary, "evidence": self.evidence,
               "retry": self.retry.value, "oom": None if self.oom is None else self.oom.to_dict()}
        return out if self.node_rank is None else out | {"node_rank": self.node_rank}

    @classmethod
    def from_dict(cls, data, where: str) -> "Failure":
        """A failure read back from a job folder's record; UsageError naming `where` when it
        is not one (an unknown kind, a missing summary, figures out of range)."""
        if not isinstance(data, dict):
            raise UsageError(f"{where}: the failure is {type(data).__name__}, expected an object")
        try:
            kind = FailureKind(data.get("kind"))
            retry = RetryAction(data.get("retry") or RETRY_TABLE[kind].value)
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        rank = data.get("node_rank")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 1 << 20):
            raise UsageError(f"{where}: node_rank = {rank!r}, expected a node's rank")
        oom = data.get("oom")
        return cls(kind, _text(data.get("summary"), kind.value), _text(data.get("evidence"), ""), retry,
                   None if oom is None else OOMFigures.from_dict(oom, where), rank)


def _text(value, default: str) -> str:
    return value if isinstance(value, str) else default


@dataclass(frozen=True)
class Outcome:
    """How one node's run ended (outcome-node<R>.json): written by the runner, read back (and
    validated: the folder is on a shared file system) by recovery, watch, report and the local
    backend. `failure` is None when the record has no classification (its classification
    failed: `error` says why)."""

    node_rank: int
    exit_code: int | None
    signal: int | None
    duration_s: float
    job_id: str
    argv: tuple[str, ...] = ()
    peak_memory_bytes_by_gpu: dict[str, int] = field(default_factory=dict)
    failure: Failure | None = None
    error: str | None = None
    host: str | None = None  # the node's name as the scheduler knows it (what --exclude takes)
    last_step: int | None = None  # the last training step the runner saw (runtime/progress.py)
    checkpoint_step: int | None = None  # the step of the newest checkpoint in the chain's folder

    @property
    def failed(self) -> bool:
        return self.exit_code not in (0, None) or bool(self.signal)

    def to_dict(self) -> dict:
        out = {"node_rank": self.node_rank, "exit_code": self.exit_code, "signal": self.signal,
               "duration_s": self.duration_s, "job_id": self.job_id, "argv": list(self.argv),
               "peak_memory_bytes_by_gpu": dict(self.peak_memory_bytes_by_gpu),
               "failure": None if self.failure is None else self.failure.to_dict()}
        for key in ("error", "host", "last_step", "checkpoint_step"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def all_valid(cls, records: list, where: str) -> list["Outcome"]:
        """The records that read back as outcomes; damaged ones are left out, as a node that
        wrote none (`where`: the folder they came from)."""
        out = []
        for data in records:
            try:
                out.append(cls.from_dict(data, where))
            except UsageError:
                continue
        return out

    @classmethod
    def from_dict(cls, data, where: str) -> "Outcome":
        """UsageError naming `where` and the key when the record is not an outcome."""
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected an object, found {type(data).__name__}")

        def whole(key, top, optional=True):
            v = data.get(key)
            if v is None and optional:
                return None
            if isinstance(v, bool) or not isinstance(v, int) or not -top <= v <= top:
                raise UsageError(f"{where}: {key} = {v!r}, expected a whole number")
            return v

        rank = whole("node_rank", MAX_NODE_RANK, optional=False)
        if rank < 0:
            raise UsageError(f"{where}: node_rank = {rank}, expected 0 or more")
        duration = data.get("duration_s", 0.0)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e9:
            raise UsageError(f"{where}: duration_s = {duration!r}, expected seconds")
        argv = data.get("argv") or []
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise UsageError(f"{where}: argv is not a list of strings")
        peaks = data.get("peak_memory_bytes_by_gpu") or {}
        if not isinstance(peaks, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_FIGURE_BYTES for v in peaks.values()):
            raise UsageError(f"{where}: peak_memory_bytes_by_gpu is not a map of GPU to bytes")
        failure = data.get("failure")
        error = data.get("error")
        host = data.get("host")
        if host is not None and not (isinstance(host, str) and NODE_NAME.fullmatch(host)):
            raise UsageError(f"{where}: host = {host!r}, expected a node name")
        steps = [whole(k, MAX_STEP) for k in ("last_step", "checkpoint_step")]
        if any(s is not None and s < 0 for s in steps):
            raise UsageError(f"{where}: a step below 0")
        return cls(rank, whole("exit_code", 1 << 31), whole("signal", 1 << 16), float(duration),
                   str(data.get("job_id", "")), tuple(argv), {str(k): v for k, v in peaks.items()},
                   None if failure is None else Failure.from_dict(failure, where),
                   error if isinstance(error, str) else None, host, *steps)


# The job folder as argv and the environment name it before it exists: a rendered framework
# file's path is written with this token, which the runner on the node replaces by the job's
# folder (no shell ever reads it).
JOB_FOLDER_TOKEN = "{JOBCTL_JOB_FOLDER}"
# The chain's checkpoint folder, the same for every attempt of a chain (the first attempt's
# <job folder>/checkpoints), which the runner puts in place of this token
CHECKPOINT_DIR_TOKEN = "{JOBCTL_CHECKPOINT_DIR}"
# Set to "1" by a framework whose rendered files include a Python module the command imports
# (torchtitan's Float8 config): the runner puts <job folder>/framework first on PYTHONPATH, after
# jobctl's own sitecustomize folder (the variable is a switch: no path is read from it).
FRAMEWORK_ON_PYTHONPATH = "JOBCTL_FRAMEWORK_ON_PYTHONPATH"
# ... and what each node knows only when it runs: its rank, the first node's address and the
# job's port (a framework's own launcher, `accelerate launch --machine_rank ...`, needs them)
NODE_RANK_TOKEN = "{JOBCTL_NODE_RANK}"
MASTER_ADDR_TOKEN = "{JOBCTL_MASTER_ADDR}"
MASTER_PORT_TOKEN = "{JOBCTL_MASTER_PORT}"


def per_node(arg: str, rank: int, master: str, port: int) -> str:
    """An argument with this node's rank, the first node's address and the job's port in place."""
    return arg.replace(NODE_RANK_TOKEN, str(rank)).replace(MASTER_ADDR_TOKEN, master).replace(
        MASTER_PORT_TOKEN, str(port))
