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
import contextlib
import dataclasses
import itertools
import statistics
import sys
from pathlib import Path

from jobctl.planner import perf
from jobctl.planner.catalog import GIB, lookup_gpu
from jobctl.planner.memory import estimate
from jobctl.planner.memory.workload import low_precision_format
from jobctl.planner.search import Constraints, Target, search
from jobctl_measure.published_throughput import Row, load_rows

DATA = Path(__file__).resolve().parent / "data" / "published_throughput.yaml"
# NVIDIA's Megatron-Bridge and NeMo performance summaries (FP8, MXFP8, NVFP4 on H100, B200,
# GB200): the low-precision efficiencies and the TP-overlap constant are fitted on their fit half
DATA_2025 = Path(__file__).resolve().parent / "data" / "published_throughput_2025.yaml"


def _clear_caches() -> None:
    """The step model keeps per-layer costs by their arguments, not by the module's constants."""
    perf.clear_caches()


@contextlib.contextmanager
def _restored(rows: list[Row], *constants: str):
    """A fit's trials move perf's `constants` and the rows' links: put them back afterwards,
    whatever happened, with the step model's caches emptied."""
    saved = {k: getattr(perf, k) for k in constants}
    saved_links = [(r, r.links) for r in rows]
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(perf, k, v)
        for r, links in saved_links:
            r.links = links
        _clear_caches()


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
                r.links = dataclasses.replace(r.links, gemm_efficiency=value)
    else:
        setattr(perf, name, value)
    _clear_caches()


def fit(rows: list[Row]) -> dict:
    fit_rows = [r for r in rows if r.scored and r.half == "fit"]
    best = None
    with _restored(rows, *(k for k in GRID if hasattr(perf, k))):
        for values in itertools.product(*GRID.values()):
            for k, v in zip(GRID, values):
                _set(fit_rows, k, v)
            err = statistics.mean(abs(r.error) for r in fit_rows)
            if best is None or err < best[0]:
                best = (err, dict(zip(GRID, values)))
    return {"fit_mae": best[0], "constants": best[1]}


# The 2025 fit: the share of TP traffic the overlap leaves exposed, and per (generation, format)
# the large-GEMM efficiency of the low-precision peak (each group's rows depend on its own
# constant only, so each is searched alone for every value of the shared one).
TP_OVERLAP_GRID = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
LOW_EFFICIENCY_GRID = [round(0.20 + 0.02 * i, 2) for i in range(36)]


def _group(r: Row) -> tuple[str, str] | None:
    w = r.workload
    if w.precision not in ("fp8", "mxfp8", "nvfp4"):
        return None
    return perf.generation(r.gpu), low_precision_format(w.precision, w.fp8_recipe, w.caps.fp8_backend)


def _set_low(rows: list[Row], group, value: float) -> None:
    for r in rows:
        if _group(r) == group:
            r.links = dataclasses.replace(r.links, low_efficiency=value,
                                          low_tflops=lookup_gpu(r.gpu).low_precision_tflops(r.workload.precision))


TE_GRID = [round(0.50 + 0.02 * i, 2) for i in range(21)]
# the BF16 Transformer Engine rows the Hopper TE constant is fitted on (the issue's named source;
# reference rows: their micro-batch is not printed and taken as 1, the rest as in the 2024 README)
TE_SOURCE = "megatron_h100_2024"


def _set_te(rows: list[Row], value: float) -> None:
    for r in rows:
        r.links = dataclasses.replace(r.links, te_gemm_efficiency=value)
    _clear_caches()


def fit_2025(rows: list[Row], te_rows: list[Row]) -> dict:
    """The TP-overlap share, Hopper's BF16 GEMM efficiency under Transformer Engine and the
    low-precision efficiencies that minimise the fit halves' mean absolute error (the check
    halves are not looked at). rows: the 2025 file's; te_rows: Megatron-Core's H100 table."""
    fit_rows = [r for r in rows if r.scored and r.half == "fit"]
    te_fit = [r for r in te_rows if r.half == "fit"]
    groups = sorted({g for r in fit_rows if (g := _group(r))})
    best = None
    with _restored(rows + te_rows, "TP_OVERLAP_EXPOSED"):
        for tp_exposed in TP_OVERLAP_GRID:
            perf.TP_OVERLAP_EXPOSED = tp_exposed
            _clear_caches()
            scores = []
            for v in TE_GRID:
                _set_te(te_fit + fit_rows, v)
                scores.append((statistics.mean(abs(r.error) for r in te_fit), v))
            _, te = min(scores)
            _set_te(te_fit + fit_rows, te)  # the FP8 rows' output layer and attention stay BF16
            chosen, errs = {}, [abs(r.error) for r in te_fit]
            for g in groups:
                members = [r for r in fit_rows if _group(r) == g]
                scores = []
                for v in LOW_EFFICIENCY_GRID:
                    _set_low(members, g, v)
                    _clear_caches()
                    scores.append((statistics.mean(abs(r.error) for r in members), v))
                err, chosen[g] = min(scores)
                _set_low(members, g, chosen[g])
                errs += [abs(r.error) for r in members]
            _clear_caches()
            errs += [abs(r.error) for r in fit_rows if _group(r) is None]
            mae = statistics.mean(errs)
            if best is None or mae < best[0]:
                best = (mae, tp_exposed, te, chosen)
    return {"fit_mae": best[0], "TP_OVERLAP_EXPOSED": best[1], "GEMM_EFFICIENCY_TE": {"hopper": best[2]},
            "LOW_PRECISION_GEMM_EFFICIENCY": best[3],
            "rows": {**{g: sorted(r.id for r in fit_rows if _group(r) == g) for g in best[3]},
                     "hopper bf16 (Transformer Engine)": sorted(r.id for r in te_fit)}}


# torch.compile and async TP from pairs of torchtitan runs on the same GPUs, one with the feature
# and one without (their H100s are 96 GB / 500 W parts: a ratio of two runs, not the runs' own
# times, is what these pairs can score). Compile: the 8-GPU pair fits COMPILE_MEMBOUND_SHARE, the
# 128-GPU pair checks. Async TP: the async-TP table's four pairs (BF16 and row-wise Float8, 70B
# and 8B, vanilla TP -> async TP), halves alternating in id order: the BF16 pairs fit
# ASYNC_TP_EXPOSED, the Float8 pairs check it (with the Float8 constants, fitted after it).
COMPILE_PAIRS = {"fit": ("torchtitan-202412-llama31-8b-8gpu-fsdp", "torchtitan-202412-llama31-8b-8gpu-fsdp-compile"),
                 "check": ("torchtitan-202412-llama31-8b-128gpu-fsdp",
                           "torchtitan-202412-llama31-8b-128gpu-fsdp-compile")}
_TT = "torchtitan-asynctp-202506-llama3-"
ASYNC_TP_PAIRS = {"fit": [(_TT + "70b-256gpu-bf16-vanilla-tp", _TT + "70b-256gpu-bf16-async-tp"),
                          (_TT + "8b-64gpu-bf16-vanilla-tp", _TT + "8b-64gpu-bf16-async-tp")],
                  "check": [(_TT + "70b-256gpu-fp8-rowwise-vanilla-tp", _TT + "70b-256gpu-fp8-rowwise-async-tp"),
                            (_TT + "8b-64gpu-fp8-rowwise-vanilla-tp", _TT + "8b-64gpu-fp8-rowwise-async-tp")]}
ASYNC_TP_GRID = [round(0.05 * i, 2) for i in range(21)]
COMPILE_GRID = [round(0.05 * i, 2) for i in range(1, 21)]
# torchtitan's row-wise Float8 (what jobctl renders for it: torchtitan 0.3.0 offers no other
# scaling) against BF16 on the same GPUs, both compiled, from the async-TP table: half of the
# pairs fit LOW_PRECISION_GEMM_EFFICIENCY[("hopper", "fp8-rowwise")], the other half check it
FLOAT8_PAIRS = {"fit": [(_TT + "70b-256gpu-bf16-vanilla-tp", _TT + "70b-256gpu-fp8-rowwise-vanilla-tp"),
                        (_TT + "8b-64gpu-bf16-async-tp", _TT + "8b-64gpu-fp8-rowwise-async-tp")],
                "check": [(_TT + "70b-256gpu-bf16-async-tp", _TT + "70b-256gpu-fp8-rowwise-async-tp"),
                          (_TT + "8b-64gpu-bf16-vanilla-tp", _TT + "8b-64gpu-fp8-rowwise-vanilla-tp")]}
ROWWISE = ("hopper", "fp8-rowwise")
ROWWISE_GRID = [round(0.30 + 0.02 * i, 2) for i in range(31)]  # 0.30-0.90 of the FP8 peak
ROWWISE_CAST_GRID = list(range(0, 161, 2))  # bytes per element of a linear's input and output, per token


def pair_speedups(rows: list[Row], pairs) -> list[tuple[str, float, float]]:
    """(the pair's first id, measured speed-up, predicted speed-up) of (without, with) pairs."""
    by_id = {r.id: r for r in rows}
    out = []
    for a, b in pairs:
        ra, rb = by_id[a], by_id[b]
        out.append((a, ra.measured_s / rb.measured_s, ra.predicted_s / rb.predicted_s))
    return out


def fit_compile(rows: list[Row]) -> float:
    """COMPILE_MEMBOUND_SHARE that makes the fit pair's predicted speed-up its measured one."""
    best = None
    with _restored([], "COMPILE_MEMBOUND_SHARE"):
        for v in COMPILE_GRID:
            perf.COMPILE_MEMBOUND_SHARE = v
            _clear_caches()
            ((_, measured, predicted),) = pair_speedups(rows, [COMPILE_PAIRS["fit"]])
            err = abs(predicted / measured - 1)
            if best is None or err < best[0]:
                best = (err, v)
    return best[1]


def fit_async_tp(rows: list[Row]) -> float:
    """ASYNC_TP_EXPOSED that makes the fit pairs' predicted speed-ups closest to the measured
    ones (mean |predicted / measured - 1|)."""
    best = None
    with _restored([], "ASYNC_TP_EXPOSED"):
        for v in ASYNC_TP_GRID:
            perf.ASYNC_TP_EXPOSED = v
            _clear_caches()
            err = statistics.mean(abs(p_ / m - 1) for _, m, p_ in pair_speedups(rows, ASYNC_TP_PAIRS["fit"]))
            if best is None or err < best[0] - 1e-12:
                best = (err, v)
    return best[1]


def fit_rowwise(rows: list[Row]) -> tuple[float, float]:
    """The row-wise Float8 GEMM efficiency and cast bytes that make the fit pairs' predicted
    speed-ups closest to the measured ones (mean |predicted / measured - 1|)."""
    fp8 = [r for r in rows if _group(r) == ROWWISE]
    best = None
    for v in ROWWISE_GRID:
        for cast in ROWWISE_CAST_GRID:
            _set_low(fp8, ROWWISE, v)
            for r in fp8:
                r.links = dataclasses.replace(r.links, low_cast_bytes=cast)
            _clear_caches()
            err = statistics.mean(abs(p_ / m - 1) for _, m, p_ in pair_speedups(rows, FLOAT8_PAIRS["fit"]))
            if best is None or err < best[0] - 1e-12:
                best = (err, v, cast)
    _set_low(fp8, ROWWISE, perf.LOW_PRECISION_GEMM_EFFICIENCY.get(ROWWISE, 0.0))
    for r in fp8:
        r.links = dataclasses.replace(r.links, low_cast_bytes=perf.ROWWISE_CAST_BYTES)
    _clear_caches()
    return best[1], best[2]


def _pairs_report(rows: list[Row]) -> None:
    print("\ntorch.compile and async TP, as speed-ups of pairs of torchtitan runs on the same GPUs:")
    print(f"{'pair (without -> with)':72} {'half':5} {'measured':>8} {'predicted':>9}")
    for half in ("fit", "check"):
        for a, m, p_ in pair_speedups(rows, [COMPILE_PAIRS[half]]):
            print(f"{a + ' -> compile':72} {half:5} {m:7.3f}x {p_:8.3f}x")
    for half in ("fit", "check"):
        for a, m, p_ in pair_speedups(rows, ASYNC_TP_PAIRS[half]):
            print(f"{a + ' -> async TP':72} {half:5} {m:7.3f}x {p_:8.3f}x")
    for half in ("fit", "check"):
        for a, m, p_ in pair_speedups(rows, FLOAT8_PAIRS[half]):
            print(f"{a + ' -> fp8 rowwise':72} {half:5} {m:7.3f}x {p_:8.3f}x")


HOST_GIB = 2048  # host RAM per node of these clusters (DGX A100: 1-2 TB, DGX H100: 2 TB)


def versus_search(r: Row) -> dict:
    """The search on the row's GPUs (exactly its nodes, with its variant's memory), framework and
    batch: its choice, and the published layout's predicted speed relative to it (and whether the
    model fits it)."""
    gpn = r.plan.gpus_per_node
    gpu = lookup_gpu(r.gpu)
    t = Target("published", "gpus", gpu, gpn, r.gpus // gpn, HOST_GIB * GIB, r.memory_bytes or gpu.memory_bytes,
               r.links,
               domain_gpus=r.link_gpus if r.link_gpus > gpn else 0)
    res = search(r.workload, t, Constraints(nodes=r.gpus // gpn, max_nodes=r.gpus // gpn))
    mem = estimate(r.workload, t.gpu_memory_bytes, r.plan, t.host_mem_bytes, detail=False)
    out = {"fits": mem.fits, "need_gib": mem.total_bytes / GIB, "chosen": None, "ratio": None}
    if res.best is not None and res.best.estimate is not None:
        out["chosen"] = res.best.plan.summary()
        out["ratio"] = res.best.estimate.step_time_s / r.predicted_s  # > 1: the published layout is faster
    return out


def _table(rows: list[Row], markdown: bool) -> None:
    if markdown:
        print("| row | source | half | GPUs | layout | measured step | predicted | error | not scored because |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r.id} | {r.source} | {r.half if r.scored else 'reference (' + r.half + ')'} | {r.gpus} | {r.plan.summary()} | "
                  f"{r.measured_s:.3g} s ({r.how}) | {r.predicted_s:.3g} s | {r.error:+.1%} | "
                  f"{r.why_not_scored or '-'} |")
    else:
        print(f"{'row':44} {'half':5} {'GPUs':>5} {'measured':>9} {'predicted':>9} {'error':>7}")
        for r in rows:
            half = r.half if r.scored else f"ref-{r.half[0]}"
            print(f"{r.id[:44]:44} {half:5} {r.gpus:5d} {r.measured_s:8.3g}s {r.predicted_s:8.3g}s {r.error:+7.1%}")


def _by(rows: list[Row], key, title: str) -> None:
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    print(title)
    for k, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        name = k if isinstance(k, str) else " ".join(str(x) for x in k)
        print(f"  {name:34} {len(rs):3d} rows  MAE {statistics.mean(abs(r.error) for r in rs):6.1%}  "
              f"mean error {statistics.mean(r.error for r in rs):+6.1%}")


def _layouts(rows: list[Row]) -> None:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="grid-search the efficiency constants on the fit half")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--layouts", action="store_true",
                    help="also run the search on each row's GPUs: is the published layout among the best?")
    ap.add_argument("--data", choices=("2021", "2025", "all"), default="all",
                    help="2021: the 2021-24 sources; 2025: NVIDIA's Megatron-Bridge/NeMo summaries; all: both")
    args = ap.parse_args(argv)
    if args.data in ("2021", "all"):
        rows, skipped = load_rows(DATA)
        rows.sort(key=lambda r: (r.source, r.id))
        _table(rows, args.markdown)
        s = summary(rows)
        print()
        print(f"rows scored {s['n']}, reference {len(rows) - s['n']}, skipped {len(skipped)}: mean absolute error all "
              f"{s['all']:.1%}, fit half {s['fit']:.1%}, check half {s['check']:.1%}, check half Megatron rows "
              f"({s['n_check_megatron']}) {s['check_megatron']:.1%}")
        _by([r for r in rows if r.scored], lambda r: r.source, "scored rows, by source:")
        _by([r for r in rows if not r.scored], lambda r: r.source,
            "reference rows (not scored: configuration incomplete or other hardware), by source:")
        _pairs_report(rows)
        if args.layouts:
            _layouts(rows)
        if args.fit:
            print(f"\ncompile pair fit: COMPILE_MEMBOUND_SHARE {fit_compile(rows)}")
            print(f"async TP pair fit: ASYNC_TP_EXPOSED {fit_async_tp(rows)}")
            eff, cast = fit_rowwise(rows)
            print(f"row-wise Float8 pair fit: LOW_PRECISION_GEMM_EFFICIENCY[{ROWWISE}] {eff}, ROWWISE_CAST_BYTES {cast}")
            f = fit(rows)
            print(f"\nfit half, grid search: MAE {f['fit_mae']:.1%} with {f['constants']}")
    if args.data in ("2025", "all"):
        rows, skipped = load_rows(DATA_2025)
        rows.sort(key=lambda r: (r.source, r.id))
        print("\nNVIDIA's performance summaries (benchmarks/data/published_throughput_2025.yaml):")
        _table(rows, args.markdown)
        s = summary(rows)
        print()
        print(f"rows scored {s['n']}, reference {len(rows) - s['n']}, skipped {len(skipped)}: mean absolute error all "
              f"{s['all']:.1%}, fit half {s['fit']:.1%}, check half {s['check']:.1%}")
        scored = [r for r in rows if r.scored]
        _by(scored, lambda r: (r.source, r.half), "scored rows, by source and half:")
        _by([r for r in scored if r.half == "check"], lambda r: (r.gpu.split("-")[0], r.workload.precision),
            "check half, by GPU and format:")
        if [r for r in rows if not r.scored]:
            _by([r for r in rows if not r.scored], lambda r: r.source, "reference rows, by source:")
        if args.layouts:
            _layouts(rows)
        if args.fit:
            te_rows = [r for r in load_rows(DATA)[0] if r.source == TE_SOURCE]
            f = fit_2025(rows, te_rows)
            print(f"\nfit halves, grid search: MAE {f['fit_mae']:.1%} with TP_OVERLAP_EXPOSED {f['TP_OVERLAP_EXPOSED']}, "
                  f"GEMM_EFFICIENCY_TE {f['GEMM_EFFICIENCY_TE']} and LOW_PRECISION_GEMM_EFFICIENCY "
                  f"{f['LOW_PRECISION_GEMM_EFFICIENCY']}")
            for g, ids in f["rows"].items():
                print(f"  {g}: set by {', '.join(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
