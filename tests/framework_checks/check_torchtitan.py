"""torchtitan 0.3.0: the rendered overrides through its own ConfigManager (tyro and
Trainer.Config.__post_init__), then ParallelDims and the trainer's batch arithmetic
(trainer.py: gradient_accumulation_steps = global / (local x dp_replicate x dp_shard); under PP
n_microbatches = local / pipeline_parallel_microbatch_size). With expert parallelism, ParallelDims
builds its meshes on torch's fake process group of the plan's world size (parallel_dims.py
build_mesh: the sparse mesh pp x dp_replicate x efsdp x ep over the same ranks as the dense one),
and the model config the rendered --module/--config names is built on the meta device to read
its experts.

Under fp8 and mxfp8 the rendered files hold a registry config module (--module names it): it is
written to a folder put first on sys.path, as the job's runner puts the job's framework folder on
PYTHONPATH, and ConfigManager imports it, which builds torchtitan's Float8LinearConverter or
MXFP8LinearConverter (with torchao). The converters refuse GPUs below compute capability 8.9 (10.0
for MXFP8) and this check runs on a CPU: their capability probes answer for the H100 or B200 the
plan is for (the only patch)."""

import contextlib
import io
import json
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
from torch.distributed.pipelining.schedules import get_schedule_class  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402


def _mesh(dims, world):
    """Build the meshes on a fake process group of `world` ranks; (efsdp, ep) sizes."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import torchtitan.distributed.parallel_dims as tt_pd

    tt_pd.device_type = "cpu"
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    dims.build_mesh()
    return dims.get_mesh("efsdp").size(), dims.get_mesh("ep").size()


def _experts(cfg):
    """(experts, top_k) of the model config the run builds, read from torchtitan's own config."""
    model = cfg.model_spec.model
    moe = next((lc.moe for lc in model.layers if getattr(lc, "moe", None) is not None), None)
    return (moe.num_experts, moe.router.top_k) if moe is not None else (0, 0)


def _linears(cfg) -> dict:
    """How many Linear configs of the model are torchao's Float8Linear, how many are not, and
    the names of those that are not (torchtitan's model config tree, models/common/linear.py)."""
    from torchtitan.models.common.linear import Linear

    out = {"float8": 0, "mxfp8": 0, "other": 0, "other_names": set()}
    for fqn, lc, _parent, _attr in cfg.model_spec.model.traverse(Linear.Config):
        if type(lc).__qualname__ == "Float8Linear.Config":
            out["float8"] += 1
        elif type(lc).__qualname__ == "MXFP8Linear.Config":
            out["mxfp8"] += 1
        else:
            out["other"] += 1
            out["other_names"].add(fqn.split(".")[-1])
    out["other_names"] = sorted(out["other_names"])
    return out


def _with_files(case) -> None:
    """The rendered Python files importable, as the job's PYTHONPATH makes them."""
    py = {k: v for k, v in case["framework"].get("files", {}).items() if k.endswith(".py")}
    if not py:
        return
    import torchtitan.components.quantization.float8 as tt_float8
    import torchtitan.components.quantization.mx as tt_mx

    # the plan's H100 (9.0) or B200 (10.0), not this CPU
    tt_float8.has_cuda_capability = tt_mx.has_cuda_capability = lambda major, minor: True
    folder = Path(tempfile.mkdtemp(prefix="jobctl-tt-"))
    for name, text in py.items():
        (folder / name).write_text(text)
        sys.modules.pop(name[:-3], None)  # each case's own module of that name
    sys.path.insert(0, str(folder))


def check(case):
    args = list(case["framework"]["args"])
    if not any(a.startswith("--module=") for a in args):
        args = ["--module=llama3", "--config=llama3_debugmodel"] + args
    _with_files(case)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            cfg = ConfigManager().parse_args(args)
        except SystemExit:
            raise ValueError(err.getvalue()[-600:]) from None
    p, t = cfg.parallelism, cfg.training
    world = case["plan"]["world_size"]
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, world_size=world)
    experts = _experts(cfg)
    efsdp = ep = None
    if p.expert_parallel_degree > 1:
        efsdp, ep = _mesh(dims, world)
    batch_degree = dims.dp_replicate * dims.dp_shard
    if t.global_batch_size % (t.local_batch_size * batch_degree):
        raise ValueError("global batch size must be multiple of local batch size times data-parallel degree")
    accum = t.global_batch_size // (t.local_batch_size * batch_degree)
    pp = p.pipeline_parallel_degree
    n_micro = t.local_batch_size // p.pipeline_parallel_microbatch_size if pp > 1 else 1
    schedule = get_schedule_class(p.pipeline_parallel_schedule).__name__ if pp > 1 else None
    ac = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint is not None else None
    return {"ok": True, "accum": accum, "n_microbatches": n_micro, "schedule": schedule, "ac": ac,
            "dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": p.tensor_parallel_degree,
            "pp": pp, "cp": p.context_parallel_degree, "sp": p.enable_sequence_parallel,
            "cpu_offload": t.enable_cpu_offload, "layers_per_stage": p.pipeline_parallel_layers_per_stage,
            "compile": cfg.compile.enable, "async_tp": cfg.compile.enable_async_tensor_parallel,
            "ep": ep, "efsdp": efsdp, "experts": experts[0], "top_k": experts[1], "linears": _linears(cfg)}


out = []
for case in json.load(sys.stdin):
    try:
        out.append(check(case))
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
