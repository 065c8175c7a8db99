#!/usr/bin/env python
"""Megatron-LM's own functional tests' GPU memory against jobctl's memory model (issue 14).

Data: benchmarks/data/megatron_functional_memory.yaml, read from NVIDIA/Megatron-LM
tests/functional_tests/test_cases/gpt/<case>/ (model_config.yaml: the run's arguments;
golden_values_*.json: "mem-allocated-bytes" and "mem-max-allocated-bytes"), with the file
header saying how each number was read. Megatron writes them from the last global rank (the
last pipeline stage) after the optimizer step: torch.cuda.memory_stats' allocated bytes now
(resident: weights, gradient buffer, optimizer states) and at their peak since start. These
are *allocated* bytes, so jobctl's tensor terms are compared (its total minus the CUDA
context, NCCL buffers and allocator reserve, which the allocator's allocated count never
holds). The last logged step is used (step 1's peak comes before the optimizer states exist).

Each run becomes a jobctl Workload (framework megatron, GPT family: Megatron's defaults are
LayerNorm, GELU MLP of 4h, learned positions, biases, dropout 0.1, tied embeddings) and a
Plan on 8 GPUs (dp = 8 / (tp·pp·cp)); the model's last pipeline stage is the one compared.
The conversion and the comparison are jobctl_measure/megatron_functional.py (the tests use them
too); this script prints the table.

Run:  python benchmarks/megatron_memory.py [--gpu h100|a100|all] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jobctl_measure.megatron_functional import GIB, compare, load

DATA = Path(__file__).resolve().parent / "data" / "megatron_functional_memory.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="all", choices=("all", "h100", "a100"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [compare(e) for e in load(DATA) if args.gpu in ("all", e["gpu"])]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("Megatron-LM functional tests (last rank, after the optimizer step) vs jobctl's tensor terms, GiB")
    print(f"{'case':44} {'gpu':4} {'peak':>6} {'model':>6} {'diff':>6}  {'resid':>6} {'model':>6} {'diff':>6}")
    for r in rows:
        name = r["case"].replace("gpt3_mcore_", "").replace("gpt3_", "")[:44]
        if "skipped" in r:
            print(f"{name:44} {r['gpu']:4} {r['skipped']}")
            continue
        print(f"{name:44} {r['gpu']:4} {r['peak_published'] / GIB:6.2f} {r['peak_modelled'] / GIB:6.2f} "
              f"{r['peak_diff'] * 100:+5.0f}%  {r['resident_published'] / GIB:6.2f} "
              f"{r['resident_modelled'] / GIB:6.2f} {r['resident_diff'] * 100:+5.0f}%")
        print(f"{'':44} {r['layout']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
