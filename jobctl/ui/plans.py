"""Plans for people: the memory breakdown with a bar per term, the step estimate, the
alternatives, the decision (--explain), the dry run, every cluster side by side."""

from __future__ import annotations

import sys

from jobctl.planner.plan import layout_text
from jobctl.ui.terminal import (
    GIB,
    bar,
    console,
    duration,
    gib,
    print_unsqueezed,
    sanitize,
    short_duration,
)


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
        table.add_row(Text(t["name"]), gib(t["bytes"]), Text(bar(t["bytes"], usable), style="cyan"), Text(t["formula"]))
    share = mem["total_bytes"] / usable if usable else float("inf")
    style = "bold green" if share <= 1 else "bold red"
    table.add_row(Text("total", style="bold"), Text(gib(mem["total_bytes"]), style=style),
                  Text(bar(min(mem["total_bytes"], usable * 1.25), usable), style=style),
                  Text(f"{share:.0%} of {gib(usable)} GiB usable (GPU total minus the safety margin)"))
    return table


def render_plan(report: dict) -> None:
    from rich.text import Text

    con = console()
    head = f"{report['recipe']} on {report['cluster']}/{report['partition']}"
    m = report.get("model") or {}
    if m:
        head += f" — {m['name']} ({m['params'] / 1e9:.2f}B params)"
    con.print(Text(head, style="bold"))
    if report["feasible"]:
        p = report["plan"]
        con.print(Text(
            f"fits: {p['nodes']} node(s) x {p['gpus_per_node']} {report['gpu']} = {p['world_size']} "
            f"GPU{'s' if p['world_size'] != 1 else ''} | "
            f"tp {p['tp']} · pp {p['pp']} · dp {p['dp']} · cp {p['cp']} | sharding {p['sharding']} | "
            f"micro-batch {p['micro_batch_size']} x {p['grad_accum_steps']} accumulation x dp {p['dp']} "
            f"= {p['global_batch_size']} sequences | recompute {p['recompute']} | offload {p['offload']} | "
            f"sequence parallel {'on' if p['sequence_parallel'] else 'off'}", style="green"))
        mem = report["memory"]
        learned = report.get("learned")
        if learned:
            con.print(Text(f"memory calibrated by {learned['from']}: +{gib(learned['fixed_gap_bytes'])} GiB and "
                           f"{learned['per_scaling']:.3g} x the activations and logits the model missed (the "
                           "\"learned from an OOM\" term; `plan --no-learn` leaves it out)", style="yellow"),
                      soft_wrap=True)
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
        choice = report.get("objective_choice")
        if choice:
            con.print(Text(f"objective {choice['name']}: {choice['rule']}", style="bold"))
            for note in choice.get("notes", []):
                con.print(Text("  " + note))
            others = ", ".join(f"{k} → {v['gpus']} GPU{'s' if v['gpus'] != 1 else ''}, step "
                               f"{duration(v['step_time_s'])}"
                               for k, v in choice.get("others", {}).items() if v.get("step_time_s"))
            if others:
                con.print(Text(f"  other objectives (--objective): {others}", style="dim"))
        for line in report.get("framework_advice") or []:
            con.print(Text(line, style="yellow"))
        s = report.get("search") or {}
        if s:
            con.print(Text(f"{s['considered']} layouts evaluated, {s['feasible']} fit, objective: "
                           f"{report.get('objective', 'balanced')}", style="dim"))
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
        for line in report.get("framework_advice") or []:
            con.print(Text(line, style="yellow"))


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


def render_explain(ex: dict) -> None:
    from rich.text import Text

    con = console()
    con.print(Text(f"Decision ({ex['objective']}): {ex['layouts_evaluated']} layouts evaluated, "
                   f"{ex['feasible']} fit.", style="bold"))
    for reason, n in sorted(ex["rejected"].items(), key=lambda x: -x[1]):
        con.print(Text(f"  rejected, {reason}: {n}"))
    for i, wnr in enumerate(ex["winners"], 1):
        con.print(Text(f"  #{i} {wnr['plan']} on {wnr['world_size']} GPU{'s' if wnr['world_size'] != 1 else ''}: {wnr['memory_gib']} GiB, "
                       f"step {duration(wnr['step_time_s'])}, {wnr['tokens_per_s_per_gpu'] or 0:,.0f} tokens/s/GPU"))
    checks = ex.get("memory_checks") or []
    if checks:
        from rich.table import Table

        con.print(Text("Memory terms, and what checks them:", style="bold"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=1)  # the indent, kept on wrapped lines
        grid.add_column(max_width=20)  # term names wrap instead of being cut
        grid.add_column(no_wrap=True)
        grid.add_column()
        for c in checks:
            grid.add_row("", Text(c["term"]), Text(c["check"]), Text(c["by"]))
        con.print(grid)
        notes = Table.grid(padding=(0, 1))
        notes.add_column(width=1)
        notes.add_column(style="dim")
        for key, what in (ex.get("memory_evidence") or {}).items():
            notes.add_row("", Text(f"{key}: {what}"))
        con.print(notes)


def render_dry_run(items: list[dict]) -> None:
    """What submit would do: parameters, environment, each node's command, the sbatch script."""
    import json as _json

    from rich.text import Text

    con = console()
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


def short_layout(p: dict) -> str:
    """The parallel layout in few characters: "tp4 pp9 dp2 z1" (cp and interleaving when used,
    "+off" with offload); micro-batches are their own column."""
    text = f"tp{p['tp']} pp{p['pp']}" + (f"v{p['virtual_stages']}" if p.get("virtual_stages", 1) > 1 else "")
    text += f" dp{p['dp']}" + (f" cp{p['cp']}" if p["cp"] > 1 else "")
    text += {"none": "", "zero1": " z1", "zero2": " z2", "zero3": " z3", "hsdp": " hsdp"}.get(p["sharding"], f" {p['sharding']}")
    if p["recompute"] != "none":
        text += " rc" if p["recompute"] == "full" else " sel"
    return text + (" +off" if p["offload"] != "none" else "")


def render_plan_overview(reports: list[dict], recipe: str, wide: bool = False) -> None:
    """Every cluster side by side, best first. At 80 columns: short cells that never wrap
    (numbers and layouts are truncated with an ellipsis on narrower terminals, never folded
    letter by letter); only the reason of a cluster that does not fit wraps, at words.
    `wide` shows the full layout and the reason in their own columns."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{recipe} on every cluster, best first", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("cluster", no_wrap=True, overflow="ellipsis")
    table.add_column("GPUs", justify="right", no_wrap=True)
    table.add_column("layout" if not wide else "layout (micro-batch x accumulation)", no_wrap=not wide,
                     overflow="ellipsis" if not wide else "fold")
    if not wide:
        table.add_column("mbs", no_wrap=True)
    table.add_column("GiB/GPU", justify="right", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("to train", justify="right", no_wrap=True)
    if wide:
        table.add_column("why not / what would", overflow="fold")
    other_rows = []
    clusters = [r["cluster"] for r in reports]
    for r in reports:
        # the partition only where it tells something: --wide, or a cluster listed twice
        where = r["cluster"] + (f"/{r['partition']}" if r.get("partition") and (wide or clusters.count(r["cluster"]) > 1)
                                else "")
        if r["feasible"]:
            p, mem, est = r["plan"], r["memory"], r.get("estimate") or {}
            cells = [where, str(p["world_size"]), layout_text(p) if wide else short_layout(p)]
            if not wide:
                cells.append(f"{p['micro_batch_size']}x{p['grad_accum_steps']}")
            cells += [f"{mem['total_bytes'] / GIB:.1f}/{mem['gpu_usable_bytes'] / GIB:.0f}",
                      short_duration(est.get("step_time_s")), short_duration(est.get("time_to_train_s"))]
            table.add_row(*cells, *([""] if wide else []))
        else:
            closest = (r.get("closest") or {}).get("memory")
            why = f"needs {gib(closest['total_bytes'])} GiB/GPU" if closest else (
                r["reasons"][0] if r["reasons"] else "does not fit")
            if r["suggestions"]:
                why += "; " + r["suggestions"][0].split(":")[0]
            other_rows.append((where, why))
            if wide:
                table.add_row(where, "", Text("does not fit", style="red"), "", "", "", Text(why))
            else:
                table.add_row(where, "-", Text("does not fit", style="red"), "", "", "", "")
    con = console()
    print_unsqueezed(table) if wide else con.print(table)
    if not wide:  # the reasons, one per line, wrapped at words
        for where, why in other_rows:
            con.print(Text.assemble((f"{where}: ", "bold"), ("does not fit: ", "red"), why))
        con.print(Text("layout: tp/pp/dp/cp sizes, z1-z3 = ZeRO stage, rc = full recompute, sel = selective, "
                       "+off = offload; mbs = micro-batch x accumulation; GiB/GPU = peak/usable; --wide for all",
                       style="dim"))

def render_memory_calc(result: dict) -> None:
    from rich.text import Text

    con = console()
    con.print(Text(result["headline"], style="bold"))
    con.print(memory_table(result["memory"], "Memory per GPU (GiB = 2^30 bytes)"))
    for note in result["notes"]:
        con.print(Text("note: " + note))
    verdict = result["verdict"]
    con.print(Text(verdict, style="bold green" if result["fits"] else "bold red"))


def render_history(block: dict) -> None:
    """Under the plan table: what the history says (plan's "history" block), if anything."""
    from rich.text import Text

    if not block:
        return
    con = console()
    for w in block.get("warnings") or []:
        con.print(Text("warning: ", style="bold yellow") + Text(w["message"]), soft_wrap=True)
    err = block.get("model_error")
    if err:
        con.print(Text(f"memory model on this cluster, from {err['jobs']} finished job(s) with measured peaks: "
                       f"median error {err['median_pct']:+.1f}%, worst {err['worst_pct']:+.1f}% "
                       "(predicted vs measured; negative: predicted less than used)", style="dim"), soft_wrap=True)


def render_framework(block: dict) -> None:
    """`plan --emit`: the plan in its framework's own names, as text a shell or a file takes."""
    import shlex

    name = block.get("name", "")
    out = [f"# {name}: arguments (${{framework.args}})", shlex.join(block.get("args") or []) or "(none)"]
    env = block.get("env") or {}
    if env:
        out.append("# environment")
        out += [f"export {k}={shlex.quote(str(v))}" for k, v in env.items()]
    for key, text in (block.get("files") or {}).items():
        out.append(f"# file {key} (${{framework.files.{key.split('.')[0]}}} in the job's folder)")
        out.append(text.rstrip("\n"))
    for note in block.get("notes") or []:
        out.append(f"# note: {note}")
    sys.stdout.write(sanitize("\n".join(out)) + "\n")


def render_framework_table(rows: list[dict], recipe: str, cluster: str, current: str, objective: str) -> None:
    """`plan --framework all`: each framework's plan on the same GPUs, fastest first."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    con = console()
    table = Table(title=f"{recipe} on {cluster}, each framework (objective {objective})", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("framework", no_wrap=True, min_width=10)
    table.add_column("GPUs", justify="right", no_wrap=True, min_width=4)
    table.add_column("layout", no_wrap=True, overflow="ellipsis")
    table.add_column("mbs", no_wrap=True, min_width=6)
    table.add_column("GiB/GPU", justify="right", no_wrap=True, min_width=7)
    table.add_column("step", justify="right", no_wrap=True, min_width=6)
    table.add_column("tok/s/GPU", justify="right", no_wrap=True, min_width=9)
    order = sorted(rows, key=lambda r: (not r["feasible"], r["step_time_s"] or 0.0))
    for r in order:
        name = r["framework"] + (" *" if r["framework"] == current else "")
        if r["feasible"]:
            p = r["plan"]
            table.add_row(name, str(r["gpus"]), short_layout(p), f"{p['micro_batch_size']}x{p['grad_accum_steps']}",
                          gib(r["memory_bytes"]), duration(r["step_time_s"]), f"{r['tokens_per_s_per_gpu'] or 0:,.0f}")
        else:
            table.add_row(name, "-", "does not fit", "", "", "", "")
    con.print(table)
    for r in order:
        if not r["feasible"] and r.get("reason"):
            con.print(Text(f"{r['framework']}: {r['reason']}"))
    con.print(Text("* the recipe's framework. layout: tp/pp/dp/cp sizes, z1-z3 = ZeRO stage, rc = full "
                   "recompute, sel = selective, +off = offload; mbs = micro-batch x accumulation", style="dim"))
    con.print(Text(f"plan one: jobctl plan {recipe} --cluster {cluster} --framework NAME", style="dim"))
