"""A tiny, real training loop that needs nothing but Python: a character-level bigram
language model trained by SGD on a built-in text, printing its loss.

It reads its settings from the plan jobctl puts in the environment (JOBCTL_MICRO_BATCH_SIZE,
JOBCTL_GRAD_ACCUM_STEPS), so the global batch is micro-batch x accumulation as planned.
Run: python -m jobctl.examples.tiny_train --steps 20 [--seq-len 64] [--lr 0.5]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

TEXT = (
    "the planner finds the layout that fits and runs fast. the job watches itself and steps down "
    "when memory runs out. every number is explained, and nothing a user submitted is lost. "
) * 8


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=float(os.environ.get("JOBCTL_LR", "0.5")),
                    help="learning rate (default: $JOBCTL_LR, the recipe's train.lr, else 0.5)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    mbs = int(os.environ.get("JOBCTL_MICRO_BATCH_SIZE", "4"))
    accum = int(os.environ.get("JOBCTL_GRAD_ACCUM_STEPS", "2"))
    rng = random.Random(args.seed)
    vocab = sorted(set(TEXT))
    index = {c: i for i, c in enumerate(vocab)}
    v = len(vocab)
    data = [index[c] for c in TEXT]
    # logits[a][b]: score of character b following a (a bigram model, V x V parameters)
    logits = [[0.0] * v for _ in range(v)]
    print(f"tiny_train: vocab {v}, params {v * v}, micro-batch {mbs} x accumulation {accum}, "
          f"seq_len {args.seq_len}", flush=True)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        grad = [[0.0] * v for _ in range(v)]
        loss_sum, count = 0.0, 0
        for _ in range(mbs * accum):
            start = rng.randrange(0, len(data) - args.seq_len - 1)
            for a, b in zip(data[start:start + args.seq_len], data[start + 1:start + args.seq_len + 1]):
                row = logits[a]
                top = max(row)
                exps = [math.exp(x - top) for x in row]
                z = sum(exps)
                loss_sum -= math.log(exps[b] / z)
                g = grad[a]
                for j in range(v):
                    g[j] += exps[j] / z
                g[b] -= 1.0
                count += 1
        for a in range(v):
            row, g = logits[a], grad[a]
            for j in range(v):
                row[j] -= args.lr * g[j] / count * v
        print(f"step {step:4d}  loss {loss_sum / count:.4f}", flush=True)
    print(f"tiny_train: done in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
