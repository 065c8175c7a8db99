"""The live view of one job's chain (`jobctl watch`)."""

from __future__ import annotations

from jobctl.ui.terminal import bar, clock_time, console, duration, gib_or, state_text


def chain_line(chain: list[dict], text: str):
    from rich.text import Text

    # The chain text is built from ids, failure words and plan fields: colour the last state only.
    last = chain[-1]["state"] if chain else ""
    # Text.assemble, not Text + Text: a sum keeps the first part's style for the whole line.
    if last and text.endswith(" " + last):
        return Text.assemble(("attempts  ", "bold"), text[: -len(last)], state_text(last))
    return Text.assemble(("attempts  ", "bold"), text)


def watch_view(snap: dict, live: bool = False):
    """The `watch` view of a snapshot (jobctl.cli.watch.Watcher.poll) as one renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    job, mem = snap["job"], snap["memory"]
    head = Text.assemble((f"#{job['id']} {job['recipe']} ", "bold"), state_text(job["state"]))
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
    parts.append(chain_line(snap["chain"], snap["chain_text"]))
    tip = snap["chain"][-1] if snap["chain"] else {}
    if tip.get("layout"):
        parts.append(Text.assemble(("layout    ", "bold"), tip["layout"]))
    learned = [a for a in snap["chain"] if a.get("calibration_text")]
    if learned:  # what the newest OOM of the chain taught the ladder
        parts.append(Text.assemble(("learned   ", "bold"), f"#{learned[-1]['id']}: {learned[-1]['calibration_text']}"))
    reached = [a for a in snap["chain"] if a.get("progress")]
    if reached:  # how far the newest attempt that ended got, and its checkpoint
        parts.append(Text.assemble(("reached   ", "bold"), f"#{reached[-1]['id']}: {reached[-1]['progress']}"))
    predicted, usable = mem.get("predicted_peak_bytes"), mem.get("gpu_usable_bytes")
    limits = f"predicted peak {gib_or(predicted)} GiB/GPU, usable {gib_or(usable)} GiB"
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
            table.add_row(str(n["node"]), str(n["gpu_count"]), gib_or(n["latest_max_bytes"]),
                          Text(gib_or(peak), style=style), "" if n["peak_gpu"] is None else str(n["peak_gpu"]),
                          vs, Text(bar(peak or 0, scale) if scale else "", style=style),
                          clock_time(n["latest_at"]))
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
    console().print(watch_view(snap))


def live_watch():
    """A live view on stdout: a context manager giving `show(snapshot)`, which redraws it."""
    import contextlib

    from rich.live import Live

    @contextlib.contextmanager
    def _live():
        # Redrawn only when show() is called (the watcher paces itself), never on a timer.
        with Live(console=console(), auto_refresh=False, transient=False, redirect_stderr=False) as lv:
            yield lambda snap: lv.update(watch_view(snap, live=True), refresh=True)

    return _live()
