"""Bad recipes and inventories: every problem reported at once as `file:line: key.path: ...`.

Each bad input is a small YAML file in tests/data/bad/ (or written to tmp_path) and each
test names the exact line the message must point to. Most cases run `jobctl.cli.main`
in-process (fast); tests/test_cli.py runs a representative set through `python -m jobctl`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from jobctl.cli import main  # this checkout's, whatever `pip install -e` points at (pyproject.toml: pythonpath)
from jobctl.config import loader as config
from jobctl.config import schema
from jobctl.errors import EXIT_USAGE, ConfigError

REPO = Path(__file__).resolve().parent.parent

BAD = "tests/data/bad"
GOOD = "tests/data/good"
INV = f"{GOOD}/inv_small.yaml"  # 2 nodes x 4 H100
RECIPE = f"{GOOD}/small.yaml"

# One reported problem: `file:line: key.path: message` (line and key may be absent:
# a file that cannot be read has no line; a YAML syntax error has no key).
ISSUE = re.compile(r"^(?P<file>[^:\s]+|<command line>)(?::(?P<line>\d+))?: (?:(?P<key>[\w.\-]+): )?(?P<msg>.+)$")

# Run from the repository root with only its clusters/; wide "terminal" so that rich does not
# wrap long messages (the wrapping itself is pinned in test_cli.py).
pytestmark = pytest.mark.usefixtures("repo_cli")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def issues_of(err: str) -> list[tuple[str, int | None, str | None, str]]:
    """Parse stderr into (file, line, key, message), asserting that every line is one issue."""
    assert "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    assert lines[0].startswith("error: "), err
    lines[0] = lines[0][len("error: "):]
    out = []
    for text in lines:
        m = ISSUE.match(text)
        assert m, f"not a `file:line: key: message` line: {text!r}"
        out.append((m["file"], int(m["line"]) if m["line"] else None, m["key"], m["msg"]))
    return out


def load_issues(path, model=schema.Recipe, overrides=None, checks=()) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config.load(path, model, overrides, checks)
    return [str(i) for i in e.value.issues]


# --- every bad recipe: exit 2, the exact lines, all problems at once ------------------------

# (fixture, [(file or None for the fixture itself, line, key, text the message must contain)])
RECIPE_CASES = [
    ("syntax_indent.yaml", [(None, 6, None, "YAML syntax error: mapping values are not allowed here")]),
    ("syntax_tab.yaml", [(None, 4, None, "found character '\\t' that cannot start any token")]),
    ("syntax_flow.yaml", [(None, 7, None, "(while parsing a flow sequence started at line 6)")]),
    ("syntax_quote.yaml", [(None, 2, None, "while scanning a quoted scalar that starts here")]),
    ("duplicate_key.yaml", [(None, 7, "train.seq_len", "duplicate key (first given at line 5)")]),
    ("not_a_mapping.yaml", [(None, 1, None, "expected a mapping of keys at the top level, got a list")]),
    ("empty.yaml", [(None, None, "name", "required key is missing"), (None, None, "model", "required key is missing"),
                    (None, None, "train", "required key is missing")]),
    ("unknown_keys.yaml", [
        (None, 7, "train.optimiser", "unknown key; did you mean 'optimizer'?"),
        (None, 9, "parallelism.tpp", "unknown key; did you mean 'tp'?"),
        (None, 10, "framwork", "unknown key; did you mean 'framework'?"),
    ]),
    ("wrong_types.yaml", [
        (None, 5, "train.seq_len", "got 'long'; expected an integer"),
        (None, 6, "train.global_batch_size", "got 1.5; expected a whole number"),
        (None, 7, "train.optimizer", "got 'adamx'; did you mean 'adamw'? allowed: 'adamw', 'adam8bit'"),
        (None, 8, "train.lora_targets", "got 'q'; expected a list"),
        (None, 10, "parallelism.pp", "got 'two'; allowed: an integer or 'auto'"),
        (None, 11, "parallelism.sequence_parallel", "got 'maybe'; allowed: true or false or 'auto'"),
        (None, 12, "parallelism.sharding", "got 'zero4'; did you mean 'zero3'? allowed: 'none', 'zero1', 'zero2', 'zero3', 'hsdp' or 'auto'"),
    ]),
    ("bool_as_number.yaml", [
        (None, 6, "train.global_batch_size", "got true; expected an integer"),
        (None, 8, "parallelism.tp", "got true; expected an integer or 'auto'"),
    ]),
    ("bad_sizes.yaml", [
        (None, 5, "model.layers", "got 0; must be greater than 0"),
        (None, 6, "model.hidden", "got 1000000000; must be at most 1048576"),
        (None, 7, "model.ffn_hidden", "got -1; must be greater than 0"),
        (None, 11, "train.seq_len", "got 0; must be greater than 0"),
        (None, 12, "train.global_batch_size", "got -8; must be greater than 0"),
        (None, 14, "parallelism.tp", "got 0; must be a positive integer up to 1048576 or 'auto'"),
        (None, 15, "parallelism.micro_batch_size", "got 99999999999; must be a positive integer up to 1048576"),
        (None, 17, "memory.safety_margin_gib", "got -1; must be at least 0"),
    ]),
    ("unknown_preset.yaml", [
        (None, 3, "model", "unknown model preset 'llama3-8b'; did you mean 'llama3.1-8b'"),
        (None, 5, "train.seq_len", "got -1; must be greater than 0"),
    ]),
    ("model_shapes.yaml", [(None, 3, "model", "hidden (100) must be divisible by heads (3)")]),
    ("model_typo.yaml", [
        (None, 3, "model.heads", "required key is missing; add it"),
        (None, 8, "model.heds", "unknown key; did you mean 'heads'?"),
    ]),
    ("interp_missing.yaml", [(None, 5, "train.seq_len",
                              "cannot resolve interpolation '${train.seqlen}': Interpolation key 'train.seqlen' not found")]),
    ("missing_value.yaml", [(None, 5, "train.seq_len", "is '???' (a value that must be given)")]),
    ("plan_outside_launch.yaml", [(None, 3, "description", "${plan.*} is only known under launch:")]),
    ("base_child.yaml", [
        ("base_parent.yaml", 5, "train.seq_len", "got -2048; must be greater than 0"),
        (None, 5, "train.global_batch_size", "got 0; must be greater than 0"),
    ]),
    ("base_syntax_child.yaml", [("base_syntax_parent.yaml", 6, None, "YAML syntax error: mapping values")]),
    ("base_circular_a.yaml", [("base_circular_b.yaml", 2, "base",
                               "circular base: tests/data/bad/base_circular_a.yaml -> tests/data/bad/base_circular_b.yaml"
                               " -> tests/data/bad/base_circular_a.yaml")]),
    ("base_self.yaml", [(None, 2, "base", "circular base: tests/data/bad/base_self.yaml -> tests/data/bad/base_self.yaml")]),
    ("base_missing.yaml", [(None, 2, "base", "file not found: tests/data/bad/no_such_base.yaml")]),
]


@pytest.mark.parametrize("fixture, expected", RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_bad_recipe_reports_every_problem_at_its_line(capsys, fixture, expected):
    code, out, err = run(capsys, "plan", f"{BAD}/{fixture}", "--cluster", INV)
    assert code == EXIT_USAGE == 2
    assert out == ""  # stdout is data only
    got = issues_of(err)
    want = [(f"{BAD}/{f or fixture}", line, key, text) for f, line, key, text in expected]
    assert [(f, line, key) for f, line, key, _ in got] == [(f, line, key) for f, line, key, _ in want], err
    for (_, _, _, msg), (_, _, _, text) in zip(got, want):
        assert text in msg


INVENTORY_CASES = [
    ("inv_unknown_gpu.yaml", [
        (5, "partitions.0.gpu", "unknown GPU 'h100-sxm-80g'; did you mean 'h100-sxm-80gb'"),
        (10, "partitions.1.gpu", "unknown GPU 'tpu-v5' (allowed: a100-sxm-40gb,"),
        (11, "partitions.1.gpus_per_node", "got 0; must be greater than 0"),
    ]),
    ("inv_bad_values.yaml", [
        (3, "schedular", "unknown key; did you mean 'scheduler'?"),
        (8, "partitions.0.nodes", "got -1; must be greater than 0"),
        (9, "partitions.0.nodez", "unknown key; did you mean 'nodes'?"),
        (10, "partitions.0.mem_gib", "got 100000; must be at most 65536"),
        (12, "env.NCCL_DEBUG", "got 1; expected a string"),  # an upper-case user key keeps its name
    ]),
    ("inv_no_partitions.yaml", [(3, "partitions", "got []; needs at least 1 item")]),
]


@pytest.mark.parametrize("fixture, expected", INVENTORY_CASES, ids=[c[0] for c in INVENTORY_CASES])
def test_bad_inventory_reports_every_problem_at_its_line(capsys, fixture, expected):
    code, out, err = run(capsys, "plan", RECIPE, "--cluster", f"{BAD}/{fixture}")
    assert code == 2 and out == ""
    got = issues_of(err)
    assert [(f, line, key) for f, line, key, _ in got] == [(f"{BAD}/{fixture}", line, key) for line, key, _ in expected], err
    for (*_, msg), (*_, text) in zip(got, expected):
        assert text in msg


# --- golden messages: the exact text for a few key cases ------------------------------------

def test_golden_unknown_keys_stderr(capsys):
    code, _, err = run(capsys, "plan", f"{BAD}/unknown_keys.yaml", "--cluster", INV)
    assert code == 2
    assert err == (
        "error: tests/data/bad/unknown_keys.yaml:7: train.optimiser: unknown key; did you mean 'optimizer'? "
        "(allowed here: adam_beta1, adam_beta2, adam_eps, attention, checkpoint_interval, compile, cuda_graphs, "
        "ep_overlap, fp8_recipe, "
        "fused_cross_entropy, "
        "global_batch_size, "
        "grad_clip, grad_reduce, lora_rank, lora_targets, lr, lr_schedule, method, min_lr, moe_dispatcher, optimizer, "
        "precision, recompute_modules, seed, "
        "seq_len, "
        "steps, tokens, warmup_steps, weight_decay)\n"
        "tests/data/bad/unknown_keys.yaml:9: parallelism.tpp: unknown key; did you mean 'tp'? "
        "(allowed here: cp, dp, ep, micro_batch_size, offload, pp, recompute, sequence_parallel, sharding, tp, "
        "virtual_stages)\n"
        "tests/data/bad/unknown_keys.yaml:10: framwork: unknown key; did you mean 'framework'? "
        "(allowed here: description, framework, launch, memory, model, name, parallelism, resources, tokenizer, "
        "train)\n"
    )


def test_golden_wrong_types():
    assert load_issues(f"{BAD}/wrong_types.yaml") == [
        "tests/data/bad/wrong_types.yaml:5: train.seq_len: got 'long'; expected an integer",
        "tests/data/bad/wrong_types.yaml:6: train.global_batch_size: got 1.5; expected a whole number",
        "tests/data/bad/wrong_types.yaml:7: train.optimizer: got 'adamx'; did you mean 'adamw'? allowed: "
        "'adamw', 'adam8bit', 'adafactor', 'lion', 'adam-mini', 'sgd' or 'sgd-momentum'",
        "tests/data/bad/wrong_types.yaml:8: train.lora_targets: got 'q'; expected a list",
        "tests/data/bad/wrong_types.yaml:10: parallelism.pp: got 'two'; allowed: an integer or 'auto'",
        "tests/data/bad/wrong_types.yaml:11: parallelism.sequence_parallel: got 'maybe'; allowed: true or false or 'auto'",
        "tests/data/bad/wrong_types.yaml:12: parallelism.sharding: got 'zero4'; did you mean 'zero3'? allowed: "
        "'none', 'zero1', 'zero2', 'zero3', 'hsdp' or 'auto'",
    ]


def test_golden_syntax_error():
    assert load_issues(f"{BAD}/syntax_indent.yaml") == [
        "tests/data/bad/syntax_indent.yaml:6: YAML syntax error: mapping values are not allowed here; "
        "fix the indentation or quoting there",
    ]


def test_golden_base_errors_point_into_each_file():
    assert load_issues(f"{BAD}/base_child.yaml") == [
        "tests/data/bad/base_parent.yaml:5: train.seq_len: got -2048; must be greater than 0",
        "tests/data/bad/base_child.yaml:5: train.global_batch_size: got 0; must be greater than 0",
    ]


def test_golden_unknown_gpu():
    from jobctl.planning.load import _check_gpus

    assert load_issues(f"{BAD}/inv_unknown_gpu.yaml", schema.Inventory, checks=(_check_gpus,))[0] == (
        "tests/data/bad/inv_unknown_gpu.yaml:5: partitions.0.gpu: unknown GPU 'h100-sxm-80g'; did you mean "
        "'h100-sxm-80gb' or 'a100-sxm-80gb' or 'a100-sxm-40gb'? (allowed: a100-sxm-40gb, a100-sxm-80gb, a10g-24gb, "
        "b200-192gb, cpu, gb200-186gb, h100-pcie-80gb, h100-sxm-80gb, h200-141gb, l40s-48gb, mi300x-192gb, rtx4090-24gb, v100-32gb)"
    )


@pytest.mark.parametrize("fixture", ["wrong_types.yaml", "bad_sizes.yaml", "unknown_keys.yaml", "bool_as_number.yaml"])
def test_fast_path_and_omegaconf_path_agree(fixture):
    """Plain files skip omegaconf; an override forces it. The problems must be the same."""
    plain = load_issues(f"{BAD}/{fixture}")
    forced = load_issues(f"{BAD}/{fixture}", overrides=["name=x"])  # `name: x` in every fixture
    assert plain == forced


# --- key=value overrides: errors point at `<command line>` -----------------------------------

OVERRIDE_CASES = [
    ("train.seq_len=abc", "<command line>: train.seq_len: got 'abc'; expected an integer"),
    ("train.seq_len=", "<command line>: train.seq_len: got an empty value; expected an integer"),
    ("train.global_batch_size=0", "<command line>: train.global_batch_size: got 0; must be greater than 0"),
    ("parallelism.tp=true", "<command line>: parallelism.tp: got true; expected an integer or 'auto'"),
    ("parallelism.virtual_stages=0", "<command line>: parallelism.virtual_stages: must be between 1 and 128 (model "
                                     "chunks per pipeline rank), or auto (got 0)"),
    ("parallelism.virtual_stages=two", "<command line>: parallelism.virtual_stages: got 'two'; allowed: an integer or "
                                       "'auto'"),
    ("parallelism.recompute=fll", "<command line>: parallelism.recompute: got 'fll'; did you mean 'full'? allowed: "
                                  "'none', 'selective', 'full' or 'auto'"),
    ("trian.seq_len=5", "<command line>: trian: unknown key; did you mean 'train'?"),
    ("train.seq_len.x=5", "<command line>: train.seq_len: got {'x': 5}; expected an integer"),
    ("train.lora_targets=[q,zz]", "<command line>: train.lora_targets.1: got 'zz'"),
    ("train.seq_len=${nothere}", "<command line>: train.seq_len: cannot resolve interpolation '${nothere}'"),
    ("train.seq_len=[1", "<command line>: train.seq_len: cannot parse the value '[1'"),
    ("model=llama3-8b", "<command line>: model: unknown model preset 'llama3-8b'; did you mean 'llama3.1-8b'"),
    ("seq_len", "<command line>: seq_len: expected key=value with a dotted key"),
    ("=5", "<command line>: =5: expected key=value"),
]


@pytest.mark.parametrize("override, expected", OVERRIDE_CASES, ids=[c[0] for c in OVERRIDE_CASES])
def test_override_errors_point_at_the_command_line(capsys, override, expected):
    code, out, err = run(capsys, "plan", RECIPE, "--cluster", INV, override)
    assert code == 2 and out == ""
    issues_of(err)  # well-formed, no traceback
    assert err.startswith("error: " + expected), err
    assert err.count("\n") == 1  # exactly one problem


def test_override_and_file_errors_are_reported_together(capsys):
    code, _, err = run(capsys, "plan", f"{BAD}/bad_sizes.yaml", "--cluster", INV, "train.optimizer=adamx", "framework=jax")
    assert code == 2
    got = issues_of(err)
    files = [f for f, *_ in got]
    assert files[:8] == [f"{BAD}/bad_sizes.yaml"] * 8  # the file's eight, in line order, then the command line
    assert [line for _, line, *_ in got[:8]] == [5, 6, 7, 11, 12, 14, 15, 17]
    assert sorted((f, key) for f, _, key, _ in got[8:]) == [("<command line>", "framework"),
                                                           ("<command line>", "train.optimizer")]


def test_override_replaces_a_missing_value(capsys):
    code, out, _ = run(capsys, "plan", f"{BAD}/missing_value.yaml", "--cluster", INV, "train.seq_len=1024", "--json")
    assert code == 0
    import json

    assert json.loads(out)["train"]["seq_len"] == 1024


def test_override_of_a_key_from_the_base_points_at_the_command_line():
    assert load_issues(f"{GOOD}/child.yaml", overrides=["train.global_batch_size=-1"]) == [
        "<command line>: train.global_batch_size: got -1; must be greater than 0",
    ]


def test_override_of_a_list_item_by_index():
    loaded = config.load(INV, schema.Inventory, ["partitions.0.nodes=1", "partitions[0].gpus_per_node=2"])
    part = loaded.value.partitions[0]
    assert (part.nodes, part.gpus_per_node) == (1, 2)
    assert load_issues(INV, schema.Inventory, ["partitions.3.nodes=1"])[0].startswith(
        "<command line>: partitions.3.nodes: cannot apply the override: ")


# --- interpolation, inheritance, launch --------------------------------------------------------

def test_interpolation_and_base_inheritance_work():
    loaded = config.load(f"{GOOD}/child.yaml", schema.Recipe)
    r = loaded.value
    assert r.name == "small-llama-child"  # ${model.name}-child, model from the base
    assert r.train.seq_len == 256  # ${model.hidden}
    assert r.train.global_batch_size == 16  # from the base
    assert loaded.lines[("train", "seq_len")] == (f"{GOOD}/child.yaml", 5)
    assert loaded.lines[("train", "global_batch_size")] == (f"{GOOD}/small.yaml", 14)


@pytest.mark.parametrize("fixture", ["child.yaml", "launch_plan.yaml"])
def test_launch_plan_interpolation_is_left_for_submit_time(capsys, fixture):
    """`${plan.tp}` in launch: is not resolved (nor an error) at plan time."""
    loaded = config.load(f"{GOOD}/{fixture}", schema.Recipe)
    cmd = loaded.value.launch.command
    text = cmd if isinstance(cmd, str) else " ".join(cmd)
    assert "${plan.tp}" in text
    code, _, err = run(capsys, "plan", f"{GOOD}/{fixture}", "--cluster", INV)
    assert code == 0, err


def test_launch_plan_interpolation_given_as_an_override(capsys):
    code, _, err = run(capsys, "plan", RECIPE, "--cluster", INV, "launch.command=python t.py --tp ${plan.tp}")
    assert code == 0, err


def test_base_is_relative_to_the_recipe_folder_not_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "common").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "common" / "base.yaml").write_text((REPO / RECIPE).read_text())
    (tmp_path / "runs" / "run.yaml").write_text("base: ../common/base.yaml\nname: run\ntrain:\n  seq_len: 512\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = config.load(tmp_path / "runs" / "run.yaml", schema.Recipe).value
    assert (r.name, r.train.seq_len, r.train.global_batch_size) == ("run", 512, 16)


def test_base_chain_of_three_reports_the_deepest_error_in_its_file(tmp_path):
    (tmp_path / "a.yaml").write_text("name: a\nmodel: llama3.1-8b\ntrain:\n  seq_len: 2048\n  global_batch_size: 8\n"
                                     "  precision: bf16\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nname: b\n")
    (tmp_path / "c.yaml").write_text("# top\nbase: b.yaml\nname: c\n")
    [msg] = load_issues(tmp_path / "c.yaml")
    assert msg.startswith(f"{tmp_path / 'a.yaml'}:6: train.precision: got 'bf16'; did you mean 'bf16-mixed'? ")


@pytest.mark.parametrize("base, problem", [
    ("5", "got 5; expected the path of a YAML file"),
    ("''", "got ''; expected the path of a YAML file"),
    (".", "is a directory; give the path to a YAML file"),
])
def test_bad_base_values(tmp_path, base, problem):
    (tmp_path / "r.yaml").write_text(f"name: r\nbase: {base}\n")
    [msg] = load_issues(tmp_path / "r.yaml")
    assert msg.startswith(f"{tmp_path / 'r.yaml'}:2: base: ") and problem in msg


# --- files that are missing or cannot be read --------------------------------------------------

def test_missing_recipe_file(capsys):
    code, out, err = run(capsys, "plan", "tests/data/bad/no_such_recipe.yaml", "--cluster", INV)
    assert code == 2 and out == ""
    assert err == ("error: tests/data/bad/no_such_recipe.yaml: file not found; check the path "
                   "(recipes live in recipes/, inventories in clusters/)\n")


def test_unknown_recipe_name_suggests_a_close_one(capsys):
    code, _, err = run(capsys, "plan", "llama8", "--cluster", INV)
    assert code == 2
    assert err.startswith("error: llama8: no such recipe file or name; did you mean 'llama8b'? (recipes: ")


def test_recipe_name_is_looked_up_in_recipes(capsys):
    code, _, err = run(capsys, "plan", "tiny", "--cluster", "local")
    assert code == 0, err


def test_directory_instead_of_a_recipe(capsys):
    code, _, err = run(capsys, "plan", "tests/data", "--cluster", INV)
    assert code == 2
    assert err == "error: tests/data: is a directory; give the path to a YAML file\n"


def test_directory_instead_of_an_inventory(capsys, tmp_path):
    d = tmp_path / "inv.yaml"
    d.mkdir()
    code, _, err = run(capsys, "plan", RECIPE, "--cluster", str(d))
    assert code == 2
    assert err == f"error: {d}: is a directory; give the path to a YAML file\n"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads mode-000 files; the same path is covered with a simulated PermissionError below")
def test_unreadable_file_mode_000(capsys, tmp_path):
    p = tmp_path / "secret.yaml"
    p.write_text((REPO / RECIPE).read_text())
    p.chmod(0)
    code, _, err = run(capsys, "plan", str(p), "--cluster", INV)
    assert code == 2
    assert err == f"error: {p}: cannot read the file: permission denied; check its mode (chmod +r)\n"


def test_unreadable_file_permission_error(capsys, tmp_path, monkeypatch):
    p = tmp_path / "secret.yaml"
    p.write_text((REPO / RECIPE).read_text())
    real = os.open

    def os_open(path, *a, **k):  # how the loader opens a file (jobctl/config/loader.py read_bounded)
        if os.path.basename(path) == "secret.yaml":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", os_open)
    code, _, err = run(capsys, "plan", str(p), "--cluster", INV)
    assert code == 2
    assert err == f"error: {p}: cannot read the file: permission denied; check its mode (chmod +r)\n"


def test_not_utf8(capsys, tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    code, _, err = run(capsys, "plan", str(p), "--cluster", INV)
    assert code == 2
    assert err.startswith(f"error: {p}: not a UTF-8 text file (invalid continuation byte at byte 9)")


# --- both files at once ------------------------------------------------------------------------

def test_load_request_reports_recipe_and_inventory_problems_together():
    from jobctl.planning import load_request

    with pytest.raises(ConfigError) as e:
        load_request(f"{BAD}/unknown_preset.yaml", [], [f"{BAD}/inv_unknown_gpu.yaml", "local"])
    files = [i.file for i in e.value.issues]
    assert files == [f"{BAD}/unknown_preset.yaml"] * 2 + [f"{BAD}/inv_unknown_gpu.yaml"] * 3
    rec, invs = load_request(RECIPE, [], [INV, "h100"])
    assert rec.value.name == "small" and [i.value.name for i in invs] == ["small", "h100"]
