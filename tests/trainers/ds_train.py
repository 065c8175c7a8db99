"""A small, real DeepSpeed training job for the tests (issue 33): the recipe's Llama trained on a
learnable synthetic task with everything else taken from the ds_config.json jobctl rendered.

DeepSpeed builds the optimizer and the learning-rate schedule from the file (no client optimizer
is passed), and the batch from its triple: each rank draws `train_micro_batch_size_per_gpu`
sequences per micro-step and the engine accumulates `gradient_accumulation_steps` of them. With
JOBCTL_PP > 1 the model is a `deepspeed.pipe.PipelineModule(num_stages=JOBCTL_PP)` trained with
`engine.train_batch()`.

The task: a fixed random permutation `succ` of the vocabulary; a sequence starts at a random
token and each next token is `succ` of the one before. An untrained model's cross entropy is
about ln(vocab); the successor is a function of the current token, so the loss can go to 0.

Rank 0 prints one line per optimizer step, `ds_train: step N loss X` (the mean over the global
batch), and first a line with the layout as the engine has it. Under jobctl (torchrun):

    launch.command: python tests/trainers/ds_train.py ${framework.args} --layers ${model.layers} ...

The number of steps is --steps, else $JOBCTL_TRAIN_STEPS (the recipe's train.steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# this checkout's jobctl_measure (the reference Llama), as the tests' pyproject `pythonpath` does:
# torchrun puts only this script's folder on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jobctl_measure import torch_reference  # noqa: E402

DATA_SEED = 1234  # the permutation: the same on every rank, whatever --seed is


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn-hidden", type=int, default=172)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=int(os.environ.get("JOBCTL_SEQ_LEN", "32")))
    ap.add_argument("--steps", type=int, default=int(os.environ.get("JOBCTL_TRAIN_STEPS", "20")),
                    help="optimizer steps (default: $JOBCTL_TRAIN_STEPS, the recipe's train.steps, else 20)")
    ap.add_argument("--seed", type=int, default=0, help="model initialisation")
    ap.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    ap = deepspeed.add_config_arguments(ap)
    return ap.parse_args(argv)


class Batches:
    """Endless (inputs, labels) micro-batches of successor chains, one stream per data-parallel rank."""

    def __init__(self, vocab: int, seq_len: int, micro_batch_size: int, dp_rank: int):
        g = torch.Generator().manual_seed(DATA_SEED)
        self.succ = torch.randperm(vocab, generator=g)
        self.rng = torch.Generator().manual_seed(DATA_SEED + 1 + dp_rank)
        self.vocab, self.seq_len, self.micro_batch_size = vocab, seq_len, micro_batch_size

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        tok = torch.randint(0, self.vocab, (self.micro_batch_size,), generator=self.rng)
        seq = [tok]
        for _ in range(self.seq_len):
            tok = self.succ[tok]
            seq.append(tok)
        chain = torch.stack(seq, dim=1)  # micro_batch_size x (seq_len + 1)
        return chain[:, :-1].contiguous(), chain[:, 1:].contiguous()


class NormHead(nn.Module):
    """The final RMSNorm and the output projection, as one pipeline layer."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, x):
        return self.lm_head(self.norm(x))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def build(args, pp: int) -> nn.Module:
    torch.manual_seed(args.seed)  # the same initial weights on every rank and for every layout
    model = torch_reference.build_model(dict(
        family="llama", layers=args.layers, hidden=args.hidden, ffn_hidden=args.ffn_hidden, heads=args.heads,
        kv_heads=args.kv_heads, vocab=args.vocab, attention="sdpa"))
    if pp == 1:
        return model
    from deepspeed.pipe import PipelineModule

    layers = [model.embed_tokens, *model.layers, NormHead(model.norm, model.lm_head)]
    # with the pipeline's activation checkpointing (ds_config pipeline.activation_checkpoint_interval)
    # only the transformer blocks: DeepSpeed's reentrant checkpoint gives the embedding, whose input
    # is token ids, an output without grad_fn (pipe/module.py _is_checkpointable)
    return PipelineModule(layers=layers, num_stages=pp, loss_fn=lm_loss, partition_method="parameters",
                          checkpointable_layers=[type(model.layers[0]).__name__])


def main(argv=None) -> int:
    args = parse_args(argv)
    pp = int(os.environ.get("JOBCTL_PP", "1"))
    deepspeed.init_distributed()
    model = build(args, pp)
    # no optimizer here: DeepSpeed makes the one ds_config.json names (and its scheduler)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=[p for p in model.parameters() if p.requires_grad])
    if engine.bfloat16_enabled():
        # DeepSpeed casts the parameters to bf16, not the buffers: the reference model's RoPE
        # tables would promote q and k back to fp32 beside a bf16 v
        for module in model.modules():
            for name, buf in module._buffers.items():
                if buf is not None and buf.is_floating_point():
                    module._buffers[name] = buf.to(torch.bfloat16)
    mbs, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    rank = dist.get_rank()
    if pp > 1:
        dp_rank, dp = engine.grid.get_data_parallel_id(), engine.grid.get_data_parallel_world_size()
    else:
        dp_rank, dp = rank, dist.get_world_size()
    basic = getattr(engine, "basic_optimizer", None)
    if rank == 0:
        print(f"ds_train: ranks {dist.get_world_size()} dp {dp} pp {pp} micro_batch_size {mbs} "
              f"grad_accum_steps {accum} train_batch_size {engine.train_batch_size()} "
              f"zero_stage {engine.zero_optimization_stage()} overlap_comm {engine.zero_overlap_comm()} "
              f"offload_optimizer {engine.zero_offload_optimizer() is not None and engine.zero_use_cpu_optimizer()} "
              f"optimizer {type(basic).__name__ if basic is not None else type(optimizer).__name__} "
              f"wrapped {type(optimizer).__name__} scheduler {type(scheduler).__name__}", flush=True)
    data = Batches(args.vocab, args.seq_len, mbs, dp_rank)
    started = time.time()
    for step in range(1, args.steps + 1):
        if pp > 1:
            # the engine draws `accum` micro-batches (first stage: inputs, last: labels) and
            # returns the mean loss, broadcast to every stage
            loss = engine.train_batch(data_iter=data).detach().float()
        else:
            total = torch.zeros((), dtype=torch.float32)
            for _ in range(accum):
                inputs, labels = next(data)
                micro = lm_loss(engine(inputs), labels)
                engine.backward(micro)
                engine.step()  # steps the optimizer at the accumulation boundary only
                total += micro.detach().float()
            loss = total / accum
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        if rank == 0:
            print(f"ds_train: step {step} loss {loss.item():.4f} lr {engine.get_lr()[0]:.3g}", flush=True)
    if rank == 0:
        print(f"ds_train: done {args.steps} steps in {time.time() - started:.1f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Leave without running C++ static destructors. With DeepSpeed 0.19.8's JIT-built CPU ops
    # loaded (CPU Adam, shm comm) a rank sometimes aborts after its work is done, in exit-time
    # teardown: "terminate called without an active exception", SIGABRT, seen in 2 CI runs of
    # the offload test after all 20 steps had printed (and in none of 6 runs outside pytest).
    # Every step, the loss and the learning rate were already written; nothing is left to run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
