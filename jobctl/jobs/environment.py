"""Plan -> Slurm parameters and the job's environment: pure functions of the Plan, the recipe
and the inventory (jobctl.config's values). Nothing here reads files, the clock or the
environment, or prints. Environment values reach the job byte for byte (no shell reads them);
the one place a shell reads our values is submitit's sbatch script, where submitit quotes every
value, and values that could still break a ``#SBATCH`` line (newlines, NUL) are refused here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from jobctl import frameworks
from jobctl.backends.launch import LaunchError, parse_slurm_time
from jobctl.model import slug
from jobctl.planner.plan import Plan, Sharding

DEFAULT_TIME_MIN = 60
DEFAULT_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

# Names submitit sets itself or jobctl derives from the plan; overriding them through
# slurm.additional would make the job disagree with its plan or lose its logs.
_RESERVED_SBATCH = {
    "job_name": "the recipe's name",
    "partition": "the partition in the inventory",
    "nodes": "the plan", "ntasks": "the plan", "ntasks_per_node": "the plan",
    "gpus": "the plan", "gpus_per_node": "the plan", "gpus_per_task": "the plan",
    "cpus_per_task": "the partition's cpus_per_node", "mem": "the partition's mem_gib",
    "mem_per_cpu": "the partition's mem_gib", "mem_per_gpu": "the partition's mem_gib",
    "time": "recipe resources.time", "account": "slurm.account", "qos": "slurm.qos",
    "constraint": "slurm.constraint", "gres": "slurm.gres", "exclude": "recipe resources.exclude",
    "output": "submitit (the job folder)", "error": "submitit (the job folder)",
    "open_mode": "submitit", "signal": "submitit", "array": "submitit",
}
_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- Slurm ---------------------------------------------------------------------------------

def slurm_parameters(plan: Plan, recipe: Any, inventory: Any, partition: Any) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters for running ``plan`` on ``partition``.

    One task per node (torchrun starts the per-GPU processes); the whole node's CPUs and
    memory are requested. Keys with no value are left out, so submitit's defaults apply.
    GPUs: ``gres=gpu:<G>`` plus ``gpus_per_node=<G>`` by default; with the inventory's own
    ``slurm.gres`` naming GPUs, that string alone (its count must equal the plan's).
    """
    _check_fits(plan, recipe, inventory, partition)
    slurm = getattr(inventory, "slurm", None)
    gpu_partition = str(partition.gpu).lower() != "cpu"
    params: dict[str, Any] = {
        "job_name": slug(recipe.name),  # no '%' (Slurm's patterns), no control characters
        "partition": partition.name,
        "nodes": plan.nodes,
        "ntasks_per_node": 1,
        # a plan that uses some of a node's GPUs takes the same share of its CPUs and memory,
        # so that the rest of the node stays schedulable; all of them: the whole node
        "cpus_per_task": _share(partition.cpus_per_node, plan, partition, whole=1),
        "mem": _mem(_share(partition.mem_gib, plan, partition)),
        "time": _time_min(recipe, partition),
    }
    exclude = list(getattr(getattr(recipe, "resources", None), "exclude", None) or [])
    if exclude:
        params["exclude"] = ",".join(exclude)
    gres = getattr(slurm, "gres", None)
    if gpu_partition:
        gres_gpus = None if gres is None else _gres_gpu_count(gres)
        if gres is None:
            # Both flags, as submitit users write them. Slurm 22.05 accepts the pair
            # (TresPerNode=gres:gpu:8,gres:gpu:8) and allocates 8 per node, not 16.
            params["gpus_per_node"] = plan.gpus_per_node
            gres = f"gpu:{plan.gpus_per_node}"
        elif gres_gpus is None:
            params["gpus_per_node"] = plan.gpus_per_node  # the inventory's gres asks for no GPUs
        elif gres_gpus != plan.gpus_per_node:
            raise LaunchError(
                f"slurm.gres {gres!r} asks for {gres_gpus} GPUs per node; the plan uses {plan.gpus_per_node}",
                hint=f"Leave slurm.gres unset (jobctl then asks for gpu:{plan.gpus_per_node}) "
                     "or make its count match the plan.",
            )
        # else: the inventory's gres names the GPUs; --gpus-per-node is left out, because Slurm
        # refuses a typed --gres=gpu:h100:8 next to an untyped --gpus-per-node=8 ("Invalid GRES
        # specification (with and without type identification)", seen on Slurm 22.05).
    for name in ("account", "qos", "constraint"):
        value = getattr(slurm, name, None)
        if value is not None:
            params[name] = value
    if gres is not None:
        params["gres"] = gres
    additional = _additional(getattr(slurm, "additional", None) or {})
    if additional:
        params["additional_parameters"] = additional
    setup = list(getattr(slurm, "setup", None) or [])
    if setup:
        params["setup"] = setup
    for key, value in params.items():
        if isinstance(value, str):
            _check_sbatch_value(key, value)
    return params


def _gres_gpu_count(gres: str) -> int | None:
    """GPUs per node in a --gres string ("gpu:8", "gpu:h100:8", "gpu:h100" = 1), or None without gpu."""
    # Slurm's format: a comma-separated list of name[[:type]:count], count defaulting to 1.
    for entry in gres.split(","):
        fields = entry.strip().split(":")
        if fields[0] == "gpu":
            return int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return None


def _check_fits(plan: Any, recipe: Any, inventory: Any, partition: Any) -> None:
    where = f"partition {partition.name!r} of cluster {getattr(inventory, 'name', '?')!r}"
    problems = list(plan.check()) if hasattr(plan, "check") else []
    if plan.gpus_per_node > partition.gpus_per_node:
        problems.append(f"the plan uses {plan.gpus_per_node} GPUs per node; {where} has {partition.gpus_per_node}")
    if plan.nodes > partition.nodes:
        problems.append(f"the plan uses {plan.nodes} nodes; {where} has {partition.nodes}")
    resources = getattr(recipe, "resources", None)
    max_nodes = getattr(resources, "max_nodes", None)
    if max_nodes is not None and plan.nodes > max_nodes:
        problems.append(f"the plan uses {plan.nodes} nodes; the recipe allows resources.max_nodes={max_nodes}")
    exact = getattr(resources, "nodes", None)
    if exact is not None and (plan.nodes != exact or plan.gpus_per_node != partition.gpus_per_node):
        problems.append(f"the plan uses {plan.world_size} GPUs; the recipe asks for resources.nodes={exact} "
                        f"whole nodes ({exact * partition.gpus_per_node} GPUs)")
    excluded = _excluded_nodes(getattr(resources, "exclude", None) or [])
    if excluded and plan.nodes > partition.nodes - excluded:
        problems.append(f"the plan uses {plan.nodes} nodes; {where} has {partition.nodes}, and resources.exclude "
                        f"keeps {excluded} of them out: {max(0, partition.nodes - excluded)} left, so the job would "
                        "wait forever")
    wanted = getattr(resources, "partition", None)
    if wanted is not None and wanted != partition.name:
        problems.append(f"the recipe asks for resources.partition={wanted!r}, not {partition.name!r}")
    if problems:
        raise LaunchError("the plan does not fit the job request:\n  " + "\n  ".join(problems),
                          hint="Plan again for this cluster (`jobctl plan RECIPE --cluster NAME`).")


def _excluded_nodes(names: list[str]) -> int:
    """How many nodes resources.exclude names (Slurm ranges expanded, each counted once)."""
    from jobctl.backends.discover import expand_hostlist

    return len(set(expand_hostlist(",".join(names)))) if names else 0


def _share(amount, plan: Any, partition: Any, whole=None):
    """`amount` of a node (CPUs, GiB) in proportion to the GPUs of it the plan uses, rounded
    down (to a multiple of `whole` when given, at least one); all of it for a whole node."""
    used, per_node = plan.gpus_per_node, partition.gpus_per_node
    if not per_node or used >= per_node:
        return amount
    share = amount * used / per_node
    if whole:
        return max(whole, int(share // whole * whole))
    return math.floor(share * 1024) / 1024


def _mem(mem_gib: float) -> str:
    # Slurm's G and M are binary units (GiB, MiB). Whole GiB when exact, else MiB, rounded down
    # so the request never exceeds the node.
    if float(mem_gib).is_integer():
        return f"{int(mem_gib)}G"
    return f"{math.floor(mem_gib * 1024)}M"


def _time_min(recipe: Any, partition: Any) -> int:
    limit = parse_slurm_time(getattr(partition, "time_limit", None), f"partitions[{partition.name}].time_limit")
    resources = getattr(recipe, "resources", None)
    asked = parse_slurm_time(getattr(resources, "time", None), "resources.time")
    if asked is None:
        return limit if limit is not None else DEFAULT_TIME_MIN
    if limit is not None and asked > limit:
        raise LaunchError(
            f"resources.time: {resources.time!r} ({asked} min) is longer than partition "
            f"{partition.name!r} allows ({partition.time_limit!r}, {limit} min); Slurm would never start it",
            hint=f"Ask for at most {partition.time_limit!r}, or resume from checkpoints in shorter jobs.",
        )
    return asked


def _additional(additional: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in additional.items():
        key = str(key)
        if not _SBATCH_KEY.fullmatch(key):
            raise LaunchError(f"slurm.additional: {key!r} is not an sbatch long option name "
                              "(letters, digits, '-' and '_', at least 2 characters)")
        norm = key.replace("-", "_")
        if norm in _RESERVED_SBATCH:
            raise LaunchError(f"slurm.additional: {key!r} is set by jobctl from {_RESERVED_SBATCH[norm]}",
                              hint="Remove it from slurm.additional.")
        if value is False:  # `exclusive: false` means "do not pass the flag"
            continue
        if isinstance(value, str):
            _check_sbatch_value(f"slurm.additional.{key}", value)
        out[key] = value
    return out


def _check_sbatch_value(key: str, value: str) -> None:
    # submitit writes `#SBATCH --key='value'`: a newline inside the quotes would end the
    # comment line and put the rest into the batch script as shell code.
    if any(c in value for c in "\n\r\0"):
        raise LaunchError(f"{key}: {value!r} contains a line break or NUL, which cannot go in an #SBATCH line")


# -- environment ---------------------------------------------------------------------------

def job_environment(plan: Plan, recipe: Any, inventory: Any, framework_env: dict | None = None) -> dict[str, str]:
    """The job's environment: defaults, what the framework's rendering needs (e.g.
    CUDA_DEVICE_MAX_CONNECTIONS for Megatron, accelerate's FSDP_*), then the inventory's env,
    then the recipe's, then JOBCTL_*.

    Later sources win, so a recipe or inventory may change PYTORCH_CUDA_ALLOC_CONF. The
    JOBCTL_* values come from the plan and cannot be overridden (that is an error).
    """
    env = dict(DEFAULT_ENV)
    for name, value in (framework_env or {}).items():
        _check_env("framework.env", name, value)
        env[name] = value
    for source, values in (("env", getattr(inventory, "env", None)),
                           ("launch.env", getattr(getattr(recipe, "launch", None), "env", None))):
        for name, value in (values or {}).items():
            _check_env(source, name, value)
            env[name] = value
    derived = {**plan_environment(plan, recipe.name), **train_environment(recipe)}
    clash = sorted(set(env) & set(derived))
    if clash:
        raise LaunchError(f"environment names {', '.join(clash)} are set by jobctl from the plan",
                          hint="Rename them; read the plan's values from JOBCTL_* in the job.")
    env.update(derived)
    return env


def _fp8_recipe(recipe) -> str:
    """train.fp8_recipe, or the default scaling of the recipe's framework."""
    from jobctl.planner import inputs

    return frameworks.default_fp8_recipe(inputs.framework(recipe).caps, getattr(recipe.train, "fp8_recipe", None))


def train_environment(recipe: Any) -> dict[str, str]:
    """The recipe's training values a script may read (so that `--sweep train.lr=...` reaches a
    job whose command does not name ${train.lr}): JOBCTL_SEQ_LEN, and JOBCTL_LR and
    JOBCTL_TRAIN_STEPS when the recipe gives them; JOBCTL_PRECISION (and JOBCTL_FP8_RECIPE under
    fp8), which code of one's own reads to pick its Transformer Engine recipe."""
    train = getattr(recipe, "train", None)
    out = {}
    if getattr(train, "seq_len", None) is not None:
        out["JOBCTL_SEQ_LEN"] = str(train.seq_len)
    if getattr(train, "precision", None) is not None:
        out["JOBCTL_PRECISION"] = str(train.precision)
        if train.precision == "fp8":
            out["JOBCTL_FP8_RECIPE"] = _fp8_recipe(recipe)
    if getattr(train, "lr", None) is not None:
        out["JOBCTL_LR"] = repr(float(train.lr))
    if getattr(train, "steps", None) is not None:
        out["JOBCTL_TRAIN_STEPS"] = str(train.steps)
    return out


def plan_environment(plan: Plan, recipe_name: str) -> dict[str, str]:
    """The JOBCTL_* variables that carry the plan into the job."""
    return {
        "JOBCTL_TP": str(plan.tp),
        "JOBCTL_PP": str(plan.pp),
        "JOBCTL_DP": str(plan.dp),
        "JOBCTL_CP": str(plan.cp),
        "JOBCTL_EP": str(plan.ep),
        "JOBCTL_MICRO_BATCH_SIZE": str(plan.micro_batch_size),
        "JOBCTL_GRAD_ACCUM_STEPS": str(plan.grad_accum_steps),
        "JOBCTL_GLOBAL_BATCH_SIZE": str(plan.global_batch_size),
        "JOBCTL_SHARDING": str(plan.sharding),
        "JOBCTL_ZERO_STAGE": str(Sharding(plan.sharding).zero_stage),
        "JOBCTL_RECOMPUTE": str(plan.recompute),
        "JOBCTL_OFFLOAD": str(plan.offload),
        "JOBCTL_SEQUENCE_PARALLEL": "1" if plan.sequence_parallel else "0",
        "JOBCTL_VIRTUAL_STAGES": str(plan.virtual_stages),
        "JOBCTL_RECOMPUTE_LAYERS": str(plan.recompute_layers),
        "JOBCTL_NODES": str(plan.nodes),
        "JOBCTL_GPUS_PER_NODE": str(plan.gpus_per_node),
        "JOBCTL_WORLD_SIZE": str(plan.nodes * plan.gpus_per_node),
        "JOBCTL_PLAN": json.dumps(plan.to_dict(), separators=(",", ":")),
        "JOBCTL_RECIPE_NAME": str(recipe_name),
    }


def _check_env(source: str, name: Any, value: Any) -> None:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise LaunchError(f"{source}: {name!r} is not an environment variable name "
                          "(letters, digits and '_', not starting with a digit)")
    if not isinstance(value, str):
        raise LaunchError(f"{source}.{name}: values must be strings, got {type(value).__name__} {value!r}",
                          hint="Quote it in the YAML.")
    if "\0" in value:
        raise LaunchError(f"{source}.{name}: contains a NUL byte, which no environment can hold")


