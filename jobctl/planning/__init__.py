"""The planning service: recipe + inventory -> plan report (load.py), on one inventory or all
(plans.py), frameworks side by side and the advice about them (compare.py), the next plan after
an out-of-memory failure (oom.py, imported where it is used), what the history teaches (learn.py).
"""

from jobctl.planner.search import OBJECTIVES as OBJECTIVES  # re-exported: the CLI's --objective choices
from jobctl.planning.compare import (
    FRAMEWORK_GAP,
    compare_frameworks,
    framework_advice,
    framework_advice_for,
    framework_names,
)
from jobctl.planning.load import load_inventory, load_recipe, load_request, train_steps
from jobctl.planning.plans import DEFAULT_OBJECTIVE, framework_block, learned_block, plan_on
from jobctl.planning.report import PlanReport

__all__ = ["DEFAULT_OBJECTIVE", "FRAMEWORK_GAP", "OBJECTIVES", "PlanReport", "compare_frameworks", "framework_advice",
           "framework_advice_for", "framework_block", "framework_names", "learned_block", "load_inventory",
           "load_recipe", "load_request", "plan_on", "train_steps"]
