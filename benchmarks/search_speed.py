"""How long `jobctl plan` takes, as a user runs it: whole processes, CPU seconds, as ratios to
`python -c pass` measured in the same run (the machines are shared and noisy; ratios hold).

Rows: the commands of issue 25's table (70B on h100, 8B on a10g, 70B on every inventory, 70B
with --framework all, 405B on 16,384 H100s with --objective time), then every shipped recipe on
every shipped inventory, each against its budget. With --baseline DIR, the same commands are
also run from another checkout of jobctl (DIR on PYTHONPATH) in the same run, for the "before"
column; the figures the issue measured are printed beside them. Then the in-process searches
(seconds, layouts evaluated) and the slowest imports of one plan (python -X importtime).

Prints figures; it asserts nothing. Bytecode is written (PYTHONDONTWRITEBYTECODE is unset for
the children) and one uncounted run warms the caches, as a user's loop would.

Run: python3 benchmarks/search_speed.py [-n 5] [--baseline /path/to/old/checkout] [--no-importtime] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The largest search: Llama 3.1 405B on 2,048 nodes of 8 H100s.
BIG_CLUSTER = """name: h100-16k
scheduler: slurm
partitions:
  - {name: gpu, gpu: h100-sxm-80gb, gpus_per_node: 8, nodes: 2048, cpus_per_node: 192, mem_gib: 2000}
"""
# (label, plan arguments, budget in seconds, what issue 25 measured before the objectives and the
# framework comparison / when it was filed, on its dev machine)
ISSUE_ROWS = [
    ("70B on h100", ["recipes/llama70b.yaml", "--cluster", "h100", "--json"], 0.15, "~0.08 s / 2.2 s CPU"),
    ("8B on a10g", ["recipes/llama8b.yaml", "--cluster", "a10g", "--json"], 0.15, "- / 2.9 s wall"),
    ("70B, every inventory", ["recipes/llama70b.yaml", "--json"], 0.4, "0.41 s / 3.5 s"),
    ("70B on h100, --framework all", ["recipes/llama70b.yaml", "-c", "h100", "--framework", "all", "--json"], 0.4,
     "- / 5.4 s"),
    ("405B on 16,384 H100, --objective time", ["recipes/llama405b.yaml", "-c", "{big}", "--objective", "time",
                                               "--json"], 0.5, "0.11 s of search / 6.8 s"),
]
ONE_PLAN_BUDGET_S = 0.15


def cpu_seconds(argv: list[str], env: dict, n: int) -> list[float]:
    """CPU seconds (user + system) of n runs of argv, after one uncounted run."""
    out = []
    for i in range(n + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode not in (0, 3):  # 3: does not fit, still a whole plan
            raise SystemExit(f"search_speed: {' '.join(argv)} exited {p.returncode}:\n"
                             f"{p.stderr.decode(errors='replace')[-2000:]}")
        if i:
            out.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return out


def environment(pythonpath: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def rows_for(commands, n: int, baseline: str | None) -> list[dict]:
    py = sys.executable
    now_env, old_env = environment(), environment(baseline) if baseline else None
    floor = min(cpu_seconds([py, "-c", "pass"], now_env, n))
    rows = [{"label": "python -c pass", "argv": [], "cpu_s": floor, "x_python": 1.0, "budget_s": None}]
    # -P: the checkout's folder is not put first on sys.path, so PYTHONPATH chooses the code
    run = [py, "-P", "-m", "jobctl", "plan"] if sys.version_info >= (3, 11) else [py, "-m", "jobctl", "plan"]
    if baseline and sys.version_info < (3, 11):
        raise SystemExit("search_speed: --baseline needs Python 3.11 or newer (python -P)")
    for label, args, budget, issue in commands:
        argv = [*run, *args]
        t = cpu_seconds(argv, now_env, n)
        row = {"label": label, "argv": args, "cpu_s": min(t), "median_s": statistics.median(t),
               "x_python": min(t) / floor, "budget_s": budget, "issue": issue}
        if old_env is not None:
            old = min(cpu_seconds(argv, old_env, n))
            row.update(baseline_s=old, baseline_x_python=old / floor)
        rows.append(row)
    return rows


def shipped(big: str) -> list[tuple]:
    from jobctl.config.workspace import all_cluster_names

    out = [(label, [a.replace("{big}", big) for a in args], budget, issue) for label, args, budget, issue in ISSUE_ROWS]
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        for cluster in sorted(all_cluster_names()):
            out.append((f"{recipe.stem} on {cluster}", [f"recipes/{recipe.name}", "--cluster", cluster, "--json"],
                        ONE_PLAN_BUDGET_S, ""))
    return out


def in_process(big: str) -> list[tuple]:
    """Seconds and layouts evaluated of the searches themselves (no start-up), caches cold."""
    from jobctl.planner import inputs
    from jobctl.planner.search import search
    from jobctl.planning import load_inventory, load_recipe

    rows = []
    inv = load_inventory(big)
    rec = load_recipe(str(ROOT / "recipes/llama405b.yaml"), [])
    part = inv.value.partitions[0]
    for objective in ("balanced", "throughput", "time", "gpus"):
        t0 = time.process_time()
        r = search(inputs.workload(rec.value, inv.value), inputs.target(inv.value, part), inputs.constraints(rec.value),
                   objective=objective)
        rows.append((f"llama405b on 2048 x 8 H100 ({objective})", time.process_time() - t0, r.considered,
                     r.best.plan.summary() if r.best else "no fit"))
    return rows


def importtime(args: list[str], top: int = 12) -> list[tuple]:
    """The slowest imports (cumulative ms) of one plan."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "jobctl", "plan", *args], cwd=ROOT, env=environment(),
                       capture_output=True, text=True)
    rows = []
    for line in p.stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            self_us, cum_us, name = line.split(":", 1)[1].split("|", 2)
            rows.append((name.rstrip(), int(self_us) / 1000, int(cum_us) / 1000))
    return sorted(rows, key=lambda r: -r[2])[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5, help="runs per command (the minimum is reported)")
    ap.add_argument("--baseline", metavar="DIR", help="another jobctl checkout to time beside this one")
    ap.add_argument("--no-importtime", dest="importtime", action="store_false",
                    help="leave out the slowest imports of one plan (python -X importtime)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = str(Path(tmp) / "h100-16k.yaml")
        Path(big).write_text(BIG_CLUSTER)
        rows = rows_for(shipped(big), args.n, args.baseline)
        searches = in_process(big)
        imports = importtime(ISSUE_ROWS[0][1]) if args.importtime else []
    if args.json:
        print(json.dumps({"rows": rows, "in_process": searches, "imports": imports}, indent=1))
        return 0
    floor = rows[0]["cpu_s"]
    print(f"# jobctl plan, CPU seconds (min of {args.n}), python -c pass = {floor:.3f} s here")
    head = f"{'command':<40} {'CPU s':>6} {'x py':>5} {'budget':>7}"
    head += f" {'before':>7} {'x py':>5}" if args.baseline else ""
    print(head + "  issue 25 (before / when filed)")
    over = []
    for r in rows[1:]:
        line = f"{r['label']:<40} {r['cpu_s']:6.3f} {r['x_python']:5.1f} {r['budget_s']:7.2f}"
        if args.baseline:
            line += f" {r['baseline_s']:7.3f} {r['baseline_x_python']:5.1f}"
        print(line + (f"  {r['issue']}" if r["issue"] else ""))
        if r["cpu_s"] > r["budget_s"]:
            over.append(r["label"])
    print(f"over budget: {', '.join(over) if over else 'none'}")
    print()
    print(f"{'in-process search (cold caches)':<44} {'CPU s':>6} {'evaluated':>9}  best plan")
    for name, dt, n, best in searches:
        print(f"{name:<44} {dt:6.3f} {n:9d}  {best}")
    if imports:
        print()
        print(f"{'slowest imports of one plan':<44} {'self ms':>8} {'cum ms':>8}")
        for name, self_ms, cum_ms in imports:
            print(f"{name[:44]:<44} {self_ms:8.1f} {cum_ms:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
