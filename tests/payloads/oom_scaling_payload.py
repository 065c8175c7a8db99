"""Test payload: a training step whose real memory need is far above what jobctl's model
predicted, by an unmodelled buffer that scales like the activations and logits (a custom kernel's
workspace, say); it fails exactly as PyTorch does when that need exceeds the GPU.

need = P + OOM_GAMMA * S, with P the plan's predicted peak and S its predicted activations and
logits, both read from the job's own plan.json. The GPU: OOM_CAPACITY_GIB total, of which
OOM_FREE_GIB is free when the step asks for the rest (PyTorch's message: in use = capacity -
free, "Tried to allocate" = need - in use).
"""

import json
import os
import sys
import time

GIB = 1 << 30


def main() -> int:
    report = json.loads(open(os.path.join(os.environ["JOBCTL_JOB_FOLDER"], "plan.json")).read())
    mem = report["memory"]
    predicted, scaling = mem["total_bytes"], mem["activations_bytes"] + mem["logits_bytes"]
    need = predicted + float(os.environ["OOM_GAMMA"]) * scaling
    capacity = float(os.environ.get("OOM_CAPACITY_GIB", "79.19")) * GIB
    free = float(os.environ.get("OOM_FREE_GIB", "0.75")) * GIB
    print(f"oom_scaling_payload: micro-batch {os.environ['JOBCTL_MICRO_BATCH_SIZE']}, recompute "
          f"{os.environ['JOBCTL_RECOMPUTE']}: needs {need / GIB:.2f} GiB of {capacity / GIB:.2f}", flush=True)
    time.sleep(0.5)
    if need > capacity:
        in_use = capacity - free
        tried = need - in_use
        # PyTorch >= 2.1's message (c10/cuda/CUDACachingAllocator.cpp), with its figures
        message = (f"CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a total capacity of "
                   f"{capacity / GIB:.2f} GiB of which {free / GIB:.2f} GiB is free. Including non-PyTorch memory, "
                   f"this process has {in_use / GIB:.2f} GiB memory in use. Of the allocated memory "
                   f"{in_use / GIB - 1:.2f} GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but "
                   f"unallocated.")
        sys.stderr.write("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
                         f"torch.OutOfMemoryError: {message}\n")
        return 1
    for step in range(1, 4):
        print(f"step {step} loss {2.0 / step:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
