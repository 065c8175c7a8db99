"""Training frameworks as values: what each can run and how a plan becomes its configuration.

One module per framework (megatron, torchtitan, deepspeed, fsdp, custom); `get(name,
supports)` returns its `Framework`. The planner reads the capability tables and never the other
way round (the import-linter contract in pyproject.toml).
"""

from __future__ import annotations

from jobctl.frameworks import custom, deepspeed, fsdp, megatron, torchtitan
from jobctl.frameworks.base import (
    JOB_FOLDER_TOKEN,
    Capabilities,
    Framework,
    GradBuffer,
    Rendered,
    Selective,
    StateRecipe,
    file_path,
    ep_overlap,
    default_fp8_recipe,
    fp8_param_gather,
    graphed_step,
    flex_backend,
    loss_chunks,
    recompute_modules,
    selective_frees_memory,
)

REGISTRY: dict[str, Framework] = {
    "megatron": megatron.FRAMEWORK,
    "torchtitan": torchtitan.FRAMEWORK,
    "deepspeed": deepspeed.FRAMEWORK,
    "fsdp": fsdp.FRAMEWORK,
    "custom": custom.FRAMEWORK,
}
ALIASES = {"generic": "custom"}  # the old name of custom
NAMES = tuple(REGISTRY)


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def get(name: str | Framework, supports: dict | None = None) -> Framework:
    """The framework called `name` (an alias accepted); `supports` refines `custom` only."""
    if isinstance(name, Framework):
        return name
    key = canonical(name)
    if key not in REGISTRY:
        raise KeyError(f"unknown framework {name!r} (known: {', '.join(NAMES)}; 'generic' is custom's old name)")
    if key == "custom" and supports:
        return custom.make(supports)
    return REGISTRY[key]


__all__ = ["ALIASES", "JOB_FOLDER_TOKEN", "NAMES", "REGISTRY", "Capabilities", "Framework", "GradBuffer",
           "Rendered", "Selective", "StateRecipe", "canonical", "default_fp8_recipe", "ep_overlap", "file_path",
           "fp8_param_gather", "get", "graphed_step", "flex_backend", "loss_chunks",
           "recompute_modules", "selective_frees_memory"]
