"""Jobs in a table (`status`, `history`) and an inventory's drift (`clusters check`)."""

from __future__ import annotations

from jobctl.ui.terminal import (
    STATE_STYLES,
    console,
    duration,
    local_time,
    print_unsqueezed,
    short_duration,
)


def jobs_table(rows: list[dict], title: str | None = None, wide: bool = False):
    """Jobs as `status` and `history` show them (rows from jobctl.jobs.status.job_row). At 80
    columns: short cells that never wrap (long names end in an ellipsis), one space between
    columns, the reason wrapping at words; `wide`: everything in full (node lists, years)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1) if wide else (0, 1, 0, 0))
    fold = {"overflow": "fold"} if wide else {"no_wrap": True, "overflow": "ellipsis"}
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("scheduler id" if wide else "sched", **fold)
    table.add_column("recipe", **fold, max_width=None if wide else 14)
    table.add_column("cluster", **fold, max_width=None if wide else 8)
    table.add_column("state", no_wrap=True)
    table.add_column("nodes" if wide else "N", justify="right", **fold)
    table.add_column("submitted", no_wrap=True)
    table.add_column("elapsed", justify="right", no_wrap=True)
    table.add_column("exit reason" if wide else "reason", overflow="fold" if wide else "ellipsis")
    chains = any(r.get("chain") for r in rows)
    if chains:
        table.add_column("attempts", overflow="fold" if wide else "ellipsis")
    from datetime import datetime

    year = datetime.now().astimezone().strftime("%Y")
    for r in rows:
        nodes = "" if r["nodes"] is None else str(r["nodes"])
        if r.get("node_list") and wide:
            nodes += f" {r['node_list']}"
        why = r.get("failure_kind") or exit_text(r.get("exit_code")) or r.get("detail") or r.get("reason") or ""
        chain = " → ".join(f"#{i}" for i in r.get("chain") or [])
        when = local_time(r.get("submitted_at"))
        if not wide and when.startswith(year + "-"):
            when = when[5:]  # this year's: "11-25 19:15"
        cells = [f"#{r['id']}", Text(r.get("scheduler_job_id") or ""), Text(r["recipe"]), Text(r["cluster"]),
                 Text(r["state"], style=STATE_STYLES.get(r["state"], "bold red")), Text(nodes), when,
                 duration(r.get("elapsed_s")) if wide else short_duration(r.get("elapsed_s")), Text(why)]
        table.add_row(*cells, *([Text(chain)] if chains else []))
    return table


def exit_text(reason: str | None) -> str:
    """sacct's ExitCode "code:signal" in words ("0:0", nothing to say, is left out)."""
    import re

    m = re.fullmatch(r"(\d+):(\d+)", reason or "")
    if not m:
        return reason or ""
    code, sig = int(m[1]), int(m[2])
    return ", ".join(([f"exit {code}"] if code else []) + ([f"signal {sig}"] if sig else []))


def render_jobs(rows: list[dict], title: str | None = None, wide: bool = False) -> None:
    table = jobs_table(rows, title, wide)
    print_unsqueezed(table) if wide else console().print(table)


def render_drift(cluster: str, rows: list[dict], drift: bool) -> None:
    """`jobctl clusters check`: the inventory against the cluster, one row per value."""
    from rich.table import Table
    from rich.text import Text

    styles = {"ok": "green", "changed": "bold yellow", "missing": "bold red", "extra": "yellow"}
    table = Table(title=f"Drift of {cluster} (inventory vs cluster now)", title_justify="left", pad_edge=False)
    for col in ("partition", "what", "inventory", "cluster", "status"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(Text(r["partition"]), Text(r["what"]), Text(r["inventory"]), Text(r["cluster"]),
                      Text(r["status"], style=styles.get(r["status"], "")))
    con = console()
    con.print(table)
    n = sum(1 for r in rows if r["status"] != "ok")
    con.print(Text(f"{n} value(s) drifted: update the inventory (`jobctl clusters discover`) or the cluster"
                   if drift else "no drift", style="bold yellow" if drift else "green"), soft_wrap=True)


def render_doctor(report: dict) -> None:
    """`jobctl doctor`: the history file's state, its problems, what to do."""
    from rich.text import Text

    con = console()
    state = "usable" if report["ok"] else "NOT usable"
    con.print(Text(f"history {report['path']}: " + (state if report["exists"] else "none yet (made by the first submit)"),
                   style="green" if report["ok"] else "bold red"), soft_wrap=True)
    if report.get("exists"):
        jobs = ", ".join(f"{n} {s}" for s, n in sorted((report.get("jobs") or {}).items())) or "none"
        con.print(Text(f"  mode {report.get('mode')}, {report.get('size', 0):,} bytes, schema "
                       f"{report.get('schema_version', '?')}, jobs: {jobs}"), soft_wrap=True)
    for problem in report["problems"]:
        con.print(Text(f"  problem: {problem}", style="yellow"), soft_wrap=True)
    for copy in report["copies"]:
        con.print(Text(f"  kept copy of a damaged version: {copy}"), soft_wrap=True)
    if report.get("reset_to"):
        con.print(Text(f"moved aside to {report['reset_to']}; the next command starts an empty history"),
                  soft_wrap=True)
    elif not report["ok"]:
        con.print(Text("To fix: `jobctl doctor --reset` moves it aside (nothing is deleted); job folders stay."),
                  soft_wrap=True)
