"""What a job folder measured: GPU memory from the sampler's CSVs and the training hooks'
records, against the plan's prediction. Shared by `watch` and `report`.

Every reader here tolerates a missing or half-written file: a running job is still writing
them. Nothing here prints or asks the scheduler.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from jobctl.runtime.sampler import parse_samples, read_samples
from jobctl.store import folder as layout
from jobctl.store.folder import JobFolder


def plan_memory(folder: JobFolder | None) -> dict:
    """The prediction in plan.json: predicted peak per GPU, the usable limit, and the CUDA
    context term (which the allocator's own figures do not include). {} without plan.json."""
    report = folder.read_json(layout.PLAN) if folder else None
    mem = (report or {}).get("memory") or {} if isinstance(report, dict) else {}
    if not mem:
        return {}
    context = sum(int(t.get("bytes") or 0) for t in mem.get("terms") or [] if t.get("name") == "cuda context")
    return {"predicted_peak_bytes": mem.get("total_bytes"), "gpu_usable_bytes": mem.get("gpu_usable_bytes"),
            "cuda_context_bytes": context, "gpu": report.get("gpu")}


def sampler_notes(folder: JobFolder | None) -> list[str]:
    """What the samplers said about themselves (gpu/node-<R>.csv.note), e.g. why there is no GPU."""
    return folder.sampler_notes() if folder else []


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


def read_gpu_samples(folder: JobFolder | None) -> list:
    """Every sample of every node of a job, node by node."""
    return [s for _, path in (folder.sampler_files() if folder else []) for s in read_samples(path)]


class SamplerTail:
    """Latest and peak GPU memory of one job folder, read incrementally: `watch` polls every
    few seconds, and a day-long job's CSVs hold hundreds of thousands of rows."""

    def __init__(self, folder: JobFolder | None):
        self.folder = folder
        self._offsets: dict[Path, int] = {}
        self._usage: dict[tuple[int, int], dict] = {}

    def update(self) -> list[dict]:
        """Read what the CSVs gained since the last call; the usage per GPU (gpu_usage's rows)."""
        for _, path in (self.folder.sampler_files() if self.folder else []):
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


def hook_peaks(folder: JobFolder | None) -> tuple[list[dict], list[str]]:
    """Per rank, the largest allocator figures the training hooks recorded (memory/rank-<N>.jsonl:
    "step" and "oom" lines), and the reasons ranks gave for having the hooks off."""
    ranks, off = [], []
    for rank, path in (folder.hook_files() if folder else []):
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
                off.append(f"rank {rank}: {rec.get('reason')}")
            if rec.get("event") not in ("step", "oom"):
                continue
            oom = oom or rec.get("event") == "oom"
            r, a = rec.get("max_memory_reserved_bytes"), rec.get("max_memory_allocated_bytes")
            if isinstance(r, int):
                reserved = r if reserved is None else max(reserved, r)
            if isinstance(a, int):
                allocated = a if allocated is None else max(allocated, a)
        if reserved is not None or allocated is not None:
            ranks.append({"rank": rank, "max_memory_reserved_bytes": reserved,
                          "max_memory_allocated_bytes": allocated, "oom": oom})
    return ranks, off


def error_pct(predicted: int | None, measured: int | None) -> float | None:
    """The prediction's error in percent of the measurement: (predicted - measured) / measured.
    Positive: the plan over-predicted (memory left unused); negative: it under-predicted.
    The same sign convention as docs/memory-accuracy.md."""
    if not predicted or not measured:
        return None
    return round((predicted - measured) / measured * 100, 2)


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
