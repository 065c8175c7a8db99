"""Run the real `jobctl` entry point in a subprocess, from the repository, for end-to-end tests."""

import importlib.util
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def jobctl(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = str(ROOT)
    e["COLUMNS"] = "4000"  # no table wrapping in assertions
    return subprocess.run([sys.executable, "-m", "jobctl", *args], cwd=ROOT, env=e, capture_output=True,
                          text=True, timeout=timeout)


def history_rows(home) -> list[dict]:
    """Every row of the jobs table in `home`'s history file, oldest first (read directly with
    sqlite3, so a test sees what is on disk, not what jobctl reports)."""
    con = sqlite3.connect(Path(home) / "history.sqlite")
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM jobs ORDER BY id")]
    finally:
        con.close()


def need_package(name: str) -> None:
    """Skip a test whose framework package is not installed; under JOBCTL_REQUIRE_FRAMEWORKS (the
    README's test command) fail instead, so that CI cannot pass by skipping."""
    if importlib.util.find_spec(name) is None:
        if os.environ.get("JOBCTL_REQUIRE_FRAMEWORKS"):
            pytest.fail(f"{name} is not installed (pip install -e '.[test]')")
        pytest.skip(f"{name} is not installed")


def need_compiler(what: str) -> None:
    """Skip a test that runs torch.compile on the CPU (inductor builds C++) where no C++ compiler is
    found; under JOBCTL_REQUIRE_FRAMEWORKS fail instead, as need_package does."""
    import shutil
    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        if os.environ.get("JOBCTL_REQUIRE_FRAMEWORKS"):
            pytest.fail(f"no C++ compiler: torch.compile needs one to build {what} for the CPU")
        pytest.skip(f"no C++ compiler for torch.compile on the CPU ({what})")


def benchmark(script: str, *args, timeout=900) -> str:
    """Run benchmarks/<script> from the repository and return its standard output."""
    r = subprocess.run([sys.executable, f"benchmarks/{script}", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
