"""A damaged, read-only history through the real entry point: one clear message with exit code 6
(docs/exit-codes.md), a copy of the damaged file kept, nothing submitted, and `jobctl doctor`
saying how to recover; `doctor --reset` moves it aside and the next command works."""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def jobctl(home: Path, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", "jobctl", *args], cwd=cwd or home.parent, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "JOBCTL_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


def real_history(tmp_path) -> Path:
    """A history with one finished local job (submitit's local executor)."""
    home = tmp_path / "home"
    r = jobctl(home, "submit", str(ROOT / "recipes" / "tiny.yaml"), "--cluster", "local", "--wait")
    assert r.returncode == 0, r.stderr[-2000:]
    db = home / "history.sqlite"
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, nothing in -wal
    con.close()
    return home


def damage(db: Path, how: str) -> None:
    if how == "garbage":
        db.write_bytes(b"this is not a database, it was overwritten by something else\n" * 100)
    else:  # the jobs table's pages overwritten with 0xff, the header left intact
        data = bytearray(db.read_bytes())
        page = int.from_bytes(data[16:18], "big") or 65536
        assert len(data) >= 3 * page, len(data)
        data[page:len(data)] = b"\xff" * (len(data) - page)
        db.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage", "pages"])
def test_a_damaged_history_gives_one_message_keeps_a_copy_and_doctor_recovers(tmp_path, how):
    home = real_history(tmp_path)
    db = home / "history.sqlite"
    damage(db, how)
    damaged_bytes = db.read_bytes()
    for args in (["status"], ["history"], ["submit", str(ROOT / "recipes" / "tiny.yaml"), "--cluster", "local"]):
        r = jobctl(home, *args)
        assert r.returncode == 6, (args, r.stdout, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and "is damaged" in r.stderr and "jobctl doctor" in r.stderr, r.stderr
    assert len(list((home / "jobs").iterdir())) == 1  # the refused submit made no job folder
    (copy,) = home.glob("history.sqlite.damaged-*")  # one copy, however many commands met it
    assert copy.read_bytes() == damaged_bytes and (copy.stat().st_mode & 0o077) == 0
    r = jobctl(home, "doctor")
    assert r.returncode == 6 and "NOT usable" in r.stdout and str(copy) in r.stdout, r.stdout
    r = jobctl(home, "doctor", "--reset")
    assert r.returncode == 0 and "moved aside" in r.stdout, r.stdout + r.stderr
    assert not db.exists() and len([p for p in home.glob("history.sqlite.reset-*") if p.name[-1].isdigit()]) == 1
    r = jobctl(home, "status")
    assert r.returncode == 0, r.stderr
    r = jobctl(home, "doctor", "--json")
    assert r.returncode == 0 and '"ok": true' in r.stdout


def test_a_read_only_history_is_refused_before_anything_is_submitted(tmp_path):
    home = real_history(tmp_path)
    db = home / "history.sqlite"
    # root ignores file modes: make the file immutable instead (what a read-only mount does)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available on this file system")
    try:
        r = jobctl(home, "submit", str(ROOT / "recipes" / "tiny.yaml"), "--cluster", "local")
        assert r.returncode == 6 and "read-only" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert len(list((home / "jobs").iterdir())) == 1
        assert jobctl(home, "history").returncode == 0  # reading still works
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=False)
