"""Check jobctl's own state (the history database) and say how to recover it."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import EXIT_OK, EXIT_STATE
from jobctl.jobs.commands import check_history

HELP = "check the history database; with --reset, move a damaged one aside"
EPILOG = """examples:
  jobctl doctor                 # where the history is, its mode, sqlite's integrity check, jobs per state
  jobctl doctor --json
  jobctl doctor --reset         # move it (and its -wal/-shm) aside to history.sqlite.reset-<time>

Nothing is deleted: --reset renames the file, the job folders stay where they are, and a copy
of a damaged history is kept as history.sqlite.damaged-* the first time a command meets it.
Jobs still running keep running; `jobctl status` no longer lists them after a reset
(`squeue --me` does).
exit codes: 0 the history is usable (or --reset done), 6 it is damaged or read-only."""


def add_arguments(p) -> None:
    p.add_argument("--reset", action="store_true", help="move the history aside and start an empty one")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the report as JSON on stdout")


def run(args) -> int:
    report = check_history(args.reset)
    if args.as_json:
        ui.print_json(report)
    else:
        ui.render_doctor(report)
    return EXIT_OK if report["ok"] or args.reset else EXIT_STATE
