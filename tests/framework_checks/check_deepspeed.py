"""DeepSpeed: the rendered ds_config.json through deepspeed.runtime.config.DeepSpeedConfig (its
pydantic ZeRO/offload/precision configs and the batch assertion). DeepSpeedConfig asks
deepspeed.comm for the data-parallel world size; with no process group it silently takes 1, so
the two calls are answered with the plan's data-parallel size (what a real group would say)."""

import json
import sys
import warnings

warnings.filterwarnings("ignore")
import deepspeed.comm as dist  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402


def check(case):
    cfg = json.loads(case["framework"]["files"]["ds_config.json"])
    world = case["plan"]["dp"]
    dist.get_rank = lambda *a, **k: 0
    dist.get_world_size = lambda *a, **k: world
    c = DeepSpeedConfig(cfg)
    z = c.zero_config
    return {"ok": True, "train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
            "accum": c.gradient_accumulation_steps, "stage": int(c.zero_optimization_stage),
            "offload_optimizer": str(z.offload_optimizer.device) if z.offload_optimizer else None,
            "offload_param": str(z.offload_param.device) if z.offload_param else None,
            # after DeepSpeed's validator, which fills the stage's own default where the file is silent
            "overlap_comm": bool(z.overlap_comm)}


out = []
for case in json.load(sys.stdin):
    try:
        out.append(check(case))
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
