"""A job's memory report: measured against predicted per GPU and per rank, and its attempts."""

from __future__ import annotations

from jobctl.ui.terminal import bar, console, gib, gib_or, pct, state_text
from jobctl.ui.watch import chain_line


def report_gpu_table(rep: dict):
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"Peak memory per GPU (GPU sampler, GiB): predicted {gib_or(rep['predicted_peak_bytes'])}, "
                        f"usable {gib_or(rep['gpu_usable_bytes'])}", title_justify="left", pad_edge=False,
                  caption="error = (predicted - measured) / measured: + the plan over-predicted, - it under-predicted",
                  caption_justify="left")
    for col in ("node", "gpu", "name", "samples", "measured peak", "predicted", "error", "of usable", ""):
        table.add_column(col, justify="left" if col in ("name", "") else "right", no_wrap=True)
    usable = rep["gpu_usable_bytes"] or 0
    for g in rep["gpus"]:
        over = usable and g["peak_bytes"] is not None and g["peak_bytes"] > usable
        table.add_row(str(g["node"]), str(g["gpu"]), Text(g["name"] or ""), str(g["samples"]),
                      Text(gib_or(g["peak_bytes"]), style="bold red" if over else ""),
                      gib_or(rep["predicted_peak_bytes"]), pct(g["error_pct"]),
                      "" if g["usable_pct"] is None else f"{g['usable_pct']:.0f} %",
                      Text(bar(g["peak_bytes"] or 0, usable) if usable else "", style="cyan"))
    return table


def report_rank_table(rep: dict):
    from rich.table import Table

    table = Table(title="Allocator peaks per rank (jobctl.hooks, GiB)", title_justify="left", pad_edge=False,
                  caption=f"error against the prediction less its CUDA context term, "
                          f"{gib_or(rep['predicted_allocator_bytes'])} GiB (the allocator does not see the context)",
                  caption_justify="left")
    for col in ("rank", "max reserved", "max allocated", "error", "OOM"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rep["ranks"]:
        table.add_row(str(r["rank"]), gib_or(r["max_memory_reserved_bytes"]), gib_or(r["max_memory_allocated_bytes"]),
                      pct(r["error_pct"]), "yes" if r["oom"] else "")
    return table


def attempts_table(chain: list[dict]):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # 80 columns: short headers, numbers that never wrap, the layout and the notes wrapping at words
    table = Table(title="Attempts (GiB per GPU: predicted, measured peak, error)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col, min_width in (("id", None), ("#", None), ("state", None), ("layout", 14), ("pred", None),
                           ("peak", None), ("error", None), ("why it ended / changed", 16)):
        table.add_column(col, justify="right" if col in ("id", "#", "pred", "peak", "error") else "left",
                         overflow="fold", no_wrap=min_width is None, min_width=min_width)
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
        if a.get("calibration_text"):
            notes.append(f"calibrated: {a['calibration_text']}")
        if a.get("progress"):
            notes.append(f"reached {a['progress']}")
        table.add_row(f"#{a['id']}", str(a["attempt"]), state_text(a["state"]), Text(a.get("layout") or ""),
                      gib_or(a["predicted_peak_bytes"], ""), gib_or(a.get("measured_peak_bytes"), ""),
                      pct(a.get("error_pct")), Text("; ".join(notes)))
    return table


def render_report(rep: dict) -> None:
    """`jobctl report`: memory measured against the plan, then the attempt chain."""
    from rich.text import Text

    con = console()
    where = f"#{rep['id']} {rep['recipe']} on {rep['cluster']}" + (f"/{rep['partition']}" if rep["partition"] else "")
    head = Text.assemble((where + " ", "bold"), state_text(rep["state"]))
    if rep.get("layout"):
        head.append(f"  {rep['layout']}, {rep['nodes']} node(s) x {rep['gpus_per_node']} {rep.get('gpu') or 'GPU'}")
    con.print(head)
    if rep.get("states_note"):
        con.print(Text(rep["states_note"], style="yellow"))
    if rep["gpus"]:
        con.print(report_gpu_table(rep))
    else:
        con.print(Text(rep["no_samples"], style="bold yellow"))
    if rep["ranks"]:
        con.print(report_rank_table(rep))
    for line in rep.get("hooks_off") or []:
        con.print(Text(f"hooks off on {line}", style="dim"))
    m = rep.get("measured_peak")
    if m and rep["predicted_peak_bytes"]:
        err = m["error_pct"]
        verdict = "" if err is None else (f": the plan over-predicted by {err:.1f} %" if err > 0 else
                                          f": the plan under-predicted by {-err:.1f} %" if err < 0 else ": exact")
        con.print(Text(f"measured peak {gib(m['bytes'])} GiB ({m['source']}, {m['where']}) vs predicted "
                       f"{gib(rep['predicted_peak_bytes'])} GiB{verdict}", style="bold"))
    elif not m:
        con.print(Text("measured peak: nothing measured, so the prediction cannot be checked"))
    con.print(attempts_table(rep["chain"]))
    con.print(chain_line(rep["chain"], rep["chain_text"]))
