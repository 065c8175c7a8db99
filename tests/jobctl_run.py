"""Run the real `jobctl` entry point in a subprocess, from the repository, for end-to-end tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def jobctl(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = str(ROOT)
    e["COLUMNS"] = "4000"  # no table wrapping in assertions
    return subprocess.run([sys.executable, "-m", "jobctl", *args], cwd=ROOT, env=e, capture_output=True,
                          text=True, timeout=timeout)
