"""jobctl's step-time model against published, measured training throughputs.

Reads benchmarks/data/published_throughput.yaml (every row with its source: Narayanan et al.
2021, Korthikanti et al. 2022, Megatron-Core's H100 table, the Llama 3 paper, torchtitan's
H100 benchmarks, BLOOM, MosaicML llm-foundry), keeps the 16-bit rows without torch.compile
whose layout is stated, turns each published figure into a measured step time by the
source's own FLOPs convention (jobctl_measure/published_throughput.py, which the tests use too),
and prints predicted vs measured per row.

The rows are split in two halves, alternating within each source in id order: "fit" rows
choose the efficiency constants (--fit searches a small grid over them and prints the best),
"check" rows only check. The table and the summary go into docs/step-time-accuracy.md.

    python benchmarks/step_time_accuracy.py            # the table with the constants in perf.py
    python benchmarks/step_time_accuracy.py --fit      # also: the grid search on the fit half
    python benchmarks/step_time_accuracy.py --markdown # the table as markdown (for the docs)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

from jobctl.planner import perf
from jobctl.planner.catalog import GIB, lookup_gpu
from jobctl.planner.memory import estimate
from jobctl.planner.search import Constraints, Target, search
from jobctl_measure.published_throughput import Row, load_rows

DATA = Path(__file__).resolve().parent / "data" / "published_throughput.yaml"


def summary(rows: list[Row]) -> dict:
    def mae(rs):
        return statistics.mean(abs(r.error) for r in rs) if rs else float("nan")

    rows = [r for r in rows if r.scored]
    check = [r for r in rows if r.half == "check"]
    return {
        "all": mae(rows), "fit": mae([r for r in rows if r.half == "fit"]), "check": mae(check),
        "check_megatron": mae([r for r in check if r.framework == "megatron"]),
        "n": len(rows), "n_check_megatron": len([r for r in check if r.framework == "megatron"]),
    }


# The constants the fit may move, and the grid it tries: the large-GEMM efficiency per GPU
# generation, the GEMM saturation size, attention's and memory-bound kernels' efficiencies.
GRID = {
    "a100": [0.65, 0.70, 0.75, 0.80, 0.85],
    "h100": [0.50, 0.55, 0.60, 0.65, 0.70],
    "GEMM_SATURATION_ELEMS": [1 << 16, 1 << 18, 1 << 20, 1 << 22],
    "ATTENTION_EFFICIENCY": [0.25, 0.30, 0.35, 0.40, 0.45],
    "MEMORY_EFFICIENCY": [0.4, 0.5, 0.6, 0.7, 0.8],
}


def _set(rows: list[Row], name: str, value) -> None:
    if name in ("a100", "h100"):
        for r in rows:
            if (r.links.peak_tflops < 500) == (name == "a100"):
                r.links = perf.Links(**{**r.links.__dict__, "gemm_efficiency": value})
    else:
        setattr(perf, name, value)


def fit(rows: list[Row]) -> dict:
    fit_rows = [r for r in rows if r.scored and r.half == "fit"]
    saved = {k: getattr(perf, k) for k in GRID if hasattr(perf, k)}
    saved_links = [(r, r.links) for r in rows]
    best = None
    try:
        for values in itertools.product(*GRID.values()):
            for k, v in zip(GRID, values):
                _set(fit_rows, k, v)
            err = statistics.mean(abs(r.error) for r in fit_rows)
            if best is None or err < best[0]:
                best = (err, dict(zip(GRID, values)))
    finally:
        for k, v in saved.items():
            setattr(perf, k, v)
        for r, links in saved_links:
            r.links = links
    return {"fit_mae": best[0], "constants": best[1]}


HOST_GIB = 2048  # host RAM per node of these clusters (DGX A100: 1-2 TB, DGX H100: 2 TB)


def versus_search(r: Row) -> dict:
    """The search on the row's GPUs (exactly its nodes), framework and batch: its choice, and the
    published layout's predicted speed relative to it (and whether the model fits it)."""
    gpn = min(8, r.gpus)
    gpu = lookup_gpu(r.gpu)
    t = Target("published", "gpus", gpu, gpn, r.gpus // gpn, HOST_GIB * GIB, gpu.memory_bytes, r.links)
    res = search(r.workload, t, Constraints(nodes=r.gpus // gpn, max_nodes=r.gpus // gpn))
    mem = estimate(r.workload, t.gpu_memory_bytes, r.plan, t.host_mem_bytes, detail=False)
    out = {"fits": mem.fits, "need_gib": mem.total_bytes / GIB, "chosen": None, "ratio": None}
    if res.best is not None and res.best.estimate is not None:
        out["chosen"] = res.best.plan.summary()
        out["ratio"] = res.best.estimate.step_time_s / r.predicted_s  # > 1: the published layout is faster
    return out



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="grid-search the efficiency constants on the fit half")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--layouts", action="store_true",
                    help="also run the search on each row's GPUs: is the published layout among the best?")
    args = ap.parse_args(argv)
    rows, skipped = load_rows(DATA)
    rows.sort(key=lambda r: (r.source, r.id))
    if args.markdown:
        print("| row | source | half | GPUs | layout | measured step | predicted | error | not scored because |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r.id} | {r.source} | {r.half or 'reference'} | {r.gpus} | {r.plan.summary()} | "
                  f"{r.measured_s:.3g} s ({r.how}) | {r.predicted_s:.3g} s | {r.error:+.1%} | "
                  f"{r.why_not_scored or '-'} |")
    else:
        print(f"{'row':44} {'half':5} {'GPUs':>5} {'measured':>9} {'predicted':>9} {'error':>7}")
        for r in rows:
            print(f"{r.id[:44]:44} {r.half or 'ref':5} {r.gpus:5d} {r.measured_s:8.3g}s {r.predicted_s:8.3g}s {r.error:+7.1%}")
    s = summary(rows)
    print()
    print(f"rows scored {s['n']}, reference {len(rows) - s['n']}, skipped {len(skipped)}: mean absolute error all {s['all']:.1%}, fit half {s['fit']:.1%}, "
          f"check half {s['check']:.1%}, check half Megatron rows ({s['n_check_megatron']}) {s['check_megatron']:.1%}")
    for scored in (True, False):
        by_source: dict[str, list[Row]] = {}
        for r in rows:
            if r.scored == scored:
                by_source.setdefault(r.source, []).append(r)
        print("scored rows, by source:" if scored else "reference rows (not scored: configuration incomplete or other "
              "hardware), by source:")
        for src, rs in sorted(by_source.items()):
            print(f"  {src:28} {len(rs):3d} rows  MAE {statistics.mean(abs(r.error) for r in rs):6.1%}  "
                  f"mean error {statistics.mean(r.error for r in rs):+6.1%}")
    if args.layouts:
        print("\nThe published layout against the search on the same GPUs (exactly its nodes), framework and batch"
              "\n(published/chosen: the published layout's predicted speed over the chosen plan's):")
        print(f"{'row':44} {'published/chosen':>16}  chosen plan, or why the model disagrees")
        for r in rows:
            v = versus_search(r)
            if not v["fits"]:
                why = f"the model says the published layout needs {v['need_gib']:.0f} GiB per GPU"
            else:
                why = v["chosen"] or "nothing fits"
            ratio = f"{v['ratio']:.2f}" if v["ratio"] else "-"
            print(f"{r.id[:44]:44} {ratio:>16}  {why}")
    if args.fit:
        f = fit(rows)
        print(f"\nfit half, grid search: MAE {f['fit_mae']:.1%} with {f['constants']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
