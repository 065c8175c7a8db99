"""The command-line contract: exit codes, stdout/stderr, the `plan --json` and `memory --json` shapes.

Exit codes: 0 fits, 3 does not fit (or a pinned layout is impossible), 2 bad input or usage,
1 internal error (traceback kept). A representative set runs through the real entry point
(`python -m jobctl` in a subprocess); the rest calls `jobctl.cli.main` in-process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobctl import cli  # this checkout's, whatever `pip install -e` points at (pyproject.toml: pythonpath)

REPO = Path(__file__).resolve().parent.parent

BAD = "tests/data/bad"
GOOD = "tests/data/good"
INV = f"{GOOD}/inv_small.yaml"  # 2 nodes x 4 H100
RECIPE = f"{GOOD}/small.yaml"  # 4 heads, 2 KV heads, 4 layers, global batch 16

GROUPS = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "overhead")
MEMORY_KEYS = {f"{g}_bytes" for g in GROUPS} | {"total_bytes", "gpu_usable_bytes", "host_bytes_per_node"}
PLAN_KEYS = {"nodes", "gpus_per_node", "world_size", "tp", "pp", "dp", "cp", "sharding", "micro_batch_size",
             "grad_accum_steps", "global_batch_size", "recompute", "offload", "sequence_parallel"}
ISSUE = re.compile(r"^(error: )?([^:\s]+|<command line>)(:\d+)?: ")
SHIPPED_CLUSTERS = sorted(p.stem for p in (REPO / "clusters").glob("*.y*ml"))

# from the repository root, only its clusters/, no wrapping by rich (see test_error_lines_are_not_wrapped)
pytestmark = pytest.mark.usefixtures("repo_cli")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv) -> tuple[int, dict]:
    code, out, err = run(capsys, *argv, "--json")
    assert "Traceback" not in err
    return code, json.loads(out)


def subprocess_cli(*argv, columns: str | None = "4000", env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("JOBCTL_CLUSTERS", "COLUMNS")}
    e["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    if columns:
        e["COLUMNS"] = columns
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "jobctl", *argv], capture_output=True, text=True, cwd=REPO,
                          env=e, timeout=60)


# --- through the real entry point -------------------------------------------------------------

SUBPROCESS_CASES = [
    # (id, argv, exit code, text that must be in stderr (2) or stdout (0, 3))
    ("unknown-keys", ["plan", f"{BAD}/unknown_keys.yaml", "-c", INV], 2,
     "tests/data/bad/unknown_keys.yaml:7: train.optimiser: unknown key; did you mean 'optimizer'?"),
    ("yaml-syntax", ["plan", f"{BAD}/syntax_indent.yaml", "-c", INV], 2,
     "tests/data/bad/syntax_indent.yaml:6: YAML syntax error: mapping values are not allowed here"),
    ("error-in-base", ["plan", f"{BAD}/base_child.yaml", "-c", INV], 2,
     "tests/data/bad/base_parent.yaml:5: train.seq_len: got -2048; must be greater than 0"),
    ("circular-base", ["plan", f"{BAD}/base_self.yaml", "-c", INV], 2,
     "tests/data/bad/base_self.yaml:2: base: circular base: "),
    ("unknown-gpu", ["plan", RECIPE, "-c", f"{BAD}/inv_unknown_gpu.yaml"], 2,
     "tests/data/bad/inv_unknown_gpu.yaml:5: partitions.0.gpu: unknown GPU 'h100-sxm-80g'; did you mean 'h100-sxm-80gb'"),
    ("override-type", ["plan", RECIPE, "-c", INV, "train.seq_len=abc"], 2,
     "<command line>: train.seq_len: got 'abc'; expected an integer"),
    ("missing-file", ["plan", "nope/recipe.yaml", "-c", INV], 2, "nope/recipe.yaml: file not found"),
    ("unknown-cluster", ["plan", RECIPE, "--cluster", "h10"], 2, "unknown cluster 'h10'; did you mean 'h100'?"),
    ("tp-heads", ["plan", RECIPE, "-c", INV, "parallelism.tp=3"], 3,
     "tp=3 does not divide the attention heads: 4 % 3 = 1"),
    ("world-too-big", ["plan", RECIPE, "-c", INV, "parallelism.tp=2", "parallelism.pp=2", "parallelism.dp=4",
                       "parallelism.cp=1"], 3,
     "tp(2) * pp(2) * dp(4) * cp(1) = 16 GPUs > 8 available (small/gpu: 2 nodes x 4 GPUs)"),
    ("fits-with-base-and-launch", ["plan", f"{GOOD}/child.yaml", "-c", INV], 0, "fits: "),
    ("memory-bad-optimizer", ["memory", "--model-size-gb", "14", "--optimizer", "adamx"], 2,
     "--optimizer: unknown value 'adamx'; did you mean 'adamw'"),
    ("memory-negative", ["memory", "--model_size_gb", "-3"], 2, "--model-size-gb: expected a positive size in GB, got -3"),
    ("unknown-command", ["plna"], 2, "unknown command 'plna'; did you mean 'plan'?"),
]


@pytest.mark.parametrize("argv, code, text", [c[1:] for c in SUBPROCESS_CASES], ids=[c[0] for c in SUBPROCESS_CASES])
def test_entry_point(argv, code, text):
    p = subprocess_cli(*argv)
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    if code == 2:
        assert text in p.stderr
        assert p.stdout == ""  # errors go to stderr only
        assert all(ISSUE.match(line) or line.startswith("To fix: ") for line in p.stderr.splitlines()), p.stderr
    else:
        assert text in p.stdout


def test_entry_point_plan_json():
    p = subprocess_cli("plan", RECIPE, "--cluster", INV, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["feasible"] is True and d["cluster"] == "small"


def test_error_lines_are_not_wrapped_in_a_pipe():
    p = subprocess_cli("plan", f"{BAD}/unknown_keys.yaml", "-c", INV, columns=None)
    assert p.returncode == 2
    assert len(p.stderr.splitlines()) == 3, p.stderr


# --- exit codes and usage -----------------------------------------------------------------------

@pytest.mark.parametrize("argv, code", [
    ([], 2), (["--help"], 0), (["--version"], 0), (["plan"], 2), (["plan", RECIPE, "--bogus"], 2),
    (["memory", "--model-size-gb", "abc"], 2), (["memory", "--params", "7e9", "--model-size-gb", "14"], 2),
    (["plan", "--help"], 0),
])
def test_usage_exit_codes(capsys, argv, code):
    got, _, err = run(capsys, *argv)
    assert got == code
    assert "Traceback" not in err


def test_unknown_command(capsys):
    code, out, err = run(capsys, "plna")
    assert code == 2 and out == ""
    assert err.startswith("jobctl: error: unknown command 'plna'; did you mean 'plan'? (commands: plan, memory, ")
    assert err.count("\n") == 1


def test_internal_error_keeps_the_traceback_and_exits_1(capsys, monkeypatch):
    import jobctl.planning.load

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(jobctl.planning.load, "load_recipe", boom)
    monkeypatch.setattr(sys, "argv", ["jobctl", "plan", RECIPE, "-c", INV])
    with pytest.raises(SystemExit) as e:
        cli.run()
    err = capsys.readouterr().err
    assert e.value.code == 70  # EX_SOFTWARE: a bug in jobctl
    assert "Traceback" in err and "RuntimeError: boom" in err and "internal error" in err


# --- plan --json: the contract -------------------------------------------------------------------

def check_plan_invariants(report: dict) -> None:
    assert {"recipe", "cluster", "partition", "feasible", "model", "plan", "memory", "reasons"} <= set(report)
    assert isinstance(report["reasons"], list)
    if not report["feasible"]:
        assert report["plan"] is None and report["memory"] is None and report["reasons"]
        return
    assert set(report["model"]) >= {"name", "params"} and report["model"]["params"] > 0
    p, m = report["plan"], report["memory"]
    assert PLAN_KEYS <= set(p)
    assert MEMORY_KEYS <= set(m)
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == p["world_size"] == p["nodes"] * p["gpus_per_node"]
    assert p["micro_batch_size"] * p["grad_accum_steps"] * p["dp"] == p["global_batch_size"]
    assert m["total_bytes"] == sum(m[f"{g}_bytes"] for g in GROUPS)
    assert m["total_bytes"] <= m["gpu_usable_bytes"]  # it fits
    assert all(isinstance(m[k], int) for k in MEMORY_KEYS)
    assert isinstance(p["sequence_parallel"], bool)
    assert p["sharding"] in {"none", "zero1", "zero2", "zero3", "hsdp"}
    assert p["recompute"] in {"none", "selective", "full"}
    assert p["offload"] in {"none", "optimizer", "optimizer+params"}


@pytest.mark.parametrize("argv", [
    [RECIPE, "--cluster", INV],
    [RECIPE, "--cluster", INV, "train.global_batch_size=64", "train.seq_len=1024"],
    [f"{GOOD}/child.yaml", "--cluster", INV],
    ["recipes/tiny.yaml", "--cluster", "local"],
    ["llama8b", "--cluster", "h100"],
])
def test_plan_json_contract(capsys, argv):
    code, d = run_json(capsys, "plan", *argv)
    assert code == 0
    assert d["feasible"] is True and d["reasons"] == []
    check_plan_invariants(d)


def test_plan_json_values(capsys):
    code, d = run_json(capsys, "plan", RECIPE, "--cluster", INV, "train.global_batch_size=64")
    assert code == 0
    assert (d["recipe"], d["cluster"], d["partition"]) == (RECIPE, "small", "gpu")
    assert d["model"]["name"] == "small-llama"
    # 4 llama layers of h=256, a=4, g=2 (d=64), f=688, V=1024 untied:
    # layer = 2·h·a·d + 2·h·g·d + 3·h·f + 2·h = 131072 + 65536 + 528384 + 512 = 725504
    assert d["model"]["params"] == 4 * 725504 + 2 * 1024 * 256 + 256
    assert d["plan"]["global_batch_size"] == 64


def test_pinned_impossible_layout_is_exit_3_with_the_arithmetic(capsys):
    code, d = run_json(capsys, "plan", RECIPE, "--cluster", INV, "parallelism.tp=3")
    assert code == 3
    check_plan_invariants(d)
    assert d["feasible"] is False
    assert "tp=3 does not divide the attention heads: 4 % 3 = 1" in d["reasons"]
    assert "tp=3 does not divide the KV heads: 2 % 3 = 2" in d["reasons"]


def test_pinned_world_larger_than_the_partition(capsys):
    pins = ["parallelism.tp=2", "parallelism.pp=2", "parallelism.dp=4", "parallelism.cp=1"]
    code, out, err = run(capsys, "plan", RECIPE, "--cluster", INV, *pins)
    assert code == 3 and err == ""
    assert "does not fit" in out
    assert "tp(2) * pp(2) * dp(4) * cp(1) = 16 GPUs > 8 available (small/gpu: 2 nodes x 4 GPUs)" in out


def test_pinned_layout_in_the_recipe_file_is_also_exit_3(capsys, tmp_path):
    p = tmp_path / "pinned.yaml"
    p.write_text(f"base: {REPO / RECIPE}\nname: pinned\nparallelism:\n  tp: 3\n")
    code, d = run_json(capsys, "plan", str(p), "--cluster", INV)
    assert code == 3
    assert "tp=3 does not divide the attention heads: 4 % 3 = 1" in d["reasons"]


def test_does_not_fit_is_exit_3_with_reasons(capsys):
    code, d = run_json(capsys, "plan", "llama405b", "--cluster", "rtx4090")
    assert code == 3
    check_plan_invariants(d)
    assert any("GiB" in r for r in d["reasons"])


# --- plan without --cluster: one row per inventory -------------------------------------------

def test_plan_on_every_cluster_json(capsys):
    code, d = run_json(capsys, "plan", RECIPE)
    assert code == 0
    assert d["recipe"] == RECIPE
    assert sorted(r["cluster"] for r in d["clusters"]) == SHIPPED_CLUSTERS
    for r in d["clusters"]:
        check_plan_invariants(r)


def test_plan_on_every_cluster_table(capsys):
    code, out, err = run(capsys, "plan", RECIPE)
    assert code == 0 and err == ""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("───")) + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    rows = [line.split()[0] for line in lines[start:end]]  # the first cell: the cluster
    assert sorted(rows) == SHIPPED_CLUSTERS


def test_plan_on_every_cluster_includes_jobctl_clusters(capsys, monkeypatch, tmp_path):
    (tmp_path / "zz-extra.yaml").write_text((REPO / INV).read_text())
    monkeypatch.setenv("JOBCTL_CLUSTERS", str(tmp_path))
    code, d = run_json(capsys, "plan", RECIPE)
    assert code == 0
    assert len(d["clusters"]) == len(SHIPPED_CLUSTERS) + 1
    assert "small" in [r["cluster"] for r in d["clusters"]]


def test_plan_on_every_cluster_reports_a_bad_inventory(capsys, monkeypatch, tmp_path):
    (tmp_path / "broken.yaml").write_text((REPO / BAD / "inv_unknown_gpu.yaml").read_text())
    monkeypatch.setenv("JOBCTL_CLUSTERS", str(tmp_path))
    code, out, err = run(capsys, "plan", RECIPE)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {tmp_path / 'broken.yaml'}:5: partitions.0.gpu: unknown GPU 'h100-sxm-80g'")


# --- --cluster: a name or a path ----------------------------------------------------------------

def test_cluster_name_and_path_give_the_same_plan(capsys):
    _, by_name = run_json(capsys, "plan", RECIPE, "--cluster", "a100-80")
    _, by_path = run_json(capsys, "plan", RECIPE, "--cluster", "clusters/a100-80.yaml")
    assert by_name == by_path


def test_unknown_cluster_name(capsys):
    code, out, err = run(capsys, "plan", RECIPE, "--cluster", "a100_80")
    assert code == 2 and out == ""
    assert err == ("error: unknown cluster 'a100_80'; did you mean 'a100-80'?\n"
                   f"To fix: known clusters: {', '.join(SHIPPED_CLUSTERS)}; or pass a path to an inventory file\n")


@pytest.mark.parametrize("arg, text", [
    ("nope.yaml", "error: inventory file not found: nope.yaml\n"),
    ("h100.yaml", "error: inventory file not found: h100.yaml; did you mean --cluster h100?\n"),
    ("some/dir/h9.yml", "error: inventory file not found: some/dir/h9.yml\n"),
])
def test_cluster_path_not_found(capsys, arg, text):
    code, out, err = run(capsys, "plan", RECIPE, "--cluster", arg)
    assert code == 2 and out == ""
    assert err.startswith(text)
    assert "clusters list" not in err  # no hint naming a command that does not exist


# --- memory ---------------------------------------------------------------------------------------

def test_memory_underscore_spellings_are_the_same_flags(capsys):
    _, a = run_json(capsys, "memory", "--model_size_gb", "14", "--gpu_memory_gb", "40", "--num_gpus", "8",
                    "--zero_stage", "3")
    _, b = run_json(capsys, "memory", "--model-size-gb", "14", "--gpu-memory-gb", "40", "--num-gpus", "8",
                    "--zero-stage", "3")
    assert a == b


@pytest.mark.parametrize("argv, fits, states_bytes", [
    # Mixed-precision Adam keeps 16 bytes per parameter (ZeRO paper §3.1): 2 + 2 + 12.
    (["--model-size-gb", "14"], False, 16 * 7_000_000_000),
    (["--model-size-gb", "14", "--zero-stage", "3", "--num-gpus", "8"], True, 16 * 7_000_000_000 // 8),
    (["--params", "7e9", "--precision", "bf16-pure"], True, 8 * 7_000_000_000),  # 2 + 2 + 2·2
    (["--model-size-gb", "1"], True, 16 * 500_000_000),
])
def test_memory_json(capsys, argv, fits, states_bytes):
    code, d = run_json(capsys, "memory", *argv)
    assert code == (0 if fits else 3)
    m = d["memory"]
    assert MEMORY_KEYS <= set(m)
    assert m["total_bytes"] == sum(m[f"{g}_bytes"] for g in GROUPS)
    assert m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"] == states_bytes
    assert d["fits"] is fits


def test_memory_fsdp2_allocator_terms_follow_what_is_asked(capsys):
    # FSDP2 (accelerate's loop, which frees the gradients each step) at ZeRO-3 over 8 GPUs: with
    # activations the activation phase is the peak and the sharded gradients' freed blocks stay
    # cached on the reduce-scatter stream; without them (states only) the peak is the end of
    # backward, where those gradients are in use, so they must not be counted twice; and from a
    # bare parameter count nothing about the units' shapes is known
    base = ["memory", "--zero-stage", "3", "--num-gpus", "8"]

    def terms(*argv, framework="fsdp"):
        _, d = run_json(capsys, *base, "--framework", framework, *argv)
        return {t["name"]: t["bytes"] for t in d["memory"]["terms"]}

    # torchtitan 0.3.0 zeroes them in place under its CUDA-graphed step: held, never cached
    titan = terms("--model", "llama3.1-8b", "--seq-len", "8192", framework="torchtitan")
    assert "cached gradients (reduce-scatter stream)" not in titan and titan["gradients"] > 0

    full = terms("--model", "llama3.1-8b", "--seq-len", "8192")
    assert full["cached gradients (reduce-scatter stream)"] == full["gradients"]
    states = terms("--model", "llama3.1-8b")
    assert "cached gradients (reduce-scatter stream)" not in states and "freed 16-bit logits block" not in states
    assert states["cached all-gather buffers"] == full["cached all-gather buffers"]
    bare = terms("--params", "8e9")
    assert bare["cached all-gather buffers"] == 0 and "cached gradients (reduce-scatter stream)" not in bare


def test_memory_json_has_the_same_memory_keys_as_plan(capsys):
    _, mem = run_json(capsys, "memory", "--model", "llama3.1-8b", "--seq-len", "2048")
    _, plan = run_json(capsys, "plan", RECIPE, "--cluster", INV)
    assert set(mem["memory"]) == set(plan["memory"])


@pytest.mark.parametrize("argv, text", [
    (["--model-size-gb", "-3"], "error: --model-size-gb: expected a positive size in GB, got -3\n"),
    (["--model-size-gb", "nan"], "error: --model-size-gb: expected a positive size in GB, got nan\n"),
    (["--params", "0"], "error: --params: expected a parameter count such as 7.5e9, got 0\n"),
    (["--model-size-gb", "14", "--num-gpus", "-1"], "error: --num-gpus: expected a positive number of GPUs, got -1\n"),
    (["--model-size-gb", "14", "--gpu-memory-gb", "0"],
     "error: --gpu-memory-gb: expected a size in GB between 0 and 4096, got 0.0\n"),
    (["--model-size-gb", "14", "--zero-stage", "4"], "error: --zero-stage: expected 0, 1, 2 or 3, got 4\n"),
    (["--model-size-gb", "14", "--optimizer", "adamx"],
     "error: --optimizer: unknown value 'adamx'; did you mean 'adamw' or 'adam8bit' or 'adam-mini'? "
     "(allowed: adamw, adam8bit, adafactor, lion, adam-mini, sgd, sgd-momentum)\n"),
    (["--model-size-gb", "14", "--precision", "bf16"], "error: --precision: unknown value 'bf16'; did you mean "),
    (["--model", "llama3-8b"], "error: --model: unknown model preset 'llama3-8b'; did you mean 'llama3.1-8b'"),
])
def test_memory_bad_values_one_line_exit_2(capsys, argv, text):
    code, out, err = run(capsys, "memory", *argv)
    assert code == 2 and out == ""
    assert "Traceback" not in err
    assert err.startswith(text)
    assert err.count("\n") == 1, err  # one line


@pytest.mark.parametrize("argv", [
    ["--model", "llama3.1-8b", "--seq-len", "-5"],
    ["--model", "llama3.1-8b", "--seq-len", "0"],
    ["--model", "llama3.1-8b", "--seq-len", "4096", "--micro-batch-size", "0"],
    ["--model", "llama3.1-8b", "--seq-len", "4096", "--micro-batch-size", "-1"],
])
def test_memory_rejects_non_positive_sequence_and_batch(capsys, argv):
    code, _, err = run(capsys, "memory", *argv)
    assert code == 2 and "Traceback" not in err


def test_memory_absurd_sizes_do_not_crash(capsys):
    code, _, err = run(capsys, "memory", "--model", "gpt3-175b", "--seq-len", "16777216", "--micro-batch-size", "1000000")
    assert code == 3 and "Traceback" not in err  # valid sizes (within the schema's bounds) that cannot fit


def test_ctrl_c_wrapped_by_a_library_is_an_interrupt_not_an_internal_error(monkeypatch, capsys):
    # A library can turn the KeyboardInterrupt it receives into an error of its own (raised while
    # handling it); the user pressed Ctrl-C, so jobctl exits 130 ("interrupted"), not 70 with a
    # traceback (seen once in the Ctrl-C-at-any-moment test, tests/test_submit_interrupt.py).
    import jobctl.cli as cli

    def wrapped():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("initializer failed") from None  # context kept, cause suppressed

    monkeypatch.setattr(cli, "main", wrapped)
    with pytest.raises(SystemExit) as e:
        cli.run()
    assert e.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"

    def bug():
        raise ValueError("a real bug")

    monkeypatch.setattr(cli, "main", bug)
    with pytest.raises(SystemExit) as e:
        cli.run()
    assert e.value.code == 70
    assert "internal error" in capsys.readouterr().err
