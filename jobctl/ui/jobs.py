"""Jobs in a table (`status`, `history`) and an inventory's drift (`clusters check`)."""

from __future__ import annotations

from jobctl.ui.terminal import STATE_STYLES, console, duration, local_time


def jobs_table(rows: list[dict], title: str | None = None):
    """Jobs as `status` and `history` show them (rows from jobctl.jobs.status.job_row)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", pad_edge=False)
    for col in ("id", "scheduler id", "recipe", "cluster", "state", "nodes", "submitted", "elapsed",
                "exit reason", "attempts"):
        table.add_column(col, justify="right" if col in ("id", "nodes", "elapsed") else "left",
                         overflow="fold", no_wrap=col in ("id", "state", "submitted"))
    for r in rows:
        nodes = "" if r["nodes"] is None else str(r["nodes"])
        if r.get("node_list"):
            nodes += f" {r['node_list']}"
        why = r.get("failure_kind") or exit_text(r.get("exit_code")) or r.get("detail") or r.get("reason") or ""
        chain = " → ".join(f"#{i}" for i in r.get("chain") or [])
        table.add_row(f"#{r['id']}", Text(r.get("scheduler_job_id") or ""), Text(r["recipe"]), Text(r["cluster"]),
                      Text(r["state"], style=STATE_STYLES.get(r["state"], "bold red")), Text(nodes),
                      local_time(r.get("submitted_at")), duration(r.get("elapsed_s")), Text(why), Text(chain))
    return table


def exit_text(reason: str | None) -> str:
    """sacct's ExitCode "code:signal" in words ("0:0", nothing to say, is left out)."""
    import re

    m = re.fullmatch(r"(\d+):(\d+)", reason or "")
    if not m:
        return reason or ""
    code, sig = int(m[1]), int(m[2])
    return ", ".join(([f"exit {code}"] if code else []) + ([f"signal {sig}"] if sig else []))


def render_jobs(rows: list[dict], title: str | None = None) -> None:
    console().print(jobs_table(rows, title))


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
