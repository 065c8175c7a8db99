"""The `jobctl` command line: one module per command; exit codes handled here, in one place.

argparse (standard library) keeps start-up lean: `jobctl plan` is run in loops, and heavy
imports (omegaconf, pydantic, rich, submitit, paramiko) happen inside the commands.
"""

from __future__ import annotations

import argparse
import gc
import sys

from jobctl import __version__
from jobctl.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, JobctlError

DESCRIPTION = """Plan, submit, watch and recover LLM training jobs on GPU clusters.

Exit codes (docs/exit-codes.md): 0 ok / fits, 2 bad input or usage, 3 does not fit,
            4 the job failed (--wait, watch), 5 the scheduler or SSH refused or is unreachable,
            6 the history database is damaged or read-only (jobctl doctor), 70 a bug in jobctl (the traceback is printed), 130 interrupted."""

# (module, command name): each module defines add_arguments(parser) and run(args) -> int.
COMMANDS = [
    ("jobctl.cli.plan", "plan"),
    ("jobctl.cli.memory", "memory"),
    ("jobctl.cli.submit", "submit"),
    ("jobctl.cli.status", "status"), ("jobctl.cli.logs", "logs"), ("jobctl.cli.cancel", "cancel"), ("jobctl.cli.history", "history"),
    ("jobctl.cli.requeue", "requeue"),
    ("jobctl.cli.watch", "watch"), ("jobctl.cli.report", "report"),
    ("jobctl.cli.clusters", "clusters"), ("jobctl.cli.remote", "remote"),
    ("jobctl.cli.doctor", "doctor"),
]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors: one line, exit 2, no traceback
        sys.stderr.write(f"{self.prog}: error: {message} (run `{self.prog} --help`)\n")
        raise SystemExit(EXIT_USAGE)


def _command_parser(module_name: str, name: str):
    import importlib

    mod = importlib.import_module(module_name)
    p = _Parser(prog=f"jobctl {name}", description=mod.__doc__, epilog=getattr(mod, "EPILOG", None),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(p)
    return p, mod


def _top_help() -> str:
    import importlib

    lines = [DESCRIPTION, "", "commands:"]
    for module_name, name in COMMANDS:
        lines.append(f"  {name:<10} {importlib.import_module(module_name).HELP}")
    lines += ["", "Run `jobctl COMMAND --help` for a command's options and examples."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map JobctlError to its exit code with one clear message, no traceback.

    Only the module of the command being run is imported (start-up time)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write("usage: jobctl [--version] COMMAND ...\n\n" + _top_help())
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        sys.stdout.write(f"jobctl {__version__}\n")
        return 0
    commands = dict((name, mod) for mod, name in COMMANDS)
    if argv[0] not in commands:
        import difflib

        close = difflib.get_close_matches(argv[0], list(commands), n=1)
        sys.stderr.write(f"jobctl: error: unknown command {argv[0]!r}"
                         + (f"; did you mean {close[0]!r}?" if close else "")
                         + f" (commands: {', '.join(commands)})\n")
        return EXIT_USAGE
    try:
        # what the imports make lives as long as the process: no cycle collection while the
        # command's modules load, and the collector need not walk them again on every full
        # collection afterwards (a tenth of `plan --framework all`'s time); once per process
        # (main() called again in one, as tests do, freezes nothing more)
        first = not gc.get_freeze_count()
        collecting = gc.isenabled()
        if first:
            gc.disable()
        try:
            parser, mod = _command_parser(commands[argv[0]], argv[0])
        finally:
            if first:
                gc.freeze()
                if collecting:
                    gc.enable()
        args = parser.parse_intermixed_args(argv[1:])
        return int(mod.run(args) or 0)
    except JobctlError as e:
        from jobctl import ui

        ui.error(e.message, e.hint)
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:
        return 0
    finally:
        if "jobctl.remote.client" in sys.modules:  # the SSH connections this command opened
            sys.modules["jobctl.remote.client"].close_all()


def _interrupted(e: BaseException | None) -> bool:
    """Whether Ctrl-C is behind e: a library may turn the KeyboardInterrupt it received into an
    error of its own (raised while handling it, or from it)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def run() -> None:
    try:
        code = main()
    except KeyboardInterrupt:  # between the command's own handlers (e.g. while importing)
        sys.stderr.write("interrupted\n")
        code = EXIT_INTERRUPTED
    except Exception as e:
        if _interrupted(e):  # the user's Ctrl-C, wrapped by a library: not a bug in jobctl
            sys.stderr.write("interrupted\n")
            code = EXIT_INTERRUPTED
        else:
            import traceback

            traceback.print_exc()
            sys.stderr.write("internal error: this is a bug in jobctl; please report it with the traceback above\n")
            code = EXIT_INTERNAL
    sys.exit(code)
