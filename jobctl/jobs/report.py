"""What a job folder says after (or during) a run: GPU memory measured against the plan's
prediction, each attempt's failure, and the attempt chain in one line; shared by `watch`
and `report`.

A job folder (jobctl/submit.py) holds plan.json (the `plan --json` report), the sampler's
gpu/node-<R>.csv (jobctl/runtime/sampler.py), the training hooks' memory/rank-<N>.jsonl
(jobctl/hooks.py), one outcome-node<R>.json per node and, after a failure, successor.json
or final.json (jobctl/recover.py). Every reader here tolerates a missing or half-written
file: a running job is still writing them. Nothing here prints or asks the scheduler.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

# How the attempt chain names a failure ("#12 → #13 (OOM, mbs 4→2)"): the classifier's
# kinds (runtime/classify.py FailureKind), then scheduler states for jobs without records.
FAILURE_WORDS = {
    "CUDA_OOM": "OOM", "HOST_OOM": "host OOM", "TIMEOUT": "timeout", "PREEMPTED": "preempted",
    "NODE_FAIL": "node failure", "NCCL": "NCCL error", "CANCELLED": "cancelled", "USER_ERROR": "error",
    # Slurm's OUT_OF_MEMORY is the cgroup's oom_kill counter: host memory (classify.py, rule 5)
    "OUT_OF_MEMORY": "host OOM", "FAILED": "failed", "BOOT_FAIL": "boot failure", "DEADLINE": "deadline",
    "SUBMIT_FAILED": "not submitted",
}
# Plan fields that the ladder changes, in the order the chain names them, with short names.
# grad_accum_steps is left out: it follows from micro_batch_size and dp (global batch kept).
PLAN_CHANGES = (("micro_batch_size", "mbs"), ("recompute", "recompute"), ("recompute_layers", "recompute layers"),
                ("offload", "offload"), ("sharding", "sharding"), ("tp", "tp"), ("pp", "pp"),
                ("virtual_stages", "vpp"), ("dp", "dp"), ("cp", "cp"), ("sequence_parallel", "sp"),
                ("nodes", "nodes"))
_CSV_NAME = re.compile(r"node-(\d+)\.csv")
_RANK_NAME = re.compile(r"rank-(\d+)\.jsonl")


# --- the job folder ---------------------------------------------------------------------------

def read_json(path: Path) -> dict | None:
    """A JSON object from `path`; None when it is missing or not (yet) whole."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def plan_memory(folder: Path | None) -> dict:
    """The prediction in plan.json: predicted peak per GPU, the usable limit, and the CUDA
    context term (which the allocator's own figures do not include). {} without plan.json."""
    report = read_json(folder / "plan.json") if folder else None
    mem = (report or {}).get("memory") or {}
    if not mem:
        return {}
    context = sum(int(t.get("bytes") or 0) for t in mem.get("terms") or [] if t.get("name") == "cuda context")
    return {"predicted_peak_bytes": mem.get("total_bytes"), "gpu_usable_bytes": mem.get("gpu_usable_bytes"),
            "cuda_context_bytes": context, "gpu": report.get("gpu")}


def outcomes(folder: Path | None) -> list[dict]:
    """The outcome records of the nodes that wrote one, by node rank."""
    if folder is None:
        return []
    out = [read_json(p) for p in sorted(folder.glob("outcome-node*.json"))]
    return sorted((o for o in out if o and "node_rank" in o), key=lambda o: o["node_rank"])


def sampler_files(folder: Path | None) -> list[tuple[int, Path]]:
    """(node rank, path) of the sampler CSVs in gpu/, by rank."""
    if folder is None or not (folder / "gpu").is_dir():
        return []
    found = [(int(m[1]), p) for p in (folder / "gpu").iterdir() if (m := _CSV_NAME.fullmatch(p.name))]
    return sorted(found)


def sampler_notes(folder: Path | None) -> list[str]:
    """What the samplers said about themselves (gpu/node-<R>.csv.note), e.g. why there is no GPU."""
    if folder is None or not (folder / "gpu").is_dir():
        return []
    lines = []
    for p in sorted((folder / "gpu").glob("node-*.csv.note")):
        try:
            lines += [f"{p.name.split('.')[0]}: {line.strip()}" for line in p.read_text(errors="replace").splitlines()
                      if line.strip()]
        except OSError:
            pass
    return lines


def gpu_usage(samples) -> list[dict]:
    """Per GPU of a job (node rank, index): its latest and peak memory_used_bytes, from
    sampler.GPUSample rows in file order."""
    by_gpu: dict[tuple[int, int], dict] = {}
    for s in samples:
        g = by_gpu.setdefault((s.node_rank, s.gpu), {
            "node": s.node_rank, "gpu": s.gpu, "name": s.name, "samples": 0, "latest_bytes": None,
            "latest_at": None, "peak_bytes": None, "peak_at": None, "total_bytes": None})
        g["samples"] += 1
        if s.memory_total_bytes is not None:
            g["total_bytes"] = s.memory_total_bytes
        if s.memory_used_bytes is None:
            continue
        g["latest_bytes"], g["latest_at"] = s.memory_used_bytes, s.time_utc
        if g["peak_bytes"] is None or s.memory_used_bytes > g["peak_bytes"]:
            g["peak_bytes"], g["peak_at"] = s.memory_used_bytes, s.time_utc
    return [by_gpu[k] for k in sorted(by_gpu)]


def read_gpu_samples(folder: Path | None) -> list:
    """Every sample of every node of a job, node by node."""
    from jobctl.runtime.sampler import read_samples

    return [s for _, path in sampler_files(folder) for s in read_samples(path)]


class SamplerTail:
    """Latest and peak GPU memory of one job folder, read incrementally: `watch` polls every
    few seconds, and a day-long job's CSVs hold hundreds of thousands of rows."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self._offsets: dict[Path, int] = {}
        self._usage: dict[tuple[int, int], dict] = {}

    def update(self) -> list[dict]:
        """Read what the CSVs gained since the last call; the usage per GPU (gpu_usage's rows)."""
        from jobctl.runtime.sampler import parse_samples

        for _, path in sampler_files(self.folder):
            start = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
            if end == 0:
                continue
            self._offsets[path] = start + end
            for row in gpu_usage(parse_samples(chunk[:end].decode("utf-8", "replace"))):
                key = (row["node"], row["gpu"])
                old = self._usage.get(key)
                if old is None:
                    self._usage[key] = row
                    continue
                old["samples"] += row["samples"]
                for k in ("name", "total_bytes", "latest_bytes", "latest_at"):
                    if row[k] is not None:
                        old[k] = row[k]
                if row["peak_bytes"] is not None and (old["peak_bytes"] is None or row["peak_bytes"] > old["peak_bytes"]):
                    old["peak_bytes"], old["peak_at"] = row["peak_bytes"], row["peak_at"]
        return [dict(self._usage[k]) for k in sorted(self._usage)]


def hook_peaks(folder: Path | None) -> tuple[list[dict], list[str]]:
    """Per rank, the largest allocator figures the training hooks recorded (memory/rank-<N>.jsonl:
    "step" and "oom" lines), and the reasons ranks gave for having the hooks off."""
    ranks, off = [], []
    mem_dir = folder / "memory" if folder else None
    if mem_dir is None or not mem_dir.is_dir():
        return ranks, off
    for path in sorted(mem_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
        m = _RANK_NAME.fullmatch(path.name)
        if not m:
            continue
        reserved = allocated = None
        oom = False
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:  # the line in flight when the process died
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("event") == "off":
                off.append(f"rank {m[1]}: {rec.get('reason')}")
            if rec.get("event") not in ("step", "oom"):
                continue
            oom = oom or rec.get("event") == "oom"
            r, a = rec.get("max_memory_reserved_bytes"), rec.get("max_memory_allocated_bytes")
            if isinstance(r, int):
                reserved = r if reserved is None else max(reserved, r)
            if isinstance(a, int):
                allocated = a if allocated is None else max(allocated, a)
        if reserved is not None or allocated is not None:
            ranks.append({"rank": int(m[1]), "max_memory_reserved_bytes": reserved,
                          "max_memory_allocated_bytes": allocated, "oom": oom})
    return sorted(ranks, key=lambda r: r["rank"]), off


def error_pct(predicted: int | None, measured: int | None) -> float | None:
    """The prediction's error in percent of the measurement: (predicted - measured) / measured.
    Positive: the plan over-predicted (memory left unused); negative: it under-predicted.
    The same sign convention as docs/memory-accuracy.md."""
    if not predicted or not measured:
        return None
    return round((predicted - measured) / measured * 100, 2)


# --- attempts and the chain -------------------------------------------------------------------

def folder_of(record) -> Path | None:
    return Path(record.job_folder) if record.job_folder else None


def failure_of(record) -> dict | None:
    """Why an attempt that did not complete ended: {"kind", "summary"}. The first node's
    verdict (successor.json / final.json), else the outcome records (recover.job_failure),
    else the history's exit reason, else its state. None for a job not ended, or completed."""
    from jobctl.jobs.recovery import job_failure

    if not record.terminal or record.state.value == "COMPLETED":
        return None
    folder = folder_of(record)
    for name in ("successor.json", "final.json"):
        data = read_json(folder / name) if folder else None
        if data and isinstance(data.get("failure"), dict) and data["failure"].get("kind"):
            f = data["failure"]
            return {"kind": f["kind"], "summary": f.get("summary") or data.get("stopped")}
    try:
        failure = job_failure([o for o in outcomes(folder) if isinstance(o.get("failure"), dict)])
    except (KeyError, TypeError):
        failure = None
    if failure:
        return {"kind": failure["kind"], "summary": failure.get("summary")}
    reason = record.exit_reason or ""
    if reason in FAILURE_WORDS:
        return {"kind": reason, "summary": None}
    return {"kind": record.state.value, "summary": reason or None}


def plan_change(parent_plan: dict, child_plan: dict) -> str:
    """What the ladder changed between two plans, e.g. "mbs 4→2" or "recompute none→full, mbs 2→1"."""
    parts = []
    for key, word in PLAN_CHANGES:
        a, b = parent_plan.get(key), child_plan.get(key)
        if a != b and not (a is None or b is None):
            if isinstance(a, bool):
                a, b = ("on" if a else "off"), ("on" if b else "off")
            parts.append(f"{word} {a}→{b}")
    return ", ".join(parts)


def lineage(history, record) -> list:
    """The attempts that led to `record` and those that continued it (the newest retry of
    each), oldest first. A parent retried twice shows only the later retry."""
    chain = history.chain(record.id)
    by_id = {r.id: r for r in chain}
    path = [by_id.get(record.id, record)]
    while path[0].parent_id is not None and path[0].parent_id in by_id and len(path) <= len(chain):
        path.insert(0, by_id[path[0].parent_id])
    while len(path) <= len(chain):
        children = [r for r in chain if r.parent_id == path[-1].id]
        if not children:
            break
        path.append(max(children, key=lambda r: r.id))
    return path


def attempt(record, parent=None, *, measure: bool = False) -> dict:
    """One attempt as the chain shows it: state, plan summary, prediction, failure, and how it
    differs from the attempt before (`label`, e.g. "OOM, mbs 4→2"). With `measure`, also the
    measured peak: the sampler's largest figure, else the hooks' largest max_memory_reserved
    (whose error is against the prediction less its CUDA context term), and `measured_max_bytes`,
    the largest of all of them (what the history records)."""
    from jobctl.ui import layout_text

    plan = record.plan
    folder = folder_of(record)
    mem = plan_memory(folder)
    predicted = record.predicted_peak_bytes or mem.get("predicted_peak_bytes")
    row = {
        "id": record.id, "attempt": record.attempt, "parent_id": record.parent_id, "state": record.state.value,
        "scheduler": record.scheduler, "scheduler_job_id": record.scheduler_job_id,
        "layout": layout_text(plan) if "tp" in plan and "sharding" in plan else None,
        "nodes": plan.get("nodes"), "gpus_per_node": plan.get("gpus_per_node"),
        "micro_batch_size": plan.get("micro_batch_size"), "predicted_peak_bytes": predicted,
        "gpu_usable_bytes": mem.get("gpu_usable_bytes"), "failure": failure_of(record), "label": None,
        "job_folder": record.job_folder,
    }
    if parent is not None:
        why = failure_of(parent)
        words = [FAILURE_WORDS.get(why["kind"], why["kind"].lower())] if why else []
        change = plan_change(parent.plan, plan)
        row["label"] = ", ".join(words + ([change] if change else [])) or None
    final = read_json(folder / "final.json") if folder else None
    row["stopped"] = (final or {}).get("stopped")
    if measure:
        sampled = [g["peak_bytes"] for g in gpu_usage(read_gpu_samples(folder)) if g["peak_bytes"] is not None]
        hooked = [r["max_memory_reserved_bytes"] for r in hook_peaks(folder)[0]
                  if r["max_memory_reserved_bytes"] is not None]
        source = "sampler" if sampled else "hooks" if hooked else None
        peak = max(sampled or hooked) if source else None
        against = predicted - mem.get("cuda_context_bytes", 0) if predicted and source == "hooks" else predicted
        row.update(measured_peak_bytes=peak, measured_source=source, error_pct=error_pct(against, peak),
                   measured_max_bytes=max(sampled + hooked) if source else None)
    return row


def chain_text(attempts: list[dict]) -> str:
    """"#12 → #13 (OOM, mbs 4→2) → #14 RUNNING": every attempt, how each differs from the one
    before, and the state of the last."""
    parts = []
    for i, a in enumerate(attempts):
        text = f"#{a['id']}"
        if i and a.get("label"):
            text += f" ({a['label']})"
        if i == len(attempts) - 1:
            text += f" {a['state']}"
        parts.append(text)
    return " → ".join(parts)


def attempts(records: list, *, measure: bool = False) -> list[dict]:
    """`attempt` for each record of a lineage, each against the one before it."""
    return [attempt(r, records[i - 1] if i else None, measure=measure) for i, r in enumerate(records)]


# --- the plot ---------------------------------------------------------------------------------

def _seconds(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def memory_series(samples) -> dict[tuple[int, int], tuple[list[float], list[int]]]:
    """Per GPU (node, index): seconds since the job's first sample, and memory_used_bytes.
    Wall-clock times (time_utc), not monotonic_s: each node has its own monotonic clock."""
    points = [(s.node_rank, s.gpu, t, s.memory_used_bytes) for s in samples
              if s.memory_used_bytes is not None and (t := _seconds(s.time_utc)) is not None]
    if not points:
        return {}
    t0 = min(p[2] for p in points)
    series: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
    for node, gpu, t, used in sorted(points, key=lambda p: (p[0], p[1], p[2])):
        xs, ys = series.setdefault((node, gpu), ([], []))
        xs.append(t - t0)
        ys.append(used)
    return series


def import_pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display); UsageError when the
    optional `plot` extra is not installed."""
    from jobctl.errors import UsageError

    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is an optional extra and is not installed",
                         hint="pip install 'jobctl[plot]'  (or: pip install matplotlib)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


GIB = 1 << 30
LEGEND_MAX_GPUS = 16  # more lines than this: one colour and one legend entry per node


def plot_memory(series: dict, predicted: int | None, usable: int | None, path: str | Path, title: str) -> None:
    """GPU memory over time, one line per node/GPU, with the predicted peak and the usable
    limit as horizontal lines; written to `path` (the format follows its extension)."""
    plt = import_pyplot()
    span = max((xs[-1] for xs, _ in series.values()), default=0.0)
    unit, scale = ("min", 60.0) if span > 600 else ("s", 1.0)
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    try:
        by_node = len(series) > LEGEND_MAX_GPUS
        nodes = sorted({n for n, _ in series})
        colours = plt.get_cmap("tab10" if (len(nodes) if by_node else len(series)) <= 10 else "tab20")
        labelled = set()
        for i, ((node, gpu), (xs, ys)) in enumerate(sorted(series.items())):
            if by_node:
                count = sum(1 for n, _ in series if n == node)
                colour, label = colours(nodes.index(node) % colours.N), f"node {node} ({count} GPUs)"
                label = None if node in labelled else label
                labelled.add(node)
            else:
                colour, label = colours(i % colours.N), f"node {node} gpu {gpu}"
            ax.plot([x / scale for x in xs], [y / GIB for y in ys], color=colour, linewidth=1.4, label=label,
                    marker="o" if len(xs) == 1 else None)
        if predicted:
            ax.axhline(predicted / GIB, color="black", linestyle="--", linewidth=1.5,
                       label=f"predicted peak {predicted / GIB:,.2f} GiB")
        if usable:
            ax.axhline(usable / GIB, color="red", linestyle=":", linewidth=1.8,
                       label=f"usable limit {usable / GIB:,.2f} GiB")
        ax.set_xlabel(f"time since the first sample ({unit})")
        ax.set_ylabel("GPU memory used (GiB = 2^30 bytes)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
