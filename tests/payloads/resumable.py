"""Test payload: a training loop that checkpoints its step to the job folder after every
step and resumes from it when the job is started again (after preemption or requeue)."""

import os
import sys
import time


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    folder = os.environ["JOBCTL_JOB_FOLDER"]
    ckpt = os.path.join(folder, "checkpoint-step.txt")
    start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    with open(os.path.join(folder, "starts.txt"), "a") as f:
        f.write(f"{start}\n")
    print(f"resumable: starting at step {start}", flush=True)
    for step in range(start + 1, steps + 1):
        time.sleep(0.3)
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(step))
        os.replace(tmp, ckpt)
        print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
