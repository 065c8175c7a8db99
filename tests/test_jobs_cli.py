"""`jobctl status`, `logs`, `cancel` and `history` against real things: a fresh sqlite history
per test (JOBCTL_HOME), real local jobs (submitit's local executor) and real Slurm jobs on the
dev cluster (tests/slurm_fixture.py), with exit codes asserted through the CLI entry point."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobctl import cli  # this checkout's, whatever `pip install -e` points at (pyproject.toml: pythonpath)
from jobctl.store.history import History

REPO = Path(__file__).resolve().parent.parent

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "SUBMIT_FAILED"}
LONG = "train.steps=100000"  # ~5 minutes of tiny_train: long enough to be cancelled while running
PLAN = {"nodes": 1, "gpus_per_node": 1, "world_size": 1, "tp": 1, "pp": 1, "dp": 1, "cp": 1}


@pytest.fixture(autouse=True)
def _env(repo_cli_home):
    # conftest.py's repo_cli_home: the repository root, a fresh JOBCTL_HOME, no wrapping by rich
    real_scancel = shutil.which("scancel")
    yield
    _stop_leftovers(real_scancel)


def _stop_leftovers(scancel: str | None) -> None:
    """After a failed test: stop the jobs it really submitted (a folder with submitit.json),
    so a 5-minute job does not outlive it."""
    from jobctl.backends.local import LocalBackend

    with History.open() as h:
        records = [r for r in h.list() if r.job_folder and (Path(r.job_folder) / "submitit.json").exists()]
    for r in records:
        if r.scheduler == "local":
            LocalBackend().cancel([r])
    slurm = [r.scheduler_job_id for r in records if r.scheduler == "slurm" and not r.terminal]
    if slurm and scancel:
        subprocess.run([scancel, *slurm], capture_output=True, timeout=60)


def jobctl(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def jobctl_json(capsys, *argv):
    code, out, err = jobctl(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def subprocess_jobctl(*argv, **kwargs) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.Popen([sys.executable, "-m", "jobctl", *map(str, argv)], cwd=REPO, env=env, text=True, **kwargs)


def submit(capsys, cluster: str, *overrides: str) -> dict:
    code, out, err = jobctl(capsys, "submit", "recipes/tiny.yaml", "--cluster", cluster, *overrides, "--json")
    assert code == 0, err
    (job,) = json.loads(out)
    return job


def wait_status(capsys, job_id: int, until, timeout_s: float = 120) -> dict:
    """Poll `status JOB --json` (bounded) until `until(row)`; the last row."""
    deadline = time.monotonic() + timeout_s
    while True:
        (row,) = jobctl_json(capsys, "status", job_id)
        if until(row) or time.monotonic() > deadline:
            assert until(row), f"job #{job_id} after {timeout_s} s: {row}"
            return row
        time.sleep(0.5)


def wait_for(predicate, timeout_s: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.2)


def record(job_id: int):
    with History.open() as h:
        return h.get(job_id), [t.state.value for t in h.transitions(job_id)]


def fake_job(h: History, *, scheduler="local", scheduler_job_id=None, folder=None, parent_id=None,
             cluster="local", recipe="tiny") -> int:
    jid = h.prepare(recipe_name=recipe, recipe_text=f"name: {recipe}\n", plan=PLAN, cluster=cluster,
                    scheduler=scheduler, parent_id=parent_id)
    if scheduler_job_id is not None:
        h.mark_submitted(jid, scheduler_job_id, folder)
    return jid


# --- local executor -----------------------------------------------------------------------------

def test_local_job_status_logs_history(capsys):
    job = submit(capsys, "local")
    jid = job["id"]
    row = wait_status(capsys, jid, lambda r: r["state"] in TERMINAL, timeout_s=60)
    assert row["state"] == "COMPLETED", row
    assert (row["scheduler"], row["scheduler_job_id"], row["recipe"], row["cluster"], row["nodes"]) == \
        ("local", job["scheduler_job_id"], "tiny", "local", 1)
    assert row["elapsed_s"] is not None and row["job_folder"] == job["job_folder"]
    rec, transitions = record(jid)
    assert rec.state.value == "COMPLETED" and transitions[0] == "PREPARED" and transitions[-1] == "COMPLETED"

    # the table, from the same rows; without JOB it shows recent jobs too
    code, out, _ = jobctl(capsys, "status")
    assert code == 0 and f"#{jid}" in out and "COMPLETED" in out and "tiny" in out

    # logs: the node log the job wrote, by jobctl id and by scheduler id
    code, out, _ = jobctl(capsys, "logs", jid)
    assert code == 0
    assert [line for line in out.splitlines() if "loss" in line][-1].startswith("step   20")
    assert out == jobctl(capsys, "logs", f"local:{job['scheduler_job_id']}")[1]
    code, out, err = jobctl(capsys, "logs", f"#{jid}", "-f")  # already ended: prints and returns
    assert code == 0 and "tiny_train: done" in out
    code, out, err = jobctl(capsys, "logs", jid, "--node", 1)
    assert code == 2 and out == "" and f"job #{jid} has 1 node(s), so no node 1" in err

    # history: the sqlite rows only, filters
    rows = jobctl_json(capsys, "history")
    assert [r["id"] for r in rows] == [jid] and rows[0]["state"] == "COMPLETED"
    assert [r["id"] for r in jobctl_json(capsys, "history", "--recipe", "tiny", "--state", "completed",
                                         "--cluster", "local")] == [jid]
    assert jobctl_json(capsys, "history", "--state", "failed,cancelled") == []
    assert jobctl_json(capsys, "history", "--cluster", "dev") == []
    assert jobctl_json(capsys, "history", "--recipe", "llama70b") == []
    code, out, err = jobctl(capsys, "history", "--state", "bogus")
    assert code == 2 and "unknown job state 'bogus'" in err and "COMPLETED" in err
    code, out, _ = jobctl(capsys, "history")
    assert code == 0 and f"#{jid}" in out and "COMPLETED" in out


def test_logs_follow_until_the_job_ends(capsys, tmp_path):
    job = submit(capsys, "local", "train.steps=400")  # ~1.5 s of training
    p = subprocess_jobctl("logs", job["id"], "-f", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=90)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert "step  400" in out and "tiny_train: done" in out
    assert f"#{job['id']}: COMPLETED" in err and "Traceback" not in err
    assert record(job["id"])[0].state.value == "COMPLETED"  # -f recorded what it saw


def test_cancel_local_job_and_ctrl_c_while_following(capsys, tmp_path):
    job = submit(capsys, "local", LONG)
    jid, pid = job["id"], int(job["scheduler_job_id"])
    node_log = Path(job["job_folder"]) / "logs" / "node-0.log"
    wait_for(lambda: node_log.exists() and "step" in node_log.read_text(), 60, "the job to start training")
    assert jobctl_json(capsys, "status", jid)[0]["state"] == "RUNNING"

    # Ctrl-C while following: exit 130, nothing else said
    out_file = tmp_path / "follow.out"
    with open(out_file, "w") as f:
        # SIGINT as a terminal sends it (a shell's background job would inherit it ignored)
        p = subprocess_jobctl("logs", jid, "-f", stdout=f, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            wait_for(lambda: "loss" in out_file.read_text(), 60, "logs -f to print")
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=30)
        finally:
            p.kill()
    assert p.returncode == 130 and err == "", err

    code, out, err = jobctl(capsys, "cancel", jid)
    assert code == 0, err
    assert out == f"#{jid}\tCANCELLED\tcancelled\n"
    from jobctl.backends.local import alive as _alive

    wait_for(lambda: not _alive(pid), 30, "the controller to exit")
    size = node_log.stat().st_size
    time.sleep(1.0)
    assert node_log.stat().st_size == size, "the training process still writes after cancel"
    rec, transitions = record(jid)
    assert rec.state.value == "CANCELLED" and transitions[-1] == "CANCELLED"
    assert jobctl_json(capsys, "status", jid)[0]["state"] == "CANCELLED"  # not re-read as FAILED

    code, out, err = jobctl(capsys, "cancel", f"#{jid}")
    assert code == 0 and f"#{jid} already ended (CANCELLED)" in err and out == f"#{jid}\tCANCELLED\talready ended\n"


def test_cancel_local_job_submitted_with_sigint_ignored(capsys, tmp_path):
    """A job submitted from a script's background job inherits SIGINT ignored: its controller
    cannot be interrupted, so cancel has to stop the processes under it."""
    out_file, err_file = tmp_path / "submit.out", tmp_path / "submit.err"
    with open(out_file, "w") as out, open(err_file, "w") as err:  # files: the job inherits them
        p = subprocess_jobctl("submit", "recipes/tiny.yaml", "--cluster", "local", LONG, "--json",
                              stdout=out, stderr=err,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        assert p.wait(timeout=60) == 0, err_file.read_text()
    (job,) = json.loads(out_file.read_text())
    from jobctl.backends.local import alive as _alive
    from jobctl.backends.local import descendants as _descendants

    pid = int(job["scheduler_job_id"])
    node_log = Path(job["job_folder"]) / "logs" / "node-0.log"
    wait_for(lambda: node_log.exists() and "step" in node_log.read_text(), 60, "the job to start training")
    tree = [pid] + _descendants(pid)
    assert len(tree) >= 3  # controller, submitit task, the training command

    code, out, err = jobctl(capsys, "cancel", job["id"])
    assert code == 0 and out == f"#{job['id']}\tCANCELLED\tcancelled\n", err
    wait_for(lambda: not any(_alive(p) for p in tree), 30, "every process of the job to exit")
    assert record(job["id"])[0].state.value == "CANCELLED"


# --- errors, references, chains -------------------------------------------------------------------

def test_unknown_jobs_are_usage_errors(capsys):
    for argv in (["status", "7"], ["logs", "7"], ["cancel", "7"], ["status", "slurm:7"], ["logs", "x7"]):
        code, out, err = jobctl(capsys, *argv)
        assert code == 2 and out == "", argv
        assert err.startswith("error: "), err
    assert "the history is empty" in jobctl(capsys, "cancel", "7")[2]
    with History.open() as h:
        known = fake_job(h, scheduler="slurm", scheduler_job_id="424242", cluster="dev")
    code, out, err = jobctl(capsys, "cancel", known, 99)  # one unknown: nothing is cancelled
    assert code == 2 and "no job '99'" in err and "jobctl history" in err and f"#{known} (slurm 424242)" in err
    assert record(known)[0].state.value == "SUBMITTED"


def test_never_submitted_and_no_log_yet(capsys, tmp_path):
    folder = tmp_path / "job"
    (folder / "logs").mkdir(parents=True)
    with History.open() as h:
        prepared = fake_job(h)
        waiting = fake_job(h, scheduler_job_id="999999999", folder=folder)
    code, out, err = jobctl(capsys, "logs", prepared)
    assert code == 2 and "never submitted" in err
    code, out, err = jobctl(capsys, "cancel", prepared)
    assert code == 0 and "never submitted" in err and record(prepared)[0].state.value == "PREPARED"

    code, out, err = jobctl(capsys, "logs", waiting)
    assert code == 2 and out == ""
    assert f"no log yet for job #{waiting} node 0" in err
    assert str(folder / "logs" / "node-0.log") in err and "999999999_0_log.out" in err and "-f" in err

    # before the node log exists, submitit's own files are shown
    (folder / "999999999_0_log.out").write_text("submitit says hello\n")
    (folder / "999999999_0_log.err").write_text("submitit: starting\n")
    code, out, err = jobctl(capsys, "logs", waiting)
    assert code == 0 and out == "submitit says hello\nsubmitit: starting\n" and "showing submitit's" in err
    (folder / "logs" / "node-0.log").write_text("step 1 loss 3.0\n")
    assert jobctl(capsys, "logs", waiting)[1] == "step 1 loss 3.0\n"


def test_history_shows_attempt_chains_newest_first(capsys):
    with History.open() as h:
        first = fake_job(h, scheduler_job_id="11", folder=None)
        other = fake_job(h, recipe="other")
        second = fake_job(h, scheduler_job_id="12", parent_id=first)
        third = fake_job(h, parent_id=second)
    rows = jobctl_json(capsys, "history")
    assert [r["id"] for r in rows] == [third, second, other, first]
    by_id = {r["id"]: r for r in rows}
    assert by_id[first]["chain"] == by_id[third]["chain"] == [first, second, third]
    assert by_id[other]["chain"] == [] and by_id[third]["attempt"] == 3 and by_id[third]["parent_id"] == second
    code, out, _ = jobctl(capsys, "history")  # each job's place in its chain, compactly
    assert code == 0 and f"3 of #{first}" in out and f"1 of #{first}" in out
    code, out, _ = jobctl(capsys, "history", "--wide")  # the whole chain
    assert code == 0 and f"#{first} → #{second} → #{third}" in out
    assert [r["id"] for r in jobctl_json(capsys, "history", "--limit", 2)] == [third, second]
    assert [r["id"] for r in jobctl_json(capsys, "history", "--recipe", "other")] == [other]
    assert jobctl(capsys, "history", "--limit", -1)[0] == 2


def test_scheduler_failures_exit_5_and_record_nothing(capsys, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("sacct", 'echo "sacct: error: slurmdbd: connection refused" >&2; exit 1'),
                         ("scancel", 'echo "scancel: error: Unable to contact slurm controller" >&2; exit 1')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with History.open() as h:
        jid = fake_job(h, scheduler="slurm", scheduler_job_id="424242", cluster="dev", folder=tmp_path / "job")
    for argv in (["status"], ["status", jid], ["logs", jid, "-f"], ["cancel", jid]):
        code, out, err = jobctl(capsys, *argv)
        assert code == 5 and out == "" and "sacct failed" in err and "connection refused" in err, argv
    (bin_dir / "sacct").write_text("#!/bin/sh\nexit 0\n")  # answers, knows nothing
    code, out, err = jobctl(capsys, "cancel", jid)
    assert code == 5 and "scancel failed" in err and "Unable to contact" in err
    assert record(jid)[0].state.value != "CANCELLED"
    assert jobctl_json(capsys, "history")[0]["id"] == jid  # history asks no scheduler


# --- the real Slurm dev cluster -------------------------------------------------------------------

def sacct_state(job_id: str) -> str | None:
    p = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], capture_output=True, text=True,
                       timeout=60)
    rows = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    return rows[0] if rows else None


def test_slurm_job_status_logs_history(slurm_cluster, capsys):
    job = submit(capsys, "dev")
    jid, sid = job["id"], job["scheduler_job_id"]
    row = wait_status(capsys, jid, lambda r: r["state"] in TERMINAL)
    assert row["state"] == "COMPLETED", row
    assert (row["scheduler"], row["scheduler_job_id"], row["cluster"], row["nodes"]) == ("slurm", sid, "dev", 1)
    assert sacct_state(sid) == "COMPLETED"
    assert jobctl_json(capsys, "status", f"slurm:{sid}")[0]["id"] == jid

    code, out, _ = jobctl(capsys, "logs", jid)
    assert code == 0 and sum("loss" in line for line in out.splitlines()) == 20

    assert [r["id"] for r in jobctl_json(capsys, "history", "--cluster", "dev", "--state", "COMPLETED")] == [jid]
    assert jobctl_json(capsys, "history", "--cluster", "local") == []
    assert record(jid)[1][-1] == "COMPLETED"


def test_slurm_cancel(slurm_cluster, capsys):
    job = submit(capsys, "dev", LONG)
    jid, sid = job["id"], job["scheduler_job_id"]
    wait_status(capsys, jid, lambda r: r["state"] == "RUNNING" or r["state"] in TERMINAL)
    code, out, err = jobctl(capsys, "cancel", jid)
    assert code == 0, err
    assert out == f"#{jid}\tCANCELLED\tcancelled\n"
    wait_for(lambda: sacct_state(sid) == "CANCELLED", 60, f"sacct to show job {sid} CANCELLED")
    assert record(jid)[0].state.value == "CANCELLED"
    row = jobctl_json(capsys, "status", jid)[0]
    assert row["state"] == "CANCELLED"
    assert [r["id"] for r in jobctl_json(capsys, "history", "--state", "cancelled")] == [jid]
    code, out, err = jobctl(capsys, "cancel", sid)  # by its Slurm id: already ended
    assert code == 0 and "already ended" in err


def test_status_of_200_jobs_asks_sacct_once(slurm_cluster, capsys, tmp_path, monkeypatch):
    real = shutil.which("sacct")
    assert real, "sacct is not on PATH"
    bin_dir, calls = tmp_path / "bin", tmp_path / "sacct-calls"
    bin_dir.mkdir()
    wrapper = bin_dir / "sacct"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{calls}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with History.open() as h:
        ids = [fake_job(h, scheduler="slurm", scheduler_job_id=str(9_000_000 + i), cluster="dev") for i in range(200)]

    rows = jobctl_json(capsys, "status")
    assert sorted(r["id"] for r in rows) == sorted(ids)
    lines = calls.read_text().splitlines()
    assert len(lines) == 1, lines
    args = lines[0].split()
    assert args[args.index("-j") + 1].count(",") == 199 and "-S" in args  # bounded by the submit time
    assert {r["state"] for r in rows} == {"PENDING"}  # sacct has no rows for made-up ids

    calls.unlink()
    code, out, _ = jobctl(capsys, "status")  # the table: the same single query
    assert code == 0 and out.count("PENDING") == 200 and len(calls.read_text().splitlines()) == 1
    calls.unlink()
    jobctl_json(capsys, "history")  # history never asks the scheduler
    assert not calls.exists()


def test_status_west_of_utc(slurm_cluster, capsys, monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        job = submit(capsys, "dev")
        row = wait_status(capsys, job["id"], lambda r: r["state"] in TERMINAL, timeout_s=60)
        assert row["state"] == "COMPLETED"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
