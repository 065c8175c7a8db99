"""The step-time model against published measurements (issue 15; docs/step-time-accuracy.md).

The measured values are the sources' own (benchmarks/data/published_throughput.yaml, each row
with its source and the row as printed; read by jobctl_measure/published_throughput.py); the
targets are the issue's."""

import statistics
from pathlib import Path

import pytest
import yaml

from jobctl_measure.published_throughput import load_moe_rows, load_rows

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "published_throughput.yaml"


def test_every_row_names_its_source_and_quotes_it():
    doc = yaml.safe_load(DATA.read_text())
    for row in doc["rows"]:
        assert row["source"] in doc["sources"], row["id"]
        assert row.get("quote"), row["id"]
        assert row["measured"], row["id"]
    for src in doc["sources"].values():
        assert src.get("title") and src.get("where"), src


def test_a_tflops_row_becomes_a_step_time_by_the_papers_formula():
    # Narayanan et al. 2021 Table 1, the 1T row: 128 layers, h 25600, V 51200, s 2048, batch 3072,
    # 3072 GPUs at 163 TFLOP/s each. Eq. (3): F = 96·B·s·l·h²·(1 + s/6h + V/16lh).
    B, s, l, h, V = 3072, 2048, 128, 25600, 51200
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    expected = flops / (163e12 * 3072)  # about 103 s per step
    rows, _ = load_rows(DATA)
    (row,) = [r for r in rows if r.id == "narayanan2021-t1-1t"]
    assert row.measured_s == pytest.approx(expected, rel=1e-9)
    assert 100 < row.measured_s < 106


def test_mean_absolute_error_meets_the_issue_targets():
    rows, _ = load_rows(DATA)
    scored = [r for r in rows if r.scored]
    assert len(scored) >= 60
    mae_all = statistics.mean(abs(r.error) for r in scored)
    megatron_check = [r for r in scored if r.half == "check" and r.framework == "megatron"]
    assert len(megatron_check) >= 8
    mae_megatron = statistics.mean(abs(r.error) for r in megatron_check)
    assert mae_all <= 0.10, f"all rows: {mae_all:.1%}"
    assert mae_megatron <= 0.05, f"held-out Megatron rows: {mae_megatron:.1%}"


def test_the_halves_alternate_within_each_source():
    rows, _ = load_rows(DATA)
    for source in {r.source for r in rows if r.scored}:
        group = sorted((r for r in rows if r.scored and r.source == source), key=lambda r: r.id)
        assert [r.half for r in group] == ["fit" if i % 2 == 0 else "check" for i in range(len(group))]


# --- Llama 3 405B (issue 29: within 15%) --------------------------------------------------------
# The paper's Table 4 prints TP, CP, PP, DP and the batch per DP; its Sec. 3.3.2 fixes the
# interleaving: one layer fewer on the first and last stages leaves "the first model chunk on the
# first stage" with "only the embedding", so a chunk is one layer and each of the 16 ranks holds
# (126 + 2) / 16 = 8 of them (V = 8, written into the rows with that derivation).
_LLAMA3 = [r for r in load_rows(DATA)[0] if r.source == "llama3_2024"]


def test_llama3_405b_runs_are_modelled_with_the_papers_interleaving():
    assert sorted(r.id for r in _LLAMA3) == ["llama3-405b-16384gpu-seq131072", "llama3-405b-16384gpu-seq8192",
                                             "llama3-405b-8192gpu-seq8192"]
    assert all(r.plan.pp == 16 and r.plan.virtual_stages == (126 + 2) // 16 for r in _LLAMA3)
    # Table 4: 430, 400 and 380 TFLOP/s per GPU; a step is the 16M-token batch's FLOPs over those
    by_id = {r.id: r for r in _LLAMA3}
    assert by_id["llama3-405b-8192gpu-seq8192"].measured_s > by_id["llama3-405b-16384gpu-seq8192"].measured_s


@pytest.mark.parametrize("row", _LLAMA3, ids=[r.id for r in _LLAMA3])
def test_llama3_405b_step_time_within_15_percent(row):
    assert abs(row.error) <= 0.15, f"{row.id}: {row.error:+.1%}"


# --- Megatron-Core's H100 table (issue 29: within 15%) -----------------------------------------
# The Megatron-LM README's weak-scaling table (Megatron-Core r0.8, H100, BF16): reference rows
# (micro-batch and recompute not printed), its fit half sets GEMM_EFFICIENCY_TE; the check half
# (7.1B, 32B, 119B, 177B) only checks.
_MCORE_H100 = [r for r in load_rows(DATA)[0] if r.source == "megatron_h100_2024"]


def test_megatron_core_h100_table_check_half_within_15_percent():
    check = [r for r in _MCORE_H100 if r.half == "check"]
    assert sorted(r.id for r in check) == ["megatron-h100-2024-119b", "megatron-h100-2024-177b",
                                           "megatron-h100-2024-32b", "megatron-h100-2024-7.1b"]
    mae = statistics.mean(abs(r.error) for r in check)
    assert mae <= 0.15, ", ".join(f"{r.id} {r.error:+.1%}" for r in check)


# Megatron's interleaved schedule warms up (pp - rank - 1)·2 + (V - 1)·group chunks, the group at
# least pp (schedules.py get_pp_rank_microbatches, core_v0.16.1): 141 one-layer chunks on the second
# rank of the 8,192-GPU run, 82 GiB. Meta's own schedule sets its group N freely (the paper's
# Figure 6: "N = 5") and ran it without recompute; jobctl models Megatron's.
_LLAMA3_REFUSED = {"llama3-405b-8192gpu-seq8192"}


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=(
    "82 GiB under Megatron's interleaved warm-up; Meta's schedule with its own micro-batch group ran it")))
    if r.id in _LLAMA3_REFUSED else r for r in _LLAMA3], ids=[r.id for r in _LLAMA3])
def test_llama3_405b_layouts_fit(row):
    fits, need = _fits(row)
    assert fits, f"{row.id}: {need:.1f} GiB"


# --- NVIDIA's performance summaries: FP8, MXFP8, NVFP4 and TP overlap (issue 29) -------------

DATA_2025 = ROOT / "benchmarks" / "data" / "published_throughput_2025.yaml"


def test_every_2025_row_names_its_source_quotes_it_and_says_where_its_settings_come_from():
    doc = yaml.safe_load(DATA_2025.read_text())
    for row in doc["rows"]:
        assert row["source"] in doc["sources"] and row.get("quote") and row["measured"], row["id"]
        # the settings the tables do not print were attached from the frameworks' recipes, or the
        # row says why it is not modelled
        assert any(f.startswith("settings: ") for f in row["inferred_fields"]), row["id"]


def test_megatron_bridge_rows_fuse_the_loss_with_transformer_engines_kernel_and_say_where():
    # every Megatron-Bridge release's perf scripts set cross_entropy_fusion_impl "te" over the
    # provider's cross_entropy_loss_fusion=True; each row carries the value with its path:line@tag
    doc = yaml.safe_load(DATA_2025.read_text())
    bridge = [r for r in doc["rows"] if r["source"] == "megatron_bridge_perf_summary"]
    assert bridge and all(r.get("fused_cross_entropy") == "te" for r in bridge)
    assert all(any(str(f).startswith("fused_cross_entropy te: ") and "gpt_provider.py:" in f
                   for f in r["inferred_fields"]) for r in bridge)
    moe = yaml.safe_load((DATA_2025.parent / "published_moe_release_settings.yaml").read_text())["rows"]
    assert all(r["cross_entropy_fusion"] == "te" and f"@{r['tag']}" in r["sources"]["cross_entropy_fusion"]
               for r in moe)
    assert {r.workload.fused_cross_entropy for r in _MOE[0]} == {"te"}


def test_the_2025_check_halves_meet_the_issue_targets():
    """Issue 29: step-time mean |error| at most 10% on the held-out half of Megatron-Bridge's and
    NeMo's rows, FP8 and low precision alike (the fit half chose the constants)."""
    rows, _ = load_rows(DATA_2025)
    scored = [r for r in rows if r.scored]
    assert len(scored) >= 40
    for source in ("megatron_bridge_perf_summary", "nemo_perf_summary_2407"):
        check = [r for r in scored if r.source == source and r.half == "check"]
        assert check, source
        mae = statistics.mean(abs(r.error) for r in check)
        assert mae <= 0.10, f"{source}: {mae:.1%} on {len(check)} held-out rows"
    formats = {r.workload.precision for r in scored if r.half == "check"}
    assert formats == {"fp8", "mxfp8", "nvfp4"}


def test_nemotron4_has_no_learned_position_table():
    # Nemotron-4 340B is gpt-shaped (squared-ReLU MLP of two matrices) with rotary positions
    # (NeMo's NemotronConfig: position_embedding_type "rope"); GPT-3 learns a 2048 x h table.
    # Its first stage holds the vocabulary's shard only: 256000 x 18432 / tp 8 parameters.
    rows = {r.id: r for r in load_rows(DATA_2025)[0]}
    assert rows["nemo-2407-nemotron4-340b-h100-fp8-128"].workload.model.max_seq_len == 0
    assert rows["nemo-2407-gpt3-175b-h100-fp8-128"].workload.model.max_seq_len == 2048
    from jobctl.planner.memory.breakdown import estimate_stage
    from jobctl.planner.catalog import lookup_gpu
    r = rows["nemo-2407-nemotron4-340b-h100-fp8-128"]
    first = estimate_stage(r.workload, lookup_gpu(r.gpu).memory_bytes, r.plan, "first")
    (weights,) = [t for t in first.terms if t.name == "weights"]
    assert weights.bytes == 256000 * 18432 // 8 * 2  # 2 B each (BF16), outside the FP8 layers


def _fits(row) -> tuple[bool, float]:
    from jobctl.planner.catalog import GIB, lookup_gpu
    from jobctl.planner.memory import estimate
    m = estimate(row.workload, lookup_gpu(row.gpu).memory_bytes, row.plan, 2048 * GIB, detail=False)
    return m.fits, m.total_bytes / GIB


_2025_ROWS = [r for r in load_rows(DATA_2025)[0] if r.scored]


@pytest.mark.parametrize("row", _2025_ROWS, ids=[r.id for r in _2025_ROWS])
def test_no_published_layout_is_called_does_not_fit(row):
    fits, need = _fits(row)
    assert fits, f"{row.id}: {need:.1f} GiB"


# NVIDIA's MoE rows (Megatron-Bridge's performance summaries 25.09-26.08; issue 31): the ones
# jobctl plans (Qwen3 MoE under Megatron-Core, a pipeline split it can express, the perf recipe's
# settings attached) are runnable by its memory model; the rest are left out with the reason.
DATA_MOE = ROOT / "benchmarks" / "data" / "published_moe_2025.yaml"
_MOE = load_moe_rows(DATA_MOE)


def test_the_moe_rows_quote_their_source_and_attach_their_settings():
    doc = yaml.safe_load(DATA_MOE.read_text())
    for row in doc["rows"]:
        assert row["source"] in doc["sources"] and row.get("quote") and row["measured"], row["id"]
        assert row.get("not_modelled") or any(str(x).startswith("settings: ") for x in row["inferred_fields"]), row["id"]
    rows, skipped = _MOE
    assert len(rows) + len(skipped) == len(doc["rows"])
    reasons = dict(skipped)
    # gpt-oss-120b (since its sinks, biases, windows and clamped GEGLU are rendered for Megatron):
    # scored, alternating halves among its own rows, its recompute of layernorm named as not modelled
    oss = sorted((r for r in rows if "gpt-oss" in r.id), key=lambda r: r.id)
    assert len(oss) >= 12 and [r.half for r in oss] == ["fit", "check"] * (len(oss) // 2) + ["fit"] * (len(oss) % 2)
    assert all(r.workload.model.sliding_window == 128 for r in oss)
    assert any("recompute of layernorm as none" in r.assumed for r in oss)
    # DeepSeek-V3 (issue 29): its 61 layers laid out over 4, 8 or 16 stages, each run's multi-token
    # prediction and recomputed modules as its row says (the 25.11 GB200 BF16 run trained no MTP
    # module; every run recomputes MLA's up-projection); its rows alternate halves among themselves
    rows = {r.id: r for r in _MOE[0]}
    deepseek = [r for r in rows.values() if "deepseek-v3" in r.id]
    assert len(deepseek) >= 12 and {r.plan.pp for r in deepseek} >= {4, 8, 16}
    assert rows["mbridge-2511-deepseek-v3-gb200-bf16-256"].workload.mtp_layers == 0
    assert rows["mbridge-2604-deepseek-v3-b200-mxfp8-256"].workload.mtp_layers == 1
    assert all(r.plan.recompute == "selective" and r.workload.recompute_modules[0] == "mla_up_proj" for r in deepseek)
    # two rows name the dense layers' MLP besides (each row's recompute_modules, as published)
    assert rows["mbridge-260401-deepseek-v3-b200-mxfp8-256"].workload.recompute_modules == ("mla_up_proj", "mlp")
    assert sum(r.workload.recompute_modules == ("mla_up_proj",) for r in deepseek) == len(deepseek) - 2
    halves = sorted(r.half for r in deepseek)
    assert halves == ["check"] * (len(deepseek) // 2) + ["fit"] * (len(deepseek) - len(deepseek) // 2)
    assert not any("deepseek-v3" in rid and "layers over pp" in why for rid, why in reasons.items())


def test_the_moe_check_half_meets_the_issue_target():
    """Issue 31: throughput of the published MoE layouts within 15% mean on the held-out half
    (the fit half chose MOE_HOST_S_PER_EXPERT and MOE_GEMM_EFFICIENCY: benchmarks/moe_step_time.py)."""
    check = [r for r in _MOE[0] if r.half == "check"]
    assert len(check) >= 18
    mae = statistics.mean(abs(r.error) for r in check)
    assert mae <= 0.15, f"{mae:.1%} on {len(check)} held-out rows"


# The tightest: the 25.09 run of Qwen3-30B-A3B on 16 H100 (pp 2, 24 virtual stages, micro-batch 2,
# Megatron-Core 0.14, padded token dropping), 77.5 GiB of the 78.6 usable once its FP8 experts and
# Transformer Engine's fused loss are counted as the release ran them (85.8 before).
@pytest.mark.parametrize("row", _MOE[0], ids=[r.id for r in _MOE[0]])
def test_no_published_moe_layout_is_called_does_not_fit(row):
    fits, need = _fits(row)
    assert fits, f"{row.id}: {need:.1f} GiB"


def test_each_moe_row_runs_with_its_own_releases_settings():
    # published_moe_release_settings.yaml, read from each release's perf configs: Qwen3-30B-A3B on 8
    # GB200 (MXFP8) ran Transformer Engine graphs of the router only and no all-to-all overlap in
    # 26.04 (v0.4.0), full-iteration graphs with the overlap from 26.06 (v0.5.0); the 26.02 H100
    # run asked for DeepEP, which its container lacked (known-issues.md), and is left out
    rows = {r.id: r for r in _MOE[0]}
    old, new = rows["mbridge-2604-qwen3-30b-a3b-gb200-mxfp8-8"], rows["mbridge-2606-qwen3-30b-a3b-gb200-mxfp8-8"]
    from jobctl.frameworks import ep_overlap
    assert (ep_overlap(old.workload, old.plan), old.workload.caps.moe_expert_launches) == (False, True)
    assert (ep_overlap(new.workload, new.plan), new.workload.caps.moe_expert_launches) == (True, False)
    assert old.workload.grad_reduce_dtype == new.workload.grad_reduce_dtype == "bf16"
    skipped = dict(_MOE[1])
    assert "DeepEP is not supported in the current NeMo framework 26.02 container" in \
        skipped["mbridge-2602-qwen3-30b-a3b-h100-fp8-16"]
    doc = yaml.safe_load((DATA_MOE.parent / "published_moe_release_settings.yaml").read_text())
    tags = {m["release"]: m["tag"] for m in doc["mapping"]}
    for rel in doc["rows"]:  # every value names the line of its release's code that set it
        assert rel["tag"] == tags[rel["release"]] or rel["tag"] == "r0.1.0", rel["id"]
        for field in ("dispatcher", "overlap_ep_comm", "cuda_graph_impl", "grad_reduce"):
            assert "@" in rel["sources"][field] and (rel["tag"] in rel["sources"][field]), (rel["id"], field)
