"""The validated-input cache: a hit gives the same plan without YAML or pydantic; any change
to the file is a miss; a broken cache is only a miss."""

import json
import subprocess
import sys
from pathlib import Path

from jobctl_run import jobctl

ROOT = Path(__file__).resolve().parent.parent


def plan_json(home, recipe="recipes/llama70b.yaml", **env):
    p = jobctl("plan", recipe, "--cluster", "h100", "--json", env={"JOBCTL_CACHE": str(home), **env})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_hit_gives_the_same_plan(tmp_path):
    first = plan_json(tmp_path)
    assert len(list((tmp_path / "validated").glob("*.json"))) == 2  # recipe + inventory
    second = plan_json(tmp_path)
    assert first == second
    assert first == plan_json(tmp_path / "other", JOBCTL_NO_CACHE="1")


def test_a_hit_imports_neither_pydantic_nor_yaml(tmp_path):
    plan_json(tmp_path)
    code = ("import sys; from jobctl.planning import load_recipe, load_inventory, plan_on; "
            "r = plan_on(load_recipe('recipes/llama70b.yaml', []), load_inventory('h100')); "
            "print(r.feasible, 'pydantic' in sys.modules, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"JOBCTL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["True", "False", "False"], out.stderr


def test_an_edited_file_is_validated_again(tmp_path):
    recipe = tmp_path / "r.yaml"
    text = (ROOT / "recipes" / "llama70b.yaml").read_text()
    recipe.write_text(text)
    assert plan_json(tmp_path / "h", str(recipe))["train"]["seq_len"] == 8192
    recipe.write_text(text.replace("seq_len: 8192", "seq_len: 4096"))
    assert plan_json(tmp_path / "h", str(recipe))["train"]["seq_len"] == 4096
    recipe.write_text(text.replace("seq_len: 8192", "seq_len: -1"))
    p = jobctl("plan", str(recipe), "--cluster", "h100", env={"JOBCTL_CACHE": str(tmp_path / "h")})
    assert p.returncode == 2 and "seq_len" in p.stderr


def test_a_corrupt_entry_is_a_miss(tmp_path):
    first = plan_json(tmp_path)
    for entry in (tmp_path / "validated").glob("*.json"):
        entry.write_text("{not json")
    assert plan_json(tmp_path) == first


def test_a_hit_keeps_which_fields_the_document_gave(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_CACHE", str(tmp_path))
    from jobctl.planning import load_inventory

    inv = tmp_path / "inv.yaml"
    inv.write_text("name: x\nlogin: {host: 127.0.0.1, port: 2222}\n"
                   "partitions: [{name: p, gpu: cpu, gpus_per_node: 1, nodes: 1, mem_gib: 16}]\n")
    cold = load_inventory(str(inv)).value
    warm = load_inventory(str(inv)).value
    assert type(warm).__name__ == "Values"  # the second load came from the cache
    assert warm.login.model_fields_set == cold.login.model_fields_set == {"host", "port"}
    assert warm.login.known_hosts == cold.login.known_hosts
    assert warm.model_dump() == cold.model_dump()
