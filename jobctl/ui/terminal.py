"""The terminal: one rich console per stream, JSON on stdout, messages on stderr, and the
small formatting helpers every view shares. User strings are never read as markup."""

from __future__ import annotations

import json
import re
import sys

from jobctl.model import duration  # noqa: F401  (the ui's modules take it from here)

GIB = 1 << 30


BAR_WIDTH = 12


def console(stderr: bool = False, width: int | None = None):
    from rich.console import Console

    return Console(stderr=stderr, markup=False, highlight=False, emoji=False, soft_wrap=False, width=width)


def print_unsqueezed(renderable) -> None:
    """A table at its natural width even when the terminal is narrower (`--wide`: the terminal
    wraps whole lines; no cell is folded letter by letter)."""
    from rich.measure import Measurement

    con = console()
    natural = Measurement.get(con, con.options.update_width(100_000), renderable).maximum
    (console(width=natural) if natural > con.width else con).print(renderable)


# Terminal control characters, and Unicode format characters that change what text appears to
# say: bidi overrides and isolates (U+202A-202E, U+2066-2069: "cat\u202egnp.exe" shows as
# "catexe.png"), marks, zero-width characters and joiners, line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                      "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]")


def sanitize(text: str) -> str:
    """Text without terminal control characters (escape sequences become visible \\x1b) or
    Unicode format characters (a bidi override becomes visible \\u202e)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100
                        else f"\\u{ord(m.group(0)):04x}", text)


def clean(value):
    """`value` with every string in it (dict values and keys, list and tuple items) sanitized:
    what a view receives from the services holds user- and job-supplied strings (recipe names,
    log lines, scheduler reasons) that must reach the terminal as text, never as escapes."""
    if isinstance(value, str):
        return sanitize(value)
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if type(value) is tuple:
        return tuple(clean(v) for v in value)
    return value


def sanitized(fn):
    """A view whose arguments are cleaned first (ui/__init__.py wraps every view with it)."""
    import functools

    @functools.wraps(fn)
    def view(*args, **kwargs):
        return fn(*(clean(a) for a in args), **{k: clean(v) for k, v in kwargs.items()})

    return view


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def error(message: str, hint: str | None = None) -> None:
    con = console(stderr=True)
    from rich.text import Text

    con.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    if hint:
        con.print(Text.assemble(("To fix: ", "bold"), hint), soft_wrap=True)


def line(text: str) -> None:
    """One line of data on stdout (tab-separated results scripts read)."""
    sys.stdout.write(text + "\n")


def raw(text: str) -> None:
    """Text as it is on stdout (a log, a YAML document), flushed; on a terminal, its control
    characters are shown, not obeyed (a job's log may hold anything)."""
    sys.stdout.write(sanitize(text) if sys.stdout.isatty() else text)
    sys.stdout.flush()


def info(message: str) -> None:
    from rich.text import Text

    console(stderr=True).print(Text(message, style="dim"), soft_wrap=True)


def notes(*loaded) -> None:
    """What the user should know of where recipes and inventories were found (their `notes`)."""
    for item in loaded:
        for note in getattr(item, "notes", ()):
            info(sanitize("note: " + note))  # paths from this folder: shown, never obeyed


def para(text: str, style: str | None = None, indent: str = "", hang: str = "  ", stderr: bool = False) -> None:
    """A paragraph wrapped at words to the terminal's width (80 through a pipe), its next lines
    indented by `hang` more than the first: no trailing spaces, no word cut."""
    import textwrap

    from rich.text import Text

    con = console(stderr=stderr)
    for ln in textwrap.wrap(text, max(con.width, 20), initial_indent=indent, subsequent_indent=indent + hang,
                            break_long_words=False, break_on_hyphens=False) or [""]:
        con.print(Text(ln, style=style or ""), soft_wrap=True)


PROGRESS_DELAY_S = 1.0  # work shorter than this shows no progress at all


class Progress:
    """What `progress` yields: `update(text)` says what is being done now."""

    def __init__(self, message: str):
        import threading

        self.message = sanitize(message)
        self._lock = threading.Lock()
        self._status = None
        self._done = False

    def update(self, message: str) -> None:
        with self._lock:
            self.message = sanitize(message)
            if self._status is not None:
                self._status.update(self.message)

    def _start(self) -> None:
        with self._lock:
            if self._done:
                return
            self._status = console(stderr=True).status(self.message, spinner="dots")
            self._status.start()

    def _stop(self) -> None:
        with self._lock:
            self._done = True
            if self._status is not None:
                self._status.stop()


class _Silent:
    def update(self, message: str) -> None:
        pass


def progress(message: str):
    """A context showing a spinner and `message` on stderr while slow work runs: only when
    stderr is a terminal, and only once the work has taken PROGRESS_DELAY_S (quick commands
    and pipes, scripts and CI see nothing). Erased when the work ends."""
    import contextlib

    @contextlib.contextmanager
    def run():
        if not sys.stderr.isatty():
            yield _Silent()
            return
        import os
        import threading

        try:
            delay = float(os.environ.get("JOBCTL_PROGRESS_DELAY", PROGRESS_DELAY_S))
        except ValueError:
            delay = PROGRESS_DELAY_S
        shown = Progress(message)
        timer = threading.Timer(min(max(delay, 0.0), 60.0), shown._start)
        timer.daemon = True
        timer.start()
        try:
            yield shown
        finally:
            timer.cancel()
            shown._stop()

    return run()


def gib(x) -> str:
    return f"{x / GIB:,.2f}"


def bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """`value` against `scale` as a bar of `width` characters (up to 1.25 x as long when over)."""
    if scale <= 0:
        return ""
    n = min(value / scale, 1.25) * width
    full = int(n)
    return "█" * full + ("▌" if n - full >= 0.5 else "")


def local_time(iso: str | None) -> str:
    """A stored UTC timestamp as local wall-clock time, to the minute."""
    from datetime import datetime

    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


STATE_STYLES = {"COMPLETED": "green", "RUNNING": "bold cyan", "COMPLETING": "cyan", "PENDING": "yellow",
                 "SUBMITTED": "yellow", "REQUEUED": "yellow", "SUSPENDED": "yellow", "PREPARED": "dim",
                 "CANCELLED": "magenta", "UNKNOWN": "dim"}


def gib_or(x, empty: str = "—") -> str:
    return empty if x is None else gib(x)


def pct(x) -> str:
    return "" if x is None else f"{x:+.1f} %"


def clock_time(iso: str | None) -> str:
    """A sampler timestamp (UTC ISO) as local time of day."""
    from datetime import datetime

    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return iso


def state_text(state: str):
    from rich.text import Text

    return Text(state, style=STATE_STYLES.get(state, "bold red"))


def short_duration(seconds) -> str:
    """A duration in at most 6 characters: 54.6s, 31m, 15.2h, 21.3d."""
    if seconds is None:
        return ""
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 100:
        return f"{s:.1f}s"
    if s < 100 * 60:
        return f"{s / 60:.0f}m"
    if s < 48 * 3600:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d" if s < 1000 * 86400 else f"{s / 86400:.0f}d"
