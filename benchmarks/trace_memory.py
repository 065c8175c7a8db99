#!/usr/bin/env python
"""Traced (FakeTensorMode + FSDPMemTracker) vs modelled (jobctl.planner.memory) GPU memory
of torchtitan's own Llama 3 8B / 70B / 405B, FSDP2 (x TP) over N fake ranks, one training
step, no GPU.

What it does, per layout:
  1. builds torchtitan's Llama3Model from its own "8B" config
     (torchtitan/models/llama3/__init__.py: _8b; dim 4096, 32 layers, 32 heads, 8 kv heads,
     vocab 128256, ffn from compute_ffn_hidden_dim(4096, 1024, 1.3) = 14336) under
     torch._subclasses.FakeTensorMode on the CPU device: shapes, dtypes and storages are
     real, no bytes are allocated;
  2. parallelises it with torchtitan's own parallelize_llama
     (torchtitan/models/llama3/parallelize.py), which applies torchtitan's activation
     checkpointing (torchtitan/distributed/activation_checkpoint.py: FullAC / SelectiveAC,
     the op-level SAC) and apply_fsdp_to_decoder (torchtitan/distributed/fsdp.py: per-block
     fully_shard, reshard_after_forward per its "default" policy, MixedPrecisionPolicy
     bf16 params / fp32 reduce) on torchtitan's ParallelDims mesh (world of N ranks over
     torch's fake process group, built outside the fake mode);
  3. builds AdamW as torchtitan's default_adamw does (lr 8e-4, betas 0.9/0.95, eps 1e-8,
     wd 0.1, fused) and runs one untracked warm-up step (so optimizer states exist), then
     one tracked step under torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker:
     forward on token ids [local_batch, seq_len], torchtitan's CrossEntropyLoss (sum,
     divided by the token count, fp32 logits), backward, optimizer.step, zero_grad;
  4. prints, per group (weights, grads, optimizer, FSDP buffers = unsharded params +
     all-gather + unsharded grads + reduce-scatter, activations+logits = the tracker's
     Activation + Temp + Inputs), the tracker's breakdown at the peak and the group's own
     maximum over the step, and jobctl's estimate() for the same layout (framework
     torchtitan, flash attention, zero3 over N ranks) summed by group; diff = (modelled -
     own max) / own max, and for the total (modelled - peak) / peak; rows off by more than
     5 % are flagged "!".  jobctl's terms are each a maximum and it adds them, so a group
     can match while the total is above the traced peak (maxima that never coexist).
     A "per block" row compares the Activation bytes each transformer block still holds
     after its forward (saved for backward + its output; from the tracker's module
     snapshots) with jobctl's stored_layer_bytes().

Run (from the repository root):
  python benchmarks/trace_memory.py                        # default layouts, 32 layers
  python benchmarks/trace_memory.py --layouts b1-none b2-sac
  python benchmarks/trace_memory.py --layers 2 --seq-len 2048   # quick; jobctl gets the
                                                           #   same layer count
  python benchmarks/trace_memory.py --model 70B --tp 8 --ranks 256 --layouts b16-full
  python benchmarks/trace_memory.py --model 405B --tp 8 --pp 8 --ranks 512 --layouts b32-full
  python benchmarks/trace_memory.py --pp 4 --stage last --layouts b8-none   # 8B, last stage
  python benchmarks/trace_memory.py --json                 # raw numbers (bytes)
  python benchmarks/trace_memory.py --allocator --layouts b2-sac   # reserved memory (below)
Layouts are b<local batch>-<none|full|sac>; --ranks (default 8) is the world size, FSDP
degree x --tp x --pp.  With --tp > 1 torchtitan's own TP plan is applied (its models' parallelize:
column/row-wise linears, sequence parallel norms, loss parallel); see _patch_for_tp for the
two stand-ins it needs.  With --pp > 1 it traces one rank of one pipeline stage (--stage first,
the default, or last) as torchtitan's Trainer builds it: pipeline_llm splits the model with
torchtitan's default split, parallelize_llama wraps the stage (FSDP2 with reshard_after_forward
False under PP), and torch's 1F1B schedule (or, with --schedule Interleaved1F1B, the interleaved one over
torchtitan's default two model chunks per rank) runs the local batch as micro-batches of one sample.
The other stages exist only through the fake process group's send/recv (shaped buffers, no
data); _patch_for_pp stands in for the metadata they would exchange at the first step.  The
tracker then also files FSDP2's fp32 accumulated unsharded gradients as unsharded grads and the
post-schedule reduction's tensors as reduce-scatter buffers (see _tracker_class).
With --model 30B-A3B or 671B it builds torchtitan's own Qwen3 30B-A3B or DeepSeek-V3 671B (MoE
blocks, DeepSeek's MLA, shared expert and dense first blocks) with expert parallelism 1 (the local
dispatcher: the all-to-all's split sizes come from the routing, which fake tensors do not have),
and also compares, term by term, what one MoE block's router, dispatcher, experts, attention and
norms save for backward (_MoeTerms). Two more stand-ins there: the router's gate runs under
autocast(float32), which CPU autocast refuses, so it runs as CUDA's would, on fp32 copies
(_patch_router_for_cuda_autocast); MLA's 192-wide queries and keys against 128-wide values send
CPU SDPA to its math path (a x s x s fp32 probabilities), so a stand-in keeps what
FlexAttention keeps on CUDA (_patch_attention_for_mla).
The step is the 0.3.0 trainer's: the registry configs' chunked loss (--loss auto: chunked
without PP) and, under its default CUDA graphs, gradients zeroed in place rather than freed
(--cuda-graphs auto: on without PP); --loss ce --cuda-graphs off traces its earlier loop.
Needs torch (a CPU build is enough) and torchtitan; both are imported only here.

What it cannot see, and the workarounds it needs:
  * CPU kernels, not CUDA's.  Fake CUDA tensors crash on a CPU build, so everything is
    traced on the CPU device.  torchtitan's language models use FlexAttention (compiled);
    that cannot run under fake tensors here, so each block's inner attention is swapped
    for torchtitan's own ScaledDotProductAttention (causal, no document mask), which on
    CPU dispatches to aten._scaled_dot_product_flash_attention_for_cpu.  That kernel
    keeps the same tensors for backward as CUDA flash attention (q, k, v, out, fp32 logsumexp;
    CUDA adds two scalar rng tensors).  The table prints the kernel seen and its outputs.
    For op-level SAC, torchtitan's save list names the CUDA flash op; the CPU flash op is
    added to it so SAC saves attention on CPU as it does on CUDA.
  * RMSNorm: on CUDA F.rms_norm runs the fused kernel, whose backward keeps the 16-bit
    input and an fp32 rstd; on CPU it runs the composite and keeps two fp32 copies of the
    input per norm (+0.4 GiB per 8B block at seq 8192).  By default torchtitan's RMSNorm
    forward is replaced with an autograd.Function that computes the same output and keeps
    CUDA's set; --cpu-rmsnorm keeps CPU's behaviour.
  * No CUDA context, NCCL buffers, allocator caching or fragmentation: jobctl's
    "overhead" terms are printed but not compared; the comparison is of tensor bytes
    (--allocator compares the allocator's share).
  * The process group is torch's fake one (torch.testing._internal.distributed.fake_pg):
    collectives are shaped but move nothing, so all-gather / reduce-scatter buffers are
    those FSDP2 allocates on one rank.
  * spmd_backend "partial_dtensor": torchtitan 0.3.0's default "spmd_types" backend fails
    in fully_shard with torch 2.13 ("When dp_mesh_dims is provided, all parameters must
    be DTensors on the full SPMD mesh"), so the legacy backend is used; with tp = cp = 1
    both apply the same per-block FSDP2 wrapping and mixed-precision policy.
  * DTensor sharding propagation runs its ops under the ambient fake mode, which the
    tracker then counts (global-shape optimizer temporaries, ~10x the real states); the
    script gives that propagation its own FakeTensorMode so only local ops are tracked.
  * torchtitan's device_type falls back to "cuda" without a GPU; the mesh is built on
    "cpu" instead.  Weight init is skipped (values do not exist under fake tensors).
    Gradient clipping, the data loader and the loss all-reduce are not run.

--allocator records, instead of the tracker's categories, every allocation and free of the build
and --steps training steps (jobctl_measure.alloc_recorder.AllocRecorder: the storage, its bytes,
the stream it was made on) and replays them through jobctl_measure.caching_allocator, a model of
PyTorch's CUDA caching allocator: max reserved bytes with and without expandable segments, what
each stream holds when reserved memory peaks, and jobctl's allocator view of the same layout (its
total less CUDA context and NCCL buffers).

--impl hf traces transformers' LlamaForCausalLM (built from Llama 3.1's config.json dimensions,
no weights) wrapped as HF accelerate's FSDP2 plugin wraps it (_build_hf says from where), against
jobctl's `fsdp` framework: FSDP only, AC none or full.  One stand-in: under fake tensors
transformers cannot read position ids, keeps a packed-sequence mask and so materialises an
[s, s] mask and repeat_kv copies per layer; find_packed_sequence_indices is made to answer
what it answers on real data (one sequence per row: no mask, SDPA's is_causal with GQA).

Mirrors: torchtitan/trainer.py (Trainer.__init__: update_from_config, parallelize_fn,
to_empty; _forward_backward_body), torchtitan/models/llama3/{__init__,parallelize}.py,
torchtitan/distributed/{parallel_dims,fsdp,activation_checkpoint}.py,
torchtitan/components/{loss.py,optimizer/optimizer.py},
torch/distributed/_tools/fsdp2_mem_tracker.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import re
import sys
import time

GIB = 1 << 30
TOL = 0.05
DEFAULT_LAYOUTS = ("b1-none", "b1-full", "b1-sac")
MODELS = ("8B", "70B", "405B", "30B-A3B", "671B")  # torchtitan's llama3_configs, qwen3_configs, deepseekv3_configs
PRESET_OF = {"8B": "llama3.1-8b", "70B": "llama3.1-70b", "405B": "llama3.1-405b", "30B-A3B": "qwen3-30b-a3b",
             "671B": "deepseek-v3"}
# torchtitan's MoE models: Qwen3Model (models/qwen3/__init__.py _30b_a3b) and DeepSeekV3Model
# (models/deepseek_v3/__init__.py _671b: MLA, a shared expert, 3 dense blocks first, no MTP)
MOE_MODELS = ("30B-A3B", "671B")
# jobctl's terms of one MoE block, each what torchtitan's block saves for backward (_MoeTerms);
# those of the routed part are averaged over the layers by jobctl (x moe_layers / layers)
MOE_TERMS = ("router", "routed tokens", "expert intermediates", "shared expert intermediates", "mlp input")
ROUTED_TERMS = ("router", "routed tokens", "expert intermediates", "shared expert intermediates")
AC_NAMES = {"none": "none", "full": "full", "sac": "selective"}

# tracker category -> comparison group (jobctl's group names)
GROUP_OF = {
    "Sharded Param": "weights",
    "Sharded Grad": "grads",
    "OptState": "optimizer",
    "Unsharded Param": "buffers",
    "All Gather": "buffers",
    "Unsharded Grad": "buffers",
    "Reduce Scatter": "buffers",
    "Activation": "activations+logits",
    "Temp": "activations+logits",
    "Inputs": "activations+logits",
    "Buffer": "module buffers",
}
# jobctl's overhead terms that the caching allocator does not see (so not in max_memory_reserved)
OUTSIDE_ALLOCATOR = ("cuda context", "nccl buffers")
GROUP_ORDER = ("weights", "grads", "optimizer", "buffers", "activations+logits", "module buffers")


def parse_layout(name: str) -> tuple[int, str]:
    try:
        b, ac = name.split("-")
        if not b.startswith("b") or ac not in AC_NAMES:
            raise ValueError
        return int(b[1:]), ac
    except ValueError:
        raise SystemExit(f"bad layout {name!r}: expected b<local batch>-<none|full|sac>")


# --------------------------------------------------------------------------------------
# the trace


class _Env:
    """Process-wide set-up, once: fake process group, torchtitan mesh, patches."""

    def __init__(self, ranks: int, backend: str, cuda_rmsnorm: bool = True, tp: int = 1, pp: int = 1,
                 stage: str = "first", schedule: str = "1F1B"):
        import torch
        import torch.distributed as dist
        import torch.distributed.tensor._sharding_prop as sharding_prop
        import torchtitan.distributed.activation_checkpoint as tt_ac
        import torchtitan.distributed.parallel_dims as tt_pd
        import torchtitan.distributed.utils as tt_dist_utils
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.testing._internal.distributed.fake_pg import FakeStore

        # DTensor's sharding propagation: its own fake mode, so the tracker skips it
        # (it counts ops run under the fake mode that was active when it was entered).
        prop_mode = FakeTensorMode()
        sharding_prop.detect_fake_mode = lambda *a, **k: prop_mode
        # torchtitan picks "cuda" when no accelerator is found; this is a CPU trace.
        tt_pd.device_type = "cpu"
        # op-level SAC: save the CPU flash-attention op as torchtitan saves CUDA's.
        orig_save_ops = tt_ac._get_default_save_ops

        def save_ops():
            ops = orig_save_ops()
            ops.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
            return ops

        tt_ac._get_default_save_ops = save_ops
        if tp > 1:
            _patch_for_tp()
        if pp > 1:
            _patch_for_pp()
        if cuda_rmsnorm:
            from torchtitan.models.common.nn_modules import RMSNorm
            RMSNorm.forward = _cuda_like_rms_norm()

        # torchtitan's meshes put "pp" outermost (parallel_dims.py), so global rank
        # k * ranks / pp is the first rank of stage k (middle: the second stage)
        rank = {"first": 0, "middle": 1, "last": pp - 1}[stage] * (ranks // pp)
        if not dist.is_initialized():
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
        tt_dist_utils.set_spmd_backend(backend)
        self.parallel_dims = tt_pd.ParallelDims(
            dp_replicate=1, dp_shard=-1, cp=1, tp=tp, pp=pp, ep=1, world_size=ranks, spmd_backend=backend)
        self.parallel_dims.build_mesh()  # outside any fake mode
        self.backend = backend
        self.ranks = ranks
        self.tp = tp
        self.pp = pp
        self.stage = stage
        self.schedule = schedule


def _patch_for_tp():
    """Two stand-ins that tensor parallelism needs under fake tensors on the CPU.

    * FSDP2 over a TP-sharded parameter concatenates the dp and tp meshes
      (_fsdp_param.py _init_sharding_spec_tp -> DeviceMesh._concatenate), which builds the
      rank tensor under the ambient fake mode and fails; it is built outside it here.
    * DTensor has a sharding rule for CUDA's flash-attention op but none for the CPU one
      that stands in for it; q, k, v arrive head-sharded (torchtitan's TP plan), so the
      attention runs on the local shards and its output is wrapped back with the same
      placements: the kernel keeps for backward what it keeps on one TP rank on CUDA."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torchtitan.models.common.attention import ScaledDotProductAttention

    concatenate = DeviceMesh._concatenate

    def concatenate_outside_fake(meshes):
        with unset_fake_temporarily():
            return concatenate(meshes)

    DeviceMesh._concatenate = staticmethod(concatenate_outside_fake)
    attend = ScaledDotProductAttention.forward

    def attend_locally(self, q, k, v, **kw):
        if isinstance(q, DTensor):
            out = attend(self, q.to_local(), k.to_local(), v.to_local(), **kw)
            return DTensor.from_local(out, q.device_mesh, q.placements, run_check=False)
        return attend(self, q, k, v, **kw)

    ScaledDotProductAttention.forward = attend_locally


def _patch_for_pp():
    """Stand-ins for the other pipeline ranks, which one process on a fake process group has not.

    torch's PipelineStage (distributed/pipelining/stage.py) learns its neighbours' tensors at
    the first step: a vote over the stages (``_warmup_p2p``, which reads the received result
    with ``.item()``) and then the stages' input/output metadata sent as pickled objects
    (``_send_meta`` / ``_recv_meta``).  Over the fake process group nothing is received, so
    * the vote's outcome is set to what the real vote gives for torchtitan's stages, which
      are built without example inputs: DYNAMIC (metadata inferred at the first step);
    * metadata sent is dropped, and metadata received is what the neighbour would send: from
      the next stage, the gradients of this stage's outputs (same shapes and dtypes as the
      outputs); from the previous stage, its output, the hidden state [micro-batch, seq, dim]
      in the activation dtype (under TP the DTensor torchtitan's blocks exchange: sharded by
      sequence over the tp mesh, Shard(1)).
    The activations and gradients themselves go through the fake process group's send/recv:
    the receive buffers are allocated as on a GPU and hold nothing."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.pipelining import schedules, stage
    from torch.distributed.tensor import DTensor, Shard

    def warmup_p2p(self, stages, has_backward, p2p_done):
        for st in stages:
            st._inference_mode = stage.InferenceMode.DYNAMIC

    def send_meta(self, meta, dst_stage):
        pass

    def recv_meta(self, src_stage):
        if src_stage == self.stage_index + 1:
            return stage._StageBackwardMeta(backward_metas=self._stage_meta.outputs)
        shape, dtype, tp_mesh = self._trace_hidden_meta  # set by _build_torchtitan_pp
        with unset_fake_temporarily():
            hidden = torch.empty(shape, dtype=dtype, device="meta")
            if tp_mesh is not None:  # under TP the stages exchange sequence-sharded DTensors
                hidden = DTensor.from_local(hidden, tp_mesh, [Shard(1)], run_check=False)
            meta = stage.extract_tensor_meta(hidden)
        return stage._StageForwardMeta(forward_metas=(meta,))

    schedules._PipelineSchedule._warmup_p2p = warmup_p2p
    stage.PipelineStage._send_meta = send_meta
    stage.PipelineStage._recv_meta = recv_meta


def _cuda_like_rms_norm():
    """RMSNorm that keeps, for backward, what CUDA's fused kernel keeps.

    On CUDA, F.rms_norm dispatches to aten._fused_rms_norm, whose backward keeps the
    16-bit input, the weight and the fp32 rstd ([..., 1]).  On CPU, F.rms_norm runs the
    composite (x.float(), pow, mean, rsqrt, mul, ...) and autograd keeps two fp32 copies of
    the input per norm, 4x the 16-bit input: a CPU artefact of ~0.4 GiB per Llama 8B block
    at seq 8192.  This Function computes the same output and keeps CUDA's set."""
    import torch

    class CudaLikeRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            xf = x.float()
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            y = (xf * rstd).to(x.dtype)
            if weight is not None:
                y = y * weight
            ctx.save_for_backward(x, weight, rstd)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, weight, rstd = ctx.saved_tensors
            xf = x.float()
            xhat = xf * rstd
            g = gy.float() * weight.float() if weight is not None else gy.float()
            gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
            gw = (gy.float() * xhat).sum(tuple(range(gy.dim() - 1))).to(weight.dtype) if weight is not None else None
            return gx.to(x.dtype), gw, None

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return CudaLikeRMSNorm.apply(x, self.weight, eps)

    return forward


def _tracker_class():
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class Tracker(FSDPMemTracker):
        """FSDPMemTracker that also keeps each category's own maximum and where the peak was."""

        def __init__(self, mod, *a, **k):
            import torch
            # several model chunks on one rank (interleaved PP): FSDPMemTracker takes one FSDP
            # root; it instruments every FSDP module under _root_mod, so it is given all chunks
            chunks = list(mod) if isinstance(mod, torch.nn.ModuleList) else [mod]
            super().__init__(chunks[0], *a, **k)
            self._root_mod = mod
            self.cat_max: dict[str, int] = {}
            self.group_max: dict[str, int] = {}
            self.group_max_where: dict[str, str] = {}
            self.cat_max_where: dict[str, str] = {}
            self.peak_where = ""
            self._pp_reducing = False

        def __enter__(self):
            # Under PP, FSDP2 accumulates unsharded gradients between micro-batches, upcast
            # to the reduce dtype (_fsdp_param.py to_accumulated_grad_if_needed); the tracker
            # does not know that tensor and would count it as Temp: it is an unsharded grad.
            from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
            from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

            tracker, orig = self, FSDPParam.to_accumulated_grad_if_needed
            self._orig_to_accumulated = orig

            def to_accumulated(param):
                orig(param)
                if param.unsharded_accumulated_grad is not None:
                    tracker._update_and_maybe_create_winfos(param.unsharded_accumulated_grad,
                                                            _FSDPRefType.UNSHARDED_GRAD)

            FSDPParam.to_accumulated_grad_if_needed = to_accumulated
            # ... and reduces them after the schedule (PipelineStage.perform_reduce_grad),
            # outside backward, where the tracker would call the reduce-scatter's input and
            # output Activation: they are FSDP's reduce-scatter buffers.
            from torch.distributed.pipelining.stage import _PipelineStageBase
            orig_reduce = self._orig_reduce = _PipelineStageBase.perform_reduce_grad
            def perform_reduce_grad(stage, *a, **k):
                tracker._pp_reducing = True
                try:
                    return orig_reduce(stage, *a, **k)
                finally:
                    tracker._pp_reducing = False

            _PipelineStageBase.perform_reduce_grad = perform_reduce_grad
            return super().__enter__()

        def __exit__(self, *args):
            from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
            from torch.distributed.pipelining.stage import _PipelineStageBase
            FSDPParam.to_accumulated_grad_if_needed = self._orig_to_accumulated
            _PipelineStageBase.perform_reduce_grad = self._orig_reduce
            return super().__exit__(*args)

        def _fsdp_state_pre_forward(self, fsdp_mod, orig):
            # the output layer under torchtitan's ChunkedLossWrapper runs once per chunk at the top
            # level, which FSDPMemTracker refuses ("multiple iterative calls"): its module stats
            # (which nothing here reads) start again at each call
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def pre_forward(*a, **k):
                if getattr(fsdp_mod, "_jobctl_called_per_chunk", False) and not self._mod_tracker.is_bw:
                    self.memory_tracking.pop(fsdp_mod, None)
                return inner(*a, **k)

            return pre_forward

        def _track(self, reftype, t):
            if self._pp_reducing:  # tensors created by the post-schedule reduction
                from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
                reftype = _FSDPRefType.REDUCE_SCATTER
            return super()._track(reftype, t)

        def _where(self):
            mods = [p for p in self._mod_tracker.parents if p != "Global"]
            w = "backward" if self._mod_tracker.is_bw else "optimizer" if self._in_opt else "forward"
            return w + (" in " + max(mods, key=len) if mods else "")

        def _update_peak_stats(self, peak_state):
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            for snap in self._curr_mem_snap.values():
                groups: dict[str, int] = {}
                for k, v in snap.items():
                    k = getattr(k, "value", k)
                    if k in GROUP_OF:
                        groups[GROUP_OF[k]] = groups.get(GROUP_OF[k], 0) + v
                    if v > self.cat_max.get(k, 0):
                        self.cat_max[k] = v
                        self.cat_max_where[k] = self._where()
                for g, v in groups.items():
                    if v > self.group_max.get(g, 0):
                        self.group_max[g] = v
                        self.group_max_where[g] = self._where()
            if self._peak_mem != before:
                self.peak_where = self._where()

    return Tracker


def _patch_router_for_cuda_autocast():
    """torchtitan's router computes its gate under torch.autocast(dtype=float32) (models/common/
    moe.py TokenChoiceTopKRouter.forward). CUDA autocast runs that linear on fp32 copies of its
    input and weight, which autograd keeps; CPU autocast does not support float32 and is
    disabled (a warning), so on CPU the gate would run in bf16 and keep the bf16 input. The gate
    is made to do what CUDA's autocast does: F.linear on fp32 copies."""
    import torch.nn.functional as F
    from torchtitan.models.common import moe as tt_moe

    router = tt_moe.TokenChoiceTopKRouter
    if getattr(router, "_jobctl_fp32_gate", False):
        return
    orig = router.forward

    def forward(self, x, expert_bias=None):
        gate = self.gate
        gate.forward = lambda inp: F.linear(inp.float(), gate.weight.float())
        try:
            return orig(self, x, expert_bias)
        finally:
            del gate.forward  # the class's forward again

    router.forward = forward
    router._jobctl_fp32_gate = True


def _patch_attention_for_mla():
    """MLA's queries and keys are 192 wide and its values 128: CPU's flash kernel needs one width
    and SDPA falls back to the math path, which keeps the a x s x s fp32 probabilities (8 GiB per
    DeepSeek-V3 block at seq 4096). torchtitan runs FlexAttention there on CUDA (models/
    deepseek_v3/__init__.py attn_backend "flex"), whose backward keeps q, k, v, the output and
    the fp32 log-sum-exp, as flash does; this stand-in keeps that set (and makes dq, dk, dv in
    backward), for the attention calls whose widths differ."""
    import torch
    from torchtitan.models.common.attention import ScaledDotProductAttention

    cls = ScaledDotProductAttention
    if getattr(cls, "_jobctl_mla", False):
        return
    orig = cls.forward

    class FlashLike(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # (B, L, N, H) in and out, as torchtitan's inner attention
            out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    def forward(self, q, k, v, **kw):
        if q.shape[-1] == v.shape[-1]:
            return orig(self, q, k, v, **kw)
        return FlashLike.apply(q, k, v)

    cls.forward = forward
    cls._jobctl_mla = True


class _MoeTerms:
    """What one MoE block's submodules keep for backward, by jobctl's term: the router's saved
    tensors ("router"), the routed experts' h-wide tensors and the dispatcher's indices and
    scores ("routed tokens"), the grouped experts' f_e-wide tensors ("expert intermediates"),
    the shared experts' ("mlp input": the norm's output they keep; "shared expert
    intermediates"), the attention's ("attention"), the norms' ("norms"). Saved tensors are seen
    through autograd's saved_tensors_hooks and counted once per storage; parameters and module
    buffers (the RoPE cache) are not activations and are left out. The block traced is the last
    (an MoE one: DeepSeek-V3's first three are dense)."""

    def __init__(self, model):
        from torch.multiprocessing.reductions import StorageWeakRef

        self._ref = StorageWeakRef
        blocks = list(model.layers.values()) if hasattr(model.layers, "values") else list(model.layers)
        blk = blocks[-1]
        self.hidden = blk.moe.routed_experts.inner_experts.w1_EFD.shape[-1]
        self.stack = ["other"]
        self.skip: set = set()
        self.saved: dict = {}
        self.tensors: list = []  # (term, shape, dtype, bytes, submodule): what each term is made of
        labels = {blk.attention_norm: "norms", blk.ffn_norm: "norms", blk.attention: "attention",
                  blk.moe.router: "router", blk.moe.routed_experts: "routed",
                  blk.moe.routed_experts.inner_experts: "experts"}
        if blk.moe.shared_experts is not None:
            labels[blk.moe.shared_experts] = "shared"
        for mod, label in labels.items():
            mod.register_forward_pre_hook(self._enter(label))
            mod.register_forward_hook(self._leave)

    def _enter(self, label):
        def pre(mod, args):
            self.stack.append(label)
            for t in (*mod.parameters(), *mod.buffers()):
                self.skip.add(self._ref(t.untyped_storage()))
        return pre

    def _leave(self, mod, args, out):
        self.stack.pop()

    def _pack(self, t):
        label = self.stack[-1]
        if label != "other":
            ref = self._ref(t.untyped_storage())
            if ref not in self.skip and ref not in self.saved:
                where = label
                if label == "experts":
                    label = "routed tokens" if t.dim() < 2 or t.shape[-1] == self.hidden else "expert intermediates"
                elif label == "routed":
                    label = "routed tokens"
                elif label == "shared":
                    label = "mlp input" if t.shape[-1] == self.hidden else "shared expert intermediates"
                nbytes = t.untyped_storage().nbytes()
                self.saved[ref] = (label, nbytes)
                self.tensors.append((label, list(t.shape), str(t.dtype).replace("torch.", ""), nbytes, where))
        return t

    def __enter__(self):
        import torch
        self.saved.clear()
        self.tensors.clear()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    def totals(self) -> dict:
        out: dict = {}
        for label, nbytes in self.saved.values():
            out[label] = out.get(label, 0) + nbytes
        return out


class _Both:
    """Two context managers as one (the attention probe and the MoE terms around one forward)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __enter__(self):
        self.a.__enter__()
        self.b.__enter__()
        return self

    def __exit__(self, *exc):
        self.b.__exit__(*exc)
        return self.a.__exit__(*exc)


def _attn_probe_class():
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class AttnProbe(TorchDispatchMode):
        """Records which attention kernel ran in forward and the bytes of its outputs."""

        def __init__(self):
            super().__init__()
            self.ops: dict[str, list[int]] = {}  # op -> [calls, output bytes]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(t is DTensor for t in types):
                return NotImplemented
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if "scaled_dot_product" in name or "flash_attention" in name:
                import torch
                nb = sum(t.numel() * t.element_size() for t in
                         (out if isinstance(out, (tuple, list)) else (out,))
                         if isinstance(t, torch.Tensor))
                rec = self.ops.setdefault(name, [0, 0])
                rec[0] += 1
                rec[1] += nb
            return out

    return AttnProbe


def _state(name):
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPModState
    return getattr(_FSDPModState, name)


def _torchtitan_config(env, model_name: str, ac: str, seq_len: int, layers: int, convert=None, **parallelism_kw):
    """torchtitan's ParallelismConfig, its Llama 3 config cut to `layers` blocks (attention swapped
    for its SDPA, RoPE cache at seq_len) and the AC config, as the Trainer sets them up.
    `convert`: a model converter's convert (the Float8 one), applied where the registry applies
    it, before update_from_config sets the sharding configs (a converted Linear's config keeps
    only its sizes)."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    parallelism = ParallelismConfig(spmd_backend=env.backend, **parallelism_kw)
    if model_name == "671B":
        from torchtitan.models.deepseek_v3 import deepseekv3_configs
        cfg = deepseekv3_configs[model_name](attn_backend="flex", moe_comm_backend="standard")
    elif model_name in MOE_MODELS:
        from torchtitan.models.qwen3 import qwen3_configs
        cfg = qwen3_configs[model_name](attn_backend="flex")
    else:
        cfg = llama3_configs[model_name](attn_backend="flex")
    cfg.layers = cfg.layers[:layers]
    if convert is not None:
        cfg = convert(cfg) or cfg
    # Trainer: model_config.update_from_config(config=...) sets the sharding configs
    # (and the RoPE cache length to training.seq_len, done by hand below).
    cfg.update_from_config(config=argparse.Namespace(parallelism=parallelism))
    for lc in cfg.layers:
        lc.attention.inner_attention = ScaledDotProductAttention.Config()
        lc.attention.rope = dataclasses.replace(lc.attention.rope, max_seq_len=seq_len)
    ac_config = {"none": None, "full": FullAC.Config(), "sac": SelectiveAC.Config()}[ac]
    return parallelism, cfg, ac_config


def _build_torchtitan(env, model_name: str, batch: int, ac: str, seq_len: int, layers: int):
    """torchtitan's Llama3Model parallelised by its own parallelize_llama; its loss; AdamW."""
    import torch
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import CompileConfig, TrainingConfig
    from torchtitan.models.llama3 import parallelize_llama
    from torchtitan.models.deepseek_v3.parallelize import parallelize_deepseekv3
    from torchtitan.models.qwen3.parallelize import parallelize_qwen3

    parallelism, cfg, ac_config = _torchtitan_config(env, model_name, ac, seq_len, layers)
    if model_name in MOE_MODELS:
        _patch_router_for_cuda_autocast()
    if model_name == "671B":
        _patch_attention_for_mla()
    with torch.device("meta"):
        model = cfg.build()
    parallelize = {"30B-A3B": parallelize_qwen3, "671B": parallelize_deepseekv3}.get(model_name, parallelize_llama)
    model = parallelize(
        model, parallel_dims=env.parallel_dims, training=TrainingConfig(), parallelism=parallelism,
        compile_config=CompileConfig(), ac_config=ac_config, dump_folder="/tmp")
    model.to_empty(device="cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    if getattr(env, "loss", "ce") == "chunked":
        # every registry config's loss (models/*/config_registry.py: ChunkedLossWrapper over
        # CrossEntropyLoss, 8 chunks), wired as the Trainer wires it: the model stops before the
        # output layer (_skip_lm_head), the wrapper runs it chunk by chunk (trainer.py __init__)
        from torchtitan.components.loss import ChunkedLossWrapper
        chunked = ChunkedLossWrapper(ChunkedLossWrapper.Config())
        chunked.set_lm_head(model.lm_head)
        model._skip_lm_head = True
        model.lm_head._jobctl_called_per_chunk = True
        loss_fn = chunked
    else:
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    labels = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    n_tokens = torch.tensor(float(batch * seq_len))
    # trainer.py train_step: zero_grad(set_to_none=training.disable_cuda_graphs), so under the
    # default CUDA graphs (no PP, no EP) the sharded gradients stay allocated between steps
    set_to_none = not getattr(env, "cuda_graphs", False)

    def step(probe=None):  # torchtitan/trainer.py _forward_backward_body + optimizer step
        if probe is not None:
            with probe:
                pred = model(tokens)
        else:
            pred = model(tokens)
        loss, _ = loss_fn(pred, labels, n_tokens)
        del pred
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    return model, opt, step, (tokens, labels)


def _build_torchtitan_pp(env, model_name: str, batch: int, ac: str, seq_len: int, layers: int):
    """One pipeline rank of torchtitan's Llama3Model: split and scheduled by torchtitan's own
    pipeline_llm (distributed/pipeline_parallel.py: its default layer split, which counts the
    embedding and the output layer as one layer each; PipelineStage; the 1F1B schedule; one
    micro-batch per sample, pipeline_parallel_microbatch_size 1), each stage parallelised by
    parallelize_llama (FSDP2 with reshard_after_forward False under PP, fsdp.py), as
    torchtitan's Trainer does.  The step is pp_forward_backward_step's schedule.step (torch
    2.13's API: the whole local batch, split into micro-batches by the schedule) and the
    optimizer step.  The model and its split are built on the meta device outside the fake
    mode (pipeline_llm deep-copies the model per stage, which fake tensors do not survive);
    to_empty then makes fake tensors of the stage's parameters."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import CompileConfig, TrainingConfig
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models.llama3 import parallelize_llama

    parallelism, cfg, ac_config = _torchtitan_config(env, model_name, ac, seq_len, layers,
                                                     pipeline_parallel_degree=env.pp,
                                                     pipeline_parallel_schedule=env.schedule)
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
    with unset_fake_temporarily():
        with torch.device("meta"):
            model = cfg.build()
        try:
            schedule, parts, first, last = pipeline_llm(
                model, parallel_dims=env.parallel_dims, training=TrainingConfig(local_batch_size=batch),
                parallelism=parallelism, compile_config=CompileConfig(), ac_config=ac_config,
                dump_folder="/tmp", device=torch.device("cpu"), model_config=cfg,
                parallelize_fn=parallelize_llama, loss_fn=loss_fn)
        except ValueError as e:  # torchtitan's own checks of the split
            raise SystemExit(f"torchtitan cannot pipeline this layout: {e}") from None
    if first and last:
        raise SystemExit("expected one pipeline stage on the traced rank, not the whole model")
    # interleaved schedules: this rank holds v model chunks (torchtitan's default, 2), one
    # PipelineStage each; the tracker and the optimizer see them together
    for st in getattr(schedule, "_stages", None) or [schedule._stage]:
        st._trace_hidden_meta = ((1, seq_len // env.tp, cfg.dim), torch.bfloat16,
                                 env.parallel_dims.get_mesh("tp") if env.tp > 1 else None)
    part = parts[0] if len(parts) == 1 else torch.nn.ModuleList(parts)
    part.to_empty(device="cpu")
    part.train()
    opt = torch.optim.AdamW(part.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    labels = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    n_tokens = torch.tensor(float(batch * seq_len))

    def step(probe=None):
        import contextlib
        with probe if probe is not None else contextlib.nullcontext():
            if first:
                schedule.step(tokens, return_outputs=False)
            elif not last:  # a middle stage: its input arrives from the previous one
                schedule.step(return_outputs=False)
            else:
                losses = []
                schedule.step(target=labels, losses=losses, return_outputs=False,
                              loss_kwargs={"global_valid_tokens": n_tokens})
        opt.step()
        opt.zero_grad(set_to_none=True)

    return part, opt, step, (tokens, labels)


# meta-llama/Llama-3.1-{8B,70B,405B} config.json (the dimensions that size tensors)
HF_CONFIGS = {
    "8B": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8),
    "70B": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8),
    "405B": dict(hidden_size=16384, intermediate_size=53248, num_attention_heads=128, num_key_value_heads=8),
}


def _build_hf(env, model_name: str, batch: int, ac: str, seq_len: int, layers: int):
    """A transformers LlamaForCausalLM from its config (no weights), wrapped as HF accelerate's
    FSDP2 plugin wraps it (accelerate utils/fsdp_utils.py fsdp2_prepare_model: fully_shard per
    decoder layer, then the root; parameters upcast to fp32; bf16 mixed precision is
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), utils/dataclasses.py; activation
    checkpointing is checkpoint_wrapper, non-reentrant, on the decoder layers, fsdp2_apply_ac).
    The loop is a plain accelerate script's: outputs = model(input_ids, labels=labels);
    outputs.loss.backward() (the logits stay referenced by `outputs`); AdamW step; zero_grad."""
    import functools

    import torch
    import transformers.masking_utils as masking_utils
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    # On real tensors, position ids 0..s-1 in every row are "one sequence per row" and the
    # causal mask is skipped (SDPA's is_causal, GQA inside the kernel). Under fake tensors
    # find_packed_sequence_indices cannot read the values (is_tracing) and keeps a packed-
    # sequence mask, which materialises an [s, s] mask per layer and repeat_kv copies: a
    # trace artefact, so it answers what it answers on real data.
    masking_utils.find_packed_sequence_indices = lambda position_ids: None

    if env.tp > 1 or ac == "sac":
        raise SystemExit("--impl hf traces FSDP only, with AC none or full (accelerate has no TP plan "
                         "or selective AC)")
    cfg = LlamaConfig(**HF_CONFIGS[model_name], num_hidden_layers=layers, vocab_size=128256,
                      max_position_embeddings=seq_len, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    if ac == "full":
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, LlamaDecoderLayer))
    mesh = env.parallel_dims.get_mesh("fsdp")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
    model.to_empty(device="cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    labels = torch.randint(0, cfg.vocab_size, (batch, seq_len))

    def step(probe=None):
        if probe is not None:
            with probe:
                outputs = model(input_ids=tokens, labels=labels)
        else:
            outputs = model(input_ids=tokens, labels=labels)
        outputs.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step, (tokens, labels)


BUILDERS = {"torchtitan": _build_torchtitan, "hf": _build_hf}


def trace(env, model_name: str, batch: int, ac: str, seq_len: int, layers: int, impl: str = "torchtitan") -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    pp = getattr(env, "pp", 1) > 1
    # under PP the stage is split on the meta device outside the fake mode (_build_torchtitan_pp)
    fake = FakeTensorMode(allow_non_fake_inputs=pp)
    with fake:
        build = _build_torchtitan_pp if pp else BUILDERS[impl]
        model, opt, step, inputs = build(env, model_name, batch, ac, seq_len, layers)
        t_build = time.perf_counter() - t0
        step()  # warm-up: creates the optimizer states (steady state from step 2 on)
        t_warm = time.perf_counter() - t0 - t_build
        tracker = _tracker_class()(model, opt)
        tracker.track_inputs(inputs)
        probe = _attn_probe_class()()
        moe = _MoeTerms(model) if model_name in MOE_MODELS else None
        t1 = time.perf_counter()
        with tracker:
            step(_Both(probe, moe) if moe is not None else probe)
        t_step = time.perf_counter() - t1

    # per block: Activation bytes still held after its first forward (saved for backward
    # + its output, the next block's input) = after post-forward - before pre-forward.
    per_block = {}
    # with several model chunks (interleaved PP) block names repeat across chunks and a block's
    # forward brackets other chunks' frees: no per-block figure
    for stats in (tracker.memory_tracking.values() if not isinstance(model, torch.nn.ModuleList) else ()):
        m = re.search(r"\.layers\.(\d+)$", stats.mod_fqn)
        snaps = stats.snapshots
        if m and snaps.get(_state("BEF_PRE_FW")) and snaps.get(_state("AFT_POST_FW")):
            def act(snap):
                return sum(v for d in snap.values() for k, v in d.items() if getattr(k, "value", k) == "Activation")
            per_block[int(m.group(1))] = (act(snaps[_state("AFT_POST_FW")][0])
                                          - act(snaps[_state("BEF_PRE_FW")][0]))
    peak = {}
    for snap in tracker.get_tracker_snapshot("peak").values():
        for k, v in snap.items():
            k = getattr(k, "value", k)
            peak[k] = peak.get(k, 0) + v
    res = {
        "peak": peak, "category_max": dict(tracker.cat_max),
        "category_max_where": dict(tracker.cat_max_where),
        "group_max": dict(tracker.group_max), "group_max_where": dict(tracker.group_max_where), "peak_where": tracker.peak_where,
        "per_block_activation": [per_block[i] for i in sorted(per_block)],
        "attention_ops": {k: {"calls": c, "output_bytes": b} for k, (c, b) in probe.ops.items()},
        "block_terms": moe.totals() if moe is not None else {},
        "block_tensors": moe.tensors if moe is not None else [],
        "seconds": {"build": t_build, "warmup_step": t_warm, "traced_step": t_step,
                    "total": time.perf_counter() - t0},
    }
    del model, opt, step, inputs, tracker, fake
    gc.collect()
    return res


def record_allocations(env, model_name: str, batch: int, ac: str, seq_len: int, layers: int,
                       impl: str = "torchtitan", steps: int = 3) -> dict:
    """Build the layout and run `steps` training steps under an AllocRecorder: the whole
    allocation sequence from the first parameter to the last step's zero_grad."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jobctl_measure.alloc_recorder import AllocRecorder

    t0 = time.perf_counter()
    pp = getattr(env, "pp", 1) > 1
    rec = AllocRecorder()
    fake = FakeTensorMode(allow_non_fake_inputs=pp)
    with fake, rec:
        build = _build_torchtitan_pp if pp else BUILDERS[impl]
        model, opt, step, inputs = build(env, model_name, batch, ac, seq_len, layers)
        rec.mark("build")
        for i in range(steps):
            step()
            rec.mark(f"step {i + 1}")
    names = {0: "default"}
    mods = list(model) if isinstance(model, torch.nn.ModuleList) else [model]
    for m in mods:
        state = getattr(m, "_get_fsdp_state", None)
        ctx = getattr(state(), "_comm_ctx", None) if state else None
        for attr in ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream",
                     "all_reduce_stream"):
            s = getattr(ctx, attr, None)
            for i, x in enumerate(rec.streams):
                if s is not None and x is s:
                    names[i] = attr.replace("_stream", "").replace("_", "-")
    events = list(rec.events)  # what dies with the model below is not part of the steps
    res = {"events": events, "origin": rec.origin, "streams": {i: names.get(i, f"stream {i}") for i in range(len(rec.streams))},
           "seconds": time.perf_counter() - t0}
    del model, opt, step, inputs, rec, fake
    gc.collect()
    return res


# --------------------------------------------------------------------------------------
# jobctl's side


def modelled(model_name: str, batch: int, ac: str, seq_len: int, layers: int, ranks: int, tp: int = 1,
             impl: str = "torchtitan", pp: int = 1, stage: str = "first", virtual: int = 1,
             cuda_graphs: bool = False, loss: str = "chunked", compile: bool = False) -> dict:
    """jobctl's memory for a layout this script traces (`compile`: the blocks compiled, which the
    trace does not run: tests compare it with published compiled runs)."""
    from jobctl import frameworks
    from jobctl.planner.memory import Workload, estimate_stage, layer_activation_terms, stored_layer_bytes
    from jobctl.planner.models import PRESETS
    from jobctl.planner.plan import Plan

    spec = PRESETS[PRESET_OF[model_name]]
    if layers != spec.layers:
        spec = dataclasses.replace(spec, layers=layers)
    gpn = min(ranks, 8)
    dp = ranks // (tp * pp)
    # the same layout under the framework jobctl would plan it for: torchtitan, or fsdp (HF
    # accelerate: eager HF layers, SDPA attention)
    framework = frameworks.get("fsdp" if impl == "hf" else "torchtitan")
    if loss == "ce" and framework.caps.loss_chunks:
        # the program traced computes the whole logits' loss at once (--loss ce: torchtitan's
        # trainer before its registry configs chunked it): the model of that program
        framework = dataclasses.replace(framework, caps=dataclasses.replace(framework.caps, loss_chunks=0))
    w = Workload(spec, seq_len, batch * dp, framework=framework, attention="sdpa" if impl == "hf" else "flash",
                 cuda_graphs=cuda_graphs, compile=compile)
    # torchtitan's TP plan always shards the norms and the block boundaries by sequence
    # (SequenceParallel in models/llama3/model.py's parallelize plan)
    # under PP torchtitan's micro-batches are of one sample (pipeline_parallel_microbatch_size
    # 1): the local batch is the number of micro-batches, the schedule's "accumulation"
    mb, accum = (1, batch) if pp > 1 else (batch, 1)
    p = Plan(nodes=ranks // gpn, gpus_per_node=gpn, tp=tp, pp=pp, dp=dp, cp=1, sharding="zero3",
             micro_batch_size=mb, grad_accum_steps=accum, global_batch_size=batch * dp,
             recompute=AC_NAMES[ac], offload="none", sequence_parallel=tp > 1, virtual_stages=virtual)
    bd = estimate_stage(w, 80 << 30, p, stage if pp > 1 else "only").to_dict()
    terms = bd["terms"]
    outside = sum(t["bytes"] for t in terms if t["name"] in OUTSIDE_ALLOCATOR)
    return {"terms": [{"name": t["name"], "group": t["group"], "bytes": t["bytes"]} for t in terms],
            "layer_terms": {n: v for n, v, _ in layer_activation_terms(w, p, mb)},
            "moe_share": spec.moe_layers / spec.layers if spec.moe is not None else 0.0,
            "per_block_activation": stored_layer_bytes(w, p, mb),
            "reserved": bd["total_bytes"] - outside}


def compare(tr: dict, mo: dict) -> list[dict]:
    traced = dict.fromkeys(GROUP_ORDER, 0)
    for k, v in tr["peak"].items():
        if k in GROUP_OF:
            traced[GROUP_OF[k]] += v
    tmax = {g: tr["group_max"].get(g, 0) for g in GROUP_ORDER}
    model = dict.fromkeys(GROUP_ORDER, 0.0)
    overhead = overlap = 0.0
    for t in mo["terms"]:
        g = t["group"]
        if g in ("activations", "logits"):
            g = "activations+logits"
        if g in model:
            model[g] += t["bytes"]
        elif g == "overhead":
            overhead += t["bytes"]
        elif g == "overlap":  # terms never held together (negative): the total only
            overlap += t["bytes"]
    rows = []
    for g in GROUP_ORDER:
        m = model[g] if g != "module buffers" else None
        rows.append({"group": g, "traced": traced[g], "traced_max": tmax[g], "modelled": m})
    total = tr["peak"].get("Total", sum(traced.values()))
    rows.append({"group": "total (tensors)", "traced": total, "traced_max": total,
                 "modelled": sum(model.values()) + overlap})
    pb = tr["per_block_activation"]
    if pb:
        mean = sum(pb) / len(pb)
        rows.append({"group": f"per block, mean of {len(pb)}", "traced": None, "traced_max": mean,
                     "modelled": mo["per_block_activation"]})
    bt = tr.get("block_terms") or {}
    if bt and mo["layer_terms"]:  # what one MoE block keeps, term by term (no recompute: all of it)
        # jobctl averages the routed part over the layers; one MoE block holds all of it
        lt = {n: v / mo["moe_share"] if n in ROUTED_TERMS else v for n, v in mo["layer_terms"].items()}
        for name in MOE_TERMS:
            if name in bt or name in lt:
                rows.append({"group": f"  {name}", "traced": None, "traced_max": bt.get(name, 0),
                             "modelled": lt.get(name, 0)})
        att = sum(v for n, v in lt.items() if n in ATTENTION_TERMS)
        rows.append({"group": "  attention", "traced": None, "traced_max": bt.get("attention", 0), "modelled": att})
        rows.append({"group": "  norms", "traced": None, "traced_max": bt.get("norms", 0),
                     "modelled": lt.get("rmsnorm inputs", 0)})
    rows.append({"group": "overhead (not traced)", "traced": None, "traced_max": None, "modelled": overhead})
    for r in rows:  # each group against its own maximum over the step; total against the peak
        ref = r["traced_max"]
        r["rel_diff"] = (r["modelled"] - ref) / ref if ref and r["modelled"] is not None else None
    return rows


# jobctl's attention terms (a block's attention module keeps these)
ATTENTION_TERMS = ("qkv input", "q, k, v", "q/k norm inputs", "attention lse", "attention output", "mla latents")


# --------------------------------------------------------------------------------------
# output


def _wrap(text):
    import textwrap
    print(textwrap.fill(text, width=99, initial_indent="   ", subsequent_indent="     "))


def _g(x):
    return "-" if x is None else f"{x / GIB:9.3f}"


def _who(model_name: str) -> str:
    return {"30B-A3B": "qwen3 (MoE)", "671B": "deepseek_v3 (MoE, MLA)"}.get(model_name, "llama3")


def print_layout(name, batch, ac, args, tr, mo, rows):
    s = tr["seconds"]
    par = f"FSDP2 x{args.ranks // (args.tp * args.pp)}" + (f" x TP {args.tp}" if args.tp > 1 else "") + (
        f" x PP {args.pp} {args.schedule} ({args.stage} stage)" if args.pp > 1 else "")
    who = _who(args.model) if args.impl == "torchtitan" else "HF llama"
    print(f"\n== {name}: {who} {args.model} ({args.layers} layers), {par}, local batch {batch}, "
          f"seq {args.seq_len}, AC {ac}"[:120])
    where = (tr["peak_where"] or "?").replace("FSDPLlama3Model.", "").replace("FSDPLlama3Model", "model")
    print(f"   trace {s['total']:.1f} s (build {s['build']:.1f}, warm-up step {s['warmup_step']:.1f}, "
          f"traced step {s['traced_step']:.1f}); peak during {where}"[:99])
    print(f"   {'group (GiB)':24} {'at peak':>9} {'own max':>9} {'modelled':>9} {'diff':>8}  own max during")
    for r in rows:
        d = r["rel_diff"]
        flag = "!" if d is not None and abs(d) > TOL else ""
        dtxt = "-" if d is None else f"{d * 100:+7.1f}%"
        where = tr["group_max_where"].get(r["group"], "") if r["group"] in GROUP_ORDER else ""
        where = where.replace("FSDPLlama3Model.", "").replace("FSDPLlama3Model", "model")
        print(f"   {r['group']:24} {_g(r['traced']):>9} {_g(r['traced_max']):>9} "
              f"{_g(r['modelled']):>9} {dtxt:>8} {flag:1} {where[:28]}")
    _wrap("jobctl terms: " + "; ".join(f"{t['name']} {t['bytes'] / GIB:.2f}" for t in mo["terms"]
                                       if t["group"] in ("activations", "logits", "buffers")))
    _wrap("tracker at peak: " + "; ".join(f"{k} {v / GIB:.2f}" for k, v in tr["peak"].items()
                                          if v and k != "Total"))
    for op, rec in tr["attention_ops"].items():
        _wrap(f"attention kernel {op.replace('aten.', '')}: {rec['calls']} calls in forward, outputs "
              f"(out + lse) {rec['output_bytes'] / rec['calls'] / (1 << 20):.1f} MiB per call")
    if not tr["attention_ops"]:
        print("   attention kernel: none seen (unexpected)")


def allocator_rows(rec: dict) -> dict:
    """Replay a recorded allocation sequence through the caching-allocator model, with and
    without expandable segments: max reserved, and what the allocator held at that moment."""
    from jobctl_measure import caching_allocator as ca

    out = {}
    for mode, expandable in (("expandable", True), ("default", False)):
        r = ca.replay(rec["events"], expandable_segments=expandable)
        ev = r["at_peak"].get("event")
        out[mode] = {
            "max_reserved": r["max_reserved"], "max_allocated": r["max_allocated"],
            "max_requested": r["max_requested"],
            "peak_request": {"bytes": ev[2], "op": rec["origin"].get(ev[1], "?"),
                             "stream": rec["streams"][ev[3]]} if ev and ev[0] == "a" else None,
            "streams_at_peak": {rec["streams"][k]: v for k, v in r["at_peak"].get("streams", {}).items()},
            "steps": r["phases"],
        }
    return out


def print_allocator(name, args, rec, al, mo):
    e, d = al["expandable"], al["default"]
    tensors = e["max_requested"]
    print(f"\n{args.model} {name}: {len(rec['events'])} allocation events over build + {args.steps} steps "
          f"({rec['seconds']:.0f} s)")
    print(f"  {'':34} {'GiB':>8} {'vs tensors':>10}")
    print(f"  {'tensors, peak (the trace)':34} {_g(tensors):>8}")
    for label, r in (("reserved, expandable_segments", e), ("reserved, default allocator", d)):
        print(f"  {label:34} {_g(r['max_reserved']):>8} {(r['max_reserved'] - tensors) / tensors:>+10.1%}")
    print(f"  {'jobctl, allocator view':34} {_g(mo['reserved']):>8} {(mo['reserved'] - tensors) / tensors:>+10.1%}"
          f"   vs expandable {(mo['reserved'] - e['max_reserved']) / e['max_reserved']:+.1%}")
    pr = e["peak_request"]
    if pr:
        print(f"  expandable peak: reserved last grew for {pr['bytes'] / GIB:.2f} GiB on the {pr['stream']} "
              f"stream\n   ({pr['op'].replace('aten.', '').replace('.default', '')}); then, GiB:")
        print(f"  {'stream':34} {'reserved':>8} {'in use':>8} {'largest free':>13}")
        for name_, v in e["streams_at_peak"].items():
            print(f"  {name_:34} {_g(v['reserved']):>8} {_g(v['allocated']):>8} {_g(v['largest_free']):>13}")
    steps = " / ".join(_g(st["max_reserved"]) for st in e["steps"][1:])
    print(f"  max reserved per step (expandable): {steps}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", nargs="+", default=list(DEFAULT_LAYOUTS),
                    help="b<local batch>-<none|full|sac>, e.g. b1-none b2-sac (default: %(default)s)")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--model", default="8B", choices=MODELS, help="torchtitan's Llama 3 config (default 8B)")
    ap.add_argument("--layers", type=int, default=None,
                    help="trace only the first N blocks (default: all; 32, 80, 126)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1); ranks = FSDP x TP")
    ap.add_argument("--pp", type=int, default=1,
                    help="pipeline-parallel degree (default 1; torchtitan only): traces one rank of --stage "
                         "under torchtitan's pipeline_llm, 1F1B, micro-batches of one sample; ranks = PP x FSDP x TP")
    ap.add_argument("--schedule", default="1F1B", choices=("1F1B", "Interleaved1F1B"),
                    help="with --pp: torch's pipeline schedule (default 1F1B); Interleaved1F1B puts two model "
                         "chunks on each rank (torchtitan's default for looped schedules)")
    ap.add_argument("--stage", default="first", choices=("first", "middle", "last"),
                    help="with --pp: the pipeline stage traced (default first; middle is the second stage)")
    ap.add_argument("--impl", default="torchtitan", choices=tuple(BUILDERS),
                    help="whose model code: torchtitan's Llama3Model and parallelize functions (default), or "
                         "transformers' LlamaForCausalLM wrapped as HF accelerate's FSDP2 plugin does (hf)")
    ap.add_argument("--ranks", type=int, default=8, help="FSDP degree (fake ranks)")
    ap.add_argument("--spmd-backend", default="partial_dtensor",
                    choices=("partial_dtensor", "spmd_types", "full_dtensor"))
    ap.add_argument("--cpu-rmsnorm", action="store_true",
                    help="keep CPU's composite RMSNorm (saves fp32 copies) instead of CUDA's fused set")
    ap.add_argument("--loss", default="auto", choices=("auto", "ce", "chunked"),
                    help="torchtitan's loss: the ChunkedLossWrapper every 0.3.0 registry config uses (chunked: "
                         "8 sequence chunks), or CrossEntropyLoss on the whole logits (ce); auto (the default): "
                         "chunked without PP, ce under PP (its last stage's chunked loss inside the schedule is "
                         "not traced, and jobctl counts the whole logits there)")
    ap.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"),
                    help="zero the gradients as torchtitan 0.3.0's trainer does under CUDA graphs "
                         "(zero_grad(set_to_none=False): they stay allocated between steps) or without them "
                         "(set_to_none=True); auto (the default): as the trainer runs the layout, graphs on "
                         "without PP (jobctl renders them off under PP and EP)")
    ap.add_argument("--json", action="store_true", help="raw numbers (bytes) as JSON")
    ap.add_argument("--allocator", action="store_true",
                    help="record every allocation of the build and --steps training steps and replay them "
                         "through the caching-allocator model (jobctl_measure/caching_allocator.py): max reserved "
                         "bytes, with and without expandable_segments, against the tensors' peak")
    ap.add_argument("--steps", type=int, default=3, help="with --allocator: training steps recorded (default 3)")
    args = ap.parse_args()
    if args.layers is None:
        from jobctl.planner.models import PRESETS
        args.layers = PRESETS[PRESET_OF[args.model]].layers
    if args.tp < 1 or args.pp < 1 or args.ranks % (args.tp * args.pp):
        raise SystemExit(f"--ranks {args.ranks} must be a multiple of --tp {args.tp} x --pp {args.pp}")
    if args.pp > 1 and args.impl != "torchtitan":
        raise SystemExit("--pp traces torchtitan only, and its middle and last stages with --tp 1 only")
    if args.steps < 1:
        raise SystemExit("--steps must be 1 or more")
    if args.model in MOE_MODELS and (args.tp > 1 or args.pp > 1 or args.impl != "torchtitan"):
        raise SystemExit(f"--model {args.model} traces torchtitan's MoE under FSDP only (--tp 1 --pp 1): expert "
                         "parallelism's all-to-all sizes its buffers from the routing, which fake tensors do not have")
    if args.stage == "middle" and args.pp < 3:
        raise SystemExit("--stage middle needs --pp 3 or more")
    layouts = [(n, *parse_layout(n)) for n in args.layouts]
    if args.ranks > 8 and args.ranks % 8:
        raise SystemExit("--ranks above 8 must be a multiple of 8")

    import logging
    logging.getLogger("torchtitan").setLevel(logging.WARNING)
    import warnings
    warnings.filterwarnings("ignore")
    import torch

    env = _Env(args.ranks, args.spmd_backend, cuda_rmsnorm=not args.cpu_rmsnorm, tp=args.tp, pp=args.pp,
               stage=args.stage, schedule=args.schedule)
    env.loss = args.loss if args.loss != "auto" else ("chunked" if args.pp == 1 and args.impl == "torchtitan"
                                                      else "ce")
    env.cuda_graphs = args.cuda_graphs == "on" or (args.cuda_graphs == "auto" and args.pp == 1
                                                   and args.impl == "torchtitan")
    out = {"meta": {"torch": torch.__version__, "model": args.model, "layers": args.layers,
                    "seq_len": args.seq_len, "ranks": args.ranks, "tp": args.tp, "pp": args.pp,
                    "stage": args.stage if args.pp > 1 else "only", "schedule": args.schedule if args.pp > 1 else None,
                    "impl": args.impl, "loss": env.loss, "cuda_graphs": env.cuda_graphs,
                    "spmd_backend": args.spmd_backend,
                    "rmsnorm": "cpu composite" if args.cpu_rmsnorm else "cuda-like saved set", "device": "cpu (fake)"},
           "layouts": []}
    if not args.json and not args.allocator:
        tp = (f" x TP {args.tp}" if args.tp > 1 else "") + (f" x PP {args.pp}" if args.pp > 1 else "")
        who = ("torchtitan " + _who(args.model) if args.impl == "torchtitan"
               else "transformers LlamaForCausalLM (accelerate FSDP2)")
        print(f"torch {torch.__version__}; {who} {args.model} under FakeTensorMode (CPU), FSDP2 "
              f"x{args.ranks // (args.tp * args.pp)}{tp} ({args.ranks} fake ranks).\nGiB per rank. 'at peak': the tracker's breakdown when the "
              f"total peaked; 'own max': the\ngroup's own maximum over the step. diff = (modelled - "
              f"own max) / own max (total: vs the\npeak). ! = off by more than {TOL:.0%}.")
    if args.allocator:
        if not args.json:
            print(f"torch {torch.__version__}; {args.model} x{args.ranks // (args.tp * args.pp)} FSDP"
                  + (f" x TP {args.tp}" if args.tp > 1 else "") + (f" x PP {args.pp} ({args.stage} stage)" if args.pp > 1 else "")
                  + f", {args.impl}:\nallocations replayed through the caching-allocator model. 'jobctl, "
                  "allocator view':\nits total less the CUDA context and NCCL buffers, which the allocator does "
                  "not hold.")
        for name, batch, ac in layouts:
            rec = record_allocations(env, args.model, batch, ac, args.seq_len, args.layers, args.impl, args.steps)
            al = allocator_rows(rec)
            mo = modelled(args.model, batch, ac, args.seq_len, args.layers, args.ranks, args.tp, args.impl,
                          args.pp, args.stage, 2 if args.schedule == "Interleaved1F1B" else 1, env.cuda_graphs,
                          env.loss)
            out["layouts"].append({"name": name, "local_batch": batch, "ac": ac, "allocator": al,
                                   "events": len(rec["events"]), "modelled_reserved": mo["reserved"]})
            if not args.json:
                print_allocator(name, args, rec, al, mo)
                sys.stdout.flush()
        if args.json:
            print(json.dumps(out, indent=2, default=str))
        return _teardown()
    for name, batch, ac in layouts:
        tr = trace(env, args.model, batch, ac, args.seq_len, args.layers, args.impl)
        mo = modelled(args.model, batch, ac, args.seq_len, args.layers, args.ranks, args.tp, args.impl,
                      args.pp, args.stage, 2 if args.schedule == "Interleaved1F1B" else 1, env.cuda_graphs,
                      env.loss)
        rows = compare(tr, mo)
        out["layouts"].append({"name": name, "local_batch": batch, "ac": ac, "traced": tr,
                               "modelled": mo, "rows": rows})
        if not args.json:
            print_layout(name, batch, ac, args, tr, mo, rows)
            sys.stdout.flush()
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print("\nNot traced: CUDA context, NCCL buffers, allocator cache/fragmentation (jobctl's\n"
              "'overhead'; --allocator replays the allocator). CPU kernels stand in for CUDA's\n"
              "(see the module docstring).")
    return _teardown()


def _teardown() -> int:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
