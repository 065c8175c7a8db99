"""The step-time model against published measurements (issue 15; docs/step-time-accuracy.md).

The measured values are the sources' own (benchmarks/data/published_throughput.yaml, each row
with its source and the row as printed; read by jobctl_measure/published_throughput.py); the
targets are the issue's."""

import statistics
from pathlib import Path

import pytest
import yaml

from jobctl_measure.published_throughput import load_rows

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
