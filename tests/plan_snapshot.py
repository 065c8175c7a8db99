"""What `jobctl plan --json` prints for every shipped recipe on every shipped inventory, kept as a
stored copy so that a change meant to make planning faster (or to move code) can be shown to
leave every plan, memory breakdown, step estimate and piece of advice as it was.

`python tests/plan_snapshot.py` writes tests/data/plan_snapshot.json.gz (run it only when a
change of plans is meant, and say why in the commit; it keeps what `plan --explain` shows, less
the "explain" block, where the command takes --explain); tests/test_plan_snapshot.py compares.
It plans with jobctl as installed (`pip install -e .` from this checkout; `PYTHONPATH=. python
tests/plan_snapshot.py` uses this checkout whatever is installed).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "data" / "plan_snapshot.json.gz"
WORKERS = 2  # processes planning the commands (at most the machine's cores)
# the largest search the planner is asked for: Llama 3.1 405B on 2,048 nodes of 8 H100s
BIG_CLUSTER = """name: h100-16k
scheduler: slurm
partitions:
  - {name: gpu, gpu: h100-sxm-80gb, gpus_per_node: 8, nodes: 2048, cpus_per_node: 192, mem_gib: 2000}
"""


def _cli_json(argv: list[str]) -> tuple[int, object]:
    from jobctl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, json.loads(out.getvalue())


def commands(big_cluster: str) -> list[list[str]]:
    """The plan commands the copy holds: each shipped recipe on each inventory (its own
    framework, the default objective, with the framework comparison), the same with each other
    framework, every inventory at once, and the 405B recipe on 16,384 GPUs with --objective time."""
    from jobctl.config.workspace import all_cluster_names
    from jobctl.planning import framework_names

    recipes = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").glob("*.yaml"))
    out = []
    for r in recipes:
        for c in sorted(all_cluster_names()):
            out.append(["plan", r, "--cluster", c, "--json"])
            for f in framework_names():
                out.append(["plan", r, "--cluster", c, "--framework", f, "--json"])
        out.append(["plan", r, "--json"])
    out.append(["plan", "recipes/llama405b.yaml", "--cluster", big_cluster, "--objective", "time", "--json"])
    return out


def with_explain(argv: list[str]) -> bool:
    """The commands also run with --explain: one inventory, the recipe's own framework (what
    `plan` shows only with --explain, such as every framework's row, is compared there)."""
    return "--cluster" in argv and "--framework" not in argv


def collect(explain: bool = False) -> dict:
    """{command line: [exit code, JSON]} for every command, run in this process from the
    repository root with an empty history and no cache; `explain`: the commands of
    `with_explain` with --explain added (keyed as without it)."""
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "h100-16k.yaml"
        big.write_text(BIG_CLUSTER)
        old = {k: os.environ.get(k) for k in ("JOBCTL_HOME", "JOBCTL_NO_CACHE", "JOBCTL_CLUSTERS")}
        os.environ.update(JOBCTL_HOME=str(Path(tmp) / "home"), JOBCTL_NO_CACHE="1")
        os.environ.pop("JOBCTL_CLUSTERS", None)
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            todo = [a for a in commands(str(big)) if not explain or with_explain(a)]
            # the commands are independent: split over the machine's cores (two on CI's), each
            # worker a fresh interpreter planning its share in-process, as one process would
            workers = max(1, min(WORKERS, os.cpu_count() or 1))
            shares = [todo[i::workers] for i in range(workers)]
            if workers == 1:
                results = [_plan_all(shares[0], explain, str(big))]
            else:
                ctx = multiprocessing.get_context("spawn")
                with ctx.Pool(workers) as pool:
                    results = pool.starmap(_plan_all, [(share, explain, str(big)) for share in shares])
            got = {k: v for part in results for k, v in part.items()}
            return {key: got[key] for key in (" ".join(a).replace(str(big), "h100-16k.yaml") for a in todo)}
        finally:
            os.chdir(cwd)
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _plan_all(todo: list[list[str]], explain: bool, big: str) -> dict:
    """{command line: [exit code, JSON]} for `todo`, planned in this process."""
    out = {}
    for argv in todo:
        code, data = _cli_json(argv + ["--explain"] if explain else argv)
        out[" ".join(argv).replace(big, "h100-16k.yaml")] = [code, _portable(data, big)]
    return out


def _portable(value, big: str):
    """The temporary inventory's path written as its file name."""
    if isinstance(value, dict):
        return {k: _portable(v, big) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v, big) for v in value]
    if isinstance(value, str):
        return value.replace(big, "h100-16k.yaml")
    return value


def load() -> dict:
    with gzip.open(SNAPSHOT, "rt", encoding="utf-8") as f:
        return json.load(f)


def main() -> int:
    data = collect()
    for k, (code, doc) in collect(explain=True).items():
        data[k] = [code, {x: v for x, v in doc.items() if x != "explain"} if isinstance(doc, dict) else doc]
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(SNAPSHOT, "wb", mtime=0) as f:
        f.write(json.dumps(data, indent=1, sort_keys=True).encode())
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}: {len(data)} commands", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
