"""`jobctl requeue` (the OOM ladder by hand) on real local and Slurm jobs, and what `jobctl plan`
learns from a real sqlite history: warnings for layouts like one that already ran out of GPU
memory, and the memory model's error from measured peaks. A fresh JOBCTL_HOME per test."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from jobctl import cli
from jobctl.planning import learn
from jobctl.store.history import History, default_path

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30


@pytest.fixture(autouse=True)
def _env(repo_cli_home):
    # conftest.py's repo_cli_home: the repository root, a fresh JOBCTL_HOME, no wrapping by rich
    yield
    _stop_leftovers()


def _stop_leftovers() -> None:
    """After a failed test: stop what it really submitted and left running."""
    if not default_path().exists():
        return
    from jobctl.backends.local import LocalBackend

    with History.open() as h:
        records = [r for r in h.list() if r.job_folder and not r.terminal]
    for r in records:
        if r.scheduler == "local":
            LocalBackend().cancel([r])
    slurm = [r.scheduler_job_id for r in records if r.scheduler == "slurm"]
    if slurm and shutil.which("scancel"):
        subprocess.run(["scancel", *slurm], capture_output=True, timeout=60, check=False)


def jobctl(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def rows() -> list[dict]:
    with History.open() as h:
        return [r.to_dict() | {"plan": r.plan} for r in reversed(h.list())]


# --- requeue --------------------------------------------------------------------------------------

def test_requeue_smaller_then_same_of_a_finished_local_job(capsys, tmp_path):
    code, _, err = jobctl(capsys, "submit", "recipes/tiny.yaml", "--cluster", "local", "--wait")
    assert code == 0, err
    (first,) = rows()
    # The planner's plan for tiny on this machine: the whole global batch of 8 in one
    # micro-batch on one "GPU" (dp 1, no accumulation).
    assert (first["plan"]["micro_batch_size"], first["plan"]["grad_accum_steps"], first["plan"]["dp"]) == (8, 1, 1)

    code, out, err = jobctl(capsys, "requeue", first["id"], "--smaller", "--wait", "--json")
    assert code == 0, err
    new = json.loads(out)
    # The micro-batch rung: the largest micro-batch at most half the failed one that divides the
    # batch per dp rank (8 / dp 1 = 8): 4; accumulation keeps the global batch: 8 / (4 x dp 1) = 2.
    assert (new["plan"]["micro_batch_size"], new["plan"]["grad_accum_steps"]) == (4, 2)
    assert new["plan"]["global_batch_size"] == 8 and new["rung"] == "micro-batch"
    assert (new["parent_id"], new["attempt"]) == (first["id"], 2)
    second = rows()[1]
    assert second["id"] == new["jobctl_id"] and second["state"] == "COMPLETED"
    assert (second["parent_id"], second["attempt"], second["plan"]) == (first["id"], 2, new["plan"])
    job_json = json.loads((Path(second["job_folder"]) / "job.json").read_text())
    assert (job_json["parent_id"], job_json["attempt"]) == (first["id"], 2)
    assert "micro-batch 4 x accumulation 2" in (Path(second["job_folder"]) / "logs" / "node-0.log").read_text()

    # Without --smaller: the same plan again as attempt 3; the table output names the new job.
    code, out, err = jobctl(capsys, "requeue", f"#{second['id']}")
    assert code == 0, err
    third = rows()[2]
    assert out.split("\t")[0] == f"#{third['id']}"
    assert f"attempt 3, parent #{second['id']}; the same plan" in err
    assert (third["parent_id"], third["attempt"], third["plan"]) == (second["id"], 3, second["plan"])
    with History.open() as h:
        assert [r.id for r in h.chain(first["id"])] == [first["id"], second["id"], third["id"]]


def test_requeue_at_the_bottom_of_the_ladder_exits_3(capsys, tmp_path):
    """A job whose plan is the ladder's last one: nothing smaller, exit 3, nothing submitted."""
    from jobctl.jobs.submission import prepare, write_folder
    from jobctl.planning import load_request, plan_on
    from jobctl.planning.oom import after_oom
    from jobctl.store.folder import JobFolder

    rec, (inv,) = load_request("recipes/tiny.yaml", [], ["local"])
    report = plan_on(rec, inv).to_dict()
    while True:  # step down as far as the ladder goes
        nxt = after_oom(rec, inv, report["plan"], partition=report["partition"])
        if not nxt.feasible:
            break
        report = nxt.to_dict()
    sub = prepare(rec, inv, report)
    with History.open() as h:
        jid = h.prepare(recipe_name=sub.recipe_name, recipe_text=sub.recipe_text, plan=sub.plan, cluster="local",
                        scheduler="local", partition=sub.partition, predicted_peak_bytes=report["memory"]["total_bytes"])
        folder = JobFolder.create(tmp_path, jid, "tiny")
        write_folder(sub, folder, jid)
        h.mark_submitted(jid, "999999", folder.path)
        h.transition(jid, "FAILED", failure_kind="CUDA_OOM")
    code, out, err = jobctl(capsys, "requeue", jid, "--smaller", "--tried-to-allocate", "0.5")
    assert code == 3 and out == ""
    assert "the ladder is at its bottom" in err
    assert len(rows()) == 1


def test_requeue_of_a_running_job_is_refused(capsys):
    code, out, err = jobctl(capsys, "submit", "recipes/tiny.yaml", "--cluster", "local", "train.steps=100000",
                            "--json")
    assert code == 0, err
    (job,) = json.loads(out)
    code, out, err = jobctl(capsys, "requeue", job["id"], "--smaller")
    assert code == 2 and f"job #{job['id']} is RUNNING: requeueing it would run it twice" in err
    assert f"jobctl cancel {job['id']}" in err and len(rows()) == 1
    assert jobctl(capsys, "cancel", job["id"])[0] == 0


def test_requeue_unknown_job_and_bad_options_exit_2(capsys):
    code, out, err = jobctl(capsys, "requeue", "42")
    assert code == 2 and out == "" and "no job '42'" in err and "the history is empty" in err
    code, out, err = jobctl(capsys, "requeue", "#42", "--tried-to-allocate", "2")
    assert code == 2 and "--tried-to-allocate goes with --smaller" in err
    with History.open() as h:  # recorded but never submitted: no job folder to take
        jid = h.prepare(recipe_name="tiny", recipe_text="name: tiny\n", plan={"nodes": 1}, cluster="local",
                        scheduler="local")
    code, out, err = jobctl(capsys, "requeue", jid, "--smaller")
    assert code == 2 and f"job #{jid} has no job folder" in err


def oom_recipe(tmp_path: Path, budget: int) -> Path:
    """tests/test_recovery_e2e.py's recipe: Llama 3.2 1B on one (fake) H100, planned at
    micro-batch 8; the payload fails as PyTorch does on CUDA OOM above `budget` sequences."""
    import yaml

    doc = {
        "name": "oom-test", "model": "llama3.2-1b",
        "train": {"seq_len": 2048, "global_batch_size": 16, "precision": "bf16-mixed", "attention": "sdpa"},
        "framework": "generic",
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "dp": 1, "recompute": "none", "offload": "none"},
        "resources": {"time": "00:05:00"},
        "launch": {"launcher": "none", "command": ["python", str(REPO / "tests" / "payloads" / "oom_payload.py")],
                   "env": {"OOM_MAX_MICRO_BATCH": str(budget)}},
    }
    path = tmp_path / "oom.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_requeue_smaller_after_a_cuda_oom_on_slurm(slurm_cluster, capsys, monkeypatch, tmp_path):
    """A real Slurm job OOMs (its own recovery turned off); `requeue --smaller` steps down with
    the figures of its outcome record, and the new job completes. Then a scheduler failure."""
    from jobctl.jobs.recovery import failure_figures
    from jobctl.planning import load_request
    from jobctl.planning.oom import after_oom
    from jobctl.runtime.outcome import read_outcomes
    from jobctl.store.folder import JobFolder

    code, _, err = jobctl(capsys, "submit", oom_recipe(tmp_path, budget=4), "--cluster", "dev",
                          "--retry", "CUDA_OOM=none", "--wait", "--json")  # quiet: the job's log has PyTorch's traceback
    assert code == 4, err  # --wait: the job failed
    (first,) = rows()
    assert first["state"] == "FAILED" and first["plan"]["micro_batch_size"] == 8
    folder = Path(first["job_folder"])
    figures = failure_figures(read_outcomes(JobFolder(folder)))
    assert figures.tried_to_allocate_bytes == 2 * GIB  # 0.25 GiB x micro-batch 8, from the log

    code, out, err = jobctl(capsys, "requeue", f"slurm:{first['scheduler_job_id']}", "--smaller", "--wait",
                            "--json")
    assert code == 0, err
    new = json.loads(out)
    second = rows()[1]
    assert second["scheduler"] == "slurm" and second["state"] == "COMPLETED"
    assert (second["parent_id"], second["attempt"]) == (first["id"], 2)
    # 16 sequences on dp 1: micro-batch 8 x 2 -> 4 x 4, as test_recovery_e2e's first step.
    assert (second["plan"]["micro_batch_size"], second["plan"]["grad_accum_steps"]) == (4, 4)
    # ... and the ladder was given the outcome's figures (they set the learned usable memory).
    rec, (inv,) = load_request(str(folder / "recipe.yaml"), [], [str(folder / "inventory.yaml")])
    expected = after_oom(rec, inv, first["plan"], figures, first["partition"]).ladder
    assert (new["rung"], new["reason"]) == (expected["rung"], expected["reason"])

    # Slurm cannot be reached (no sbatch here): exit 5, and nothing recorded.
    monkeypatch.setenv("PATH", "/nonexistent")
    code, out, err = jobctl(capsys, "requeue", second["id"])
    assert code == 5 and "sbatch is not installed" in err
    assert len(rows()) == 2


# --- what plan learns -----------------------------------------------------------------------------

def _report(capsys, *extra) -> dict:
    code, out, err = jobctl(capsys, "plan", "recipes/llama70b.yaml", "--cluster", "h100", *extra, "--json")
    assert code == 0, err
    return json.loads(out)


def _record(report: dict, *, state: str, failure_kind: str | None = None, exit_code: str | None = None, plan: dict | None = None,
            predicted: int | None = None, measured: int | None = None, cluster: str = "h100",
            plan_json=None) -> int:
    """A job in the history as submit records it: the resolved recipe text, the plan."""
    from jobctl.jobs.submission import prepare
    from jobctl.planning import load_request

    rec, (inv,) = load_request(report["recipe"], [f"train.seq_len={report['train']['seq_len']}"], ["h100"])
    sub = prepare(rec, inv, report)
    with History.open() as h:
        jid = h.prepare(recipe_name=sub.recipe_name, recipe_text=sub.recipe_text,
                        plan=plan_json if plan_json is not None else (plan or report["plan"]), cluster=cluster,
                        scheduler="slurm", partition=report["partition"],
                        predicted_peak_bytes=predicted if predicted is not None else report["memory"]["total_bytes"])
        h.mark_submitted(jid, str(1000 + jid), None)
        h.transition(jid, state, failure_kind=failure_kind, exit_code=exit_code)
        if measured is not None:
            h.set_measured_peak(jid, measured)
    return jid


def test_plan_without_history_file_reads_nothing(capsys):
    report = _report(capsys)
    assert "history" not in report
    assert not default_path().exists() and not default_path().parent.exists()  # nothing created


def test_plan_warns_about_a_layout_that_already_ran_out_of_memory(capsys):
    report = _report(capsys)
    p = report["plan"]
    oomed = _record(report, state="FAILED", failure_kind="CUDA_OOM")
    # Not like this plan: a larger micro-batch that OOMed (and predicted more), another cluster,
    # another sequence length, a failure that was not a CUDA OOM.
    bigger = dict(p, micro_batch_size=2 * p["micro_batch_size"],
                  grad_accum_steps=max(1, p["grad_accum_steps"] // 2))
    _record(report, state="FAILED", failure_kind="CUDA_OOM", plan=bigger,
            predicted=report["memory"]["total_bytes"] + 5 * GIB)
    _record(report, state="FAILED", failure_kind="CUDA_OOM", cluster="a100-80")
    _record(report, state="FAILED", exit_code="1:0")
    other_seq = _report(capsys, "train.seq_len=2048")
    _record(other_seq, state="FAILED", failure_kind="CUDA_OOM")

    again = _report(capsys)
    (w,) = again["history"]["warnings"]
    assert w["job"] == oomed and w["tried"] == p and w["predicted_peak_bytes"] == report["memory"]["total_bytes"]
    assert w["why"] == f"the same layout with micro-batch {p['micro_batch_size']} >= {p['micro_batch_size']}"
    assert w["message"].startswith(f"#{oomed} ran out of GPU memory on h100/{report['partition']} with tp{p['tp']}")
    assert "model_error" not in again["history"]  # no measured peaks yet
    assert {k: v for k, v in again.items() if k != "history"} == report  # the plan itself is unchanged

    code, out, _ = jobctl(capsys, "plan", "recipes/llama70b.yaml", "--cluster", "h100")
    assert code == 0 and f"warning: #{oomed} ran out of GPU memory" in out

    # The plan stored as a whole `plan --json` report (model and seq_len from it) counts too,
    # and the job that continued it is named.
    as_report = _record(report, state="FAILED", failure_kind="CUDA_OOM", plan_json=report)
    with History.open() as h:
        child = h.prepare(recipe_name="llama70b", recipe_text="x", plan=bigger, cluster="h100", scheduler="slurm",
                          parent_id=as_report)
    newest = _report(capsys)["history"]["warnings"][0]
    assert newest["job"] == as_report and newest["continued_as"]["job"] == child
    assert newest["continued_as"]["state"] == "PREPARED" and f"continued as #{child}" in newest["message"]


def test_plan_reports_the_memory_model_error_from_measured_peaks(capsys):
    report = _report(capsys)
    # (predicted - measured) / measured: (10 - 8) / 8 = +25 %, (9 - 10) / 10 = -10 %,
    # (11 - 10) / 10 = +10 %: median +10 %, worst (largest in size) +25 %, 3 jobs.
    for predicted, measured in ((10, 8), (9, 10), (11, 10)):
        _record(report, state="COMPLETED", predicted=predicted * GIB, measured=measured * GIB)
    # An OOMed run's peak stops short of its demand: not counted (nor like this plan: another
    # layout, predicted above it).
    _record(report, state="FAILED", failure_kind="CUDA_OOM", predicted=report["memory"]["total_bytes"] + GIB,
            measured=20 * GIB, plan=dict(report["plan"], tp=1))
    _record(report, state="COMPLETED", predicted=1 * GIB, measured=2 * GIB, cluster="a100-80")
    got = _report(capsys)["history"]
    assert got == {"model_error": {"jobs": 3, "median_pct": 10.0, "worst_pct": 25.0}}
    code, out, _ = jobctl(capsys, "plan", "recipes/llama70b.yaml", "--cluster", "h100")
    assert code == 0
    assert "from 3 finished job(s) with measured peaks: median error +10.0%, worst +25.0%" in out


# --- the rules, pure ------------------------------------------------------------------------------

BASE = {"nodes": 2, "gpus_per_node": 8, "world_size": 16, "tp": 8, "pp": 1, "dp": 2, "cp": 1, "sharding": "zero1",
        "micro_batch_size": 2, "grad_accum_steps": 4, "global_batch_size": 16, "recompute": "none",
        "offload": "none", "sequence_parallel": True, "virtual_stages": 1, "hsdp_shard": 0, "recompute_layers": 0}


@pytest.mark.parametrize("change, predicted, like", [
    ({}, None, True),
    ({"micro_batch_size": 4, "grad_accum_steps": 2}, None, True),
    ({"micro_batch_size": 1, "grad_accum_steps": 8}, None, False),
    ({"micro_batch_size": 1, "grad_accum_steps": 8}, 80 * GIB, True),  # predicted above the failed one's
    ({"recompute": "full"}, None, False),
    ({"tp": 4, "dp": 4}, None, False),
    ({"dp": 4, "nodes": 4, "world_size": 32}, None, False),  # ZeRO-1 states over more ranks: less per GPU
    ({"dp": 1, "nodes": 1, "world_size": 8, "grad_accum_steps": 8}, None, True),
    ({"pp": 4, "tp": 2}, None, False),
])
def test_why_like(change, predicted, like):
    failed = learn.PastJob(1, "FAILED", "CUDA_OOM", "h100", "main", BASE, predicted_peak_bytes=70 * GIB)
    assert (learn.why_like(dict(BASE, **change), predicted, failed) is not None) is like


def test_pipeline_micro_batches_in_flight():
    pp = dict(BASE, tp=2, pp=4, grad_accum_steps=8)
    failed = learn.PastJob(1, "FAILED", "CUDA_OOM", "h100", "main", pp)
    assert learn.why_like(dict(pp, grad_accum_steps=4), None, failed) is not None  # min(4, 4) = min(4, 8)
    assert learn.why_like(dict(pp, grad_accum_steps=2), None, failed) is None  # 2 in flight < 4


def test_model_error_by_hand_and_nothing_known():
    jobs = [learn.PastJob(i, s, None, "c", "p", {}, predicted_peak_bytes=pr, measured_peak_bytes=me)
            for i, (s, pr, me) in enumerate([("COMPLETED", 100, 80), ("TIMEOUT", 90, 100), ("COMPLETED", 50, None),
                                             ("CANCELLED", 1, 100)])]
    # +25 % and -10 %: the median of two is their mean, +7.5 %
    assert learn.model_error(jobs) == {"jobs": 2, "median_pct": 7.5, "worst_pct": 25.0}
    assert learn.model_error(jobs[2:]) is None
    assert learn.history_block({"cluster": "c", "plan": None}, []) == {}


@pytest.mark.parametrize("env", [
    {"JOBCTL_HOME": "/x/home"},
    {"JOBCTL_HOME": "", "XDG_STATE_HOME": "/x/state"},
    {"JOBCTL_HOME": "", "XDG_STATE_HOME": "relative/ignored"},
    {"JOBCTL_HOME": "", "XDG_STATE_HOME": ""},
])
def test_history_path_follows_the_store(monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert learn.history_path() == default_path()


# --- learning that cannot poison (issue 30) ----------------------------------------------------------

def _oom(id, *, scaling=0.5, gap=GIB, recipe="llama70b", days=1, predicted=60 * GIB, partition="gpu"):
    from datetime import datetime, timedelta, timezone

    return learn.PastJob(id, "FAILED", "CUDA_OOM", "h100", partition, {}, ("llama3.1-70b", 70), 8192, predicted,
                         calibration={"fixed_gap_bytes": gap, "per_scaling": scaling}, recipe_name=recipe,
                         created_at=(datetime.now(timezone.utc) - timedelta(days=days)).isoformat())


def _done(id, *, predicted, attempt=1):
    return learn.PastJob(id, "COMPLETED", None, "h100", "gpu", {}, ("llama3.1-70b", 70), 8192, predicted,
                         attempt=attempt, recipe_name="other")


def _for(jobs, recipe="llama70b"):
    return learn.calibration_for(jobs, "gpu", ("llama3.1-70b", 70), 8192, recipe, gpu_bytes=80 * GIB)


def test_a_calibration_applies_to_the_recipe_whose_job_taught_it():
    got = _for([_oom(3)])
    assert got["from"] == "job #3's CUDA OOM" and got["per_scaling"] == 0.5 and "advice" not in got
    other = _for([_oom(3, recipe="probe")])
    assert "fixed_gap_bytes" not in other  # advice for another recipe of the model, not a term
    (line,) = other["advice"]
    assert "job #3" in line and "recipe 'probe'" in line


def test_an_implausible_calibration_is_suspect_evidence():
    """Job #6 of the issue: '77.13 GiB + 2.16e+03 x activations' on a 24 GiB partition's model."""
    for job in (_oom(6, scaling=2160.0), _oom(6, gap=int(77.13 * GIB))):
        got = _for([job])
        assert "fixed_gap_bytes" not in got and "suspect" in got["advice"][0]
        assert "--forget-learned 6" in got["advice"][0]


def test_a_calibration_expires():
    assert "fixed_gap_bytes" in _for([_oom(3, days=learn.CALIBRATION_TTL_DAYS - 1)])
    old = _for([_oom(3, days=learn.CALIBRATION_TTL_DAYS + 1)])
    assert "fixed_gap_bytes" not in old and "older than" in old["advice"][0]


def test_a_later_completed_job_at_a_larger_footprint_refutes_it():
    refuting = _for([_oom(3, predicted=60 * GIB), _done(5, predicted=61 * GIB)])
    assert "fixed_gap_bytes" not in refuting and "refuted by job #5" in refuting["advice"][0]
    # a smaller footprint, an earlier job, or a retry (planned with a calibration) proves nothing
    for done in (_done(5, predicted=59 * GIB), _done(2, predicted=61 * GIB), _done(5, predicted=61 * GIB, attempt=2)):
        assert _for([_oom(3, predicted=60 * GIB), done])["from"] == "job #3's CUDA OOM"


def test_an_older_good_calibration_applies_when_the_newest_is_not():
    got = _for([_oom(3), _oom(7, scaling=5000.0)])
    assert got["from"] == "job #3's CUDA OOM" and "job #7" in got["advice"][0]


def test_plan_shows_advice_and_history_forgets_the_calibration(capsys):
    """Through the real CLI and sqlite history: a suspect calibration recorded with an OOMed job is
    shown by `plan` and not applied; `history --forget-learned` drops it from the history."""
    report = _report(capsys)
    jid = _record(report, state="FAILED", failure_kind="CUDA_OOM")
    with History.open() as h:
        h.set_extra(jid, {"calibration": {"fixed_gap_bytes": 77 * GIB, "per_scaling": 2160.0, "points": []}})
    again = _report(capsys)
    assert "learned" not in again and again["plan"] == report["plan"]
    assert any(f"job #{jid}'s CUDA OOM" in w and "suspect" in w for w in again["warnings"])
    code, out, _ = jobctl(capsys, "plan", "recipes/llama70b.yaml", "--cluster", "h100")
    assert code == 0 and "suspect evidence" in out
    code, out, err = jobctl(capsys, "history", "--forget-learned", str(jid))
    assert code == 0 and "forgotten" in (out + err)
    with History.open() as h:
        assert "calibration" not in h.get(jid).extra
    after = _report(capsys)
    assert not any("suspect" in w for w in after.get("warnings") or [])


def test_the_model_error_median_of_an_even_count_is_the_mean_of_the_middle_two():
    # errors +25 %, -10 %, +10 %, +50 % (hand-derived as above): sorted -10, +10, +25, +50; the
    # median of four is (10 + 25) / 2 = 17.5 %, as statistics.median has it
    import statistics

    from jobctl.planning.learn import PastJob, model_error
    pairs = ((10, 8), (9, 10), (11, 10), (15, 10))
    jobs = [PastJob(i, "COMPLETED", None, "h100", None, {}, predicted_peak_bytes=p * GIB,
                    measured_peak_bytes=m * GIB) for i, (p, m) in enumerate(pairs)]
    got = model_error(jobs)
    assert got == {"jobs": 4, "median_pct": 17.5, "worst_pct": 50.0}
    assert got["median_pct"] == statistics.median([25.0, -10.0, 10.0, 50.0])
