"""One exception hierarchy for jobctl, mapped to exit codes in one place (cli.main)."""

from __future__ import annotations

from dataclasses import dataclass

# The exit codes, one meaning each (docs/exit-codes.md; `jobctl --help` lists them too):
EXIT_OK = 0  # success; for plan/memory: it fits; with --wait: the job completed
EXIT_USAGE = 2  # bad input: a recipe, an inventory, a flag, an unknown job
EXIT_NO_FIT = 3  # the request is valid but cannot fit / a pinned layout is impossible / nothing smaller
EXIT_JOB_FAILED = 4  # a job that was waited for (or watched) ended without completing
EXIT_BACKEND = 5  # the scheduler or the transport refused or could not be reached
EXIT_STATE = 6  # jobctl's own state (the history database) is damaged, read-only or on a full disk
EXIT_INTERNAL = 70  # a bug in jobctl (EX_SOFTWARE): the traceback is kept
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class JobctlError(Exception):
    """Base class of the errors a user can act on. Printed without a traceback."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(JobctlError):
    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a YAML file: where it is, what was wrong, what is allowed."""

    file: str
    line: int | None
    key: str
    problem: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.problem}" if self.key else f"{where}: {self.problem}"


class ConfigError(JobctlError):
    """All problems found in a recipe or inventory, reported together."""

    exit_code = EXIT_USAGE

    def __init__(self, issues: list[ConfigIssue], hint: str | None = None):
        self.issues = list(issues)
        text = "\n".join(str(i) for i in self.issues)
        super().__init__(text, hint)


class InfeasibleError(JobctlError):
    """A valid request that cannot run: a pinned layout that is impossible, nothing fits."""

    exit_code = EXIT_NO_FIT


class SchedulerError(JobctlError):
    """The scheduler (Slurm, a login node over SSH) refused or could not be reached."""

    exit_code = EXIT_BACKEND


class SubmissionUncertain(SchedulerError):
    """The scheduler call failed in a way that does not say whether the job was made (sbatch
    timed out, the connection to a login node dropped after the request was sent): the job stays
    PREPARED until `jobctl status` finds it, or finds it was not made."""
