#!/usr/bin/env python
"""Predicted (jobctl.planner.memory) vs measured (PyTorch) bytes, term by term.

CPU mode (default, ~10-30 s): tiny Llama/GPT models from jobctl_measure/torch_reference.py.
  * model states: parameter, gradient and optimizer-state bytes after one real optimizer
    step (adamw, sgd, sgd-momentum, adafactor; fp32 and pure bf16) vs jobctl's
    "weights", "gradients" and "optimizer states" terms.  Expected: exact.
  * activations: bytes autograd SAVES for backward (saved_tensors_hooks, deduplicated by
    storage), per transformer layer, vs jobctl's `stored_layer_bytes` (recompute none:
    `layer_activation_bytes`; full: the checkpointed layer input).
  * head: jobctl's "logits and loss" term is a PEAK figure (16-bit logits + fp32
    log-probs + two fp32 gradients: 14 B per logit element in bf16, 16 B in fp32).  What
    autograd SAVES is only the fp32 log-softmax (4 B per logit element) plus the final
    norm / output-layer input and the targets.  The table compares the log-softmax bytes
    with the 4 B/element part of jobctl's term, and prints the peak figure and the rest of
    the head separately (labelled "not compared" / "not modelled").

CUDA mode (`--cuda`): larger tiny models on the GPU, a few real training steps
(forward, backward, optimizer step); torch.cuda.max_memory_allocated() vs jobctl's total
minus the non-tensor terms (cuda context, nccl buffers, the allocator's).  Exits 2
without CUDA.

Usage:
  python benchmarks/memory_accuracy.py            # CPU table
  python benchmarks/memory_accuracy.py --json     # the same rows as JSON
  python benchmarks/memory_accuracy.py --detail   # + jobctl's per-layer terms and the
                                                  #   measured tensors of layer 0
  python benchmarks/memory_accuracy.py --cuda     # GPU peak vs jobctl (needs CUDA)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import sys
import time

import torch
import torch.nn.functional as F

from jobctl.planner.memory import (
    GIB,
    Workload,
    estimate,
    layer_activation_terms,
    stored_layer_bytes,
)
from jobctl.planner.models import ModelSpec
from jobctl.planner.plan import Plan
from jobctl_measure import torch_reference as tr

# --------------------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------------------

# name -> (torch_reference cfg, jobctl framework, jobctl attention)
#   framework "generic" = eager PyTorch/HF layers; "torchtitan" = fused kernels.
#   ("megatron" is fused too, but pads the vocabulary to a multiple of 128, which the
#   reference model does not do; torchtitan is used so the vocabularies agree.)
_LLAMA = dict(family="llama", layers=2, hidden=256, ffn_hidden=688, heads=8, kv_heads=2, vocab=1000)
_GPT = dict(family="gpt", layers=2, hidden=256, ffn_hidden=1024, heads=8, vocab=1000, max_seq_len=512)

CPU_ACT_CONFIGS = {
    "llama-eager": (dict(_LLAMA, impl="eager", attention="sdpa"), "generic", "sdpa"),
    "llama-fused": (dict(_LLAMA, impl="fused", attention="sdpa"), "torchtitan", "sdpa"),
    "llama-eager-attn": (dict(_LLAMA, impl="eager", attention="eager"), "generic", "eager"),
    "gpt-eager-p0.1": (dict(_GPT, dropout=0.1, attention="eager"), "generic", "eager"),
    "gpt-sdpa-p0": (dict(_GPT, dropout=0.0, attention="sdpa"), "generic", "sdpa"),
}

# model states do not depend on impl/attention: one untied llama, one tied llama, one gpt
# (tied, learned positions, biases).
CPU_STATE_CONFIGS = {
    "llama": dict(_LLAMA),
    "llama-tied": dict(_LLAMA, tied_embeddings=True),
    "gpt": dict(_GPT, dropout=0.1),
}

OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "adafactor")
DTYPES = {"fp32": (torch.float32, "fp32"), "bf16": (torch.bfloat16, "bf16-pure")}  # -> jobctl precision
RECOMPUTE = ("none", "full")

ACT_TOL = 0.10  # activations: within 10% is "ok"; states must be exact


def model_spec(cfg: dict, name: str) -> ModelSpec:
    c = tr.resolve_config(cfg)  # torch_reference's defaults (tied, ffn, kv_heads, max_seq_len...)
    return ModelSpec(
        name=name, family=c["family"], layers=c["layers"], hidden=c["hidden"], ffn_hidden=c["ffn_hidden"],
        heads=c["heads"], kv_heads=c["kv_heads"], vocab=c["vocab"], tied_embeddings=c["tied_embeddings"],
        max_seq_len=c["max_seq_len"] if c["family"] == "gpt" else 0,  # llama: RoPE, no parameters
        dropout=c["dropout"],
    )


def single_gpu_plan(b: int, recompute: str) -> Plan:
    return Plan(nodes=1, gpus_per_node=1, tp=1, pp=1, dp=1, cp=1, sharding="none", micro_batch_size=b,
                grad_accum_steps=1, global_batch_size=b, recompute=recompute, offload="none",
                sequence_parallel=False)


def workload(spec, seq, b, optimizer, precision, framework, attention) -> Workload:
    return Workload(model=spec, seq_len=seq, global_batch_size=b, optimizer=optimizer, precision=precision,
                    attention=attention, framework=framework)


def term_bytes(bd, name: str) -> float:
    return sum(t.bytes for t in bd.terms if t.name == name)


# --------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------

def _row(section, config, term, predicted, measured, kind, note=""):
    """kind: 'state' (exact), 'act' (10%), 'info' (printed, not compared)."""
    err = None
    if predicted is not None and measured is not None and measured != 0:
        err = 100.0 * (predicted - measured) / measured
    if kind == "info" or predicted is None or measured is None:
        status = "-"
    elif predicted == measured:
        status = "exact"
    elif kind == "state":
        status = "DIFF"
    elif measured and abs(predicted - measured) / measured <= ACT_TOL:
        status = "ok"
    else:
        status = "DIFF"
    return {"section": section, "config": config, "term": term,
            "predicted": None if predicted is None else int(round(predicted)),
            "measured": None if measured is None else int(measured),
            "error_pct": None if err is None else round(err, 3), "status": status, "note": note}


def state_rows():
    rows = []
    for cname, cfg in CPU_STATE_CONFIGS.items():
        spec = model_spec(cfg, cname)
        for opt in OPTIMIZERS:
            for dname, (dt, precision) in DTYPES.items():
                m = tr.state_bytes(cfg, opt, dt)
                w = workload(spec, 8, 1, opt, precision, "generic", "sdpa")
                bd = estimate(w, 80 * GIB, single_gpu_plan(1, "none"))
                label = f"{cname} {opt} {dname}"
                if spec.params() != m["params"]:
                    rows.append(_row("states", label, "parameter count", spec.params(), m["params"], "state"))
                rows.append(_row("states", label, "weights", term_bytes(bd, "weights"), m["param_bytes"], "state"))
                rows.append(_row("states", label, "gradients", term_bytes(bd, "gradients"), m["grad_bytes"], "state"))
                rows.append(_row("states", label, "optimizer states", term_bytes(bd, "optimizer states"),
                                 m["optimizer_bytes"], "state"))
                if m["optimizer_step_bytes"]:
                    rows.append(_row("states", label, "optimizer step counters", 0, m["optimizer_step_bytes"], "info",
                                     "0-dim fp32 'step' tensors, 4 B per parameter tensor; not modelled "
                                     "(on CUDA they stay on the CPU unless fused/capturable)"))
    return rows


def _logsoftmax_bytes(res) -> int:
    n = 0
    for t in res["tensors"]:
        if t["region"] == "head" and any("LogSoftmaxBackward" in o for _, _, owners in t["saved"] for o in owners):
            n += t["nbytes"]
    return n


def activation_rows(seq, batch, detail=False):
    rows, details = [], []
    for cname, (cfg, framework, attention) in CPU_ACT_CONFIGS.items():
        spec = model_spec(cfg, cname)
        c = tr.resolve_config(cfg)
        for dname, (dt, precision) in DTYPES.items():
            head_seen = None
            for rc in RECOMPUTE:
                res = tr.saved_activation_bytes(cfg, seq, batch, dtype=dt, recompute=rc)
                w = workload(spec, seq, batch, "adamw", precision, framework, attention)
                plan = single_gpu_plan(batch, rc)
                bd = estimate(w, 80 * GIB, plan)
                label = f"{cname} {dname} rc={rc}"
                per_layer = stored_layer_bytes(w, plan, batch)
                meas = res["per_layer"]
                if len(set(meas)) == 1:
                    rows.append(_row("activations", label, f"per layer saved (each of {len(meas)})",
                                     per_layer, meas[0], "act"))
                else:
                    for i, m in enumerate(meas):
                        rows.append(_row("activations", label, f"layer {i} saved", per_layer, m, "act"))
                emb_pred = term_bytes(bd, "embedding dropout mask")
                elems = seq * batch * c["vocab"]
                lsm = _logsoftmax_bytes(res)
                saved_pred = (term_bytes(bd, "layer activations") + emb_pred
                              + term_bytes(bd, "final norm and output input") + 4 * elems)
                rows.append(_row("total", label, "all saved tensors", saved_pred, res["total"], "act",
                                 "jobctl: layer activations + embedding dropout mask + final norm and output "
                                 "input + 4·sbV log-probs; measured also has token ids and targets (8·sb each)"))
                # embedding and head do not depend on the recompute policy: print them once,
                # and again only if they differ.
                head = (res["embedding"], res["head"], lsm)
                if head == head_seen:
                    continue
                head_seen = head
                hlabel = f"{cname} {dname}" + (f" rc={rc}" if rc != "none" else "")
                rows.append(_row("head", hlabel, "embedding saved", emb_pred, res["embedding"], "info",
                                 "measured: int64 token ids (8·sb, not modelled); jobctl: gpt embedding "
                                 "dropout mask (sbh) - the reference GPT has no embedding dropout"))
                rows.append(_row("head", hlabel, "fp32 log-softmax saved", 4 * elems, lsm, "act",
                                 "compared: the 4 B/elem log-probs part of jobctl's 'logits and loss'"))
                rows.append(_row("head", hlabel, "final norm + lm_head input + targets saved", 0,
                                 res["head"] - lsm, "info", "not modelled by jobctl"))
                peak = term_bytes(bd, "logits and loss")
                rows.append(_row("head", hlabel, "jobctl 'logits and loss' PEAK vs all head SAVED", peak,
                                 res["head"], "info",
                                 f"PEAK {peak / elems:g} B/elem (jobctl) vs SAVED {res['head'] / elems:.3f} "
                                 "B/elem (measured): a peak is not comparable with saved bytes"))
                if detail:
                    lines = [f"== {label}  (s={seq} b={batch}, sbh={res['sbh']})",
                             "  jobctl layer_activation_terms (no recompute):"]
                    for n_, v, f in layer_activation_terms(w, plan, batch):
                        lines.append(f"    {int(v):>10d} B  {v / res['sbh']:7.3f}*sbh  {n_}: {f}")
                    lines.append("  measured layer 0:")
                    lines.append(tr.format_layer(res, 0))
                    details.append("\n".join(lines))
    return rows, details


# --------------------------------------------------------------------------------------
# CUDA mode
# --------------------------------------------------------------------------------------

_LLAMA_GPU = dict(family="llama", layers=4, hidden=1024, ffn_hidden=2816, heads=16, kv_heads=4, vocab=32000)
_GPT_GPU = dict(family="gpt", layers=4, hidden=1024, ffn_hidden=4096, heads=16, vocab=32000)


_DEVICE = "cuda"  # a module constant so that the CUDA code path can be smoke-tested elsewhere


def cuda_configs(seq):
    llama = dict(_LLAMA_GPU, max_seq_len=seq)
    gpt = dict(_GPT_GPU, max_seq_len=seq)
    cases = []
    for dname in ("bf16", "fp32"):
        for rc in RECOMPUTE:
            cases += [
                ("llama-eager", dict(llama, impl="eager", attention="sdpa"), "generic", "sdpa", "adamw", dname, rc),
                ("llama-fused", dict(llama, impl="fused", attention="sdpa"), "torchtitan", "sdpa", "adamw", dname, rc),
                ("gpt-eager-p0.1", dict(gpt, dropout=0.1, attention="eager"), "generic", "eager", "adamw", dname, rc),
                ("gpt-sdpa-p0", dict(gpt, dropout=0.0, attention="sdpa"), "generic", "sdpa", "adamw", dname, rc),
            ]
    for opt in ("sgd-momentum", "adafactor"):
        cases.append(("llama-eager", dict(llama, impl="eager", attention="sdpa"), "generic", "sdpa", opt, "bf16", "none"))
    return cases


def cuda_rows(seq, batch, steps, keep_grads):
    """A few real training steps per configuration on the GPU.

    Measured (all relative to memory_allocated() before the model exists):
      weights    memory_allocated after model.to(cuda), minus the model's buffers
      persistent memory_allocated after opt.step(): weights + grads + optimizer states
                 (minus buffers, token ids and targets)
      transient  peak of forward+backward minus memory_allocated just before the forward:
                 activations + logits/loss (+ gradients when they are freed between steps)
      peak       torch.cuda.max_memory_allocated() over the steps (forward, backward, step)
    Predicted: jobctl's terms; "tensors" = total - overheads (cuda context, nccl, allocator).
    """
    dev = torch.device(_DEVICE)
    rows = []
    for cname, cfg, framework, attention, opt_name, dname, rc in cuda_configs(seq):
        dt, precision = DTYPES[dname]
        label = f"{cname} {opt_name} {dname} rc={rc}"
        spec = model_spec(cfg, cname)
        w = workload(spec, seq, batch, opt_name, precision, framework, attention)
        bd = estimate(w, 80 * GIB, single_gpu_plan(batch, rc))
        pred_tensors = bd.tensor_bytes
        pred_persist = bd.weights_bytes + bd.grads_bytes + bd.optimizer_bytes
        pred_transient = bd.activations_bytes + bd.logits_bytes + bd.buffers_bytes
        if not keep_grads:
            pred_transient += bd.grads_bytes

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = tr.build_model(cfg).to(device=dev, dtype=dt)
        model.train()
        if rc == "full":
            model.layers = torch.nn.ModuleList([tr.Checkpointed(l) for l in model.layers])
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        torch.cuda.synchronize()
        m_weights = torch.cuda.memory_allocated() - base - buffers
        params = list(model.parameters())
        opt = tr.make_optimizer(opt_name, params, 1e-4)
        V = cfg["vocab"]
        ids = torch.randint(0, V, (batch, seq), device=dev)
        tgt = torch.randint(0, V, (batch, seq), device=dev)
        inputs = 2 * ids.numel() * ids.element_size()
        fb_peak = opt_peak = transient = persist = 0
        t0 = time.perf_counter()
        for step in range(steps):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            # logits are not kept by a Python name: as in a training loop, only autograd holds them
            loss = F.cross_entropy(model(ids).float().reshape(-1, V), tgt.reshape(-1))
            loss.backward()
            del loss
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            fb_peak = max(fb_peak, peak)
            if step > 0:  # step 0 has no optimizer states yet
                transient = max(transient, peak - before)
            torch.cuda.reset_peak_memory_stats()
            opt.step()
            torch.cuda.synchronize()
            opt_peak = max(opt_peak, torch.cuda.max_memory_allocated() - base)
            persist = torch.cuda.memory_allocated() - base - buffers - inputs
            opt.zero_grad(set_to_none=not keep_grads)
        secs = time.perf_counter() - t0
        peak = max(fb_peak, opt_peak)
        rows.append(_row("cuda", label, "weights", bd.weights_bytes, m_weights, "state",
                         "memory_allocated after model.to(cuda) minus model buffers"))
        rows.append(_row("cuda", label, "weights+grads+optimizer", pred_persist, persist, "act",
                         "memory_allocated after opt.step() minus buffers, ids, targets "
                         "(the allocator rounds each block up to 512 B)"))
        rows.append(_row("cuda", label, "transient fwd+bwd", pred_transient, transient, "act",
                         "fwd+bwd peak minus memory_allocated before the forward; predicted: activations "
                         "+ logits and loss (+ gradients when freed between steps)"))
        rows.append(_row("cuda", label, "optimizer-step peak", pred_tensors, opt_peak, "info",
                         "peak inside opt.step() (foreach temporaries); not modelled separately"))
        rows.append(_row("cuda", label, "max_memory_allocated", pred_tensors, peak, "act",
                         "predicted: total less the overheads (cuda context, nccl, allocator); "
                         "model buffers (RoPE tables, masks; not modelled) are included in measured"))
        rows[-1]["seconds"] = round(secs, 2)
        rows[-1]["buffers"] = buffers
        del model, opt, params, ids, tgt
    gc.collect()
    torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------

def _fmt(v):
    return "-" if v is None else f"{v:,}"


def print_table(rows, out=sys.stdout):
    headers = ("config", "term", "predicted B", "measured B", "err %", "status")
    order = ("states", "activations", "head", "total", "cuda")
    sections = sorted({r["section"] for r in rows}, key=lambda x: order.index(x) if x in order else len(order))
    notes = {}
    for sec in sections:
        body = []
        for r in (r for r in rows if r["section"] == sec):
            mark = ""
            if r["note"]:
                mark = notes.setdefault(r["note"], f"[{len(notes) + 1}]")
            err = "-" if r["error_pct"] is None or r["status"] == "-" else f"{r['error_pct']:+.2f}"
            body.append((r["config"], r["term"] + (" " + mark if mark else ""), _fmt(r["predicted"]),
                         _fmt(r["measured"]), err, r["status"]))
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
        line = "  ".join
        print(f"\n## {sec}", file=out)
        print(line(h.ljust(wd) if i < 2 else h.rjust(wd) for i, (h, wd) in enumerate(zip(headers, widths))), file=out)
        print(line("-" * wd for wd in widths), file=out)
        for b in body:
            print(line(x.ljust(wd) if i < 2 else x.rjust(wd) for i, (x, wd) in enumerate(zip(b, widths))), file=out)
    if notes:
        print("\nnotes:", file=out)
        for text, mark in notes.items():
            print(f"  {mark} {text}", file=out)


def summary(rows):
    compared = [r for r in rows if r["status"] in ("exact", "ok", "DIFF")]
    return {"compared": len(compared), "exact": sum(r["status"] == "exact" for r in compared),
            "ok": sum(r["status"] == "ok" for r in compared), "diff": sum(r["status"] == "DIFF" for r in compared)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print rows as JSON instead of the table")
    ap.add_argument("--cuda", action="store_true", help="GPU mode: max_memory_allocated vs jobctl (needs CUDA)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (CPU 128, CUDA 1024)")
    ap.add_argument("--batch", type=int, default=None, help="micro-batch (CPU 2, CUDA 2)")
    ap.add_argument("--steps", type=int, default=3, help="CUDA: training steps per config")
    ap.add_argument("--free-grads", action="store_true",
                    help="CUDA: zero_grad(set_to_none=True) (PyTorch's default); by default gradients are "
                         "zeroed in place and stay allocated, as jobctl's sum of terms assumes")
    ap.add_argument("--detail", action="store_true", help="CPU: jobctl per-layer terms + measured layer 0 tensors")
    ap.add_argument("--threads", type=int, default=4, help="torch CPU threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    meta = {"date": _dt.date.today().isoformat(), "torch": torch.__version__, "python": sys.version.split()[0]}
    t0 = time.perf_counter()
    details = []
    if args.cuda:
        if not torch.cuda.is_available():
            print("memory_accuracy: --cuda needs a CUDA device, and torch.cuda.is_available() is False "
                  f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}). "
                  "Run without --cuda for the CPU comparison.", file=sys.stderr)
            return 2
        seq, batch = args.seq or 1024, args.batch or 2
        meta.update(mode="cuda", device=torch.cuda.get_device_name(), seq=seq, batch=batch, steps=args.steps,
                    keep_grads=not args.free_grads)
        rows = cuda_rows(seq, batch, args.steps, not args.free_grads)
    else:
        seq, batch = args.seq or 128, args.batch or 2
        meta.update(mode="cpu", seq=seq, batch=batch)
        rows = state_rows()
        act, details = activation_rows(seq, batch, args.detail)
        rows += act
    meta["seconds"] = round(time.perf_counter() - t0, 2)
    meta["summary"] = summary(rows)
    if args.json:
        json.dump({"meta": meta, "rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"# jobctl memory model vs PyTorch ({meta['mode']})  date {meta['date']}  torch {meta['torch']}  "
          f"python {meta['python']}" + (f"  device {meta['device']}" if args.cuda else ""))
    print(f"# s={seq} b={batch}; status: exact | ok (activations within {ACT_TOL:.0%}) | DIFF | - (not compared)")
    print_table(rows)
    for d in details:
        print("\n" + d)
    s = meta["summary"]
    print(f"\n{s['compared']} compared: {s['exact']} exact, {s['ok']} within {ACT_TOL:.0%}, {s['diff']} DIFF; "
          f"{meta['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
