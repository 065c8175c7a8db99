"""accelerate: the rendered accelerate_config.yaml through accelerate's own ClusterConfig loader
(unknown keys and bad enums refused), and the rendered FSDP_* environment through
FullyShardedDataParallelPlugin (what Accelerator() builds in the training process) and
ParallelismConfig for HSDP."""

import json
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
from accelerate.commands.config.config_args import ClusterConfig  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin  # noqa: E402


def check(case):
    fw = case["framework"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "accelerate_config.yaml")
        with open(path, "w") as f:
            f.write(fw["files"]["accelerate_config.yaml"])
        cc = ClusterConfig.from_yaml_file(path)
    out = {"ok": True, "distributed_type": str(cc.distributed_type), "num_processes": cc.num_processes,
           "mixed_precision": str(cc.mixed_precision)}
    env = fw["env"]
    if env.get("ACCELERATE_USE_FSDP") == "true":
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            pl = FullyShardedDataParallelPlugin()
            out.update(fsdp_version=pl.fsdp_version, reshard_after_forward=pl.reshard_after_forward,
                       offload=type(pl.cpu_offload).__name__, activation_checkpointing=pl.activation_checkpointing,
                       wrap=list(pl.transformer_cls_names_to_wrap or []))
            if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
                from accelerate.parallelism_config import ParallelismConfig

                pc = ParallelismConfig()
                out.update(dp_replicate=pc.dp_replicate_size, dp_shard=pc.dp_shard_size, total=pc.total_size)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return out


out = []
for case in json.load(sys.stdin):
    try:
        out.append(check(case))
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
