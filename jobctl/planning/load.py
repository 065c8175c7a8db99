"""Recipes and inventories as the planner needs them: found, read and validated, with every
problem of every file reported at once."""

from __future__ import annotations

from dataclasses import replace

from jobctl.config import loader as config
from jobctl.config.workspace import EMBEDDED_LOCAL, find_cluster, find_recipe, shadowing
from jobctl.errors import ConfigError, ConfigIssue
from jobctl.planner.catalog import gpu_names, unknown_message
from jobctl.planner.models import PRESETS


def _check_preset(data: dict, where) -> list[ConfigIssue]:
    """`model:` names a preset that exists (a mapping is checked by the schema)."""

    model = data.get("model")
    if not isinstance(model, str) or model in PRESETS:
        return []
    f, line = where(("model",))
    return [ConfigIssue(f, line, "model", unknown_message("model preset", model, sorted(PRESETS))
                        + "; or give a mapping {family, layers, hidden, ffn_hidden, heads, kv_heads, vocab}")]


def _check_gpus(data: dict, where) -> list[ConfigIssue]:
    """Every partition's `gpu:` is in the catalog."""

    parts = data.get("partitions")
    out = []
    for i, part in enumerate(parts if isinstance(parts, list) else []):
        gpu = part.get("gpu") if isinstance(part, dict) else None
        if isinstance(gpu, str) and gpu not in gpu_names():
            f, line = where(("partitions", i, "gpu"))
            out.append(ConfigIssue(f, line, f"partitions.{i}.gpu", unknown_message("GPU", gpu, gpu_names())))
    return out


def load_recipe(path: str, overrides: list[str]):
    """Load and validate a recipe (a path or a name from recipes/); ConfigError lists every problem.
    Its `notes` say when a name was found in this folder's recipes/ instead of the shipped one."""
    loaded = config.load(find_recipe(path), "Recipe", overrides, checks=(_check_preset,))
    note = shadowing(path, "recipe")
    return replace(loaded, notes=(note,)) if note else loaded


def load_inventory(name_or_path: str, overrides: list[str] | None = None):
    """Load and validate an inventory (a name from clusters/ or a path); None path = embedded local."""

    path = find_cluster(name_or_path)
    if path is None:
        from jobctl.config import schema

        inv = schema.Inventory.model_validate(EMBEDDED_LOCAL)
        return config.Loaded("<embedded local>", inv, dict(EMBEDDED_LOCAL), None, {})
    loaded = config.load(path, "Inventory", overrides, checks=(_check_gpus,))
    note = shadowing(name_or_path)
    return replace(loaded, notes=(note,)) if note else loaded


def load_request(recipe: str, overrides: list[str], clusters: list[str]):
    """The recipe and every named inventory, with the problems of all of them reported at
    once (one ConfigError) instead of stopping at the first bad file."""
    issues: list[ConfigIssue] = []
    rec = None
    invs = []
    try:
        rec = load_recipe(recipe, overrides)
    except ConfigError as e:
        issues += e.issues
    for name in clusters:
        try:
            invs.append(load_inventory(name))
        except ConfigError as e:
            issues += e.issues
    if issues:
        raise ConfigError(issues)
    return rec, invs


def train_steps(recipe) -> int | None:
    """Optimizer steps to train: train.steps, or train.tokens over tokens per step."""
    t = recipe.train
    if t.steps:
        return t.steps
    if t.tokens:
        per_step = t.global_batch_size * t.seq_len
        return -(-t.tokens // per_step)
    return None
