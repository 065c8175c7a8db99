"""Test payload: a training step that runs out of GPU memory above a budget, exactly as
PyTorch does (torch.OutOfMemoryError with the caching allocator's message, exit code 1).

The budget is the largest micro-batch that "fits": OOM_MAX_MICRO_BATCH (0: always OOM).
The micro-batch comes from the command line when the recipe passes ${framework.args}
(Megatron's --micro-batch-size), else from the plan's environment (JOBCTL_MICRO_BATCH_SIZE);
each sequence "needs" 0.25 GiB more, so the "Tried to allocate" figure grows with it.
With OOM_NODE_RANK=R only node R fails; the other nodes hang (as ranks left in a collective do).
"""

import os
import sys
import time

GIB = 1 << 30


def oom_message(mbs: int) -> str:
    """PyTorch >= 2.1's OOM message (c10/cuda/CUDACachingAllocator.cpp) for a micro-batch of `mbs`."""
    tried = 0.25 * mbs
    return (f"CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of "
            f"79.19 GiB of which {0.75:.2f} GiB is free. Including non-PyTorch memory, this process "
            f"has 78.43 GiB memory in use. Of the allocated memory 76.20 GiB is allocated by PyTorch, "
            f"and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
            f"is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            f"fragmentation.  See documentation for Memory Management  "
            f"(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def main() -> int:
    argv = sys.argv[1:]
    if "--micro-batch-size" in argv:
        mbs = int(argv[argv.index("--micro-batch-size") + 1])
        print(f"oom_payload: argv {' '.join(argv)}", flush=True)
    else:
        mbs = int(os.environ["JOBCTL_MICRO_BATCH_SIZE"])
    accum = int(os.environ["JOBCTL_GRAD_ACCUM_STEPS"])
    budget = int(os.environ.get("OOM_MAX_MICRO_BATCH", "0"))
    print(f"oom_payload: micro-batch {mbs} x {accum} (fits up to {budget})", flush=True)
    time.sleep(0.5)
    oom_rank = os.environ.get("OOM_NODE_RANK")  # only this node runs out; the others wait, as in a collective
    if mbs > budget and oom_rank is not None and os.environ.get("JOBCTL_NODE_RANK") != oom_rank:
        print("oom_payload: waiting for the other nodes in a collective", flush=True)
        time.sleep(600)
        return 0
    if mbs > budget:
        message = oom_message(mbs)
        try:
            import torch
        except ImportError:  # without torch, the same text and exit status
            sys.stderr.write("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
                             f"torch.OutOfMemoryError: {message}\n")
            return 1
        raise torch.OutOfMemoryError(message)
    for step in range(1, 4):
        print(f"step {step} loss {2.0 / step:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
