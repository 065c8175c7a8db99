"""The user's own training code: it reads the plan from JOBCTL_* variables and runs what its
recipe declares it supports (`framework: {name: custom, supports: {...}}`).

Defaults, when the recipe declares nothing: data parallelism with no sharding or FSDP-style full
sharding, full or no recomputation, no offload, no tensor/pipeline/context parallelism. What the
code does is unknown, so the model uses the ZeRO paper's mixed-precision recipe and eager
(HF-style) layers.
"""

from __future__ import annotations

from dataclasses import replace

from jobctl.frameworks.base import (
    Capabilities,
    Framework,
    GradBuffer,
    Rendered,
    Selective,
    StateRecipe,
    common_problems,
)

CAPS = Capabilities(
    name="custom",
    title="your own code (reads JOBCTL_*)",
    shardings=("none", "zero3"),
    recompute=("none", "full"),
    selective=Selective.NOT_OFFERED,
    offload=("none",),
    optimizers=("adamw", "adam8bit", "lion", "sgd", "sgd-momentum", "adam-mini", "adafactor"),
    methods=("full", "lora", "qlora"),
    # fp8/mxfp8/nvfp4: the code's own Transformer Engine layers (JOBCTL_PRECISION says which);
    # memory as TE keeps it
    precisions=("bf16-mixed", "fp16-mixed", "bf16-pure", "fp32", "fp8", "mxfp8", "nvfp4"),
    state_recipe=StateRecipe.ZERO,
    reduce_bytes=2,
    grad_buffer=GradBuffer.DDP_BUCKETS,
    sources=(("what the code runs", "the recipe's framework.supports (defaults: dp, sharding none|zero3, "
              "recompute none|full)"),),
)

# framework.supports keys -> Capabilities fields
SUPPORT_KEYS = ("tp", "pp", "cp", "sequence_parallel", "interleaved", "sharding", "recompute", "offload",
                "recompute_layers")


def capabilities(supports: dict | None) -> Capabilities:
    """The custom table with what the recipe declares (validated by the schema)."""
    if not supports:
        return CAPS
    change: dict = {}
    for key in ("tp", "pp", "cp", "interleaved", "recompute_layers"):
        if supports.get(key) is not None:
            change[key] = bool(supports[key])
    if supports.get("sequence_parallel") is not None:
        change["sequence_parallel"] = "optional" if supports["sequence_parallel"] else "no"
    for key, field in (("sharding", "shardings"), ("recompute", "recompute"), ("offload", "offload")):
        if supports.get(key) is not None:
            change[field] = tuple(dict.fromkeys(["none", *supports[key]])) if key != "sharding" \
                else tuple(dict.fromkeys(supports[key]))
    if "selective" in change.get("recompute", ()):
        change["selective"] = Selective.CORE_ATTENTION  # the scores only, as Megatron's selective
    if change.get("pp"):
        change["schedules"] = ("1F1B", "interleaved 1F1B") if change.get("interleaved") else ("1F1B",)
    declared = tuple(f"{k}={supports[k]}" for k in SUPPORT_KEYS if supports.get(k) is not None)
    return replace(CAPS, sources=(("what the code runs", "the recipe's framework.supports: " + ", ".join(declared)),),
                   **change)


def make(supports: dict | None = None) -> Framework:
    caps = capabilities(supports)

    def problems(plan, w) -> list[str]:
        return common_problems(caps, plan, w)

    return Framework(caps, problems, render)


def render(plan, w) -> Rendered:
    return Rendered("custom", (), {}, {}, ("your code reads the plan from JOBCTL_* (README: the job's environment)",))


FRAMEWORK = make()
