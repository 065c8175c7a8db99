"""Mixture-of-experts models described and counted (issue 31, first step).

Expected counts are the models' authors' published figures, quoted per model. A published total
is checked within 0.5%. A published active count is a rounded figure in all but one case, and
authors count it two ways: with the embedding lookup and the output layer (Mistral, Meta,
DeepSeek, Qwen) or without the embedding (OpenAI's gpt-oss table), so each is checked in its
authors' convention, to the digits they print."""

from __future__ import annotations

import json

import pytest

from jobctl.planner.models import PRESETS
from jobctl_run import jobctl

# (preset, published total, published active, digits the active figure is printed to, whether the
# authors count the embedding lookup in "active", where the figures are published)
PUBLISHED = [
    ("deepseek-v3", 671e9, 37e9, 1e9, True, "DeepSeek-V3 Technical Report (arXiv:2412.19437), abstract: 671B total, "
     "37B activated for each token (the main model; the MTP module is counted apart)"),
    ("qwen3-235b-a22b", 235e9, 22e9, 1e9, True, "Qwen3-235B-A22B model card: 235B in total and 22B activated"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.1e9, True, "Qwen3-30B-A3B model card: 30.5B in total and 3.3B activated"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.1e9, True, "Mistral AI, 'Mixtral of experts' (2023): 46.7B total parameters, "
     "12.9B per token"),
    ("mixtral-8x22b", 141e9, 39e9, 1e9, True, "Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024): 39B active "
     "parameters out of 141B"),
    ("gpt-oss-120b", 116.83e9, 5.13e9, 0.01e9, False, "gpt-oss model card (OpenAI, 2025), Table 1: 116.83B total, "
     "5.13B active parameters per token (the embedding not counted as active)"),
    ("gpt-oss-20b", 20.91e9, 3.61e9, 0.01e9, False, "gpt-oss model card (OpenAI, 2025), Table 1: 20.91B total, "
     "3.61B active parameters per token (the embedding not counted as active)"),
    ("llama4-maverick", 400e9, 17e9, 1e9, True, "Meta, 'The Llama 4 herd' (2025): 17B active parameters, 128 experts, "
     "400B total parameters"),
]


@pytest.mark.parametrize("name, total, active, digits, with_embedding, source", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_total_and_active_counts_are_the_published_ones(name, total, active, digits, with_embedding, source):
    m = PRESETS[name]
    assert m.params() == pytest.approx(total, rel=0.005), source
    counted = m.active_params() - (0 if with_embedding else m.embedding_params())
    # a printed figure stands for anything that rounds to it, or that its authors truncated to it
    assert active - digits / 2 <= counted < active + digits, (counted, source)
    assert m.active_params() < m.params()


def test_a_moe_layer_counts_by_hand():
    """Mixtral 8x7B (config.json: hidden 4096, 32 heads, 8 KV heads of 128, intermediate 14336,
    8 experts, top 2, vocabulary 32000, untied), by hand."""
    h, f, e = 4096, 14336, 8
    attention = h * h + 2 * h * 1024 + h * h
    layer = attention + e * 3 * h * f + h * e + 2 * h  # experts, router, two norms
    total = 32 * layer + 2 * 32000 * h + h
    assert PRESETS["mixtral-8x7b"].params() == total
    active = 32 * (attention + 2 * 3 * h * f + h * e + 2 * h) + 2 * 32000 * h + h
    assert PRESETS["mixtral-8x7b"].active_params() == active


def test_mla_attention_counts_by_hand():
    """DeepSeek-V3's attention (config.json: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank
    512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128): q_a, its norm, q_b; kv_a
    (latent + the shared RoPE key), its norm, kv_b; o."""
    from jobctl.planner.moe import attention_params
    h, a = 7168, 128
    q = h * 1536 + 1536 + 1536 * a * (128 + 64)
    kv = h * (512 + 64) + 512 + 512 * a * (128 + 128)
    assert attention_params(PRESETS["deepseek-v3"]) == q + kv + a * 128 * h


def test_a_moe_model_is_counted_and_planned_where_the_framework_runs_it(tmp_path):
    # under FSDP via accelerate, which jobctl does not plan mixtures of experts for, the refusal
    # names the frameworks that do (tests/test_moe_planning.py plans them there)
    r = jobctl("plan", "recipes/llama8b.yaml", "model=mixtral-8x7b", "framework=fsdp", "--cluster", "h100", "--json")
    assert r.returncode != 0
    d = json.loads(r.stdout)
    assert d["feasible"] is False
    assert d["model"]["params"] == PRESETS["mixtral-8x7b"].params()
    assert d["model"]["active_params"] == PRESETS["mixtral-8x7b"].active_params()
    assert any("mixture of experts" in why and "megatron" in why for why in d["reasons"]), d["reasons"]
    for framework in ("megatron", "torchtitan"):
        r = jobctl("plan", "recipes/llama8b.yaml", "model=mixtral-8x7b", f"framework={framework}", "--cluster", "h100",
                   "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"]["ep"] > 1


def test_a_recipe_describes_its_own_moe_and_mla_model(tmp_path):
    recipe = tmp_path / "tiny-moe.yaml"
    recipe.write_text("""name: tiny-moe
model:
  name: tiny-moe
  family: llama
  layers: 4
  hidden: 256
  ffn_hidden: 512
  heads: 4
  vocab: 1000
  moe: {experts: 8, top_k: 2, expert_ffn_hidden: 128, shared_experts: 1, first_dense_layers: 1}
  attention: {kind: mla, q_lora_rank: 64, kv_lora_rank: 32, qk_rope_head_dim: 16, qk_nope_head_dim: 32,
              v_head_dim: 32}
train: {seq_len: 256, global_batch_size: 8}
framework: megatron
""")
    r = jobctl("plan", str(recipe), "--cluster", "h100", "--json")
    d = json.loads(r.stdout)
    h, a = 256, 4
    attention = (h * 64 + 64 + 64 * a * 48) + (h * 48 + 32 + 32 * a * 64) + a * 32 * h
    dense = attention + 3 * h * 512 + 2 * h
    moe = attention + h * 8 + 3 * h * 128 + 8 * 3 * h * 128 + 2 * h
    assert d["model"]["params"] == dense + 3 * moe + 2 * 1000 * h + h


def test_a_wrong_moe_is_a_recipe_error(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("""name: bad
model: {family: llama, layers: 2, hidden: 64, ffn_hidden: 128, heads: 4, vocab: 100,
        moe: {experts: 4, top_k: 8, expert_ffn_hidden: 32}}
train: {seq_len: 64, global_batch_size: 2}
""")
    r = jobctl("plan", str(recipe), "--cluster", "h100")
    assert r.returncode == 2
    assert "top_k (8) cannot exceed experts (4)" in r.stderr and "Traceback" not in r.stderr


def test_the_memory_calculator_sizes_a_moe_models_states_and_sends_its_activations_to_plan():
    r = jobctl("memory", "--model", "deepseek-v3", "--num-gpus", "256", "--zero-stage", "1", "--json")
    assert r.returncode == 3, r.stderr  # EXIT_NO_FIT (docs/exit-codes.md): 1.25 TB of 16-bit weights per GPU
    d = json.loads(r.stdout)
    n = PRESETS["deepseek-v3"].params()
    assert d["params"] == n
    weights = next(t for t in d["memory"]["terms"] if t["name"] == "weights")
    assert weights["bytes"] == 2 * n  # every expert on every GPU, 16-bit
    r = jobctl("memory", "--model", "deepseek-v3", "--seq-len", "4096")
    assert r.returncode == 2 and "expert parallelism" in r.stderr and "Traceback" not in r.stderr


def test_a_recipe_describes_a_gpt_oss_like_layer(tmp_path):
    # sinks, biases on every linear, a window on alternate layers and the clamped GEGLU, described
    # in the recipe: rendered for Megatron as for the gpt-oss presets
    recipe = tmp_path / "tiny-oss.yaml"
    body = """name: tiny-oss
model:
  name: tiny-oss
  family: llama
  activation: clamped-geglu
  layers: 4
  hidden: 256
  ffn_hidden: 256
  heads: 4
  kv_heads: 2
  vocab: 1000
  moe: {experts: 8, top_k: 2, expert_ffn_hidden: 256, router_bias: true, expert_bias: true}
  attention: {head_dim: 64, bias: true, sinks: true, sliding_window: 32, full_every: 2}
train: {seq_len: 256, global_batch_size: 8}
framework: megatron
"""
    recipe.write_text(body)
    r = jobctl("plan", str(recipe), "--cluster", "h100", "--json")
    assert r.returncode == 0, r.stdout[-600:]
    args = json.loads(r.stdout)["framework"]["args"]
    assert [str(args[args.index(f) + 1]) for f in ("--window-size", "--window-attn-skip-freq", "--softmax-type")] == \
        ["31,0", "2", "learnable"]
    assert "--quick-geglu" in args and "--add-qkv-bias" in args
    # biased attention without biased experts: Megatron biases every linear or none
    recipe.write_text(body.replace("router_bias: true, expert_bias: true", "router_bias: false"))
    r = jobctl("plan", str(recipe), "--cluster", "h100", "--json")
    assert r.returncode == 3 and any("biases every linear layer" in x for x in json.loads(r.stdout)["reasons"])
    # a window's companion without the window, and a window on MLA: recipe errors, no traceback
    for old, new, message in (("sliding_window: 32, ", "", "set sliding_window too"),
                              ("head_dim: 64,", "kind: mla, kv_lora_rank: 32, qk_rope_head_dim: 16, "
                               "qk_nope_head_dim: 32, v_head_dim: 32,", "sliding_window is for kind gqa")):
        recipe.write_text(body.replace(old, new))
        r = jobctl("plan", str(recipe), "--cluster", "h100")
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-600:]
