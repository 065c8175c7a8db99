"""`jobctl watch` and `jobctl report` on job folders built from real parts: plan.json from a real
`jobctl plan --json` (and `--after-oom` for the OOM chain), GPU CSVs written by the sampler's own
writer, outcome records by runtime.outcome.write_outcome from a real CUDA OOM log, hooks' JSONL lines,
history rows in a fresh JOBCTL_HOME; and a real local-executor job. Numbers are checked against
values worked out by hand here."""

from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobctl import cli  # this checkout's, whatever `pip install -e` points at (pyproject.toml: pythonpath)
from jobctl.model import RetryPolicy
from jobctl.runtime.outcome import write_outcome
from jobctl.runtime.sampler import COLUMNS, GPUSampler, sample_rows
from jobctl.store.folder import JobFolder
from jobctl.store.history import History

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
OOM_LOG = REPO / "tests" / "data" / "failures" / "cuda_oom--torch2x-h100-torchrun.txt"
T0 = datetime(2026, 11, 21, 9, 0, 0, tzinfo=timezone.utc)

# the repository root, a fresh JOBCTL_HOME (tmp_path / "home"), no wrapping by rich
pytestmark = pytest.mark.usefixtures("repo_cli_home")


def jobctl(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def plan_report(capsys, tmp_path, name: str, *argv) -> dict:
    """A real `jobctl plan ... --json` report (the object submit writes to plan.json)."""
    code, out, err = jobctl(capsys, "plan", *argv, "--json")
    assert code == 0, err
    (tmp_path / f"{name}.json").write_text(out)
    return json.loads(out)


# --- building job folders -------------------------------------------------------------------------

def add_job(h: History, home: Path, report: dict, *, recipe: str, scheduler: str = "slurm",
            scheduler_job_id: str = "4242", parent_id: int | None = None, attempt: int = 1) -> tuple[int, Path]:
    """A submitted job as submit_all leaves it: a history row and a folder with plan.json and job.json."""
    jid = h.prepare(recipe_name=recipe, recipe_text=f"name: {recipe}\n", plan=report["plan"], cluster=report["cluster"],
                    partition=report["partition"], scheduler=scheduler, parent_id=parent_id,
                    predicted_peak_bytes=report["memory"]["total_bytes"])
    folder = home / "jobs" / f"{jid}-{recipe}"
    (folder / "logs").mkdir(parents=True)
    (folder / "plan.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "job.json").write_text(json.dumps({
        "jobctl_id": jid, "cluster": report["cluster"], "partition": report["partition"], "scheduler": scheduler,
        "attempt": attempt, "parent_id": parent_id, "policy": RetryPolicy().to_dict()}, indent=2) + "\n")
    h.mark_submitted(jid, scheduler_job_id, str(folder))
    h.transition(jid, "SUBMITTED")
    if scheduler == "local":  # the controller's pid and start time, as the local backend records them
        from jobctl.backends.local import start_time

        (folder / "submitit.json").write_text(json.dumps({
            "job_id": scheduler_job_id, "submitit_folder": str(folder),
            "controller_start": start_time(int(scheduler_job_id))}) + "\n")
    return jid, folder


def reading(gpu: int, used_gib: float, total_bytes: int, name: str) -> dict:
    return {"gpu": gpu, "name": name, "memory_used_bytes": int(used_gib * GIB), "memory_total_bytes": total_bytes,
            "utilization_pct": 97.0, "power_w": 280.5, "temperature_c": 61.0}


def write_csv(path: Path, node: int, samples: list[list[dict]], every_s: float = 10.0) -> None:
    """A sampler CSV with these readings (one list per sample), every_s apart from T0: the
    sampler's own header and row function."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for i, readings in enumerate(samples):
            at = (T0 + timedelta(seconds=i * every_s)).isoformat(timespec="milliseconds")
            w.writerows(sample_rows(readings, node, at, 1000.0 + i * every_s))


def run_sampler(path: Path, node: int, samples: list[list[dict]]) -> None:
    """Write a CSV with the real GPUSampler thread, its backend replaying `samples`."""
    script = list(samples)
    done = threading.Event()

    def backend():
        if not script:
            done.set()
            return []  # no GPU rows: nothing more is written
        return script.pop(0)

    sampler = GPUSampler(path, interval_s=0.005, node_rank=node, backend=backend)
    sampler.start()
    assert done.wait(10), "the sampler did not replay its readings"
    assert sampler.stop(5)
    assert sampler.errors == 0


def hooks_lines(folder: Path, rank: int, reserved_gib: list[float]) -> None:
    """memory/rank-<N>.jsonl as jobctl.runtime.hooks writes it: installed, then one line per interval."""
    path = folder / "memory" / f"rank-{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"event": "installed", "time_s": 1.0, "rank": rank, "local_rank": rank % 4, "pid": 100 + rank,
              "interval_steps": 50, "memory_snapshot": False, "snapshot_max_entries": None}]
    for i, r in enumerate(reserved_gib):
        lines.append({"event": "step", "time_s": 2.0 + i, "rank": rank, "local_rank": rank % 4, "pid": 100 + rank,
                      "step": i * 50, "device": rank % 4, "max_memory_allocated_bytes": int((r - 1) * GIB),
                      "max_memory_reserved_bytes": int(r * GIB), "memory_allocated_bytes": int((r - 2) * GIB),
                      "memory_reserved_bytes": int(r * GIB)})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "step", "rank"')  # torn last line


def oom_outcome(folder: Path, job_id: str) -> dict:
    """The first node's outcome record after a real CUDA OOM log, written by runtime.outcome.write_outcome
    (as the file holds it)."""
    text = OOM_LOG.read_text()
    (folder / "logs" / "node-0.log").write_text(text[text.index("#---\n") + 5:])
    return write_outcome(JobFolder(folder), 0, 1, None, 312.5, ["python", "train.py"], job_id).to_dict()


def successor_json(folder: Path, child_id: int, child_folder: Path, failure: dict) -> None:
    """What recover._submit_successor writes after submitting the next attempt."""
    (folder / "successor.json").write_text(json.dumps({
        "jobctl_id": child_id, "scheduler_job_id": "x", "job_folder": str(child_folder), "rung": "micro-batch",
        "reason": "micro_batch_size halved", "failure": failure}, indent=2) + "\n")


# --- report: numbers ---------------------------------------------------------------------------------

def test_report_compares_measured_peaks_with_the_prediction(capsys, tmp_path):
    # Llama 3.1 8B on A10G nodes, tp 4 x dp 2 (pp and cp 1): 2 nodes x 4 GPUs (a real plan).
    rep = plan_report(capsys, tmp_path, "plan", "recipes/llama8b.yaml", "--cluster", "a10g",
                      "parallelism.tp=4", "parallelism.dp=2", "parallelism.pp=1", "parallelism.cp=1")
    assert (rep["plan"]["nodes"], rep["plan"]["gpus_per_node"]) == (2, 4)
    predicted = rep["memory"]["total_bytes"]
    context = next(t["bytes"] for t in rep["memory"]["terms"] if t["name"] == "cuda context")
    home = Path(os.environ["JOBCTL_HOME"])
    total = 24 * GIB  # A10G
    # Peaks by hand (GiB): node 0: 17.00 17.25 17.50 17.75; node 1: 16.50 16.75 17.00 18.25.
    peaks = {0: [17.0, 17.25, 17.5, 17.75], 1: [16.5, 16.75, 17.0, 18.25]}
    with History.open() as h:
        jid, folder = add_job(h, home, rep, recipe="llama8b")
        h.transition(jid, "RUNNING")
        h.transition(jid, "COMPLETED")
        for node, node_peaks in peaks.items():
            samples = [[reading(g, 4.0, total, "NVIDIA A10G") for g in range(4)],
                       [reading(g, p, total, "NVIDIA A10G") for g, p in enumerate(node_peaks)],
                       [reading(g, p - 1.0, total, "NVIDIA A10G") for g, p in enumerate(node_peaks)]]
            run_sampler(folder / "gpu" / f"node-{node}.csv", node, samples)
        with open(folder / "gpu" / "node-1.csv", "a") as f:
            f.write("2026-11-21T09:10:00.000+00:00,123.0,1,3,NVIDIA A10G,99999")  # cut short by a crash
        # Hooks, rank k: 14 GiB then 15 + k/8 GiB reserved; rank 7: 15.875 GiB.
        for rank in range(8):
            hooks_lines(folder, rank, [14.0, 15.0 + rank / 8])

    code, out, err = jobctl(capsys, "report", jid, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["predicted_peak_bytes"] == predicted
    assert r["gpu_usable_bytes"] == rep["memory"]["gpu_usable_bytes"]
    assert [(g["node"], g["gpu"]) for g in r["gpus"]] == [(n, g) for n in (0, 1) for g in range(4)]
    assert all(g["samples"] == 3 for g in r["gpus"])  # the torn row is not one
    by = {(g["node"], g["gpu"]): g for g in r["gpus"]}
    assert by[(1, 3)]["peak_bytes"] == 19_595_788_288  # 18.25 GiB
    assert by[(0, 0)]["peak_bytes"] == 18_253_611_008  # 17.00 GiB
    assert by[(0, 2)]["latest_bytes"] == 17_716_740_096  # 16.50 GiB, the last sample
    assert by[(1, 3)]["error_pct"] == pytest.approx((predicted - 19_595_788_288) / 19_595_788_288 * 100, abs=0.005)
    assert by[(0, 0)]["error_pct"] == pytest.approx((predicted - 18_253_611_008) / 18_253_611_008 * 100, abs=0.005)
    assert by[(1, 3)]["usable_pct"] == pytest.approx(19_595_788_288 / rep["memory"]["gpu_usable_bytes"] * 100, abs=0.005)
    assert r["measured_peak"]["bytes"] == 19_595_788_288
    assert r["measured_peak"]["where"] == "node 1 gpu 3"
    # Hooks: compared with the prediction less the CUDA context (the allocator does not see it).
    assert r["predicted_allocator_bytes"] == predicted - context
    assert [x["rank"] for x in r["ranks"]] == list(range(8))
    top = r["ranks"][7]
    assert top["max_memory_reserved_bytes"] == 17_045_651_456  # 15.875 GiB
    assert top["max_memory_allocated_bytes"] == 15_971_909_632  # 14.875 GiB
    assert top["error_pct"] == pytest.approx((predicted - context - 17_045_651_456) / 17_045_651_456 * 100, abs=0.005)
    assert r["chain_text"] == f"#{jid} COMPLETED"
    # The largest measured figure (sampler 18.25 GiB > hooks 15.875 GiB) is now in the history.
    with History.open() as h:
        assert h.get(jid).measured_peak_bytes == 19_595_788_288

    code, out, err = jobctl(capsys, "report", f"#{jid}")
    assert code == 0, err
    err_pct = (predicted - 19_595_788_288) / 19_595_788_288 * 100
    assert "18.25" in out and "NVIDIA A10G" in out and f"{err_pct:+.1f} %" in out
    assert "measured peak 18.25 GiB (sampler, node 1 gpu 3)" in out
    assert "15.88" in out  # rank 7's reserved peak, GiB to 2 places


# --- the OOM chain ------------------------------------------------------------------------------------

@pytest.fixture
def oom_chain(capsys, tmp_path):
    """#1 (mbs 4) CUDA OOM -> #2 (mbs 2) CUDA OOM -> #3 (mbs 1) COMPLETED, Llama 2 7B LoRA on one
    H100, each plan from `jobctl plan` (--after-oom for the next rung), as recovery leaves them."""
    recipe = ["recipes/llama2-7b-24gb.yaml", "--cluster", "h100"]
    p1 = plan_report(capsys, tmp_path, "p1", *recipe, "--objective", "gpus")  # one GPU
    p2 = plan_report(capsys, tmp_path, "p2", *recipe, "--after-oom", tmp_path / "p1.json")
    p3 = plan_report(capsys, tmp_path, "p3", *recipe, "--after-oom", tmp_path / "p2.json")
    assert [p["plan"]["micro_batch_size"] for p in (p1, p2, p3)] == [4, 2, 1]
    home = Path(os.environ["JOBCTL_HOME"])
    total = 80 * GIB
    peaks_gib = [79.3, 76.1, 27.4]  # the two OOMs ran into the 80 GB; the last fits
    with History.open() as h:
        ids, folders, outcome = [], [], None
        for i, (plan, peak) in enumerate(zip((p1, p2, p3), peaks_gib)):
            jid, folder = add_job(h, home, plan, recipe="llama2-7b-24gb", scheduler_job_id=str(5000 + i),
                                  parent_id=ids[-1] if ids else None, attempt=i + 1)
            h.transition(jid, "RUNNING")
            write_csv(folder / "gpu" / "node-0.csv", 0,
                      [[reading(0, 1.2 + (peak - 1.2) * min(1.0, k / 20), total, "NVIDIA H100 80GB HBM3")]
                       for k in range(40)])
            if ids:  # the parent's first node submitted this attempt
                successor_json(folders[-1], jid, folder, outcome["failure"])
            if i < 2:
                outcome = oom_outcome(folder, str(5000 + i))
                assert outcome["failure"]["kind"] == "CUDA_OOM"
                h.transition(jid, "FAILED", "CUDA out of memory", failure_kind="CUDA_OOM")
            else:
                write_outcome(JobFolder(folder), 0, 0, None, 900.0, ["python", "train.py"], str(5000 + i))
                h.transition(jid, "COMPLETED")
            ids.append(jid)
            folders.append(folder)
    return ids, folders, (p1, p2, p3), peaks_gib


def test_watch_once_shows_the_chain(capsys, oom_chain):
    ids, _, plans, _ = oom_chain
    chain = f"#{ids[0]} → #{ids[1]} (OOM, mbs 4→2) → #{ids[2]} (OOM, mbs 2→1) COMPLETED"
    code, out, err = jobctl(capsys, "watch", ids[0], "--once")
    assert code == 0, err
    assert chain in out
    assert f"#{ids[2]} llama2-7b-24gb COMPLETED" in out  # it followed the chain to its end
    assert "chain ended: COMPLETED" in out
    assert "27.40" in out  # the last attempt's peak, GiB

    code, out, err = jobctl(capsys, "watch", ids[1], "--json")
    assert code == 0, err
    snap = json.loads(out)
    assert snap["chain_text"] == chain
    assert snap["watching"] == ids[1] and snap["job"]["id"] == ids[2]
    assert (snap["ended"], snap["completed"], snap["recovering"]) == (True, True, False)
    assert [a["failure"]["kind"] if a["failure"] else None for a in snap["chain"]] == ["CUDA_OOM", "CUDA_OOM", None]
    (node,) = snap["memory"]["nodes"]
    assert node["peak_bytes"] == int(27.4 * GIB) and node["gpu_count"] == 1
    assert snap["memory"]["predicted_peak_bytes"] == plans[2]["memory"]["total_bytes"]


def test_report_on_the_chain_records_each_measured_peak(capsys, oom_chain):
    ids, _, plans, peaks_gib = oom_chain
    code, out, err = jobctl(capsys, "report", ids[1], "--json")
    assert code == 0, err
    r = json.loads(out)
    assert [a["id"] for a in r["chain"]] == ids
    assert [a["label"] for a in r["chain"]] == [None, "OOM, mbs 4→2", "OOM, mbs 2→1"]
    assert [a["measured_peak_bytes"] for a in r["chain"]] == [int(p * GIB) for p in peaks_gib]
    for a, plan, peak in zip(r["chain"], plans, peaks_gib):
        p = plan["memory"]["total_bytes"]
        assert a["predicted_peak_bytes"] == p
        assert a["error_pct"] == pytest.approx((p - int(peak * GIB)) / int(peak * GIB) * 100, abs=0.005)
    assert r["chain"][0]["failure"]["summary"].startswith("CUDA_OOM on GPU 0: tried to allocate 3.91 GiB")
    with History.open() as h:
        assert [h.get(i).measured_peak_bytes for i in ids] == [int(p * GIB) for p in peaks_gib]
    code, out, err = jobctl(capsys, "report", ids[2])
    assert code == 0, err
    assert "Attempts" in out and "CUDA_OOM" in out and "tp1 pp1 dp1 cp1 none mbs4x4" in out


def test_watch_live_view_in_a_terminal(oom_chain):
    """Without --once and on a terminal: rich's Live view; the chain has ended, so it draws once
    and exits 0."""
    import pty

    ids, *_ = oom_chain
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="160", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "jobctl", "watch", str(ids[0])], cwd=REPO, env=env,
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=30) == 0
    text = b"".join(chunks).decode("utf-8", "replace")
    assert f"#{ids[1]} (OOM, mbs 4→2)" in text and "chain ended: COMPLETED" in text


# --- following a live chain --------------------------------------------------------------------------

def test_follow_switches_to_the_successor_and_exits_with_the_chain(capsys, tmp_path):
    """Local jobs whose scheduler ids are real processes: the first dies of an OOM, the view
    waits for recovery, moves to the successor, and ends when that one completes."""
    from jobctl.jobs.watch import follow

    p1 = plan_report(capsys, tmp_path, "t1", "recipes/tiny.yaml", "--cluster", "local")
    p2 = plan_report(capsys, tmp_path, "t2", "recipes/tiny.yaml", "--cluster", "local", "--after-oom",
                     tmp_path / "t1.json")
    home = Path(os.environ["JOBCTL_HOME"])
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        with History.open() as h:
            first, folder1 = add_job(h, home, p1, recipe="tiny", scheduler="local", scheduler_job_id=str(procs[0].pid))
            seen, ticks = [], []

            def tick(interval_s):
                ticks.append(interval_s)
                if len(ticks) == 1:  # the first attempt dies of a CUDA OOM
                    oom_outcome(folder1, str(procs[0].pid))
                    procs[0].kill()
                    procs[0].wait()
                elif len(ticks) == 2:  # its first node submits the next attempt
                    second, folder2 = add_job(h, home, p2, recipe="tiny", scheduler="local",
                                              scheduler_job_id=str(procs[1].pid), parent_id=first, attempt=2)
                    successor_json(folder1, second, folder2, json.loads((folder1 / "outcome-node0.json").read_text())["failure"])
                    seen.append(folder2)
                elif len(ticks) == 3:  # which completes: submitit's result pickle
                    with open(seen[0] / f"{procs[1].pid}_0_result.pkl", "wb") as f:
                        pickle.dump(("success", None), f)
                else:
                    raise AssertionError("the view did not end")

            snaps = []
            code = follow(h, h.get(first), 0.25, snaps.append, sleep=tick)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert code == 0 and ticks == [0.25] * 3
    texts = [s["chain_text"] for s in snaps]
    assert texts == [f"#{first} RUNNING", f"#{first} FAILED", f"#{first} → #{first + 1} (OOM, mbs 8→4) RUNNING",
                     f"#{first} → #{first + 1} (OOM, mbs 8→4) COMPLETED"]
    assert [s["recovering"] for s in snaps] == [False, True, False, False]
    assert [s["ended"] for s in snaps] == [False, False, False, True]
    assert snaps[0]["memory"]["no_samples"] == "no GPU samples yet"


def test_follow_ctrl_c_exits_130_quietly(capsys, tmp_path):
    from jobctl.jobs.watch import follow

    p1 = plan_report(capsys, tmp_path, "t1", "recipes/tiny.yaml", "--cluster", "local")
    home = Path(os.environ["JOBCTL_HOME"])
    proc = subprocess.Popen(["sleep", "60"])
    try:
        with History.open() as h:
            jid, _ = add_job(h, home, p1, recipe="tiny", scheduler="local", scheduler_job_id=str(proc.pid))

            def interrupt(_):
                raise KeyboardInterrupt

            snaps = []
            assert follow(h, h.get(jid), 2.0, snaps.append, sleep=interrupt) == 130
    finally:
        proc.kill()
        proc.wait()
    assert len(snaps) == 1 and snaps[0]["job"]["state"] == "RUNNING"
    assert capsys.readouterr().err == ""


def test_scheduler_errors_end_a_snapshot_but_not_the_live_view(capsys, monkeypatch, tmp_path):
    """sacct failing for real (a slurm.conf without a controller): --once exits 5; the live view
    says so and keeps the recorded state."""
    from jobctl.jobs.watch import follow

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\n")  # no SlurmctldHost: sacct fails at once
    monkeypatch.setenv("SLURM_CONF", str(conf))
    rep = plan_report(capsys, tmp_path, "plan", "recipes/tiny.yaml", "--cluster", "dev")
    home = Path(os.environ["JOBCTL_HOME"])
    with History.open() as h:
        jid, _ = add_job(h, home, rep, recipe="tiny", scheduler_job_id="777")
    code, out, err = jobctl(capsys, "watch", jid, "--once")
    assert code == 5 and out == "" and "sacct" in err

    def interrupt(_):
        raise KeyboardInterrupt

    snaps = []
    with History.open() as h:
        assert follow(h, h.get(jid), 2.0, snaps.append, sleep=interrupt) == 130
    (snap,) = snaps
    assert "sacct" in snap["scheduler_error"] and snap["job"]["state"] == "SUBMITTED" and not snap["ended"]


def test_watch_without_job_picks_the_newest_active_one(capsys, tmp_path):
    code, out, err = jobctl(capsys, "watch")
    assert (code, out) == (0, "") and "no active job" in err
    p1 = plan_report(capsys, tmp_path, "t1", "recipes/tiny.yaml", "--cluster", "local")
    home = Path(os.environ["JOBCTL_HOME"])
    proc = subprocess.Popen(["sleep", "60"])
    try:
        with History.open() as h:
            add_job(h, home, p1, recipe="tiny", scheduler="local", scheduler_job_id=str(proc.pid))
            newest, _ = add_job(h, home, p1, recipe="tiny", scheduler="local", scheduler_job_id=str(proc.pid))
            add_job(h, home, p1, recipe="tiny", scheduler="local", scheduler_job_id="999999999")
        code, out, err = jobctl(capsys, "watch", "--json")  # the last one's process is gone: FAILED
    finally:
        proc.kill()
        proc.wait()
    assert code == 0, err
    snap = json.loads(out)
    assert snap["job"]["id"] == newest and snap["job"]["state"] == "RUNNING" and not snap["ended"]
    code, _, err = jobctl(capsys, "watch", "#99")
    assert code == 2 and "no job #99" in err


# --- the plot -------------------------------------------------------------------------------------

def test_report_plot_draws_memory_over_time(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the optional `plot` extra) is not installed")
    rep = plan_report(capsys, tmp_path, "plan", "recipes/llama8b.yaml", "--cluster", "a10g",
                      "parallelism.tp=4", "parallelism.dp=2")
    home = Path(os.environ["JOBCTL_HOME"])
    with History.open() as h:
        jid, folder = add_job(h, home, rep, recipe="llama8b")
        h.transition(jid, "RUNNING")
    # 15 minutes, a sample every 10 s: load, warm-up, then steps that breathe by 0.6 GiB.
    for node in (0, 1):
        samples = []
        for k in range(90):
            row = []
            for g in range(4):
                level = 0.5 if k < 3 else 9.0 if k < 8 else 16.2 + 0.25 * g - 0.4 * node
                row.append(reading(g, level + (0.6 if k >= 8 and k % 3 == 0 else 0.0), 24 * GIB, "NVIDIA A10G"))
            samples.append(row)
        write_csv(folder / "gpu" / f"node-{node}.csv", node, samples)
    png = tmp_path / "mem.png"
    code, _, err = jobctl(capsys, "report", jid, "--plot", png)
    assert code == 0, err
    assert f"plot written to {png}" in err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    keep = os.environ.get("JOBCTL_TEST_KEEP_PLOT")  # to look at it: JOBCTL_TEST_KEEP_PLOT=/tmp/x.png
    if keep:
        Path(keep).write_bytes(data)


def test_report_plot_without_matplotlib_says_how_to_install(capsys, monkeypatch, oom_chain):
    ids, *_ = oom_chain
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    code, out, err = jobctl(capsys, "report", ids[0], "--plot", "never.png")
    assert code == 2 and out == ""
    assert "matplotlib" in err and "pip install 'jobctl[plot]'" in err
    assert not Path("never.png").exists()


# --- a real local job --------------------------------------------------------------------------------

def test_real_local_job_report_and_watch_say_there_is_no_gpu(capsys, tmp_path):
    code, out, err = jobctl(capsys, "submit", "recipes/tiny.yaml", "--cluster", "local", "--wait", "--json")
    assert code == 0, err
    (job,) = json.loads(out)
    jid = job["id"]

    code, out, err = jobctl(capsys, "report", jid)
    assert code == 0, err
    assert "no GPU samples: node-0: gpu-sampler: no GPU found" in out
    assert f"#{jid} COMPLETED" in out and "nothing measured" in out
    code, out, err = jobctl(capsys, "report", jid, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["gpus"] == [] and r["measured_peak"] is None and r["chain_text"] == f"#{jid} COMPLETED"
    assert r["predicted_peak_bytes"] > 0
    if _has_matplotlib():
        code, out, err = jobctl(capsys, "report", jid, "--plot", tmp_path / "cpu.png")
        assert code == 0 and "no plot written" in err and not (tmp_path / "cpu.png").exists()

    code, out, err = jobctl(capsys, "watch", jid, "--once")
    assert code == 0, err
    assert "no GPU samples (node-0: gpu-sampler: no GPU found" in out
    assert "chain ended: COMPLETED" in out
    with History.open() as h:
        assert h.get(jid).measured_peak_bytes is None


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_sampler_tail_reads_only_what_the_csv_gained(tmp_path):
    """watch reads the CSVs incrementally; a line still being written waits for the next poll."""
    from jobctl.jobs.memory import SamplerTail

    path = tmp_path / "gpu" / "node-0.csv"
    total = 80 * GIB
    write_csv(path, 0, [[reading(0, 10.0, total, "H100"), reading(1, 12.0, total, "H100")],
                        [reading(0, 30.0, total, "H100"), reading(1, 11.0, total, "H100")]])
    tail = SamplerTail(JobFolder(tmp_path))
    first = tail.update()
    assert [(g["gpu"], g["samples"], g["latest_bytes"], g["peak_bytes"]) for g in first] == \
        [(0, 2, 30 * GIB, 30 * GIB), (1, 2, 11 * GIB, 12 * GIB)]
    rows = sample_rows([reading(0, 20.0, total, "H100"), reading(1, 40.0, total, "H100")], 0,
                       "2026-11-21T09:01:00.000+00:00", 1060.0)
    with open(path, "a", newline="") as f:
        csv.writer(f).writerow(rows[0])
        f.write(",".join(map(str, rows[1]))[:25])  # gpu 1's row, half written
    second = tail.update()
    assert [(g["gpu"], g["samples"], g["latest_bytes"], g["peak_bytes"]) for g in second] == \
        [(0, 3, 20 * GIB, 30 * GIB), (1, 2, 11 * GIB, 12 * GIB)]
    with open(path, "a", newline="") as f:
        f.write(",".join(map(str, rows[1]))[25:] + "\r\n")  # the rest of it
    third = tail.update()
    assert [(g["gpu"], g["samples"], g["latest_bytes"], g["peak_bytes"]) for g in third] == \
        [(0, 3, 20 * GIB, 30 * GIB), (1, 3, 40 * GIB, 40 * GIB)]
    assert third[1]["peak_at"] == "2026-11-21T09:01:00.000+00:00"
