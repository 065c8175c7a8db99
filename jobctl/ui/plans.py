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
    para,
    print_unsqueezed,
    sanitize,
    short_duration,
)

# the DeepEP kernels a mixture of experts' tokens travel by (train.moe_dispatcher), as the summary names them
DISPATCHERS = {"hybridep": "HybridEP", "deepep": "DeepEP"}


def _stage_layers(report: dict) -> str:
    """"; layers 16/16/13 + MTP": a pipeline's layers on its first, middle and last stage where
    they differ (a split no even one takes, stages one layer short) or the last holds MTP modules."""
    held = (report.get("memory") or {}).get("stage_layers")
    if not held:
        return ""
    first, middle, last, mtp = held["first"], held["middle"], held["last"], held.get("mtp_on_last") or 0
    if first == middle == last and not mtp:
        return ""
    counts = f"{first}/{middle}/{last}" if report["plan"]["pp"] > 2 else f"{first}/{last}"
    return f"; layers {counts}" + (" + MTP" if mtp else "")


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


def short_formula(formula: str) -> str:
    """A memory term's formula as the plan's one-line view shows it: its arithmetic, before the
    first "; " or " [" (what the formula counts, and the term-by-term detail, are in --explain)."""
    head = formula
    for sep in (" [", "; "):
        head = head.split(sep, 1)[0]
    if not any(ch.isdigit() for ch in head) and "; " in formula:  # "offloaded; GPU keeps ..."
        head = formula.split("; ", 1)[1].split("; ", 1)[0]
    return head


def memory_lines(mem: dict, title: str):
    """The memory breakdown at a glance: one line per term (GiB, a bar, a short formula)."""
    from rich.text import Text

    from jobctl.ui.columns import Column, print_table

    usable = mem["gpu_usable_bytes"]
    rows = [[t["name"], gib(t["bytes"]), Text(bar(t["bytes"], usable, 8), style="cyan"), short_formula(t["formula"])]
            for t in mem["terms"] if t["bytes"] != 0 or t["group"] == "weights"]
    share = mem["total_bytes"] / usable if usable else float("inf")
    style = "bold green" if share <= 1 else "bold red"
    rows.append([Text("total", style="bold"), Text(gib(mem["total_bytes"]), style=style),
                 Text(bar(min(mem["total_bytes"], usable * 1.25), usable, 8), style=style),
                 f"{share:.0%} of the {gib(usable)} GiB usable"])
    columns = [Column("term", min_width=12), Column("GiB", right=True), Column(""),
               Column("formula (--explain: derivation)", min_width=16)]
    print_table(columns, rows, title, steps=[(0, 18), (3, 40)])


def comparison_lines(why_not: list[dict], est: dict | None, gpus: int) -> None:
    """Why the other values of each dimension lost: one line each, with the alternative's GPU
    count and its tokens/s per GPU and in total against this plan's."""
    from rich.text import Text

    from jobctl.ui.columns import Column, print_table

    rows = [[w["change"], str(w["gpus"]), f"{w['per_gpu']:+.1%}", f"{w['total']:+.1%}", w["reason"]]
            for w in why_not if w.get("gpus") is not None]
    if rows:
        # tokens/s per GPU and in total, each against this plan's (the estimate line above)
        print_table([Column("why not"), Column("GPUs", right=True), Column("per GPU", right=True),
                     Column("total", right=True), Column("why it loses", min_width=20)], rows, rule=False)
    for w in why_not:
        if w.get("gpus") is None:
            console().print(Text(f"  {w['text']}"), soft_wrap=False, overflow="ellipsis", crop=True)


def render_plan(report: dict) -> None:
    """`jobctl plan`: the plan at a glance (one screen at 80 columns); --explain adds every
    term's derivation, the whole decision and the evidence behind each memory term."""
    con = console()
    explain = bool(report.get("explain"))
    head = f"{report['recipe']} on {report['cluster']}/{report['partition']}"
    m = report.get("model") or {}
    if m:
        active = m.get("active_params")
        head += f" — {m['name']} ({m['params'] / 1e9:.2f}B params" + (
            f", {active / 1e9:.2f}B active)" if active and active != m["params"] else ")")
    para(head, style="bold")
    if report["feasible"]:
        _render_fit(report, explain)
    else:
        para("does not fit", style="bold red")
        for r in report["reasons"]:
            para("- " + r, indent="  ")
        if report.get("closest"):
            c = report["closest"]
            title = "The layout that came closest (GiB)"
            con.print(memory_table(c["memory"], title)) if explain else memory_lines(c["memory"], title)
        if report["suggestions"]:
            para("What would fit:", style="bold")
            for s in report["suggestions"]:
                para("- " + s, indent="  ")
        for line in report.get("framework_advice") or []:
            para(line, "yellow")


def _render_fit(report: dict, explain: bool) -> None:
    """A plan that fits: its layout, memory, speed, the alternatives and the objective's choice."""
    con = console()
    p = report["plan"]
    gpus = p["world_size"]
    stages = _stage_layers(report)
    para(
        f"fits: {p['nodes']} node{'s' if p['nodes'] != 1 else ''} x {p['gpus_per_node']} {report['gpu']} = "
        f"{gpus} GPU{'s' if gpus != 1 else ''} · tp {p['tp']} · pp {p['pp']}"
        + (f" (v {p['virtual_stages']}{stages})" if p.get("virtual_stages", 1) > 1
           else f" ({stages[2:]})" if stages else "")
        + f" · dp {p['dp']} · cp {p['cp']}" + (f" · ep {p['ep']}" if p.get("ep", 1) > 1 else ""), style="green")
    para(
        f"{p['sharding']}" + (" · sequence parallel" if p["sequence_parallel"] else "")
        + (" · bf16 grads" if (report.get("train") or {}).get("grad_reduce") == "bf16" else "")
        + (f" · {DISPATCHERS[dispatcher]} dispatch" if (dispatcher := (report.get("train") or {}).get("moe_dispatcher"))
           in DISPATCHERS and p.get("ep", 1) > 1 else "")
        + f" · recompute {p['recompute']}"
        + (f" ({p['recompute_layers']}/stage)" if p.get("recompute_layers") else "")
        + (f" ({', '.join(sanitize(str(x)) for x in mods)})"
           if (mods := (report.get("train") or {}).get("recompute_modules")) else "")
        + f" · offload {p['offload']}", style="green")
    overlaps = (report.get("framework") or {}).get("overlaps")
    if overlaps:  # at a glance their names; --explain (and --json) with the flags that turn them on
        para("overlapped: " + ("; ".join(overlaps) if explain else " · ".join(o.split(" (")[0] for o in overlaps)),
             style="green")
    para(
        f"micro-batch {p['micro_batch_size']} x {p['grad_accum_steps']} accumulation x dp {p['dp']} = "
        f"{p['global_batch_size']:,} sequences", style="green")
    mem = report["memory"]
    learned = report.get("learned")
    if learned:
        para(f"memory calibrated by {learned['from']}: +{gib(learned['fixed_gap_bytes'])} GiB and "
             f"{learned['per_scaling']:.3g} x the activations and logits the model missed (the "
             "\"learned from an OOM\" term; `plan --no-learn` leaves it out)", style="yellow")
    title = f"Memory per GPU in GiB (2^30 B), on the most loaded rank ({mem['stage']} stage)"
    if explain:
        con.print(memory_table(mem, title))
    else:
        memory_lines(mem, title)
    con.print(f"host RAM per node: {gib(mem['host_bytes_per_node'])} of {gib(mem['host_usable_bytes'])} "
              "GiB usable")
    est = report.get("estimate")
    if est:
        lines = estimate_lines(est, gpus)
        r = report.get("resilience")
        with_failures = resilience_line(r)
        if with_failures and len(lines) > 1:
            lines[1] += f"; {with_failures}"
        for text in lines:
            para(text, style="bold")
        line = checkpoint_line(r)
        if line:
            para(line)
        if explain:
            for text in step_parts_lines(est):
                para(text, indent="  ")
    why_not = report.get("why_not") or []
    if explain:
        for w in why_not:
            para("why not " + w["text"], indent="  ")
    else:
        comparison_lines(why_not, est, gpus)
    alts = report.get("alternatives") or []
    if alts:  # four at a glance (--json and --explain: all of them)
        alternatives_lines(alts if explain else alts[:4], gpus)
    choice = report.get("objective_choice")
    s = report.get("search") or {}
    if choice:
        para(f"objective {choice['name']}: {choice['rule']}", "bold")
        for note in choice.get("notes", []):
            para(note, indent="  ")
        others = "; ".join(f"{k} → {v['gpus']} GPU{'s' if v['gpus'] != 1 else ''}, step "
                           f"{duration(v['step_time_s'])}"
                           for k, v in choice.get("others", {}).items() if v.get("step_time_s"))
        if others:
            para(f"other objectives (--objective): {others}", "dim", indent="  ")
        if s:
            para(f"{s['considered']} layouts evaluated, {s['feasible']} fit", style="dim", indent="  ")
    elif s:
        para(f"{s['considered']} layouts evaluated, {s['feasible']} fit, objective: "
             f"{report.get('objective', 'balanced')}", style="dim")
    for line in [*(report.get("framework_advice") or []), *(report.get("warnings") or [])]:
        para(line, "yellow")
    if explain:
        render_explain(report["explain"])


def estimate_lines(est: dict, gpus: int) -> list[str]:
    """The step estimate: speed on one line, the time to train on the next."""
    out = [f"step {duration(est['step_time_s'])} · {est['tokens_per_s']:,.0f} tokens/s in total on {gpus} "
           f"GPU{'s' if gpus != 1 else ''}, {est['tokens_per_s_per_gpu']:,.0f} per GPU · MFU {est['mfu']:.1%}"]
    if est.get("time_to_train_s"):
        out.append(f"{est['steps']:,} steps: {duration(est['time_to_train_s'])}, {est['gpu_hours']:,.0f} GPU-hours")
    return out


STEP_PARTS = (("compute_s", "compute"), ("tp_comm_s", "TP"), ("pp_bubble_s", "bubble"), ("pp_p2p_s", "PP sends"),
              ("dp_comm_s", "DP exposed"), ("cp_comm_s", "CP exposed"), ("ep_comm_s", "EP exposed"),
              ("moe_host_s", "expert launches"), ("offload_s", "offload"), ("optimizer_s", "optimizer"))


def step_parts_lines(est: dict) -> list[str]:
    """--explain: the step's parts (those above zero) and how the data-parallel ring runs."""
    parts = est.get("parts") or {}
    shown = [f"{label} {duration(parts[key])}" for key, label in STEP_PARTS if parts.get(key, 0) > 0]
    out = ["step parts: " + " · ".join(shown)] if shown else []
    ring = est.get("data_parallel_ring")
    if ring:
        k = ring["ranks_per_node"]
        bw = ring["bus_gbs_per_gpu"]
        gbs = f"{bw:,.0f} GB/s per GPU" if bw >= 10 else f"{bw:.2g} GB/s per GPU"
        where = (f"inside one node: {gbs}" if ring["inside_node"] else
                 f"one per node over {ring['nodes']} nodes: {gbs} (one GPU's share of the network)" if k == 1 else
                 f"{k} per node over {ring['nodes']} nodes: {gbs} (the network shares of {k} GPUs together)")
        out.append(f"data-parallel ring: {ring['ranks']} ranks, {where}, {ring['latency_s'] * 1e6:,.0f} us latency a "
                   "call (NCCL's ring)")
    return out


def resilience_line(r: dict | None) -> str | None:
    """The time to train with interruptions (the JSON's "resilience" block has the rest)."""
    if not r or not r.get("time_to_train_s"):
        return None
    return f"with failures (1/{r['mtbi_h']:,.0f} h): {duration(r['time_to_train_s'])}"


def checkpoint_line(r: dict | None) -> str | None:
    """Goodput, the checkpoint and its interval, and the runner's hang threshold
    (resources.hang_after sets it; 0 turns the watchdog off)."""
    if not r:
        return None
    parts = []
    if r.get("time_to_train_s"):
        size = r["checkpoint_bytes"] / 1e12
        what = f"{size:.2f} TB" if size >= 0.1 else f"{r['checkpoint_bytes'] / 1e9:.1f} GB"
        parts.append(f"goodput {r['goodput']:.0%}, {what} checkpoint in {duration(r['write_s'])} / "
                     f"{r['interval_steps']:,} steps")
    if "hang_after_s" in r:  # the first step's threshold: --json, submit --dry-run
        parts.append(f"hang after {duration(r['hang_after_s'])}" if r["hang_after_s"] else "no hang watchdog")
    return ", ".join(parts) or None


def alternatives_lines(alts: list[dict], gpus: int) -> None:
    """The next best layouts, one line each (the legend as in `plan --cluster all`)."""
    from jobctl.ui.columns import Column, print_table

    rows = []
    for a in alts:
        p, m, e = a["plan"], a["memory"], a["estimate"] or {}
        rows.append([short_layout(p), f"{p['micro_batch_size']}x{p['grad_accum_steps']}", str(p["world_size"]),
                     gib(m["total_bytes"]), duration(e.get("step_time_s")),
                     f"{e.get('tokens_per_s_per_gpu', 0):,.0f}", f"{e.get('mfu', 0):.1%}"])
    print_table([Column("next best layouts", min_width=12), Column("mbs"), Column("GPUs", right=True),
                 Column("GiB", right=True), Column("step", right=True), Column("tok/s/GPU", right=True),
                 Column("MFU", right=True)], rows, rule=False)


def render_explain(ex: dict) -> None:
    from rich.text import Text

    con = console()
    para(f"Decision ({ex['objective']}): {ex['layouts_evaluated']} layouts evaluated, {ex['feasible']} fit.",
         style="bold")
    for reason, n in sorted(ex["rejected"].items(), key=lambda x: -x[1]):
        para(f"rejected, {reason}: {n}", indent="  ")
    for i, wnr in enumerate(ex["winners"], 1):
        para(f"#{i} {wnr['plan']} on {wnr['world_size']} GPU{'s' if wnr['world_size'] != 1 else ''}: "
             f"{wnr['memory_gib']} GiB, step {duration(wnr['step_time_s'])}, "
             f"{wnr['tokens_per_s_per_gpu'] or 0:,.0f} tokens/s/GPU", indent="  ")
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


NODE_RANK = "<NODE_RANK>"  # what the dry run shows where each node's command differs: its rank


def command_template(nodes: list[dict]) -> list[str] | None:
    """The one command every node runs, with NODE_RANK where the nodes' commands differ (each
    node's own rank there); None when they differ in anything else."""
    argvs = [n["argv"] for n in nodes]
    if not argvs or any(len(a) != len(argvs[0]) for a in argvs):
        return None
    template = list(argvs[0])
    for i in range(len(template)):
        if any(a[i] != template[i] for a in argvs):
            if not all(a[i] == str(n["node_rank"]) for a, n in zip(argvs, nodes)):
                return None
            template[i] = NODE_RANK
    return template


def _tokens(argv: list[str]) -> list[str]:
    """Shell-quoted words, an option kept with its value ("--nnodes 14") so a line never ends
    between them."""
    import shlex

    words = [shlex.quote(a) if a != NODE_RANK else a for a in argv]
    out: list[str] = []
    for i, w in enumerate(words):
        if out and out[-1].startswith("-") and " " not in out[-1] and not w.startswith("-") and i > 0:
            out[-1] += " " + w
        else:
            out.append(w)
    return out


def word_lines(tokens: list[str], indent: str = "  ", hang: str = "    ") -> None:
    """Tokens filling lines to the terminal's width, never cut inside one (a longer one has its
    own line)."""
    from rich.text import Text

    con = console()
    width = max(con.width, 20)
    line = indent
    for tok in tokens:
        if line.strip() and len(line) + 1 + len(tok) > width:
            con.print(Text(line), soft_wrap=True)
            line = indent + hang
        line += ("" if not line.strip() else " ") + tok
    if line.strip():
        con.print(Text(line), soft_wrap=True)


def render_dry_run(items: list[dict]) -> None:
    """What submit would do, as a Slurm user reads it: the sbatch script, the environment, then
    the command once, its node rank shown as what varies (`--json` keeps one entry per node)."""
    import shlex

    from rich.text import Text

    con = console()
    for item in items:
        nodes = item["nodes"]
        para(f"{item['recipe']} -> {item['cluster']}/{item['partition']} ({item['scheduler']}), "
             f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}", style="bold")
        con.print(Text(f"job folder: {item['job_folder']}"), soft_wrap=True)  # a path: never broken
        hang = item.get("hang") or {}
        if hang:
            para(f"hang watchdog: no new step in {duration(hang['after_s'])}, first step "
                 f"{duration(hang['first_step_s'])}" if hang.get("after_s") else "hang watchdog: off")
        if item.get("checkpoint_dir"):
            con.print(Text(f"checkpoints (every attempt): {item['checkpoint_dir']}"), soft_wrap=True)
        if "sbatch" in item:
            con.print(Text("sbatch script (as submitit writes it):", style="bold"))
            con.print(Text(item["sbatch"].rstrip("\n")), soft_wrap=True)
        else:
            para("parameters: " + ", ".join(f"{k}={v}" for k, v in item["parameters"].items()))
        con.print(Text("environment of the command, on every node:", style="bold"))
        word_lines([f"{k}={shlex.quote(v)}" if len(v) < 200 else f"{k}=<{len(v)} characters>"
                    for k, v in item["env"].items()])
        template = command_template(nodes)
        if template is not None:
            varies = (f"; {NODE_RANK} is 0 to {len(nodes) - 1}" if NODE_RANK in template
                      else "" if len(nodes) == 1 else " (the same on each)")
            para(f"command on {'each of the ' + str(len(nodes)) + ' nodes' if len(nodes) > 1 else 'the node'}"
                 f"{varies} (argv, run without a shell; shown shell-quoted):", style="bold")
            word_lines(_tokens(template))
        else:  # the nodes' commands differ beyond their rank: each one
            for node in nodes:
                con.print(Text(f"command on node {node['node_rank']} (argv, no shell, shown shell-quoted):",
                               style="bold"))
                word_lines(_tokens(node["argv"]))
        files = item.get("framework_files") or {}
        if files:
            para("framework files: " + ", ".join(files.values()))
        if "check" in item:
            ok = item["check"]["ok"]
            para(("sbatch --test-only: OK " if ok else "sbatch --test-only: REFUSED ") + item["check"]["sbatch"],
                 style="green" if ok else "bold red")


def short_layout(p: dict) -> str:
    """The parallel layout in few characters: "tp4 pp9 dp2 z1" (cp and interleaving when used,
    "+off" with offload); micro-batches are their own column."""
    text = f"tp{p['tp']} pp{p['pp']}" + (f"v{p['virtual_stages']}" if p.get("virtual_stages", 1) > 1 else "")
    text += f" dp{p['dp']}" + (f" cp{p['cp']}" if p["cp"] > 1 else "") + (f" ep{p['ep']}" if p.get("ep", 1) > 1 else "")
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
    table.add_column("to train" if wide else "train", justify="right", no_wrap=True)  # 3 columns for a long layout
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
        con.print(Text("layout: tp/pp/dp/cp/ep sizes, z1-z3 = ZeRO stage, rc = full recompute, sel = selective, "
                       "+off = offload; mbs = micro-batch x accumulation; GiB/GPU = peak/usable; train = time to train; --wide for "
                       "all",
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
    for key, what in (("hf_args", "Hugging Face Trainer's arguments"), ("launch_args", "its launcher's arguments")):
        if block.get(key):
            out += [f"# {what} (${{framework.{key}}})", shlex.join(block[key])]
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
            table.add_row(name, "-", "cannot run it" if r.get("refused") else "does not fit", "", "", "", "")
    con.print(table)
    for r in order:
        if not r["feasible"] and r.get("reason"):
            con.print(Text(f"{r['framework']}: {r['reason']}"))
    con.print(Text("* the recipe's framework. layout: tp/pp/dp/cp/ep sizes, z1-z3 = ZeRO stage, rc = full "
                   "recompute, sel = selective, +off = offload; mbs = micro-batch x accumulation", style="dim"))
    con.print(Text(f"plan one: jobctl plan {recipe} --cluster {cluster} --framework NAME", style="dim"))
