"""All terminal output goes through here: rich tables for people, JSON for scripts.

The only module that imports rich. User strings are never interpreted as markup.
stdout is data (tables, JSON); stderr is chatter and errors.
"""

from __future__ import annotations

import json
import sys

from jobctl.planner.plan import layout_text

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

    con.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    if hint:
        con.print(Text.assemble(("To fix: ", "bold"), hint), soft_wrap=True)


def line(text: str) -> None:
    """One line of data on stdout (tab-separated results scripts read)."""
    sys.stdout.write(text + "\n")


def raw(text: str) -> None:
    """Text as it is on stdout (a log, a YAML document), flushed."""
    sys.stdout.write(text)
    sys.stdout.flush()


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
        why = r.get("failure_kind") or _exit_text(r.get("exit_code")) or r.get("detail") or r.get("reason") or ""
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


def render_history(block: dict) -> None:
    """Under the plan table: what the history says (plan's "history" block), if anything."""
    from rich.text import Text

    if not block:
        return
    con = _console()
    for w in block.get("warnings") or []:
        con.print(Text("warning: ", style="bold yellow") + Text(w["message"]), soft_wrap=True)
    err = block.get("model_error")
    if err:
        con.print(Text(f"memory model on this cluster, from {err['jobs']} finished job(s) with measured peaks: "
                       f"median error {err['median_pct']:+.1f}%, worst {err['worst_pct']:+.1f}% "
                       "(predicted vs measured; negative: predicted less than used)", style="dim"), soft_wrap=True)


# --- watch, report ---------------------------------------------------------------------------------

def _gib_or(x, empty: str = "—") -> str:
    return empty if x is None else gib(x)


def _pct(x) -> str:
    return "" if x is None else f"{x:+.1f} %"


def _clock_time(iso: str | None) -> str:
    """A sampler timestamp (UTC ISO) as local time of day."""
    from datetime import datetime

    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return iso


def _state_text(state: str):
    from rich.text import Text

    return Text(state, style=_STATE_STYLES.get(state, "bold red"))


def _chain_line(chain: list[dict], text: str):
    from rich.text import Text

    # The chain text is built from ids, failure words and plan fields: colour the last state only.
    last = chain[-1]["state"] if chain else ""
    # Text.assemble, not Text + Text: a sum keeps the first part's style for the whole line.
    if last and text.endswith(" " + last):
        return Text.assemble(("attempts  ", "bold"), text[: -len(last)], _state_text(last))
    return Text.assemble(("attempts  ", "bold"), text)


def watch_view(snap: dict, live: bool = False):
    """The `watch` view of a snapshot (jobctl.cli.watch.Watcher.poll) as one renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    job, mem = snap["job"], snap["memory"]
    head = Text.assemble((f"#{job['id']} {job['recipe']} ", "bold"), _state_text(job["state"]))
    where = f"  {job['scheduler']} {job['scheduler_job_id'] or '(not submitted)'} on {job['cluster']}"
    where += f"/{job['partition']}" if job.get("partition") else ""
    count = job.get("nodes")
    if job.get("node_list"):
        where += f"  nodes {job['node_list']}"
    elif count is not None:
        where += f"  {count} node" + ("s" if count != 1 else "")
    if job.get("elapsed_s") is not None:
        where += f"  elapsed {duration(job['elapsed_s'])}"
    head.append(where)
    parts = [head]
    if job.get("reason"):
        parts.append(Text(f"scheduler says: {job['reason']}", style="yellow"))
    if snap.get("scheduler_error"):
        parts.append(Text(f"scheduler: {snap['scheduler_error']}", style="bold yellow"))
    parts.append(_chain_line(snap["chain"], snap["chain_text"]))
    tip = snap["chain"][-1] if snap["chain"] else {}
    if tip.get("layout"):
        parts.append(Text.assemble(("layout    ", "bold"), tip["layout"]))
    predicted, usable = mem.get("predicted_peak_bytes"), mem.get("gpu_usable_bytes")
    limits = f"predicted peak {_gib_or(predicted)} GiB/GPU, usable {_gib_or(usable)} GiB"
    if mem["nodes"]:
        table = Table(title=f"GPU memory (GiB = 2^30 bytes): {limits}", title_justify="left", pad_edge=False)
        for col in ("node", "GPUs", "latest (max)", "peak", "peak GPU", "of predicted", "", "sampled at"):
            table.add_column(col, justify="left" if col in ("", "sampled at") else "right", no_wrap=True)
        scale = usable or predicted or 0
        for n in mem["nodes"]:
            peak = n["peak_bytes"]
            over = peak is not None and ((usable and peak > usable) or (predicted and peak > predicted))
            style = "bold red" if over else "green"
            vs = f"{peak / predicted * 100:.0f} %" if peak is not None and predicted else ""
            table.add_row(str(n["node"]), str(n["gpu_count"]), _gib_or(n["latest_max_bytes"]),
                          Text(_gib_or(peak), style=style), "" if n["peak_gpu"] is None else str(n["peak_gpu"]),
                          vs, Text(_bar(peak or 0, scale) if scale else "", style=style),
                          _clock_time(n["latest_at"]))
        parts.append(table)
    else:
        parts.append(Text.assemble(("memory    ", "bold"), (mem["no_samples"], "yellow")))
        parts.append(Text("          " + limits))
    if snap["recovering"]:
        parts.append(Text(f"#{job['id']} failed; its first node is submitting the next attempt (OOM ladder)",
                          style="yellow"))
    elif snap["ended"]:
        why = (tip.get("failure") or {})
        text = f"chain ended: {job['state']}"
        if why.get("summary") or tip.get("stopped"):
            text += f" ({tip.get('stopped') or why['summary']})"
        parts.append(Text(text, style="bold green" if snap["completed"] else "bold red"))
    elif live:
        parts.append(Text("refreshing; Ctrl-C to stop watching (the job goes on)", style="dim"))
    return Group(*parts)


def render_watch(snap: dict) -> None:
    _console().print(watch_view(snap))


def live_watch():
    """A live view on stdout: a context manager giving `show(snapshot)`, which redraws it."""
    import contextlib

    from rich.live import Live

    @contextlib.contextmanager
    def _live():
        # Redrawn only when show() is called (the watcher paces itself), never on a timer.
        with Live(console=_console(), auto_refresh=False, transient=False, redirect_stderr=False) as lv:
            yield lambda snap: lv.update(watch_view(snap, live=True), refresh=True)

    return _live()


def report_gpu_table(rep: dict):
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"Peak memory per GPU (GPU sampler, GiB): predicted {_gib_or(rep['predicted_peak_bytes'])}, "
                        f"usable {_gib_or(rep['gpu_usable_bytes'])}", title_justify="left", pad_edge=False,
                  caption="error = (predicted - measured) / measured: + the plan over-predicted, - it under-predicted",
                  caption_justify="left")
    for col in ("node", "gpu", "name", "samples", "measured peak", "predicted", "error", "of usable", ""):
        table.add_column(col, justify="left" if col in ("name", "") else "right", no_wrap=True)
    usable = rep["gpu_usable_bytes"] or 0
    for g in rep["gpus"]:
        over = usable and g["peak_bytes"] is not None and g["peak_bytes"] > usable
        table.add_row(str(g["node"]), str(g["gpu"]), Text(g["name"] or ""), str(g["samples"]),
                      Text(_gib_or(g["peak_bytes"]), style="bold red" if over else ""),
                      _gib_or(rep["predicted_peak_bytes"]), _pct(g["error_pct"]),
                      "" if g["usable_pct"] is None else f"{g['usable_pct']:.0f} %",
                      Text(_bar(g["peak_bytes"] or 0, usable) if usable else "", style="cyan"))
    return table


def report_rank_table(rep: dict):
    from rich.table import Table

    table = Table(title="Allocator peaks per rank (jobctl.hooks, GiB)", title_justify="left", pad_edge=False,
                  caption=f"error against the prediction less its CUDA context term, "
                          f"{_gib_or(rep['predicted_allocator_bytes'])} GiB (the allocator does not see the context)",
                  caption_justify="left")
    for col in ("rank", "max reserved", "max allocated", "error", "OOM"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rep["ranks"]:
        table.add_row(str(r["rank"]), _gib_or(r["max_memory_reserved_bytes"]), _gib_or(r["max_memory_allocated_bytes"]),
                      _pct(r["error_pct"]), "yes" if r["oom"] else "")
    return table


def attempts_table(chain: list[dict]):
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Attempts (GiB per GPU)", title_justify="left", pad_edge=False)
    for col in ("id", "attempt", "state", "layout", "predicted", "measured peak", "error", "why it ended / changed"):
        table.add_column(col, justify="right" if col in ("id", "attempt", "predicted", "measured peak", "error")
                         else "left", overflow="fold", no_wrap=col in ("id", "state"))
    for a in chain:
        notes = []
        if a.get("label"):
            notes.append(f"after the previous attempt: {a['label']}")
        f = a.get("failure")
        if f:
            summary = f.get("summary") or ""
            notes.append(summary if summary.startswith(f["kind"]) else f"{f['kind']}" + (f": {summary}" if summary else ""))
        if a.get("stopped"):
            notes.append(a["stopped"])
        table.add_row(f"#{a['id']}", str(a["attempt"]), _state_text(a["state"]), Text(a.get("layout") or ""),
                      _gib_or(a["predicted_peak_bytes"], ""), _gib_or(a.get("measured_peak_bytes"), ""),
                      _pct(a.get("error_pct")), Text("; ".join(notes)))
    return table


def render_report(rep: dict) -> None:
    """`jobctl report`: memory measured against the plan, then the attempt chain."""
    from rich.text import Text

    con = _console()
    where = f"#{rep['id']} {rep['recipe']} on {rep['cluster']}" + (f"/{rep['partition']}" if rep["partition"] else "")
    head = Text.assemble((where + " ", "bold"), _state_text(rep["state"]))
    if rep.get("layout"):
        head.append(f"  {rep['layout']}, {rep['nodes']} node(s) x {rep['gpus_per_node']} {rep.get('gpu') or 'GPU'}")
    con.print(head)
    if rep.get("states_note"):
        con.print(Text(rep["states_note"], style="yellow"), soft_wrap=True)
    if rep["gpus"]:
        con.print(report_gpu_table(rep))
    else:
        con.print(Text(rep["no_samples"], style="bold yellow"), soft_wrap=True)
    if rep["ranks"]:
        con.print(report_rank_table(rep))
    for line in rep.get("hooks_off") or []:
        con.print(Text(f"hooks off on {line}", style="dim"), soft_wrap=True)
    m = rep.get("measured_peak")
    if m and rep["predicted_peak_bytes"]:
        err = m["error_pct"]
        verdict = "" if err is None else (f": the plan over-predicted by {err:.1f} %" if err > 0 else
                                          f": the plan under-predicted by {-err:.1f} %" if err < 0 else ": exact")
        con.print(Text(f"measured peak {gib(m['bytes'])} GiB ({m['source']}, {m['where']}) vs predicted "
                       f"{gib(rep['predicted_peak_bytes'])} GiB{verdict}", style="bold"), soft_wrap=True)
    elif not m:
        con.print(Text("measured peak: nothing measured, so the prediction cannot be checked"), soft_wrap=True)
    con.print(attempts_table(rep["chain"]))
    con.print(_chain_line(rep["chain"], rep["chain_text"]), soft_wrap=True)


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
    con = _console()
    con.print(table)
    n = sum(1 for r in rows if r["status"] != "ok")
    con.print(Text(f"{n} value(s) drifted: update the inventory (`jobctl clusters discover`) or the cluster"
                   if drift else "no drift", style="bold yellow" if drift else "green"), soft_wrap=True)
