"""Another user on the same cluster (issue 26): shared folders, planted links, a trusted cache,
two histories in one workdir, schedulers that answer oddly. Each test reproduces one attack
class of the issue against the real code (a real job submitted through `jobctl submit` where a
job is needed) and fails on the code before the fix."""

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from jobctl_run import jobctl

from jobctl.store.folder import JobFolder
from jobctl.store.private import UnsafeFolder, check_path, write_new

ROOT = Path(__file__).resolve().parent.parent
ROOT_USER = os.geteuid() == 0
NOBODY = 65534  # a uid that is not ours (root can give files to it)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


def rows(home):
    db = home / "history.sqlite"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    out = [dict(r) for r in con.execute("SELECT * FROM jobs ORDER BY id")]
    con.close()
    return out


def local_inventory(tmp_path: Path, workdir: Path) -> Path:
    inv = tmp_path / "here.yaml"
    inv.write_text(f"name: here\nscheduler: local\nworkdir: {workdir}\npartitions:\n"
                   "  - {name: local, gpu: cpu, gpus_per_node: 1, nodes: 1, cpus_per_node: 2, mem_gib: 16}\n")
    return inv


# --- 1. job folders: made, never reused; never written through a link ------------------------

def test_a_folder_planted_where_the_next_job_goes_is_not_used(tmp_path):
    # the next job of this history is #1 "tiny": another user made 1-tiny/ first, open to all
    root = private(tmp_path / "jobs")
    planted = root / "1-tiny"
    planted.mkdir()
    os.chmod(planted, 0o777)
    (planted / "theirs").write_text("x")
    folder = JobFolder.create(root, 1, "tiny")
    assert folder.path != planted and folder.path.name.startswith("1-tiny-")
    assert stat.S_IMODE(os.stat(folder.path).st_mode) == 0o700
    folder.write_json("plan.json", {"secret": 1})
    assert sorted(os.listdir(planted)) == ["theirs"]


def test_a_link_planted_where_the_next_job_goes_is_not_followed(tmp_path):
    root = private(tmp_path / "jobs")
    victim = private(tmp_path / "victim")
    (root / "1-tiny").symlink_to(victim)
    folder = JobFolder.create(root, 1, "tiny")
    folder.write_text("recipe.yaml", "name: tiny\n")
    assert not folder.path.is_symlink() and folder.path.parent == root
    assert os.listdir(victim) == []


def test_a_link_planted_at_the_temporary_file_is_not_written_through(tmp_path, monkeypatch):
    # the writer's temporary name, made known: a link there to a file of the user's
    victim = tmp_path / "bashrc"
    victim.write_text("the user's own\n")
    folder_path = private(tmp_path / "folder")
    monkeypatch.setattr("jobctl.store.private.secrets.token_hex", lambda n: "known")
    (folder_path / f".plan.json.{os.getpid()}.known.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_new(folder_path / "plan.json", b"{}")
    assert victim.read_text() == "the user's own\n"
    assert not (folder_path / "plan.json").exists()


def test_a_root_others_can_write_to_is_refused_and_a_sticky_one_is_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o770)  # the group may rename what anyone makes there
    with pytest.raises(UnsafeFolder, match="its group can write to it") as e:
        JobFolder.create(shared / "jobs", 1, "tiny")
    assert "chmod +t" in e.value.hint
    assert not (shared / "jobs").exists()  # nothing made in it
    os.chmod(shared, 0o1777)  # sticky: like /tmp, others cannot rename what is not theirs
    folder = JobFolder.create(shared, 1, "tiny")
    assert stat.S_IMODE(os.stat(folder.path).st_mode) == 0o700


def test_a_link_on_the_way_to_the_root_is_checked_where_it_leads(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    (tmp_path / "link").symlink_to(open_dir)  # the path looks private; where it leads is not
    with pytest.raises(UnsafeFolder, match="everyone can write to it"):
        check_path(tmp_path / "link" / "jobs", "the job folder root")


@pytest.mark.skipif(not ROOT_USER, reason="giving a folder to another user needs root")
def test_a_root_that_belongs_to_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, -1)
    with pytest.raises(UnsafeFolder, match="belongs to"):
        JobFolder.create(theirs, 1, "tiny")


def test_submit_refuses_a_shared_workdir_before_recording_anything(home, tmp_path):
    shared = tmp_path / "project"
    shared.mkdir()
    os.chmod(shared, 0o775)
    r = jobctl("submit", "recipes/tiny.yaml", "--cluster", str(local_inventory(tmp_path, shared)))
    assert r.returncode == 2, r.stderr
    assert "can be changed by other users" in r.stderr and "Traceback" not in r.stderr
    assert rows(home) == [] and os.listdir(shared) == []


def test_a_local_job_writes_its_pickles_owner_only_and_runs_with_the_users_umask(home, tmp_path):
    made = tmp_path / "made-by-the-job"
    recipe = tmp_path / "touch.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny.yaml").read_text().split("launch:")[0]
                      + f"launch:\n  launcher: none\n  command: [python, -c, \"open('{made}', 'w').close()\"]\n")
    r = jobctl("submit", str(recipe), "--cluster", "local", "--wait")
    assert r.returncode == 0, r.stderr
    (job,) = rows(home)
    folder = Path(job["job_folder"])
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    pickles = list(folder.rglob("*.pkl"))  # the job submitted, and its result: both hold what it ran
    assert len(pickles) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in pickles), \
        [(p.name, oct(p.stat().st_mode)) for p in pickles]
    # the command's own files keep the user's umask (the tests run under the usual 022)
    assert stat.S_IMODE(made.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- 3. two histories in one workdir ---------------------------------------------------------

def test_two_histories_sharing_a_workdir_get_folders_of_their_own(tmp_path):
    workdir = private(tmp_path / "project")
    inv = local_inventory(tmp_path, workdir)
    folders = []
    for who in ("alice", "bob"):
        env = {"JOBCTL_HOME": str(tmp_path / who)}
        r = jobctl("submit", "recipes/tiny.yaml", "--cluster", str(inv), "--wait", env=env)
        assert r.returncode == 0, r.stderr
        (job,) = rows(tmp_path / who)
        assert job["id"] == 1  # both histories number from 1
        folders.append(job["job_folder"])
        report = jobctl("report", "1", "--json", env=env)
        assert report.returncode == 0, report.stderr
        assert json.loads(report.stdout)["job_folder"] == job["job_folder"]
    assert folders[0] != folders[1]


def test_a_workdir_the_scripts_shell_would_act_on_is_refused(home, tmp_path):
    # submitit writes the job folder into the sbatch script's srun line unquoted: a `$(...)` in
    # the path would run when the job starts (and when the --dry-run script is run by hand)
    marker = tmp_path / "pwned"
    workdir = private(tmp_path / f"w$(touch {marker})")
    inv = tmp_path / "slurm.yaml"
    inv.write_text((ROOT / "clusters" / "dev.yaml").read_text() + f"workdir: '{workdir}'\n")
    r = jobctl("submit", "recipes/tiny.yaml", "--cluster", str(inv), "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "characters the sbatch script's shell would act on" in r.stderr and "'$'" in r.stderr
    assert not marker.exists() and rows(home) == []


# --- 2. the validated-input cache ------------------------------------------------------------

def _plan(cache: Path, recipe="recipes/tiny.yaml"):
    r = jobctl("plan", recipe, "--cluster", "local", "--json", env={"JOBCTL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _dry_run(cache: Path) -> str:
    """What `submit --dry-run` would run for the tiny recipe, read through the cache."""
    r = jobctl("submit", "recipes/tiny.yaml", "--cluster", "local", "--dry-run", "--json",
               env={"JOBCTL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _entry_for(cache: Path, kind: str, source: Path) -> Path:
    from jobctl.config import cache as validcache

    return cache / "validated" / f"{validcache.key(kind, source.read_text())}.json"


def _tampered(entry_text: str) -> str:
    """The entry with the recipe's command changed and LD_PRELOAD added, as an attacker would,
    in whichever format the entry has (the name is computable by anyone with this jobctl)."""
    body = entry_text[entry_text.index("{"):] if not entry_text.startswith("{") else entry_text
    doc = json.loads(body)
    doc["value"]["launch"]["command"] = ["sh", "-c", "echo pwned"]
    doc["value"]["launch"]["env"] = {"LD_PRELOAD": "/tmp/evil.so"}
    doc["data"]["launch"]["command"] = ["sh", "-c", "echo pwned"]
    doc["data"]["launch"]["env"] = {"LD_PRELOAD": "/tmp/evil.so"}
    return json.dumps(doc)


def test_an_edited_cache_entry_for_an_unchanged_recipe_is_not_used(home, tmp_path):
    cache = tmp_path / "cache"
    _plan(cache)
    entry = _entry_for(cache, "Recipe", ROOT / "recipes" / "tiny.yaml")
    entry.write_text(_tampered(entry.read_text()))  # what another user, or a bug, left there
    out = _dry_run(cache)
    assert "pwned" not in out and "LD_PRELOAD" not in out


def test_a_cache_folder_others_can_write_to_is_neither_read_nor_written(tmp_path):
    cache = tmp_path / "cache"
    (cache / "validated").mkdir(parents=True)
    os.chmod(cache / "validated", 0o777)
    _plan(cache)
    assert os.listdir(cache / "validated") == []  # nothing written where others can plant entries
    # entries another user planted there (with a key file of theirs) are not read either
    own = tmp_path / "own"
    _plan(own)
    for f in (own / "validated").iterdir():
        (cache / "validated" / f.name).write_bytes(f.read_bytes())
    entry = _entry_for(cache, "Recipe", ROOT / "recipes" / "tiny.yaml")
    entry.write_text(_tampered(entry.read_text()))
    assert "pwned" not in _dry_run(cache)


@pytest.mark.skipif(not ROOT_USER, reason="giving a folder to another user needs root")
def test_a_cache_folder_of_another_user_is_not_read(tmp_path):
    # another user made the cache folder (JOBCTL_CACHE on a shared disk) with this jobctl, and
    # edited an entry, signing it with their own key where entries are signed: it verifies, but
    # the folder is not the user's
    import hashlib
    import hmac

    cache = tmp_path / "cache"
    _plan(cache)  # the other user's run
    entry = _entry_for(cache, "Recipe", ROOT / "recipes" / "tiny.yaml")
    body = _tampered(entry.read_text())
    key = cache / "validated" / "key"
    if key.exists():
        mac = hmac.new(key.read_bytes(), body.encode(), hashlib.sha256).hexdigest()
        entry.write_text(mac + "\n" + body)
    else:
        entry.write_text(body)
    for p in [cache / "validated", *(cache / "validated").iterdir()]:
        os.chown(p, NOBODY, -1)
    assert "pwned" not in _dry_run(cache)


# --- 5, 7. scheduler answers are input ---------------------------------------------------------

def fake_slurm(tmp_path: Path, **outputs: str) -> Path:
    """A bin folder of stand-ins for Slurm's commands, each printing what it is given (bytes
    written as `printf`-style escapes) and logging its argv to <name>.argv; put first on PATH."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name in ("sacct", "squeue", "scancel", "scontrol", "sinfo", "sbatch"):
        body = outputs.get(name, "")
        (bin_dir / f"{name}.out").write_bytes(body.encode("latin-1") if isinstance(body, str) else body)
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {bin_dir}/{name}.argv\ncat {bin_dir}/{name}.out\n')
        script.chmod(0o755)
    return bin_dir


def slurm_history(home: Path, scheduler_ids: list[str]) -> list[int]:
    """A history holding Slurm jobs on the dev cluster, submitted as `scheduler_ids`."""
    from jobctl.store.history import History

    h = History.open(home / "history.sqlite")
    out = []
    for sid in scheduler_ids:
        jid = h.prepare(recipe_name="tiny", recipe_text="name: tiny\n", plan={}, cluster="dev", scheduler="slurm",
                        partition="gpu")
        h.mark_submitted(jid, sid, str(home / f"folder-{jid}"))
        out.append(jid)
    h.close()
    return out


def with_fake(bin_dir: Path, home: Path) -> dict:
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "JOBCTL_HOME": str(home), "SLURM_CONF": "/nonexistent"}


def test_slurm_states_jobctl_does_not_know_break_no_command(tmp_path):
    home = tmp_path / "home"
    a, b, c = slurm_history(home, ["1001", "1002", "1003"])
    sacct = ("1001|RESIZING|0:0|2026-11-27T10:00:00|Unknown|n1|None\n"
             "1002|REVOKED|0:0|2026-11-27T10:00:00|2026-11-27T10:01:00|n1|None\n"
             "1003|SOME_FUTURE_STATE|0:0|Unknown|Unknown|None|None\n")
    env = with_fake(fake_slurm(tmp_path, sacct=sacct), home)
    for args in (["status"], ["status", "--json"], ["history"], ["watch", str(c), "--once"]):
        r = jobctl(*args, env=env)
        assert r.returncode in (0, 4), (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and "unknown job state" not in r.stderr, args
    states = {j["id"]: j["state"] for j in json.loads(jobctl("status", "--json", env=env).stdout)}
    assert states == {a: "RUNNING", b: "CANCELLED", c: "UNKNOWN"}


def test_an_id_from_the_scheduler_is_never_an_option_to_scancel(tmp_path):
    home = tmp_path / "home"
    (jid,) = slurm_history(home, ["--me"])  # what a hostile squeue answered for a lost submission
    bin_dir = fake_slurm(tmp_path)
    r = jobctl("cancel", str(jid), env=with_fake(bin_dir, home))
    assert r.returncode == 5 and "not a Slurm job id: '--me'" in r.stderr, r.stderr
    assert not (bin_dir / "scancel.argv").exists()


def test_sacct_rows_that_are_not_job_ids_or_not_utf8_or_too_many_are_input(tmp_path):
    from jobctl.backends import slurm

    assert slurm.parse_sacct("--me|RUNNING|0:0|x|x|n|None\n1001|RUNNING|0:0|x|x|n|None\n").keys() == {"1001"}
    assert [slurm.valid_job_id(x) for x in ("1001", "1001_3", "1001+0", "--me", "1 2", "", "1001_", "a1")] == \
        [True, True, True, False, False, False, False, False]
    bin_dir = fake_slurm(tmp_path, sacct=b"1001|RUNNING|0:0|x|x|n\xff\xfe|None\n")
    assert slurm.run_here([str(bin_dir / "sacct")]).startswith("1001|RUNNING|0:0|x|x|n\ufffd")
    big = tmp_path / "big"
    row = b"1001|RUNNING|0:0|x|x|n|None\n"
    big.write_bytes(row * (slurm.MAX_ANSWER_BYTES // len(row) + 1_000))
    (bin_dir / "sacct.out").unlink()
    (bin_dir / "sacct.out").symlink_to(big)
    with pytest.raises(slurm.SchedulerError, match="answered more than 32 MiB"):
        slurm.run_here([str(bin_dir / "sacct")])


def test_a_hundred_thousand_repeated_sacct_rows_are_read_in_linear_time():
    # a requeued job's runs are kept (earlier); copying them per row made 60,000 rows take 20 s on the
    # issue's machine, 120,000 take 22 s here; read linearly they take well under a second on the
    # issue's machine, 120,000 take 22 s here; read linearly they take well under a second
    import signal

    from jobctl.backends import slurm

    def too_slow(*_):
        raise TimeoutError("quadratic")

    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(10)
    try:
        out = slurm.parse_sacct("1001|REQUEUED|0:0|x|x|n|None\n" * 120_000)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert len(out["1001"].earlier) == 119_999


# --- 4. a local submit killed half-way --------------------------------------------------------

KILLED_AT_RECORDING = """
import os, signal, sys
from jobctl.store.history import History
from jobctl.cli import main
# SIGKILL at the worst moment: the controller runs, its id is not recorded yet
History.mark_submitted = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(main(sys.argv[1:]))
"""


def test_a_local_submit_killed_after_starting_the_job_is_found_and_can_be_cancelled(home, tmp_path):
    import subprocess
    import sys
    import time

    recipe = tmp_path / "sleep.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny.yaml").read_text().split("launch:")[0]
                      + "launch:\n  launcher: none\n  command: [python, -c, 'import time; time.sleep(120)']\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBCTL_HOME": str(home)}
    p = subprocess.run([sys.executable, "-c", KILLED_AT_RECORDING, "submit", str(recipe), "--cluster", "local"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    (row,) = rows(home)
    assert row["state"] == "PREPARED" and row["scheduler_job_id"] is None
    env_now = {"JOBCTL_HOME": str(home), "JOBCTL_RECONCILE_AFTER_S": "0"}
    r = jobctl("status", "--json", env=env_now)
    assert r.returncode == 0, r.stderr
    (job,) = json.loads(r.stdout)
    assert job["state"] == "RUNNING" and job["scheduler_job_id"], job
    pid = int(job["scheduler_job_id"])
    r = jobctl("cancel", "1", env=env_now)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and \
            Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z":
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert rows(home)[0]["state"] == "CANCELLED"


# --- 6. a deeply nested recipe, whichever YAML scanner stops first ---------------------------

def test_a_deep_recipe_is_refused_when_libyaml_stops_before_the_nesting(tmp_path, monkeypatch):
    # PyYAML 6.0.4 with libyaml: the limits' scan (libyaml's) stopped on 100,000 '[' before it
    # counted them, and PyYAML's own recursive composer then crashed (RecursionError, exit 70).
    # Stand in for such a libyaml: a scanner that stops at once.
    import yaml

    from jobctl.config import limits
    from jobctl.errors import ConfigError
    from jobctl.planning import load_recipe

    class StopsAtOnce(yaml.SafeLoader):
        def check_token(self, *choices):
            raise yaml.scanner.ScannerError("libyaml stopped here")

    monkeypatch.setattr(limits, "_FAST", StopsAtOnce)
    monkeypatch.setenv("JOBCTL_NO_CACHE", "1")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: deep\nm: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(str(deep), [])
    assert "nested more than 64 levels deep" in str(e.value)


# --- 7. numbers, secrets, bytes, names, files: the lower classes -----------------------------

def test_a_400_digit_step_count_is_a_clear_error(home):
    r = jobctl("plan", "recipes/tiny.yaml", "-c", "local", "train.steps=1" + "0" * 400)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "train.steps" in r.stderr and "must be at most 1000000000000" in r.stderr
    assert len(r.stderr) < 400  # the value is quoted, not all 401 digits of it


def test_an_inventory_too_large_to_search_is_refused(tmp_path):
    many = tmp_path / "many.yaml"
    many.write_text("name: many\npartitions:\n" + "".join(
        f"  - {{name: p{i}, gpu: h100-sxm-80gb, gpus_per_node: 8, nodes: 16, cpus_per_node: 8, mem_gib: 64}}\n"
        for i in range(65)))
    r = jobctl("plan", "recipes/tiny.yaml", "-c", str(many))
    assert r.returncode == 2 and "partitions" in r.stderr and "at most 64" in r.stderr, r.stderr
    huge = tmp_path / "huge.yaml"  # 3 x 131,072 nodes of 8 GPUs: each within its own limit
    huge.write_text("name: huge\npartitions:\n" + "".join(
        f"  - {{name: p{i}, gpu: h100-sxm-80gb, gpus_per_node: 8, nodes: 131072, cpus_per_node: 8, mem_gib: 64}}\n"
        for i in range(3)))
    r = jobctl("plan", "recipes/tiny.yaml", "-c", str(huge))
    assert r.returncode == 2 and "3,145,728 GPUs in all" in r.stderr, r.stderr


def test_a_secret_read_from_the_environment_is_hidden_in_the_dry_run(home):
    r = jobctl("submit", "recipes/tiny.yaml", "-c", "local", "--dry-run", "--json",
               "launch.command=python -m jobctl.examples.tiny_train --token ${oc.env:JOBCTL_TEST_TOKEN}",
               env={"JOBCTL_TEST_TOKEN": "hf_0123456789secret"})
    assert r.returncode == 0, r.stderr
    assert "hf_0123456789secret" not in r.stdout and "***" in r.stdout


def test_a_nul_that_arrives_through_interpolation_is_refused_at_submit(home, tmp_path):
    recipe = tmp_path / "nul.yaml"
    recipe.write_text('name: nul\ndescription: "a\\0b"\n'
                      "model: {family: llama, layers: 2, hidden: 64, ffn_hidden: 172, heads: 4, kv_heads: 2, vocab: 256}\n"
                      "train: {seq_len: 64, global_batch_size: 8, precision: fp32}\n"
                      "launch:\n  launcher: none\n  command: [python, -c, 'print(1)']\n"
                      "  env: {X: '${description}'}\n")
    r = jobctl("submit", str(recipe), "-c", "local", "--wait")
    assert r.returncode == 2 and "NUL" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert rows(home) == []


def test_a_clusters_folder_here_does_not_shadow_a_shipped_cluster_without_saying_so(tmp_path):
    import subprocess
    import sys

    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "local.yaml").write_text(
        "name: local\nscheduler: local\nenv: {LD_PRELOAD: /tmp/evil.so}\npartitions:\n"
        "  - {name: local, gpu: cpu, gpus_per_node: 1, nodes: 1, cpus_per_node: 2, mem_gib: 16}\n")
    r = subprocess.run([sys.executable, "-m", "jobctl", "plan", str(ROOT / "recipes" / "tiny.yaml"), "-c", "local"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "JOBCTL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert f"using {tmp_path / 'clusters' / 'local.yaml'} from this folder" in r.stderr


def test_bidi_overrides_and_zero_width_characters_are_shown_not_obeyed(tmp_path):
    recipe = tmp_path / "bidi.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny.yaml").read_text().replace("\nname: tiny\n",
                                                                        '\nname: "txt\\u202egnp\\u200b"\n', 1))
    r = jobctl("plan", str(recipe), "-c", "local")
    assert r.returncode == 0, r.stderr
    assert "\u202e" not in r.stdout + r.stderr and "\u200b" not in r.stdout + r.stderr
    from jobctl.ui.terminal import sanitize

    assert sanitize("txt\u202egnp\u200b \x1b[31m") == "txt\\u202egnp\\u200b \\x1b[31m"


def test_base_names_only_a_recipe_or_inventory_file(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nkey: b3BlbnNzaC1rZXktdjE\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nbase: {secret}\n")
    r = jobctl("plan", str(recipe), "-c", "local")
    assert r.returncode == 2 and "recipe or inventory YAML file" in r.stderr, r.stderr
    assert "OPENSSH" not in r.stderr and "b3Blbn" not in r.stderr


def test_an_sbatch_answer_without_a_job_id_is_uncertain_not_a_crash(tmp_path):
    home = tmp_path / "home"
    bin_dir = fake_slurm(tmp_path, scontrol="Slurmctld(primary) at ctl is UP\n",
                         sbatch="\x1b]0;owned\x07\x1b[2J all went well\n")
    r = jobctl("submit", "recipes/tiny.yaml", "-c", "dev", env=with_fake(bin_dir, home))
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
    assert "names no job id" in r.stderr and "\x1b" not in r.stderr
    (row,) = rows(home)
    assert row["state"] == "PREPARED"  # `jobctl status` looks for it at Slurm by its comment


@pytest.mark.parametrize("gres, words", [("gpu:h100:-1", "-1 GPUs per node"),
                                         ("gpu:h100:99999999", "99999999 GPUs per node")])
def test_discover_refuses_a_gpu_count_no_node_has(tmp_path, gres, words):
    bin_dir = fake_slurm(tmp_path, sinfo=f"gpu*|up|1-00:00:00|2|64|512000|{gres}|n[1-2]\n")
    r = jobctl("clusters", "discover", "--name", "x", env=with_fake(bin_dir, tmp_path / "home"))
    assert r.returncode == 5 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "another jobctl version" not in r.stderr
