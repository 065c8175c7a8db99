"""The in-process memory hooks, run in real child Pythons: the no-CUDA no-op, per-step
records, an OOM that still fails exactly as PyTorch makes it fail, and the sitecustomize.

This machine has no GPU, so the CUDA cases patch torch.cuda's counters in the child (FAKE_CUDA)
before the hooks look at them; everything else — the excepthook chain, the files, the exit
code, the sitecustomize start-up — is the real thing.
"""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobctl.runtime import hooks

REPO = Path(__file__).resolve().parent.parent
GIB = 2 ** 30
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
               "of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.85 GiB memory in use.")

# A CPU build of torch made to look like a node with 8 GPUs; figures grow with the device index.
FAKE_CUDA = textwrap.dedent("""
    import os, pickle
    import torch
    torch.backends.cuda.is_built = lambda: True
    torch.cuda.device_count = lambda: 8
    torch.cuda.current_device = lambda: 0
    _FIGURES = {"max_memory_allocated": 70 * 2**30, "max_memory_reserved": 75 * 2**30,
                "memory_allocated": 60 * 2**30, "memory_reserved": 74 * 2**30}
    for _name, _value in _FIGURES.items():
        setattr(torch.cuda, _name, lambda device=None, _value=_value: _value + (device or 0))
    def _record(**kwargs):
        with open(os.environ["FAKE_CUDA_LOG"], "a") as f:
            f.write(f"record_memory_history {sorted(kwargs.items())}\\n")
    def _dump(filename):
        with open(filename, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[]]}, f)
    torch.cuda.memory._record_memory_history = _record
    torch.cuda.memory._dump_snapshot = _dump
""")


def run_child(tmp_path, script, *, env=None, pythonpath=()):
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith("JOBCTL_") and k not in ("RANK", "LOCAL_RANK", "PYTHONPATH")}
    child_env.update({"JOBCTL_JOB_FOLDER": str(tmp_path / "job"), "FAKE_CUDA_LOG": str(tmp_path / "fake.log"),
                      "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(REPO)])})
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-c", script], env=child_env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def records(tmp_path, rank=0):
    path = tmp_path / "job" / "memory" / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- pure parts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("env, expected", [
    ({}, dict(folder=None, rank=0, local_rank=None, interval_steps=50, memory_snapshot=False)),
    ({"JOBCTL_JOB_FOLDER": "/jobs/7", "RANK": "12", "LOCAL_RANK": "4", "JOBCTL_MEMORY_SNAPSHOT": "1",
      "JOBCTL_HOOKS_INTERVAL_STEPS": "10"},
     dict(folder="/jobs/7", rank=12, local_rank=4, interval_steps=10, memory_snapshot=True)),
    ({"LOCAL_RANK": "3"}, dict(rank=3, local_rank=3)),  # RANK unset: one node, LOCAL_RANK is the rank
    ({"JOBCTL_MEMORY_SNAPSHOT": "0"}, dict(memory_snapshot=False)),
])
def test_settings_from_env(env, expected):
    settings = hooks.settings_from_env(env)
    assert {k: getattr(settings, k) for k in expected} == expected
    assert settings.problems == ()


def test_explicit_arguments_win_over_the_environment():
    env = {"JOBCTL_JOB_FOLDER": "/jobs/7", "JOBCTL_MEMORY_SNAPSHOT": "1", "JOBCTL_HOOKS_INTERVAL_STEPS": "10"}
    settings = hooks.settings_from_env(env, interval_steps=5, memory_snapshot=False, folder=Path("/elsewhere"))
    assert (settings.folder, settings.interval_steps, settings.memory_snapshot) == ("/elsewhere", 5, False)
    assert settings.rank_file == Path("/elsewhere/memory/rank-0.jsonl")
    assert settings.snapshot_file == Path("/elsewhere/memory/oom-rank-0.pickle")


def test_bad_environment_values_are_named_and_ignored():
    settings = hooks.settings_from_env({"JOBCTL_HOOKS_INTERVAL_STEPS": "0", "RANK": "x",
                                        "JOBCTL_MEMORY_SNAPSHOT_MAX_ENTRIES": "lots"})
    assert settings.interval_steps == 50 and settings.rank == 0
    assert settings.snapshot_max_entries == hooks.DEFAULT_SNAPSHOT_MAX_ENTRIES
    assert len(settings.problems) == 3 and "JOBCTL_HOOKS_INTERVAL_STEPS='0'" in settings.problems[0]


@pytest.mark.parametrize("interval_steps", [0, -5, 2.5])
def test_a_bad_interval_argument_is_an_error(interval_steps):
    with pytest.raises(ValueError, match="interval_steps"):
        hooks.settings_from_env({}, interval_steps=interval_steps)


def test_is_oom():
    import torch

    oom = torch.OutOfMemoryError(OOM_MESSAGE)
    assert hooks.is_oom(oom)
    assert hooks.is_oom(RuntimeError(OOM_MESSAGE))  # how PyTorch before 2.0 raised it
    try:
        try:
            raise oom
        except RuntimeError as e:
            raise ValueError("step 7 failed") from e
    except ValueError as wrapped:
        assert hooks.is_oom(wrapped)
    assert not hooks.is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not hooks.is_oom(KeyboardInterrupt())
    assert not hooks.is_oom(None)


@pytest.mark.parametrize("argv, launcher", [
    (["/venv/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"], True),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py"], True),
    (["/venv/bin/python3", "-u", "train.py", "--steps", "10"], False),
    (["python", "-m", "jobctl.examples.tiny_train"], False),
])
def test_the_torchrun_agent_is_not_a_training_process(argv, launcher):
    assert hooks._is_torch_launcher(argv) is launcher


def test_site_env_puts_the_sitecustomize_first():
    env = hooks.site_env({"PYTHONPATH": "/opt/lib"})
    assert env == {"JOBCTL_HOOKS": "1", "PYTHONPATH": hooks.sitecustomize_dir() + os.pathsep + "/opt/lib"}
    assert (Path(hooks.sitecustomize_dir()) / "sitecustomize.py").is_file()
    assert hooks.site_env({})["PYTHONPATH"] == hooks.sitecustomize_dir()


# --- child processes ----------------------------------------------------------------------------

def test_without_cuda_install_says_so_once_and_step_does_nothing(tmp_path):
    proc = run_child(tmp_path, textwrap.dedent("""
        import torch
        from jobctl.runtime import hooks
        print(hooks.install(), hooks.install(interval_steps=1))
        for i in range(200):
            hooks.step(i)
        print(hooks.on_oom(torch.OutOfMemoryError("CUDA out of memory.")))
    """))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "False"]
    assert proc.stderr.count("no CUDA") == 1
    assert records(tmp_path) == [{**records(tmp_path)[0], "event": "off",
                                  "reason": "no CUDA (torch 2.13.0+cpu is built without CUDA)"}]
    assert sorted(p.name for p in (tmp_path / "job" / "memory").iterdir()) == ["rank-0.jsonl"]


def test_without_a_job_folder_the_hooks_are_off(tmp_path):
    proc = run_child(tmp_path, "from jobctl import hooks; print(hooks.install()); hooks.step(0)",
                     env={"JOBCTL_JOB_FOLDER": ""})
    assert proc.returncode == 0 and proc.stdout.strip() == "False"
    assert "JOBCTL_JOB_FOLDER is not set" in proc.stderr
    assert not (tmp_path / "job").exists()


def test_step_records_every_n_steps_per_rank(tmp_path):
    proc = run_child(tmp_path, FAKE_CUDA + textwrap.dedent("""
        from jobctl.runtime import hooks
        assert hooks.install(interval_steps=50) is True
        for i in range(120):
            hooks.step(i)
    """), env={"RANK": "11", "LOCAL_RANK": "3"})
    assert proc.returncode == 0, proc.stderr
    installed, *steps = records(tmp_path, rank=11)
    assert installed["event"] == "installed" and installed["interval_steps"] == 50
    assert installed["memory_snapshot"] is False
    assert [r["step"] for r in steps] == [0, 50, 100]
    assert all(r["event"] == "step" and r["rank"] == 11 and r["local_rank"] == 3 for r in steps)
    assert steps[0]["device"] == 3  # LOCAL_RANK's GPU
    assert steps[0]["max_memory_allocated_bytes"] == 70 * GIB + 3
    assert steps[0]["max_memory_reserved_bytes"] == 75 * GIB + 3
    assert steps[0]["memory_allocated_bytes"] == 60 * GIB + 3
    assert steps[0]["memory_reserved_bytes"] == 74 * GIB + 3
    assert not (tmp_path / "fake.log").exists()  # no snapshot recording unless asked


OOM_SCRIPT = textwrap.dedent(f"""
    import torch
    {{install}}
    for i in range(8):
        {{step}}
    raise torch.OutOfMemoryError({OOM_MESSAGE!r})
""")


def test_an_oom_fails_as_pytorch_would_and_leaves_a_record_and_a_snapshot(tmp_path):
    without = run_child(tmp_path, FAKE_CUDA + OOM_SCRIPT.format(install="", step="pass"))
    proc = run_child(tmp_path, FAKE_CUDA + OOM_SCRIPT.format(install="from jobctl import hooks; hooks.install()",
                                                             step="hooks.step(i)"),
                     env={"JOBCTL_MEMORY_SNAPSHOT": "1", "JOBCTL_HOOKS_INTERVAL_STEPS": "4"})
    assert without.returncode == proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.splitlines()[-1] == without.stderr.splitlines()[-1] == f"torch.OutOfMemoryError: {OOM_MESSAGE}"

    *_, oom = records(tmp_path)
    assert oom["event"] == "oom" and oom["step"] == 7
    assert oom["error"] == f"torch.OutOfMemoryError: {OOM_MESSAGE}"
    assert oom["max_memory_allocated_bytes"] == 70 * GIB and oom["max_memory_reserved_bytes"] == 75 * GIB
    assert oom["snapshot"] == "oom-rank-0.pickle"
    with open(tmp_path / "job" / "memory" / "oom-rank-0.pickle", "rb") as f:
        assert set(pickle.load(f)) == {"segments", "device_traces"}
    assert (tmp_path / "fake.log").read_text() == "record_memory_history [('max_entries', 100000)]\n"
    assert [r["step"] for r in records(tmp_path) if r["event"] == "step"] == [0, 4]


def test_on_oom_in_the_scripts_own_except_records_once(tmp_path):
    proc = run_child(tmp_path, FAKE_CUDA + textwrap.dedent("""
        import torch
        from jobctl.runtime import hooks
        hooks.install()
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
        except RuntimeError as e:
            print(hooks.on_oom(e), hooks.on_oom(ValueError("not an OOM")))
            raise ValueError("the step failed") from e
    """))
    assert proc.returncode == 1
    assert proc.stdout.split() == ["True", "False"]
    assert "ValueError: the step failed" in proc.stderr and "RuntimeError: CUDA out of memory" in proc.stderr
    ooms = [r for r in records(tmp_path) if r["event"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"
    assert ooms[0]["snapshot"] is None  # recording was not on


def test_other_errors_and_a_broken_folder_pass_through_untouched(tmp_path):
    (tmp_path / "job").write_text("a file where the job folder should be")
    proc = run_child(tmp_path, FAKE_CUDA + textwrap.dedent("""
        from jobctl.runtime import hooks
        hooks.install()
        hooks.step(0)
        raise torch.OutOfMemoryError("CUDA out of memory.")
    """))
    assert proc.returncode == 1
    assert proc.stderr.count("cannot record memory figures") == 1
    assert proc.stderr.splitlines()[-1] == "torch.OutOfMemoryError: CUDA out of memory."

    (tmp_path / "job").unlink()
    proc = run_child(tmp_path, FAKE_CUDA + "from jobctl import hooks\nhooks.install()\nraise KeyError('x')\n")
    assert proc.returncode == 1 and proc.stderr.splitlines()[-1] == "KeyError: 'x'"
    assert [r["event"] for r in records(tmp_path)] == ["installed"]


def test_sitecustomize_installs_the_hooks_in_an_unchanged_script(tmp_path):
    # A second sitecustomize further along PYTHONPATH (as a distribution might have) fakes
    # CUDA; jobctl's, first on the path, must run it before installing.
    fake_site = tmp_path / "fake_site"
    fake_site.mkdir()
    (fake_site / "sitecustomize.py").write_text(FAKE_CUDA)
    script = textwrap.dedent(f"""
        import os, torch
        print("JOBCTL_HOOKS" in os.environ)
        raise torch.OutOfMemoryError({OOM_MESSAGE!r})
    """)
    proc = run_child(tmp_path, script, pythonpath=[hooks.sitecustomize_dir(), fake_site],
                     env={"JOBCTL_HOOKS": "1", "JOBCTL_MEMORY_SNAPSHOT": "1", "RANK": "5", "LOCAL_RANK": "1"})
    assert proc.returncode == 1
    assert proc.stdout.strip() == "False"  # children of the training process start without hooks
    assert proc.stderr.splitlines()[-1] == f"torch.OutOfMemoryError: {OOM_MESSAGE}"
    installed, oom = records(tmp_path, rank=5)
    assert installed["event"] == "installed" and installed["memory_snapshot"] is True
    assert oom["event"] == "oom" and oom["device"] == 1 and oom["snapshot"] == "oom-rank-5.pickle"
    assert (tmp_path / "job" / "memory" / "oom-rank-5.pickle").is_file()


def test_sitecustomize_without_cuda_and_without_jobctl_hooks(tmp_path):
    site = hooks.sitecustomize_dir()
    proc = run_child(tmp_path, "print('ran')", pythonpath=[site], env={"JOBCTL_HOOKS": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ran"
    assert proc.stderr.count("no CUDA") == 1
    assert [r["event"] for r in records(tmp_path)] == ["off"]

    (tmp_path / "job" / "memory" / "rank-0.jsonl").unlink()
    proc = run_child(tmp_path, "import sys; print('torch' in sys.modules)", pythonpath=[site])
    assert proc.returncode == 0 and proc.stdout.strip() == "False" and proc.stderr == ""
    assert not (tmp_path / "job" / "memory" / "rank-0.jsonl").exists()


def test_sitecustomize_loads_the_hooks_by_path_where_jobctl_is_not_importable(tmp_path):
    shadow = tmp_path / "shadow" / "jobctl"  # stands for a job Python without jobctl installed
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('jobctl is not installed here')\n")
    proc = run_child(tmp_path, "import sys; print('_jobctl_hooks' in sys.modules)",
                     pythonpath=[hooks.sitecustomize_dir(), tmp_path / "shadow"], env={"JOBCTL_HOOKS": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert [r["event"] for r in records(tmp_path)] == ["off"]
