"""What a user reads at 80 columns, kept as golden files (issue 28): `history` and `status` of
the history in tests/ui_history.py, `plan` of the 70B recipe on h100, `submit --dry-run` of the
405B recipe on h100. Each command runs as a user runs it through a pipe (a subprocess, stdout
not a terminal, no COLUMNS: rich's 80 columns), in UTC; the job folder's home and this
machine's python are written as $JOBCTL_HOME and $PYTHON.

`python tests/golden_outputs.py` rewrites tests/golden/*.txt and the README's copies (the
blocks after `<!-- output: NAME -->`): run it only when a change of what the user reads is
meant, and read the diff (tests/test_golden_outputs.py compares). The commands run this
checkout (PYTHONPATH); the history they read is written by jobctl as installed (`pip install -e
.` from this checkout; `PYTHONPATH=. python tests/golden_outputs.py` uses this checkout whatever
is installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
COMMANDS = {
    "history": ["history"],
    "status": ["status"],
    "plan-llama70b-h100": ["plan", "recipes/llama70b.yaml", "--cluster", "h100"],
    "dry-run-llama405b-h100": ["submit", "recipes/llama405b.yaml", "--cluster", "h100", "--dry-run"],
}


def make_home(home: Path) -> None:
    """A JOBCTL_HOME holding tests/ui_history.py's history."""
    import ui_history

    from jobctl.store.history import History

    os.environ["JOBCTL_HOME"] = str(home)
    try:
        with History.open(clock=ui_history.start) as h:
            ui_history.fill(h)
    finally:
        del os.environ["JOBCTL_HOME"]


def env(home: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TERM")}
    e.update({"JOBCTL_HOME": str(home), "TZ": "UTC", "PYTHONPATH": str(ROOT), "JOBCTL_NO_CACHE": "1"})
    e.pop("JOBCTL_CLUSTERS", None)
    return e


def run(name: str, home: Path) -> tuple[int, str, str]:
    """(exit code, stdout with the machine's paths named, stderr) of one command through a pipe."""
    r = subprocess.run([sys.executable, "-m", "jobctl", *COMMANDS[name]], cwd=ROOT, env=env(home),
                       capture_output=True, text=True, timeout=300)
    return r.returncode, normalise(r.stdout, home), r.stderr


def normalise(text: str, home: Path) -> str:
    return text.replace(str(home), "$JOBCTL_HOME").replace(sys.executable, "$PYTHON")


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        make_home(home)
        for name in COMMANDS:
            code, out, err = run(name, home)
            if code != 0:
                raise SystemExit(f"{name}: exit {code}\n{err}")
            (GOLDEN / f"{name}.txt").write_text(out)
            print(f"wrote tests/golden/{name}.txt: {len(out.splitlines())} lines")
            readme = ROOT / "README.md"
            text = readme.read_text()
            marker = f"<!-- output: {name} -->\n```text\n"
            if marker in text:
                head, rest = text.split(marker, 1)
                readme.write_text(head + marker + out + "```" + rest.split("```", 1)[1])


if __name__ == "__main__":
    main()
