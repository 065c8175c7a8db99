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

    con.print(Text("error: ", style="bold red") + Text(message))
    if hint:
        con.print(Text("To fix: ", style="bold") + Text(hint))


def info(message: str) -> None:
    _console(stderr=True).print(message, style="dim")


def gib(x) -> str:
    return f"{x / GIB:,.2f}"


def _bar(value: float, scale: float) -> str:
    if scale <= 0:
        return ""
    n = value / scale * BAR_WIDTH
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
        s = report.get("search") or {}
        if s:
            con.print(Text(f"{s['considered']} layouts evaluated, {s['feasible']} fit; rule: fewest GPUs, then least "
                           "model parallelism, then cheapest memory knobs, then largest micro-batch", style="dim"))
    else:
        con.print(Text("does not fit", style="bold red"))
        for r in report["reasons"]:
            con.print(Text("  - " + r))
        if report.get("closest"):
            c = report["closest"]
            con.print(memory_table(c["memory"], "The layout that came closest (GiB)"))
        if report["suggestions"]:
            con.print(Text("What would fit:", style="bold"))
            for s in report["suggestions"]:
                con.print(Text("  - " + s))


def render_plan_overview(reports: list[dict], recipe: str) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{recipe} on every cluster (GiB per GPU)", title_justify="left")
    for col in ("cluster", "partition", "fits", "GPUs", "layout", "peak GiB", "usable GiB", "why not / what would"):
        table.add_column(col, overflow="fold")
    for r in reports:
        if r["feasible"]:
            p, mem = r["plan"], r["memory"]
            table.add_row(r["cluster"], r["partition"] or "", Text("yes", style="green"), str(p["world_size"]),
                          f"tp{p['tp']} pp{p['pp']} dp{p['dp']} cp{p['cp']} {p['sharding']} mbs{p['micro_batch_size']} "
                          f"rc={p['recompute']} off={p['offload']}",
                          gib(mem["total_bytes"]), gib(mem["gpu_usable_bytes"]), "")
        else:
            why = "; ".join(r["reasons"][:2])
            if r["suggestions"]:
                why += " | " + r["suggestions"][0]
            table.add_row(r["cluster"], r.get("partition") or "", Text("no", style="red"), "", "", "", "", Text(why))
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
