"""Hostile and broken input through the real entry point (`python -m jobctl`): each ends in one
clear message naming the file and line, exit code 2 (docs/exit-codes.md), no traceback, inside a
memory limit, and nothing written. The limits are jobctl/config/loader.py's (MAX_*); the
expected numbers below are written out from the shapes themselves."""

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEMORY = 2 << 30  # address space for the child: python + jobctl + omegaconf need ~0.3 GiB


def jobctl(*args, cwd, env=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    return subprocess.run([sys.executable, "-m", "jobctl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd), **(env or {})})


def laughs(levels: int = 9) -> str:
    """The "billion laughs" shape: 9 aliases of 9 aliases ... 9**9 = 387,420,489 strings."""
    text = "name: laughs\nl0: &l0 [" + ", ".join(['"lol"'] * 9) + "]\n"
    for i in range(1, levels):
        text += f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n"
    return text


def doubling(levels: int) -> str:
    """a_i = a_{i-1} a_{i-1}: a 64-character string doubled `levels` times = 64 * 2**levels characters."""
    text = "name: doubling\na0: " + "x" * 64 + "\n"
    for i in range(1, levels + 1):
        text += f'a{i}: "${{a{i - 1}}}${{a{i - 1}}}"\n'
    return text


def chain(n: int) -> str:
    text = "name: chain\na0: x\n"
    for i in range(1, n + 1):
        text += f"a{i}: ${{a{i - 1}}}\n"
    return text


CASES = {
    # name: (text, line the message must name, words it must contain)
    "billion-laughs": (laughs(), 3, "aliases"),
    "deep-flow": ("name: deep\nm: " + "[" * 100_000 + "]" * 100_000 + "\n", 2, "nested more than 64"),
    "deep-block": ("name: deep\n" + "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n", None,
                   "nested more than 64"),
    # 64 * 2**11 = 131,072 characters > the 64 KiB limit; 11 levels < the depth limit of 16
    "interpolation-doubling": (doubling(11), 13, "64 KiB"),
    "interpolation-chain": (chain(40), None, "interpolation nested more than 16"),
    "interpolation-chain-5000": (chain(5000), None, "interpolation nested more than 16"),
    "interpolation-loop": ("name: loop\na: ${b}\nb: ${a}\n", 2, "a"),
    "too-large": ("name: big\n" + "".join(f"k{i}: {i}\n" for i in range(40_000)), None, "256 KiB"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_yaml_ends_in_one_message_with_exit_2(tmp_path, case):
    text, line, words = CASES[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    before = sorted(p for p in tmp_path.rglob("*"))
    r = jobctl("plan", str(recipe), "--cluster", "h100", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    assert "recipe.yaml" in r.stderr and words in r.stderr, r.stderr
    if line is not None:
        assert f"recipe.yaml:{line}:" in r.stderr, r.stderr
    # nothing written: no job folder, no state, no cache entry for a refused file
    assert sorted(p for p in tmp_path.rglob("*") if ".cache" not in p.parts) == before


@pytest.mark.parametrize("path", ["/dev/zero", "fifo"])
def test_a_path_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, path):
    if path == "fifo":
        path = str(tmp_path / "recipe.yaml")
        os.mkfifo(path)  # opening it for reading would block until a writer came
        assert stat.S_ISFIFO(os.stat(path).st_mode)
    r = jobctl("plan", path, "--cluster", "h100", cwd=tmp_path)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr[-2000:]


def test_an_inventory_is_bounded_too(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(laughs().replace("name: laughs", "name: inv\nscheduler: local"))
    r = jobctl("plan", str(ROOT / "recipes" / "tiny.yaml"), "--cluster", str(inv), cwd=tmp_path)
    assert r.returncode == 2 and "inv.yaml:4:" in r.stderr and "aliases" in r.stderr, r.stderr[-2000:]


def test_a_base_file_that_is_a_device_is_named_at_the_base_key(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: x\nbase: /dev/zero\n")
    r = jobctl("plan", str(recipe), "--cluster", "h100", cwd=tmp_path)
    assert r.returncode == 2 and "recipe.yaml:2: base:" in r.stderr and "not a regular file" in r.stderr, r.stderr


def test_fuzzed_recipes_and_inventories_end_in_a_document_or_a_config_error():
    """hypothesis (400 examples) over recipe/inventory-shaped YAML with anchors, aliases of aliases, nesting,
    interpolations and cut-off text, in a child process limited to 2 GiB of address space."""
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "payloads" / "fuzz_loaders.py"), str(MEMORY), "400"],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "examples: 400" in r.stdout


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_infinite_or_nan_numbers_are_refused(tmp_path, value):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny.yaml").read_text().replace("train:\n", f"train:\n  lr: {value}\n", 1))
    assert f"lr: {value}" in recipe.read_text()
    r = jobctl("plan", str(recipe), "--cluster", "h100", cwd=tmp_path)
    assert r.returncode == 2 and "train.lr" in r.stderr and "finite" in r.stderr, r.stderr[-2000:]


ESC_NAME = "tiny\x1b[31mRED\x1b]0;pwn\x07"
TOKEN = "hf_SECRETVALUE123"


def hostile_recipe(tmp_path) -> Path:
    import yaml

    doc = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    doc["name"] = ESC_NAME
    doc.setdefault("launch", {}).setdefault("env", {})["HF_TOKEN"] = TOKEN
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_dry_run_hides_launch_env_values_and_escapes_the_name(tmp_path):
    recipe = hostile_recipe(tmp_path)
    for extra in ([], ["--json"]):
        r = jobctl("submit", str(recipe), "--cluster", "dev", "--dry-run", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert TOKEN not in r.stdout and "\x1b" not in r.stdout and "\x07" not in r.stdout
        assert "HF_TOKEN" in r.stdout and "***" in r.stdout
    assert "#SBATCH --job-name=tiny-31mRED-0-pwn" in r.stdout.replace("\\n", "\n")
    shown = jobctl("submit", str(recipe), "--cluster", "dev", "--dry-run", "--show-secrets", cwd=tmp_path)
    assert TOKEN in shown.stdout


def test_a_hostile_name_stays_text_in_every_view_of_a_real_job(tmp_path):
    """A real local job (submitit's local executor) of a recipe whose name holds escape
    sequences and whose launch.env holds a token: status, history and report print the name
    with its control characters made visible, never the token; the job folder is the id plus a
    safe slug, inside the jobs folder, owner-only."""
    recipe = hostile_recipe(tmp_path)
    env = {"JOBCTL_HOME": str(tmp_path / "home")}
    r = jobctl("submit", str(recipe), "--cluster", "local", "--wait", cwd=tmp_path, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for args in (["status", "--wide"], ["history", "--wide"], ["report", "1"]):
        out = jobctl(*args, cwd=tmp_path, env={**env, "COLUMNS": "200"})
        assert out.returncode == 0, (args, out.stderr[-2000:])
        text = out.stdout + out.stderr
        assert "\x1b" not in text and "\x07" not in text and TOKEN not in text, args
        assert "\\x1b[31mRED" in text, (args, text)
    jobs = tmp_path / "home" / "jobs"
    (folder,) = jobs.iterdir()
    assert folder.name == "1-tiny-31mRED-0-pwn"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for p in folder.rglob("*"):
        if p.is_file() and p.name.endswith(".json"):
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
