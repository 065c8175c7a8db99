"""Jobs in a table (`status`, `history`) and an inventory's drift (`clusters check`)."""

from __future__ import annotations

from jobctl.ui.columns import Column, print_table
from jobctl.ui.terminal import (
    STATE_STYLES,
    console,
    duration,
    local_time,
    short_duration,
)

# The jobs table at any width. Its columns, and how it degrades when the terminal is narrower
# than the table, step by step (each step only as far as needed): long recipe and cluster names
# and a long reason (sbatch's refusal) are cut first, then the columns least needed to tell
# jobs apart go, the scheduler's id first.
# The state, the reason (CUDA_OOM, NODE_FAIL, exit 1, signal 9 in full) and the place in an
# attempt chain ("3 of #5") are never cut; `--wide` shows every cell in full.
JOB_COLUMNS = {
    "id": Column("id", right=True),
    "sched": Column("sched"),
    "recipe": Column("recipe"),
    "cluster": Column("cluster"),
    "state": Column("state"),
    "N": Column("N", right=True),
    "submitted": Column("submitted"),
    "elapsed": Column("elapsed", right=True),
    "reason": Column("reason", min_width=12),  # a scheduler's long pending reason is cut
    "attempts": Column("attempts"),
}
JOB_STEPS = [("reason", 28), ("recipe", 24), ("cluster", 14), ("sched", None), ("recipe", 16), ("cluster", 10),
             ("N", None), ("reason", 20), ("submitted", None), ("recipe", 10), ("cluster", 6), ("elapsed", None),
             ("cluster", None)]


def chain_text(row: dict, wide: bool = False) -> str:
    """A job's place in its attempt chain: "2 of #5" (its attempt, the chain's first job); with
    `wide`, the whole chain "#5 → #6 → #7"."""
    chain = row.get("chain") or []
    if not chain:
        return ""
    if wide:
        return " → ".join(f"#{i}" for i in chain)
    return f"{chain.index(row['id']) + 1 if row['id'] in chain else row.get('attempt') or '?'} of #{chain[0]}"


def job_cells(r: dict, wide: bool, year: str) -> dict:
    from rich.text import Text

    nodes = "" if r["nodes"] is None else str(r["nodes"])
    if r.get("node_list") and wide:
        nodes += f" {r['node_list']}"
    why = r.get("failure_kind") or exit_text(r.get("exit_code")) or r.get("detail") or r.get("reason") or ""
    when = local_time(r.get("submitted_at"))
    if not wide and when.startswith(year + "-"):
        when = when[5:]  # this year's: "11-25 19:15"
    return {"id": f"#{r['id']}", "sched": r.get("scheduler_job_id") or "", "recipe": r["recipe"],
            "cluster": r["cluster"], "state": Text(r["state"], style=STATE_STYLES.get(r["state"], "bold red")),
            "N": nodes, "submitted": when,
            "elapsed": duration(r.get("elapsed_s")) if wide else short_duration(r.get("elapsed_s")),
            "reason": why, "attempts": chain_text(r, wide)}


def render_jobs(rows: list[dict], title: str | None = None, wide: bool = False) -> None:
    """Jobs as `status` and `history` show them (rows from jobctl.jobs.status.job_row): one line
    each at any width (columns narrowed, then dropped in JOB_COLUMNS' order); `wide`: every
    cell in full (node lists, years, whole chains), as wide as it takes."""
    from datetime import datetime

    year = datetime.now().astimezone().strftime("%Y")
    names = [n for n in JOB_COLUMNS if n != "attempts" or any(r.get("chain") for r in rows)]
    columns = [JOB_COLUMNS[n] for n in names]
    if wide:
        columns = [Column("scheduler id" if c.header == "sched" else c.header, right=c.right) for c in columns]
    cells = [[job_cells(r, wide, year)[n] for n in names] for r in rows]
    steps = [(names.index(n), w) for n, w in JOB_STEPS if n in names]
    print_table(columns, cells, title, width=10**6 if wide else None, steps=steps)


def exit_text(reason: str | None) -> str:
    """sacct's ExitCode "code:signal" in words ("0:0", nothing to say, is left out)."""
    import re

    m = re.fullmatch(r"(\d+):(\d+)", reason or "")
    if not m:
        return reason or ""
    code, sig = int(m[1]), int(m[2])
    return ", ".join(([f"exit {code}"] if code else []) + ([f"signal {sig}"] if sig else []))




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
