"""Test payload: a training loop that checkpoints, resumes, and can hang or report a GPU fault.

Each step sleeps STEP_S, saves a checkpoint as a step-N folder in $JOBCTL_CHECKPOINT_DIR (the
chain's folder jobctl gives every attempt; written under a .tmp name, then renamed, as
torchtitan's and DCP's savers finish a checkpoint) and prints `step N loss ...`. It starts
after $JOBCTL_RESUME_STEP when $JOBCTL_RESUME is 1, and appends every step it runs to
steps-run.txt beside the checkpoints, so a test can count them across attempts.

HANG_AT_STEP=N: the first attempt to reach step N stops there, forever, in
stuck_in_a_collective (as a rank waits for a peer that never comes).
XID_ON_FIRST_NODE=1: the first node this payload runs on prints the driver's line for Xid 79
(the GPU fell off the bus, as the kernel log shows it) and fails, there and every later time
it runs there (the node stays bad); on any other node it trains.
OOM_AT_STEP=N with OOM_MAX_MICRO_BATCH=B: at step N, a micro-batch ($JOBCTL_MICRO_BATCH_SIZE)
above B runs out of GPU memory as PyTorch reports it (tests/payloads/oom_payload.py's message).
"""

import os
import sys
import time


def stuck_in_a_collective() -> None:
    while True:
        time.sleep(1)


def main() -> int:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    step_s = float(os.environ.get("STEP_S", "0.2"))
    ckpt = os.environ["JOBCTL_CHECKPOINT_DIR"]
    node = os.environ.get("SLURMD_NODENAME", "local")
    start = int(os.environ.get("JOBCTL_RESUME_STEP", "0")) if os.environ.get("JOBCTL_RESUME") == "1" else 0
    print(f"hang_payload: on {node}, starting after step {start} of {total}", flush=True)
    bad = os.path.join(ckpt, "..", "bad-node.txt")
    if os.environ.get("XID_ON_FIRST_NODE") == "1":
        if not os.path.exists(bad):
            with open(bad, "w") as f:
                f.write(node)
        if open(bad).read() == node:
            print("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.", flush=True)
            return 1
    hang_at = int(os.environ.get("HANG_AT_STEP", "0"))
    oom_at = int(os.environ.get("OOM_AT_STEP", "0"))
    mbs = int(os.environ.get("JOBCTL_MICRO_BATCH_SIZE", "1"))
    hung = os.path.join(ckpt, "..", "hung-once.txt")
    for step in range(start + 1, total + 1):
        if step == hang_at and not os.path.exists(hung):
            open(hung, "w").close()
            print("hang_payload: waiting for a peer that never comes", flush=True)
            stuck_in_a_collective()
        if step == oom_at and mbs > int(os.environ.get("OOM_MAX_MICRO_BATCH", "0")):
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from oom_payload import oom_message

            sys.stderr.write(f"Traceback (most recent call last):\ntorch.OutOfMemoryError: {oom_message(mbs)}\n")
            return 1
        time.sleep(step_s)
        tmp = os.path.join(ckpt, f"step-{step}.tmp")
        os.makedirs(tmp, exist_ok=True)
        os.replace(tmp, os.path.join(ckpt, f"step-{step}"))
        with open(os.path.join(ckpt, "..", "steps-run.txt"), "a") as f:
            f.write(f"{step}\n")
        print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
