"""The framework capability tables and renderings (jobctl.frameworks), without the frameworks:
no plan uses a feature its framework lacks, custom code gets what it declares, and the
rendered configuration reaches the launch command."""

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobctl import frameworks
from jobctl.config.loader import resolve_launch
from jobctl.config.workspace import all_cluster_names
from jobctl.errors import ConfigError
from jobctl.model import JOB_FOLDER_TOKEN, OOMFigures
from jobctl.planner import inputs
from jobctl.planner.ladder import next_plan
from jobctl.planner.memory import Workload
from jobctl.planner.models import PRESETS
from jobctl.planner.plan import Plan
from jobctl.planner.search import OBJECTIVES, Constraints, search
from jobctl.planning import load_inventory, load_recipe, plan_on

RECIPES = ["llama2-7b-24gb", "llama3.2-1b-a10g", "llama405b", "llama70b", "llama8b", "tiny"]


def uses_only_what_it_has(caps, plan: Plan, w) -> list[str]:
    """The capability table read directly (independent of each module's `problems`)."""
    bad = []
    if plan.tp > 1 and not caps.tp:
        bad.append("tp")
    if plan.pp > 1 and not caps.pp:
        bad.append("pp")
    if plan.cp > 1 and not caps.cp:
        bad.append("cp")
    if plan.virtual_stages > 1 and not caps.interleaved:
        bad.append("interleaved")
    if plan.sequence_parallel and plan.tp > 1 and caps.sequence_parallel == "no":
        bad.append("sp")
    if plan.sharding not in caps.shardings or plan.recompute not in caps.recompute or plan.offload not in caps.offload:
        bad.append("knob")
    if plan.recompute_layers and not caps.recompute_layers:
        bad.append("recompute_layers")
    return bad


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("framework", [None, "megatron", "torchtitan", "deepspeed", "fsdp", "custom"])
def test_no_plan_uses_a_feature_its_framework_lacks(recipe, framework):
    over = [f"framework={framework}"] if framework else []
    rec = load_recipe(f"recipes/{recipe}.yaml", over)
    for cluster in all_cluster_names():
        inv = load_inventory(cluster, [])
        for objective in OBJECTIVES:
            data = plan_on(rec, inv, objective=objective, alternatives=3).to_dict()
            if not data["feasible"]:
                continue
            w = inputs.workload(rec.value, inv.value)
            for p in [data["plan"]] + [a["plan"] for a in data["alternatives"]]:
                plan = Plan.from_dict(p, "test")
                assert uses_only_what_it_has(w.caps, plan, w) == [], (recipe, cluster, objective, p)
                assert w.framework.problems(plan, w) == [], (recipe, cluster, objective, p)
            assert data["framework"]["name"] == w.caps.name


@settings(max_examples=40, deadline=None)
@given(framework=st.sampled_from(["megatron", "torchtitan", "deepspeed", "fsdp", "custom"]),
       model=st.sampled_from(["llama3.2-1b", "llama3.1-8b"]), seq=st.sampled_from([1024, 4096]),
       gbs=st.sampled_from([8, 32, 64]), gpus=st.sampled_from([1, 4, 8]))
def test_every_rung_of_the_oom_ladder_is_a_configuration_the_framework_runs(framework, model, seq, gbs, gpus):
    inv = load_inventory("h100", ["partitions.0.nodes=2", f"partitions.0.gpus_per_node={gpus}"])
    t = inputs.target(inv.value, inv.value.partitions[0])
    w = Workload(PRESETS[model], seq, gbs, framework=framework)
    r = search(w, t, Constraints())
    if r.best is None:
        return
    plan, history = r.best.plan, ()
    for _ in range(30):
        step = next_plan(w, t, Constraints(), plan, OOMFigures(), history=history)
        if step is None:
            break
        assert uses_only_what_it_has(w.caps, step.plan, w) == [], step.plan.summary()
        assert w.framework.problems(step.plan, w) == [], step.plan.summary()
        history, plan = history + (plan,), step.plan


def test_generic_is_custom_and_custom_gets_only_data_parallelism_and_fsdp_by_default():
    assert frameworks.get("generic") == frameworks.get("custom")
    caps = frameworks.get("custom").caps
    assert (caps.tp, caps.pp, caps.cp, caps.shardings, caps.recompute, caps.offload) == (
        False, False, False, ("none", "zero3"), ("none", "full"), ("none",))


def test_custom_supports_widen_the_search(tmp_path):
    base = load_recipe("recipes/llama70b.yaml", ["framework=custom"])
    data = plan_on(base, load_inventory("h100", [])).to_dict()
    assert data["feasible"] is False or (data["plan"]["tp"], data["plan"]["pp"]) == (1, 1)
    text = (tmp_path / "r.yaml")
    doc = json.loads(json.dumps(base.data))
    doc["framework"] = {"name": "custom", "supports": {"tp": True, "pp": True, "sequence_parallel": True,
                                                       "sharding": ["none", "zero1"], "recompute": ["full"]}}
    import yaml

    text.write_text(yaml.safe_dump(doc))
    wide = plan_on(load_recipe(str(text), []), load_inventory("h100", [])).to_dict()
    assert wide["feasible"] and wide["plan"]["tp"] * wide["plan"]["pp"] > 1
    assert wide["plan"]["sharding"] in ("none", "zero1") and wide["plan"]["offload"] == "none"


def test_supports_is_refused_for_a_framework_jobctl_models(tmp_path):
    import yaml

    doc = yaml.safe_load(Path("recipes/llama8b.yaml").read_text())
    doc["framework"] = {"name": "megatron", "supports": {"tp": False}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as e:
        load_recipe(str(path), [])
    assert "supports is for framework custom" in str(e.value)


def test_framework_args_splice_into_a_list_and_quote_into_a_string():
    fw = {"name": "deepspeed", "args": ["--deepspeed", "--deepspeed_config", f"{JOB_FOLDER_TOKEN}/framework/ds_config.json",
                                        "--weird", "a b;$(x)"], "files": {"ds_config.json": "{}"}}
    listed = resolve_launch({"launch": {"command": ["python", "t.py", "${framework.args}", "--x", "${plan.tp}"]}},
                            {"tp": 2}, framework=fw)
    assert listed["command"] == ["python", "t.py", *fw["args"], "--x", 2]
    text = resolve_launch({"launch": {"command": "python t.py ${framework.args} --cfg ${framework.files.ds_config}"}},
                          {"tp": 2}, framework=fw)
    assert shlex.split(text["command"]) == ["python", "t.py", *fw["args"], "--cfg",
                                            f"{JOB_FOLDER_TOKEN}/framework/ds_config.json"]


def test_selective_means_each_frameworks_own_thing():
    assert frameworks.get("megatron").caps.selective is frameworks.Selective.CORE_ATTENTION
    assert frameworks.get("torchtitan").caps.selective is frameworks.Selective.OP_SAC
    for name in ("deepspeed", "fsdp", "custom"):
        assert "selective" not in frameworks.get(name).caps.recompute
    # torchtitan's op-level SAC keeps less than no recompute and more than full, with flash attention
    from jobctl.planner.memory import estimate

    w = Workload(PRESETS["llama3.1-8b"], 8192, 8, framework="torchtitan", attention="flash")
    p = Plan(1, 8, 1, 1, 8, 1, "zero3", 1, 1, 8, "none", "none", False)
    acts = {rc: estimate(w, 80 << 30, Plan(**{**p.__dict__, "recompute": rc})).activations_bytes
            for rc in ("none", "selective", "full")}
    assert acts["full"] < acts["selective"] < acts["none"]


def test_deepspeed_refuses_its_pipeline_engine_with_zero2_and_3():
    w = Workload(PRESETS["llama3.1-8b"], 2048, 64, framework="deepspeed")
    p = Plan(1, 8, 1, 2, 4, 1, "zero3", 1, 16, 64, "none", "none", False)
    assert any("incompatible with pipeline" in x for x in w.framework.problems(p, w))
    assert not any("pipeline" in x for x in w.framework.problems(Plan(**{**p.__dict__, "sharding": "zero1"}), w))


def test_megatron_interleaving_needs_microbatches_a_multiple_of_pp_and_layers_per_chunk():
    w = Workload(PRESETS["llama3.1-8b"], 4096, 64, framework="megatron")  # 32 layers
    ok = Plan(4, 8, 8, 4, 1, 1, "none", 1, 64, 64, "none", "none", True, 2)
    assert w.framework.problems(ok, w) == []
    odd = Plan(4, 8, 8, 4, 1, 1, "none", 1, 64, 64, "none", "none", True, 3)  # 8 layers per stage / 3
    assert any("virtual" in x for x in w.framework.problems(odd, w))
    few = Plan(4, 8, 8, 4, 1, 1, "none", 2, 2, 4, "none", "none", True, 2)  # 2 micro-batches < pp 4
    assert any("multiple of pp" in x for x in w.framework.problems(few, w))


def test_plan_emit_and_json_carry_the_configuration(capsys):
    from jobctl.cli import main

    assert main(["plan", "recipes/llama3.2-1b-a10g.yaml", "--cluster", "a10g", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fw = data["framework"]
    assert fw["name"] == "deepspeed" and "--deepspeed_config" in fw["args"]
    cfg = json.loads(fw["files"]["ds_config.json"])
    assert cfg["train_micro_batch_size_per_gpu"] == data["plan"]["micro_batch_size"]
    assert main(["plan", "recipes/llama8b.yaml", "--cluster", "h100", "--emit"]) == 0
    out = capsys.readouterr().out
    args = shlex.split(out.strip().splitlines()[1])
    assert "--parallelism.tensor_parallel_degree=" in " ".join(args)
    assert args[-1] in ("activation_checkpoint:none", "activation_checkpoint:selective", "activation_checkpoint:full")


def test_emit_needs_a_cluster(capsys):
    from jobctl.cli import main

    assert main(["plan", "recipes/llama8b.yaml", "--emit"]) == 2


def test_torchtitan_cuda_graphs_keep_the_gradients_and_can_be_turned_off():
    # torchtitan 0.3.0's trainer captures forward and backward as one CUDA graph unless
    # --training.disable_cuda_graphs, and then zeroes gradients in place (trainer.py train_step:
    # zero_grad(set_to_none=training.disable_cuda_graphs)): at the activation peak of a
    # one-micro-batch FSDP step the sharded gradients exist. Llama 3.1 8B, FSDP over 8, b1:
    # the sharded fp32 gradients are 8.03e9 x 4 B / 8 = 3.74 GiB
    from jobctl.planner.memory import estimate

    p = Plan(1, 8, 1, 1, 8, 1, "zero3", 1, 1, 8, "none", "none", False)
    graphed = Workload(PRESETS["llama3.1-8b"], 8192, 8, framework="torchtitan")
    freed = Workload(PRESETS["llama3.1-8b"], 8192, 8, framework="torchtitan", cuda_graphs=False)
    grads = next(t.bytes for t in estimate(graphed, 80 << 30, p).terms if t.name == "gradients")
    assert grads == pytest.approx(PRESETS["llama3.1-8b"].params() * 4 / 8)
    def tensors(mem):  # the tensors' peak; the allocator's cache is apart (freed gradients' blocks stay reserved)
        return mem.total_bytes - mem.overhead_bytes

    gap = tensors(estimate(graphed, 80 << 30, p)) - tensors(estimate(freed, 80 << 30, p))
    assert gap == pytest.approx(grads, rel=0.01)
    # off: rendered so; and never under PP or EP, where torchtitan cannot capture one
    r = frameworks.get("torchtitan").render(p, freed)
    assert "--training.disable_cuda_graphs" in r.args
    assert "--training.disable_cuda_graphs" not in frameworks.get("torchtitan").render(p, graphed).args
    pinned = Workload(PRESETS["llama3.1-8b"], 8192, 8, framework="torchtitan", cuda_graphs=True)
    inv = load_inventory("h100", []).value
    res = search(pinned, inputs.target(inv, inv.partitions[0], "bf16-mixed"), Constraints(pp=2))
    assert res.best is None and any("captures no CUDA graph" in x for x in res.reasons)
    other = Workload(PRESETS["llama3.1-8b"], 8192, 8, framework="megatron", cuda_graphs=True)
    res = search(other, inputs.target(inv, inv.partitions[0], "bf16-mixed"), Constraints())
    assert res.best is None and any("train.cuda_graphs=true" in x for x in res.reasons)
