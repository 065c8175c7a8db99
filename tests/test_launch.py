"""launch: Slurm parameters, job environment and launcher argv from a Plan (pure functions)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys

import pytest

from jobctl.backends.launch import (
    LaunchError,
    command_argv,
    launcher_argv,
    parse_slurm_time,
    rdzv_port,
)
from jobctl.jobs.environment import job_environment, slurm_parameters
from jobctl.config.schema import (
    Inventory,
    Launch,
    Partition,
    Recipe,
    Resources,
    SlurmOptions,
    Train,
)
from jobctl.planner.plan import Plan

# Strings a shell would act on. Every one must come back exactly as it went in.
HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch {marker})",
    "`touch {marker}`",
    "a; touch {marker}",
    "x && touch {marker} || true",
    "line1\nline2\n",
    "  leading and trailing spaces  ",
    "tab\tinside",
    "$HOME ${PATH} $1",
    "back\\slash",
    "*.py ?",
    "'",
    '"',
    "--nnodes",
    "-m",
    "",
    "ünïcødé ✓",
    "> /tmp/out < /etc/passwd | cat",
]


def hostile(tmp_path) -> list[str]:
    marker = tmp_path / "pwned"
    return [s.replace("{marker}", str(marker)) for s in HOSTILE]


# A concrete plan: 2 nodes x 8 GPUs = 16 ranks = tp 4 * pp 2 * dp 2 * cp 1;
# global batch 32 = micro-batch 2 * accumulation 8 * dp 2.
PLAN = Plan(nodes=2, gpus_per_node=8, tp=4, pp=2, dp=2, cp=1, sharding="hsdp", micro_batch_size=2,
            grad_accum_steps=8, global_batch_size=32, recompute="selective", offload="none",
            sequence_parallel=True, virtual_stages=1, hsdp_shard=0)


def make_recipe(**kw) -> Recipe:
    base = dict(name="llama-test", model="llama3-8b", train=Train(seq_len=4096, global_batch_size=32))
    base.update(kw)
    return Recipe(**base)


def make_partition(**kw) -> Partition:
    base = dict(name="gpu", gpu="h100-sxm-80gb", gpus_per_node=8, nodes=16, cpus_per_node=192, mem_gib=2000)
    base.update(kw)
    return Partition(**base)


def make_inventory(partition: Partition | None = None, **kw) -> Inventory:
    base = dict(name="h100", partitions=[partition or make_partition()])
    base.update(kw)
    return Inventory(**base)


# -- time limits -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, minutes",
    [
        ("90", 90),
        ("1", 1),
        ("0:30", 1),  # M:S, seconds round up to a minute
        ("10:00", 10),  # one colon is minutes:seconds, as in Slurm
        ("04:00:00", 240),
        ("48:00:00", 2880),  # hours may exceed 24 without a day part
        ("00:00:01", 1),
        ("01:30:30", 91),
        ("2-00", 2880),
        ("1-12", 2160),
        ("1-12:30", 2190),
        ("2-00:00:00", 2880),
        ("7-00:00:00", 10080),
        (" 04:00:00 ", 240),
        ("UNLIMITED", None),
        ("infinite", None),
        (None, None),
        (45, 45),
    ],
)
def test_parse_slurm_time(text, minutes):
    assert parse_slurm_time(text, "resources.time") == minutes


@pytest.mark.parametrize(
    "text",
    ["", "abc", "4h", "1:2:3:4", "1-", "-5", "1-24", "1-00:60", "00:60:00", "00:00:60", "1.5", "0", "00:00:00",
     "0-00", "1--2", "１２", "１-００"],
)
def test_parse_slurm_time_rejects_with_key(text):
    with pytest.raises(ValueError, match=r"^resources\.time: "):
        parse_slurm_time(text, "resources.time")


# -- slurm_parameters ------------------------------------------------------------------------


def test_slurm_parameters_gpu_partition():
    inv = make_inventory(partition=make_partition(time_limit="7-00:00:00"),
                         slurm=SlurmOptions(account="proj", qos="high", constraint="ib",
                                            additional={"exclusive": True, "mail-type": "END", "requeue": False},
                                            setup=["module load cuda/12.4", "source /opt/venv/bin/activate"]))
    recipe = make_recipe(resources=Resources(time="2-00:00:00"))
    params = slurm_parameters(PLAN, recipe, inv, inv.partitions[0])
    assert params == {
        "job_name": "llama-test",
        "partition": "gpu",
        "nodes": 2,
        "ntasks_per_node": 1,
        "cpus_per_task": 192,
        "mem": "2000G",
        "time": 2 * 24 * 60,
        "gpus_per_node": 8,
        "account": "proj",
        "qos": "high",
        "constraint": "ib",
        "gres": "gpu:8",
        "additional_parameters": {"exclusive": True, "mail-type": "END"},  # False means "leave out"
        "setup": ["module load cuda/12.4", "source /opt/venv/bin/activate"],
    }


def test_slurm_parameters_cpu_partition_and_defaults():
    part = make_partition(name="local", gpu="cpu", gpus_per_node=1, nodes=1, cpus_per_node=2, mem_gib=15.5)
    inv = make_inventory(partition=part, name="local")
    plan = Plan(nodes=1, gpus_per_node=1, tp=1, pp=1, dp=1, cp=1, sharding="none", micro_batch_size=1,
                grad_accum_steps=4, global_batch_size=4, recompute="none", offload="none", sequence_parallel=False)
    params = slurm_parameters(plan, make_recipe(), inv, part)
    assert "gpus_per_node" not in params and "gres" not in params
    assert params["time"] == 60  # neither recipe nor partition says: one hour
    assert params["mem"] == "15872M"  # 15.5 GiB = 15872 MiB
    assert not {"account", "qos", "constraint", "additional_parameters", "setup"} & set(params)


def test_slurm_parameters_time_defaults_to_partition_limit():
    part = make_partition(time_limit="04:00:00")
    params = slurm_parameters(PLAN, make_recipe(), make_inventory(partition=part), part)
    assert params["time"] == 240


@pytest.mark.parametrize(
    "gres, gpus_per_node",
    [
        (None, 8),  # default: gpu:8 and --gpus-per-node=8
        ("gpu:h100:8", None),  # typed: Slurm refuses it next to an untyped --gpus-per-node
        ("gpu:8", None),
        ("gpu:h100:8,nvme:1", None),
        ("nvme:1", 8),  # asks for no GPU: --gpus-per-node carries them
    ],
)
def test_slurm_parameters_gres(gres, gpus_per_node):
    inv = make_inventory(slurm=SlurmOptions(gres=gres))
    params = slurm_parameters(PLAN, make_recipe(), inv, inv.partitions[0])
    assert params["gres"] == (gres or "gpu:8")
    assert params.get("gpus_per_node") == gpus_per_node


@pytest.mark.parametrize("gres, count", [("gpu:h100:4", 4), ("gpu:h100", 1), ("nvme:1,gpu:2", 2)])
def test_slurm_parameters_gres_count_must_match_the_plan(gres, count):
    inv = make_inventory(slurm=SlurmOptions(gres=gres))
    with pytest.raises(LaunchError, match=f"asks for {count} GPUs per node; the plan uses 8"):
        slurm_parameters(PLAN, make_recipe(), inv, inv.partitions[0])


def test_slurm_parameters_are_submitit_names(tmp_path):
    """submitit itself accepts every name and writes a script that quotes the values."""
    from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string

    inv = make_inventory(slurm=SlurmOptions(account="it's $(touch x)", additional={"comment": "a b; c"},
                                            setup=["echo setup"]))
    params = slurm_parameters(PLAN, make_recipe(), inv, inv.partitions[0])
    executor = SlurmExecutor(folder=tmp_path)
    executor.update_parameters(**params)  # raises on any name submitit does not know
    script = _make_sbatch_string(command="true", folder=tmp_path, **params)
    assert "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --mem=2000G" in script
    assert "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --account='it'\"'\"'s $(touch x)'" in script
    assert "#SBATCH --comment='a b; c'" in script


@pytest.mark.parametrize("slurm", [SlurmOptions(), SlurmOptions(gres="gpu:h100:8"),
                                   SlurmOptions(additional={"exclusive": True, "comment": "it's $(touch x); `id`"})])
def test_real_sbatch_accepts_the_parameters(slurm_cluster, tmp_path, slurm):
    """sbatch --test-only on the dev cluster (2 nodes x 8 H100, 16 CPUs, 64000 MB) takes the script."""
    from submitit.slurm.slurm import _make_sbatch_string

    part = make_partition(nodes=2, cpus_per_node=16, mem_gib=62, time_limit="1-00:00:00")
    inv = make_inventory(partition=part, slurm=slurm, name="dev")
    params = slurm_parameters(PLAN, make_recipe(resources=Resources(time="00:10:00")), inv, part)
    script = tmp_path / "job.sh"
    script.write_text(_make_sbatch_string(command="true", folder=tmp_path, **params))
    res = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "to start at" in res.stderr and "node[1-2]" in res.stderr


@pytest.mark.parametrize(
    "plan_kw, part_kw, recipe_kw, message",
    [
        (dict(nodes=32, dp=8), {}, {}, r"plan uses 32 nodes; partition 'gpu' of cluster 'h100' has 16"),
        (dict(gpus_per_node=16, dp=4), {}, {}, r"plan uses 16 GPUs per node; partition 'gpu' .* has 8"),
        ({}, {}, dict(resources=Resources(max_nodes=1)), r"resources.max_nodes=1"),
        ({}, {}, dict(resources=Resources(partition="other")), r"resources.partition='other'"),
        (dict(dp=3), {}, {}, r"tp\(4\) \* pp\(2\) \* dp\(3\)"),
    ],
)
def test_slurm_parameters_refuses_plans_that_do_not_fit(plan_kw, part_kw, recipe_kw, message):
    plan = dataclasses.replace(PLAN, **plan_kw)  # built directly: from_dict would refuse what does not add up
    part = make_partition(**part_kw)
    with pytest.raises(LaunchError, match=message):
        slurm_parameters(plan, make_recipe(**recipe_kw), make_inventory(partition=part), part)


def test_slurm_parameters_time_errors_name_the_key():
    part = make_partition(time_limit="1-00:00:00")
    inv = make_inventory(partition=part)
    with pytest.raises(ValueError, match=r"^resources\.time: '4 hours'"):
        slurm_parameters(PLAN, make_recipe(resources=Resources(time="4 hours")), inv, part)
    with pytest.raises(ValueError, match=r"resources\.time: '2-00:00:00' \(2880 min\) is longer than partition"):
        slurm_parameters(PLAN, make_recipe(resources=Resources(time="2-00:00:00")), inv, part)
    bad = make_partition(time_limit="soon")
    with pytest.raises(ValueError, match=r"^partitions\[gpu\]\.time_limit: 'soon'"):
        slurm_parameters(PLAN, make_recipe(), make_inventory(partition=bad), bad)


@pytest.mark.parametrize(
    "slurm, message",
    [
        (SlurmOptions(account="a\nrm -rf ~"), r"account: .* line break"),
        (SlurmOptions(additional={"comment": "x\ntouch /tmp/pwned"}), r"slurm.additional.comment: .* line break"),
        (SlurmOptions(additional={"x\ny": "1"}), r"not an sbatch long option name"),
        (SlurmOptions(additional={"exclusive\n": True}), r"not an sbatch long option name"),
        (SlurmOptions(additional={"nodes": 4}), r"'nodes' is set by jobctl from the plan"),
        (SlurmOptions(additional={"ntasks-per-node": 8}), r"'ntasks-per-node' is set by jobctl"),
        (SlurmOptions(additional={"output": "/tmp/x"}), r"'output' is set by jobctl from submitit"),
    ],
)
def test_slurm_parameters_refuse_what_would_break_the_sbatch_script(slurm, message):
    inv = make_inventory(slurm=slurm)
    with pytest.raises(LaunchError, match=message):
        slurm_parameters(PLAN, make_recipe(), inv, inv.partitions[0])


@pytest.mark.parametrize(("name", "job_name"), [
    ("x\ntouch /tmp/pwned", "x-touch-tmp-pwned"),  # a line break would end the #SBATCH line
    ("run%j-%x-50%", "run-j--x-50"),  # Slurm expands %j, %x in names used in paths ("-%" keeps its "-")
    ("tiny\x1b[31mRED\x1b]0;pwn\x07", "tiny-31mRED-0-pwn"),  # escape sequences
    ("../../etc", "etc"),
])
def test_the_slurm_job_name_is_the_recipe_name_made_safe(name, job_name):
    inv = make_inventory()
    assert slurm_parameters(PLAN, make_recipe(name=name), inv, inv.partitions[0])["job_name"] == job_name


# -- job_environment -------------------------------------------------------------------------


def test_job_environment_plan_values_derived_by_hand():
    env = job_environment(PLAN, make_recipe(), make_inventory())
    assert env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "JOBCTL_TP": "4",
        "JOBCTL_PP": "2",
        "JOBCTL_DP": "2",
        "JOBCTL_CP": "1",
        "JOBCTL_EP": "1",  # a dense model: no expert parallelism
        "JOBCTL_MICRO_BATCH_SIZE": "2",
        "JOBCTL_GRAD_ACCUM_STEPS": "8",
        "JOBCTL_GLOBAL_BATCH_SIZE": "32",
        "JOBCTL_SHARDING": "hsdp",
        "JOBCTL_ZERO_STAGE": "3",  # HSDP shards parameters, gradients and optimizer states
        "JOBCTL_RECOMPUTE": "selective",
        "JOBCTL_OFFLOAD": "none",
        "JOBCTL_SEQUENCE_PARALLEL": "1",
        "JOBCTL_VIRTUAL_STAGES": "1",
        "JOBCTL_RECOMPUTE_LAYERS": "0",  # 0 = every layer the recompute mode covers
        "JOBCTL_NODES": "2",
        "JOBCTL_GPUS_PER_NODE": "8",
        "JOBCTL_WORLD_SIZE": "16",
        "JOBCTL_PLAN": env["JOBCTL_PLAN"],  # checked below, as data
        "JOBCTL_RECIPE_NAME": "llama-test",
        "JOBCTL_SEQ_LEN": "4096",  # the recipe's train.seq_len (it gives no lr and no steps: those are not set)
        "JOBCTL_PRECISION": "bf16-mixed",  # the recipe's train.precision (the default)
    }
    decoded = json.loads(env["JOBCTL_PLAN"])
    expected = {
        "nodes": 2, "gpus_per_node": 8, "world_size": 16, "tp": 4, "pp": 2, "dp": 2, "cp": 1,
        "sharding": "hsdp", "micro_batch_size": 2, "grad_accum_steps": 8, "global_batch_size": 32,
        "recompute": "selective", "offload": "none", "sequence_parallel": True, "virtual_stages": 1,
        "hsdp_shard": 0,
    }
    assert {k: decoded.get(k) for k in expected} == expected  # fields added to Plan later ride along
    assert Plan.from_dict(json.loads(env["JOBCTL_PLAN"])) == PLAN
    assert all(isinstance(v, str) for v in env.values())


@pytest.mark.parametrize("sharding, stage", [("none", "0"), ("zero1", "1"), ("zero2", "2"), ("zero3", "3"),
                                             ("hsdp", "3")])
def test_zero_stage(sharding, stage):
    plan = Plan.from_dict(PLAN.to_dict() | {"sharding": sharding, "sequence_parallel": False})
    env = job_environment(plan, make_recipe(), make_inventory())
    assert env["JOBCTL_ZERO_STAGE"] == stage
    assert env["JOBCTL_SEQUENCE_PARALLEL"] == "0"


@pytest.mark.parametrize(
    "inv_env, recipe_env, expected",
    [
        ({}, {}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, {},
         {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}),
        ({"PYTORCH_CUDA_ALLOC_CONF": "a"}, {"PYTORCH_CUDA_ALLOC_CONF": "b"}, {"PYTORCH_CUDA_ALLOC_CONF": "b"}),
        ({"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}, {"NCCL_DEBUG": "INFO"},
         {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8"}),
        ({"PYTORCH_CUDA_ALLOC_CONF": ""}, {}, {"PYTORCH_CUDA_ALLOC_CONF": ""}),
    ],
)
def test_job_environment_precedence(inv_env, recipe_env, expected):
    env = job_environment(PLAN, make_recipe(launch=Launch(env=recipe_env)), make_inventory(env=inv_env))
    assert {k: v for k, v in env.items() if not k.startswith("JOBCTL_")} == expected


def test_job_environment_plan_values_cannot_be_overridden():
    with pytest.raises(LaunchError, match="JOBCTL_TP are set by jobctl from the plan"):
        job_environment(PLAN, make_recipe(launch=Launch(env={"JOBCTL_TP": "1"})), make_inventory())


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "A=B", "", "X\nY", "X\n", "ÄB"])
def test_job_environment_rejects_bad_names(name):
    with pytest.raises(LaunchError, match=r"^env: .* is not an environment variable name"):
        job_environment(PLAN, make_recipe(), make_inventory(env={name: "v"}))


def test_job_environment_rejects_nul():
    with pytest.raises(LaunchError, match=r"launch.env.X: contains a NUL"):
        job_environment(PLAN, make_recipe(launch=Launch(env={"X": "a\0b"})), make_inventory())


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_hostile_env_values_stay_intact(tmp_path, index):
    value = hostile(tmp_path)[index]
    env = job_environment(PLAN, make_recipe(launch=Launch(env={"FROM_RECIPE": value})),
                          make_inventory(env={"FROM_INVENTORY": value}))
    assert env["FROM_RECIPE"] == value and env["FROM_RECIPE"].encode() == value.encode()
    assert env["FROM_INVENTORY"] == value
    # and through a real process, without a shell
    out = subprocess.run([sys.executable, "-c", "import os, sys; sys.stdout.write(os.environ['FROM_RECIPE'])"],
                         env=env, capture_output=True, check=True).stdout
    assert out == value.encode()
    assert not (tmp_path / "pwned").exists()


# -- command_argv / launcher_argv ------------------------------------------------------------


@pytest.mark.parametrize(
    "command, argv",
    [
        ("python train.py --lr 3e-4", ["python", "train.py", "--lr", "3e-4"]),
        ("python train.py --name 'my run'", ["python", "train.py", "--name", "my run"]),
        ('torchrun_wrapper "a b" c\\ d', ["torchrun_wrapper", "a b", "c d"]),
        ("echo $(touch /tmp/pwned); ls", ["echo", "$(touch", "/tmp/pwned);", "ls"]),
        ("echo `id` $HOME # not a comment", ["echo", "`id`", "$HOME", "#", "not", "a", "comment"]),
        (["python", "train.py", "a b", "$(x)"], ["python", "train.py", "a b", "$(x)"]),
    ],
)
def test_command_argv(command, argv):
    assert command_argv(command) == argv


@pytest.mark.parametrize("command, message", [(None, "not set"), ("", "empty"), ([], "empty"), ("   ", "empty"),
                                              ("python 'unbalanced", "cannot split"), (["a", 3], r"\[1\]")])
def test_command_argv_errors(command, message):
    with pytest.raises(LaunchError, match=message):
        command_argv(command)


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_hostile_command_args_stay_intact(tmp_path, index):
    value = hostile(tmp_path)[index]
    as_list = ["python", "train.py", value, "--x", value]
    assert command_argv(as_list) == as_list
    assert command_argv(shlex.join(as_list)) == as_list  # a quoted string splits back to the same words
    assert launcher_argv(PLAN.nodes, PLAN.gpus_per_node, as_list, 0, "node1", 29500, "none") == as_list
    argv = launcher_argv(PLAN.nodes, PLAN.gpus_per_node, as_list, 1, "node1", 29500, "torchrun", rdzv_id="7")
    assert argv[-4:] == ["train.py", value, "--x", value]
    # and through a real process, without a shell: the program sees exactly these bytes
    script = tmp_path / "echo_argv.py"
    script.write_text("import json, sys\nsys.stdout.write(json.dumps(sys.argv[1:]))\n")
    out = subprocess.run([sys.executable, str(script), *as_list[2:]], capture_output=True, check=True).stdout
    assert json.loads(out) == as_list[2:]
    assert not (tmp_path / "pwned").exists()


def test_launcher_argv_torchrun_script():
    argv = launcher_argv(PLAN.nodes, PLAN.gpus_per_node, ["python", "train.py", "--cfg", "a.yaml"], 1, "node-a", 23456, "torchrun",
                         rdzv_id="4242")
    assert argv == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "node-a:23456", "--rdzv-id", "4242",
                    "train.py", "--cfg", "a.yaml"]


@pytest.mark.parametrize(
    "command, tail",
    [
        (["python3", "-m", "pkg.train", "--steps", "10"], ["--module", "pkg.train", "--steps", "10"]),
        (["python", "-u", "train.py"], ["train.py"]),
        (["python3.11", "train.py"], ["train.py"]),
        (["train.py", "-x"], ["train.py", "-x"]),
        (["bash", "run.sh", "a"], ["--no-python", "bash", "run.sh", "a"]),
        (["/opt/venv/bin/python", "train.py"], ["--no-python", "/opt/venv/bin/python", "train.py"]),
        (["python\n", "train.py"], ["--no-python", "python\n", "train.py"]),  # not python: left alone
    ],
)
def test_launcher_argv_targets(command, tail):
    argv = launcher_argv(PLAN.nodes, PLAN.gpus_per_node, command, 0, "h", 20000, "torchrun", rdzv_id="1")
    assert argv[:13] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "0",
                         "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:20000", "--rdzv-id", "1"]
    assert argv[13:] == tail


@pytest.mark.parametrize(
    "command, script, module, no_python, args",
    [
        (["python", "train.py", "--nnodes", "9", "$(x)"], "train.py", False, False, ["--nnodes", "9", "$(x)"]),
        (["python", "-m", "pkg.train", "--lr", "1"], "pkg.train", True, False, ["--lr", "1"]),
        (["bash", "run.sh", "a b"], "bash", False, True, ["run.sh", "a b"]),
    ],
)
def test_launcher_argv_parses_with_torchrun(command, script, module, no_python, args):
    """torchrun's own argument parser reads our argv as intended."""
    run = pytest.importorskip("torch.distributed.run")
    argv = launcher_argv(PLAN.nodes, PLAN.gpus_per_node, command, 1, "node1", 25000, "torchrun", rdzv_id="99")
    ns = run.get_args_parser().parse_args(argv[1:])
    assert (ns.nnodes, ns.nproc_per_node, ns.node_rank) == ("2", "8", 1)
    assert (ns.rdzv_backend, ns.rdzv_endpoint, ns.rdzv_id) == ("c10d", "node1:25000", "99")
    assert (ns.training_script, ns.module, ns.no_python, ns.training_script_args) == (script, module, no_python, args)


@pytest.mark.parametrize(
    "command, kw, message",
    [
        (["python"], {}, "without a script"),
        (["python", "-m"], {}, "without a module"),
        (["python", "-O", "train.py"], {}, "interpreter option '-O'"),
        (["--help"], {}, "torchrun option"),
        (["train.py"], dict(node_rank=2), "node_rank 2 is outside 0..1"),
        (["train.py"], dict(port=70000), "not a TCP port"),
        (["train.py"], dict(master_addr=""), "not a host"),
        (["train.py"], dict(launcher="srun"), "not one of torchrun, none"),
        ([], {}, "empty"),
    ],
)
def test_launcher_argv_errors(command, kw, message):
    args = dict(node_rank=0, master_addr="h", port=20000, launcher="torchrun") | kw
    with pytest.raises(LaunchError, match=message):
        launcher_argv(PLAN.nodes, PLAN.gpus_per_node, command, **args)


def test_launcher_argv_default_rdzv_id_is_the_same_on_every_node():
    ids = {launcher_argv(PLAN.nodes, PLAN.gpus_per_node, ["t.py"], r, "node1", 21000, "torchrun")[12] for r in range(PLAN.nodes)}
    assert len(ids) == 1


# -- rdzv_port -------------------------------------------------------------------------------


def test_rdzv_port_is_deterministic_and_in_range():
    ids = [str(i) for i in range(2000)] + ["123_4", "123_5", "local-99"]
    ports = [rdzv_port(i) for i in ids]
    assert all(20000 <= p <= 29999 for p in ports)
    assert ports == [rdzv_port(i) for i in ids]
    assert len(set(ports)) > 1500  # spread out, so neighbouring jobs rarely collide
    assert rdzv_port("123_4") != rdzv_port("123_5")


def test_rdzv_port_is_stable_across_processes():
    code = "from jobctl.backends.launch import rdzv_port; print(rdzv_port('4242'), rdzv_port('77_3'))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout for seed in ("1", "2")}
    assert outs == {f"{rdzv_port('4242')} {rdzv_port('77_3')}\n"}


# -- nodes kept out (issue 30) ---------------------------------------------------------------------


def test_excluded_nodes_reach_sbatch_and_count_against_the_partition():
    """PLAN uses 2 of the 16-node partition: excluding Slurm's range gpu[01-14] (14 nodes) leaves
    exactly 2; one more name leaves 1, and the job would wait forever."""
    inv = make_inventory()
    ok = make_recipe(resources=Resources(exclude=["gpu[01-14]"]))
    assert slurm_parameters(PLAN, ok, inv, inv.partitions[0])["exclude"] == "gpu[01-14]"
    too_many = make_recipe(resources=Resources(exclude=["gpu[01-14]", "gpu15"]))
    with pytest.raises(LaunchError) as e:
        slurm_parameters(PLAN, too_many, inv, inv.partitions[0])
    assert "keeps 15 of them out: 1 left" in e.value.message
    assert "exclude" not in slurm_parameters(PLAN, make_recipe(), inv, inv.partitions[0])


@pytest.mark.parametrize("name", ["node2;rm -rf /", "node 2", "-x", "node[1-2", "$(id)", "a" * 300])
def test_an_excluded_node_name_is_a_node_name(name):
    with pytest.raises(ValueError):
        Resources(exclude=[name])


def test_exclude_cannot_come_in_through_slurm_additional():
    inv = make_inventory(slurm=SlurmOptions(additional={"exclude": "gpu01"}))
    with pytest.raises(LaunchError) as e:
        slurm_parameters(PLAN, make_recipe(), inv, inv.partitions[0])
    assert "resources.exclude" in e.value.message


def test_submit_keeps_the_job_off_an_excluded_node(slurm_cluster, tmp_path):
    """On the dev cluster's two nodes: --exclude node1 runs the 1-node job on node2 (as Slurm's
    accounting says), and excluding both refuses the job before Slurm sees it."""
    import os

    from jobctl_run import history_rows, jobctl

    env = {"JOBCTL_HOME": str(tmp_path / "home")}
    r = jobctl("submit", "recipes/tiny.yaml", "--cluster", "dev", "--exclude", "node1", "--wait", env=env)
    assert r.returncode == 0, r.stderr
    (row,) = history_rows(tmp_path / "home")
    acct = subprocess.run(["sacct", "-j", row["scheduler_job_id"], "-n", "-P", "-X", "-o", "NodeList"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=60)
    assert acct.stdout.strip() == "node2", acct.stdout + acct.stderr
    r = jobctl("submit", "recipes/tiny.yaml", "--cluster", "dev", "--exclude", "node[1-2]", "--dry-run", env=env)
    assert r.returncode != 0 and "0 left, so the job would wait forever" in r.stderr
