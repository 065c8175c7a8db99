"""Planning for failures (issue 30): checkpoint size, write time, interruptions and the Young
interval, derived by hand here from the Llama 3 paper's figures and the model's own numbers."""

import math

import pytest

from jobctl.planner import resilience as r
from jobctl.planning import load_inventory, load_recipe, plan_on


def test_the_llama3_rate_is_one_interruption_every_three_hours_at_their_scale():
    # Llama 3 paper, section 3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs
    # (2,048 nodes of 8); the paper says "about one every three hours"
    res = r.plan_for_failures(1e12, nodes=2048, step_s=10.0, time_to_train_s=None)
    assert res.mtbi_s / 3600 == pytest.approx(54 * 24 / 419, rel=1e-9)
    assert 2.5 < res.mtbi_s / 3600 < 3.5


def test_young_interval_and_waste_by_hand():
    # 1 TB over 16 nodes at 2 GB/s each: 31.25 s; 16 nodes at the Llama 3 rate:
    # M = 86400 / (16 * 419 / (54 * 2048)) s; tau = sqrt(2 * 31.25 * M); 60 s steps
    write = 1e12 / (2e9 * 16)
    m = 86400 / (16 * 419 / (54 * 2048))
    tau = math.sqrt(2 * write * m)
    steps = round(tau / 60)
    res = r.plan_for_failures(1e12, nodes=16, step_s=60.0, time_to_train_s=100 * 3600.0)
    assert res.write_s == pytest.approx(write) and res.mtbi_s == pytest.approx(m)
    assert res.interval_steps == steps
    waste = write / (steps * 60) + (steps * 60 + write) / (2 * m) + 600 / m
    assert res.waste == pytest.approx(waste) and res.goodput == pytest.approx(1 / (1 + waste))
    assert res.time_to_train_s == pytest.approx(100 * 3600 * (1 + waste))


def test_a_partition_says_its_own_bandwidth_and_rate():
    res = r.plan_for_failures(1e12, nodes=4, step_s=1.0, time_to_train_s=3600.0, write_gbs_per_node=10.0,
                              interruptions_per_node_day=0.0)
    assert res.write_s == pytest.approx(1e12 / (10e9 * 4))
    assert math.isinf(res.mtbi_s) and res.interval_steps == 0 and res.goodput == 1.0


def test_the_plan_reports_a_checkpoint_of_each_state_once():
    """Llama 3.1 70B under Megatron's mixed precision with AdamW: 2 B weights + 4 B fp32 master +
    2 x 4 B moments per parameter are written (gradients are not), whatever the sharding."""
    rec = load_recipe("recipes/llama70b.yaml", [])
    d = plan_on(rec, load_inventory("h100", []), alternatives=0).to_dict()
    block = d["resilience"]
    assert block["checkpoint_bytes"] == pytest.approx(d["model"]["params"] * (2 + 4 + 2 * 4), rel=1e-9)
    nodes = d["plan"]["nodes"]
    assert block["write_s"] == pytest.approx(block["checkpoint_bytes"] / (2e9 * nodes), abs=0.1)
    assert block["time_to_train_s"] > d["estimate"]["time_to_train_s"]
    faster = load_inventory("h100", ["partitions.0.checkpoint_write_gbs_per_node=20"])
    assert plan_on(rec, faster, alternatives=0).to_dict()["resilience"]["goodput"] > block["goodput"]


def test_the_405b_plan_on_16384_gpus_prints_the_interval_the_checkpoint_time_and_goodput(tmp_path):
    """Issue 30: `plan` for the 405B recipe on 2,048 nodes of 8 H100s says how often to
    checkpoint, how long one takes and the goodput (the figures are the JSON's, shown)."""
    import json

    from jobctl_run import jobctl
    from plan_snapshot import BIG_CLUSTER

    inv = tmp_path / "h100-16k.yaml"
    inv.write_text(BIG_CLUSTER)
    home = {"JOBCTL_HOME": str(tmp_path / "home")}
    args = ("plan", "recipes/llama405b.yaml", "resources.nodes=2048", "--cluster", str(inv))
    data = json.loads(jobctl(*args, "--json", env=home).stdout)
    r = data["resilience"]
    assert data["plan"]["world_size"] == 16384 and 0.5 < r["goodput"] < 1 and r["interval_steps"] >= 1
    # 2,048 nodes at the Llama 3 rate: one interruption every 6,335 node-hours / 2,048 = 3.1 h
    assert r["mtbi_h"] == pytest.approx(54 * 24 * 2048 / 419 / 2048, rel=0.01)
    text = jobctl(*args, env=home).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("goodput"))
    assert f"goodput {r['goodput']:.0%}" in line and f"/ {r['interval_steps']:,} steps" in line
    assert "checkpoint in" in line and "hang after" in line
    assert f"with failures (1/{r['mtbi_h']:,.0f} h)" in text
