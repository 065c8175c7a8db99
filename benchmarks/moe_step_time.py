"""jobctl's step-time model against NVIDIA's published, measured mixture-of-experts runs.

Reads benchmarks/data/published_moe_2025.yaml (Megatron-Bridge's performance summaries, 25.09 to
26.08: DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, GPT-OSS 120B on H100, B200 and GB200) with
the settings each Qwen3 row's own release ran (published_moe_release_settings.yaml: dispatcher,
EP all-to-all overlap, CUDA graphs, read from that release's perf configs), keeps the rows
jobctl can plan (its presets under Megatron-Core, a layout its pipeline split can express), and
prints the predicted step time against the measured one (tokens/s per GPU as printed), with
what each run did that jobctl does not model (DeepEP's dispatch: HybridEP's is modelled; CUDA graphs beyond the
host launches they save, CuTeDSL's fused grouped MLP, paged stashing of expert activations,
multi-token prediction) and whether jobctl's memory model calls the layout runnable. The EP
overlap (Megatron's combined 1F1B schedule) is modelled, on where the row's release ran it.

The rows are split in two halves, alternating in id order: --fit chooses MOE_HOST_S_PER_EXPERT
and, for each value of it, MOE_GEMM_EFFICIENCY per GPU generation on the fit half only; the
check half is reported. docs/step-time-accuracy.md holds the table.

    python benchmarks/moe_step_time.py            # the table with the constants in perf.py
    python benchmarks/moe_step_time.py --fit      # also: the grid search on the fit half
    python benchmarks/moe_step_time.py --markdown # the table as markdown (for the docs)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobctl.frameworks.base import LOW_PRECISIONS  # noqa: E402
from jobctl.planner import perf  # noqa: E402
from jobctl.planner.catalog import GIB, lookup_gpu  # noqa: E402
from jobctl.planner.memory import estimate  # noqa: E402
from jobctl_measure.published_throughput import load_moe_rows  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "published_moe_2025.yaml"
GRID = [round(0.10 + 0.02 * i, 2) for i in range(46)]  # 0.10 .. 1.00
HOST_GRID = [round(25e-6 * i, 6) for i in range(49)]  # 0 .. 1.2 ms per local expert


def _generation(row) -> str:
    return perf.generation(row.gpu)


def _group(row) -> tuple[str, bool]:
    """The constant a row's experts take: its GPU generation, and whether they run a low-precision
    recipe (MOE_GEMM_EFFICIENCY) or 16-bit (MOE_GEMM_EFFICIENCY_16BIT)."""
    return _generation(row), row.workload.precision in LOW_PRECISIONS


def _set(rows, group: tuple[str, bool], value: float) -> None:
    for r in rows:
        if _group(r) == group:
            r.links = dataclasses.replace(r.links, moe_efficiency=value)
    perf.clear_caches()


def fit(rows) -> tuple[float, dict]:
    """MOE_HOST_S_PER_EXPERT (one for all GPUs: host time) and, for each value of it,
    MOE_GEMM_EFFICIENCY per generation, for low-precision and for 16-bit experts apart
    (MOE_GEMM_EFFICIENCY_16BIT: gpt-oss's and one DeepSeek-V3 run's BF16 experts), minimising the
    fit half's mean |error| (the check half is not looked at); the constants and the rows' links
    are put back afterwards."""
    from step_time_accuracy import _restored

    kept = perf.MOE_HOST_S_PER_EXPERT
    best = None
    try:
        with _restored(rows):
            for host in HOST_GRID:
                perf.MOE_HOST_S_PER_EXPERT = host
                out, errors = {}, []
                for group in sorted({_group(r) for r in rows}):
                    members = [r for r in rows if r.half == "fit" and _group(r) == group]
                    if not members:
                        continue
                    scores = []
                    for v in GRID:
                        _set(members, group, v)
                        scores.append((statistics.mean(abs(r.error) for r in members), v))
                    out[group] = (*min(scores), len(members))
                    errors += [out[group][0]] * len(members)
                if best is None or statistics.mean(errors) < best[0]:
                    best = (statistics.mean(errors), host, out)
    finally:
        perf.MOE_HOST_S_PER_EXPERT = kept
        perf.clear_caches()
    return best[1], best[2]


def fits(row) -> tuple[bool, float]:
    gpu = lookup_gpu(row.gpu)
    mem = estimate(row.workload, gpu.memory_bytes, row.plan, detail=False)
    return mem.fits_gpu, mem.total_bytes / GIB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="search MOE_GEMM_EFFICIENCY on the fit half")
    ap.add_argument("--markdown", action="store_true", help="the table as markdown")
    ap.add_argument("--layouts", action="store_true",
                    help="also: jobctl's own pick on each row's GPUs against the published layout")
    args = ap.parse_args()
    rows, skipped = load_moe_rows(DATA)
    rows.sort(key=lambda r: r.id)
    md = args.markdown
    head = ("row", "half", "layout", "measured s", "predicted s", "error", "GiB", "not modelled")
    print(("| " + " | ".join(head) + " |\n|" + "---|" * len(head)) if md else
          f"{'row':46} {'half':5} {'layout':30} {'meas s':>7} {'pred s':>7} {'error':>6} {'GiB':>6}  not modelled")
    for r in rows:
        ok, gib = fits(r)
        layout = r.plan.summary().replace(" zero1", "").replace(" recompute=none", "")
        extra = ", ".join(r.unmodelled + r.assumed) or "-"
        cells = (r.id, r.half, layout, f"{r.measured_s:.2f}", f"{r.predicted_s:.2f}", f"{r.error:+.1%}",
                 f"{gib:.1f}" + ("" if ok else " (does not fit)"), extra)
        print("| " + " | ".join(cells) + " |" if md else
              f"{r.id:46} {r.half:5} {layout[:30]:30} {cells[3]:>7} {cells[4]:>7} {cells[5]:>6} {cells[6]:>6}  {extra}")
    print()
    for half in ("fit", "check"):
        sel = [r for r in rows if r.half == half]
        by = {}
        for r in sel:
            by.setdefault(_generation(r), []).append(abs(r.error))
        parts = ", ".join(f"{g} {statistics.mean(v):.1%} ({len(v)})" for g, v in sorted(by.items()))
        print(f"{half} half: {len(sel)} rows, mean |error| {statistics.mean(abs(r.error) for r in sel):.1%} ({parts})")
    refused = [r.id for r in rows if not fits(r)[0]]
    print(f"layouts jobctl's memory model calls 'does not fit': {len(refused)} of {len(rows)}"
          + (f" ({', '.join(refused)})" if refused else ""))
    print(f"rows left out: {len(skipped)}")
    for rid, why in skipped:
        print(f"  {rid}: {why[:150]}")
    if args.layouts:
        from step_time_accuracy import versus_search

        print("\njobctl's pick on the same GPUs (exactly the row's nodes) against the published layout "
              "(ratio > 1: the pick's predicted step is longer)")
        ratios = []
        for r in rows:
            got = versus_search(r)
            ratios.append(got["ratio"])
            ratio = f"{got['ratio']:.2f}" if got["ratio"] else "-"
            print(f"  {r.id:46} {ratio:>5}  {got['chosen'] or 'nothing fits'}")
        known = [x for x in ratios if x]
        if known:
            print(f"  median {statistics.median(known):.2f}; pick at least as fast (<= 1.001): "
                  f"{sum(x <= 1.001 for x in known)} of {len(known)}")
    if args.fit:
        host, got = fit(rows)
        print(f"\nfit half: MOE_HOST_S_PER_EXPERT {host * 1e3:.3f} ms; per generation, MOE_GEMM_EFFICIENCY "
              "(low-precision experts) and MOE_GEMM_EFFICIENCY_16BIT: " +
              ", ".join(f"{g} {'low' if low else '16-bit'} {v} (mean |error| {e:.1%}, {n} rows)"
                        for (g, low), (e, v, n) in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
