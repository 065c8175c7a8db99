"""The memory model: bytes on the most loaded rank, term by term, each with its source.

See docs/memory-model.md. Notation: s sequence, b micro-batch, h hidden,
a heads, g KV heads, f FFN hidden, L layers, V vocabulary, t tp, p pp, c cp, N shard group.
Every term is a named field of `MemoryBreakdown`; nothing is multiplied by an unnamed
factor. Defaults of the overhead terms live in `Overheads` and can be overridden by a
recipe or an inventory (`memory:` block).

One module per group of terms, each small enough to check against docs/memory-model.md on its
own: workload.py (what the model is given, the breakdown's shape), stages.py (how a pipeline
stage is cut), states.py (weights, gradients, optimizer states), activations.py, head.py (logits
and loss), buffers.py (each framework's buffers), allocator.py (the caching allocator and the
fixed overheads), breakdown.py (the sum, and the most loaded rank). This package names them all.
"""

from __future__ import annotations

from jobctl.planner.memory.activations import (
    layer_activation_bytes,
    layer_activation_terms,
    pipeline_in_flight,
    recomputed_layers,
    stored_layer_bytes,
)
from jobctl.planner.memory.allocator import (
    FSDP2_ALLOCATOR_TERMS,
)
from jobctl.planner.memory.breakdown import (
    estimate,
    estimate_stage,
)
from jobctl.planner.memory.head import (
    logits_bytes_per_elem,
)
from jobctl.planner.memory.stages import (
    _stage_matrices,
    even_split,
    framework_vocab,
    front_loaded,
    stage_layers,
)
from jobctl.planner.memory.states import (
    StateBytes,
    add_model_states,
    lora_params_per_layer,
    model_state_elements,
    model_state_terms,
    optimizer_state_elements,
    state_bytes,
)
from jobctl.planner.memory.workload import (
    BNB_BLOCK,
    DEEPSPEED_REDUCE_BUCKET_ELEMS,
    GIB,
    QLORA_WEIGHT_BYTES,
    MemoryBreakdown,
    Overheads,
    Term,
    Training,
    Workload,
)

__all__ = [
    "BNB_BLOCK", "DEEPSPEED_REDUCE_BUCKET_ELEMS", "FSDP2_ALLOCATOR_TERMS", "GIB", "MemoryBreakdown",
    "Overheads", "QLORA_WEIGHT_BYTES", "StateBytes", "Term", "Training", "Workload", "_stage_matrices",
    "add_model_states", "estimate", "estimate_stage", "framework_vocab", "layer_activation_bytes",
    "layer_activation_terms", "logits_bytes_per_elem", "lora_params_per_layer", "model_state_elements", "model_state_terms",
    "optimizer_state_elements", "pipeline_in_flight", "recomputed_layers", "stage_layers", "even_split", "front_loaded",
    "state_bytes",
    "stored_layer_bytes",
]
