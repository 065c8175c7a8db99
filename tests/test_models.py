"""Exact parameter counts against published figures (not against the code's own formula)."""

import pytest

from jobctl.planner.models import PRESETS, padded_vocab

# Published counts: Llama 3.1 from docs/memory-model.md §1 (no vocabulary padding); Llama 2 7B/13B/70B
# and Llama 3.2 1B/3B as sum(p.numel()) of the released Hugging Face checkpoints
# (model cards: 6.74B, 13.0B, 69.0B, 1.24B, 3.21B); GPT-2 small: 124,439,808 (HF "gpt2").
PUBLISHED = {
    "llama3.1-8b": 8_030_261_248,
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "gpt2": 124_439_808,
}


@pytest.mark.parametrize("name,count", sorted(PUBLISHED.items()))
def test_preset_parameter_counts_match_published(name, count):
    assert PRESETS[name].params() == count


def test_llama_8b_by_hand():
    # 32 layers x (2·4096·4096 + 2·4096·1024 + 3·4096·14336 + 2·4096) + 2·128256·4096 + 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert PRESETS["llama3.1-8b"].params() == 32 * layer + 2 * 128256 * 4096 + 4096


def test_megatron_vocab_padding():
    # --make-vocab-size-divisible-by 128, times tp: 128256 = 128·1002 stays at tp=1, and at
    # tp=8 rounds up to ceil(128256/1024)·1024 = 126·1024 = 129024;
    # 32000 padded for tp=8 -> ceil(32000/1024)*1024 = 32768; 50257 for tp=1 -> 50304.
    assert padded_vocab(128256, 128) == 128256
    assert padded_vocab(128256, 128 * 8) == 129024
    assert padded_vocab(32000, 128 * 8) == 32768
    assert padded_vocab(50257, 128) == 50304
    m = PRESETS["llama2-7b"]
    assert m.params(vocab=32768) - m.params() == 2 * 768 * 4096
