"""`jobctl clusters discover` / `check`: parsing of captured Slurm output (tests/data/slurm/) and
end-to-end runs on the real dev cluster (locally and over SSH).

dev-*.txt were captured from scripts/dev-cluster.sh's cluster (Slurm 22.05.8); dev-drained-* with
node2 drained; multi-* are hand-written in the same format (typed/untyped GRES, socket specs,
drained and down nodes, a CPU partition, a partition without nodes, several MaxTime forms).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from ssh_fixture import ssh_cluster  # noqa: F401  (pytest fixture)

from jobctl.backends import discover as d
from jobctl.cli import main
from jobctl.config.schema import Inventory
from jobctl.planner.catalog import gpu_names

DATA = Path(__file__).parent / "data" / "slurm"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def _facts(prefix: str, node_file: str | None = None):
    part = _read(f"{prefix}-scontrol-partition.txt") if (DATA / f"{prefix}-scontrol-partition.txt").exists() else ""
    return d.cluster_facts(_read(f"{prefix}-sinfo.txt"), part, _read(node_file or f"{prefix}-scontrol-node.txt"))


# --- parsing ---------------------------------------------------------------------------------------


def test_dev_sinfo():
    (row,) = d.parse_sinfo(_read("dev-sinfo.txt"))
    assert (row.partition, row.default, row.avail, row.time_limit) == ("gpu", True, "up", "infinite")
    assert (row.nodes, row.cpus, row.memory_mb, row.gres, row.nodelist) == (2, 16, 64000, "gpu:h100:8", "node[1-2]")


def test_dev_scontrol_nodes():
    nodes = d.parse_scontrol(_read("dev-scontrol-node.txt"))
    assert [n["NodeName"] for n in nodes] == ["node1", "node2"]
    n = nodes[0]
    assert (n["CPUTot"], n["RealMemory"], n["Gres"], n["State"], n["Partitions"]) == ("16", "64000", "gpu:h100:8", "IDLE", "gpu")
    assert n["OS"].startswith("Linux ") and "#1 SMP" in n["OS"]  # a value with spaces
    assert n["AllocTRES"] == ""


def test_dev_facts():
    (f,) = _facts("dev")
    assert (f.name, f.gres_type, f.gpus_per_node, f.nodes) == ("gpu", "h100", 8, 2)
    assert (f.cpus_per_node, f.mem_gib, f.time_limit, f.raw_time_limit, f.default) == (16, 62, None, "UNLIMITED", True)
    assert f.drained == [] and f.down == [] and f.other_shapes == 0


def test_dev_drained_capture():
    (f,) = _facts("dev", "dev-drained-scontrol-node.txt")
    assert f.nodes == 2 and f.drained == ["node2"] and f.down == []


def test_multi_facts():
    facts = {f.name: f for f in _facts("multi")}
    assert list(facts) == ["batch", "h100", "cpu", "debug", "empty"]
    b = facts["batch"]
    assert (b.gres_type, b.gpus_per_node, b.nodes, b.cpus_per_node, b.mem_gib, b.time_limit, b.default) == \
        ("a100", 4, 3, 64, 502, "1-00:00:00", True)
    h = facts["h100"]
    assert (h.gres_type, h.gpus_per_node, h.nodes, h.cpus_per_node, h.mem_gib, h.time_limit) == \
        ("h100", 8, 4, 96, 2014, None)
    assert h.drained == ["h02", "h04"] and h.down == ["h03"]
    c = facts["cpu"]
    assert (c.has_gpus, c.nodes, c.cpus_per_node, c.mem_gib, c.time_limit) == (False, 2, 128, 250, "2-00:00:00")
    g = facts["debug"]
    assert (g.gres_type, g.gpus_per_node, g.nodes, g.time_limit) == (None, 8, 1, "30:00")
    assert facts["empty"].nodes == 0


def test_facts_from_sinfo_only():
    facts = {f.name: f for f in d.cluster_facts(_read("multi-sinfo.txt"), "", "")}
    assert (facts["batch"].gpus_per_node, facts["batch"].nodes, facts["batch"].source) == (4, 3, "sinfo")
    assert facts["batch"].time_limit == "1-00:00:00" and facts["h100"].time_limit is None


@pytest.mark.parametrize("text, want", [
    ("gpu:h100:8", [d.Gres("gpu", "h100", 8)]),
    ("gpu:8", [d.Gres("gpu", None, 8)]),
    ("gpu:a100:4(S:0-1)", [d.Gres("gpu", "a100", 4)]),
    ("gpu:h100:4(S:0),gpu:a100:2(S:1)", [d.Gres("gpu", "h100", 4), d.Gres("gpu", "a100", 2)]),
    ("gpu:mi300x:8(S:0-1),nvme:1", [d.Gres("gpu", "mi300x", 8), d.Gres("nvme", None, 1)]),
    ("(null)", []),
    ("", []),
])
def test_parse_gres(text, want):
    assert d.parse_gres(text) == want


def test_gpus_of():
    assert d.gpus_of("gpu:a100:4(S:0-1)") == ("a100", 4)
    assert d.gpus_of("gpu:8") == (None, 8)
    assert d.gpus_of("(null)") == (None, 0)
    assert d.gpus_of("shard:h100:64,gpu:h100:8") == ("h100", 8)


@pytest.mark.parametrize("state, want", [
    ("IDLE", "up"), ("MIXED", "up"), ("ALLOCATED", "up"), ("IDLE+DRAIN", "drained"), ("DRAINED", "drained"),
    ("MIXED+DRAIN", "drained"), ("DRAINING", "drained"), ("DOWN", "down"), ("DOWN*", "down"), ("IDLE*", "down"),
    ("DOWN+DRAIN", "drained"), ("FAIL", "down"),
])
def test_node_state(state, want):
    assert d.node_state(state) == want


def test_kv_line_values_with_spaces():
    kv = d.parse_kv_line("NodeName=h02 State=IDLE+DRAIN Reason=bad gpu 3 [admin@2026-11-20T09:00:00] Partitions=h100")
    assert kv == {"NodeName": "h02", "State": "IDLE+DRAIN", "Reason": "bad gpu 3 [admin@2026-11-20T09:00:00]",
                  "Partitions": "h100"}


def test_time_limit_and_memory():
    assert d.time_limit("UNLIMITED") is None and d.time_limit("infinite") is None
    assert d.time_limit("1-00:00:00") == "1-00:00:00" and d.time_limit("30:00") == "30:00"
    assert d.mib_to_gib(64000) == 62 and d.mib_to_gib(65536) == 64


def test_cluster_name():
    assert d.parse_cluster_name("AuthType = auth/munge\nClusterName             = jobctl-dev\n") == "jobctl-dev"


# --- GPU mapping and the YAML ------------------------------------------------------------------------


def test_gpu_mapping():
    keys = gpu_names()
    assert d.gpu_choices("h100", keys) == ("h100-sxm-80gb",)
    assert d.gpu_choices("mi300x", keys) == ("mi300x-192gb",)
    assert d.gpu_choices("h200", keys) == ("h200-141gb",)
    assert d.gpu_choices("a100-sxm-40gb", keys) == ("a100-sxm-40gb",)  # a catalog key as GRES type
    assert set(d.gpu_choices("a100", keys)) == {"a100-sxm-80gb", "a100-sxm-40gb"}
    assert "cpu" not in d.gpu_choices(None, keys) and len(d.gpu_choices(None, keys)) > 2


def test_ambiguous_asks_for_gpu_map():
    facts = _facts("multi")
    with pytest.raises(d.AmbiguousGPU) as e:
        d.resolve_gpus(facts, {}, gpu_names())
    msg = e.value.message()
    assert "--gpu-map a100=a100-sxm-80gb" in msg and "--gpu-map a100=a100-sxm-40gb" in msg
    assert "--gpu-map gpu=" in msg and "debug" in msg
    gpus = d.resolve_gpus(facts, {"a100": "a100-sxm-40gb", "gpu": "l40s-48gb"}, gpu_names())
    assert gpus == {"batch": "a100-sxm-40gb", "h100": "h100-sxm-80gb", "cpu": "cpu", "debug": "l40s-48gb"}


def test_multi_yaml_is_a_valid_inventory():
    facts = _facts("multi")
    gpus = d.resolve_gpus(facts, {"a100": "a100-sxm-80gb", "gpu": "h100-sxm-80gb"}, gpu_names())
    text = d.inventory_yaml("big", facts, gpus, source="test", login={"host": "login.example.org"})
    assert "# RealMemory" in text and "# skipped (no nodes): empty" in text
    inv = Inventory.model_validate(yaml.safe_load(text))
    parts = {p.name: p for p in inv.partitions}
    assert list(parts) == ["batch", "h100", "cpu", "debug"]
    assert (parts["batch"].gpu, parts["batch"].gpus_per_node, parts["batch"].nodes, parts["batch"].mem_gib,
            parts["batch"].time_limit) == ("a100-sxm-80gb", 4, 3, 502, "1-00:00:00")
    assert parts["debug"].time_limit == "30:00"  # quoted: YAML 1.1 would read 30:00 as 1800
    assert parts["cpu"].gpu == "cpu" and parts["h100"].time_limit is None
    assert inv.login.host == "login.example.org"
    # and it has no drift against the facts it came from, except the drained/down nodes
    rows = d.compare(inv, facts, gpu_names())
    bad = [(r.partition, r.what) for r in rows if r.status != "ok"]
    assert bad == [("h100", "nodes available")]


def test_compare_reports_each_kind_of_drift():
    inv = Inventory.model_validate({"name": "x", "partitions": [
        {"name": "batch", "gpu": "a100-sxm-80gb", "gpus_per_node": 8, "nodes": 3, "cpus_per_node": 64, "mem_gib": 502,
         "time_limit": "24:00:00"},
        {"name": "gone", "gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": 1, "mem_gib": 10},
        {"name": "debug", "gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": 1, "cpus_per_node": 16, "mem_gib": 100},
    ]})
    rows = {(r.partition, r.what): r for r in d.compare(inv, _facts("multi"), gpu_names())}
    assert rows[("batch", "gpus_per_node")].status == "changed"
    assert rows[("batch", "time_limit")].status == "ok"  # 24:00:00 == 1-00:00:00
    assert rows[("batch", "nodes")].status == "ok" and rows[("batch", "mem_gib")].status == "ok"
    assert rows[("gone", "partition")].status == "missing"
    assert rows[("debug", "cpus_per_node")].status == "changed"
    assert rows[("debug", "mem_gib")].status == "changed"
    assert rows[("debug", "time_limit")].status == "changed"  # unlimited in the inventory, 30:00 now
    assert rows[("h100", "partition")].status == "extra" and rows[("cpu", "partition")].status == "extra"
    assert ("empty", "partition") not in rows  # no nodes: not worth an inventory entry


# --- the CLI without a cluster ------------------------------------------------------------------------


@pytest.fixture
def multi_cluster(monkeypatch):
    from jobctl.planning import clusters

    monkeypatch.setattr(clusters, "snapshot", lambda login=None, cluster=None: (_facts("multi"), "big", "here"))


def test_cli_ambiguous_without_tty_exits_2(multi_cluster, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    assert main(["clusters", "discover"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-map a100=" in err and "--gpu-map gpu=" in err


def test_cli_gpu_map(multi_cluster, capsys):
    assert main(["clusters", "discover", "--gpu-map", "a100=a100-sxm-40gb", "--gpu-map", "gpu=l40s-48gb"]) == 0
    inv = Inventory.model_validate(yaml.safe_load(capsys.readouterr().out))
    assert inv.name == "big" and [p.gpu for p in inv.partitions] == ["a100-sxm-40gb", "h100-sxm-80gb", "cpu", "l40s-48gb"]
    assert inv.login is None
    assert main(["clusters", "discover", "--gpu-map", "a100=a100-80"]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_cli_check_unreachable_exits_5(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    monkeypatch.setenv("PATH", str(tmp_path))  # and no sinfo either
    assert main(["clusters", "check", "dev"]) == 5
    assert "sinfo" in capsys.readouterr().err


# --- the real dev cluster -----------------------------------------------------------------------------


def _discover_dev(tmp_path, capsys, *argv) -> Path:
    assert main(["clusters", "discover", *argv]) == 0
    path = tmp_path / "discovered.yaml"
    path.write_text(capsys.readouterr().out)
    return path


def test_discover_dev_cluster(slurm_cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    path = _discover_dev(tmp_path, capsys)
    inv = Inventory.model_validate(yaml.safe_load(path.read_text()))
    assert inv.name == "jobctl-dev" and inv.scheduler == "slurm" and inv.login is None
    (p,) = inv.partitions
    assert (p.name, p.gpu, p.gpus_per_node, p.nodes, p.cpus_per_node, p.mem_gib, p.time_limit) == \
        ("gpu", "h100-sxm-80gb", 8, 2, 16, 62, None)
    assert main(["plan", "recipes/tiny.yaml", "--cluster", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["feasible"]
    assert main(["clusters", "check", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["drift"] is False


def test_check_dev_no_drift_then_drained(slurm_cluster, capsys):
    assert main(["clusters", "check", "dev"]) == 0
    assert "no drift" in capsys.readouterr().out
    subprocess.run(["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=test"], check=True)
    try:
        assert main(["clusters", "check", "dev", "--json"]) == 3
        out = json.loads(capsys.readouterr().out)
        assert out["drift"] is True
        bad = [r for r in out["rows"] if r["status"] != "ok"]
        assert [(r["partition"], r["what"], r["status"]) for r in bad] == [("gpu", "nodes available", "changed")]
        assert "node2 drained" in bad[0]["cluster"]
        assert main(["clusters", "check", "dev"]) == 3
        assert "drifted" in capsys.readouterr().out
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], check=True)


def test_discover_and_check_over_ssh(ssh_cluster, tmp_path, capsys):  # noqa: F811 (pytest fixture)
    path = _discover_dev(tmp_path, capsys, "--cluster", str(ssh_cluster.inventory), "--name", "dev-ssh2")
    inv = Inventory.model_validate(yaml.safe_load(path.read_text()))
    (p,) = inv.partitions
    assert (inv.name, p.gpu, p.gpus_per_node, p.nodes, p.cpus_per_node, p.mem_gib) == \
        ("dev-ssh2", "h100-sxm-80gb", 8, 2, 16, 62)
    assert (inv.login.host, inv.login.port, inv.login.user) == (ssh_cluster.host, ssh_cluster.port, ssh_cluster.user)
    assert main(["clusters", "check", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["what"] == "login" and rows[0]["status"] == "ok"


def test_cli_asks_on_a_terminal(multi_cluster, capsys, monkeypatch):
    import io

    answers = io.StringIO("2\nnonsense\nl40s-48gb\n")
    answers.isatty = lambda: True
    monkeypatch.setattr("sys.stdin", answers)
    assert main(["clusters", "discover"]) == 0
    out, err = capsys.readouterr()
    inv = Inventory.model_validate(yaml.safe_load(out))
    assert [p.gpu for p in inv.partitions] == ["a100-sxm-40gb", "h100-sxm-80gb", "cpu", "l40s-48gb"]
    assert "which one?" in err


# --- block topology (Slurm topology/block, one block per NVLink domain) --------------------------

def test_hostlists_expand_as_slurm_writes_them():
    assert d.expand_hostlist("gb[001-003,010],login1") == ["gb001", "gb002", "gb003", "gb010", "login1"]
    assert d.expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    for bad in ("gb[1-", "gb[3-1]", "gb[a-b]", "gb[[1]]"):
        with pytest.raises(d.DiscoveryError):
            d.expand_hostlist(bad)
    with pytest.raises(d.DiscoveryError):
        d.expand_hostlist("n[0-999999999]")  # more nodes than any inventory may hold


def test_a_block_topology_becomes_the_partitions_nvlink_domain():
    """`scontrol show topology` under topology/block prints one "BlockName=... BlockIndex=...
    Nodes=..." record per block (slurm src/plugins/topology/block/topology_block.c
    _print_topo_record); on a GB200 NVL72 system a block is a rack's NVLink domain. The dev
    cluster's two 8-GPU nodes in one block: a domain of 16 GPUs."""
    part = _read("dev-scontrol-partition.txt") if (DATA / "dev-scontrol-partition.txt").exists() else ""
    topology = "BlockName=rack1 BlockIndex=0 Nodes=node[1-2]\n"
    (f,) = d.cluster_facts(_read("dev-sinfo.txt"), part, _read("dev-scontrol-node.txt"), topology)
    assert f.block_nodes == 2
    text = d.inventory_yaml("dev", [f], {"gpu": "h100-sxm-80gb"}, source="test")
    (p,) = Inventory.model_validate(yaml.safe_load(text)).partitions
    assert p.nvlink_domain_gpus == 16
    # a tree topology, or none, says nothing about NVLink
    (g,) = d.cluster_facts(_read("dev-sinfo.txt"), part, _read("dev-scontrol-node.txt"),
                           "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[1-2]\n")
    assert g.block_nodes == 0 and "nvlink_domain_gpus" not in d.inventory_yaml("dev", [g], {"gpu": "h100-sxm-80gb"},
                                                                               source="test")
