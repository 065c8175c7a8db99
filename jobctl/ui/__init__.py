"""All terminal output goes through here: rich tables for people, JSON for scripts.

The only package that imports rich (and matplotlib, ui/plot.py). User strings are never
interpreted as markup. stdout is data (tables, JSON); stderr is chatter and errors. Each view
lives in its own module; this package names them all.
"""

from jobctl.ui.jobs import jobs_table, render_doctor, render_drift, render_jobs
from jobctl.ui.plans import (
    alternatives_table,
    estimate_line,
    memory_table,
    render_dry_run,
    render_explain,
    render_framework,
    render_framework_table,
    render_history,
    render_memory_calc,
    render_plan,
    render_plan_overview,
)
from jobctl.ui.report import (
    attempts_table,
    render_report,
    report_gpu_table,
    report_rank_table,
)
from jobctl.ui.terminal import (
    duration,
    error,
    gib,
    info,
    line,
    local_time,
    print_json,
    raw,
    sanitized,
)
from jobctl.ui.watch import live_watch, render_watch, watch_view

# Every view that prints gets its arguments with control characters made visible: names,
# log lines and reasons come from users and jobs (print_json needs nothing: JSON escapes
# them; raw cleans what goes to a terminal itself).
(alternatives_table, attempts_table, error, render_doctor, estimate_line, info, jobs_table, line, memory_table, render_drift,
 render_dry_run, render_explain, render_framework, render_framework_table, render_history, render_jobs,
 render_memory_calc, render_plan, render_plan_overview, render_report, render_watch, report_gpu_table, report_rank_table, watch_view) = map(
    sanitized, (alternatives_table, attempts_table, error, render_doctor, estimate_line, info, jobs_table, line, memory_table,
                render_drift, render_dry_run, render_explain, render_framework, render_framework_table,
                render_history, render_jobs,
                render_memory_calc, render_plan, render_plan_overview, render_report, render_watch, report_gpu_table,
                report_rank_table, watch_view))

__all__ = [
    "alternatives_table",
    "attempts_table",
    "duration",
    "error",
    "estimate_line",
    "gib",
    "info",
    "jobs_table",
    "line",
    "live_watch",
    "local_time",
    "memory_table",
    "print_json",
    "raw",
    "render_doctor",
    "render_drift",
    "render_dry_run",
    "render_explain",
    "render_framework",
    "render_framework_table",
    "render_history",
    "render_jobs",
    "render_memory_calc",
    "render_plan",
    "render_plan_overview",
    "render_report",
    "render_watch",
    "report_gpu_table",
    "report_rank_table",
    "watch_view",
]
