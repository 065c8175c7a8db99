"""A small, real Hugging Face Trainer job for the tests (issue 33): a tiny transformers Llama
trained with the TrainingArguments jobctl renders for the fsdp (accelerate) framework, on a
learnable synthetic task (each token is followed by a fixed successor, so the loss can go to 0
from about ln(vocab)).

Everything about the run comes from the command line, parsed by transformers' own
HfArgumentParser: ${framework.args} (batch, accumulation, precision, lr, schedule, steps,
clipping, seed, Adam) and, under `accelerate launch`, the accelerate config and launch arguments
jobctl rendered. The model's shape comes from --layers/--hidden/... (this script's own options,
the recipe's model fields). Rank 0 prints `hf_train: world W type T` once, then
`hf_train: step N loss X lr Y` per optimizer step, and each rank prints its rank and node.

    launch.command: python tests/trainers/hf_train.py ${framework.args} --layers ${model.layers} ...
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

DATA_SEED = 1234


class Chains(torch.utils.data.Dataset):
    """Successor chains under a fixed random permutation of the vocabulary."""

    def __init__(self, vocab: int, seq_len: int, size: int = 4096):
        g = torch.Generator().manual_seed(DATA_SEED)
        succ = torch.randperm(vocab, generator=g)
        tok = torch.randint(0, vocab, (size,), generator=g)
        seq = [tok]
        for _ in range(seq_len - 1):
            tok = succ[tok]
            seq.append(tok)
        self.ids = torch.stack(seq, dim=1)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            print(f"hf_train: step {state.global_step} loss {logs['loss']:.4f} "
                  f"lr {logs.get('learning_rate', float('nan')):.3g}", flush=True)


def model_args(argv):
    ap = argparse.ArgumentParser(add_help=False)
    for name, default in (("layers", 2), ("hidden", 64), ("ffn-hidden", 172), ("heads", 4), ("kv-heads", 2),
                          ("vocab", 256), ("seq-len", 32)):
        ap.add_argument(f"--{name}", type=int, default=default)
    return ap.parse_known_args(argv)


def main(argv=None) -> int:
    shape, rest = model_args(sys.argv[1:] if argv is None else argv)
    folder = os.environ.get("JOBCTL_JOB_FOLDER")
    defaults = ["--logging_steps", "1", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
                "--output_dir", os.path.join(folder, "hf_out") if folder else "hf_out"]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(defaults + rest)
    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn_hidden,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.seq_len,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=Chains(shape.vocab, shape.seq_len),
                      callbacks=[Report()])
    state = trainer.accelerator.state
    print(f"hf_train: rank {state.process_index} of {state.num_processes} on {socket.gethostname()} "
          f"(node rank {os.environ.get('JOBCTL_NODE_RANK', '?')})", flush=True)
    if state.is_main_process:
        print(f"hf_train: world {state.num_processes} type {state.distributed_type.value} "
              f"micro {args.per_device_train_batch_size} accum {args.gradient_accumulation_steps}", flush=True)
    trainer.train()
    if state.is_main_process:  # accelerate's FP8 converts the model's Linear layers in place at prepare()
        float8 = sum(type(m).__name__ == "Float8Linear" for m in trainer.model.modules())
        print(f"hf_train: float8 linears {float8}", flush=True)
    if torch.distributed.is_initialized():  # leave together: a rank that exits first aborts the other's gloo
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: on CPU ranks under `accelerate launch` (static
    # rendezvous) torch 2.13 sometimes aborts there ("terminate called without an active
    # exception", a joinable store/gloo thread destroyed at exit) after training has ended.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
