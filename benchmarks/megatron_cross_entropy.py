#!/usr/bin/env python
"""Megatron-Core's own cross-entropy losses on the CPU: the peak bytes they hold per logit,
measured, against jobctl's bytes per logit for Megatron.

Megatron-LM computes the loss inside the model's forward (models/common/language_module/
language_module.py compute_language_model_loss): with --cross-entropy-loss-fusion (native impl)
it calls fusions/fused_cross_entropy.py's fused_vocab_parallel_cross_entropy, whose steps are
functions decorated with megatron.core.jit.jit_fuser (torch.compile on torch >= 2.2); without it,
tensor_parallel/cross_entropy.py's vocab_parallel_cross_entropy, which works in place on one fp32
copy of the logits. This script runs both, from the installed megatron-core, on bf16 logits
[s, b, V] over a one-rank gloo group (tensor-parallel size 1; the bytes are per local logit at
any TP), compiled by inductor for the CPU (a C++ compiler is needed), and records every CPU
allocation and free with torch.profiler (profile_memory) around the forward and, separately,
the backward, after two warm-up steps (compilation).

Per logit it reports: the forward's peak with the bf16 logits (which exist during forward),
what the loss keeps for backward, and the backward's peak: what it keeps plus the most the
backward allocates at once (the bf16 logits are not counted there: Megatron's forward returns
the loss and drops them; the loss saves only its fp32 softmax). The loss's peak is the larger.
jobctl's figure is planner.memory.logits_bytes_per_elem for framework megatron, with and
without the recipe's fused_cross_entropy.

What differs from a GPU: inductor generates C++ instead of Triton kernels; which buffers a
compiled graph allocates comes from its graph lowering and scheduler, which both backends share.
The measured figure is checked against GPU runs by Megatron-LM's own functional tests (the
cross_entropy_loss_fusion case in benchmarks/megatron_memory.py).

Run: python benchmarks/megatron_cross_entropy.py [--seq 512 --batch 2 --vocab 32000] [--json]
Needs torch, megatron-core and a C++ compiler; imported only here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings


def _peak(prof) -> tuple[int, int]:
    """(most bytes alive at once above the start, bytes alive at the end) over a profile's
    CPU memory events, in time order."""
    live = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak, live


def measure(loss_fn, s: int, b: int, v: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    logits = torch.randn(s, b, v, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, v, (s, b))
    for _ in range(2):  # compile, and let the caching settle
        loss_fn(logits, target).sum().backward()
        logits.grad = None
    n = s * b * v
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as fwd:
        loss = loss_fn(logits, target)
    f_peak, kept = _peak(fwd)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as bwd:
        loss.sum().backward()
        del loss
    b_peak, _ = _peak(bwd)
    forward = 2 + f_peak / n  # the bf16 logits exist during forward
    backward = (kept + b_peak) / n
    return {"forward": forward, "kept": kept / n, "backward": backward, "peak": max(forward, backward)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--json", action="store_true", help="raw numbers as JSON")
    args = ap.parse_args()
    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        raise SystemExit("a C++ compiler is needed: torch.compile (inductor) builds Megatron's fused loss for the CPU")
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        from megatron.core import jit, parallel_state
        from megatron.core.fusions.fused_cross_entropy import (
            fused_vocab_parallel_cross_entropy,
        )
        from megatron.core.tensor_parallel.cross_entropy import (
            vocab_parallel_cross_entropy,
        )

        from jobctl.planner.memory import Workload, logits_bytes_per_elem
        from jobctl.planner.models import PRESETS

        parallel_state.initialize_model_parallel(1, 1)
        tp_group = parallel_state.get_tensor_model_parallel_group()

        rows = []
        for name, fn, fused in (
                ("vocab_parallel_cross_entropy (default)", vocab_parallel_cross_entropy, False),
                ("fused_vocab_parallel_cross_entropy (--cross-entropy-loss-fusion)",
                 lambda x, t: fused_vocab_parallel_cross_entropy(x, t, tp_group), True)):
            m = measure(fn, args.seq, args.batch, args.vocab)
            w = Workload(PRESETS["llama3.1-8b"], args.seq, args.batch, framework="megatron",
                         fused_cross_entropy=fused)
            rows.append({"loss": name, "fused": fused, **m, "modelled": logits_bytes_per_elem(w)})
    finally:
        dist.destroy_process_group()
    out = {"torch": torch.__version__, "jit_fuser": getattr(jit.jit_fuser, "__name__", str(jit.jit_fuser)),
           "shape": [args.seq, args.batch, args.vocab], "rows": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"Megatron-Core cross-entropy on CPU, torch {out['torch']}, jit_fuser {out['jit_fuser']}, "
          f"bf16 logits [s {args.seq}, b {args.batch}, V {args.vocab}]; bytes per logit")
    print(f"{'loss':66} {'fwd':>5} {'kept':>5} {'bwd':>5} {'peak':>5} {'jobctl':>6}")
    for r in rows:
        print(f"{r['loss']:66} {r['forward']:5.2f} {r['kept']:5.2f} {r['backward']:5.2f} {r['peak']:5.2f} "
              f"{r['modelled']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
