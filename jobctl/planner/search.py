"""Enumerate layouts (TP x PP x CP x DP x interleaving x sharding x micro-batch x recompute x
offload), keep those that fit, estimate each one's step time, and rank them by an objective.

Objectives (see `rank`):
- "balanced" (the default): the fastest plan on the GPUs the user has, as long as more GPUs still
  pay: the shortest step among the plans whose tokens/s per GPU is at least SCALING_EFFICIENCY of
  the best per-GPU throughput. Layouts span whole nodes or divide one node; a plan takes part of
  a node only when no whole-node plan is faster (a toy model), never to save per-GPU throughput;
- "throughput": the best tokens/s per GPU (the cheapest GPU-hours), then the fewest nodes within
  THROUGHPUT_TOLERANCE of it;
- "time": the fastest wall time, whatever it costs;
- "gpus": the fewest GPUs that fit, then the fastest.
"""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass, field

from jobctl import frameworks
from jobctl.frameworks.base import LOW_PRECISIONS, StateRecipe
from jobctl.planner.catalog import GIB
from jobctl.planner.memory import Workload, stage_layers
from jobctl.planner.space import (  # noqa: F401  (re-exported: the search's vocabulary)
    KNOB_COST,
    MAX_VIRTUAL_STAGES,
    MIN_CP_TOKENS,
    SMALL_BUBBLE,
    Candidate,
    Constraints,
    Evaluations,
    Layout,
    Outcome,
    Target,
    divisors,
    faster,
    knob_cost,
    knob_options,
    layouts,
    virtual_stage_options,
)

OBJECTIVES = ("balanced", "throughput", "time", "gpus")
DEFAULT_OBJECTIVE = "balanced"
# "balanced": more GPUs pay while each still delivers this share of the best tokens/s per GPU.
SCALING_EFFICIENCY = 0.90
# "throughput": among plans within this fraction of the best tokens/s per GPU, the fewest nodes.
THROUGHPUT_TOLERANCE = 0.03

AUTO = "auto"
MAX_CP = 32


@dataclass
class SearchResult:
    target: Target
    best: Candidate | None
    feasible: list[Candidate] = field(default_factory=list)
    considered: int = 0
    feasible_count: int = 0
    rejected: Counter = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)  # why nothing fits / why a pin is impossible
    closest: Candidate | None = None  # the smallest-memory layout that did not fit
    objective: str = DEFAULT_OBJECTIVE
    ranked: list[Candidate] = field(default_factory=list)  # best first, one per layout
    smallest: dict = field(default_factory=dict)  # (dimension, value) -> least memory seen (bytes)
    refused: Counter = field(default_factory=Counter)  # the framework's reason -> plans it refused that fit
    # the layouts and their evaluations, for other searches of the same space (other objectives,
    # pinned dimensions) to share
    evaluations: Evaluations | None = None

    @property
    def feasible_ok(self) -> bool:
        return self.best is not None


def pinned_problems(w: Workload, t: Target, c: Constraints) -> list[str]:
    """Pins that can never work, with the arithmetic (exit 3)."""
    m = w.model
    out = []
    if c.tp is not None:
        if m.heads % c.tp:
            out.append(f"tp={c.tp} does not divide the attention heads: {m.heads} % {c.tp} = {m.heads % c.tp}")
        if m.kv_heads % c.tp:
            out.append(f"tp={c.tp} does not divide the KV heads: {m.kv_heads} % {c.tp} = {m.kv_heads % c.tp}")
        if c.tp > t.nvlink_gpus and t.nvlink_gpus > t.gpus_per_node:
            out.append(f"tp={c.tp} crosses the NVLink domain: one of {t.partition} spans {_gpus(t.nvlink_gpus)}; "
                       "tensor parallelism must stay inside it")
        elif c.tp > t.nvlink_gpus:
            out.append(f"tp={c.tp} crosses the node boundary: a node of {t.partition} has {_gpus(t.gpus_per_node)}; "
                       "tensor parallelism must stay inside a node")
    if c.pp is not None and not stage_layers(m.layers, c.pp):
        per_rank = -(-m.layers // c.pp)
        out.append(f"pp={c.pp} cannot split {m.layers} layers: {m.layers} % {c.pp} = {m.layers % c.pp}, shortening "
                   f"the first and last stage by one layer does not make it even either, and {per_rank} per stage "
                   f"leave the last none ({c.pp - 1} x {per_rank} >= {m.layers})")
    caps = w.caps
    for what, value, offered in (("optimizer", w.optimizer, caps.optimizers), ("method", w.method, caps.methods),
                                 ("precision", w.precision, caps.precisions)):
        if value not in offered:
            why = f"; {caps.low_precision_note}" if what == "precision" and caps.low_precision_note and \
                value in LOW_PRECISIONS else ""
            out.append(f"train.{what}={value}: framework {caps.name} does not run it (it offers "
                       f"{', '.join(offered)}){why}")
    if w.precision == "fp8" and w.precision in caps.precisions and w.fp8_recipe not in caps.fp8_recipes:
        out.append(f"train.fp8_recipe={w.fp8_recipe}: framework {caps.name} does not run it (it offers "
                   f"{', '.join(caps.fp8_recipes)})")
    if w.framework.recipe_problems is not None:
        out += w.framework.recipe_problems(w)
    if w.grad_reduce == "bf16" and caps.state_recipe is not StateRecipe.MEGATRON:
        out.append(f"train.grad_reduce=bf16 is Megatron's --grad-reduce-in-bf16: jobctl renders and models it for "
                   f"megatron only, not {caps.name} (remove it, or use framework: megatron)")
    out += _moe_problems(w, t, c)
    out += _layer_variant_problems(w)
    if w.cuda_graphs is True and not caps.cuda_graphs:
        out.append(f"train.cuda_graphs=true: jobctl renders and models a CUDA-graphed step for torchtitan only, not "
                   f"{caps.name} (use auto or false)")
    if w.cuda_graphs is True and caps.cuda_graphs and ((c.pp or 1) > 1 or (c.ep or 1) > 1):
        out.append("train.cuda_graphs=true: torchtitan captures no CUDA graph under pipeline or expert parallelism "
                   "(trainer.py _validate_cuda_graphs): unpin pp/ep or use auto")
    if w.fused_cross_entropy == "te" and not caps.te_cross_entropy:
        out.append(f"train.fused_cross_entropy=te is Megatron's --cross-entropy-fusion-impl te (Transformer Engine's "
                   f"kernel): jobctl renders and models it for megatron only, not {caps.name} (use true or false)")
    if w.ep_overlap is True and not caps.ep_overlap:
        out.append(f"train.ep_overlap=true is Megatron's --overlap-moe-expert-parallel-comm: jobctl renders and models "
                   f"it for megatron only, not {caps.name} (use auto or false)")
    out += _recompute_module_problems(w, c)
    if w.compile is True and not caps.compiles:
        out.append(f"train.compile=true is torch.compile of the model: jobctl renders and models it for torchtitan "
                   f"only, not {caps.name} (remove it, or use framework: torchtitan)")
    if w.precision in LOW_PRECISIONS and w.precision not in t.gpu.formats:
        need = "Hopper, Ada or Blackwell" if w.precision == "fp8" else "Blackwell (B200, GB200)"
        have = f"runs only {', '.join(t.gpu.formats)}" if t.gpu.formats else "has no FP8 tensor cores"
        instead = " or ".join((*t.gpu.formats, "bf16-mixed"))
        out.append(f"train.precision={w.precision} needs {need} tensor cores; {t.gpu.key} {have}: use "
                   f"{instead} here, or plan on a partition with such GPUs")
    for dim, offered in (("tp", caps.tp), ("pp", caps.pp)):
        value = getattr(c, dim)
        if value is not None and value > 1 and not offered:
            out.append(f"{dim}={value}: framework {caps.name} has no {'tensor' if dim == 'tp' else 'pipeline'} "
                       f"parallelism ({_with(dim)})")
    for knob, offered in (("recompute", caps.recompute), ("offload", caps.offload)):
        value = getattr(c, knob)
        if value is not None and value not in offered:
            out.append(f"{knob}={value} is not available in framework {caps.name} (it offers {', '.join(offered)})")
    if c.virtual_stages and c.virtual_stages > 1 and not caps.interleaved:
        out.append(f"virtual_stages={c.virtual_stages}: framework {caps.name} has no interleaved pipeline schedule")
    if c.cp is not None and c.cp > 1:
        if not caps.cp:
            out.append(f"cp={c.cp}: framework {caps.name} has no context parallelism ({_with('cp')})")
        if w.seq_len % (2 * c.cp):
            out.append(f"cp={c.cp} needs seq_len divisible by 2·cp: {w.seq_len} % {2 * c.cp} = {w.seq_len % (2 * c.cp)}")
    if c.dp is not None and w.global_batch_size % c.dp:
        out.append(f"dp={c.dp} does not divide global_batch_size: {w.global_batch_size} % {c.dp} = {w.global_batch_size % c.dp}")
    if c.micro_batch_size is not None:
        per = c.micro_batch_size * (c.dp or 1)
        if w.global_batch_size % per:
            out.append(f"micro_batch_size({c.micro_batch_size}) * dp({c.dp or 1}) = {per} does not divide "
                       f"global_batch_size({w.global_batch_size})")
    if c.sharding is not None and c.sharding not in caps.shardings:
        out.append(f"sharding={c.sharding} is not available in framework {caps.name} "
                   f"(it offers {', '.join(caps.shardings)})")
    if c.sequence_parallel and caps.sequence_parallel == "no":
        out.append(f"sequence_parallel: framework {caps.name} has no sequence parallelism ({_with('sp')})")
    if c.nodes is not None and c.nodes > t.nodes:
        out.append(f"resources.nodes={c.nodes}: {t.cluster}/{t.partition} has {t.nodes} node{'s' if t.nodes != 1 else ''}")
    dims = [c.tp, c.pp, c.dp, c.cp]
    if all(d is not None for d in dims):
        world = c.tp * c.pp * c.dp * c.cp
        limit = t.total_gpus if c.max_nodes is None else min(t.total_gpus, c.max_nodes * t.gpus_per_node)
        if world > limit:
            out.append(f"tp({c.tp}) * pp({c.pp}) * dp({c.dp}) * cp({c.cp}) = {world} GPUs > {limit} available "
                       f"({t.cluster}/{t.partition}: {t.nodes} node{'s' if t.nodes != 1 else ''} x {_gpus(t.gpus_per_node)}"
                       + (f", max_nodes {c.max_nodes}" if c.max_nodes else "") + ")")
        elif world > t.gpus_per_node and world % t.gpus_per_node:
            out.append(f"world size {world} is not a whole number of {t.gpus_per_node}-GPU nodes")
    return out


def _layer_variant_problems(w: Workload) -> list[str]:
    """gpt-oss's layer (sinks, biases, windows, clamped GEGLU), dense or not, where the framework
    cannot render it, or biased in a way it cannot express."""
    m, caps = w.model, w.caps
    odd = [n for n, on in (("attention sinks", m.attention_sinks), ("attention biases", m.attention_bias),
                           ("expert biases", m.moe is not None and m.moe.expert_bias),
                           ("a router bias", m.moe is not None and m.moe.router_bias),
                           ("a sliding window", bool(m.sliding_window)),
                           ("a clamped GEGLU", m.activation != "swiglu")) if on]
    if not odd:
        return []
    if not caps.gpt_oss:
        has = ", ".join(n for n, f in frameworks.REGISTRY.items() if f.caps.gpt_oss)
        return [f"{m.name} has {', '.join(odd)}, which jobctl renders for {has} only, not {caps.name}: its plan "
                f"would build another model (use framework: {has}; or size its states: `jobctl memory --model "
                f"{m.name}`)"]
    # Megatron's add_bias_linear biases every linear (attention, MLP or experts, router) or none;
    # a dense MLP's biases jobctl does not count (the gpt-oss layer is a mixture of experts)
    biased = (m.attention_bias, m.moe is not None and m.moe.expert_bias, m.moe is not None and m.moe.router_bias)
    if any(biased) and not all(biased):
        return [f"{m.name} has {', '.join(odd)}: {caps.name} biases every linear layer (attention, experts and "
                "router, as gpt-oss) or none (add_bias_linear), not some of them"]
    return []


def _moe_problems(w: Workload, t: Target, c: Constraints) -> list[str]:
    """What of a mixture of experts (or MLA) the framework cannot run or jobctl cannot plan yet."""
    m, caps, out = w.model, w.caps, []
    if c.ep is not None and c.ep > 1 and m.moe is None:
        out.append(f"ep={c.ep}: {m.name} has no experts to split (expert parallelism is for mixtures of experts)")
    if w.moe_dispatcher != "alltoall" and m.moe is None:
        out.append(f"train.moe_dispatcher={w.moe_dispatcher}: {m.name} has no experts to dispatch to (remove it)")
    if m.moe is None and m.mla is None:
        return out
    what = (f"a mixture of experts ({m.moe.experts} experts, top {m.moe.top_k}; {m.params() / 1e9:.1f}B parameters, "
            f"{m.active_params() / 1e9:.1f}B active)" if m.moe is not None else "multi-head latent attention")
    if not caps.moe:
        has = ", ".join(n for n, f in frameworks.REGISTRY.items() if f.caps.moe)
        out.append(f"{m.name} is {what}: jobctl plans it for {has} only, not {caps.name} (expert parallelism, the "
                   f"routed tokens and their dispatch are modelled there): use framework: {has}")
        return out
    if w.moe_dispatcher not in caps.moe_dispatchers:
        kernels = {"hybridep": "HybridEP", "deepep": "normal"}.get(w.moe_dispatcher, w.moe_dispatcher)
        out.append(f"train.moe_dispatcher={w.moe_dispatcher} is Megatron-Core's flex dispatcher on DeepEP's {kernels} "
                   f"kernels: jobctl renders and models it for megatron only, not {caps.name} (use alltoall)")
    if m.mla is not None and not caps.mla:
        has = ", ".join(n for n, f in frameworks.REGISTRY.items() if f.caps.mla)
        out.append(f"{m.name} has multi-head latent attention, which jobctl models and renders for {has} only, not "
                   f"{caps.name}: use framework: {has}")
        return out
    if w.method != "full":
        out.append(f"train.method={w.method}: adapters on a mixture of experts are not modelled (use method: full)")
    if c.ep is not None and m.moe is not None and m.moe.experts % c.ep:
        out.append(f"ep={c.ep} does not divide the {m.moe.experts} experts: {m.moe.experts} % {c.ep} = "
                   f"{m.moe.experts % c.ep}")
    return out


def _recompute_module_problems(w: Workload, c: Constraints) -> list[str]:
    """train.recompute_modules where it cannot apply: a framework without named modules, a module
    the model lacks (megatron-core's TransformerConfig refuses mla_up_proj without MLA and moe_act
    without grouped experts), moe_act under FP8 delayed scaling (refused there too)."""
    named, caps, m = w.recompute_modules, w.caps, w.model
    if not named:
        return []
    if not caps.recompute_modules:
        has = ", ".join(n for n, f in frameworks.REGISTRY.items() if f.caps.recompute_modules)
        return [f"train.recompute_modules names Megatron-Core's recompute modules: jobctl renders and models them for "
                f"{has} only, not {caps.name} (remove it)"]
    out = []
    if "mla_up_proj" in named and m.mla is None:
        out.append(f"train.recompute_modules: mla_up_proj recomputes multi-head latent attention's up-projections, "
                   f"which {m.name} does not have (transformer_config.py refuses it)")
    if "moe_act" in named and m.moe is None:
        out.append(f"train.recompute_modules: moe_act recomputes the routed experts' activation; {m.name} has no "
                   "experts (transformer_config.py: only with grouped expert GEMMs)")
    if "mlp" in named and m.moe is not None and m.moe_layers == m.layers:
        out.append(f"train.recompute_modules: mlp recomputes the dense layers' MLP; every layer of {m.name} routes "
                   "(transformer_layer.py skips MoE layers): use moe_act or shared_experts")
    if "shared_experts" in named and (m.moe is None or not m.moe.shared_experts):
        out.append(f"train.recompute_modules: shared_experts recomputes a mixture of experts' shared MLP, which "
                   f"{m.name} does not have")
    if "moe_act" in named and w.precision == "fp8" and w.fp8_recipe == "delayed":
        out.append("train.recompute_modules: moe_act under fp8 delayed scaling is refused by megatron-core "
                   "('Delayed scaling does not support moe_act and layernorm recompute for fp8'): use "
                   "fp8_recipe tensorwise or drop moe_act")
    if c.recompute is not None and c.recompute != "selective":
        out.append(f"train.recompute_modules applies to parallelism.recompute: selective, not {c.recompute}")
    return out


def _with(what: str) -> str:
    """Which frameworks offer `what` (tp, pp, cp, sp), for a message."""
    has = [n for n, f in frameworks.REGISTRY.items()
           if {"tp": f.caps.tp, "pp": f.caps.pp, "cp": f.caps.cp, "sp": f.caps.sequence_parallel != "no"}[what]]
    return "frameworks with it: " + ", ".join(has) + "; custom code declares it under framework.supports"


def search(w: Workload, t: Target, c: Constraints, objective: str = DEFAULT_OBJECTIVE, steps: int | None = None,
           keep_all: bool = False, evaluations: Evaluations | None = None,
           faster_than: float | None = None, per_gpu_floor: float = 0.0) -> SearchResult:
    """Find the plans that fit on `t`, estimate their step time, rank them by `objective`.

    `evaluations`: the space of (w, t, c, steps) as an earlier search left it (its result's
    `evaluations`, or `.pinned(...)` of it): layouts it evaluated are not evaluated again.
    `faster_than` (objective "time" only): tokens/s a plan must beat to be worth finding; layouts
    whose bound does not reach it are not evaluated (the result may hold slower plans found on
    the way: the caller compares). `per_gpu_floor` (with faster_than): tokens/s per GPU such a
    plan must also reach; layouts whose bound per GPU does not are not evaluated either."""
    if faster_than is not None and objective != "time":
        raise ValueError("search: faster_than is for objective time")
    # The search makes tens of thousands of small objects (plans, keys, breakdowns), none of them
    # in a reference cycle: the cycle collector finds nothing there and took a quarter of the
    # time of `plan --framework all`. It is paused while the search runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _search(w, t, c, objective, steps, keep_all, evaluations, faster_than, per_gpu_floor)
    finally:
        if collecting:
            gc.enable()


def _search(w: Workload, t: Target, c: Constraints, objective: str, steps: int | None, keep_all: bool,
            evaluations: Evaluations | None, faster_than: float | None, per_gpu_floor: float = 0.0) -> SearchResult:
    result = SearchResult(target=t, best=None, objective=objective)
    problems = pinned_problems(w, t, c)
    if problems:
        result.reasons = problems
        return result
    if evaluations is None:
        evaluations = Evaluations(w, t, c, steps, floor=faster_than, every=keep_all)
    elif not evaluations.matches(w, t, c, steps):
        raise ValueError("search: the evaluations given are of another workload, target, constraints or steps")
    elif keep_all and not evaluations.every:
        raise ValueError("search: keep_all needs evaluations made with every=True (the others keep a layout's fastest)")
    ev = result.evaluations = evaluations
    # Each layout gets an optimistic bound first: its step time with no recomputation and no
    # offload (they only add work), for each sharding on offer and a few micro-batch sizes.
    # Layouts are visited best bound first, and a layout whose bound cannot come within the
    # objective's tolerance of the best plan found so far (for "balanced": cannot win either
    # race, see _Race) is skipped without a memory check. tests/test_search_properties.py checks
    # the pruned search against an unpruned one.
    order = ev.layouts
    if faster_than is not None and t.links is not None:  # those that cannot reach it, without their bound
        order = [layout for layout in order if ev.time_bound_above(layout, faster_than)
                 and (not per_gpu_floor or ev.bound(layout, "throughput") >= per_gpu_floor)]
        if len(order) < len(ev.layouts):
            result.rejected["slower than the best (bound)"] += len(ev.layouts) - len(order)
    order = sorted(order, key=lambda layout: -ev.bound(layout, objective))
    if ev.without_knobs:
        result.rejected["hsdp group does not divide dp·cp"] += ev.without_knobs
    per_layout: list[Candidate] = []
    closest: Candidate | None = None
    smallest: dict = {}
    visit = _Visitor(objective, keep_all, t.gpus_per_node, faster_than)
    for layout in order:
        skip = visit.skip(layout, ev.bound(layout, objective))
        if skip:
            result.rejected[skip] += 1
            continue
        out = ev.outcome(layout)
        result.considered += out.considered
        result.feasible_count += out.feasible
        for k, n in out.rejected.items():
            result.rejected[k] += n
        result.refused.update(out.refused)
        for k, v in out.smallest.items():
            if k not in smallest or v < smallest[k]:
                smallest[k] = v
        if out.closest is not None and (closest is None or out.closest.memory.total_bytes < closest.memory.total_bytes):
            closest = out.closest
        if keep_all:
            per_layout += out.every
        elif out.best is not None:
            per_layout.append(out.best)
            visit.found(layout, out.best)
    return _finish(ev, result, per_layout, closest, smallest)


class _Visitor:
    """Which layouts a search still needs to evaluate, from the best plans found so far."""

    def __init__(self, objective: str, keep_all: bool, gpus_per_node: int, floor: float | None = None):
        self.objective, self.keep_all, self.gpus_per_node = objective, keep_all, gpus_per_node
        self.best_metric: float | None = floor
        self.tolerance = THROUGHPUT_TOLERANCE if objective == "throughput" else 0.0
        self.group_best: dict = {}  # (tp, pp, cp) -> (metric, nodes) of the best plan found for that group
        # "balanced" runs two races (see _rank_balanced): among all plans, and among whole-node plans
        self.races = (_Race(), _Race())

    def skip(self, layout: Layout, bound: float) -> str | None:
        """Why `layout` cannot win (a rejection reason), or None."""
        if self.keep_all:
            return None
        if self.objective == "balanced":
            whole = layout.gpus_per_node == self.gpus_per_node
            races, world = self.races, layout.world
            if not races[0].can_win(bound, world) and not (whole and races[1].can_win(bound, world)):
                return "slower than the best (bound)"
        elif self.best_metric is not None and bound < self.best_metric * (1 - self.tolerance):
            return "slower than the best (bound)"
        seen = self.group_best.get((layout.tp, layout.pp, layout.cp))
        if self.objective == "throughput" and seen and seen[1] <= layout.nodes and bound <= seen[0]:
            # the same model-parallel layout already fits on fewer nodes at least as fast per GPU
            return "dominated by fewer nodes"
        return None

    def found(self, layout: Layout, best: Candidate) -> None:
        """A layout's fastest plan: it raises the bar the layouts after it must reach."""
        if self.objective == "balanced" and best.estimate is not None:
            self.races[0].add(best)
            if best.whole_nodes:
                self.races[1].add(best)
        metric = _metric(best, self.objective)
        if self.best_metric is None or metric > self.best_metric:
            self.best_metric = metric
        group = (layout.tp, layout.pp, layout.cp)
        seen = self.group_best.get(group)
        if seen is None or (metric, -layout.nodes) > (seen[0], -seen[1]):
            self.group_best[group] = (metric, layout.nodes)


def _finish(ev: Evaluations, result: SearchResult, per_layout: list[Candidate], closest: Candidate | None,
            smallest: dict) -> SearchResult:
    """Rank what was found; the winner and the closest miss get their memory term by term."""
    if closest is not None:
        closest = Candidate(closest.plan, ev.memory(closest.plan))
    result.closest = closest
    result.smallest = smallest
    if per_layout:
        ranked = rank(per_layout, result.objective)
        result.ranked = ranked
        result.feasible = ranked
        top = ranked[0]
        result.best = Candidate(top.plan, ev.memory(top.plan), top.estimate, top.whole_nodes)
    else:
        result.reasons = no_fit_reasons(ev.w, ev.t, ev.c, closest, result)
    return result


def _metric(cand: Candidate, objective: str) -> float:
    """Bigger is better: tokens/s per GPU (throughput, and balanced's bound), tokens/s (time),
    −GPUs (gpus)."""
    if objective == "gpus":
        return -float(cand.plan.world_size)
    if cand.estimate is None:
        return 0.0
    return cand.tokens_per_s_per_gpu if objective in ("throughput", "balanced") else cand.tokens_per_s


def rank(cands: list[Candidate], objective: str) -> list[Candidate]:
    """Order candidates best first by the objective."""
    if not cands:
        return []
    if objective == "gpus":
        return sorted(cands, key=lambda x: (x.plan.world_size, -x.tokens_per_s, knob_cost(x.plan)))
    if objective == "time":
        return sorted(cands, key=lambda x: (-x.tokens_per_s, x.plan.world_size, knob_cost(x.plan)))
    if objective == "balanced":
        return _rank_balanced(cands)
    # throughput: the best tokens/s per GPU, then prefer fewer nodes among near-equals
    top = max(x.tokens_per_s_per_gpu for x in cands)
    near = [x for x in cands if x.tokens_per_s_per_gpu >= top * (1 - THROUGHPUT_TOLERANCE)]
    rest = [x for x in cands if x.tokens_per_s_per_gpu < top * (1 - THROUGHPUT_TOLERANCE)]
    near.sort(key=lambda x: (x.plan.nodes, -x.tokens_per_s_per_gpu, knob_cost(x.plan)))
    rest.sort(key=lambda x: -x.tokens_per_s_per_gpu)
    return near + rest


class _Race:
    """The best tokens/s per GPU seen (the reference) and the most tokens/s among the plans
    within SCALING_EFFICIENCY of it; which layouts can still win."""

    def __init__(self):
        self.plans: list[Candidate] = []
        self.ref: float | None = None
        self.best_tokens = 0.0

    def add(self, c: Candidate) -> None:
        self.plans.append(c)
        if self.ref is None or c.tokens_per_s_per_gpu > self.ref:
            self.ref = c.tokens_per_s_per_gpu
            self.best_tokens = max(x.tokens_per_s for x in self.plans
                                   if x.tokens_per_s_per_gpu >= self.ref * SCALING_EFFICIENCY)
        elif c.tokens_per_s_per_gpu >= self.ref * SCALING_EFFICIENCY:
            self.best_tokens = max(self.best_tokens, c.tokens_per_s)

    def can_win(self, bound: float, world: int) -> bool:
        # layouts come best bound first: once the bound is below the reference nothing left can
        # raise it, so a layout that cannot reach SCALING_EFFICIENCY of it, or cannot beat the
        # fastest plan that does, cannot win
        return self.ref is None or bound > self.ref or (
            bound >= self.ref * SCALING_EFFICIENCY and bound * world > self.best_tokens)


# "balanced" takes part of a node only when the best plan on the whole node is not faster by this.
WHOLE_NODE_GAIN = 0.01


def _fastest_efficient(cands: list[Candidate]) -> list[Candidate]:
    top = max(x.tokens_per_s_per_gpu for x in cands)
    good = [x for x in cands if x.tokens_per_s_per_gpu >= top * SCALING_EFFICIENCY * (1 - 1e-12)]
    return sorted(good, key=lambda x: (-x.tokens_per_s, x.plan.world_size, knob_cost(x.plan)))


def _rank_balanced(cands: list[Candidate]) -> list[Candidate]:
    """The fastest of the plans that keep SCALING_EFFICIENCY of the best tokens/s per GPU (ties:
    fewer GPUs, cheaper knobs). When that takes part of a node and the same rule among the
    whole-node plans gives a faster one, that one: a user who has the node gets all of it; part
    of a node only when filling it would not be faster at all. Then the others, fastest first."""
    good = _fastest_efficient(cands)
    if not good[0].whole_nodes:
        whole = [x for x in cands if x.whole_nodes]
        if whole:
            top_whole = _fastest_efficient(whole)[0]
            if top_whole.tokens_per_s > good[0].tokens_per_s * (1 + WHOLE_NODE_GAIN):
                good = [top_whole] + [x for x in good if x is not top_whole]
    chosen = {id(x) for x in good}
    rest = sorted((x for x in cands if id(x) not in chosen), key=lambda x: (-x.tokens_per_s, x.plan.world_size))
    return good + rest


def no_fit_reasons(w: Workload, t: Target, c: Constraints, closest: Candidate | None, r: SearchResult) -> list[str]:
    if r.considered == 0:
        return [f"no valid layout: the divisibility rules leave nothing to try on {_gpus(t.total_gpus)} "
                f"(heads {w.model.heads}, kv_heads {w.model.kv_heads}, layers {w.model.layers}, "
                f"global_batch_size {w.global_batch_size})"]
    out = [f"none of {r.considered} layouts fits on {t.cluster}/{t.partition} "
           f"({t.nodes} x {t.gpus_per_node} {t.gpu.key}, {t.gpu_memory_bytes / GIB:.1f} GiB each)"]
    # plans that fit in memory but that the framework would not run: its reasons first
    for reason, n in r.refused.most_common(2):
        out.append(f"{n} that fit{'s' if n == 1 else ''} in memory {'is' if n == 1 else 'are'} refused by "
                   f"{w.caps.name}: {reason}")
    if closest is not None:
        m = closest.memory
        # the memory check comes before the framework's: the smallest may be a layout it refuses
        refused = f"; {w.caps.name} would refuse it too" if r.refused and w.framework.problems(closest.plan, w) else ""
        if not m.fits_gpu:
            out.append(f"the smallest needs {m.total_bytes / GIB:.1f} GiB per GPU, {m.gpu_usable_bytes / GIB:.1f} GiB usable "
                       f"({closest.plan.summary()}{refused})")
        else:
            out.append(f"the smallest needs {m.host_bytes_per_node / GIB:.1f} GiB host RAM per node, "
                       f"{m.host_usable_bytes / GIB:.1f} GiB usable ({closest.plan.summary()}{refused})")
    return out


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
