"""torchtitan's Float8 as jobctl plans it (issue 29): precision fp8 under torchtitan 0.3.0 is
torchao's row-wise Float8, turned on by torchtitan's own Float8LinearConverter in a registry config
module jobctl writes into the job's framework folder.

Expectations from outside jobctl: torchtitan 0.3.0's Float8LinearConverter.Config offers the
recipes "rowwise" (its default) and "rowwise_with_gw_hp" (components/quantization/float8.py);
torchao's row-wise Float8Linear saves the 16-bit input and weight for backward
(float8/float8_linear.py matmul_with_hp_or_float8_args: ctx.save_for_backward(input_hp,
weight_hp_t)) and keeps no FP8 copy of a weight between GEMMs; the measured speed-ups are
torchtitan's async-TP table (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, each row quoted
in benchmarks/data/published_throughput.yaml). The framework's own acceptance of the rendered module
is tests/test_framework_configs.py (the torchtitan checker)."""

import os
import sys
from pathlib import Path

import pytest

from jobctl.jobs.environment import train_environment
from jobctl.model import FRAMEWORK_ON_PYTHONPATH
from jobctl.planner import inputs
from jobctl.planning import load_inventory, load_recipe, plan_on
from jobctl.runtime.runner import NodeRunner
from jobctl_measure.published_throughput import load_rows

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import step_time_accuracy as sta  # noqa: E402


def _plan(recipe, overrides, cluster="h100", inventory=()):
    rec = load_recipe(f"recipes/{recipe}.yaml", list(overrides))
    return plan_on(rec, load_inventory(cluster, list(inventory)), alternatives=0, summary=False, learn=False).to_dict()


def test_fp8_under_torchtitan_defaults_to_its_converters_rowwise_scaling():
    rec = load_recipe("recipes/llama8b.yaml", ["train.precision=fp8"])  # framework torchtitan
    assert inputs.workload(rec.value).fp8_recipe == "rowwise"
    assert train_environment(rec.value)["JOBCTL_FP8_RECIPE"] == "rowwise"
    # Megatron's stays per-tensor current scaling (Megatron-Bridge's FP8-CS runs)
    mega = load_recipe("recipes/llama70b.yaml", ["train.precision=fp8"])
    assert inputs.workload(mega.value).fp8_recipe == "tensorwise"


def test_scalings_a_framework_does_not_run_are_refused_with_what_it_offers():
    d = _plan("llama8b", ["train.precision=fp8", "train.fp8_recipe=tensorwise"])
    assert not d["feasible"]
    assert any("fp8_recipe=tensorwise" in r and "rowwise" in r for r in d["reasons"]), d["reasons"]
    d = _plan("llama70b", ["train.precision=fp8", "train.fp8_recipe=rowwise"])  # Megatron: no row-wise FP8
    assert not d["feasible"]
    assert any("fp8_recipe=rowwise" in r for r in d["reasons"]), d["reasons"]


def test_fp8_is_refused_where_the_converter_would_not_reach():
    # the grouped experts are not Linear layers: Float8LinearConverter leaves them in 16 bits
    d = _plan("qwen3-30b-a3b", ["framework=torchtitan", "train.precision=fp8"])
    assert not d["feasible"]
    assert any("grouped experts" in r for r in d["reasons"]), d["reasons"]
    # ... nor does MXFP8LinearConverter
    d = _plan("qwen3-30b-a3b", ["framework=torchtitan", "train.precision=mxfp8"], cluster="b200")
    assert not d["feasible"]
    assert any("MXFP8LinearConverter" in r and "grouped experts" in r for r in d["reasons"]), d["reasons"]
    # NVFP4 has a converter of its own in torchtitan, which jobctl does not render
    d = _plan("llama8b", ["train.precision=nvfp4"], cluster="b200")
    assert not d["feasible"]
    assert any("not rendered yet" in r for r in d["reasons"]), d["reasons"]


LAYOUT = ["framework=torchtitan", "parallelism.tp=8", "parallelism.pp=1", "parallelism.dp=16", "parallelism.cp=1",
          "parallelism.sharding=zero3", "parallelism.micro_batch_size=1", "parallelism.recompute=full"]


def test_rowwise_float8_holds_what_bf16_holds():
    """Row-wise Float8 casts each weight at its GEMM and saves the 16-bit operands (torchao), so
    under full recompute (each block keeps its input only) the same layout needs the same memory
    as in BF16, term by term; Transformer Engine's FP8 under Megatron keeps FP8 weight copies
    (the contrast the model draws). Compiled under TP without recompute, the partitioner keeps
    the FP8 casts of wo's, w1's, w2's and w3's shards and their scales, and keeps the two
    all-gathered norm outputs in FP8 and one SwiGLU tensor fewer than compiled BF16 (measured:
    tests/test_compiled_activations.py); at 70B, TP 8, s 8,192, micro-batch 1 that is less."""
    bf16 = _plan("llama70b", LAYOUT)
    fp8 = _plan("llama70b", [*LAYOUT, "train.precision=fp8"])
    assert bf16["feasible"] and fp8["feasible"]
    assert fp8["plan"] == bf16["plan"]
    terms = lambda d: {t["name"]: t["bytes"] for t in d["memory"]["terms"]}  # noqa: E731
    assert terms(fp8) == terms(bf16)
    none = [*LAYOUT[:-1], "parallelism.recompute=none", "train.global_batch_size=16"]
    bf16, fp8 = _plan("llama70b", none), _plan("llama70b", [*none, "train.precision=fp8"])
    h, f, s, t = 8192, 28672, 8192, 8
    weights = (h * h + 3 * h * f) / t + 16 * h + 2 * f / t  # per layer, with the scales
    less = 2 * s * h * 1 + s * f / t * 2  # two gathered inputs 1 B smaller; the product (2 B)
    gained = terms(fp8)["layer activations"] - terms(bf16)["layer activations"]
    assert gained == pytest.approx(80 * (weights - less))  # 80 layers, one micro-batch in flight
    assert gained < 0
    mega = _plan("llama70b", ["train.precision=fp8"])
    assert any("fp8 weight" in t["name"] for t in mega["memory"]["terms"])


def test_the_rendered_module_wraps_the_registry_config_with_the_converter():
    d = _plan("llama70b", [*LAYOUT, "train.precision=fp8"])
    fw = d["framework"]
    ((name, text),) = fw["files"].items()
    assert name == "jobctl_torchtitan_float8.py"
    assert "--module=jobctl_torchtitan_float8" in fw["args"] and "--config=llama3_70b_float8" in fw["args"]
    assert "from torchtitan.models.llama3.config_registry import llama3_70b as registry_config" in text
    assert 'recipe_name="rowwise", filter_fqns=["lm_head"]' in text
    assert "model_compile_enabled=True" in text  # train.compile auto: compiled on GPUs
    assert fw["env"] == {FRAMEWORK_ON_PYTHONPATH: "1"}
    # a BF16 plan names torchtitan's own config and writes no module
    bf16 = _plan("llama70b", LAYOUT)["framework"]
    assert not bf16["files"] and "--config=llama3_70b" in bf16["args"]


def test_registry_config_by_name_and_shape():
    """A recipe names its model as it likes ("Llama 3.1 8B", "meta-llama-3-70b"); torchtitan's
    llama3_8b / llama3_70b are taken only where the shape is theirs (torchtitan 0.3.0
    models/llama3/__init__.py: _8b dim 4096, 32 layers, 32 heads, 8 KV heads, hidden
    compute_ffn_hidden_dim(4096, multiple_of=1024, ffn_dim_multiplier=1.3) = 1024·ceil(1.3·10922/1024)
    = 14336; _70b dim 8192, 80 layers, 64 heads, 8 KV heads, 4096·ceil(1.3·21845/4096) = 28672;
    vocab 128256)."""
    import dataclasses
    from jobctl.frameworks.torchtitan import registry_config
    from jobctl.planner.models import PRESETS
    l8, l70 = PRESETS["llama3.1-8b"], PRESETS["llama3.1-70b"]
    assert (l8.ffn_hidden, l70.ffn_hidden) == (1024 * -(-int(1.3 * 10922) // 1024), 4096 * -(-int(1.3 * 21845) // 4096))
    for name in ("Llama 3.1 8B", "meta-llama-3-8b", "llama3_8b", "LLAMA-3.1-8B"):
        assert registry_config(dataclasses.replace(l8, name=name)) == ("llama3", "llama3_8b"), name
    assert registry_config(dataclasses.replace(l70, name="Llama 3 70B")) == ("llama3", "llama3_70b")
    # named like one, another shape: not torchtitan's config (its own would train another model)
    assert registry_config(dataclasses.replace(l8, name="Llama 3.1 8B", layers=40)) is None
    assert registry_config(dataclasses.replace(l70, name="llama3-8b")) is None
    assert registry_config(dataclasses.replace(l8, name="mistral-8b")) is None


B200_LAYOUT = ["framework=torchtitan", "parallelism.tp=2", "parallelism.pp=1", "parallelism.dp=64",
               "parallelism.cp=1", "parallelism.sharding=zero3", "parallelism.micro_batch_size=1",
               "parallelism.recompute=full"]


def test_mxfp8_is_torchtitans_converter_over_every_linear_and_holds_what_bf16_holds():
    """torchtitan's MXFP8 (torchao's MXFP8Linear, which saves the 16-bit input and weight:
    prototype/moe_training/mxfp8_linear.py mx_mm) on B200: the module converts every Linear, as
    torchtitan's own llama3_8b_mxfp8 does; the same layout's memory is BF16's, term by term, and
    its GEMMs run at BF16's rate (no published torchtitan MXFP8 run among jobctl's sources), which
    the plan says; Megatron's MXFP8 (Transformer Engine) keeps weight copies and has a fitted rate."""
    mx = _plan("llama70b", [*B200_LAYOUT, "train.precision=mxfp8"], cluster="b200")
    bf16 = _plan("llama70b", B200_LAYOUT, cluster="b200")
    assert mx["feasible"] and bf16["feasible"] and mx["plan"] == bf16["plan"]
    fw = mx["framework"]
    ((name, text),) = fw["files"].items()
    assert name == "jobctl_torchtitan_mxfp8.py"
    assert "--module=jobctl_torchtitan_mxfp8" in fw["args"] and "--config=llama3_70b_mxfp8" in fw["args"]
    assert "MXFP8LinearConverter.Config(model_compile_enabled=True)" in text  # no fqns: every Linear
    terms = lambda d: {t["name"]: t["bytes"] for t in d["memory"]["terms"]}  # noqa: E731
    assert terms(mx) == terms(bf16)
    assert mx["estimate"]["step_time_s"] == bf16["estimate"]["step_time_s"]
    (warning,) = mx["warnings"]
    assert "BF16 rate" in warning and "keeps no weight copies" in warning
    mega = _plan("llama70b", ["train.precision=mxfp8"], cluster="b200")
    assert any("mxfp8 weight" in t["name"] for t in mega["memory"]["terms"]) and not mega.get("warnings")


def test_the_runner_puts_the_framework_folder_on_pythonpath_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/user/lib")
    runner = NodeRunner(str(tmp_path), 1, 1, 1, {FRAMEWORK_ON_PYTHONPATH: "1"}, ["python", "x.py"], "none")
    parts = runner.environment(0)["PYTHONPATH"].split(os.pathsep)
    # jobctl's sitecustomize first (its hooks), then the rendered module's folder, then the user's
    assert parts[1:] == [str(tmp_path / "framework"), "/user/lib"]
    plain = NodeRunner(str(tmp_path), 1, 1, 1, {}, ["python", "x.py"], "none")
    assert str(tmp_path / "framework") not in plain.environment(0)["PYTHONPATH"]


@pytest.fixture(scope="module")
def rows():
    return load_rows(sta.DATA)[0]


def test_rowwise_float8_pairs_measured_by_torchtitan_within_10_percent(rows):
    """The check half of the row-wise pairs (BF16 -> row-wise Float8 on the same H100s, both
    compiled): the predicted speed-up within 10% of the measured one. Measured: 70B with async TP
    652.4 -> 624.8 tokens/s per GPU (0.958x); 8B without it 4378 -> 3708.5 (0.847x)."""
    got = sta.pair_speedups(rows, sta.FLOAT8_PAIRS["check"])
    assert [round(m, 3) for _, m, _ in got] == [round(624.8 / 652.4, 3), round(3708.5 / 4378, 3)]
    for pair, measured, predicted in got:
        assert predicted == pytest.approx(measured, rel=0.10), pair


def test_the_plan_says_what_rowwise_float8_measured_and_where_it_is_not_fitted():
    # H100: fitted, and the measured pairs (above) ran 0.81x-1.00x of BF16: the plan says so
    (h100,) = _plan("llama8b", ["train.precision=fp8"])["warnings"]
    assert "no faster than BF16" in h100 and "0.81x-1.00x" in h100
    # B200: no row-wise measurement, so BF16's rate, and no Transformer Engine weight copies claimed
    (b200,) = _plan("llama8b", ["train.precision=fp8"], cluster="b200")["warnings"]
    assert "BF16 rate" in b200 and "keeps no weight copies" in b200 and "Transformer Engine" not in b200
