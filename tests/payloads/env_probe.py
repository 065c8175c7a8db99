"""Test payload: report what a process inside a jobctl job sees.

Writes <JOBCTL_JOB_FOLDER>/probe-<rank>.json with its argv, the environment variables the
tests check, and — when started by torchrun — the torch.distributed world as seen through a
real gloo all_gather (every rank contributes its rank and node).
"""

import json
import os
import sys


def main() -> int:
    info = {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                                         if k.startswith(("JOBCTL_", "PYTORCH_", "HOSTILE", "SLURM_NODEID",
                                                          "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"))}}
    rank = int(os.environ.get("RANK", "0"))
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        mine = [dist.get_rank(), int(os.environ.get("GROUP_RANK", os.environ.get("JOBCTL_NODE_RANK", "0")))]
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        info["world"] = {"size": dist.get_world_size(), "rank": dist.get_rank(), "gathered": gathered}
        dist.barrier()
        dist.destroy_process_group()
    folder = os.environ["JOBCTL_JOB_FOLDER"]
    with open(os.path.join(folder, f"probe-{rank}.json"), "w") as f:
        json.dump(info, f)
    print(f"probe rank {rank} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
