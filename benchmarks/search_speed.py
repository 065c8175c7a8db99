"""How long the planner's search takes, in process: the 405B recipe on a 16384-GPU
inventory (the largest search), and every shipped recipe on every shipped cluster.

Prints figures; it asserts nothing (timings on shared machines are noisy).
Run: python3 benchmarks/search_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from jobctl.config.workspace import all_cluster_names
    from jobctl.planner import inputs
    from jobctl.planner.memory import (
        _layer_bytes,
        _stage_params_cached,
        _stage_state_elements,
    )
    from jobctl.planner.search import search
    from jobctl.planning import load_inventory, load_recipe

    def clear():  # each measurement starts cold
        for f in (_layer_bytes, _stage_params_cached, _stage_state_elements):
            f.cache_clear()

    rows = []
    big = load_inventory("h100", ["partitions.0.nodes=2048"])
    rec = load_recipe(str(ROOT / "recipes/llama405b.yaml"), [])
    for objective in ("throughput", "time", "gpus"):
        times = []
        for _ in range(args.repeat):
            clear()
            part = big.value.partitions[0]
            t0 = time.perf_counter()
            r = search(inputs.workload(rec.value, big.value), inputs.target(big.value, part), inputs.constraints(rec.value),
                       objective=objective)
            times.append(time.perf_counter() - t0)
        rows.append((f"llama405b on 2048 x 8 H100 ({objective})", min(times), r.considered,
                     r.best.plan.summary() if r.best else "no fit"))
    total = 0.0
    for rpath in sorted((ROOT / "recipes").glob("*.yaml")):
        rec = load_recipe(str(rpath), [])
        for name in all_cluster_names():
            inv = load_inventory(name)
            clear()
            t0 = time.perf_counter()
            considered = 0
            for part in inv.value.partitions:
                tgt = inputs.target(inv.value, part, rec.value.train.precision)
                r = search(inputs.workload(rec.value, inv.value, cpu=tgt.gpu.is_cpu), tgt, inputs.constraints(rec.value))
                considered += r.considered
            dt = time.perf_counter() - t0
            total += dt
            rows.append((f"{rpath.stem} on {name}", dt, considered, r.best.plan.summary() if r.best else "no fit"))
    width = max(len(r[0]) for r in rows)
    print(f"{'search':<{width}}  {'seconds':>8}  {'evaluated':>9}  best plan")
    for name, dt, n, best in rows:
        print(f"{name:<{width}}  {dt:8.3f}  {n:9d}  {best}")
    print(f"{'all shipped recipes x clusters':<{width}}  {total:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
