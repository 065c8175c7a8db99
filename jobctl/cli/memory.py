"""A quick calculator: model states per GPU from a parameter count, and what is left."""

from __future__ import annotations

from jobctl import ui
from jobctl.errors import EXIT_NO_FIT, EXIT_OK
from jobctl.planning.calculator import calculate

HELP = "quick calculator: model-state memory per GPU from a parameter count"
EPILOG = """examples:
  jobctl memory --model-size-gb 14 --gpu-memory-gb 80 --optimizer adamw
  jobctl memory --params 7.5e9 --num-gpus 64 --zero-stage 3 --json
  jobctl memory --model llama3.1-8b --seq-len 4096 --micro-batch-size 1 --recompute full

sizes: --model-size-gb is the 16-bit checkpoint size in decimal GB (2 bytes per parameter,
as the memory guides count: 7B -> 14 GB); --gpu-memory-gb is the card's size as in its name,
taken as GiB (an "80GB" H100 reports 79.6 GiB). The underscore spellings of the memory
guides (--model_size_gb, --gpu_memory_gb, --num_gpus, --zero_stage) are accepted.
exit codes: 0 fits, 3 does not fit, 2 bad input."""


def add_arguments(p) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--params", type=float, help="parameter count, e.g. 7.5e9")
    src.add_argument("--model-size-gb", "--model_size_gb", type=float, dest="model_size_gb", help="16-bit model size in GB")
    src.add_argument("--model", help="a preset (e.g. llama3.1-8b): exact counts, and activations with --seq-len")
    p.add_argument("--gpu-memory-gb", "--gpu_memory_gb", type=float, default=80.0, dest="gpu_memory_gb",
                   help="memory of one GPU (default 80)")
    p.add_argument("--num-gpus", "--num_gpus", type=int, default=1, dest="num_gpus",
                   help="data-parallel GPUs sharing the states (default 1)")
    p.add_argument("--optimizer", default="adamw", help="adamw|adam8bit|adafactor|lion|adam-mini|sgd|sgd-momentum")
    p.add_argument("--precision", default="bf16-mixed", help="bf16-mixed|bf16-pure|fp16-mixed|fp32")
    p.add_argument("--zero-stage", "--zero_stage", type=int, default=0, dest="zero_stage", help="0-3 (3 = FSDP full shard)")
    p.add_argument("--framework", default="custom", help="custom|megatron|torchtitan|deepspeed|fsdp (generic = custom)")
    p.add_argument("--offload", default="none", help="none|optimizer|optimizer+params")
    p.add_argument("--seq-len", "--seq_len", type=int, dest="seq_len", help="with --model: include activations")
    p.add_argument("--micro-batch-size", "--micro_batch_size", type=int, default=1, dest="micro_batch_size")
    p.add_argument("--recompute", default="none", help="none|selective|full")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON (bytes) on stdout")


def run(args) -> int:
    result = calculate(
        params=args.params, model_size_gb=args.model_size_gb, model=args.model, gpu_memory_gb=args.gpu_memory_gb,
        num_gpus=args.num_gpus, optimizer=args.optimizer, precision=args.precision, zero_stage=args.zero_stage,
        framework=args.framework, offload=args.offload, seq_len=args.seq_len,
        micro_batch_size=args.micro_batch_size, recompute=args.recompute,
    )
    if args.as_json:
        ui.print_json({k: result[k] for k in ("fits", "params", "memory", "notes", "verdict", "assumptions")})
    else:
        ui.render_memory_calc(result)
    return EXIT_OK if result["fits"] else EXIT_NO_FIT


