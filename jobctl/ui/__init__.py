"""All terminal output goes through here: rich tables for people, JSON for scripts.

The only package that imports rich (and matplotlib, ui/plot.py). User strings are never
interpreted as markup. stdout is data (tables, JSON); stderr is chatter and errors. Each view
lives in its own module; this package names them all, and imports a view's module when the
view is first asked for (a command imports the views it prints, nothing more).
"""

from __future__ import annotations

import importlib

# name -> (module, sanitized). Every view that prints gets its arguments with control
# characters made visible: names, log lines and reasons come from users and jobs (print_json
# needs nothing: JSON escapes them; raw cleans what goes to a terminal itself; the rest format
# numbers or times).
_VIEWS = {
    **dict.fromkeys(("render_doctor", "render_drift", "render_jobs"), ("jobctl.ui.jobs", True)),
    **dict.fromkeys(("memory_table", "render_dry_run", "render_explain",
                     "render_framework", "render_framework_table", "render_history", "render_memory_calc",
                     "render_plan", "render_plan_overview"), ("jobctl.ui.plans", True)),
    **dict.fromkeys(("attempts_table", "render_report", "report_gpu_table", "report_rank_table"),
                    ("jobctl.ui.report", True)),
    **dict.fromkeys(("error", "info", "line", "notes"), ("jobctl.ui.terminal", True)),
    **dict.fromkeys(("duration", "gib", "local_time", "print_json", "progress", "raw", "sanitize", "sanitized"),
                    ("jobctl.ui.terminal", False)),
    **dict.fromkeys(("render_watch", "watch_view"), ("jobctl.ui.watch", True)),
    "live_watch": ("jobctl.ui.watch", False),
}


def __getattr__(name: str):
    try:
        module, clean = _VIEWS[name]
    except KeyError:
        raise AttributeError(f"module 'jobctl.ui' has no attribute {name!r}") from None
    view = getattr(importlib.import_module(module), name)
    if clean:
        from jobctl.ui.terminal import sanitized

        view = sanitized(view)
    globals()[name] = view  # asked once
    return view


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_VIEWS))


__all__ = sorted(_VIEWS)
