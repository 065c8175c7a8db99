"""Published, measured training throughputs as jobctl Workloads and Plans, with the step time each
source measured (issue 15; docs/step-time-accuracy.md).

The data (benchmarks/data/published_throughput.yaml in the jobctl repository) holds every row with
its source: Narayanan et al. 2021, Korthikanti et al. 2022, Megatron-Core's H100 table, the Llama 3
paper, torchtitan's H100 benchmarks, BLOOM, MosaicML llm-foundry. load_rows keeps the 16-bit rows
without torch.compile whose layout is stated, turns each published figure into a measured step
time by the source's own FLOPs convention, and splits the scored rows in two halves, alternating
within each source in id order: "fit" rows choose the efficiency constants, "check" rows only
check. benchmarks/step_time_accuracy.py prints the table; tests/test_step_time_accuracy.py holds
the targets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from jobctl import frameworks
from jobctl.planner.catalog import lookup_gpu
from jobctl.planner.memory import Workload
from jobctl.planner.models import ModelSpec
from jobctl.planner import inputs
from jobctl.planner.perf import Links, estimate_step
from jobctl.planner.plan import Plan


# GPU variants that differ from their catalog GPU: (memory, memory bandwidth GB/s) as their
# source prints them. torchtitan's 2024-25 H100 tables (benchmarks/llama3_h100_202412_torchtitan.md,
# "Hardware"): "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", "the default 500W power limit";
# 96 GB read as 96·10⁹ B, the smaller of the two readings (the driver's figure is not printed). The
# tensor-core peak at 500 W is not printed: the catalog's stays.
VARIANTS = {"h100-96gb-hbm2e-500w": (96 * 10**9, 2400)}


@dataclass
class Row:
    """One published run as jobctl models it: its Workload, Plan and links, and the step time
    its source measured."""

    id: str
    source: str
    framework: str
    gpu: str  # catalog key
    gpus: int
    link_gpus: int  # GPUs that talk over NVLink: a node, or the rack's domain (GB200 NVL72)
    workload: Workload
    plan: Plan
    links: Links
    measured_s: float
    how: str  # how the measured step time was derived
    assumed: list[str]
    half: str = ""
    scored: bool = True  # False: the source leaves out part of the configuration, or other hardware
    why_not_scored: str = ""
    unmodelled: list = field(default_factory=list)  # what the run did that jobctl does not model (MoE rows)
    memory_bytes: int = 0  # the GPU memory of the row's variant (VARIANTS); 0: the catalog GPU's

    @property
    def predicted_s(self) -> float:
        return estimate_step(self.workload, self.plan, self.links, self.link_gpus).step_time_s

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def megatron_flops(m: dict, batch: int, s: int) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py): model FLOPs
    of one step, non-causal attention, logits included, no recomputation."""
    h, layers, a, g, f, v = m["hidden"], m["layers"], m["heads"], m["kv_heads"], m["ffn_hidden"], m["vocab"]
    gated = 1.5 if m["family"] == "llama" else 1.0
    return 12 * batch * s * layers * h * h * ((1 + g / a + s / h) + f / h * gated + v / (2 * layers * h))


def narayanan_flops(m: dict, batch: int, s: int) -> float:
    """Narayanan et al. 2021, eq. (3): 96·B·s·l·h²·(1 + s/6h + V/16lh), recomputation included."""
    h, layers, v = m["hidden"], m["layers"], m["vocab"]
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def measured_step(r: dict) -> tuple[float, str] | None:
    """(the measured step time in seconds, how it was derived) of a data row, or None."""
    meas, m, p = r["measured"], r["model"], r["parallel"]
    s, gb, n = m["seq_len"], p["global_batch"], r["gpus"]
    if meas.get("step_time_s"):
        return float(meas["step_time_s"]), "step time as published"
    if meas.get("tokens_per_s"):
        return gb * s / meas["tokens_per_s"], "tokens/s as published"
    if meas.get("tokens_per_s_per_gpu"):
        return gb * s / (meas["tokens_per_s_per_gpu"] * n), "tokens/s per GPU as published"
    if meas.get("tflops_per_gpu"):
        if r["source"] == "narayanan2021":
            return narayanan_flops(m, gb, s) / (meas["tflops_per_gpu"] * 1e12 * n), "TFLOP/s by eq. (3)"
        return megatron_flops(m, gb, s) / (meas["tflops_per_gpu"] * 1e12 * n), "TFLOP/s by Megatron's formula"
    return None


GPUS_PER_NODE = {"gb200-186gb": 4}  # a GB200 compute tray: 2 Grace CPUs, 4 Blackwell GPUs
EAGER_SOURCES = ("narayanan2021", "megatron_readme_2021", "korthikanti2022", "bloom_tr11")
SHARDING = {"none": "none", "zero1": "zero1", "fsdp": "zero3", "fsdp-shard-grad-op": "zero2", None: "zero1"}
RECOMPUTE = {"full": "full", "selective": "selective", "op-sac": "selective", "none": "none", None: "none"}


def _links(gpu, precision: str, fp8_recipe: str | None = None, fp8_backend: str = "transformer-engine") -> Links:
    """A catalog GPU's links and fitted efficiencies, as the planner builds them for a
    partition that says nothing of its own."""
    return inputs.links(None, gpu, precision, fp8_recipe, fp8_backend)


def _learned_positions(m: dict) -> bool:
    """A row's model has learned absolute position embeddings (seq_len x hidden parameters): the
    gpt family unless the row says otherwise (Nemotron-4 is gpt-shaped with rotary positions)."""
    return m["family"] == "gpt" and m.get("position_embedding", "learned_absolute") == "learned_absolute"


def load_rows(path) -> tuple[list[Row], list[tuple[str, str]]]:
    """The rows of a published_throughput.yaml (benchmarks/data/ in the jobctl repository) that
    can be modelled, each with its halves ("fit" or "check"), and (id, why) for the rest."""
    doc = yaml.safe_load(Path(path).read_text())
    rows, skipped = [], []
    for r in doc["rows"]:
        p, m = r["parallel"], r["model"]
        # 16-bit rows are modelled as bf16-mixed (fp16 runs at the same tensor-core rate)
        precision = r.get("precision") if r.get("precision") in ("fp8", "mxfp8", "nvfp4") else "bf16-mixed"
        # torchtitan's Float8 as jobctl renders it: torchtitan 0.3.0 offers row-wise scaling only
        rowwise = r["framework"] == "torchtitan" and precision == "fp8" and r.get("fp8_recipe") == "rowwise"
        if (r.get("compile") and r["framework"] != "torchtitan") or (
                precision != "bf16-mixed" and r["framework"] != "megatron" and not rowwise):
            skipped.append((r["id"], "torch.compile outside torchtitan, or low precision outside Megatron-Core and "
                                     "torchtitan's row-wise Float8 (not modelled)"))
            continue
        if r.get("gpu") is None:
            skipped.append((r["id"], "GPU not stated"))
            continue
        if p.get("tp") is None or p.get("pp") is None:
            skipped.append((r["id"], "tensor/pipeline sizes not stated"))
            continue
        got = measured_step(r)
        if got is None:
            skipped.append((r["id"], "no throughput figure"))
            continue
        assumed = []
        family = m["family"]
        model = ModelSpec(name=m.get("name") or r["id"], family=family, layers=m["layers"], hidden=m["hidden"],
                          ffn_hidden=m["ffn_hidden"], heads=m["heads"], kv_heads=m.get("kv_heads") or m["heads"],
                          vocab=m["vocab"], max_seq_len=m["seq_len"] if _learned_positions(m) else 0)
        framework = {"meta-internal": "megatron"}.get(r["framework"], r["framework"])
        if r["framework"] == "meta-internal":
            assumed.append("Meta's stack modelled as Megatron's schedule (without Transformer Engine's GEMM efficiency)")
        tp, pp, dp, cp = p["tp"], p["pp"], p["dp"], p.get("cp") or 1
        gb = p["global_batch"]
        mbs = p.get("micro_batch")
        if mbs is None:
            mbs = 1
            assumed.append("micro-batch 1")
        vp = p.get("vp")
        if vp is None:
            vp = 1
            if pp > 1:
                assumed.append("no interleaving")
        sharding = SHARDING[p.get("sharding")]
        if r["source"] == "llama3_2024":
            sharding = "zero2"  # "shards optimizer states and gradients, not parameters after forward"
        if p.get("sharding") is None:
            assumed.append("distributed optimizer (zero1)")
        if p.get("recompute") is None:
            assumed.append("no recompute")
        if precision == "fp8" and r.get("fp8_recipe") is None:
            assumed.append("fp8 scaling recipe (tensorwise)")
        sp = p.get("sequence_parallel")
        if sp is None:
            sp = tp > 1
            assumed.append(f"sequence parallel {'on' if sp else 'off'}")
        # FlashAttention (2022) postdates these runs: Megatron-LM then fused the softmax but
        # still materialised the a·s² scores
        attention = "eager" if r["source"] in EAGER_SOURCES else "flash"
        fw = frameworks.get(framework)
        if fw.caps.tp_comm_overlap and not r.get("tp_comm_overlap"):  # the run did not overlap TP traffic
            fw = fw.with_caps(tp_comm_overlap=False)
        if fw.caps.async_tp and not p.get("async_tp"):  # compiled without torchtitan's async TP
            fw = fw.with_caps(async_tp=False)
        w = Workload(model, m["seq_len"], gb, precision=precision, framework=fw, attention=attention,
                     fp8_recipe=r.get("fp8_recipe") or "tensorwise", grad_reduce=r.get("grad_reduce") or "fp32",
                     formats=lookup_gpu(r["gpu"]).formats, compile=bool(r.get("compile")),
                     fused_cross_entropy=r.get("fused_cross_entropy") or False)
        gpu = lookup_gpu(r["gpu"])
        gpn = min(GPUS_PER_NODE.get(r["gpu"], 8), r["gpus"])
        plan = Plan(r["gpus"] // gpn, gpn, tp, pp, dp, cp, sharding, mbs, gb // (dp * mbs), gb,
                    RECOMPUTE[p.get("recompute")], "none", sp, vp, 0, p.get("recompute_layers") or 0)
        links = _links(gpu, precision, w.fp8_recipe, w.caps.fp8_backend)
        if r["framework"] == "meta-internal":
            links = dataclasses.replace(links, te_gemm_efficiency=0.0)
        link_gpus = max(gpn, min(gpu.nvlink_domain_gpus, r["gpus"]))
        row = Row(r["id"], r["source"], r["framework"], r["gpu"], r["gpus"], link_gpus, w, plan, links, got[0], got[1],
                  assumed)
        if r.get("not_modelled"):
            row.scored, row.why_not_scored = False, r["not_modelled"]
        elif assumed:
            row.scored, row.why_not_scored = False, "configuration incomplete: " + ", ".join(assumed)
        elif r.get("gpu_variant"):
            row.scored, row.why_not_scored = False, f"other hardware: {r['gpu_variant']}"
        if r.get("gpu_variant") in VARIANTS:
            row.memory_bytes, bandwidth = VARIANTS[r["gpu_variant"]]
            row.links = dataclasses.replace(row.links, mem_bandwidth_gbs=bandwidth)
        rows.append(row)
    # the halves: alternate within each source, in id order (the scored rows, and apart from them
    # the reference rows, which a fit may use under their stated assumptions)
    by_source: dict[tuple[str, bool], list[Row]] = {}
    for row in rows:
        by_source.setdefault((row.source, row.scored), []).append(row)
    for group in by_source.values():
        for i, row in enumerate(sorted(group, key=lambda x: x.id)):
            row.half = "fit" if i % 2 == 0 else "check"
    return rows, skipped


# Megatron-Bridge's MoE settings jobctl does not model (each row of published_moe_2025.yaml says
# which it ran): the run is scored as jobctl would plan it, and the table names these beside it.
# Models whose rows were scored after the MoE constants were fitted (issue 29: DeepSeek-V3, once its
# pipeline layout, multi-token prediction and recomputed modules were modelled): their rows
# alternate between the halves among themselves, so that adding them leaves the halves the
# constants were fitted on as they were; no fit has seen them yet. gpt-oss-120b's since its
# sinks, biases, windows and clamped GEGLU are rendered for Megatron (issue 29).
SCORED_AFTER_FIT = ("deepseek-v3", "gpt-oss-120b")
MOE_UNMODELLED = (("dispatcher", lambda v: v not in (None, "alltoall", "flex-hybridep", "flex-deepep"), "dispatcher"),
                  ("cuda_graphs", lambda v: v not in (None, "none"), "graphs"),
                  ("fused_grouped_mlp", bool, "fused MLP"),
                  ("paged_stash", lambda v: v not in (None, "none"), "stash"))


# The settings each Qwen3 row's own Megatron-Bridge release ran with (read per release tag; the
# file's header says how), which replace the attached recipe's of today; they also describe rows
# whose layout today's recipes lack and the 25.09 token-dropping runs (capacity factor 1.0 with
# padding: each expert computes exactly its balanced share).
RELEASE_SETTINGS = "published_moe_release_settings.yaml"
# CUDA graphs that capture the routed experts: Megatron-Bridge's full-iteration graph, and
# Megatron-Core 0.14's layer-wise graphs of whole layers (enable_cuda_graph, scope "full": the
# 25.09 token-dropping runs, whose padded shapes are static); Transformer Engine's scoped graphs
# (attn, moe_router, moe_preprocess) leave the experts' GEMMs to the host
EXPERTS_GRAPHED = ("full_iteration", "local:full")
RELEASE_DESCRIBES = ("no Megatron-Bridge perf recipe", "token-dropping run (table label 'Qwen3")


def _release_settings(path: Path) -> dict:
    if not path.exists():
        return {}
    return {r["id"]: r for r in yaml.safe_load(path.read_text())["rows"]}


def _as_moe_settings(rel: dict) -> dict:
    """A release's settings in published_moe_2025.yaml's moe_settings terms."""
    impl, scope = rel["cuda_graph_impl"] or "none", rel.get("cuda_graph_scope")
    scope = scope if isinstance(scope, str) else ",".join(scope or [])
    graphs = impl if impl in ("none", "full_iteration") else f"{impl}:{scope}"
    stash = rel["paged_stash"] if rel["paged_stash"] in ("cuda", "cuda+host") else "none"
    return {"dispatcher": "alltoall" if rel["dispatcher"] == "alltoall" else f"flex-{rel['flex_backend']}",
            "overlap_ep_comm": bool(rel["overlap_ep_comm"]), "cuda_graphs": graphs, "paged_stash": stash,
            "fused_grouped_mlp": bool(rel.get("fused_grouped_mlp")),
            "fused_cross_entropy": rel.get("cross_entropy_fusion") or False}


def load_moe_rows(path) -> tuple[list[Row], list[tuple[str, str]]]:
    """The rows of published_moe_2025.yaml (benchmarks/data/ in the jobctl repository) that
    jobctl can plan (its MoE presets, under Megatron-Core, with the recipe's settings attached),
    each with its half, and (id, why) for the rest. Selective recompute of named modules is
    modelled as the row names them where jobctl models the module (Megatron's
    caps.recompute_modules: core_attn, mla_up_proj, moe_act, mlp, shared_experts); the others
    (layernorm, moe) as none, and `assumed` says which rows had them."""
    from jobctl.planner.memory import stage_layers
    from jobctl.planner.models import PRESETS

    doc = yaml.safe_load(Path(path).read_text())
    releases = _release_settings(Path(path).with_name(RELEASE_SETTINGS))
    rows, skipped = [], []
    for r in doc["rows"]:
        rel = releases.get(r["id"])
        why = r.get("not_modelled")
        if why and not (rel and why.startswith(RELEASE_DESCRIBES)):
            skipped.append((r["id"], why))
            continue
        if rel and (rel.get("not_modelled") or not rel["layout_match"]):
            skipped.append((r["id"], rel.get("not_modelled") or f"the {rel['release']} release's perf preset has another "
                                     f"layout than the row prints ({rel['values_confidence']})"))
            continue
        model = PRESETS.get(r.get("model") or "")
        if model is None:
            skipped.append((r["id"], f"{r.get('model') or r.get('model_other')}: not a jobctl preset"))
            continue
        p, s = dict(r["parallel"]), dict(r.get("moe_settings") or {})
        if model.mtp_layers:  # the run's multi-token-prediction modules (Megatron-Bridge's mtp_num_layers)
            model = dataclasses.replace(model, mtp_layers=int(s.get("mtp_layers") or 0))
        if rel:  # what the row's own release ran, not today's recipe
            s.update(_as_moe_settings(rel))
            p["sequence_parallel"] = rel["sequence_parallel"]
            p["recompute"] = rel["recompute"].split(" ")[0]
            r = dict(r, tp_comm_overlap=rel["tp_comm_overlap"], grad_reduce=rel["grad_reduce"])
        if stage_layers(model.layers, p["pp"]) is None:
            skipped.append((r["id"], f"{model.layers} layers over pp={p['pp']}: no split jobctl can lay out"))
            continue
        assumed = []
        if s.get("token_drop"):
            assumed.append("capacity factor 1.0, padded, as a balanced dropless router (the same tokens per expert)")
        # selective recompute of the named modules jobctl models (--recompute-modules); the others as kept
        named = tuple(p.get("recompute_modules") or ()) if p.get("recompute") == "selective" else ()
        modelled = tuple(x for x in named if x in frameworks.get("megatron").caps.recompute_modules)
        if set(named) - set(modelled):
            assumed.append("recompute of " + "+".join(x for x in named if x not in modelled) + " as none")
        recompute = "selective" if modelled else {"selective": "none", "full": "full", "none": "none",
                                                  None: "none"}[p.get("recompute")]
        precision = r["precision"] if r["precision"] in ("fp8", "mxfp8", "nvfp4") else "bf16-mixed"
        fw = frameworks.get("megatron")
        if not r.get("tp_comm_overlap"):
            fw = fw.with_caps(tp_comm_overlap=False)
        if s.get("cuda_graphs") in EXPERTS_GRAPHED:  # replayed: no host launches per expert
            fw = fw.with_caps(moe_expert_launches=False)
        gpu = lookup_gpu(r["gpu"])
        seq, gb = r["seq_len"], p["global_batch"]
        w = Workload(model, seq, gb, precision=precision, framework=fw, fp8_recipe=r.get("fp8_recipe") or "tensorwise",
                     grad_reduce=r.get("grad_reduce") or "fp32", formats=gpu.formats,
                     # every release's perf scripts fuse the loss with Transformer Engine's kernel
                     # (perf_recipes/_common.py _benchmark_common, cross_entropy_impl="te" @067f987df0;
                     # the Qwen3 rows' own releases: published_moe_release_settings.yaml)
                     fused_cross_entropy=s.get("fused_cross_entropy") or "te",
                     # jobctl turns the combined schedule on wherever Megatron accepts it; off
                     # where the row's release did not (as a recipe's train.ep_overlap: false)
                     ep_overlap="auto" if s.get("overlap_ep_comm") else False,
                     moe_dispatcher={"flex-hybridep": "hybridep", "flex-deepep": "deepep"}.get(s.get("dispatcher"),
                                                                                            "alltoall"),
                     nvlink_gpus=gpu.nvlink_domain_gpus, recompute_modules=modelled)
        gpn = min(GPUS_PER_NODE.get(r["gpu"], 8), r["gpus"])
        tp, pp, dp, cp, mbs = p["tp"], p["pp"], p["dp"], p.get("cp") or 1, p["micro_batch"]
        plan = Plan(r["gpus"] // gpn, gpn, tp, pp, dp, cp, "zero1", mbs, gb // (dp * mbs), gb, recompute, "none",
                    bool(p.get("sequence_parallel")), p.get("vp") or 1, 0, p.get("recompute_layers") or 0,
                    p.get("ep") or 1)
        links = _links(gpu, precision)
        link_gpus = max(gpn, min(gpu.nvlink_domain_gpus, r["gpus"]))
        measured = gb * seq / (r["measured"]["tokens_per_s_per_gpu"] * r["gpus"])
        row = Row(r["id"], r["source"], "megatron", r["gpu"], r["gpus"], link_gpus, w, plan, links, measured,
                  "tokens/s per GPU as published", assumed)
        row.unmodelled = [label for key, on, label in MOE_UNMODELLED if on(s.get(key))]
        rows.append(row)
    for group in (None, *SCORED_AFTER_FIT):  # the first rows, then each later model's among themselves
        later = [x for x in rows if (x.workload.model.name if x.workload.model.name in SCORED_AFTER_FIT else None)
                 == group]
        for i, row in enumerate(sorted(later, key=lambda x: x.id)):
            row.half = "fit" if i % 2 == 0 else "check"
    return rows, skipped
