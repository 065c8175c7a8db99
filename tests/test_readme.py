"""The README's commands work as printed: every `jobctl plan`, `jobctl memory` and
`jobctl submit --dry-run` line of its code blocks (the ones that need no cluster), run as
written from the repository, ends with a documented exit code (0, or 3 where the README's
own text says the request does not fit) and no traceback. Lines that name a file the
reader makes first (plan.json) or need a live cluster (--check, a real submit) are left out,
and the test says how many it ran."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            for part in line.split(" | "):  # "jobctl status | jobctl logs 12 -f | ..." lists alternatives
                part = part.strip()
                if not re.match(r"jobctl (plan|memory|submit) ", part):
                    continue
                words = shlex.split(part)
                if part.startswith("jobctl submit") and ("--dry-run" not in words or "--check" in words):
                    continue
                if any(w.endswith(".json") and not (ROOT / w).exists() for w in words):
                    continue
                out.append(part)
    return out


def test_the_readmes_commands_run_as_printed(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 8, commands
    for command in commands:
        words = shlex.split(command)
        r = subprocess.run([sys.executable, "-m", "jobctl", *words[1:]], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                             "PYTHONPATH": str(ROOT), "JOBCTL_NO_CACHE": "1"})
        assert r.returncode in (0, 3), (command, r.returncode, r.stderr[-1500:])
        assert "Traceback" not in r.stderr, command
