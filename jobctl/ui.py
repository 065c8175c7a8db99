"""All terminal output goes through here: rich tables for people, JSON for scripts.

The only module that imports rich. User strings are never interpreted as markup.
stdout is data (tables, JSON); stderr is chatter and errors.
"""

from __future__ import annotations

import json
import sys

GIB = 1 << 30
BAR_WIDTH = 12


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, markup=False, highlight=False, emoji=False, soft_wrap=False)


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def error(message: str, hint: str | None = None) -> None:
    con = _console(stderr=True)
    from rich.text import Text

    con.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
    if hint:
        con.print(Text("To fix: ", style="bold") + Text(hint), soft_wrap=True)


def info(message: str) -> None:
    from rich.text import Text

    _console(stderr=True).print(Text(message, style="dim"), soft_wrap=True)


def gib(x) -> str:
    return f"{x / GIB:,.2f}"


def _bar(value: float, scale: float) -> str:
    if scale <= 0:
        return ""
    n = min(value / scale, 1.25) * BAR_WIDTH
    full = int(n)
    return "█" * full + ("▌" if n - full >= 0.5 else "")


def memory_table(mem: dict, title: str):
    """Every term of a breakdown, GiB, with a bar against the usable memory."""
    from rich.table import Table
    from rich.text import Text

    usable = mem["gpu_usable_bytes"]
    table = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    table.add_column("term")
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    table.add_column("how it is computed", overflow="fold")
    for t in mem["terms"]:
        if t["bytes"] == 0 and t["group"] not in ("weights",):
            continue
        table.add_row(Text(t["name"]), gib(t["bytes"]), Text(_bar(t["bytes"], usable), style="cyan"), Text(t["formula"]))
    share = mem["total_bytes"] / usable if usable else float("inf")
    style = "bold green" if share <= 1 else "bold red"
    table.add_row(Text("total", style="bold"), Text(gib(mem["total_bytes"]), style=style),
                  Text(_bar(min(mem["total_bytes"], usable * 1.25), usable), style=style),
                  Text(f"{share:.0%} of {gib(usable)} GiB usable (GPU total minus the safety margin)"))
    return table


def render_plan(report: dict) -> None:
    from rich.text import Text

    con = _console()
    head = f"{report['recipe']} on {report['cluster']}/{report['partition']}"
    m = report.get("model") or {}
    if m:
        head += f" — {m['name']} ({m['params'] / 1e9:.2f}B params)"
    con.print(Text(head, style="bold"))
    if report["feasible"]:
        p = report["plan"]
        con.print(Text(
            f"fits: {p['nodes']} node(s) x {p['gpus_per_node']} {report['gpu']} = {p['world_size']} GPUs | "
            f"tp {p['tp']} · pp {p['pp']} · dp {p['dp']} · cp {p['cp']} | sharding {p['sharding']} | "
            f"micro-batch {p['micro_batch_size']} x {p['grad_accum_steps']} accumulation x dp {p['dp']} "
            f"= {p['global_batch_size']} sequences | recompute {p['recompute']} | offload {p['offload']} | "
            f"sequence parallel {'on' if p['sequence_parallel'] else 'off'}", style="green"))
        mem = report["memory"]
        con.print(memory_table(mem, f"Memory per GPU (GiB = 2^30 bytes), most loaded rank: {mem['stage']} stage"))
        host = mem["host_bytes_per_node"]
        con.print(f"Host RAM per node: {gib(host)} GiB of {gib(mem['host_usable_bytes'])} GiB usable")
        est = report.get("estimate")
        if est:
            con.print(Text(estimate_line(est), style="bold"))
        for line in report.get("why_not", []):
            con.print(Text("  why not " + line))
        alts = report.get("alternatives") or []
        if alts:
            con.print(alternatives_table(alts))
        s = report.get("search") or {}
        if s:
            con.print(Text(f"{s['considered']} layouts evaluated, {s['feasible']} fit, objective: "
                           f"{report.get('objective', 'throughput')}", style="dim"))
        if report.get("explain"):
            render_explain(report["explain"])
    else:
        con.print(Text("does not fit", style="bold red"))
        for r in report["reasons"]:
            con.print(Text("  - " + r), soft_wrap=True)
        if report.get("closest"):
            c = report["closest"]
            con.print(memory_table(c["memory"], "The layout that came closest (GiB)"))
        if report["suggestions"]:
            con.print(Text("What would fit:", style="bold"))
            for s in report["suggestions"]:
                con.print(Text("  - " + s), soft_wrap=True)


def duration(seconds) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def estimate_line(est: dict) -> str:
    line = (f"step {duration(est['step_time_s'])} · {est['tokens_per_s']:,.0f} tokens/s · "
            f"{est['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU · MFU {est['mfu']:.1%}")
    if est.get("time_to_train_s"):
        line += f" · {est['steps']} steps: {duration(est['time_to_train_s'])}, {est['gpu_hours']:,.0f} GPU-hours"
    return line


def alternatives_table(alts: list[dict]):
    from rich.table import Table

    table = Table(title="Next best layouts", title_justify="left")
    for col in ("layout", "GPUs", "GiB", "step", "tokens/s/GPU", "MFU"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for a in alts:
        p, m, e = a["plan"], a["memory"], a["estimate"] or {}
        table.add_row(layout_text(p), str(p["world_size"]), gib(m["total_bytes"]), duration(e.get("step_time_s")),
                      f"{e.get('tokens_per_s_per_gpu', 0):,.0f}", f"{e.get('mfu', 0):.1%}")
    return table


def layout_text(p: dict) -> str:
    text = f"tp{p['tp']} pp{p['pp']}"
    if p.get("virtual_stages", 1) > 1:
        text += f"(v{p['virtual_stages']})"
    text += f" dp{p['dp']} cp{p['cp']} {p['sharding']} mbs{p['micro_batch_size']}x{p['grad_accum_steps']}"
    rc = p["recompute"]
    if rc != "none":
        text += f" rc={rc}" + (f"({p['recompute_layers']}/stage)" if p.get("recompute_layers") else "")
    if p["offload"] != "none":
        text += f" off={p['offload']}"
    return text


def render_explain(ex: dict) -> None:
    from rich.text import Text

    con = _console()
    con.print(Text(f"Decision ({ex['objective']}): {ex['layouts_evaluated']} layouts evaluated, "
                   f"{ex['feasible']} fit.", style="bold"))
    for reason, n in sorted(ex["rejected"].items(), key=lambda x: -x[1]):
        con.print(Text(f"  rejected, {reason}: {n}"))
    for i, wnr in enumerate(ex["winners"], 1):
        con.print(Text(f"  #{i} {wnr['plan']} on {wnr['world_size']} GPUs: {wnr['memory_gib']} GiB, "
                       f"step {duration(wnr['step_time_s'])}, {wnr['tokens_per_s_per_gpu'] or 0:,.0f} tokens/s/GPU"))


def render_dry_run(items: list[dict]) -> None:
    """What submit would do: parameters, environment, each node's command, the sbatch script."""
    import json as _json

    from rich.text import Text

    con = _console()
    for item in items:
        con.print(Text(f"{item['recipe']} -> {item['cluster']}/{item['partition']} ({item['scheduler']}), "
                       f"job folder {item['job_folder']}", style="bold"), soft_wrap=True)
        con.print(Text("parameters: " + _json.dumps(item["parameters"], default=str)), soft_wrap=True)
        con.print(Text("environment:", style="bold"))
        for k, v in item["env"].items():
            con.print(Text(f"  {k}={v!r}" if len(v) < 200 else f"  {k}=<{len(v)} characters>"), soft_wrap=True)
        for node in item["nodes"]:
            con.print(Text(f"node {node['node_rank']} runs (argv, no shell): " + _json.dumps(node["argv"])),
                      soft_wrap=True)
        if "sbatch" in item:
            con.print(Text("sbatch script:", style="bold"))
            con.print(Text(item["sbatch"]), soft_wrap=True)
        if "check" in item:
            ok = item["check"]["ok"]
            con.print(Text(("sbatch --test-only: OK " if ok else "sbatch --test-only: REFUSED ") + item["check"]["sbatch"],
                           style="green" if ok else "bold red"), soft_wrap=True)


def render_plan_overview(reports: list[dict], recipe: str) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{recipe} on every cluster, best first (GiB per GPU)", title_justify="left")
    for col in ("cluster", "partition", "fits", "GPUs", "layout", "peak GiB", "step", "time to train", "why not / what would"):
        table.add_column(col, overflow="fold", min_width=4 if col in ("fits", "GPUs") else None)
    for r in reports:
        if r["feasible"]:
            p, mem, est = r["plan"], r["memory"], r.get("estimate") or {}
            table.add_row(r["cluster"], r["partition"] or "", Text("yes", style="green"), str(p["world_size"]),
                          layout_text(p), f"{gib(mem['total_bytes'])}/{gib(mem['gpu_usable_bytes'])}",
                          duration(est.get("step_time_s")), duration(est.get("time_to_train_s")), "")
        else:
            closest = (r.get("closest") or {}).get("memory")
            if closest:
                why = f"needs {gib(closest['total_bytes'])} GiB/GPU"
            else:
                why = r["reasons"][0] if r["reasons"] else "does not fit"
            if r["suggestions"]:
                why += "; " + r["suggestions"][0].split(":")[0]
            table.add_row(r["cluster"], r.get("partition") or "", Text("no", style="red"), "", "", "", "", "", Text(why))
    _console().print(table)


def render_memory_calc(result: dict) -> None:
    from rich.text import Text

    con = _console()
    con.print(Text(result["headline"], style="bold"))
    con.print(memory_table(result["memory"], "Memory per GPU (GiB = 2^30 bytes)"))
    for note in result["notes"]:
        con.print(Text("note: " + note))
    verdict = result["verdict"]
    con.print(Text(verdict, style="bold green" if result["fits"] else "bold red"))


# --- jobs: status, history ------------------------------------------------------------------------

_STATE_STYLES = {"COMPLETED": "green", "RUNNING": "bold cyan", "COMPLETING": "cyan", "PENDING": "yellow",
                 "SUBMITTED": "yellow", "REQUEUED": "yellow", "SUSPENDED": "yellow", "PREPARED": "dim",
                 "CANCELLED": "magenta", "UNKNOWN": "dim"}


def local_time(iso: str | None) -> str:
    """A stored UTC timestamp as local wall-clock time, to the minute."""
    from datetime import datetime

    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


def jobs_table(rows: list[dict], title: str | None = None):
    """Jobs as `status` and `history` show them (rows from jobctl.cli.history.job_row)."""
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
        why = _exit_text(r.get("exit_reason")) or r.get("reason") or ""
        chain = " → ".join(f"#{i}" for i in r.get("chain") or [])
        table.add_row(f"#{r['id']}", Text(r.get("scheduler_job_id") or ""), Text(r["recipe"]), Text(r["cluster"]),
                      Text(r["state"], style=_STATE_STYLES.get(r["state"], "bold red")), Text(nodes),
                      local_time(r.get("submitted_at")), duration(r.get("elapsed_s")), Text(why), Text(chain))
    return table


def _exit_text(reason: str | None) -> str:
    """sacct's ExitCode "code:signal" in words ("0:0", nothing to say, is left out)."""
    import re

    m = re.fullmatch(r"(\d+):(\d+)", reason or "")
    if not m:
        return reason or ""
    code, sig = int(m[1]), int(m[2])
    return ", ".join(([f"exit {code}"] if code else []) + ([f"signal {sig}"] if sig else []))


def render_jobs(rows: list[dict], title: str | None = None) -> None:
    _console().print(jobs_table(rows, title))
