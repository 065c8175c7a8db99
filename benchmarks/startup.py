#!/usr/bin/env python
"""Start-up time of `jobctl plan`: wall time of whole commands, and where it goes.

1. Subprocess wall time (N runs each, median and min) of
     python -c pass                       the interpreter alone (the floor)
     python -c "import jobctl.cli"        the CLI module
     jobctl plan RECIPE --cluster C --json   via the console script next to this python
     jobctl ... (PATH)                    as a shell finds it, when that differs (e.g. a pyenv
                                          shim, which adds its own start-up)
     python -m jobctl plan ...
   and the ratio of each to `python -c pass`.  Target: the plan under 0.3 s.
2. In-process phases, each in a fresh interpreter (N runs, median): import the CLI,
   load the recipe, load the inventory, search (plan_on), JSON encoding; with the
   third-party top-level packages each phase imported for the first time.

Usage:
  python benchmarks/startup.py                   # N=10
  python benchmarks/startup.py -n 20 --json
  python benchmarks/startup.py --importtime      # + the slowest imports (python -X importtime)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 0.3

# Runs in a fresh interpreter; prints one JSON line of phase timings.
PHASES_CHILD = r"""
import json, sys, time
t = time.perf_counter
recipe, cluster = sys.argv[1], sys.argv[2]
out, mods = [], []
def top():
    return {m.split(".")[0] for m in sys.modules}
seen = top()
def mark(name, t0):
    global seen
    now = top()
    out.append((name, t() - t0, sorted(m for m in now - seen if not m.startswith("_"))))
    seen = now
t0 = t(); import jobctl.cli, jobctl.cli.plan; mark("import jobctl.cli (+ cli.plan)", t0)
t0 = t(); from jobctl.planning import load_inventory, load_recipe, plan_on; mark("import jobctl.planning", t0)
t0 = t(); import jobctl.config.schema; mark("import jobctl.config.schema (pydantic models; load_recipe imports it)", t0)
t0 = t(); rec = load_recipe(recipe, []); mark("load recipe (read YAML, validate)", t0)
t0 = t(); inv = load_inventory(cluster); mark("load inventory", t0)
t0 = t(); res = plan_on(rec, inv); mark("search (plan_on)", t0)
t0 = t(); from jobctl import ui; import io, contextlib
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    ui.print_json(res.to_dict())
mark("JSON (ui.print_json)", t0)
print(json.dumps({"phases": out, "feasible": res.feasible, "json_chars": len(buf.getvalue())}))
"""


def _time(cmd, n, env, cwd):
    """Wall times (s) of n runs of cmd; the first, uncounted run warms the file cache."""
    subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times, rc = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        rc = p.returncode
        if rc not in (0, 3):  # 3 = does not fit: still a complete plan
            raise SystemExit(f"startup: {' '.join(cmd)} exited {rc}:\n{p.stderr.decode(errors='replace')}")
    return times, rc


def _console_scripts(extra=()):
    """jobctl executables to time: the script installed beside this interpreter first, then
    the one on PATH, a pyenv shim (what an interactive shell runs under pyenv) and `extra`."""
    out = []
    here = os.path.join(os.path.dirname(sys.executable), "jobctl")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        out.append((here, ""))
    on_path = shutil.which("jobctl")
    if on_path:
        out.append((on_path, "PATH"))
    root = os.environ.get("PYENV_ROOT")
    if root and os.path.isfile(os.path.join(root, "shims", "jobctl")):
        out.append((os.path.join(root, "shims", "jobctl"), "pyenv shim"))
    out += [(e, "given") for e in extra]
    seen, unique = set(), []
    for path, why in out:
        if path not in seen:
            seen.add(path)
            unique.append((path, why))
    return unique


def command_rows(recipe, cluster, n, env, extra=()):
    py = sys.executable
    plan_args = ["plan", recipe, "--cluster", cluster, "--json"]
    cases = [("python -c pass", [py, "-c", "pass"]),
             ('python -c "import jobctl.cli"', [py, "-c", "import jobctl.cli"])]
    for i, (path, why) in enumerate(_console_scripts(extra)):
        tag = "" if i == 0 and not why else f"  [{why}: {path}]"
        cases.append((f"jobctl {' '.join(plan_args)}{tag}", [path] + plan_args))
    cases.append((f"python -m jobctl {' '.join(plan_args)}", [py, "-m", "jobctl"] + plan_args))
    rows = []
    for name, cmd in cases:
        times, rc = _time(cmd, n, env, ROOT)
        rows.append({"command": name, "argv": cmd, "n": n, "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times), "rc": rc})
    floor = rows[0]["median_s"]
    for r in rows:
        r["x_python"] = r["median_s"] / floor
    return rows


def phase_rows(recipe, cluster, n, env):
    runs = []
    for _ in range(n + 1):
        p = subprocess.run([sys.executable, "-c", PHASES_CHILD, recipe, cluster], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"startup: phase run failed:\n{p.stderr}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    runs = runs[1:]  # the first run warms the file cache
    rows = []
    for i, (name, _, mods) in enumerate(runs[0]["phases"]):
        vals = [r["phases"][i][1] for r in runs]
        rows.append({"phase": name, "median_s": statistics.median(vals), "min_s": min(vals),
                     "new_top_level_modules": [m for m in mods if m not in sys.stdlib_module_names and m != "jobctl"]})
    return rows, runs[0]["feasible"]


def importtime(recipe, cluster, env, top=12):
    """The slowest imports (cumulative µs) of one `python -X importtime -m jobctl plan ...`."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "jobctl", "plan", recipe, "--cluster", cluster,
                        "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
    rows = []
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cum_us, name = line.split(":", 1)[1].split("|", 2)
        rows.append({"module": name.strip(), "self_us": int(self_us), "cumulative_us": int(cum_us)})
    return sorted(rows, key=lambda r: -r["cumulative_us"])[:top]


def _table(headers, body, left=(0,)):
    """Plain-text table; columns in `left` are left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i in left else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(b) for b in body])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10, help="runs per command (default 10)")
    ap.add_argument("--recipe", default="recipes/llama70b.yaml")
    ap.add_argument("--cluster", default="h100")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--jobctl", action="append", default=[], metavar="PATH",
                    help="another jobctl executable to time (repeatable)")
    ap.add_argument("--importtime", action="store_true", help="also list the slowest imports")
    args = ap.parse_args(argv)
    env = dict(os.environ)

    cmds = command_rows(args.recipe, args.cluster, args.n, env, args.jobctl)
    phases, feasible = phase_rows(args.recipe, args.cluster, args.n, env)
    imports = importtime(args.recipe, args.cluster, env) if args.importtime else []
    plan_rows = [r for r in cmds if r["command"].startswith("jobctl ")]
    verdict = plan_rows[0]["median_s"] < TARGET_S if plan_rows else None
    meta = {"python": sys.version.split()[0], "executable": sys.executable, "n": args.n,
            "recipe": args.recipe, "cluster": args.cluster, "target_s": TARGET_S, "plan_meets_target": verdict,
            "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    if args.json:
        json.dump({"meta": meta, "commands": cmds, "phases": phases, "imports": imports}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0

    print(f"# jobctl start-up  {meta['date']}  python {meta['python']}  N={args.n}  "
          f"recipe {args.recipe}  cluster {args.cluster}")
    print()
    print(_table(["command", "median s", "min s", "max s", "x python", "rc"],
                 [[r["command"], f"{r['median_s']:.3f}", f"{r['min_s']:.3f}", f"{r['max_s']:.3f}",
                   f"{r['x_python']:.1f}", str(r["rc"])] for r in cmds]))
    if plan_rows:
        r = plan_rows[0]
        print(f"\nplan: median {r['median_s']:.3f} s, min {r['min_s']:.3f} s; target < {TARGET_S} s: "
              f"{'met' if verdict else 'NOT met'}")
    total = sum(p["median_s"] for p in phases)
    print(f"\n# in-process phases (fresh interpreter each run, median of {args.n}; "
          f"interpreter start-up itself is the `python -c pass` row)")
    print(_table(["phase", "median ms", "min ms", "share", "third-party packages first imported"],
                 [[p["phase"], f"{1000 * p['median_s']:.1f}", f"{1000 * p['min_s']:.1f}",
                   f"{p['median_s'] / total:.0%}", ", ".join(p["new_top_level_modules"]) or "-"]
                  for p in phases] + [["total", f"{1000 * total:.1f}", "", "100%", ""]], left=(0, 4)))
    if imports:
        print("\n# slowest imports (python -X importtime, cumulative)")
        print(_table(["module", "cumulative ms", "self ms"],
                     [[r["module"], f"{r['cumulative_us'] / 1000:.1f}", f"{r['self_us'] / 1000:.1f}"]
                      for r in imports]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
