"""A job's command and launcher argv, Slurm's time format: pure functions, values in and out
(the plan's Slurm parameters and environment are jobs/environment.py's).

Nothing here reads files, the clock or the environment, or prints. The argv lists built here
are executed without a shell (``subprocess`` with a list, ``os.execvpe``), so every element
reaches the program byte for byte: quotes, ``$(...)``, backticks, ``;`` and newlines are
data, never evaluated. The same holds for environment values. The one place a shell does
read our values is submitit's sbatch script: there every value is quoted by submitit
(``shlex.quote``), and values that could still break a ``#SBATCH`` line (newlines, NUL)
are refused here.
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex

from jobctl.errors import UsageError

RDZV_PORT_MIN, RDZV_PORT_MAX = 20000, 29999
LAUNCHERS = ("torchrun", "none")

_PYTHON = re.compile(r"python(3(\.[0-9]+)?)?")


class LaunchError(UsageError, ValueError):
    """A recipe/inventory/plan combination that cannot be turned into a job."""


# -- Slurm ---------------------------------------------------------------------------------


def parse_slurm_time(value: str | int | None, key: str) -> int | None:
    """Minutes in a Slurm time limit; None for None or UNLIMITED/INFINITE.

    Slurm's formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S. Note that a
    single colon is minutes:seconds, as in Slurm. Seconds round up to a whole minute
    (submitit takes minutes; Slurm rounds up too). ``key`` names the setting in errors.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise LaunchError(f"{key}: expected a Slurm time such as '04:00:00', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise LaunchError(f"{key}: the time limit must be positive, got {value}")
        return value
    text = str(value).strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, hours, minutes, seconds = 0, 0, 0, 0
    m = re.fullmatch(r"(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?", text, flags=re.ASCII)
    if m:
        days, hours = int(m[1]), int(m[2])
        minutes, seconds = int(m[3] or 0), int(m[4] or 0)
        bad = hours >= 24 or minutes >= 60 or seconds >= 60
    else:
        parts = text.split(":")
        if not (1 <= len(parts) <= 3 and all(p.isdigit() and p.isascii() for p in parts)):
            bad = True
        else:
            nums = [int(p) for p in parts]
            if len(nums) == 1:
                minutes = nums[0]
                bad = False
            elif len(nums) == 2:
                minutes, seconds = nums
                bad = seconds >= 60
            else:
                hours, minutes, seconds = nums
                bad = minutes >= 60 or seconds >= 60
    if bad:
        raise LaunchError(
            f"{key}: {value!r} is not a Slurm time limit; use minutes ('90'), "
            "'HH:MM:SS' ('04:00:00'), 'D-HH' ('2-00') or 'D-HH:MM:SS' ('2-12:00:00')"
        )
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total_s == 0:
        raise LaunchError(f"{key}: the time limit must be positive, got {value!r} "
                          "(to Slurm 0 means no limit; give the time the run needs)")
    return math.ceil(total_s / 60)


# -- command and launcher ------------------------------------------------------------------


def command_argv(command: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The recipe's launch.command as an argv list.

    A list is taken as is. A string is split like a POSIX shell splits words (shlex.split):
    quotes group words and backslashes escape, but nothing is evaluated: no variables,
    no ``$(...)``, no globs, no pipes or ``;`` — those characters stay in the arguments.
    """
    if command is None:
        raise LaunchError("launch.command is not set", hint="Set launch.command in the recipe, e.g. "
                          "'python train.py --config cfg.yaml'.")
    if isinstance(command, str):
        try:
            argv = shlex.split(command, posix=True)
        except ValueError as e:  # unbalanced quotes
            raise LaunchError(f"launch.command: cannot split {command!r} into words: {e}") from None
    else:
        argv = list(command)
        for i, arg in enumerate(argv):
            if not isinstance(arg, str):
                raise LaunchError(f"launch.command[{i}]: expected a string, got {type(arg).__name__} {arg!r}")
    if not argv:
        raise LaunchError("launch.command is empty")
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise LaunchError(f"launch.command[{i}]: contains a NUL byte, which no argv can hold")
    return argv


def rdzv_port(job_id: str) -> int:
    """A port in 20000-29999 that every node of job ``job_id`` computes alike, without talking.

    sha256, not hash(): Python salts str hashes per process.
    """
    digest = hashlib.sha256(str(job_id).encode("utf-8")).digest()
    return RDZV_PORT_MIN + int.from_bytes(digest[:8], "big") % (RDZV_PORT_MAX - RDZV_PORT_MIN + 1)


def launcher_argv(nodes: int, gpus_per_node: int, command_argv: list[str], node_rank: int, master_addr: str,
                  port: int, launcher: str, *, rdzv_id: str | None = None) -> list[str]:
    """The argv one node of a `nodes` x `gpus_per_node` job runs: torchrun around the command,
    or the command alone ('none').

    For torchrun a leading ``python``/``python3`` is dropped (torchrun starts the Python
    processes itself, with ``python -u``) and ``python -m pkg.mod`` becomes ``--module
    pkg.mod``; a ``.py`` script runs as is; any other program (``bash run.sh``, an
    interpreter by path) runs through ``--no-python``. ``rdzv_id`` must be the same on
    every node (default: derived from the endpoint, which already is). The list is meant
    for exec without a shell.
    """
    argv = list(command_argv)
    if not argv:
        raise LaunchError("the command is empty")
    if launcher == "none":
        return argv
    if launcher != "torchrun":
        raise LaunchError(f"launch.launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if not 0 <= node_rank < nodes:
        raise LaunchError(f"node_rank {node_rank} is outside 0..{nodes - 1} (nodes={nodes})")
    if not 1 <= port <= 65535:
        raise LaunchError(f"rendezvous port {port} is not a TCP port (1-65535)")
    if not master_addr or any(c.isspace() for c in master_addr):
        raise LaunchError(f"rendezvous host {master_addr!r} is not a host name or address")
    head = [
        "torchrun",
        "--nnodes", str(nodes),
        "--nproc-per-node", str(gpus_per_node),
        "--node-rank", str(node_rank),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{master_addr}:{port}",
        "--rdzv-id", rdzv_id if rdzv_id is not None else f"jobctl-{master_addr}-{port}",
    ]
    return head + _torchrun_target(argv)


def _torchrun_target(argv: list[str]) -> list[str]:
    first = argv[0]
    if _PYTHON.fullmatch(first):
        rest = argv[1:]
        while rest and rest[0] == "-u":  # torchrun already runs `python -u`
            rest = rest[1:]
        if not rest:
            raise LaunchError(f"launch.command: {first!r} without a script or -m module")
        if rest[0] == "-m":
            if len(rest) < 2 or rest[1].startswith("-"):
                raise LaunchError("launch.command: '-m' without a module name")
            return ["--module", *rest[1:]]
        if rest[0].startswith("-"):
            raise LaunchError(
                f"launch.command: the interpreter option {rest[0]!r} cannot be passed through torchrun",
                hint="Use the PYTHON* environment variables (e.g. PYTHONOPTIMIZE) or launch.launcher: none.",
            )
        return rest
    if first.startswith("-"):
        raise LaunchError(f"launch.command: {first!r} would be read as a torchrun option, not a program")
    if first.endswith(".py"):
        return argv
    return ["--no-python", *argv]
