"""plan --explain's "why not" reasons (planner/explain.py _loss_reason), on hand-made estimates."""

from types import SimpleNamespace

from jobctl.planner.explain import _loss_reason
from jobctl.planner.perf import StepEstimate


def candidate(world: int, tokens_per_step: float, **parts) -> SimpleNamespace:
    p = dict(compute_s=0.0, tp_comm_s=0.0, pp_bubble_s=0.0, pp_p2p_s=0.0, dp_comm_s=0.0, cp_comm_s=0.0,
             offload_s=0.0, optimizer_s=0.0)
    p.update(parts)
    step = sum(p.values())
    est = StepEstimate(step_time_s=step, tokens_per_s=tokens_per_step / step,
                       tokens_per_s_per_gpu=tokens_per_step / step / world, mfu=0.4, model_flops_per_step=1.0,
                       steps=None, time_to_train_s=None, gpu_hours=None, **p)
    return SimpleNamespace(plan=SimpleNamespace(world_size=world, recompute="none", grad_accum_steps=1),
                           estimate=est, tokens_per_s_per_gpu=est.tokens_per_s_per_gpu)


def test_fewer_gpus_doing_the_same_work_per_gpu_is_said_so():
    # the winner: 128 GPUs, a 4 s step of 3.9 s compute for 128 x 32k tokens; the alternative the
    # same per GPU on 8 GPUs (16x fewer tokens per step): no part costs more GPU-time
    win = candidate(128, 128 * 32768, compute_s=3.9, dp_comm_s=0.1)
    alt = candidate(8, 8 * 32768, compute_s=3.9, dp_comm_s=0.1)
    why = _loss_reason(win, alt)
    assert "fewer GPUs (8 vs 128)" in why and "GPU-time" not in why


def test_a_part_that_costs_more_gpu_time_is_named():
    # same GPUs; the alternative spends 1 s more per step in the pipeline bubble, which is
    # 1 / (4 + 1) = 20% of its step and 0% of the winner's
    win = candidate(8, 8 * 32768, compute_s=4.0)
    alt = candidate(8, 8 * 32768, compute_s=4.0, pp_bubble_s=1.0)
    assert _loss_reason(win, alt) == "pipeline bubble 20% of the step at 1 micro-batches (winner 0%)"


def test_why_not_a_knob_answers_with_the_winners_own_layout():
    """'why not offload=optimizer' is the winner's layout with its optimizer offloaded (what the
    user gets by pinning it), not another layout's fastest plan that happens to offload: the
    search only tries offload where a layout needs it, so that plan is not among its ranked ones.
    Llama 3.1 70B on the h100 inventory: the same layout, its optimizer step on the CPU."""
    from jobctl.planning import load_inventory, load_recipe, plan_on
    inv = load_inventory("h100", [])
    d = plan_on(load_recipe("recipes/llama70b.yaml", []), inv, alternatives=0).to_dict()
    p = d["plan"]
    (entry,) = [x for x in d["why_not"] if x["change"] == "offload=optimizer"]
    pins = [f"parallelism.{k}={p[k]}" for k in ("tp", "pp", "cp", "dp")] + ["parallelism.offload=optimizer"]
    pinned = plan_on(load_recipe("recipes/llama70b.yaml", pins), inv, alternatives=0).to_dict()
    expected = pinned["estimate"]["tokens_per_s_per_gpu"] / d["estimate"]["tokens_per_s_per_gpu"] - 1
    assert entry["per_gpu"] == round(expected, 4)
    assert -0.05 < entry["per_gpu"] < 0  # the CPU optimizer step, not another layout's recomputation
    assert "optimizer step" in entry["reason"]
