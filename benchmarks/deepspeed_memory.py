#!/usr/bin/env python
"""DeepSpeed's own ZeRO engine on the CPU, measured, against jobctl's memory model (issue 14).

DeepSpeed 0.19.8 picks its CPU accelerator (gloo) on a machine without a GPU, so its real
engine (deepspeed.initialize, ZeRO stage 1/2/3, bf16 with fp32 master weights, AdamW) trains a
small Llama here with real tensors. Per (ranks, stage), each rank in its own process:
  1. builds jobctl_measure/torch_reference.py's Llama (2 layers, h 256, f 688, 8 heads, 2 KV
     heads, vocab 1000) in bf16 and hands it to deepspeed.initialize with the zero_optimization
     block jobctl renders for the plan (overlap_comm on at stages 1 and 2 over 2 ranks);
  2. runs one step (forward, engine.backward, engine.step), then measures what stays resident:
     the bytes of every distinct tensor storage alive (a walk of the garbage collector's
     objects), i.e. what torch.cuda.memory_allocated would report on a GPU;
  3. runs a second step under a dispatch mode that adds up the storages created during it
     while they live; resident + their maximum is the step's peak (max_memory_allocated).
jobctl's side: estimate() for the same model, micro-batch 2, sequence 128, framework deepspeed,
zero<stage> over the ranks, tensor terms only (no CUDA context, NCCL buffers, allocator reserve).

    python benchmarks/deepspeed_memory.py                 # ranks 1 and 2, stages 1-3 (~1 min)
    python benchmarks/deepspeed_memory.py --ranks 2 --stages 3 --json
    python benchmarks/deepspeed_memory.py --ranks 2 --stages 2 --deepspeed-defaults  # overlap_comm off

Needs the test extra (torch CPU build, deepspeed). The first run may compile DeepSpeed's
shared-memory communication op (a minute).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import weakref

MODEL = dict(family="llama", layers=2, hidden=256, ffn_hidden=688, heads=8, kv_heads=2, vocab=1000, impl="eager")
SEQ, MICRO = 128, 2


def _storages(ptrs: dict) -> int:
    """Bytes of the distinct CPU tensor storages alive now (filled into ptrs: data_ptr -> bytes)."""
    import torch
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.device.type == "cpu" and not o.is_meta:
                st = o.untyped_storage()
                ptrs[st.data_ptr()] = st.nbytes()
        except Exception:  # objects that claim to be tensors but cannot be read
            continue
    return sum(ptrs.values())


def _live_mode(existing: set):
    """A dispatch mode: bytes of storages created under it (not views of older ones) while alive."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.seen: set = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    st = t.untyped_storage()
                    key = st.data_ptr()
                    if key and key not in self.seen and key not in existing:
                        self.seen.add(key)
                        n = st.nbytes()
                        self.live += n
                        self.peak = max(self.peak, self.live)
                        weakref.finalize(st, self._free, key, n)
            return out

        def _free(self, key, n):
            self.live -= n
            self.seen.discard(key)

    return Live()


def _worker(rank: int, ranks: int, stage: int, port: int, out, zero: dict):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks),
                      LOCAL_RANK=str(rank))
    import logging

    import deepspeed
    import torch

    from jobctl_measure import torch_reference
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = torch_reference.build_model(MODEL).to(torch.bfloat16)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randint(0, MODEL["vocab"], (MICRO, SEQ))

    def step():
        loss = engine(x).float().mean()
        engine.backward(loss)
        engine.step()

    step()
    gc.collect()
    ptrs: dict = {}
    resident = _storages(ptrs)
    live = _live_mode(set(ptrs))
    with live:
        step()
    out.put((rank, resident, resident + live.peak))


def measure(ranks: int, stage: int, zero: dict | None = None) -> dict:
    """Rank 0's resident and peak bytes; `zero`: the zero_optimization block (jobctl's rendering
    when None)."""
    if zero is None:
        from jobctl.frameworks import deepspeed
        w, plan = _workload_and_plan(ranks, stage)
        zero = deepspeed.config(plan, w)["zero_optimization"]
    import torch.multiprocessing as mp
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, ranks, stage, port, q, zero)) for r in range(ranks)]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    _, resident, peak = res[0]
    return {"resident": resident, "peak": peak}


def _workload_and_plan(ranks: int, stage: int):
    from jobctl.planner.memory import Workload
    from jobctl.planner.models import ModelSpec
    from jobctl.planner.plan import Plan

    spec = ModelSpec(name="torch_reference llama", family="llama", layers=MODEL["layers"], hidden=MODEL["hidden"],
                     ffn_hidden=MODEL["ffn_hidden"], heads=MODEL["heads"], kv_heads=MODEL["kv_heads"],
                     vocab=MODEL["vocab"])
    w = Workload(spec, SEQ, MICRO * ranks, framework="deepspeed", attention="sdpa")
    plan = Plan(nodes=1, gpus_per_node=ranks, tp=1, pp=1, dp=ranks, cp=1, sharding=f"zero{stage}",
                micro_batch_size=MICRO, grad_accum_steps=1, global_batch_size=MICRO * ranks, recompute="none",
                offload="none", sequence_parallel=False)
    return w, plan


def modelled(ranks: int, stage: int) -> dict:
    from jobctl.planner.memory import estimate_stage

    w, plan = _workload_and_plan(ranks, stage)
    bd = estimate_stage(w, 80 << 30, plan, "only")
    return {"peak": bd.tensor_bytes, "terms": {t.name: t.bytes for t in bd.terms}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], choices=(1, 2, 3))
    ap.add_argument("--deepspeed-defaults", action="store_true",
                    help="run zero_optimization as {stage} only (DeepSpeed's defaults) instead of jobctl's rendering")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for ranks in args.ranks:
        for stage in args.stages:
            me = measure(ranks, stage, {"stage": stage} if args.deepspeed_defaults else None)
            mo = modelled(ranks, stage)
            rows.append({"ranks": ranks, "stage": stage, "measured": me, "modelled": mo,
                         "peak_diff": (mo["peak"] - me["peak"]) / me["peak"]})
    if args.json:  # one line, the last: DeepSpeed logs to stdout too
        print(json.dumps(rows))
        return 0
    print("DeepSpeed ZeRO on the CPU (its own engine) vs jobctl, MB (1e6 bytes), rank 0")
    print(f"{'ranks':>5} {'stage':>5} {'resident':>9} {'peak':>9} {'modelled':>9} {'diff':>7}  modelled buffers")
    for r in rows:
        t = r["modelled"]["terms"]
        buf = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in t.items() if k in ("reduce bucket", "gathered weights"))
        print(f"{r['ranks']:>5} {r['stage']:>5} {r['measured']['resident'] / 1e6:9.1f} {r['measured']['peak'] / 1e6:9.1f} "
              f"{r['modelled']['peak'] / 1e6:9.1f} {r['peak_diff'] * 100:+6.1f}%  {buf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
